"""In-process checks of the nccl backend on a real device (world size 1): that synchronize()
really waits for the device, that per-op and pipelined timing both include the device work,
and that every collective gives exact results through the backend's own buffers.

    python tests/gpu/device_checks.py          # PASS/FAIL lines; exit 1 on a failure

Needs a CUDA (or ROCm) build of torch and a device; prints SKIP and exits 0 otherwise.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ccbench.backends.base import RankContext
from ccbench.bench.validation import count_wrong, initial_output, make_input
from ccbench.collectives import COLLECTIVES, REDUCING, layout
from ccbench.dtypes import DTYPES
from ccbench.run.control import ControlClient, ControlServer

#: an HBM bandwidth no current device reaches (bytes/s): a bound below any honest timing
_FASTER_THAN_ANY_DEVICE = 20e12


def skip_reason() -> str | None:
    from ccbench.backends.nccl import NCCLBackend, RCCLBackend

    nccl, rccl = NCCLBackend.unavailable_reason(), RCCLBackend.unavailable_reason()
    if nccl and rccl:
        return f"nccl: {nccl}; rccl: {rccl}"
    return None


def make_backend(cls: Any = None) -> tuple[Any, Callable[[], None]]:
    """A world-size-1 nccl (or rccl) backend with its own control store; returns (backend, close).
    `cls` replaces the class (the CPU twin's tests pass tests/gpu/cpu_twins.py:NCCLCpuTwin)."""
    from ccbench.backends.nccl import NCCLBackend, RCCLBackend

    if cls is None:
        cls = NCCLBackend if NCCLBackend.unavailable_reason() is None else RCCLBackend
    server = ControlServer("127.0.0.1", 0)
    store = ControlClient("127.0.0.1", server.port, 0, connect_timeout=30, secret=server.secret)
    ctx = RankContext(rank=0, world_size=1, local_rank=0, local_world_size=1, launcher="single",
                      store=store, hostname="localhost", device="cuda",
                      options={"timeout": 120, "multi_host": False})
    backend = cls(ctx)

    def close() -> None:
        backend.finalize()
        store.close()
        server.close()

    return backend, close


def check_synchronize_waits(backend: Any) -> list[tuple[bool, str]]:
    """A 1 GiB out-of-place allreduce copies 1 GiB on the device (read + write): timed up to
    synchronize() it cannot be faster than 2 GiB / 20 TB/s; and after synchronize() an event
    recorded behind it has completed."""
    torch = backend.torch
    count = (1 << 30) // 4
    send, recv = backend.alloc(count, np.dtype(np.float32)), backend.alloc(count, np.dtype(np.float32))
    send.fill_(1.0)
    backend.synchronize()
    floor = 2 * count * 4 / _FASTER_THAN_ANY_DEVICE
    results = []
    for _ in range(2):                                   # the first one warms up
        backend.barrier()
        start = time.perf_counter()
        backend.run("allreduce", send, recv, "sum", 0)
        launched = time.perf_counter() - start
        event = torch.cuda.Event()
        event.record()
        backend.synchronize()
        waited = time.perf_counter() - start
        done = event.query()
    results.append((waited >= floor, f"synchronize waits: 1 GiB allreduce {waited * 1e6:.0f} us "
                    f">= {floor * 1e6:.0f} us (launch returned after {launched * 1e6:.0f} us)"))
    results.append((bool(done), "an event recorded after the op is complete after synchronize()"))
    del send, recv
    torch.cuda.empty_cache()
    return results


def check_pipelined_includes_device_work(backend: Any) -> list[tuple[bool, str]]:
    count = (256 << 20) // 4
    send, recv = backend.alloc(count, np.dtype(np.float32)), backend.alloc(count, np.dtype(np.float32))
    depth = 10
    call = backend.bind("allreduce", send, recv, "sum", 0)
    call()
    backend.synchronize()
    backend.barrier()
    start = time.perf_counter()
    for _ in range(depth):
        call()
    backend.synchronize()
    per_op = (time.perf_counter() - start) / depth
    floor = 2 * count * 4 / _FASTER_THAN_ANY_DEVICE
    return [(per_op >= floor, f"pipelined: {depth} x 256 MiB allreduce, {per_op * 1e6:.0f} us per op "
             f">= {floor * 1e6:.0f} us")]


def check_every_collective_exact(backend: Any) -> list[tuple[bool, str]]:
    results = []
    for collective in COLLECTIVES:
        for dtype_name, dtype in DTYPES.items():
            ops = ["sum", "max", "min", "prod"] if collective in REDUCING else [None]
            for op in ops:
                if backend.unsupported(collective, dtype, op):
                    continue
                lay = layout(collective, 3000 * dtype.itemsize, dtype.itemsize, 1)
                send = backend.alloc(lay.send_count, dtype)
                recv = send if collective == "broadcast" else backend.alloc(lay.recv_count, dtype)
                backend.copy_from_numpy(send, make_input(lay, dtype, op, 0, 0))
                if recv is not send:
                    backend.copy_from_numpy(recv, initial_output(lay, dtype))
                backend.run(collective, send, recv, op, 0)
                backend.synchronize()
                got = backend.to_numpy(recv)
                if got.dtype != dtype:          # a buffer holding the dtype's bits (float8), as
                    got = got.view(dtype)       # the harness reads it (harness.Case.wrong)
                wrong = count_wrong(got, lay, op, 0, 0)
                label = f"{collective} {dtype_name}{' ' + op if op else ''}"
                results.append((wrong == 0, f"exact through the backend: {label}: wrong={wrong}"))
    return results


def main() -> int:
    reason = skip_reason()
    if reason:
        print(f"SKIP  device checks: {reason}")
        return 0
    backend, close = make_backend()
    try:
        meta = backend.info()
        print(f"INFO  {meta['library']} {meta['library_version']} on {meta['device']} "
              f"({meta['gpu']}), torch {meta['torch']}")
        results = (check_synchronize_waits(backend) + check_pipelined_includes_device_work(backend)
                   + check_every_collective_exact(backend))
    finally:
        close()
    for ok, what in results:
        print(f"{'PASS' if ok else 'FAIL'}  {what}")
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
