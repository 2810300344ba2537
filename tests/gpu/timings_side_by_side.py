"""Per-op and pipelined timing of the same cases side by side, from two records files.

    python tests/gpu/timings_side_by_side.py PER_OP.jsonl PIPELINED.jsonl [--dtype float32]

One row per (backend, collective, mode, size) of the dtype (reductions: sum only): each
timing's median time and algbw, and pipelined/per-op. Per-op timing waits for the device
after every operation, pipelined once per batch, so pipelined is expected at or below per-op
(most at small sizes, where the launch and the wait dominate). Figures only: exit status 1
only when a file holds no record of the dtype, when the two files share no case, or when a
record is not exact.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ccbench.records import load_records


def _case(r: Any) -> tuple[Any, ...]:
    return r.backend, r.collective, r.inplace, r.size_used


def _by_case(path: str, dtype: str) -> dict[tuple[Any, ...], Any]:
    return {_case(r): r for r in load_records(path)
            if r.dtype == dtype and r.op in (None, "sum")}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="timings_side_by_side.py")
    parser.add_argument("per_op")
    parser.add_argument("pipelined")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    per_op, pipelined = _by_case(args.per_op, args.dtype), _by_case(args.pipelined, args.dtype)
    shared = sorted(set(per_op) & set(pipelined), key=lambda c: (c[0], c[1], c[2], c[3]))
    print(f"{'backend':<10} {'collective':<15} {'mode':<12} {'bytes':>10} {'per-op us':>11} "
          f"{'pipelined us':>13} {'ratio':>6} {'per-op GB/s':>12} {'pipelined GB/s':>15}")
    for case in shared:
        a, b = per_op[case], pipelined[case]
        ta, tb = a.time_us["median"], b.time_us["median"]
        print(f"{case[0]:<10} {case[1]:<15} {'in-place' if case[2] else 'out-of-place':<12} "
              f"{case[3]:>10} {ta:>11.2f} {tb:>13.2f} {tb / ta if ta else float('nan'):>6.2f} "
              f"{a.algbw_gbps:>12.2f} {b.algbw_gbps:>15.2f}")
    wrong = [c for c in shared if per_op[c].wrong or pipelined[c].wrong]
    ok = bool(per_op) and bool(pipelined) and bool(shared) and not wrong
    print(f"{'PASS' if ok else 'FAIL'}  {len(shared)} {args.dtype} cases in both timings "
          f"({len(per_op)} per-op, {len(pipelined)} pipelined, {len(wrong)} not exact)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
