"""ccbench's algorithms on one device with ranks as threads, one CUDA stream each
(algorithms.device_threads): every algorithm x collective x dtype x op x mode at each world
size, the reductions in the CuPy kernels (CupyReducer) on the rank's stream, every rank's
output compared bit for bit with the values the harness expects (ccbench.bench.validation).

    python tests/gpu/thread_ranks.py [--worlds 2,4,8] [--size 64K] [--ops sum,max,min,prod]
                                     [--algorithms ring,tree,...] [--fake-cupy]

One PASS/FAIL line per (world, algorithm); exit status 1 when anything is wrong. With
--fake-cupy the same code runs on tests/gpu/fake_cupy.py (host memory, kernels by
TwinReducer): the CPU twin that CI runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent


def _cases(algorithms: list[str], ops: list[str]) -> list[tuple[str, str, str, str | None, bool]]:
    from algorithms import REGISTRY
    from ccbench.backends.algorithmic import AlgorithmBackend
    from ccbench.collectives import COLLECTIVES, REDUCING
    from ccbench.dtypes import DTYPES

    cases = []
    for algorithm in algorithms:
        for family, collective in REGISTRY:
            if family != algorithm or collective not in COLLECTIVES:   # the harness's five
                continue
            for dtype in DTYPES:
                for op in (ops if collective in REDUCING else [None]):
                    if AlgorithmBackend.refuses(DTYPES[dtype], op):   # float8 reductions
                        continue
                    for inplace in ((True,) if collective == "broadcast" else (False, True)):
                        cases.append((algorithm, collective, dtype, op, inplace))
    return cases


def _buffers(policy: Any, collective: str, lay: Any, rank: int, inplace: bool,
             dtype: np.dtype) -> tuple[Any, Any]:
    """send and recv aliased as the harness aliases them for in-place calls."""
    if collective == "broadcast":
        recv = policy.alloc(lay.recv_count, dtype)
        return recv, recv
    if not inplace:
        return policy.alloc(lay.send_count, dtype), policy.alloc(lay.recv_count, dtype)
    if collective == "allgather":
        recv = policy.alloc(lay.recv_count, dtype)
        return recv[rank * lay.block:(rank + 1) * lay.block], recv
    if collective == "reduce-scatter":
        send = policy.alloc(lay.send_count, dtype)
        return send, send[rank * lay.block:(rank + 1) * lay.block]
    send = policy.alloc(lay.send_count, dtype)
    return send, send


def run_world(world: int, cases: list[tuple[str, str, str, str | None, bool]], size: int,
              cupy: Any, timeout: float = 120.0) -> tuple[dict[tuple[Any, ...], int], int]:
    """{case: wrong elements summed over ranks}, messages moved; all cases at one world size
    on one set of thread ranks."""
    from algorithms import generate
    from algorithms.device_threads import run_device_threads
    from algorithms.executor import Executor
    from algorithms.kernels import CupyReducer
    from ccbench.backends.buffers import CupyBuffers
    from ccbench.bench.validation import count_wrong, initial_output, make_input
    from ccbench.collectives import layout
    from ccbench.dtypes import DTYPES

    root = 0

    def body(transport: Any) -> dict[tuple[Any, ...], int]:
        rank, policy, reducer = transport.rank, CupyBuffers(cupy), CupyReducer()
        wrong: dict[tuple[Any, ...], int] = {}
        for case in cases:
            algorithm, collective, dtype_name, op, inplace = case
            dtype = DTYPES[dtype_name]
            lay = layout(collective, size, dtype.itemsize, world)
            if lay.send_count == 0 or lay.recv_count == 0:
                continue
            send, recv = _buffers(policy, collective, lay, rank, inplace, dtype)
            if recv is not send and not (inplace and collective == "reduce-scatter"):
                policy.copy_from_numpy(recv, initial_output(lay, dtype))
            policy.copy_from_numpy(send, make_input(lay, dtype, op, rank, root))
            executor = Executor(generate(algorithm, collective, world, root), rank, transport,
                                reducer=reducer, xp=cupy, timeout=timeout)
            arr = policy.array
            if collective == "broadcast":
                executor.run(None, arr(recv), None, dtype_name)
            else:
                executor.run(arr(send), arr(recv), op, dtype_name)
            transport.stream.synchronize()
            wrong[case] = count_wrong(policy.to_numpy(recv), lay, op, rank, root)
            executor.close()
        return wrong

    fabric_messages = [0]

    def counted(transport: Any) -> dict[tuple[Any, ...], int]:
        result = body(transport)
        fabric_messages[0] = transport.fabric.messages
        return result

    per_rank = run_device_threads(world, cupy, counted, timeout=timeout)
    total: dict[tuple[Any, ...], int] = {}
    for result in per_rank:
        for case, count in result.items():
            total[case] = total.get(case, 0) + count
    return total, fabric_messages[0]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="thread_ranks.py")
    parser.add_argument("--worlds", default="2,4,8")
    parser.add_argument("--size", default="64K", help="bytes per case (nccl-tests S)")
    parser.add_argument("--ops", default="sum,max,min,prod")
    parser.add_argument("--algorithms", default=None, help="default: every algorithm")
    parser.add_argument("--fake-cupy", action="store_true",
                        help="CuPy over host memory (tests/gpu/fake_cupy.py): the CPU twin")
    args = parser.parse_args(argv)
    if args.fake_cupy:
        sys.path.insert(0, str(HERE))
        import fake_cupy

        fake_cupy.install()
    import cupy

    from algorithms import ALGORITHMS
    from ccbench.units import parse_size

    algorithms = args.algorithms.split(",") if args.algorithms else list(ALGORITHMS)
    cases = _cases(algorithms, args.ops.split(","))
    size = parse_size(args.size)
    failures = 0
    for world in (int(w) for w in args.worlds.split(",")):
        start = time.perf_counter()
        wrong, messages = run_world(world, cases, size, cupy)
        seconds = time.perf_counter() - start
        print(f"INFO  world {world}: {len(wrong)} cases on {world} thread ranks, one stream "
              f"each, {messages} device-to-device messages, {seconds:.1f} s")
        for algorithm in algorithms:
            mine = {c: w for c, w in wrong.items() if c[0] == algorithm}
            bad = {c: w for c, w in mine.items() if w}
            failures += bool(bad) or not mine
            detail = "" if not bad else f"  e.g. {sorted(bad.items(), key=str)[:3]}"
            print(f"{'PASS' if mine and not bad else 'FAIL'}  {algorithm} at {world} thread "
                  f"ranks: {len(mine)} cases (collective x dtype x op x mode) exact{detail}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
