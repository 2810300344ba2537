"""The figures: bandwidth and latency against size, per-rank spread, model against measurement.

Every function takes the tidy frame of ccbench.report.data.to_frame and a paper
(ccbench.report.paper) and returns the figure's pages (matplotlib Figures at the paper's
width, laid out by paper.Grid; a second page only where the panels would make the figure
more than three times as tall as wide). ccbench.report saves them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import matplotlib.ticker as mticker
from matplotlib.colors import LogNorm
from matplotlib.lines import Line2D

from ccbench.collectives import IN_PLACE_ONLY
from ccbench.report import style
from ccbench.report.paper import Grid, Paper
from ccbench.report.style import LINESTYLE, colour, line_style, set_size_axis

__all__ = ["collective_figure", "overview_figure", "rank_spread_figure", "model_figure",
           "context_line", "busbw_is_log", "MAX_BANDED_LINES", "legend_rows"]

#: a panel with more lines than this shows no p5-p95 bands: overlapping bands hide the lines
MAX_BANDED_LINES = 2

#: busbw on a log axis where the series' peaks differ by more than this factor
LOG_BUSBW_RATIO = 10.0


def _unique(values) -> list:
    out: list = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _join(values) -> str:
    return ", ".join(str(v) for v in _unique(values) if str(v) != "")


def modes_note(frame) -> str:
    """Which mode a per-rank figure shows: out of place, and in place for the collectives
    measured in place only (their one buffer), named from the registry."""
    only = [c for c in _unique(frame["collective"]) if c in IN_PLACE_ONLY]
    return f"out-of-place; {', '.join(only)} in-place" if only else "out-of-place"


def context_line(frame) -> str:
    """dtype, op, device, timing, iterations and CPU in one line for a caption."""
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
    """(series, legend label with version and options, colour key), in a stable order: by
    colour, a series measured with options other than the defaults after its default one."""
    out = []
    seen = set()
    rank = {k: i for i, k in enumerate(style.PALETTE)}
    firsts = frame.drop_duplicates("series")
    ordered = firsts.assign(_rank=firsts["colour_key"].map(lambda k: rank.get(k, len(rank))))
    for _, row in ordered.sort_values(["_rank", "series"]).iterrows():
        if row["series"] in seen:
            continue
        seen.add(row["series"])
        out.append((row["series"], row["legend"], row["colour_key"]))
    return out


def _legend_handles(frame, modes: Sequence[bool], extra: list | None = None) -> list:
    styles = _series_styles(frame)
    handles: list = [Line2D([], [], label=label, **_line(styles[series], False, edge=None))
                     for series, label, _ in _legend_entries(frame)]
    if len(modes) > 1:
        for mode in sorted(modes):
            handles.append(Line2D([], [], color="0.25", linestyle=LINESTYLE[mode],
                                  label="in-place" if mode else "out-of-place"))
    handles.extend(extra or [])
    return handles


def _legend_columns(labels: list[str], paper: Paper) -> int:
    """As many columns as fit the paper's width, measured with the renderer on a legend of
    these labels (one small figure per legend: cheap beside a figure's draw)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not labels:
        return 1
    fig = Figure(figsize=(paper.width, 2.0))
    renderer = FigureCanvasAgg(fig).get_renderer()
    handles = [Line2D([], [], color="k", marker="o", label=t) for t in labels]
    for ncol in range(len(labels), 0, -1):
        legend = fig.legend(handles=handles, ncol=ncol, fontsize=paper.tick, frameon=False)
        width = legend.get_window_extent(renderer).width / fig.dpi
        legend.remove()
        if width <= paper.width - 0.1:
            return ncol
    return 1


def legend_rows(labels: list[str], paper: Paper) -> int:
    return math.ceil(len(labels) / _legend_columns(labels, paper)) if labels else 0


def _add_legend(fig, grid: Grid, handles: list) -> None:
    if not handles:
        return
    ncol = _legend_columns([str(h.get_label()) for h in handles], grid.paper)
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, grid.legend_y()),
               ncol=ncol, frameon=False, fontsize=grid.paper.tick)


def _series_styles(frame) -> dict[str, tuple[str, int]]:
    """series -> (colour key, variant rank): what its colour, marker and line are
    (style.line_style)."""
    ranks = frame["variant_rank"] if "variant_rank" in frame else [0] * len(frame)
    return {s: (k, int(r)) for s, k, r in zip(frame["series"], frame["colour_key"], ranks,
                                               strict=True)}


