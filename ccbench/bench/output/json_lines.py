"""--format json: each record as one JSON line on stdout, as it comes; notes go to stderr."""

from __future__ import annotations

import sys

from ccbench.bench.output.table import TableWriter
from ccbench.records import Record

__all__ = ["JsonWriter"]


class JsonWriter(TableWriter):
    def header(self, title: str) -> None:
        pass

    def note(self, text: str) -> None:
        print(f"# {text}", file=sys.stderr, flush=True)

    def add(self, record: Record, modes: tuple[bool, ...]) -> None:
        print(record.to_json(), file=self.stream, flush=True)

    def footer(self, num_wrong: int | None) -> None:
        pass
