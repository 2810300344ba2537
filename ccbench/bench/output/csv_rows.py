"""--format csv: one row per record, the columns of ccbench.load."""

from __future__ import annotations

import csv

from ccbench.bench.output.json_lines import JsonWriter
from ccbench.records import Record
from ccbench.records.table import TIME_STATS, flat_row

__all__ = ["CsvWriter"]

# every scalar field of a record, every time statistic; the same names as ccbench.load's columns
_CSV_FIELDS = (
    "collective", "backend", "library", "library_version", "algorithm", "transport", "device",
    "dtype", "op", "inplace", "timing", "world_size", "nodes", "ranks_per_node", "hosts", "root",
    "size_asked", "size_used", "count", "iterations", "warmup",
    *(f"time_{stat}_us" for stat in TIME_STATS), "algbw_gbps", "busbw_gbps", "wrong",
    "run_id", "timestamp", "ccbench_version")


class CsvWriter(JsonWriter):
    """One CSV row per record; the header comes with the first row (rank 0 is the one that
    writes rows, so no other rank prints a header)."""

    def add(self, record: Record, modes: tuple[bool, ...]) -> None:
        out = csv.writer(self.stream)          # self.stream may be swapped for a bar-safe one
        if not getattr(self, "_header_done", False):
            out.writerow(_CSV_FIELDS)
            self._header_done = True
        row = flat_row(record, lists=False)
        out.writerow([row[name] for name in _CSV_FIELDS])
        self.stream.flush()
