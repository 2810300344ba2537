"""Scale of the contention-aware replay: wall time and peak memory at 1K, 4K and 16K ranks,
and the real ASTRA-sim congestion-aware binary on the same exported case.

Every point runs in a fresh child process, so its peak RSS (getrusage ru_maxrss) is its own.

    python benchmarks/bench_simulate.py matrix [--ranks 1024,4096,16384]
    python benchmarks/bench_simulate.py astra --ranks 1024 [--model results/model.json]

matrix: every required algorithm on an oversubscribed fat tree (leaves of 32, oversub 4),
a dual-plane (8 ranks per host, 16 hosts per ToR, oversub 2) and a 3D torus, 64 MiB,
synthetic links (5 us, 12.5 GB/s, gamma 1/50 GB/s). astra: `ccbench simulate --fidelity both`
beside AstraSim_Analytical_Congestion_Aware on `ccbench export astra-sim` of the same model,
collective and size (ring allreduce on switch:P; the exporter refuses multi-dimension
topologies). The machine is shared: the load average is printed with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ccbench.formats.astra import astra_bin_dir

ROOT = Path(__file__).resolve().parents[1]
ALPHA, BETA, GAMMA = 5e-6, 1 / 12.5e9, 1 / 50e9
CASES = (("allreduce", "ring"), ("allreduce", "tree"), ("allreduce", "recursive-doubling"),
         ("reduce-scatter", "recursive-halving"), ("allreduce", "rabenseifner"),
         ("allgather", "bruck"), ("alltoall", "bruck"), ("alltoall", "pairwise"))


def torus(p: int) -> str:
    side = round(p ** (1 / 3))
    while p % side:
        side -= 1
    rest = p // side
    a = round(rest ** 0.5)
    while rest % a:
        a -= 1
    return f"torus:{rest // a}x{a}x{side}"


def topologies(p: int) -> list[str]:
    return [f"fat-tree:{p}:leaf=32:oversub=4", f"dual-plane:{p}:gpus=8:tor=16:oversub=2", torus(p)]


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def child(collective: str, algorithm: str, spec: str, size: int) -> None:
    from ccbench.model.netsim import replay_collective
    from ccbench.model.topology import LinkClass, build_topology

    t0 = time.perf_counter()
    topo = build_topology(spec, None, LinkClass(ALPHA, BETA))
    res = replay_collective(collective, algorithm, topo.ranks, size, topo, GAMMA)
    wall = time.perf_counter() - t0
    print(json.dumps({"wall_s": wall, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                      / 1024, "time_us": res.time * 1e6, "engine": res.engine,
                      "max_flows": res.max_link_flows, "rounds": res.events}))


def run_child(args: list[str], timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        proc = subprocess.run([sys.executable, __file__, "child", *args], capture_output=True,
                              text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1]}
    return json.loads(proc.stdout)


def matrix(ranks: list[int], size: int, timeout: float) -> None:
    print(f"# replay of 64 MiB, synthetic links; load average before: {load()}")
    print(f"{'ranks':>6} {'topology':40} {'collective':15} {'algorithm':19} "
          f"{'wall_s':>7} {'rss_MB':>7} {'predicted_ms':>12} flows  load")
    for p in ranks:
        for spec in topologies(p):
            for coll, algo in CASES:
                out = run_child([coll, algo, spec, str(size)], timeout)
                if "error" in out:
                    print(f"{p:6d} {spec:40} {coll:15} {algo:19} {out['error']}  {load()}")
                    continue
                print(f"{p:6d} {spec:40} {coll:15} {algo:19} {out['wall_s']:7.2f} "
                      f"{out['rss_mb']:7.0f} {out['time_us'] / 1e3:12.3f} {out['max_flows']:5d}"
                      f"  {load()}", flush=True)


def timed(cmd: list[str], cwd: str | None = None, timeout: float = 900) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MB) of the child, stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{cmd[0]} failed: {proc.stderr.strip()[-400:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, (peak if peak > before else float("nan")) / 1024, proc.stdout


def astra(ranks: list[int], model: str, backend: str, size: str, timeout: float) -> None:
    """ccbench replay and ASTRA-sim congestion-aware on `ccbench export` of the same case.
    Peak RSS per child needs a fresh RUSAGE_CHILDREN maximum: run one rank count per call."""
    for p in ranks:
        spec = f"switch:{p}"
        wall, rss, out = timed([sys.executable, "-m", "ccbench", "simulate", model, "allreduce",
                                "--ranks", str(p), "--topology", spec, "--algorithm", "ring",
                                "--fidelity", "both", "--sizes", size, "--backend", backend,
                                "--format", "json"])
        row = json.loads(out)["rows"][0]
        print(f"ccbench simulate --fidelity both, ring allreduce {size} on {spec}: {wall:.2f} s, "
              f"peak {rss:.0f} MB (load {load()}); analytical {row['time_us'] / 1e3:.3f} ms, "
              f"replay {row['replay_time_us'] / 1e3:.3f} ms ({row['replay_engine']})")
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "ccbench", "export", "astra-sim", model, "-o",
                            tmp, "--ranks", str(p), "--topology", spec, "--collective",
                            "allreduce", "--sizes", size, "--backend", backend], check=True,
                           capture_output=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
            wall, rss, out = timed([str(astra_bin_dir() / "AstraSim_Analytical_Congestion_Aware"),
                                    "--workload-configuration=workload",
                                    "--system-configuration=system.json",
                                    "--network-configuration=network.yml",
                                    "--remote-memory-configuration=remote_memory.json"],
                                   cwd=tmp, timeout=timeout)
        cycles = max(int(x) for x in re.findall(r"finished, (\d+) cycles", out))
        print(f"ASTRA-sim congestion-aware, same export: {wall:.2f} s, peak {rss:.0f} MB "
              f"(load {load()}); {cycles / 1e6:.3f} ms; ccbench replay / ASTRA-sim "
              f"{row['replay_time_us'] * 1e3 / cycles:.4f}")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("matrix", "astra"))
    ap.add_argument("--ranks", default="1024,4096,16384")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per point")
    ap.add_argument("--model", default=str(ROOT / "results" / "model.json"))
    ap.add_argument("--backend", default="mpi/Intel MPI")
    ap.add_argument("--size", default="64M")
    args = ap.parse_args()
    ranks = [int(x) for x in args.ranks.split(",")]
    if args.what == "matrix":
        matrix(ranks, 64 << 20, args.timeout)
    else:
        astra(ranks, args.model, args.backend, args.size, args.timeout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
