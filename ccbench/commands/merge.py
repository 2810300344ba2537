"""`ccbench merge IN... -o OUT`: combine results files, one record per (case, size).

Inputs are files or folders (every *.jsonl below). Records of another schema or an unknown
schema version are refused (exit 2). When several records have the same case key and size,
one is kept: the first that passed validation, else the first seen; the rest are counted and
dropped. OUT is written atomically (a temporary file renamed into place).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ccbench.errors import UsageError
from ccbench.record import Record, case_key, load_records


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("merge", help="combine results files, dropping duplicates",
                                   description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("inputs", nargs="+", metavar="IN", help="results files or folders")
    parser.add_argument("-o", "--output", required=True, metavar="OUT", help="merged .jsonl")


def merge_records(records: list[Record]) -> tuple[list[Record], int]:
    """Keep one record per case_key (size included), in first-seen order."""
    kept: dict[tuple[object, ...], Record] = {}
    dropped = 0
    for record in records:
        key = case_key(record)
        if key not in kept:
            kept[key] = record
            continue
        dropped += 1
        if (kept[key].wrong or 0) > 0 and (record.wrong or 0) == 0:
            kept[key] = record                # a validated record beats a failed one
    return list(kept.values()), dropped


def main(args: argparse.Namespace) -> int:
    out = Path(args.output)
    if out.is_dir():
        raise UsageError(f"-o {str(out)!r} is a folder; name a .jsonl file")
    records = load_records(*args.inputs)
    merged, dropped = merge_records(records)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for record in merged:
            handle.write(record.to_json() + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, out)
    print(f"ccbench merge: {len(records)} records in, {len(merged)} written to {out}, "
          f"{dropped} duplicates dropped", file=sys.stderr)
    return 0
