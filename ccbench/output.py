"""What rank 0 prints: an nccl-tests style table (out-of-place and in-place side by side),
JSON lines, or CSV; and the progress bar on stderr."""

from __future__ import annotations

import csv
import sys
from dataclasses import asdict
from typing import TextIO

from ccbench.records import Record

__all__ = ["Progress", "TableWriter", "make_writer"]

_CSV_FIELDS = ("collective", "backend", "algorithm", "library_version", "dtype", "op", "inplace",
               "world_size", "size_used", "count", "iterations", "median_us", "p95_us",
               "algbw_gbps", "busbw_gbps", "wrong")


class TableWriter:
    """Rows appear as soon as both modes of a size are done."""

    def __init__(self, stream: TextIO = sys.stdout) -> None:
        self.stream = stream
        self.busbw_sum = 0.0
        self.busbw_count = 0
        self._pending: dict[tuple[object, ...], dict[bool, Record]] = {}

    def header(self, title: str) -> None:
        half = f"{'time':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"
        print(f"#\n# {title}\n#", file=self.stream)
        print(f"# {'':>10} {'':>11} {'':>8} {'':>6} {'':>4}   {'out-of-place':^33}   "
              f"{'in-place':^33}", file=self.stream)
        print(f"# {'size':>10} {'count':>11} {'type':>8} {'redop':>6} {'root':>4}   {half}   "
              f"{half}", file=self.stream)
        print(f"# {'(B)':>10} {'(elements)':>11} {'':>8} {'':>6} {'':>4}   "
              f"{'(us)':>10} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}   "
              f"{'(us)':>10} {'(GB/s)':>7} {'(GB/s)':>7}", file=self.stream, flush=True)

    def note(self, text: str) -> None:
        print(f"# {text}", file=self.stream, flush=True)

    def add(self, record: Record, modes: tuple[bool, ...]) -> None:
        self.busbw_sum += record.busbw_gbps
        self.busbw_count += 1
        key = (record.collective, record.dtype, record.op, record.size_asked)
        done = self._pending.setdefault(key, {})
        done[record.inplace] = record
        if all(mode in done for mode in modes):
            del self._pending[key]
            self._row(done)

    def _row(self, by_mode: dict[bool, Record]) -> None:
        first = next(iter(by_mode.values()))
        cells = []
        for inplace in (False, True):
            rec = by_mode.get(inplace)
            if rec is None:
                cells.append(f"{'-':>10} {'-':>7} {'-':>7} {'-':>6}")
                continue
            wrong = "N/A" if rec.wrong is None else str(rec.wrong)
            cells.append(f"{rec.time_us['median']:>10.2f} {rec.algbw_gbps:>7.3f} "
                         f"{rec.busbw_gbps:>7.3f} {wrong:>6}")
        root = str(first.root) if first.collective == "broadcast" else "-1"
        print(f"  {first.size_used:>10} {first.count:>11} {first.dtype:>8} {first.op or 'none':>6} "
              f"{root:>4}   {cells[0]}   {cells[1]}", file=self.stream, flush=True)

    def footer(self, num_wrong: int) -> None:
        average = self.busbw_sum / self.busbw_count if self.busbw_count else 0.0
        print(f"# Out of bounds values : {num_wrong} {'OK' if num_wrong == 0 else 'FAILED'}",
              file=self.stream)
        print(f"# Avg bus bandwidth    : {average:.5g}\n#", file=self.stream, flush=True)


class JsonWriter(TableWriter):
    def header(self, title: str) -> None:
        pass

    def note(self, text: str) -> None:
        print(f"# {text}", file=sys.stderr, flush=True)

    def add(self, record: Record, modes: tuple[bool, ...]) -> None:
        print(record.to_json(), file=self.stream, flush=True)

    def footer(self, num_wrong: int) -> None:
        pass


class CsvWriter(JsonWriter):
    def __init__(self, stream: TextIO = sys.stdout) -> None:
        super().__init__(stream)
        self._csv = csv.writer(stream)
        self._csv.writerow(_CSV_FIELDS)

    def add(self, record: Record, modes: tuple[bool, ...]) -> None:
        data = asdict(record)
        data["median_us"] = record.time_us["median"]
        data["p95_us"] = record.time_us["p95"]
        self._csv.writerow([data[name] for name in _CSV_FIELDS])
        self.stream.flush()


def make_writer(fmt: str) -> TableWriter:
    return {"table": TableWriter, "json": JsonWriter, "csv": CsvWriter}[fmt]()


class Progress:
    """A tqdm bar on stderr, only on a terminal and without --quiet."""

    def __init__(self, total: int, enabled: bool) -> None:
        self._bar = None
        if enabled and total > 1 and sys.stderr.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=total, unit="size", file=sys.stderr, leave=False)

    def step(self, label: str) -> None:
        if self._bar is not None:
            self._bar.set_description(label, refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