def _line(style: tuple[str, int], dashed: bool, edge: float | None = 0.6) -> dict[str, Any]:
    """plot() keywords of a series' line (_series_styles): its library's colour; the line
    style and marker of its variant and mode, the marker hollow in place; the line-drawn
    markers of a variant (x, +) a little heavier than `edge` (None: matplotlib's)."""
    key, rank = style
    linestyle, mark = line_style(key, rank, dashed)
    c = colour(key)
    out = {"color": c, "marker": mark, "linestyle": linestyle,
           "markerfacecolor": "white" if dashed else c}
    if rank or edge is not None:
        out["markeredgewidth"] = 0.9 if rank else edge
    return out


def busbw_is_log(frame) -> bool:
    """Whether, in some panel (collective and world size), the series differ by more than
    LOG_BUSBW_RATIO: at their peaks, or at the typical (median) size they share (a linear
    axis would lay the slow ones flat on the baseline: gloo beside MPI at small sizes)."""
    drawn = frame[frame["busbw"] > 0]
    if drawn.empty:
        return False
    panel = ["collective", "world_size"]
    peaks = drawn.groupby([*panel, "series"])["busbw"].max()
    spread = peaks.groupby(level=[0, 1]).agg(lambda v: v.max() / v.min())
    at_size = drawn.groupby([*panel, "size", "series"])["busbw"].median()
    per_size = at_size.groupby(level=[0, 1, 2]).agg(lambda v: v.max() / v.min())
    typical = per_size.groupby(level=[0, 1]).median()
    return bool((spread > LOG_BUSBW_RATIO).any() or (typical > LOG_BUSBW_RATIO).any())


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
        dashed = inplace and not single
        kwargs = _line(styles[series], dashed)
        c = kwargs["color"]
        ax.plot(group["size"].to_numpy(), group[value].to_numpy(), zorder=3, **kwargs)
        if band and len(group) > 1:
            ax.fill_between(group["size"].to_numpy(), group[lo].to_numpy(),
                            group[hi].to_numpy(), color=c, alpha=0.12 if dashed else 0.2,
                            linewidth=0, zorder=2)
            drew = True
    return drew


def band_note(drawn: bool) -> str:
    """What the caption says about bands."""
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


def _ranks(p: int, frame) -> str:
    return f"{p} ranks{'*' if oversubscription(p, frame) else ''}"


class _LogTicks(mticker.LogLocator):
    """Powers of ten; where the axis spans less than about two decades (a narrow range of
    times) also 2x and 5x, so that it never reads with one label."""

    def __init__(self) -> None:
        super().__init__(base=10, numticks=5)

    def tick_values(self, vmin: float, vmax: float):  # type: ignore[no-untyped-def]
        narrow = vmin > 0 and vmax > 0 and math.log10(max(vmin, vmax) / min(vmin, vmax)) < 1.8
        self.set_params(subs=(1.0, 2.0, 5.0) if narrow else (1.0,))
        return super().tick_values(vmin, vmax)


def _time_axis(ax) -> None:
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(_LogTicks())
    ax.yaxis.set_major_formatter(mticker.FuncFormatter(style.time_formatter))
    ax.yaxis.set_minor_locator(mticker.NullLocator())


def _busbw_axis(ax, log: bool) -> None:
    if log:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(mticker.LogLocator(base=10, numticks=5))
        ax.yaxis.set_major_formatter(mticker.FuncFormatter(_bw_label))
        ax.yaxis.set_minor_locator(mticker.NullLocator())
    else:
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_locator(mticker.MaxNLocator(4))


