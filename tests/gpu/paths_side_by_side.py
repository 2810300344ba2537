"""The two NCCL paths side by side: allreduce through torch.distributed (`nccl`, transport torch)
and through CuPy's binding (`nccl-cupy`, transport cupy), from one records file.

    python tests/gpu/paths_side_by_side.py FILE.jsonl [--a nccl] [--b nccl-cupy]

Prints one row per (mode, dtype, size): each path's median time, torch's out-of-place device
copy (timed alone) and b/a. In place both make the same ncclAllReduce call, so the ratio
should be ~1 within noise; out of place torch adds its copy. Figures only: exit status 1 only
when a path is missing or a record is not exact.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ccbench.records import load_records


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="paths_side_by_side.py")
    parser.add_argument("path")
    parser.add_argument("--a", default="nccl")
    parser.add_argument("--b", default="nccl-cupy")
    args = parser.parse_args(argv)
    records = [r for r in load_records(args.path) if r.collective == "allreduce"]
    table: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in records:
        table.setdefault((r.inplace, r.dtype, r.op, r.size_used), {})[r.backend] = r
    bad = [r for r in records if r.wrong != 0]
    missing = [key for key, row in table.items() if args.a not in row or args.b not in row]
    print(f"{'mode':<12} {'dtype':<9} {'op':<4} {'bytes':>10} {args.a + ' us':>12} "
          f"{'copy us':>9} {args.b + ' us':>14} {'b/a':>6}  transports")
    def order(item: tuple[tuple[Any, ...], Any]) -> tuple[Any, ...]:
        inplace, dtype, op, size = item[0]
        return inplace, dtype, str(op), size

    for (inplace, dtype, op, size), row in sorted(table.items(), key=order):
        a, b = row.get(args.a), row.get(args.b)
        if a is None or b is None:
            continue
        ta, tb = a.time_us["median"], b.time_us["median"]
        copy = a.method.get("local_copy_us")
        print(f"{'in-place' if inplace else 'out-of-place':<12} {dtype:<9} {op or '':<4} "
              f"{size:>10} {ta:>12.2f} {'' if copy is None else f'{copy:.2f}':>9} {tb:>14.2f} "
              f"{tb / ta if ta else float('nan'):>6.2f}  {a.transport}/{b.transport}")
    print(f"{'PASS' if not bad else 'FAIL'}  every allreduce record exact ({len(records)})")
    print(f"{'PASS' if not missing and table else 'FAIL'}  both paths for every case "
          f"({len(table)} cases, {len(missing)} with one path only)")
    return 1 if bad or missing or not table else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
