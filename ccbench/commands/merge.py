"""`ccbench merge IN... -o OUT`: combine results files, keeping every run.

Inputs are files or folders (every *.jsonl and *.jsonl.gz below). A record is dropped only
when another record is the same measurement: the same run id, the same case (every field of
the case identity) and the same size. Every run of a case is kept. Records that claim the
same run id with different run metadata (ccbench version, hosts, world, method, environment),
or the same measurement with different results, are refused unless --force (then the first
seen, or the one that passed validation, is kept). OUT is written atomically, under the lock
every appender takes, so a run appending to OUT meanwhile loses nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ccbench.bench.options import run_method_keys
from ccbench.errors import UsageError
from ccbench.records import Record, RecordKey, load_records, run_metadata, write_records
from ccbench.records.writer import rewriting
from ccbench.safeio import check_not_symlink

__all__ = ["MergeResult", "merge_records", "register", "main"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("merge", help="combine results files, keeping every run",
                                   description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("inputs", nargs="+", metavar="IN", help="results files or folders")
    parser.add_argument("-o", "--output", required=True, metavar="OUT",
                        help="merged .jsonl, or .parquet for a Parquet file")
    parser.add_argument("--force", action="store_true",
                        help="write even when records claim one run id with different metadata")


@dataclass(slots=True)
class MergeResult:
    records: list[Record]
    duplicates: int = 0                                   # the same measurement seen again
    conflicts: list[str] = field(default_factory=list)   # one line per conflict found


def merge_records(records: list[Record]) -> MergeResult:
    """One record per RecordKey (run, case, size), in first-seen order."""
    kept: dict[RecordKey, Record] = {}
    runs: dict[str, dict[str, object]] = {}
    method_keys = run_method_keys()
    result = MergeResult(records=[])
    for record in records:
        meta = run_metadata(record, method_keys)
        first = runs.setdefault(record.run_id, meta)
        if first != meta:
            differ = sorted(k for k in meta if meta[k] != first.get(k))
            result.conflicts.append(f"run {record.run_id}: records differ in {', '.join(differ)}")
        key = RecordKey.of(record)
        if key not in kept:
            kept[key] = record
            continue
        result.duplicates += 1
        if _results(kept[key]) != _results(record):
            result.conflicts.append(f"run {record.run_id}: {key.case.describe()} at "
                                    f"{record.size_asked} B measured twice with different results")
        if (kept[key].wrong or 0) > 0 and (record.wrong or 0) == 0:
            kept[key] = record                # a validated record beats a failed one
    result.records = list(kept.values())
    return result


def _results(record: Record) -> str:
    return json.dumps([record.time_us, record.samples_us, record.wrong], sort_keys=True)


def main(args: argparse.Namespace) -> int:
    out = Path(args.output)
    if out.is_dir():
        raise UsageError(f"-o {str(out)!r} is a folder; name a .jsonl or .parquet file")
    check_not_symlink(out)
    from ccbench.bench.output.files import check_holds_records

    check_holds_records(str(out), "-o")           # as -O and simulate -o: records files only
    # OUT may be an input that a run is appending to: its lock is held from the read to the
    # rename, so an appender waits and then appends to the merged file
    with rewriting(out):
        records = load_records(*args.inputs, require=True)
        merged = merge_records(records)
        if merged.conflicts:
            unique = list(dict.fromkeys(merged.conflicts))
            if not args.force:
                more = f" (and {len(unique) - 1} more)" if len(unique) > 1 else ""
                raise UsageError(f"refusing to merge: {unique[0]}{more}; pass --force to "
                                 f"merge anyway")
            for line in unique:
                print(f"ccbench merge: warning: {line}", file=sys.stderr)
        write_records(out, merged.records)
    runs = len({r.run_id for r in merged.records})
    print(f"ccbench merge: {len(records)} records in, {len(merged.records)} written to {out} "
          f"({runs} run(s)), {merged.duplicates} duplicates dropped", file=sys.stderr)
    return 0
