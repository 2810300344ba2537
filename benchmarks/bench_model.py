"""Scale figures of ccbench.model: analytical prediction at 16384 ranks and schedule replay
of ring allreduce at 1024 ranks. Prints the figures; targets: < 1 s and < 10 s.

    python benchmarks/bench_model.py [--ranks-analytical 16384] [--ranks-replay 1024]
"""

from __future__ import annotations

import argparse
import time

from ccbench.model.costs import predict_time
from ccbench.model.fit import calibrate
from ccbench.model.modelfile import build_model
from ccbench.model.netsim import replay, ring_program
from ccbench.model.simulate import simulate
from ccbench.model.synthetic import synthetic_records
from ccbench.model.topology import LinkClass, build_topology
from ccbench.units import parse_sizes

ALPHA, BETA, GAMMA = 5e-6, 1 / 12.5e9, 1 / 50e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ranks-analytical", type=int, default=16384)
    ap.add_argument("--ranks-replay", type=int, default=1024)
    ap.add_argument("--size", default="256M", help="replay message size (default 256M)")
    args = ap.parse_args()

    sizes = [2 ** k for k in range(10, 25)]
    recs = synthetic_records("allgather", "ring", [2, 4, 8], sizes, ALPHA, BETA, GAMMA, seed=1)
    recs += synthetic_records("allreduce", "ring", [2, 4, 8], sizes, ALPHA, BETA, GAMMA, seed=2)
    t0 = time.perf_counter()
    model = build_model(calibrate(recs, bootstrap=100), recs, ["synthetic"])
    t_fit = time.perf_counter() - t0
    print(f"calibrate: {len(recs)} records, {len(model['fits'])} fits, bootstrap 100: {t_fit:.2f} s")

    p = args.ranks_analytical
    for topo in (f"fat-tree:{p}:leaf=32:oversub=2", f"switch:{p}", f"torus:{p // 256}x16x16"):
        t0 = time.perf_counter()
        out = simulate(model, "allreduce", p, topo, parse_sizes("1K-1G"))
        dt = time.perf_counter() - t0
        last = out["rows"][-1]
        print(f"analytical allreduce {out['algorithm']}, {p} ranks on {topo}: 21 sizes in "
              f"{dt:.3f} s (target < 1 s); 1G: {last['time_us'] / 1e3:.1f} ms, "
              f"busbw {last['busbw_gbps']:.2f} GB/s")

    p = args.ranks_replay
    n = parse_sizes(args.size)[0]
    lc = LinkClass(ALPHA, BETA)
    for spec in (f"ring:{p}", f"switch:{p}"):
        topo = build_topology(spec, None, lc)
        t0 = time.perf_counter()
        prog = ring_program("allreduce", p, n)
        res = replay(prog, topo, GAMMA)
        dt = time.perf_counter() - t0
        ana = predict_time("allreduce", "ring", p, n, ALPHA, BETA, GAMMA)
        print(f"replay ring allreduce, {p} ranks on {spec}, {args.size}: {dt:.2f} s "
              f"(target < 10 s); {res.messages} messages, {res.events} event batches; "
              f"simulated {res.time * 1e3:.2f} ms vs formula {ana * 1e3:.2f} ms "
              f"(ratio {res.time / ana:.6f})")

    # where contention shows
    for coll, algo, spec in (("allreduce", "recursive-doubling", "ring:64"),
                             ("alltoall", "pairwise", "fat-tree:256:leaf=16:oversub=4")):
        out = simulate(model, coll, int(spec.split(":")[1]), spec, [1 << 24], algo, "both")
        row = out["rows"][0]
        print(f"contention: {coll} {algo} on {spec}, 16M: replay/analytical "
              f"{row['replay_vs_analytical']:.2f}, up to {row['max_flows_per_link']} flows/link")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
