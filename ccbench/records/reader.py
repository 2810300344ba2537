"""The one reader of results files, used by every command that reads records.

Reads `.jsonl` and `.jsonl.gz` files (gzip is recognised by its magic bytes, whatever the
name), `.parquet` files written by ccbench (records/table.py), and folders holding any of
them (searched recursively). A line that is not a usable
record -- not UTF-8, not JSON, not a JSON object, not a ccbench record, a field of the wrong
type, a torn last write -- is skipped, counted and reported with its file:line. Whatever
cannot be read at all (a missing path, an unreadable file, a record of a schema version this
ccbench does not know) ends the command with one `ccbench: error:` line (UsageError).
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from ccbench.errors import UsageError
from ccbench.records.schema import BadRecord, Record, record_from_dict
from ccbench.safeio import ReadBudget, check_json_depth, open_lines

__all__ = ["ReadReport", "Skipped", "iter_result_files", "read_records", "load_records",
           "RESULT_SUFFIXES"]

RESULT_SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet")
_SHOWN = 5            # skipped lines named one by one; the rest are counted


@dataclass(frozen=True, slots=True)
class Skipped:
    path: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


@dataclass(slots=True)
class ReadReport:
    """What a read found: the files read, lines holding records, and lines skipped."""

    files: list[str] = field(default_factory=list)
    num_records: int = 0
    skipped: list[Skipped] = field(default_factory=list)

    def warn(self, stream: TextIO | None = None) -> None:
        """One line per skipped line (the first few) and a total, on stderr."""
        out = stream or sys.stderr
        for entry in self.skipped[:_SHOWN]:
            print(f"ccbench: warning: skipped {entry}", file=out)
        if self.skipped:
            more = len(self.skipped) - _SHOWN
            print(f"ccbench: warning: skipped {len(self.skipped)} line(s) that are not ccbench "
                  f"records{f' ({more} more not shown)' if more > 0 else ''}; "
                  f"read {self.num_records} record(s) from {len(self.files)} file(s)", file=out)

    def summary(self) -> str:
        skipped = f", {len(self.skipped)} line(s) skipped" if self.skipped else ""
        return f"{self.num_records} record(s) from {len(self.files)} file(s){skipped}"


def _is_result_file(path: Path) -> bool:
    return path.name.endswith(RESULT_SUFFIXES)


def iter_result_files(paths: Iterable[str | os.PathLike[str]] | str | os.PathLike[str]
                      ) -> Iterator[Path]:
    """Files named directly (any name), and every *.jsonl / *.jsonl.gz below a named folder."""
    for raw in _as_list(paths):
        path = Path(raw)
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.is_file() and _is_result_file(p))
        elif path.is_file():
            yield path
        elif path.exists():
            raise UsageError(f"{str(path)!r} is neither a results file nor a folder")
        else:
            raise UsageError(f"no such results file or folder: {str(path)!r}")


def _as_list(paths: Iterable[str | os.PathLike[str]] | str | os.PathLike[str]
             ) -> list[str | os.PathLike[str]]:
    if isinstance(paths, (str, os.PathLike)):
        return [paths]
    return list(paths)


def _lines(path: Path, report: ReadReport, budget: ReadBudget) -> Iterator[tuple[int, bytes]]:
    number = 0
    try:
        for number, raw in open_lines(path, budget=budget):                 # noqa: B007 -- used below
            yield number, raw
    except (EOFError, zlib.error) as exc:                   # gzip garbage or a truncated stream
        report.skipped.append(Skipped(str(path), number + 1,
                                      f"unreadable compressed data, rest of file "
                                      f"skipped ({exc})"))
    except OSError as exc:
        if number or isinstance(exc, gzip.BadGzipFile):
            report.skipped.append(Skipped(str(path), number + 1,
                                          f"unreadable compressed data, rest of file "
                                          f"skipped ({exc})"))
        else:
            raise UsageError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None


def _parse(path: Path, number: int, raw: bytes, last: bool) -> Record:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRecord("not UTF-8 text") from None
    check_json_depth(raw, str(path), first_line=number)
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        torn = last and not raw.endswith(b"\n")
        raise BadRecord("torn last line (a write cut short)" if torn else "not JSON") from None
    try:
        return record_from_dict(data)
    except UsageError as exc:
        raise UsageError(f"{path}:{number}: {exc}") from None


def read_records(paths: Iterable[str | os.PathLike[str]] | str | os.PathLike[str]
                 ) -> tuple[list[Record], ReadReport]:
    """Every record in the given files and folders, in file order, and what was skipped.
    The input cap (inflated bytes) and the line cap count across all of them."""
    report = ReadReport()
    budget = ReadBudget()
    records: list[Record] = []
    for path in iter_result_files(paths):
        report.files.append(str(path))
        if path.name.endswith(".parquet"):           # written whole: no torn lines to skip
            from ccbench.records.table import read_parquet

            records.extend(read_parquet(path))
            continue
        pending: tuple[int, bytes] | None = None
        for number, raw in _lines(path, report, budget):
            if pending is not None:
                _take(path, *pending, False, records, report)
            pending = (number, raw)
        if pending is not None:
            _take(path, *pending, True, records, report)
    report.num_records = len(records)
    return records, report


def _take(path: Path, number: int, raw: bytes, last: bool, records: list[Record],
          report: ReadReport) -> None:
    if not raw.strip():
        return
    try:
        records.append(_parse(path, number, raw, last))
    except BadRecord as exc:
        report.skipped.append(Skipped(str(path), number, str(exc)))


def load_records(*paths: str | os.PathLike[str], require: bool = False,
                 stream: TextIO | None = None) -> list[Record]:
    """read_records for a command: skipped lines are reported on stderr; with `require`,
    finding no record at all is an error naming what was read."""
    records, report = read_records(paths)
    if require and not records:
        where = ", ".join(map(str, paths))
        first = f"; first: {report.skipped[0]}" if report.skipped else ""
        raise UsageError(f"no ccbench records in {where} ({report.summary()}{first}; results "
                         f"are {', '.join('*' + s for s in RESULT_SUFFIXES)} files written by ccbench)")
    report.warn(stream)
    return records
