"""ccbench against the references, 2 ranks, interleaved process launches (prints; no asserts).

Each round launches, one after the other: IMB-MPI1 Allreduce (ships in the impi-rt wheel),
osu_allreduce (when found: $OSU_DIR or PATH; scripts/build-osu.sh builds it from an OSU
source tree against this environment's MPI), ccbench --backend mpi pipelined and per-op, ccbench pipelined at
--mpi-thread-level multiple, a bare mpi4py loop, a bare torch.distributed loop with the same
barrier per op as ccbench's per-op mode, and ccbench gloo per-op. A process lands in a fast or
slow state for its whole life (C programs too), so every figure is the median over --rounds
separate launches, and the spread between launches is printed beside it.

What is compared: IMB's t_avg (mean over ranks of each rank's mean over -iter calls) and OSU's
average latency against ccbench's median over samples (max over ranks) of
`--timing pipelined --pipeline N` (N calls from a C loop that reads the clock around them) and
of `--timing per-op`; the bare loops are combined as ccbench combines (max over ranks per
sample). Separate launches compare process states as much as code: where one launch is fast
and the next slow (a 2-vCPU VM, benchmarks/bench_wakeup.py), benchmarks/bench_timed_region.py
runs ccbench's timed region and a bare loop in the same processes instead.

Run: python benchmarks/bench_harness.py [--rounds 3]   (prints Markdown tables)
With the Python of an MPICH or Open MPI environment it measures that MPI (no IMB there: OSU
is the reference; Open MPI's mpiexec refuses root unless OMPI_ALLOW_RUN_AS_ROOT=1 and
OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 are set).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

BIN = Path(sys.executable).parent
ENV = {**os.environ, "LD_LIBRARY_PATH": f"{BIN.parent / 'lib'}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
ENV.pop("I_MPI_WAIT_MODE", None)            # busy polling, as IMB and OSU run by default
SIZES = [8, 64, 512, 4096, 32768, 65536, 262144, 1 << 20, 4 << 20]
ITERS, PIPELINE = 100, 50                   # ccbench: samples x calls per pipelined sample
REF_ITERS = 1000                            # IMB / OSU iterations per size
Times = dict[int, float]


def _run(cmd: list[str], env: dict[str, str] | None = None) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, env=env or ENV, timeout=900,
                          check=True).stdout


def imb() -> Times:
    if not (BIN / "IMB-MPI1").exists():         # ships with impi-rt only
        return {}
    out = _run([str(BIN / "mpiexec"), "-n", "2", str(BIN / "IMB-MPI1"), "Allreduce", "-msglog",
                "3:22", "-iter", str(REF_ITERS), "-iter_policy", "off", "-npmin", "2"])
    rows = (line.split() for line in out.splitlines())
    return {int(f[0]): float(f[4]) for f in rows if len(f) == 5 and f[0].isdigit()}


def osu_binary() -> str | None:
    for folder in (os.environ.get("OSU_DIR"), *os.environ.get("PATH", "").split(os.pathsep)):
        if folder:
            for candidate in (Path(folder) / "osu_allreduce",
                              Path(folder) / "mpi" / "collective" / "osu_allreduce"):
                if candidate.exists():
                    return str(candidate)
    return None


def osu() -> Times:
    binary = osu_binary()
    if binary is None:
        return {}
    out = _run([str(BIN / "mpiexec"), "-n", "2", binary, "-m", f"8:{max(SIZES)}", "-i",
                str(REF_ITERS), "-x", "100", "-T", "mpi_float"])   # ccbench's dtype, not MPI_CHAR
    rows = (line.split() for line in out.splitlines())
    return {int(f[0]): float(f[1]) for f in rows if len(f) >= 2 and f[0].isdigit()}


def ccbench(backend: str, timing: str, *extra: str) -> Times:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.jsonl"
        _run([sys.executable, "-m", "ccbench", "launch", "-n", "2", "allreduce", "--backend",
              backend, "--sizes", ",".join(map(str, SIZES)), "--iters", str(ITERS), "--warmup",
              "5", "--timing", timing, "--pipeline", str(PIPELINE), "--check", "0", "-q",
              "--output", str(out), *extra])
        records = [json.loads(line) for line in out.read_text().splitlines()]
        return {r["size_used"]: r["time_us"]["median"] for r in records}


BARE_MPI = r"""
import json, sys, time, numpy as np, mpi4py
mpi4py.rc.thread_level = "funneled"
from mpi4py import MPI
comm = MPI.COMM_WORLD
for size in map(int, sys.argv[1:]):
    a = np.ones(size // 4, np.float32); b = np.empty_like(a)
    send, recv = [a, MPI.FLOAT], [b, MPI.FLOAT]
    for _ in range(20): comm.Allreduce(send, recv, MPI.SUM)
    runs = []
    for _ in range(100):
        comm.Barrier(); start = time.perf_counter()
        for _ in range(50): comm.Allreduce(send, recv, MPI.SUM)
        runs.append((time.perf_counter() - start) / 50 * 1e6)
    print(json.dumps([comm.rank, size, runs]), flush=True)
"""

BARE_GLOO = r"""
import json, os, sys, time, torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1],
                        rank=int(os.environ["R"]), world_size=2)
