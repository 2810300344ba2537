"""`ccbench algorithms verify|show|list`: prove the algorithms/ schedules right, print them.

    ccbench algorithms verify --ranks 1-64           every algorithm x collective, p = 1..64
    ccbench algorithms verify --ranks 3,5 --algorithm ring --segments 1,4
    ccbench algorithms show ring allreduce --ranks 4 one step table per rank
    ccbench algorithms list                          what exists
"""

from __future__ import annotations

import argparse
import time

from ccbench.errors import UsageError, choices_error, error_line

__all__ = ["main", "parse_ranks", "register"]

_MAX_RANKS = 4096


def parse_ranks(text: str) -> list[int]:
    """`1-64`, `4`, `1,2,5`, `1-8,16` -> sorted rank counts."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise UsageError(f"malformed --ranks {text!r}: empty item")
        low, sep, high = part.partition("-")
        try:
            a = int(low)
            b = int(high) if sep else a
        except ValueError:
            raise UsageError(f"malformed --ranks {text!r} (examples: 4, 1-64, 2,3,5)") from None
        if a < 1 or b < a or b > _MAX_RANKS:
            raise UsageError(f"bad --ranks {part!r}: need 1 <= low <= high <= {_MAX_RANKS}")
        out.update(range(a, b + 1))
    return sorted(out)


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"malformed --{what} {text!r} (example: 1,4)") from None
    if not values or min(values) < 1:
        raise UsageError(f"--{what} needs integers >= 1, got {text!r}")
    return values


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("algorithms", help="verify and show the algorithm schedules")
    sub = parser.add_subparsers(dest="action", required=True)
    v = sub.add_parser("verify", help="prove every schedule right for each rank count")
    v.add_argument("--ranks", default="1-64", help="rank counts: 1-64, 4, 2,3,5 (default 1-64)")
    v.add_argument("--algorithm", default="all", help="comma list or all (default all)")
    v.add_argument("--collective", default="all", help="comma list or all (default all)")
    v.add_argument("--segments", default="1", help="pipeline segments to try, e.g. 1,3 (default 1)")
    v.add_argument("--root", default="0,last", help="roots of broadcast/reduce: 0,last (default)")
    s = sub.add_parser("show", help="print one schedule, a step table per rank")
    s.add_argument("algorithm", help="ring, tree, hypercube, ... (`algorithms list` names them)")
    s.add_argument("collective", help="the collective whose schedule to show, e.g. allreduce")
    s.add_argument("--ranks", type=int, default=4, help="rank count (default 4)")
    s.add_argument("--root", type=int, default=0, help="root rank of a rooted collective (default 0)")
    s.add_argument("--segments", type=int, default=1,
                   help="pipeline segments per message (default 1)")
    sub.add_parser("list", help="algorithms and the collectives each has")


def _select(text: str, valid: list[str], what: str) -> list[str]:
    if text == "all":
        return valid
    names = [x.strip() for x in text.split(",") if x.strip()]
    for name in names:
        if name not in valid:
            raise choices_error(what, name, valid)
    return names


def _verify(args: argparse.Namespace) -> int:
    from algorithms import REGISTRY, generate, verify

    ranks = parse_ranks(args.ranks)
    algos = _select(args.algorithm, list(dict.fromkeys(a for a, _ in REGISTRY)), "algorithm")
    colls = _select(args.collective, list(dict.fromkeys(c for _, c in REGISTRY)), "collective")
    segments = _int_list(args.segments, "segments")
    roots = [r.strip() for r in args.root.split(",") if r.strip()]
    for r in roots:
        if r != "last" and not r.isdigit():
            raise UsageError(f"malformed --root {args.root!r} (example: 0,last)")
    pairs = [(a, c) for a, c in REGISTRY if a in algos and c in colls]
    if not pairs:
        raise UsageError(f"no schedule for --algorithm {args.algorithm} --collective "
                         f"{args.collective}")
    # steps: the most steps of one rank, messages: all messages, both at the largest p
    print(f"{'algorithm':<13} {'collective':<15} {'ranks':>9} {'cases':>6} {'failed':>6} "
          f"{'in-place':>9} {'steps':>6} {'messages':>9}  first failure")
    total_failed = 0
    started = time.monotonic()
    for algo, coll in pairs:
        cases = failed = 0
        first = ""
        inplace = "n/a"
        steps = msgs = 0
        for p in ranks:
            root_values = sorted({p - 1 if r == "last" else int(r) for r in roots
                                  if r == "last" or int(r) < p}) if coll in (
                "broadcast", "reduce") else [0]
            for root in root_values:
                for k in segments:
                    sched = generate(algo, coll, p, root, k)
                    modes = [False]
                    if coll not in ("broadcast", "reduce"):
                        inplace = "verified" if sched.inplace_safe else "snapshot"
                        if sched.inplace_safe:
                            modes.append(True)
                    for mode in modes:
                        result = verify(sched, inplace=mode)
                        cases += 1
                        if not result.ok:
                            failed += 1
                            if not first:
                                first = (f"p={p} root={root} segments={k}"
                                         f"{' in-place' if mode else ''}: {result.errors[0]}")
                        elif p == ranks[-1] and k == segments[0] and not mode:
                            steps, msgs = result.num_steps, result.num_messages
        total_failed += failed
        span = f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])
        print(f"{algo:<13} {coll:<15} {span:>9} {cases:>6} {failed:>6} {inplace:>9} "
              f"{steps:>6} {msgs:>9}  {first}", flush=True)
    verdict = "all schedules verified" if not total_failed else f"{total_failed} FAILED"
    print(f"{verdict} ({time.monotonic() - started:.1f} s)")
    return 0 if not total_failed else 1


def _show(args: argparse.Namespace) -> int:
    from algorithms import REGISTRY, generate, verify

    if (args.algorithm, args.collective) not in REGISTRY:
        raise choices_error("schedule", f"{args.algorithm} {args.collective}",
                            [f"{a} {c}" for a, c in REGISTRY])
    if args.ranks < 1 or not 0 <= args.root < args.ranks or args.segments < 1:
        raise UsageError(f"need --ranks >= 1, 0 <= --root < ranks and --segments >= 1 "
                         f"(got {args.ranks}, {args.root}, {args.segments})")
    sched = generate(args.algorithm, args.collective, args.ranks, args.root, args.segments)
    result = verify(sched)
    units = ", ".join(f"{b}: {n} unit(s)" for b, n in sched.units.items())
    print(f"{sched.algorithm} {sched.collective} on {sched.num_ranks} ranks, root {sched.root}, "
          f"{sched.blocks_per_unit} block(s) per unit ({units})")
    if sched.notes:
        print(sched.notes)
    for rank in range(sched.num_ranks):
        print(f"rank {rank}:")
        lines = sched.describe(rank)
        print("\n".join(lines) if lines else "     (nothing to do)")
    print(result)
    return 0 if result.ok else 1


def _list() -> int:
    from algorithms import REGISTRY

    by_algo: dict[str, list[str]] = {}
    for a, c in REGISTRY:
        by_algo.setdefault(a, []).append(c)
    for a, cs in by_algo.items():
        print(f"{a:<13} {', '.join(cs)}")
    return 0


def main(args: argparse.Namespace) -> int:
    if args.action == "verify":
        return _verify(args)
    if args.action == "show":
        return _show(args)
    return _list()


if __name__ == "__main__":
    import sys

    _parser = argparse.ArgumentParser(prog="ccbench")
    register(_parser.add_subparsers(dest="command", required=True))
    try:
        sys.exit(main(_parser.parse_args(sys.argv[1:])))
    except UsageError as exc:
        print(error_line(exc), file=sys.stderr)
        sys.exit(2)