def _limits(ax, values, log: bool) -> None:
    """y limits from every value the axes sharing it draw (shared axes: set once)."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)] if log else v[np.isfinite(v)]
    if not len(v):
        return
    if log:
        ax.set_ylim(v.min() / 1.4, v.max() * 1.4)
    else:
        ax.set_ylim(0, max(v.max(), 1e-9) * 1.06)


def _bw_label(v: float, _pos: object = None) -> str:
    """0.01, 0.1, 10, 1000; below 0.01 a power of ten (10⁻⁵), never 1e-05."""
    if v <= 0 or v >= 1:
        return f"{v:g}"
    exponent = math.floor(math.log10(v) + 1e-9)
    if exponent < -2 and abs(v / 10.0 ** exponent - 1) < 1e-6:
        return f"$10^{{{exponent}}}$"
    return f"{v:.{max(0, -exponent)}f}"


def _panel_grid(paper: Paper, count: int, rows_of_legend: int, *, shared: bool,
                max_cols: int | None = None, left_chars: int = 6) -> list[Grid]:
    return Grid.plan(paper, count, header=0, legend_rows=rows_of_legend,
                     left_chars=left_chars, gap_chars=0 if shared else left_chars,
                     max_cols=max_cols)


def _panels(grids: list[Grid], share: bool):
    """(figure, grid, [axes]) per page, y shared within a page when `share`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    out = []
    for grid in grids:
        fig, axes = grid.figure(sharey=share, sharex=True)
        FigureCanvasAgg(fig)
        out.append((fig, grid, axes))
    return out


def _finish_axes(ax, grid: Grid, k: int, ylabel: str, shared: bool) -> None:
    """x tick labels and label under the lowest panel of each column; y label on the first
    column; y tick labels only there when the rows share y."""
    if not grid.is_lowest(k):
        ax.tick_params(labelbottom=False)
        ax.set_xlabel("")
    else:
        ax.tick_params(labelbottom=True)
        ax.set_xlabel("message size")
    first = k % grid.ncols == 0
    ax.set_ylabel(ylabel if first else "")
    if shared and not first:
        ax.tick_params(labelleft=False)


def _size_axis(ax, lo: float, hi: float, grid: Grid) -> None:
    # a "64 KiB" label is about 6 characters: as many as fit the panel's width
    most = max(2, int(grid.panel_w / (7.5 * grid.paper.char_in)))
    set_size_axis(ax, lo, hi, max_ticks=most, label="message size")


def collective_figure(frame, collective: str, paper: Paper) -> list:
    """busbw panels (one per world size), then time-per-operation panels."""
    sub = frame[frame["collective"] == collective]
    worlds = _world_sizes(sub)
    styles = _series_styles(sub)
    modes = _unique(sub["inplace"])
    handles = _legend_handles(sub, modes)
    rows = legend_rows([str(h.get_label()) for h in handles], paper)
    grids = Grid.plan(paper, 2 * len(worlds), header=0, legend_rows=rows, left_chars=6,
                      gap_chars=6, max_cols=len(worlds))
    log_bw = busbw_is_log(sub)
    lo, hi = sub["size"].min(), sub["size"].max()
    pages = []
    k_all = 0
    panels = [(metric, p) for metric in ("busbw", "time") for p in worlds]
    for fig, grid, axes in _panels(grids, share=False):
        for k, ax in enumerate(axes):
            metric, p = panels[k_all + k]
            data = sub[sub["world_size"] == p]
            if metric == "busbw":
                _plot_lines(ax, data, "busbw", "busbw_p5", "busbw_p95", styles)
                _busbw_axis(ax, log_bw)       # each panel its own range: a spike at one
                _limits(ax, data[["busbw", "busbw_p5", "busbw_p95"]].to_numpy().ravel(),
                        log_bw)               # world size flattens no other
                ylabel = "busbw (GB/s)"
            else:
                _plot_lines(ax, data, "median_us", "p5_us", "p95_us", styles)
                _time_axis(ax)
                _limits(ax, data[["median_us", "p5_us", "p95_us"]].to_numpy().ravel(), True)
                ylabel = "time per op"
            _size_axis(ax, lo, hi, grid)
            ax.set_title(_ranks(p, sub), fontweight="bold")
            _finish_axes(ax, grid, k, ylabel, shared=False)
        k_all += len(axes)
        _add_legend(fig, grid, handles)
        pages.append(fig)
    return pages


def _preferred_mode(data):
    """Out-of-place where measured, else in-place (broadcast is in-place only)."""
    if (~data["inplace"]).any():
        return data[~data["inplace"]], "out-of-place"
    return data[data["inplace"]], "in-place"


