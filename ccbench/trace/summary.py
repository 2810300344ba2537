"""Per-trace summaries: ops by collective and size bucket, total communication time, the
time-weighted mean bus bandwidth, and measured against the trace's own durations."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

import numpy as np

from ccbench.units import format_size

__all__ = ["SPEEDUP_STATISTIC", "OpResult", "OpResultJson", "Speedup", "SpeedupJson",
           "BucketRow", "Fidelity", "TraceSummary", "bucket", "fidelity", "format_summary",
           "schedule", "sequence_median", "speedups", "summarize_results"]

#: what a replay's speed-up compares, wherever it is shown (terminal, summary JSON, report)
SPEEDUP_STATISTIC = "sum of per-call medians"


class OpResultJson(TypedDict):
    """OpResult as the replay summary (and the ranks' store) carries it."""

    call: int
    node_id: int
    name: str
    collective: str
    size: int
    group: list[int]
    time_us: float | None
    busbw_gbps: float | None
    original_us: float | None
    wrong: int | None
    reason: str
    group_source: str
    reduce_op: str | None
    extra: dict[str, Any]         # per-call tags of the replay (size_used, as_issued_us, ...)


@dataclass(kw_only=True, slots=True)
class OpResult:
    """One call of the trace on one backend: measured (time_us) or skipped (reason)."""

    call: int
    node_id: int
    name: str
    collective: str
    size: int                     # bytes, the op's S
    group: list[int]
    time_us: float | None = None  # median, max over the group's ranks
    busbw_gbps: float | None = None
    original_us: float | None = None
    wrong: int | None = None
    reason: str = ""
    group_source: str = ""        # named | inferred | ambiguous (ccbench.trace.groups)
    reduce_op: str | None = None  # the reduction replayed (reducing calls)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> OpResultJson:
        return {"call": self.call, "node_id": self.node_id, "name": self.name,
                "collective": self.collective, "size": self.size, "group": self.group,
                "time_us": self.time_us, "busbw_gbps": self.busbw_gbps,
                "original_us": self.original_us, "wrong": self.wrong, "reason": self.reason,
                "group_source": self.group_source, "reduce_op": self.reduce_op,
                "extra": self.extra}


def bucket(size: int) -> str:
    """The power-of-two range a size falls in, e.g. '64K-128K' ('0' for barriers)."""
    if size <= 0:
        return "0"
    low = 1 << (size.bit_length() - 1)
    return f"{format_size(low)}-{format_size(low * 2)}" if low != size else format_size(size)


def schedule(calls: Iterable[tuple[Sequence[int], float]]) -> list[tuple[float, float]]:
    """(start, end) in us of each (group ranks, time) call run back to back in trace order:
    a call starts when every rank of its group has ended its previous call, so calls on
    disjoint groups overlap. The last end is the schedule's length."""
    free: dict[int, float] = {}
    spans = []
    for group, time_us in calls:
        start = max((free.get(rank, 0.0) for rank in group), default=0.0)
        end = start + time_us
        for rank in group:
            free[rank] = end
        spans.append((start, end))
    return spans


class SpeedupJson(TypedDict):
    fastest: str
    other: str
    times: float
    statistic: str
    fastest_us: float
    other_us: float
    calls: int
    left_out: int


@dataclass(frozen=True)
class Speedup:
    """One backend against the fastest, over the calls every compared backend measured."""

    fastest: str
    other: str
    times: float           # other_us / fastest_us
    fastest_us: float      # SPEEDUP_STATISTIC over the common calls
    other_us: float
    calls: int             # the calls compared: measured by every backend
    left_out: int          # calls measured by some backends only (not compared)

    def to_dict(self) -> SpeedupJson:
        return {"fastest": self.fastest, "other": self.other, "times": self.times,
                "statistic": SPEEDUP_STATISTIC, "fastest_us": self.fastest_us,
                "other_us": self.other_us, "calls": self.calls, "left_out": self.left_out}

    def line(self) -> str:
        """The speed-up as `replay` prints it."""
        left = (f"; {self.left_out} calls measured by only some backends left out"
                if self.left_out else "")
        return (f"{self.fastest} replays this trace {self.times:.2f}x faster than {self.other} "
                f"({SPEEDUP_STATISTIC} over the {self.calls} calls every compared backend "
                f"measured: {self.fastest_us:.1f} vs {self.other_us:.1f} us{left})")


def speedups(per_call: dict[str, dict[Any, float]]) -> list[Speedup]:
    """The fastest backend against each other one, from each backend's measured time per call
    (call -> us, SPEEDUP_STATISTIC's terms): only the calls every backend measured are
    compared, so a backend that skipped calls does not look faster for it."""
    timed = {b: calls for b, calls in per_call.items() if calls}
    if len(timed) < 2:
        return []
    common = set.intersection(*(set(calls) for calls in timed.values()))
    every = set.union(*(set(calls) for calls in timed.values()))
    sums = {b: sum(calls[c] for c in common) for b, calls in timed.items()}
    fast = min(sums, key=lambda b: sums[b])
    if not common or sums[fast] <= 0:
        return []
    return [Speedup(fast, other, sums[other] / sums[fast], sums[fast], sums[other],
                    len(common), len(every) - len(common))
            for other in sorted(sums, key=lambda b: sums[b]) if other != fast]


def sequence_median(passes: Sequence[float] | None) -> float | None:
    """The whole sequence's time: the median over passes of each pass's slowest rank."""
    if not passes:
        return None
    return float(np.median(passes))


class BucketRow(TypedDict):
    """One (collective, size bucket) of a summary."""

    collective: str
    bucket: str
    ops: int
    bytes: int
    time_us: float
    skipped: int
    busbw_gbps: float | None


class Fidelity(TypedDict):
    """Replayed against the job's own time (see `fidelity`)."""

    calls: int
    median_ratio: float
    p10_ratio: float
    p90_ratio: float
    window_ratio: float


class TraceSummary(TypedDict):
    """One backend's replay of a trace (`summarize_results`); the NotRequired keys are
    added by `ccbench replay` (commands/replay.py)."""

    ops: int
    measured: int
    skipped: int
    total_time_us: float
    schedule_us: float
    busbw_gbps: float | None
    original_time_us: float | None
    fidelity: Fidelity | None
    by_bucket: list[BucketRow]
    skips: list[str]
    sequence_us: NotRequired[list[float] | None]
    sequence_median_us: NotRequired[float | None]
    as_issued_time_us: NotRequired[float | None]
    fidelity_as_issued: NotRequired[Fidelity | None]
    uncertain_calls: NotRequired[int]
    uncertain_time_us: NotRequired[float]


class _Totals(TypedDict):
    ops: int
    bytes: int
    time_us: float
    bus_bytes_us: float
    skipped: int


def summarize_results(results: list[OpResult]) -> TraceSummary:
    """Totals per (collective, size bucket) and over the whole trace."""
    rows: dict[tuple[str, str], _Totals] = defaultdict(
        lambda: {"ops": 0, "bytes": 0, "time_us": 0.0, "bus_bytes_us": 0.0, "skipped": 0})
    total_time = 0.0
    weighted = 0.0
    for res in results:
        row = rows[(res.collective, bucket(res.size))]
        row["ops"] += 1
        row["bytes"] += res.size
        if res.time_us is None:
            row["skipped"] += 1
            continue
        row["time_us"] += res.time_us
        total_time += res.time_us
        if res.busbw_gbps is not None:
            row["bus_bytes_us"] += res.busbw_gbps * res.time_us
            weighted += res.busbw_gbps * res.time_us
    table: list[BucketRow] = []
    for (collective, size_bucket), row in sorted(rows.items(), key=lambda kv: kv[0]):
        bw = row["bus_bytes_us"]
        table.append({"collective": collective, "bucket": size_bucket, "ops": row["ops"],
                      "bytes": row["bytes"], "time_us": row["time_us"],
                      "skipped": row["skipped"],
                      "busbw_gbps": bw / row["time_us"] if row["time_us"] else None})
    measured = [r for r in results if r.time_us is not None]
    originals = [r for r in measured if r.original_us is not None]
    return {
        "ops": len(results), "measured": len(measured), "skipped": len(results) - len(measured),
        "total_time_us": total_time,
        "schedule_us": max((end for _, end in schedule(
            (r.group, r.time_us) for r in measured if r.time_us is not None)), default=0.0),
        "busbw_gbps": weighted / total_time if total_time else None,
        "original_time_us": sum(r.original_us or 0.0 for r in originals) if originals else None,
        "fidelity": fidelity(originals),
        "by_bucket": table,
        "skips": sorted({r.reason for r in results if r.time_us is None and r.reason}),
    }


def fidelity(results: list[OpResult]) -> Fidelity | None:
    """Replayed against the job's own time, where the trace (or its recording) has it: the
    ratio per call (median, 10th and 90th percentile) and over the whole window (the sum of
    the replayed per-call medians over the sum of the job's own times of those calls)."""
    pairs = [(r.time_us, r.original_us) for r in results
             if r.time_us is not None and r.original_us]
    if not pairs:
        return None
    ratios = np.array([t / o for t, o in pairs if o])
    return {"calls": len(pairs), "median_ratio": float(np.median(ratios)),
            "p10_ratio": float(np.percentile(ratios, 10)),
            "p90_ratio": float(np.percentile(ratios, 90)),
            "window_ratio": sum(t for t, _ in pairs) / sum(o for _, o in pairs)}


def format_summary(name: str, summary: TraceSummary) -> list[str]:
    lines = [f"# {name}: {summary['measured']} of {summary['ops']} calls measured, "
             f"communication {summary['total_time_us']:.1f} us ({SPEEDUP_STATISTIC}; "
             f"{summary['schedule_us']:.1f} us with calls on disjoint groups overlapped)"
             + (f", time-weighted busbw {summary['busbw_gbps']:.3f} GB/s"
                if summary["busbw_gbps"] else "")]
    if summary.get("original_time_us"):
        lines.append(f"#   the trace's own durations of those calls: "
                     f"{summary['original_time_us']:.1f} us")
    fit = summary.get("fidelity")
    if fit:
        lines.append(f"#   replayed / the job's own time, {fit['calls']} calls: median per call "
                     f"{fit['median_ratio']:.2f} (10-90 %: {fit['p10_ratio']:.2f}-"
                     f"{fit['p90_ratio']:.2f}), whole window {fit['window_ratio']:.2f}")
    head = ["collective", "size", "ops", "skipped", "time_us", "busbw_GBps"]
    rows = [head] + [[r["collective"], r["bucket"], str(r["ops"]), str(r["skipped"]),
                      f"{r['time_us']:.1f}",
                      f"{r['busbw_gbps']:.3f}" if r["busbw_gbps"] is not None else "-"]
                     for r in summary["by_bucket"]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    lines += [f"#   skipped: {reason}" for reason in summary["skips"]]
    return lines
