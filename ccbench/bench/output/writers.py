"""The writer of each --format: what rank 0 prints as each size finishes."""

from __future__ import annotations

import os
from typing import Any

from ccbench.bench.output.csv_rows import CsvWriter
from ccbench.bench.output.json_lines import JsonWriter
from ccbench.bench.output.osu import OsuWriter
from ccbench.bench.output.table import TableWriter

__all__ = ["WRITERS", "QuietWhenClosed", "make_writer"]

#: --format's name (and "osu", the table of a run named by an OSU program) -> its writer
WRITERS: dict[str, type[TableWriter]] = {"table": TableWriter, "osu": OsuWriter,
                                         "json": JsonWriter, "csv": CsvWriter}


def make_writer(fmt: str, full: bool = False) -> TableWriter:
    """`full` changes the tables only: JSON and CSV rows hold every statistic anyway. "osu" is
    the table of a run named by an OSU program."""
    return WRITERS[fmt](full=full)


class QuietWhenClosed:
    """The rows' stream, where its reader may leave (`ccbench launch ... | head`): the run goes
    on and every record still goes to --output, the rows stop, as `yes | head` stops printing.
    Not a fault of any rank: before, rank 0 left at the broken pipe and the others named it
    dead ('lost the control store')."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.reader_left = False

    def write(self, text: str) -> int:
        if not self.reader_left:
            try:
                return int(self._stream.write(text))
            except BrokenPipeError:
                self._left()
        return len(text)

    def flush(self) -> None:
        if not self.reader_left:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._left()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def _left(self) -> None:
        """From now on nothing more is written, and what the stream still holds (flushed at
        exit) goes nowhere."""
        self.reader_left = True
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, self._stream.fileno())
            finally:
                os.close(null)
        except (OSError, ValueError, AttributeError):
            pass
