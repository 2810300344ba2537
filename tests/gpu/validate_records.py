"""Check the records a GPU check run wrote: no wrong element, the device and labels expected,
and (with --full) every collective x dtype x op x mode present.

    python tests/gpu/validate_records.py FILE.jsonl --backend nccl --world 1 --timing per-op \
        --device cuda --ops sum,max,min,prod --full [--buffers host-staging]
    python tests/gpu/validate_records.py FILE.jsonl --beside nccl --world 1 --timing per-op

--beside NATIVE: the file holds algorithm backends next to the library's own (NATIVE); every
algorithm record must be exact and have NATIVE's exact record of the same case and size beside
it (both are compared bit for bit with the same expected values, so they agree bit for bit).

Prints one PASS/FAIL line per check; exit status 1 when any check fails.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from typing import Any

from ccbench.collectives import COLLECTIVES, REDUCING
from ccbench.collectives import get as get_collective
from ccbench.dtypes import DTYPES
from ccbench.records import load_records


def _refuses(backend: str) -> Any:
    """The backend's refusals (dtype, op) -> reason or None: what `--dtype all` leaves out."""
    from ccbench.backends import backend_class

    return backend_class(backend).refuses


def bound_collectives(backend: str) -> list[str]:
    """The collectives the backend binds (its class's table; nccl-cupy has no gather)."""
    from ccbench.backends import backend_class

    builders = getattr(backend_class(backend), "builders", None)
    return [c for c in COLLECTIVES if builders is None or c in builders]


def expected_cases(ops: list[str], backend: str) -> set[tuple[Any, ...]]:
    refuses = _refuses(backend)
    cases = set()
    for collective, dtype in itertools.product(bound_collectives(backend), DTYPES):
        for op in (ops if collective in REDUCING else [None]):
            if refuses(DTYPES[dtype], op):
                continue
            for inplace in get_collective(collective).modes((False, True)):
                cases.add((collective, dtype, op, inplace))
    return cases


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="validate_records.py")
    parser.add_argument("path")
    parser.add_argument("--backend", default=None)
    parser.add_argument("--beside", default=None, metavar="NATIVE",
                        help="algorithm backends next to NATIVE's own records (see above)")
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--timing", required=True)
    parser.add_argument("--device", default="cuda", help="device field prefix (cuda, cpu)")
    parser.add_argument("--ops", default="sum")
    parser.add_argument("--full", action="store_true", help="every case must be present")
    parser.add_argument("--buffers", default=None, help="expected environment['buffers']")
    args = parser.parse_args(argv)
    if (args.backend is None) == (args.beside is None):
        parser.error("give one of --backend or --beside")
    records = load_records(args.path)
    failures = 0

    def check(ok: bool, what: str, detail: str = "") -> None:
        nonlocal failures
        failures += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {args.path}: {what}{'  ' + detail if detail and not ok else ''}")

    check(bool(records), f"{len(records)} records")
    if not records:
        return 1
    wrong = [r for r in records if r.wrong != 0]
    check(not wrong, "wrong == 0 in every record",
          "; ".join(f"{r.collective} {r.dtype} {r.op} inplace={r.inplace} {r.size_used}B "
                    f"wrong={r.wrong}" for r in wrong[:5]))
    if args.beside is not None:
        return _beside(records, args.beside, check, failures_of=lambda: failures)
    check({r.backend for r in records} == {args.backend}, f"backend {args.backend}",
          str({r.backend for r in records}))
    check({r.world_size for r in records} == {args.world}, f"world size {args.world}",
          str({r.world_size for r in records}))
    check({r.timing for r in records} == {args.timing}, f"timing {args.timing}",
          str({r.timing for r in records}))
    devices = {r.device for r in records}
    check(all(d.startswith(args.device) for d in devices), f"device {args.device}*", str(devices))
    versions = {r.library_version for r in records}
    check(all(v and v != "unknown" for v in versions), f"library version {sorted(versions)}",
          str(versions))
    positive = [r for r in records if not r.time_us.get("median", 0) > 0]
    check(not positive, "every median time > 0", str(len(positive)))
    if args.buffers:
        seen = {r.environment.get("buffers") for r in records}
        check(seen == {args.buffers}, f"buffers {args.buffers}", str(seen))
    if args.full:
        have = {(r.collective, r.dtype, r.op, r.inplace) for r in records}
        missing = expected_cases(args.ops.split(","), args.backend) - have
        check(not missing, "every collective x dtype x op x mode",
              f"{len(missing)} missing, e.g. {sorted(missing, key=str)[:4]}")
    else:
        check({r.collective for r in records} == set(bound_collectives(args.backend)),
              "every collective",
              str({r.collective for r in records}))
    return 1 if failures else 0


def _beside(records: list[Any], native: str, check: Any, failures_of: Any) -> int:
    """Every algorithm's exact records with the native library's exact record of each case."""
    def case(r: Any) -> tuple[Any, ...]:
        return (r.collective, r.dtype, r.op, r.inplace, r.size_used)

    exact_native = {case(r) for r in records if r.backend == native and r.wrong == 0}
    refuses = _refuses(native)      # cases the library lacks have no native record beside
    check(bool(exact_native), f"{native}: {len(exact_native)} exact cases")
    for name in sorted({r.backend for r in records} - {native}):
        mine = [r for r in records if r.backend == name]
        alone = [r for r in mine if case(r) not in exact_native
                 and not refuses(DTYPES[r.dtype], r.op)]
        check(all(r.wrong == 0 for r in mine) and not alone,
              f"{name}: {len(mine)} cases exact, each beside {native}'s exact result",
              f"wrong in {sum(r.wrong != 0 for r in mine)}, without {native} beside: "
              f"{[case(r) for r in alone[:3]]}")
    return 1 if failures_of() else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