def overview_figure(frame, metric: str, paper: Paper) -> list:
    """A panel per (world size, collective), medians, y shared by every panel."""
    collectives = _unique(frame["collective"])
    worlds = _world_sizes(frame)
    styles = _series_styles(frame)
    handles = _legend_handles(frame, [])
    rows = legend_rows([str(h.get_label()) for h in handles], paper)
    cells, rows_of = _overview_cells(frame, collectives, worlds, paper, rows)
    titles = [_overview_title(frame, p, c, len(worlds) > 1) for p, c in cells]
    grids = Grid.plan(paper, len(cells), header=0, legend_rows=rows, left_chars=5,
                      rows_of=rows_of)
    if any(_too_wide(t, grids[0]) for t in titles):
        titles = [t.replace(", ", "\n") for t in titles]
        grids = Grid.plan(paper, len(cells), header=0, legend_rows=rows, left_chars=5,
                          rows_of=rows_of, titled=2)
    log_bw = busbw_is_log(frame)
    lo, hi = frame["size"].min(), frame["size"].max()
    pages = []
    done = 0
    for fig, grid, axes in _panels(grids, share=True):
        for k, ax in enumerate(axes):
            p, coll = cells[done + k]
            data, mode = _preferred_mode(frame[(frame["world_size"] == p)
                                               & (frame["collective"] == coll)])
            if metric == "busbw":
                _plot_lines(ax, data, "busbw", "busbw_p5", "busbw_p95", styles, band=False)
                if k == 0:
                    _busbw_axis(ax, log_bw)
                    _limits(ax, frame["busbw"], log_bw)
            else:
                _plot_lines(ax, data, "median_us", "p5_us", "p95_us", styles, band=False)
                if k == 0:
                    _time_axis(ax)
                    _limits(ax, frame["median_us"], True)
            _size_axis(ax, lo, hi, grid)
            ax.set_title(titles[done + k], fontweight="bold")
            _finish_axes(ax, grid, k, "busbw (GB/s)" if metric == "busbw" else "time per op",
                         shared=True)
        done += len(axes)
        _add_legend(fig, grid, handles)
        pages.append(fig)
    return pages


def _overview_cells(frame, collectives: list[str], worlds: list[int], paper: Paper,
                    rows: int) -> tuple[list[tuple[int, str]], int | None]:
    """The panels in reading order: a row per world size where every collective fits in
    a row, else a column per world size where they fit, else row after row."""
    measured = {(int(p), c) for p, c in zip(frame["world_size"], frame["collective"],
                                            strict=True)}
    if len(measured) != len(worlds) * len(collectives) or len(worlds) == 1:
        # one world size (a first run): the collectives simply wrap into a grid
        return [(p, c) for p in worlds for c in collectives if (p, c) in measured], None
    fits = Grid.plan(paper, len(measured), header=0, legend_rows=rows, left_chars=5)[0].ncols
    if len(collectives) <= fits or len(worlds) > fits:
        return [(p, c) for p in worlds for c in collectives], len(collectives)
    return [(p, c) for c in collectives for p in worlds], len(worlds)


def _overview_title(frame, p: int, coll: str, worlds: bool) -> str:
    data = frame[(frame["world_size"] == p) & (frame["collective"] == coll)]
    _, mode = _preferred_mode(data)
    title = coll + ("*" if mode == "in-place" and coll not in IN_PLACE_ONLY else "")
    return title + (f", {_ranks(p, frame)}" if worlds else "")


def _too_wide(title: str, grid: Grid) -> bool:
    """Whether a bold panel title is wider than its panel (planning estimate)."""
    return len(title) * grid.paper.font * 0.64 / 72 > grid.panel_w


def _fitted_title(title: str, grid: Grid) -> str:
    """A bold panel title in lines that fit its panel: a series' options (`[combine=mean over
    ranks]`) on a line of their own, a line still too wide broken between words."""
    import textwrap

    if not _too_wide(title, grid):
        return title
    chars = max(10, int(grid.panel_w * 72 / (grid.paper.font * 0.64)))
    parts = title.replace(" [", "\n[").split("\n")
    return "\n".join(line for part in parts
                      for line in textwrap.wrap(part, chars, break_on_hyphens=False))


