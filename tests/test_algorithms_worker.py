"""One rank of the multi-process algorithm checks (not a test module itself).

    mpiexec -n P python -m tests.test_algorithms_worker mpi
    RANK=r WORLD_SIZE=P MASTER_ADDR=127.0.0.1 MASTER_PORT=... python -m tests.test_algorithms_worker gloo

Runs every algorithm x collective over the transport's point-to-point through the real
backend class (``<algorithm>@<transport>``), in place and out of place, and compares the
result bit for bit with the transport's native collective on the same inputs and with the
numpy reference. Prints one summary line per rank; exit status 1 on any mismatch.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import ml_dtypes
import numpy as np

from algorithms import REGISTRY
from algorithms.reference import exact_inputs, reference
from ccbench.backends.algorithmic import algorithm_backend_class
from ccbench.backends.base import RankContext
from ccbench.collectives import get
from ccbench.dtypes import sentinel

#: every collective some algorithm family of algorithms/ implements (its registry, not a list)
COLLECTIVES = sorted({c for _family, c in REGISTRY})
DTYPES = [np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.float16),
          np.dtype(ml_dtypes.bfloat16), np.dtype(np.int8), np.dtype(np.float64)]
OPS = ("sum", "max", "min", "prod")
UNITS = (1, 5, 4099)           # 4099 float64 x 4 ranks: messages past the eager limit
QUICK = bool(os.environ.get("CCBENCH_WORKER_QUICK"))   # fewer cases (oversubscribed runs)
if QUICK:
    UNITS = (1, 4099)


def cases(reducing: bool) -> list[tuple[np.dtype, str | None]]:
    """(dtype, op) pairs; quick: every op on float32, one each on bfloat16 and int8, and
    two dtypes for data movement (the transports move bytes whatever the dtype)."""
    if not QUICK:
        return [(d, op) for d in DTYPES for op in (OPS if reducing else (None,))]
    f32, bf16, i8 = np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.int8)
    if reducing:
        return [(f32, op) for op in OPS] + [(bf16, "sum"), (i8, "max")]
    return [(f32, None), (bf16, None)]


def counts(collective: str, unit: int, p: int) -> tuple[int, int]:
    """(send, receive) element counts when one schedule unit is `unit` elements: a rank's
    block where the collective has blocks, else the whole buffer (the registry's layout)."""
    spec = get(collective)
    per_block = spec.model is not None and spec.model.schedule_unit == "block"
    _count, send, recv, _used = spec.counts(unit * (p if per_block else 1), 1, p)
    return send, recv


def modes(collective: str) -> tuple[bool, ...]:
    """In place, out of place or both, as the collective's in-place layout allows."""
    inplace = get(collective).inplace
    return {"one-buffer": (True,), "never": (False,)}.get(inplace, (False, True))


def call(backend: Any, collective: str, x: np.ndarray, dtype: np.dtype, op: str | None,
         inplace: bool, rank: int, p: int, root: int, unit: int) -> np.ndarray:
    """Run one collective with the harness's buffer conventions (the registry's in-place
    layout); the output as numpy."""
    spec = get(collective)
    send_count, recv_count = counts(collective, unit, p)
    recv = backend.alloc(recv_count, dtype)
    backend.copy_from_numpy(recv, np.full(recv_count, sentinel(-1, dtype)))
    layout = spec.inplace if inplace else None
    if layout == "one-buffer":
        if spec.input_on == "all" or rank == root:
            backend.copy_from_numpy(recv, x)
        send = recv
    elif layout == "send-in-recv":
        backend.copy_from_numpy(backend.view(recv, rank * send_count, (rank + 1) * send_count), x)
        send = backend.view(recv, rank * send_count, (rank + 1) * send_count)
    elif layout == "recv-in-send":
        send = backend.alloc(send_count, dtype)
        backend.copy_from_numpy(send, x)
        recv = backend.view(send, rank * recv_count, (rank + 1) * recv_count)
    elif layout == "same":
        backend.copy_from_numpy(recv, x)
        send = recv
    else:
        send = backend.alloc(send_count, dtype)
        backend.copy_from_numpy(send, x)
    backend.bind(collective, send, recv, op, root)()      # the harness's call path
    return backend.to_numpy(recv)


def main() -> int:
    transport = sys.argv[1]
    if transport == "mpi":
        from mpi4py import MPI

        rank, p = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        launcher = "mpiexec"
    else:
        rank, p = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        launcher = "torchrun"
    ctx = RankContext(rank=rank, world_size=p, local_rank=rank, local_world_size=p,
                      launcher=launcher, store=None, hostname="localhost",  # type: ignore[arg-type]
                      options={"timeout": 60})
    from ccbench.backends import backend_class

    native = backend_class(transport)(ctx)
    root = p - 1
    checked = wrong = skipped = 0
    failures: list[str] = []
    families = sorted({a for a, _c in REGISTRY})
    for family in families:
        backend = algorithm_backend_class(f"{family}@{transport}")(ctx)
        if type(backend).bind is type(native).bind:
            failures.append(f"{family}@{transport}: bind is the transport's native call")
            wrong += 1
        for collective in COLLECTIVES:
            if backend.unsupported(collective, DTYPES[0], "sum"):
                continue
            reducing = get(collective).reduces
            for dtype, op in cases(reducing):
                for unit in UNITS:
                    send_count, _ = counts(collective, unit, p)
                    inputs = exact_inputs(collective, op, p, send_count, dtype,
                                          seed=unit + 7 * len(op or ""))
                    want = reference(collective, inputs, op, root)[rank]
                    for inplace in modes(collective):
                        got = call(backend, collective, inputs[rank], dtype, op, inplace,
                                   rank, p, root, unit)
                        if native.unsupported(collective, dtype, op):
                            skipped += 1
                            ref = None
                        else:                 # every rank calls, whether it checks or not
                            ref = call(native, collective, inputs[rank], dtype, op, inplace,
                                       rank, p, root, unit)
                        if want is None:      # no defined result here (reduce, non-root)
                            continue
                        checked += 1
                        label = (f"{family}@{transport} {collective} {dtype.name} {op} "
                                 f"unit={unit} {'in' if inplace else 'out'}-place")
                        if got.tobytes() != want.tobytes():
                            wrong += 1
                            failures.append(f"{label}: differs from the reference")
                        if ref is not None and got.tobytes() != ref.tobytes():
                            wrong += 1
                            failures.append(f"{label}: differs from native {transport}")
        if transport == "mpi":          # gloo's finalize would end the shared process group
            backend.finalize()
    for line in failures[:10]:
        print(f"rank {rank}: {line}", flush=True)
    print(f"rank {rank}/{p}: {checked} checked, {wrong} wrong, {skipped} without a native "
          f"counterpart", flush=True)
    native.finalize()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
