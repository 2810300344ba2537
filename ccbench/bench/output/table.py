"""nccl-tests' table: a row per size, out-of-place and in-place side by side, the busbw average
and the wrong-value verdict at the end. Its class is also the interface every writer has
(header, note, add, footer)."""

from __future__ import annotations

import sys
from typing import TextIO

from ccbench.collectives import ROOTED
from ccbench.records import Record

__all__ = ["TableWriter"]


class TableWriter:
    """Rows appear as soon as both modes of a size are done. `full` (OSU's -f) adds, per mode,
    the smallest and the largest of the ranks' own median times: how far apart ranks were."""

    def __init__(self, stream: TextIO | None = None, full: bool = False) -> None:
        self.stream = stream or sys.stdout     # looked up now: a rank may have replaced it
        self.full = full
        self.busbw_sum = 0.0
        self.busbw_count = 0
        self._pending: dict[tuple[object, ...], dict[bool, Record]] = {}

    def header(self, title: str) -> None:
        self.busbw_sum, self.busbw_count = 0.0, 0       # the footer averages this table only
        spread = f" {'rank min':>10} {'rank max':>10}" if self.full else ""
        units = f" {'(us)':>10} {'(us)':>10}" if self.full else ""
        half = f"{'time':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>6}{spread}"
        width = len(half)
        print(f"#\n# {title}\n#", file=self.stream)
        if self.full:
            print("# rank min, rank max: the fastest and the slowest rank's own median time; "
                  "time: the median of each call's\n# combined time (the slowest rank per call "
                  "unless --combine), so time >= rank max with the default", file=self.stream)
        print(f"# {'':>10} {'':>11} {'':>8} {'':>6} {'':>4}   {'out-of-place':^{width}}   "
              f"{'in-place':^{width}}", file=self.stream)
        print(f"# {'size':>10} {'count':>11} {'type':>8} {'redop':>6} {'root':>4}   {half}   "
              f"{half}", file=self.stream)
        print(f"# {'(B)':>10} {'(elements)':>11} {'':>8} {'':>6} {'':>4}   "
              f"{'(us)':>10} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}{units}   "
              f"{'(us)':>10} {'(GB/s)':>7} {'(GB/s)':>7}{' ' * 7 if self.full else ''}{units}",
              file=self.stream, flush=True)

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
                empty = f" {'-':>10} {'-':>10}" if self.full else ""
                cells.append(f"{'-':>10} {'-':>7} {'-':>7} {'-':>6}{empty}")
                continue
            wrong = "N/A" if rec.wrong is None else str(rec.wrong)
            spread = ""
            if self.full:
                ranks = rec.rank_median_us or [rec.time_us["median"]]
                spread = f" {min(ranks):>10.2f} {max(ranks):>10.2f}"
            cells.append(f"{rec.time_us['median']:>10.2f} {rec.algbw_gbps:>7.3f} "
                         f"{rec.busbw_gbps:>7.3f} {wrong:>6}{spread}")
        root = str(first.root) if first.collective in ROOTED else "-1"   # as nccl-tests
        print(f"  {first.size_used:>10} {first.count:>11} {first.dtype:>8} {first.op or 'none':>6} "
              f"{root:>4}   {cells[0]}   {cells[1]}", file=self.stream, flush=True)

    def footer(self, num_wrong: int | None) -> None:
        """`num_wrong` None: nothing was validated (--check 0), so nothing is called OK."""
        average = self.busbw_sum / self.busbw_count if self.busbw_count else 0.0
        if num_wrong is None:
            verdict = "not checked (--check 0)"
        else:
            verdict = f"{num_wrong} {'OK' if num_wrong == 0 else 'FAILED'}"
        print(f"# Out of bounds values : {verdict}", file=self.stream)
        print(f"# Avg bus bandwidth    : {average:.5g}\n#", file=self.stream, flush=True)