def _spread_matrix(sub, name: str, collectives: list[str], world_size: int):
    """One series' ratios: a block of world_size rows per collective (and a blank row
    between blocks), a column per size any of them measured; None where none has per-rank
    medians."""
    import numpy as np

    mine = sub[sub["series"] == name]
    # a column per size the user asked for: the sizes used differ between collectives
    # (1020 B for allgather at 3 ranks where allreduce used 1024 B) and would otherwise
    # take separate, half-offset columns
    asked = [int(a) if a == a and a is not None else int(u)
             for a, u in zip(mine["size_asked"], mine["size"], strict=True)]
    mine = mine.assign(column_size=asked)
    sizes = sorted(set(asked))
    column = {s: i for i, s in enumerate(sizes)}
    blocks = []
    for coll in collectives:
        data = mine[mine["collective"] == coll]
        if data.empty:
            continue
        data, _ = _preferred_mode(data)
        block = np.full((world_size, len(sizes)), np.nan)
        for size, ranks in zip(data["column_size"], data["rank_median_us"], strict=True):
            if len(ranks) == world_size and min(ranks) > 0:
                block[:, column[int(size)]] = np.asarray(ranks, float) / min(ranks)
        if np.isfinite(block).any():
            blocks.append((coll, block))
    if not blocks:
        return None
    rows = []
    for k, (_, block) in enumerate(blocks):
        if k:
            rows.append(np.full((1, len(sizes)), np.nan))
        rows.append(block)
    return [c for c, _ in blocks], np.clip(np.vstack(rows), 1.0, 4.0), sizes


def rank_spread_figure(frame, world_size: int, paper: Paper) -> list:
    """Straggler view: each rank's median time over the fastest rank's, per size; a panel
    per series, a block of rows (its ranks) per collective."""
    import numpy as np

    sub = frame[frame["world_size"] == world_size]
    collectives = _unique(sub["collective"])
    rank = {k: i for i, k in enumerate(style.PALETTE)}
    keys = dict(zip(sub["series"], sub["colour_key"], strict=False))
    series = sorted(_unique(sub["series"]), key=lambda s: (rank.get(keys[s], len(rank)), s))
    cells = [(name, m) for name in series
             if (m := _spread_matrix(sub, name, collectives, world_size)) is not None]
    rows = max((len(m[1]) for _, m in cells), default=1)
    height = max(1.0, 0.035 * rows + 0.3, 0.13 * len(collectives))
    label_chars = max((len(c) for c in collectives), default=4)
    grids = Grid.plan(paper, max(1, len(cells)), header=0, legend_rows=0,
                      left_chars=label_chars, gap_chars=label_chars, panel_h=height,
                      footer_in=0.5, ylabel=False)
    titles = [_fitted_title(name, grids[0]) for name, _ in cells]
    lines = max((t.count("\n") + 1 for t in titles), default=1)
    if lines > 1:
        grids = Grid.plan(paper, max(1, len(cells)), header=0, legend_rows=0,
                          left_chars=label_chars, gap_chars=label_chars, panel_h=height,
                          footer_in=0.5, ylabel=False, titled=lines)
    norm = LogNorm(vmin=1.0, vmax=4.0)
    cmap = _spread_cmap()
    pages = []
    done = 0
    for fig, grid, axes in _panels(grids, share=False):
        image = None
        for k, ax in enumerate(axes):
            if done + k >= len(cells):
                ax.set_axis_off()
                continue
            name, (colls, ratio, sizes) = cells[done + k]
            image = ax.imshow(np.ma.masked_invalid(ratio), aspect="auto", cmap=cmap, norm=norm,
                              interpolation="nearest")
            idx = _heat_ticks(sizes, most=max(2, int(grid.panel_w / (8 * paper.char_in))))
            ax.set_xticks(idx, [style.size_tick(sizes[i]) for i in idx])
            centres = [b * (world_size + 1) + (world_size - 1) / 2 for b in range(len(colls))]
            ax.set_yticks(centres, colls)
            ax.tick_params(length=0)
            for spine in ax.spines.values():
                spine.set_visible(False)
            ax.grid(False)
            ax.set_title(titles[done + k], fontweight="bold")
            ax.set_xlabel("message size" if grid.is_lowest(k) else "")
        done += len(axes)
        if image is not None:
            _spread_colour_bar(fig, grid, image, world_size)
        pages.append(fig)
    return pages


def _spread_cmap():
    import matplotlib

    return matplotlib.colormaps["rocket_r" if _has_seaborn() else "magma_r"].with_extremes(
        bad="white")