for size in map(int, sys.argv[2:]):
    t = torch.ones(size // 4)
    for _ in range(5): dist.all_reduce(t)
    times = []
    for _ in range(100):
        dist.barrier(); start = time.perf_counter(); dist.all_reduce(t)
        times.append((time.perf_counter() - start) * 1e6)
    print(json.dumps([dist.get_rank(), size, times]), flush=True)
"""


def _max_over_ranks(out: str) -> Times:
    """Per size: the median over samples of the max over ranks, as ccbench combines them."""
    ranks: dict[int, dict[int, list[float]]] = {}
    for line in out.splitlines():
        rank, size, times = json.loads(line)
        ranks.setdefault(size, {})[rank] = times
    return {size: statistics.median(max(pair) for pair in zip(*per_rank.values(), strict=True))
            for size, per_rank in ranks.items()}


def bare_mpi4py() -> Times:
    return _max_over_ranks(_run([str(BIN / "mpiexec"), "-n", "2", sys.executable, "-c",
                                 BARE_MPI, *map(str, SIZES)]))


def bare_gloo() -> Times:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    procs = [subprocess.Popen([sys.executable, "-c", BARE_GLOO, port, *map(str, SIZES)],
                              env={**ENV, "R": str(r)}, stdout=subprocess.PIPE, text=True)
             for r in (0, 1)]
    out = [proc.communicate(timeout=900)[0] for proc in procs]
    return _max_over_ranks("".join(out))


TOOLS: dict[str, Callable[[], Times]] = {
    "IMB": imb,
    "OSU": osu,
    "pipelined": lambda: ccbench("mpi", "pipelined", "--outofplace"),
    "per-op": lambda: ccbench("mpi", "per-op", "--outofplace"),
    # IMB's t_avg and OSU's average latency are means over ranks; ccbench's default is the max
    "pipelined-mean": lambda: ccbench("mpi", "pipelined", "--outofplace", "--combine", "mean"),
    "pipelined-multiple": lambda: ccbench("mpi", "pipelined", "--outofplace",
                                          "--mpi-thread-level", "multiple"),
    "mpi4py loop": bare_mpi4py,
    "gloo bare": bare_gloo,
    "gloo per-op": lambda: ccbench("gloo", "per-op", "--inplace"),
}


def _mpi_library() -> str:
    out = _run([sys.executable, "-c", "from mpi4py import MPI; "
                "print(MPI.Get_library_version().splitlines()[0])"])
    return out.replace("\0", "").strip()      # Open MPI's version string ends in a NUL


def _fmt(values: list[float]) -> str:
    if not values:
        return "-"
    middle = statistics.median(values)
    return f"{middle:.2f} ({min(values):.2f}-{max(values):.2f})" if len(values) > 1 else f"{middle:.2f}"


def _ratio(num: list[float], den: list[float]) -> str:
    if not num or not den:
        return "-"
    return f"{statistics.median(num) / statistics.median(den):.2f}"


def _print_targets(per_size: Callable[[str, int], list[float]]) -> None:
    """The issue's targets: pipelined / reference at most 1.3 from 8 B, 1.05 from 64 KiB."""
    for ours, ref in itertools.product(("pipelined", "pipelined-mean"), ("IMB", "OSU")):
        ratios = {s: statistics.median(per_size(ours, s)) / statistics.median(per_size(ref, s))
                  for s in SIZES if per_size(ours, s) and per_size(ref, s)}
        if ratios:
            small = max(ratios.values())
            large = max(r for s, r in ratios.items() if s >= 65536)
            print(f"\n# {ours}/{ref}: worst {small:.2f} from 8 B (target 1.3), "
                  f"{large:.2f} from 64 KiB (target 1.05)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="process launches per tool")
    parser.add_argument("--tools", default=",".join(TOOLS),
                        help=f"comma-separated subset of: {', '.join(TOOLS)} (an MPICH or Open "
                             "MPI environment without torch: leave out the gloo ones)")
    args = parser.parse_args()
    chosen = [name.strip() for name in args.tools.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(TOOLS))
    if unknown:
        parser.error(f"unknown tool(s) {', '.join(unknown)}; valid: {', '.join(TOOLS)}")
    loads = [os.getloadavg()[0]]
    runs: dict[str, list[Times]] = {name: [] for name in TOOLS}
    for round_number in range(args.rounds):         # interleaved: one launch of each per round
        for name in chosen:
            runs[name].append(TOOLS[name]())
            loads.append(os.getloadavg()[0])
        print(f"# round {round_number + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    def per_size(name: str, size: int) -> list[float]:
        return [run[size] for run in runs[name] if size in run]

    osu_note = ("osu_allreduce: " + (osu_binary() or "not found (scripts/build-osu.sh builds "
                "it; set OSU_DIR)"))
    print(f"# {datetime.date.today()}  {platform.node()}  {os.cpu_count()} cores  "
          f"{platform.processor() or platform.machine()}  2 ranks, {_mpi_library()}, "
          f"busy polling; load average {min(loads):.1f}-{max(loads):.1f} during the run")
    print(f"# {osu_note}")
    print(f"# medians over {args.rounds} launches, (min-max between launches); times in us\n")
    print("| bytes | IMB t_avg | ccbench pipelined | /IMB | per-op | /IMB | pipelined, thread "
          "multiple | /IMB | mpi4py loop | /IMB | OSU | pipelined/OSU | per-op/OSU |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for size in SIZES:
        ref = per_size("IMB", size)
        cells = [_fmt(ref)]
        for name in ("pipelined", "per-op", "pipelined-multiple", "mpi4py loop"):
            cells += [_fmt(per_size(name, size)), _ratio(per_size(name, size), ref)]
        cells += [_fmt(per_size("OSU", size)),
                  _ratio(per_size("pipelined", size), per_size("OSU", size)),
                  _ratio(per_size("per-op", size), per_size("OSU", size))]
        print(f"| {size} | " + " | ".join(cells) + " |")
    if "pipelined-mean" in chosen:
        print("\n| bytes | ccbench pipelined, mean over ranks (--combine mean) | /IMB | /OSU |")
        print("|---|---|---|---|")
        for size in SIZES:
            ours = per_size("pipelined-mean", size)
            print(f"| {size} | {_fmt(ours)} | {_ratio(ours, per_size('IMB', size))} | "
                  f"{_ratio(ours, per_size('OSU', size))} |")
    _print_targets(per_size)
    if "gloo bare" in chosen or "gloo per-op" in chosen:
        print("\n| bytes | gloo bare loop (barrier per op) | ccbench gloo per-op | ratio |")
        print("|---|---|---|---|")
        for size in SIZES:
            bare, ours = per_size("gloo bare", size), per_size("gloo per-op", size)
            print(f"| {size} | {_fmt(bare)} | {_fmt(ours)} | {_ratio(ours, bare)} |")
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        print("\n# no C compiler: ccbench pipelined ran its itertools loop, not the C loop")


if __name__ == "__main__":
    main()
