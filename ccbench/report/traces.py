"""Figures of `ccbench replay` records: a trace's timeline and its breakdown.

Replay records (method.trace) are one per call of a trace, each the measured median of
that call on its process group; a size sweep's figures do not describe them, so `report`
draws them apart, per trace (the folder or file the trace came from):

* timeline: the calls laid out as the job would run them back to back, one lane per
  process group, one row of lanes per backend: a call starts when every rank of its group
  has ended its previous call and lasts its measured time; colour = collective;
* breakdown: communication time by collective and size bucket (the summary's power-of-two
  buckets), one bar per backend, with each backend's total and how much faster the
  fastest is.

The latest run of each (trace, backend) is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

from ccbench.units import duration_text

__all__ = ["Span", "breakdown", "is_trace_record", "latest_runs", "split_traces", "timeline",
           "trace_figures"]


class Span(TypedDict):
    """One call of a replayed trace on the back-to-back timeline (us)."""

    call: int
    node_id: int
    group: tuple[int, ...]
    collective: str
    size: int
    start: float
    end: float

_COLLECTIVE_COLOURS = {"allreduce": "#0072B2", "allgather": "#009E73",
                       "reduce-scatter": "#D55E00", "broadcast": "#E69F00",
                       "alltoall": "#CC79A7", "alltoallv": "#882255", "reduce": "#56B4E9",
                       "gather": "#999933", "scatter": "#44AA99", "barrier": "#888888",
                       "send": "#661100", "recv": "#661100"}


def is_trace_record(record: Any) -> bool:
    return isinstance((record.method or {}).get("trace"), dict)


def split_traces(records: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """(other records, replay records)."""
    return ([r for r in records if not is_trace_record(r)],
            [r for r in records if is_trace_record(r)])


def _trace_name(record: Any) -> str:
    path = Path(str(record.method["trace"].get("file") or "trace"))
    return path.parent.name if path.suffix == ".json" or ".et" in path.name else path.name


def latest_runs(records: Sequence[Any]) -> dict[str, dict[str, list[Any]]]:
    """trace name -> backend -> the records of its latest run, in call order."""
    runs: dict[tuple[str, str], dict[str, list[Any]]] = {}
    for r in records:
        runs.setdefault((_trace_name(r), r.backend), {}).setdefault(r.run_id, []).append(r)
    out: dict[str, dict[str, list[Any]]] = {}
    for (name, backend), by_run in sorted(runs.items()):
        latest = max(by_run.values(), key=lambda recs: max(x.timestamp for x in recs))
        out.setdefault(name, {})[backend] = sorted(latest,
                                                   key=lambda x: x.method["trace"]["call"])
    return out


def timeline(records: Sequence[Any]) -> list[Span]:
    """Start and end (us) of each call run back to back: a call starts when every rank of
    its group has ended its previous call."""
    from ccbench.trace.summary import schedule

    groups = [tuple(r.method["trace"].get("group") or range(r.world_size)) for r in records]
    spans = schedule((g, float(r.time_us["median"])) for g, r in zip(groups, records,
                                                                     strict=True))
    return [{"call": r.method["trace"]["call"], "node_id": r.method["trace"]["node_id"],
             "group": group, "collective": r.collective, "size": r.size_used, "start": start,
             "end": end} for r, group, (start, end) in zip(records, groups, spans, strict=True)]


def _group_label(group: tuple[int, ...], world: int) -> str:
    if len(group) == world:
        return f"world ({world})"
    if len(group) > 4:
        return f"[{group[0]}, {group[1]}, ..., {group[-1]}]"
    return "[" + ", ".join(map(str, group)) + "]"


def _timeline_figure(name: str, backends: dict[str, list[Any]], paper: Any) -> Any:
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from ccbench.report.paper import rc_for
    from ccbench.report.style import RC

    spans = {b: timeline(recs) for b, recs in backends.items()}
    world = max(int(r.method["trace"].get("trace_world_size") or r.world_size)
                for recs in backends.values() for r in recs)
    lanes = sorted({s["group"] for ss in spans.values() for s in ss},
                   key=lambda g: (-len(g), g))
    height = 1.2 + len(spans) * max(1.2, 0.5 + 0.16 * len(lanes))
    with plt.rc_context(RC | rc_for(paper)):
        fig, axes = plt.subplots(len(spans), 1, figsize=(paper.width, min(height,
                                                                          3 * paper.width)),
                                 layout="constrained", sharex=True, squeeze=False)
        used: set[str] = set()
        longest = max((s["end"] for ss in spans.values() for s in ss), default=0.0)
        for ax, (backend, ss) in zip(axes[:, 0], spans.items(), strict=True):
            for s in ss:
                y = lanes.index(s["group"])
                colour = _COLLECTIVE_COLOURS.get(s["collective"], "#444444")
                # a call of a few us beside calls of ms would be invisible: drawn at least
                # 0.3% of the axis wide (the x label says so)
                width = max(s["end"] - s["start"], longest * 0.003)
                ax.barh(y, width, left=s["start"], height=0.7, color=colour, linewidth=0)
                used.add(s["collective"])
            total = max((s["end"] for s in ss), default=0.0)
            ax.set_yticks(range(len(lanes)), [_group_label(g, world) for g in lanes])
            ax.invert_yaxis()
            ax.set_title(f"{backend}: {len(ss)} calls, {duration_text(total)} back to back",
                         loc="left")
            ax.grid(axis="y", visible=False)
        axes[-1, 0].set_xlabel("time (µs), calls back to back")
        handles = [Patch(color=_COLLECTIVE_COLOURS.get(c, "#444444"), label=c)
                   for c in sorted(used)]
        fig.legend(handles=handles, loc="outside lower center",
                   ncols=min(3 if paper.width < 5 else 6, len(handles)))
        fig.suptitle(f"trace {name}: replay timeline")
    return fig


def breakdown(backends: dict[str, list[Any]]) \
        -> tuple[list[tuple[str, int, str]], dict[str, dict[tuple[str, int, str], float]]]:
    """(collective, bucket floor, bucket label) keys in order, and per backend the summed
    measured median (us) of each key's calls."""
    from ccbench.trace.summary import bucket

    cats: dict[tuple[str, int, str], None] = {}
    per: dict[str, dict[tuple[str, int, str], float]] = {}
    for backend, recs in backends.items():
        table = per.setdefault(backend, {})
        for r in recs:
            size = int(r.size_asked)
            low = 1 << (size.bit_length() - 1) if size > 0 else 0
            key = (r.collective, low, bucket(size))
            cats[key] = None
            table[key] = table.get(key, 0.0) + float(r.time_us["median"])
    return sorted(cats), per


