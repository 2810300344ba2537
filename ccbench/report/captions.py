"""Captions written from the data a figure draws: its world sizes, collectives and series
(with versions), never from what a run was meant to measure."""

from __future__ import annotations

from typing import Any

from ccbench.report import figures

__all__ = ["overview_caption", "collective_caption", "spread_caption", "model_caption",
           "and_list"]


def and_list(items: list[str]) -> str:
    items = [str(i) for i in items]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _worlds(frame: Any) -> str:
    worlds = figures._world_sizes(frame)
    return f"{and_list([str(p) for p in worlds])} rank{'s' if worlds != [1] else ''}"


def _series(frame: Any) -> str:
    return and_list([label for _, label, _ in figures._legend_entries(frame)])


def _only(frame: Any) -> str:
    """'; 3 ranks: Intel MPI 2021.18.1 only' where a world size has fewer series than the
    figure draws."""
    every = figures._legend_entries(frame)
    out = []
    for p in figures._world_sizes(frame):
        here = figures._legend_entries(frame[frame["world_size"] == p])
        if len(here) < len(every):
            out.append(f"{p} ranks: {and_list([label for _, label, _ in here])} only")
    return "; " + "; ".join(out) if out else ""


def _over(frame: Any) -> str:
    notes = [f"{p} ranks{figures.oversubscription(p, frame)}"
             for p in figures._world_sizes(frame) if figures.oversubscription(p, frame)]
    return f" *: {'; '.join(notes)}." if notes else ""


def _scale(frame: Any) -> str:
    if figures.busbw_is_log(frame):
        return (f" Bus bandwidth on a log axis: the series' peaks differ by more than "
                f"{figures.LOG_BUSBW_RATIO:g}x.")
    return ""


def _variants(frame: Any, modes: bool = False) -> str:
    """How the lines of series measured with options other than the defaults look (their
    legend entries name the options), where the figure draws one; `modes`: it draws
    in-place lines dashed beside out-of-place ones."""
    if "variant_rank" not in frame or not (frame["variant_rank"] > 0).any():
        return ""
    return (" Dotted lines" + (" (dash-dot in-place)" if modes else "")
            + ", with line-drawn markers: series measured with options other than the "
              "defaults, named in brackets.")


def overview_caption(frame: Any, metric: str) -> str:
    what = "Bus bandwidth" if metric == "busbw" else "Time per operation"
    colls = figures._unique(frame["collective"])
    inplace = [c for c in colls if not (~frame[frame["collective"] == c]["inplace"]).any()]
    mode = (f" {and_list(inplace)} in-place (the only mode measured), the others "
            f"out-of-place." if inplace else " Out-of-place.")
    return (f"{what} against message size: {len(colls)} collective"
            f"{'s' if len(colls) > 1 else ''} ({and_list(colls)}) at {_worlds(frame)}; "
            f"{_series(frame)}{_only(frame)}. Medians;{mode} {figures.context_line(frame)}."
            + (_scale(frame) if metric == "busbw" else "") + _variants(frame) + _over(frame))


def collective_caption(frame: Any, collective: str) -> str:
    sub = frame[frame["collective"] == collective]
    modes = figures._unique(sub["inplace"])
    lines = sub.groupby(["world_size", "series", "inplace"]).ngroups
    banded = (sub.groupby(["world_size", "series", "inplace"]).size().groupby("world_size")
              .size() <= figures.MAX_BANDED_LINES).any() and lines > 0
    how = ("solid out-of-place, dashed in-place" if len(modes) > 1
           else ("in-place" if modes[0] else "out-of-place"))
    return (f"{collective}: bus bandwidth (first row) and time per operation (second row) "
            f"against message size at {_worlds(sub)}; {_series(sub)}{_only(sub)}; {how}; "
            f"{figures.band_note(bool(banded))}. {figures.context_line(sub)}."
            + _scale(sub) + _variants(sub, len(modes) > 1) + _over(sub))


def spread_caption(frame: Any, p: int) -> str:
    sub = frame[frame["world_size"] == p]
    return (f"Per-rank spread at {p} ranks{figures.oversubscription(p, frame)}: a panel per "
            f"collective and series ({_series(sub)}); each row is a rank, each column a "
            f"message size, the colour its median time over the fastest rank's median "
            f"({figures.modes_note(sub)}). {figures.context_line(sub)}.")


def model_caption(frame: Any, collective: str, series: list[str], worlds: list[int]) -> str:
    return (f"{collective}: alpha-beta-gamma model (lines) against measured medians "
            f"(markers) at {and_list([str(p) for p in worlds])} ranks, and predicted over "
            f"measured; {and_list(series)}.")
