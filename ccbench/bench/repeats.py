"""`ccbench launch --repeat N`: the same measurement in N separate launches, and the spread
between them.

A process can land in a fast or a slow state for its whole life (placement, caches, the
machine's other load), so iterations inside one launch cannot show that noise; pyperf runs
several worker processes for the same reason. Each launch is a run of its own (its own run id,
so `compare` and `report --runs` see N runs); its records say which launch they came from in
method.repeat (1..N), method.repeats (N) and method.repeat_group (shared by the N launches).
The launcher tells the ranks through CCBENCH_REPEAT ("i/N/group").
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypedDict

import numpy as np

from ccbench.errors import UsageError
from ccbench.records import Record, load_records
from ccbench.units import format_size

__all__ = ["ENV", "RepeatIndex", "SpreadRow", "format_spread", "repeat_env", "repeat_from_env",
           "repeat_launches", "spread_rows"]

ENV = "CCBENCH_REPEAT"
_VALUE = re.compile(r"^(\d+)/(\d+)/([0-9a-f]{1,32})$")


def repeat_env(index: int, repeats: int, group: str) -> dict[str, str]:
    return {ENV: f"{index}/{repeats}/{group}"}


class RepeatIndex(TypedDict, total=False):
    """Which launch of `ccbench launch --repeat N` a rank runs in (empty outside --repeat):
    what its records' method block says (RUN_RECORD_KEYS)."""

    repeat: int                 # 1..repeats
    repeats: int
    repeat_group: str           # shared by the N launches


def repeat_from_env() -> RepeatIndex:
    """What a rank records about its launch: {} outside --repeat."""
    value = os.environ.get(ENV)
    if not value:
        return {}
    match = _VALUE.match(value)
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise UsageError(f"{ENV}={value!r} is malformed (valid: INDEX/COUNT/GROUP, set by "
                         f"ccbench launch --repeat)")
    return {"repeat": int(match.group(1)), "repeats": int(match.group(2)),
            "repeat_group": match.group(3)}


@dataclass(frozen=True, slots=True)
class SpreadRow:
    """One (case, size) over the launches: each launch's median time, and their spread."""

    label: str
    size: int
    medians_us: tuple[float, ...]       # one per launch, in launch order

    @property
    def middle_us(self) -> float:
        return float(np.median(self.medians_us))

    @property
    def spread(self) -> float:
        """(slowest - fastest launch) / median of the launches."""
        middle = self.middle_us
        return (max(self.medians_us) - min(self.medians_us)) / middle if middle > 0 else 0.0


def _label(record: Record) -> str:
    mode = "in" if record.inplace else "out"
    return " ".join(p for p in (record.collective, record.backend, record.dtype, record.op or "",
                                mode) if p)


def spread_rows(records: Sequence[Record], group: str) -> list[SpreadRow]:
    """The rows of one --repeat group, in measurement order; a case missing from a launch
    (it failed there) keeps the launches that have it."""
    per_case: dict[tuple[str, int], dict[int, float]] = {}
    for rec in records:
        if rec.method.get("repeat_group") != group:
            continue
        index = int(rec.method["repeat"])
        per_case.setdefault((_label(rec), rec.size_asked), {})[index] = rec.time_us["median"]
    return [SpreadRow(label, size, tuple(by_launch[i] for i in sorted(by_launch)))
            for (label, size), by_launch in per_case.items()]


def format_spread(rows: Sequence[SpreadRow], repeats: int, run_ids: Sequence[str]) -> list[str]:
    """Comment lines (`# ...`) for the end of the table."""
    lines = [f"# {repeats} launches (runs {', '.join(run_ids)}): per case and size, the median "
             f"time of each launch, and the spread between launches",
             f"# {'case':<32} {'size':>6} {'median':>10} {'fastest':>10} {'slowest':>10} "
             f"{'spread':>7}",
             f"# {'':<32} {'':>6} {'(us)':>10} {'(us)':>10} {'(us)':>10} {'':>7}"]
    for row in rows:
        lines.append(f"  {row.label:<32} {format_size(row.size):>6} {row.middle_us:>10.2f} "
                     f"{min(row.medians_us):>10.2f} {max(row.medians_us):>10.2f} "
                     f"{row.spread:>6.0%}")
    if rows:
        spreads = sorted(row.spread for row in rows)
        lines.append(f"# spread between launches: median {np.median(spreads):.0%}, largest "
                     f"{spreads[-1]:.0%} (slowest minus fastest launch, over their median)")
    return lines


def repeat_launches(repeats: int, launch: Callable[[dict[str, str], list[str]], int],
                    bench: list[str], output: str | None, fmt: str) -> int:
    """`repeats` launches one after the other (`launch(environment, benchmark arguments)`
    gives each one's exit status; the first that fails ends them), then the spread between
    them, printed after the table (on stderr where the output is JSON or CSV). Without
    --output the records go to a temporary file, read back for the spread and removed."""
    group = uuid.uuid4().hex[:12]
    with tempfile.TemporaryDirectory(prefix="ccbench-repeat-") as scratch:
        if output is None:
            output = os.path.join(scratch, "records.jsonl")
            bench = [*bench, "--output", output]
        for index in range(1, repeats + 1):
            print(f"ccbench: launch {index} of {repeats}", file=sys.stderr, flush=True)
            status = launch(repeat_env(index, repeats, group), bench)
            if status != 0:
                return status
        records = [r for r in load_records(output) if r.method.get("repeat_group") == group]
    records.sort(key=lambda r: (int(r.method["repeat"]), r.timestamp))
    run_ids = list(dict.fromkeys(r.run_id for r in records))
    lines = format_spread(spread_rows(records, group), repeats, run_ids)
    stream = sys.stdout if fmt == "table" else sys.stderr    # JSON and CSV stay parseable
    print("\n".join(lines), file=stream, flush=True)
    return 0
