"""The figures: bandwidth and latency against size, per-rank spread, model against measurement.

Every function takes the tidy frame of ccbench.report.data.to_frame and returns a
matplotlib Figure (Agg); ccbench.report.build saves them as PNG and SVG.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt  # Agg: the package imports style first
import matplotlib.ticker as mticker
from matplotlib.colors import LogNorm
from matplotlib.lines import Line2D

from ccbench.report import style
from ccbench.report.style import LINESTYLE, colour, marker, set_size_axis
from ccbench.units import size_label

__all__ = ["collective_figure", "overview_figure", "rank_spread_figure", "model_figure",
           "context_line"]


def _unique(values) -> list:
    out: list = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _join(values) -> str:
    return ", ".join(str(v) for v in _unique(values) if str(v) != "")


def context_line(frame) -> str:
    """dtype, op, device, timing, iterations and CPU in one line for a subtitle."""
    parts = [_join(frame["dtype"])]
    ops = [o for o in _unique(frame["op"]) if o]
    if ops:
        parts[-1] += f" {'/'.join(ops)}"
    device = _join(frame["device"])
    cpu = _join(frame["cpu"])
    ncpu = _join(frame["num_cpus"].dropna().astype(int)) if "num_cpus" in frame else ""
    if device == "cpu" and cpu:
        device = f"cpu ({cpu}{', ' + ncpu + ' cores' if ncpu else ''})"
    parts.append(device)
    nodes = _join(frame["nodes"])
    parts.append(f"{nodes} node{'s' if nodes != '1' else ''}")
    parts.append(f"{_join(frame['timing'])} timing")
    iters = sorted(_unique(frame["iterations"]))
    parts.append(f"median of {iters[0]}" + (f"-{iters[-1]}" if len(iters) > 1 else "")
                 + " iterations")
    return " · ".join(parts)


def _legend_entries(frame) -> list[tuple[str, str, str]]:
    """(series, legend label with version, colour key), in a stable order."""
    out = []
    seen = set()
    rank = {k: i for i, k in enumerate(style.PALETTE)}
    ordered = frame.assign(_rank=frame["colour_key"].map(lambda k: rank.get(k, len(rank))))
    for _, row in ordered.sort_values(["_rank", "series"]).iterrows():
        if row["series"] in seen:
            continue
        seen.add(row["series"])
        label = (f"{row['backend']} ({row['version']})" if "@" in row["backend"]
                 else row["version"])
        out.append((row["series"], label, row["colour_key"]))
    return out


def _add_legend(fig, frame, modes: Sequence[bool], extra: list | None = None,
                title: str | None = None, ncol: int = 7) -> None:
    handles = [Line2D([], [], color=colour(key), marker=marker(key), linestyle="-", label=label)
               for _, label, key in _legend_entries(frame)]
    if len(modes) > 1:
        for mode in sorted(modes):
            handles.append(Line2D([], [], color="0.25", linestyle=LINESTYLE[mode],
                                  label="in-place" if mode else "out-of-place"))
    handles.extend(extra or [])
    ncol = min(len(handles), max(1, ncol))
    budget = fig.get_figwidth() * 10.5           # characters of legend text per row
    widths = [len(str(h.get_label())) + 7 for h in handles]
    if sum(widths) <= budget:                    # one row: no entry left alone on a second
        ncol = len(handles)
    else:
        while ncol > 1 and ncol * max(widths) > budget:
            ncol -= 1
    fig.legend(handles=handles, loc="outside lower center", title=title, ncol=ncol,
               columnspacing=1.6, handlelength=2.6)


def _series_styles(frame):
    keys = dict(zip(frame["series"], frame["colour_key"], strict=False))
    return {s: (colour(k), marker(k)) for s, k in keys.items()}


#: a panel with more lines than this shows no p5-p95 bands: overlapping bands hide the lines
MAX_BANDED_LINES = 2


def _plot_lines(ax, frame, value: str, lo: str, hi: str, styles, band: bool = True) -> bool:
    """One line per (series, mode); with a single mode in the frame, every line is solid.
    The p5-p95 band only where the panel has at most MAX_BANDED_LINES lines; returns whether
    it drew one."""
    single = frame["inplace"].nunique() == 1
    lines = frame.groupby(["series", "inplace"], sort=True)
    band = band and lines.ngroups <= MAX_BANDED_LINES
    drew = False
    for (series, inplace), group in lines:
        group = group.sort_values("size")
        c, m = styles[series]
        dashed = inplace and not single
        ax.plot(group["size"], group[value], color=c, marker=m, linestyle=LINESTYLE[dashed],
                markevery=1, markerfacecolor="white" if dashed else c, markeredgewidth=0.8,
                zorder=3)
        if band and len(group) > 1:
            ax.fill_between(group["size"], group[lo], group[hi], color=c,
                            alpha=0.12 if dashed else 0.2, linewidth=0, zorder=2)
            drew = True
    return drew


def band_note(drawn: bool) -> str:
    """What the subtitle says about bands."""
    return (f"band p5-p95 in panels of at most {MAX_BANDED_LINES} lines" if drawn
            else "no p5-p95 bands: panels with more than "
                 f"{MAX_BANDED_LINES} lines show medians only")


def _world_sizes(frame) -> list[int]:
    return sorted(int(p) for p in _unique(frame["world_size"]))


def oversubscription(p: int, frame) -> str:
    """', oversubscribed (4 ranks on 2 cores)' when the records at p say so, else ''."""
    sub = frame[frame["world_size"] == p]
    if "oversubscribed" not in sub or not sub["oversubscribed"].any():
        return ""
    over = sub[sub["oversubscribed"]]
    cores = _join(over["cores_per_node"].dropna().astype(int))
    per_node = _join(over["ranks_per_node"])
    return f", oversubscribed ({per_node} ranks on {cores or '?'} cores)"


def _rank_title(p: int, frame) -> str:
    sub = frame[frame["world_size"] == p]
    nodes = _join(sub["nodes"])
    return f"{p} ranks on {nodes} node{'s' if nodes != '1' else ''}{oversubscription(p, frame)}"


def collective_figure(frame, collective: str):
    """busbw (top) and latency (bottom) against size, one column per world size."""
    sub = frame[frame["collective"] == collective]
    worlds = _world_sizes(sub)
    styles = _series_styles(sub)
    ncols = len(worlds)
    with plt.rc_context(style.RC):
        fig, axes = plt.subplots(2, ncols, figsize=(4.7 * ncols + 0.6, 6.6), squeeze=False,
                                 sharex=True, layout="constrained")
        lo, hi = sub["size"].min(), sub["size"].max()
        banded = False
        for j, p in enumerate(worlds):
            data = sub[sub["world_size"] == p]
            top, bottom = axes[0][j], axes[1][j]
            banded |= _plot_lines(top, data, "busbw", "busbw_p5", "busbw_p95", styles)
            banded |= _plot_lines(bottom, data, "median_us", "p5_us", "p95_us", styles)
            top.set_title(_rank_title(p, sub))
            top.set_ylim(bottom=0)
            bottom.set_yscale("log")
            bottom.yaxis.set_major_formatter(mticker.FuncFormatter(style.time_formatter))
            for ax in (top, bottom):
                set_size_axis(ax, lo, hi, max_ticks=7)
            top.set_xlabel("")
            if j == 0:
                top.set_ylabel("bus bandwidth (GB/s)")
                bottom.set_ylabel("time per operation")
        modes = _unique(sub["inplace"])
        only = "" if len(modes) > 1 else (" (in-place)" if modes[0] else " (out-of-place)")
        fig.suptitle(f"{collective}{only}: bus bandwidth and latency against size\n"
                     f"{context_line(sub)}; {band_note(banded)}", fontsize=11.5)
        _add_legend(fig, sub, _unique(sub["inplace"]))
    return fig


def _preferred_mode(data):
    """Out-of-place where measured, else in-place (broadcast is in-place only)."""
    if (~data["inplace"]).any():
        return data[~data["inplace"]], "out-of-place"
    return data[data["inplace"]], "in-place"


def overview_figure(frame, metric: str = "busbw"):
    """Every collective side by side (columns), one row per world size."""
    collectives = [c for c in _unique(frame["collective"])]
    worlds = _world_sizes(frame)
    styles = _series_styles(frame)
    nrows, ncols = len(worlds), len(collectives)
    modes_used: set[str] = set()
    banded = False
    with plt.rc_context(style.RC):
        # 2.4 in a column: five collectives make 14 in, shown at ~0.75 of their size in the
        # HTML, where 10.5 pt ticks stay >= 12 px
        fig, axes = plt.subplots(nrows, ncols, figsize=(2.4 * ncols + 1.9, 2.3 * nrows + 1.0),
                                 squeeze=False, sharex=True, layout="constrained",
                                 sharey="row" if metric != "busbw" else False)
        lo, hi = frame["size"].min(), frame["size"].max()
        for i, p in enumerate(worlds):
            for j, coll in enumerate(collectives):
                ax = axes[i][j]
                data = frame[(frame["world_size"] == p) & (frame["collective"] == coll)]
                if data.empty:
                    ax.set_visible(False)
                    continue
                data, mode = _preferred_mode(data)
                modes_used.add(f"; {coll} {mode}" if mode == "in-place" else mode)
                if metric == "busbw":
                    banded |= _plot_lines(ax, data, "busbw", "busbw_p5", "busbw_p95", styles)
                    ax.set_ylim(bottom=0)
                else:
                    banded |= _plot_lines(ax, data, "median_us", "p5_us", "p95_us", styles)
                    ax.set_yscale("log")
                    ax.yaxis.set_major_formatter(mticker.FuncFormatter(style.time_formatter))
                set_size_axis(ax, lo, hi, max_ticks=4)
                if i < nrows - 1:
                    ax.set_xlabel("")
                if i == 0:
                    ax.set_title(coll + (" (in-place)" if mode == "in-place" else ""),
                                 fontweight="bold")
                if j == 0:
                    over = "\noversubscribed" if oversubscription(p, frame) else ""
                    ax.set_ylabel(f"{p} ranks{over}\n" + ("busbw (GB/s)" if metric == "busbw"
                                                     else "time per op"))
        what = "bus bandwidth" if metric == "busbw" else "latency"
        fig.suptitle(f"{what} against size, every collective ({''.join(sorted(modes_used, key=len))})"
                     f"\n{context_line(frame)}; {band_note(banded)}", fontsize=11.5)
        _add_legend(fig, frame, [])
    return fig


def rank_spread_figure(frame, world_size: int):
    """Straggler view: each rank's median time over the fastest rank's, per size."""
    import numpy as np

    sub = frame[frame["world_size"] == world_size]
    collectives = _unique(sub["collective"])
    rank = {k: i for i, k in enumerate(style.PALETTE)}
    keys = dict(zip(sub["series"], sub["colour_key"], strict=False))
    series = sorted(_unique(sub["series"]), key=lambda s: (rank.get(keys[s], len(rank)), s))
    nrows, ncols = len(series), len(collectives)
    with plt.rc_context(style.RC | {"axes.grid": False}):
        fig, axes = plt.subplots(nrows, ncols, figsize=(2.5 * ncols + 1.6, (0.2 * world_size
                                                                  + 0.5) * nrows + 1.5),
                                 squeeze=False, layout="constrained")
        norm = LogNorm(vmin=1.0, vmax=4.0)
        image = None
        for i, name in enumerate(series):
            for j, coll in enumerate(collectives):
                ax = axes[i][j]
                data = sub[(sub["series"] == name) & (sub["collective"] == coll)]
                if data.empty:
                    ax.set_axis_off()
                    continue
                data, _ = _preferred_mode(data)
                data = data.sort_values("size")
                rows = [r for r in data["rank_median_us"] if len(r) == world_size]
                if not rows:
                    ax.set_axis_off()
                    continue
                mat = np.array(rows, dtype=float).T          # ranks x sizes
                fastest = np.where(mat.min(axis=0) > 0, mat.min(axis=0), np.nan)
                ratio = np.clip(mat / fastest, 1.0, 4.0)
                image = ax.imshow(ratio, aspect="auto", cmap="rocket_r" if _has_seaborn()
                                  else "magma_r", norm=norm, interpolation="nearest")
                sizes = data["size"].tolist()
                idx = _heat_ticks(sizes)
                ax.set_xticks(idx, [size_label(sizes[k], digits=2) for k in idx])
                ax.set_yticks(range(world_size), [str(r) for r in range(world_size)])
                ax.tick_params(length=2)
                for spine in ax.spines.values():
                    spine.set_visible(False)
                if i == 0:
                    ax.set_title(coll, fontweight="bold")
                if j == 0:     # horizontal, library on its own line: long names never overlap
                    ax.set_ylabel(name.replace(" (", "\n("), fontsize=10.5, rotation=0,
                                  ha="right", va="center")
                if i == nrows - 1:
                    ax.set_xlabel("size (bytes)")
        if image is not None:
            bar = fig.colorbar(image, ax=axes, location="right", shrink=0.8, aspect=30)
            bar.set_label("rank median / fastest rank median")
            bar.set_ticks([1, 1.5, 2, 3, 4], labels=["1", "1.5", "2", "3", "≥4"])
        fig.suptitle(f"Per-rank spread at {world_size} ranks"
                     f"{oversubscription(world_size, frame)} (straggler view): each row is a rank, "
                     f"its median time over the fastest rank's median\n{context_line(sub)}", fontsize=11.5)
    return fig


def _ratio_label(v: float, _pos: object = None) -> str:
    if v >= 1:
        return f"{v:g}"
    return f"1/{1 / v:g}"


def _heat_ticks(sizes: list[int], most: int = 4) -> list[int]:
    """Indices of the sizes to label: powers of two in step with 1K, at most `most` of them;
    where fewer than two sizes are powers of two (3 ranks: 12, 24, 48 ... bytes), `most`
    evenly spaced sizes instead."""
    logs = [math.log2(s) if s > 0 else 0 for s in sizes]
    for step in range(1, 31):
        idx = [i for i, k in enumerate(logs) if k == int(k) and (int(k) - 10) % step == 0]
        if len(idx) <= most:
            break
    if len(idx) >= 2 or len(sizes) < 2:
        return idx or [0]
    count = min(most, len(sizes))
    return sorted({round(k * (len(sizes) - 1) / (count - 1)) for k in range(count)})


def _has_seaborn() -> bool:
    try:
        import seaborn  # noqa: F401  (registers the rocket colormap)
        return True
    except ImportError:
        return False


def model_figure(frame, collective: str, predictions: dict[tuple[str, int], Any],
                 notes: dict[tuple[str, int], str]):
    """Measured median (markers) and model prediction (lines); below, predicted/measured."""

    sub = frame[(frame["collective"] == collective)]
    sub, mode = _preferred_mode(sub)
    worlds = [p for p in _world_sizes(sub)
              if any(k[1] == p for k in predictions if k[0] in set(sub["series"]))]
    styles = _series_styles(sub)
    ncols = max(1, len(worlds))
    with plt.rc_context(style.RC):
        fig, axes = plt.subplots(2, ncols, figsize=(3.9 * ncols + 2.6, 6.4), squeeze=False,
                                 sharex=True, layout="constrained",
                                 gridspec_kw={"height_ratios": [2.2, 1]})
        lo, hi = sub["size"].min(), sub["size"].max()
        for j, p in enumerate(worlds):
            top, bottom = axes[0][j], axes[1][j]
            data = sub[sub["world_size"] == p]
            for name, group in data.groupby("series", sort=True):
                pred = predictions.get((name, p))
                if pred is None:
                    continue
                group = group.sort_values("size")
                c, m = styles[name]
                top.plot(group["size"], group["median_us"], linestyle="none", marker=m,
                         color=c, markersize=4.5, zorder=3)
                sizes, pred_us = pred
                top.plot(sizes, pred_us, color=c, linewidth=1.3, zorder=2)
                measured = dict(zip(group["size"], group["median_us"], strict=False))
                ratio = [pu / measured[s] for s, pu in zip(sizes, pred_us, strict=False) if s in measured]
                top_sizes = [s for s in sizes if s in measured]
                bottom.plot(top_sizes, ratio, color=c, marker=m, linewidth=1.0)
            top.set_yscale("log")
            top.yaxis.set_major_formatter(mticker.FuncFormatter(style.time_formatter))
            top.set_title(_rank_title(p, sub))
            bottom.axhline(1.0, color="0.3", linewidth=0.8)
            bottom.set_yscale("log", base=2)
            bottom.yaxis.set_major_locator(mticker.FixedLocator(
                [2.0 ** k for k in range(-12, 13, 2)]))
            bottom.yaxis.set_major_formatter(mticker.FuncFormatter(_ratio_label))
            bottom.yaxis.set_minor_locator(mticker.NullLocator())
            for ax in (top, bottom):
                set_size_axis(ax, lo, hi, max_ticks=7)
            top.set_xlabel("")
            if j == 0:
                top.set_ylabel("time per operation")
                bottom.set_ylabel("predicted / measured")
        extra = [Line2D([], [], color="0.3", marker="o", linestyle="none", label="measured median"),
                 Line2D([], [], color="0.3", linestyle="-", label="model prediction")]
        fig.suptitle(f"{collective} ({mode}): alpha-beta-gamma model against measurement\n"
                     f"{context_line(sub)}", fontsize=11.5)
        present = sub[sub["series"].isin({k[0] for k in predictions})]
        _add_legend(fig, present if not present.empty else sub, [], extra=extra)
    return fig
