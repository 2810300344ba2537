"""Small multiples for a collective whose panels would hold many lines.

With four to eight series (each in and out of place) in one panel the lines cross and
their p5-p95 bands cannot be drawn without hiding them. Here every series gets its own
row: its lines with their bands in colour, every other series of the same panel as thin
grey context lines, and the axes of one column shared so rows compare by eye. Columns:
bus bandwidth at each world size, then time per operation at each world size.

    per_collective_figure(frame, collective)   # the overlay figure or the small multiples
"""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ccbench.report import figures, style
from ccbench.report.style import LINESTYLE, set_size_axis

__all__ = ["per_collective_figure", "small_multiples_figure", "is_crowded"]

#: (metric column, p5 column, p95 column, column title)
METRICS = (("busbw", "busbw_p5", "busbw_p95", "busbw (GB/s)"),
           ("median_us", "p5_us", "p95_us", "time per op"))
CONTEXT_COLOUR = "0.78"


def is_crowded(frame: Any, collective: str) -> bool:
    """Whether a panel of the overlay figure would have more lines than get bands."""
    sub = frame[frame["collective"] == collective]
    lines = sub.groupby(["world_size", "series", "inplace"]).size().groupby("world_size").size()
    return bool((lines > figures.MAX_BANDED_LINES).any())


def per_collective_figure(frame: Any, collective: str) -> Any:
    """The overlay figure (every series in one panel) while its panels have few lines,
    else one row per series."""
    if is_crowded(frame, collective):
        return small_multiples_figure(frame, collective)
    return figures.collective_figure(frame, collective)


def _row_label(label: str) -> str:
    """'ring@mpi (Intel MPI 2021.18.1)' on two lines; a library and its version on two
    ('Gloo (torch.distributed)' above '2.13.0')."""
    if label.endswith(")"):
        return label.replace(" (", "\n(", 1)
    name, _, version = label.rpartition(" ")
    return f"{name}\n{version}" if name and len(label) > 14 else label


def _column_title(p: int, frame: Any, title: str) -> str:
    star = "*" if figures.oversubscription(p, frame) else ""
    return f"{title}\n{p} ranks{star}"


def _draw_context(ax: Any, others: Any, value: str) -> None:
    for _, group in others.groupby(["series", "inplace"], sort=True):
        group = group.sort_values("size")
        ax.plot(group["size"], group[value], color=CONTEXT_COLOUR, linewidth=0.8, zorder=1)


def small_multiples_figure(frame: Any, collective: str) -> Any:
    """One row per series, one column per (metric, world size)."""
    sub = frame[frame["collective"] == collective]
    worlds, _ = shown_world_sizes(sub)
    entries = figures._legend_entries(sub)
    styles = figures._series_styles(sub)
    columns = [(metric, p) for metric in METRICS for p in worlds]
    nrows, ncols = len(entries), len(columns)
    # small panels: thinner lines and smaller markers, so 20-30 sizes stay apart
    small: Any = {"axes.titlesize": 11.5, "lines.linewidth": 1.2, "lines.markersize": 2.6}
    with plt.rc_context(style.RC | small):
        fig, axes = plt.subplots(nrows, ncols, figsize=(1.95 * ncols + 2.0, 1.45 * nrows + 1.9),
                                 squeeze=False, sharex=True, sharey="col",
                                 layout="constrained")
        lo, hi = sub["size"].min(), sub["size"].max()
        for j, ((value, p5, p95, title), p) in enumerate(columns):
            panel = sub[sub["world_size"] == p]
            lowest = None
            for i, (series, label, _) in enumerate(entries):
                ax = axes[i][j]
                own = panel[panel["series"] == series]
                if own.empty:
                    ax.set_visible(False)
                    continue
                lowest = ax
                _draw_context(ax, panel[panel["series"] != series], value)
                figures._plot_lines(ax, own, value, p5, p95, styles)
                set_size_axis(ax, lo, hi, label="", max_ticks=4)
                if value == "busbw":
                    ax.set_ylim(bottom=0)
                else:
                    ax.set_yscale("log")
                    ax.yaxis.set_major_formatter(mticker.FuncFormatter(style.time_formatter))
                if i == 0 or not axes[i - 1][j].get_visible():
                    ax.set_title(_column_title(p, sub, title))
                if j == 0:     # horizontal, version on its own line: long names never overlap
                    ax.set_ylabel(_row_label(label), rotation=0, ha="right", va="center",
                                  fontsize=11.5, fontweight="bold")
            if lowest is not None:       # size ticks under the lowest panel of each column
                lowest.xaxis.set_tick_params(labelbottom=True)
                lowest.set_xlabel("size (bytes)")
        _first_column_labels(axes, entries)
        fig.suptitle(_suptitle(sub, collective), fontsize=11.5)
        fig.legend(handles=_legend_handles(sub), loc="outside lower center",
                   ncol=4, columnspacing=1.6, handlelength=2.6)
    return fig


def shown_world_sizes(sub: Any) -> tuple[list[int], list[int]]:
    """(world sizes given a column, world sizes left out): a world size that only one series
    measured while others have several would be a column of empty panels (the overview
    figures show it); kept when every world size is that sparse."""
    worlds = figures._world_sizes(sub)
    series = sub.groupby("world_size")["series"].nunique()
    shown = [p for p in worlds if series[p] > 1 or sub["series"].nunique() == 1]
    shown = shown or worlds
    return shown, [p for p in worlds if p not in shown]


def _first_column_labels(axes: Any, entries: list[tuple[str, str, str]]) -> None:
    """A series missing from the first column is labelled on its first visible panel."""
    for i, (_, label, _) in enumerate(entries):
        row = [ax for ax in axes[i] if ax.get_visible()]
        if row and row[0] is not axes[i][0]:
            row[0].set_ylabel(_row_label(label), rotation=0, ha="right", va="center",
                              fontsize=11.5, fontweight="bold")


def _suptitle(sub: Any, collective: str) -> str:
    modes = figures._unique(sub["inplace"])
    only = "" if len(modes) > 1 else (" (in-place)" if modes[0] else " (out-of-place)")
    worlds, left_out = shown_world_sizes(sub)
    over = [p for p in worlds if figures.oversubscription(p, sub)]
    # ", oversubscribed (4 ranks on 2 cores)" per world size -> one footnote for the stars
    inner = [figures.oversubscription(p, sub).partition("(")[2].rstrip(")") for p in over]
    star = f"; *oversubscribed: {', '.join(inner)}" if over else ""
    lone = ""
    if left_out:           # its own line: a long title widens the figure, not its panels
        lone = "\n" + "; ".join(
            f"{p} ranks, measured by {figures._legend_entries(sub[sub['world_size'] == p])[0][1]}"
            f" only: in the overview figures" for p in left_out)
    return (f"{collective}{only}: bus bandwidth and time per operation against size, "
            f"one row per series{star}\n{figures.context_line(sub)}; "
            f"band p5-p95 of the iterations; grey: the other series{lone}")


def _legend_handles(sub: Any) -> list[Any]:
    handles: list[Any] = []
    if sub["inplace"].nunique() > 1:
        handles += [Line2D([], [], color="0.25", linestyle=LINESTYLE[mode],
                           label="in-place" if mode else "out-of-place")
                    for mode in (False, True)]
    handles.append(Patch(color="0.25", alpha=0.2, linewidth=0, label="p5-p95"))
    handles.append(Line2D([], [], color=CONTEXT_COLOUR, linewidth=0.8,
                          label="the other series"))
    return handles
