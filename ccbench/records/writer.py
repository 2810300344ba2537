"""Writing records: append one line at a time (crash-safe), or write a whole file atomically."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ccbench.records.schema import Record

__all__ = ["append_record", "write_records", "cut_torn_tail", "torn_warning"]


# every ccbench appender takes this lock (flock on the file) around its check-and-cut of a
# torn tail and its one write, so neither can see half of the other's record
_write = os.write                 # a seam: tests make it fail part-way (a full disk)


@contextmanager
def _locked(path: str | os.PathLike[str], create: bool) -> Iterator[int]:
    flags = os.O_RDWR | os.O_APPEND | (os.O_CREAT if create else 0)
    fd = os.open(path, flags, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)              # releases the lock


def _cut_locked(fd: int, aside: str | os.PathLike[str] | None) -> int:
    """With the file locked: cut a last line without its newline (moved to `aside`)."""
    end = os.fstat(fd).st_size
    if end == 0 or os.pread(fd, 1, end - 1) == b"\n":
        return 0
    keep, pos, step = 0, end, 1 << 16
    while pos > 0:                       # find the last newline, reading backwards
        start = max(0, pos - step)
        index = os.pread(fd, pos - start, start).rfind(b"\n")
        if index >= 0:
            keep = start + index + 1
            break
        pos = start
    if aside is not None:
        torn = os.pread(fd, end - keep, keep)
        with open(aside, "ab") as out:
            out.write(torn + b"\n")
            out.flush()
            os.fsync(out.fileno())
    os.ftruncate(fd, keep)
    return end - keep


def cut_torn_tail(path: str | os.PathLike[str], aside: str | os.PathLike[str] | None = None) -> int:
    """Cut a last line that has no newline (a write cut short by a crash, a kill or a full
    disk), so the next append starts on a fresh line instead of gluing a record onto it.
    With `aside`, the piece cut off is appended there (with a newline) before it goes.
    Holds the file's append lock, so a record another ccbench is appending is never taken
    for a torn one. Returns the bytes cut (0: ends in a newline, empty or missing)."""
    try:
        with _locked(path, create=False) as fd:
            return _cut_locked(fd, aside)
    except FileNotFoundError:
        return 0


def append_record(path: str | os.PathLike[str], record: Record) -> int:
    """Append one line with one write under the file's lock, and fsync; a crash loses at most
    the record in flight. A torn last line found first (a writer killed mid-write) is moved
    to `<path>.torn`; returns its length in bytes (0: none). A failed write (a full disk)
    cuts what it wrote, so the file keeps whole lines only, and raises the OSError."""
    line = (record.to_json() + "\n").encode("utf-8")
    with _locked(path, create=True) as fd:
        torn = _cut_locked(fd, f"{os.fspath(path)}.torn")
        end = os.fstat(fd).st_size
        try:
            written = 0
            while written < len(line):
                written += _write(fd, line[written:])
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, end)
            raise
    return torn


def torn_warning(path: str | os.PathLike[str], torn: int) -> str:
    """What an appender says after append_record moved a torn last line aside."""
    return (f"ccbench: warning: {path}: its last line ({torn} bytes, no newline: a run "
            f"stopped while writing it) was moved to {path}.torn before appending")


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
