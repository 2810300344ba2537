"""Harness overhead against the references, at 2 ranks (prints figures; no asserts).

1. Intel MPI: IMB-MPI1 Allreduce vs `ccbench allreduce --backend mpi`, 8 B to 4 MiB.
   IMB times `iter` calls back to back and averages over ranks (t_avg), so ccbench is run
   with --timing pipelined (and per-op, for reference) and its median is compared.
   Targets: ratio <= 1.10 from 64 KiB, <= 1.5 below.
2. gloo: a bare torch.distributed.all_reduce loop vs ccbench gloo in-place pipelined.
   Target: ratio <= 1.05 from 64 KiB.

Run: python benchmarks/bench_harness.py  (in an environment with impi-rt and torch)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.executable).parent
ENV = {**os.environ, "LD_LIBRARY_PATH": f"{BIN.parent / 'lib'}:{os.environ.get('LD_LIBRARY_PATH', '')}",
       "I_MPI_WAIT_MODE": "1"}
SIZES = [8 << i for i in range(20)]          # 8 B .. 4 MiB
ITERS = 200


def imb_allreduce() -> dict[int, float]:
    out = subprocess.run([str(BIN / "mpiexec"), "-n", "2", str(BIN / "IMB-MPI1"), "Allreduce",
                          "-msglog", "3:22", "-iter", str(ITERS), "-npmin", "2"],
                         capture_output=True, text=True, env=ENV, timeout=600, check=True).stdout
    times = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 5 and fields[0].isdigit():
            times[int(fields[0])] = float(fields[4])     # t_avg [usec]
    return times


def ccbench_times(backend: str, timing: str, extra: list[str]) -> dict[int, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.jsonl"
        subprocess.run([sys.executable, "-m", "ccbench", "launch", "-n", "2", "allreduce",
                        "--backend", backend, "--sizes", "8-4M", "--iters", str(ITERS),
                        "--timing", timing, "--pipeline", "20", "-q", "--output", str(out),
                        *extra], env=ENV, check=True, capture_output=True, timeout=1200)
        return {json.loads(l)["size_used"]: json.loads(l)["time_us"]["median"]
                for l in out.read_text().splitlines()}


BARE_GLOO = r"""
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1],
                        rank=int(os.environ["R"]), world_size=2)
for size in [8 << i for i in range(20)]:
    t = torch.ones(size // 4)
    for _ in range(5): dist.all_reduce(t)
    best = []
    for _ in range(10):
        dist.barrier(); start = time.perf_counter()
        for _ in range(20): dist.all_reduce(t)
        best.append((time.perf_counter() - start) / 20 * 1e6)
    best.sort()
    if dist.get_rank() == 0: print(size, best[len(best) // 2], flush=True)
"""


BARE_MPI = r"""
import time, numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
for size in [8 << i for i in range(20)]:
    a = np.ones(size // 4, np.float32); b = np.empty_like(a)
    for _ in range(20): comm.Allreduce(a, b, MPI.SUM)
    runs = []
    for _ in range(10):
        comm.Barrier(); start = time.perf_counter()
        for _ in range(20): comm.Allreduce(a, b, MPI.SUM)
        runs.append((time.perf_counter() - start) / 20 * 1e6)
    runs.sort()
    if comm.rank == 0: print(size, runs[len(runs) // 2], flush=True)
"""


def bare_mpi4py() -> dict[int, float]:
    """The floor of any Python harness: a bare mpi4py loop (no ccbench)."""
    out = subprocess.run([str(BIN / "mpiexec"), "-n", "2", sys.executable, "-c", BARE_MPI],
                         capture_output=True, text=True, env=ENV, timeout=600, check=True).stdout
    return {int(a): float(b) for a, b in (line.split() for line in out.splitlines())}


def bare_gloo() -> dict[int, float]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    procs = [subprocess.Popen([sys.executable, "-c", BARE_GLOO, port], env={**ENV, "R": str(r)},
                              stdout=subprocess.PIPE, text=True) for r in (0, 1)]
    out = procs[0].communicate(timeout=600)[0]
    procs[1].wait(timeout=60)
    return {int(a): float(b) for a, b in (line.split() for line in out.splitlines())}


def main() -> None:
    print(f"# machine: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}")
    imb = imb_allreduce()
    pipe = ccbench_times("mpi", "pipelined", ["--outofplace"])
    perop = ccbench_times("mpi", "per-op", ["--outofplace"])
    floor = bare_mpi4py()
    print("\n# Intel MPI allreduce, 2 ranks (I_MPI_WAIT_MODE=1 for all): ratios to IMB-MPI1 t_avg")
    print(f"{'bytes':>9} {'IMB us':>9} {'pipelined':>10} {'ratio':>6} {'per-op':>9} {'ratio':>6}"
          f" {'mpi4py':>9} {'ratio':>6}")
    for size in SIZES:
        if size in imb and size in pipe:
            print(f"{size:>9} {imb[size]:>9.2f} {pipe[size]:>10.2f} {pipe[size] / imb[size]:>6.2f}"
                  f" {perop[size]:>9.2f} {perop[size] / imb[size]:>6.2f}"
                  f" {floor[size]:>9.2f} {floor[size] / imb[size]:>6.2f}")
    bare = bare_gloo()
    ours = ccbench_times("gloo", "pipelined", ["--inplace"])
    print("\n# gloo allreduce, 2 ranks: ccbench (in-place, pipelined) / bare torch loop")
    print(f"{'bytes':>9} {'bare us':>9} {'ccbench':>9} {'ratio':>6}")
    for size in SIZES:
        if size in bare and size in ours:
            print(f"{size:>9} {bare[size]:>9.2f} {ours[size]:>9.2f} {ours[size] / bare[size]:>6.2f}")


if __name__ == "__main__":
    main()
