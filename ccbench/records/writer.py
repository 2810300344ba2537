"""Writing records: append one line at a time (crash-safe), or write a whole file atomically."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from ccbench.records.schema import Record

__all__ = ["append_record", "write_records", "cut_torn_tail", "rewriting", "torn_warning"]


# every ccbench appender takes this lock (flock on the file) around its check-and-cut of a
# torn tail and its one write, so neither can see half of the other's record
_write = os.write                 # a seam: tests make it fail part-way (a full disk)


@contextmanager
def _locked(path: str | os.PathLike[str], create: bool) -> Iterator[int]:
    """The file opened (never through a symbolic link) and locked. A file that another
    ccbench replaced (merge, a Parquet run's end) or removed while this one waited for the
    lock is opened again, so a record is never appended to a file no longer in its folder.
    FileNotFoundError when it is gone and `create` is false."""
    flags = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    while True:
        fd = os.open(path, flags, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                now = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            mine = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
            break
        os.close(fd)              # replaced or removed meanwhile: take the one there now
    try:
        yield fd
    finally:
        os.close(fd)              # releases the lock


@contextmanager
def rewriting(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the append lock of a file that is about to be read and replaced as a whole
    (`merge IN -o IN`, a Parquet run's end): an appender waits, then appends to the new
    file, so nothing appended meanwhile is lost with the old one. Nothing to hold for a file
    that does not exist yet, nor for one this user may not write (no appender can open it)."""
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(FileNotFoundError, PermissionError):
            stack.enter_context(_locked(path, create=False))
        yield


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
    """Write a whole results file atomically (safeio.write_atomic: a temporary file renamed
    into place; a symbolic link refused); a name ending in .parquet gets a Parquet file."""
    if str(path).endswith(".parquet"):
        from ccbench.records.table import write_parquet

        return write_parquet(path, list(records))
    from ccbench.safeio import write_atomic

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    count = 0

    def write(handle: IO[bytes]) -> None:
        nonlocal count
        for record in records:
            handle.write((record.to_json() + "\n").encode("utf-8"))
            count += 1

    write_atomic(out, write)
    return count
