"""The exporter against the real ASTRA-sim: `ccbench simulate` vs the congestion-unaware binary.

For every topology ASTRA-sim's analytical backend has (Switch, Ring, FullyConnected),
every collective and cost formula, rank counts powers of two and not, sizes 1 KiB-1 GiB
one per workload plus one workload of several sizes: export, run the binary, print
binary time / ccbench time, or the one-line refusal. Usage:

    python scripts/astra_check.py [--ranks 2,3,4,5,8,12,16,64,100] [--quick]

Binaries from $CCBENCH_ASTRA_SIM_BIN or ../shared/tools/astra-sim/bin.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ccbench.errors import UsageError  # noqa: E402
from ccbench.formats.astra import astra_bin_dir, export_astra, run_astra  # noqa: E402
from ccbench.model.costs import FORMULAS  # noqa: E402
from ccbench.model.synthetic import known_model  # noqa: E402

COLLECTIVES = ("allreduce", "allgather", "reduce-scatter", "alltoall")
TOPOLOGIES = ("switch", "ring", "fully-connected")
SIZES = [1 << k for k in range(10, 31, 4)] + [1 << 30]     # 1K, 16K, 256K, 4M, 64M, 1G


def check(model, topo: str, p: int, coll: str, algo: str, sizes: list[int],
          aware: bool = False) -> tuple[str, float | str]:
    with tempfile.TemporaryDirectory() as tmp:
        try:
            man = export_astra(model, tmp, p, f"{topo}:{p}", coll, sizes, algorithm=algo)
        except UsageError as exc:
            return "refused", str(exc)
        t = run_astra(man, aware=aware)
        return "ran", t / (man["workload"]["total_us"] * 1e-6)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2,3,4,5,7,8,12,16,64,100")
    ap.add_argument("--gamma", type=float, default=2e-11, help="s/B (0 for none)")
    ap.add_argument("--quick", action="store_true", help="sizes 1K, 1M, 1G only")
    args = ap.parse_args()
    binary = astra_bin_dir() / "AstraSim_Analytical_Congestion_Unaware"
    if not binary.is_file():
        print(f"astra_check: error: no ASTRA-sim binary at {binary} (set CCBENCH_ASTRA_SIM_BIN "
              f"to its folder, or build it: scripts/build-astra-sim.sh)", file=sys.stderr)
        return 2
    try:
        ranks = [int(x) for x in args.ranks.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--ranks {args.ranks!r}: a comma list of integers")
    try:
        return _check_all(args, ranks)
    except UsageError as exc:                   # the binary failed: its line, not a traceback
        print(f"astra_check: error: {exc}", file=sys.stderr)
        return 2


def _check_all(args: argparse.Namespace, ranks: list[int]) -> int:
    sizes = [1 << 10, 1 << 20, 1 << 30] if args.quick else SIZES
    model = known_model(alpha=5e-6, beta=1e-10, gamma=args.gamma)
    worst: dict[tuple, list[float]] = defaultdict(list)
    refused: dict[tuple, set[str]] = defaultdict(set)
    for topo in TOPOLOGIES:
        for coll in COLLECTIVES:
            for algo in FORMULAS[coll]:
                for p in ranks:
                    workloads = [[s] for s in sizes] + [sizes[:3]]
                    for ws in workloads:
                        what, val = check(model, topo, p, coll, algo, ws)
                        key = (topo, coll, algo)
                        if what == "ran":
                            worst[key].append(float(val))
                            if abs(float(val) - 1) > 0.01:
                                print(f"OFF  {topo}:{p} {coll} {algo} sizes {ws}: ratio {val:.4f}")
                        else:
                            refused[key].add(f"p={p}: {val}")
    print(f"\n{'topology':16} {'collective':15} {'formula':19} {'runs':>5} "
          f"{'min ratio':>10} {'max ratio':>10}  refused")
    for topo in TOPOLOGIES:
        for coll in COLLECTIVES:
            for algo in FORMULAS[coll]:
                key = (topo, coll, algo)
                r = worst.get(key, [])
                ref = refused.get(key, set())
                lo = f"{min(r):.5f}" if r else "-"
                hi = f"{max(r):.5f}" if r else "-"
                why = ""
                if ref:
                    first = sorted(ref)[0]
                    why = f"{len(ref)} rank counts, e.g. {first.split(': ', 1)[1][:90]}"
                print(f"{topo:16} {coll:15} {algo:19} {len(r):5} {lo:>10} {hi:>10}  {why}")
    bad = [k for k, r in worst.items() if any(abs(x - 1) > 0.01 for x in r)]
    print(f"\n{sum(len(r) for r in worst.values())} runs, {len(bad)} formula/topology pairs "
          f"outside 1 %")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
