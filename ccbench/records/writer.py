"""Writing records: append one line at a time (crash-safe), or write a whole file atomically."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ccbench.records.schema import Record

__all__ = ["append_record", "write_records", "cut_torn_tail"]


def cut_torn_tail(path: str | os.PathLike[str], aside: str | os.PathLike[str] | None = None) -> int:
    """Cut a last line that has no newline (a write cut short by a crash, a kill or a full
    disk), so the next append starts on a fresh line instead of gluing a record onto it.
    With `aside`, the piece cut off is appended there (with a newline) before it goes.
    Returns the bytes cut (0: the file ends in a newline, is empty or does not exist)."""
    try:
        handle = open(path, "rb+")
    except FileNotFoundError:
        return 0
    with handle:
        end = handle.seek(0, os.SEEK_END)
        if end == 0:
            return 0
        handle.seek(end - 1)
        if handle.read(1) == b"\n":
            return 0
        keep = 0
        step = 1 << 16
        pos = end
        while pos > 0:                       # find the last newline, reading backwards
            start = max(0, pos - step)
            handle.seek(start)
            chunk = handle.read(pos - start)
            index = chunk.rfind(b"\n")
            if index >= 0:
                keep = start + index + 1
                break
            pos = start
        if aside is not None:
            handle.seek(keep)
            torn = handle.read()
            with open(aside, "ab") as out:
                out.write(torn + b"\n")
                out.flush()
                os.fsync(out.fileno())
        handle.truncate(keep)
        return end - keep


def append_record(path: str | os.PathLike[str], record: Record) -> None:
    """Append one line and fsync, so a crash loses at most the size in flight."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(record.to_json() + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def write_records(path: str | os.PathLike[str], records: Iterable[Record]) -> int:
    """Write a whole results file atomically (a temporary file renamed into place); a name
    ending in .parquet gets a Parquet file."""
    if str(path).endswith(".parquet"):
        from ccbench.records.table import write_parquet

        return write_parquet(path, list(records))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    count = 0
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            for record in records:
                handle.write(record.to_json() + "\n")
                count += 1
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return count
