"""The writer of each --format: what rank 0 prints as each size finishes."""

from __future__ import annotations

from ccbench.bench.output.csv_rows import CsvWriter
from ccbench.bench.output.json_lines import JsonWriter
from ccbench.bench.output.osu import OsuWriter
from ccbench.bench.output.table import TableWriter

__all__ = ["WRITERS", "make_writer"]

#: --format's name (and "osu", the table of a run named by an OSU program) -> its writer
WRITERS: dict[str, type[TableWriter]] = {"table": TableWriter, "osu": OsuWriter,
                                         "json": JsonWriter, "csv": CsvWriter}


def make_writer(fmt: str, full: bool = False) -> TableWriter:
    """`full` changes the tables only: JSON and CSV rows hold every statistic anyway. "osu" is
    the table of a run named by an OSU program."""
    return WRITERS[fmt](full=full)