def _spread_colour_bar(fig, grid: Grid, image, world_size: int) -> None:
    y = 0.17 / grid.height
    bar_ax = fig.add_axes((0.25, y, 0.5, 0.08 / grid.height), label="<colorbar>")
    bar = fig.colorbar(image, cax=bar_ax, orientation="horizontal")
    bar.ax.xaxis.set_label_position("top")
    bar.set_label(f"rank median / fastest rank median (rows: ranks 0-{world_size - 1})",
                  labelpad=2)
    bar.set_ticks([1, 1.5, 2, 3, 4], labels=["1", "1.5", "2", "3", "≥4"])
    bar.ax.tick_params(length=2)


def _ratio_label(v: float, _pos: object = None) -> str:
    if v >= 1:
        return f"{v:g}"
    return f"1/{1 / v:g}"


def _heat_ticks(sizes: list[int], most: int = 4) -> list[int]:
    """Indices of the sizes to label: powers of two in step with 1K, at most `most` of them;
    where fewer than two sizes are powers of two (3 ranks: 12, 24, 48 ... bytes), `most`
    evenly spaced sizes instead."""
    logs = [math.log2(s) if s > 0 else 0 for s in sizes]
    idx: list[int] = []
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
                 paper: Paper) -> list:
    """Per world size: measured median (markers) and model prediction (lines), and beside
    it predicted/measured."""
    sub = frame[(frame["collective"] == collective)]
    sub, _ = _preferred_mode(sub)
    worlds = [p for p in _world_sizes(sub)
              if any(k[1] == p for k in predictions if k[0] in set(sub["series"]))]
    styles = _series_styles(sub)
    extra = [Line2D([], [], color="0.3", marker="o", linestyle="none", label="measured median"),
             Line2D([], [], color="0.3", linestyle="-", label="model prediction")]
    present = sub[sub["series"].isin({k[0] for k in predictions})]
    handles = _legend_handles(present if not present.empty else sub, [], extra=extra)
    rows = legend_rows([str(h.get_label()) for h in handles], paper)
    grids = Grid.plan(paper, 2 * max(1, len(worlds)), header=0, legend_rows=rows,
                      left_chars=6, gap_chars=6, max_cols=2)
    lo, hi = sub["size"].min(), sub["size"].max()
    pages = []
    done = 0
    cells = [(p, part) for p in worlds for part in ("time", "ratio")]
    for fig, grid, axes in _panels(grids, share=False):
        for k, ax in enumerate(axes):
            p, part = cells[done + k]
            data = sub[sub["world_size"] == p]
            if part == "time":
                _model_time(ax, data, predictions, p, styles)
                ax.set_ylabel("time per op")
            else:
                _model_ratio(ax, data, predictions, p, styles)
                ax.set_ylabel("ratio (x)")
            _size_axis(ax, lo, hi, grid)
            ax.tick_params(labelbottom=True)
            ax.set_xlabel("message size" if grid.is_lowest(k) else "")
            ax.set_title(f"{_ranks(p, sub)}: " + ("time" if part == "time"
                                                  else "predicted / measured"),
                         fontweight="bold")
        done += len(axes)
        _add_legend(fig, grid, handles)
        pages.append(fig)
    return pages


def _model_time(ax, data, predictions, p: int, styles) -> None:
    for name, group in data.groupby("series", sort=True):
        pred = predictions.get((name, p))
        if pred is None:
            continue
        group = group.sort_values("size")
        kwargs = _line(styles[name], False, edge=None)
        ax.plot(group["size"].to_numpy(), group["median_us"].to_numpy(), zorder=3,
                **(kwargs | {"linestyle": "none"}))
        ax.plot(pred[0], pred[1], color=kwargs["color"], linestyle=kwargs["linestyle"],
                zorder=2)
    _time_axis(ax)


def _model_ratio(ax, data, predictions, p: int, styles) -> None:
    for name, group in data.groupby("series", sort=True):
        pred = predictions.get((name, p))
        if pred is None:
            continue
        measured = dict(zip(group["size"], group["median_us"], strict=False))
        sizes = [s for s in pred[0] if s in measured]
        ratio = [pu / measured[s] for s, pu in zip(pred[0], pred[1], strict=False)
                 if s in measured]
        ax.plot(sizes, ratio, **_line(styles[name], False, edge=None))
    ax.axhline(1.0, color="0.3", linewidth=0.8)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_locator(mticker.LogLocator(base=2, numticks=7))
    ax.yaxis.set_major_formatter(mticker.FuncFormatter(_ratio_label))
    ax.yaxis.set_minor_locator(mticker.NullLocator())
