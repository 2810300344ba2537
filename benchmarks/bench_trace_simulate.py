#!/usr/bin/env python
"""How long `simulate --trace` takes on real recorded traces at 1K-16K ranks.

    python benchmarks/bench_trace_simulate.py TRACES_DIR [--ranks 1024,4096] [--topology fat-tree]

TRACES_DIR holds one folder per workload, as `scripts/make-traces.py all -o TRACES_DIR`
writes. Prints, per workload, rank count and fidelity: the wall time of the prediction
(trace parsing excluded), the ops priced and the predicted total. The machine's load
average is printed with it: times measured on a shared machine say so.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from ccbench.formats import load_trace
    from ccbench.model.synthetic import known_model
    from ccbench.model.tracesim import simulate_trace

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", help="folder of workload folders (make-traces.py all)")
    parser.add_argument("--ranks", default="1024,4096")
    parser.add_argument("--topology", default="fat-tree", help="kind; :RANKS is appended")
    args = parser.parse_args()
    model = known_model(alpha=5e-6, beta=1e-10, gamma=2e-11)
    print(f"# load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"{'workload':>8} {'ranks':>6} {'fidelity':>10} {'seconds':>8} {'ops':>4} "
          f"{'total_us':>12}")
    for folder in sorted(p for p in Path(args.traces).iterdir() if p.is_dir()):
        trace = load_trace([folder])
        for ranks in (int(x) for x in args.ranks.split(",")):
            for fidelity in ("analytical", "replay"):
                start = time.perf_counter()
                out = simulate_trace(model, trace, ranks, f"{args.topology}:{ranks}", fidelity)
                took = time.perf_counter() - start
                print(f"{folder.name:>8} {ranks:>6} {fidelity:>10} {took:>8.2f} "
                      f"{len(out['ops']):>4} {out['total_us']:>12.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
