"""algorithms/ schedules over MPI against the MPI library's own collectives.

    python benchmarks/bench_algorithms.py                 # launches 2 and 4 ranks itself
    python benchmarks/bench_algorithms.py --ranks 2 --quick

Prints, per rank count:
* ring allreduce (ring@mpi) busbw vs native MPI_Allreduce, 4 MiB - 256 MiB float32
  (ratio; target >= 0.85 from 16 MiB);
* recursive-doubling allreduce (hypercube@mpi) latency vs native, 8 B - 4 KiB
  (ratio; target <= 1.5x);
and once: the machine's large numpy copy bandwidth (bytes copied per second).

Method: per size a few warm-up calls, then timed calls each preceded by a barrier; a
call's time is the max over ranks; schedule and native calls alternate, and the medians
of each and the median of the per-iteration ratio (the `ratio` column: busbw ratio for
bandwidth, time ratio for latency) are reported. Both paths use the backends' `bind`
(what the harness times) on the same buffers, out of place.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20


def copy_bandwidth(nbytes: int = 256 * MiB, reps: int = 5) -> float:
    """GB/s of np.copyto between two large arrays (1 GB = 1e9 bytes; bytes copied, so the
    memory traffic is twice that)."""
    a = np.ones(nbytes // 8, dtype=np.float64)
    b = np.empty_like(a)
    np.copyto(b, a)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def _paired(comm, schedule_call, native_call, iters: int, warmup: int
            ) -> tuple[float, float, float]:
    """Median times of both calls, and the median of their per-iteration ratio. The two are
    timed alternately so that both see the same machine (the load of a shared host moves)."""
    for _ in range(warmup):
        schedule_call()
        native_call()
    mine, theirs = [], []
    for _ in range(iters):
        for call, out in ((schedule_call, mine), (native_call, theirs)):
            comm.Barrier()
            t0 = time.perf_counter()
            call()
            dt = time.perf_counter() - t0
            out.append(comm.allreduce(dt, op=_max()))
    ratios = [a / b for a, b in zip(mine, theirs, strict=True)]
    return float(np.median(mine)), float(np.median(theirs)), float(np.median(ratios))


def _max():
    from mpi4py import MPI

    return MPI.MAX


def worker(quick: bool) -> int:
    sys.path.insert(0, str(ROOT))
    from mpi4py import MPI

    from ccbench.backends.algorithmic import algorithm_backend_class
    from ccbench.backends.base import RankContext
    from ccbench.backends.mpi import MPIBackend

    world = MPI.COMM_WORLD
    rank, p = world.Get_rank(), world.Get_size()
    ctx = RankContext(rank=rank, world_size=p, local_rank=rank, local_world_size=p,
                      launcher="mpiexec", store=None, hostname="localhost",  # type: ignore[arg-type]
                      options={"timeout": 120})
    native = MPIBackend(ctx)
    ring = algorithm_backend_class("ring@mpi")(ctx)
    rd = algorithm_backend_class("hypercube@mpi")(ctx)
    comm = native.comm
    out = []
    factor = 2 * (p - 1) / p
    sizes = [4 * MiB, 16 * MiB, 64 * MiB] if quick else [4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
    out.append(f"## {p} ranks: ring allreduce float32 busbw (GB/s), ring@mpi vs native MPI")
    out.append(f"{'size':>10} {'ring_us':>10} {'native_us':>10} {'ring_bw':>8} {'nat_bw':>8} "
               f"{'ratio':>6}")
    for size in sizes:
        n = size // 4
        send = np.ones(n, dtype=np.float32)
        recv = np.empty_like(send)
        iters = 7 if size >= 64 * MiB else 15
        t_ring, t_nat, ratio = _paired(comm, ring.bind("allreduce", send, recv, "sum", 0),
                                       native.bind("allreduce", send, recv, "sum", 0), iters, 2)
        bw_r, bw_n = size / t_ring / 1e9 * factor, size / t_nat / 1e9 * factor
        out.append(f"{size // MiB:>8}Mi {t_ring * 1e6:>10.0f} {t_nat * 1e6:>10.0f} "
                   f"{bw_r:>8.2f} {bw_n:>8.2f} {1 / ratio:>6.2f}")
    out.append(f"## {p} ranks: recursive-doubling allreduce latency (us), hypercube@mpi vs "
               f"native MPI")
    out.append(f"{'size':>10} {'rd_us':>10} {'native_us':>10} {'ratio':>6}")
    for size in (8, 64, 512, 4096):
        send = np.ones(size // 4, dtype=np.float32)
        recv = np.empty_like(send)
        iters = 300 if quick else 2000
        t_rd, t_nat, ratio = _paired(comm, rd.bind("allreduce", send, recv, "sum", 0),
                                     native.bind("allreduce", send, recv, "sum", 0), iters, 50)
        out.append(f"{size:>9}B {t_rd * 1e6:>10.2f} {t_nat * 1e6:>10.2f} {ratio:>6.2f}")
    if rank == 0:
        print("\n".join(out), flush=True)
    for b in (ring, rd, native):
        b.finalize()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--quick", action="store_true", help="fewer sizes and iterations")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.quick)
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores "
          f"(numbers from a shared host move with it)", flush=True)
    print(f"numpy copy bandwidth (256 MiB np.copyto, best of 5): {copy_bandwidth():.2f} GB/s "
          f"copied ({os.cpu_count()} cores)", flush=True)
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    status = 0
    for p in (int(x) for x in args.ranks.split(",")):
        cmd = [mpiexec, "-n", str(p), sys.executable, __file__, "--worker"]
        if args.quick:
            cmd.append("--quick")
        status |= subprocess.run(cmd, cwd=ROOT, timeout=1800).returncode
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return status


if __name__ == "__main__":
    sys.exit(main())