def _calls_per_key(backends: dict[str, list[Any]]) -> dict[str, dict[tuple[str, str], int]]:
    """backend -> (collective, bucket label) -> calls it measured there."""
    from ccbench.trace.summary import bucket

    counts: dict[str, dict[tuple[str, str], int]] = {}
    for backend, recs in backends.items():
        table = counts.setdefault(backend, {})
        for r in recs:
            key = (r.collective, bucket(int(r.size_asked)))
            table[key] = table.get(key, 0) + 1
    return counts


def _mark_skipped(ax: Any, ys: Any, keys: list[tuple[str, int, str]],
                  counts: dict[str, dict[tuple[str, str], int]], backend: str) -> None:
    """Where this backend measured fewer of a bucket's calls than another backend did (it
    skipped them), say so at its bar: 'skipped' or 'k of n calls'."""
    for y, (collective, _, label) in zip(ys, keys, strict=True):
        most = max(c.get((collective, label), 0) for c in counts.values())
        mine = counts[backend].get((collective, label), 0)
        if mine < most:
            text = "skipped" if mine == 0 else f"{mine} of {most} calls"
            ax.annotate(text, (0, y), xycoords=("axes fraction", "data"), xytext=(2, 0),
                        textcoords="offset points", va="center", fontsize="x-small",
                        color="#aa0000")


def _breakdown_figure(name: str, backends: dict[str, list[Any]], paper: Any) -> Any:
    import matplotlib.pyplot as plt
    import numpy as np

    from ccbench.report.data import colour_key
    from ccbench.report.paper import rc_for
    from ccbench.report.style import RC, colour
    from ccbench.trace.summary import SPEEDUP_STATISTIC, speedups

    keys, per = breakdown(backends)
    totals = {b: sum(t.values()) for b, t in per.items()}
    counts = _calls_per_key(backends)
    # horizontal bars: one row per (collective, size bucket), labels never overlap
    height = 1.3 + (0.12 + 0.06 * len(per)) * len(keys)
    with plt.rc_context(RC | rc_for(paper)):
        fig, ax = plt.subplots(figsize=(paper.width, min(max(height, paper.width / 3),
                                                         3 * paper.width)),
                               layout="constrained")
        width = 0.8 / max(len(per), 1)
        y = np.arange(len(keys))
        for i, (backend, table) in enumerate(per.items()):
            first = backends[backend][0]
            lib = first.library
            ax.barh(y + (i - (len(per) - 1) / 2) * width, [table.get(k, 0.0) for k in keys],
                    width, color=colour(colour_key(first)),
                    label=f"{backend} ({lib}): {duration_text(totals[backend])} in all")
            _mark_skipped(ax, y + (i - (len(per) - 1) / 2) * width, keys, counts, backend)
        ax.set_yticks(y, [f"{c} {b}" for c, _, b in keys])
        ax.invert_yaxis()
        ax.set_xlabel("time (µs, summed over calls)")
        values = [v for t in per.values() for v in t.values() if v > 0]
        if values and max(values) > 100 * min(values):     # keep the small bars visible
            ax.set_xscale("log")
            ax.set_xlabel("time (µs, summed over calls; log)")
        title = f"trace {name}: time by collective and size"
        ratios = speedups({b: {r.method["trace"]["call"]: float(r.time_us["median"])
                               for r in recs} for b, recs in backends.items()})
        if ratios:
            last = ratios[-1]
            title += (f"; {last.fastest} {last.times:.2f}x faster than {last.other} "
                      f"({SPEEDUP_STATISTIC} over the {last.calls} calls all measured"
                      f"{f', {last.left_out} left out' if last.left_out else ''})")
        from ccbench.report.paper import wrap_text

        ax.set_title(wrap_text(title, paper, 0.8 * paper.width - 0.4))
        fig.legend(loc="outside lower center", ncols=1)
    return fig


def trace_figures(records: Sequence[Any], directory: str | Path,
                  formats: Sequence[str] = ("png",), paper: str = "double") -> list[Path]:
    """trace-<name>-timeline and trace-<name>-breakdown per trace; returns the files."""
    import re

    import matplotlib.pyplot as plt

    from ccbench.report.paper import METADATA, PAPERS

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, backends in latest_runs(records).items():
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
        for kind, draw in (("timeline", _timeline_figure), ("breakdown", _breakdown_figure)):
            fig = draw(name, backends, PAPERS[paper])
            for fmt in formats:
                path = directory / f"trace-{slug}-{kind}.{fmt}"
                fig.savefig(path, dpi=PAPERS[paper].dpi, metadata=METADATA[fmt])
                written.append(path)
            plt.close(fig)
    return written
