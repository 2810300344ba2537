"""Paper sizes: every figure is laid out for a named target width and checked against it.

    paper = PAPERS["double"]                     # 7 in wide: a two-column page's text width
    grid = Grid.for_panels(paper, 9, header=1, legend_rows=1)
    fig, axes = grid.figure()                    # axes placed in inches, no layout engine

A figure is drawn at its print size (single column 3.3 in, double column 7 in, a 16:9 slide
10 in), so font sizes in points are the sizes on paper: no text under 7 pt. Panels are at
least MIN_PANEL_IN wide and wrap into a grid (a figure is never more than 3 times as tall as
it is wide: the panels that do not fit go to a second page, a second file). The layout is
computed here from the fonts, once per figure kind, instead of by a layout engine at every
save (constrained layout and tight bounding boxes measured every text of every figure twice:
most of the report's time).

`check_figure` measures a drawn figure with matplotlib's renderer (text extents, tick label
boxes, the data's extent in each panel): the report's tests hold every figure kind to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["PAPERS", "METADATA", "Paper", "Grid", "wrap_text", "MIN_PANEL_IN", "MIN_FONT_PT", "MAX_ASPECT",
           "check_figure", "rc_for"]

#: no dates or versions in the files: the same records give the same bytes
METADATA: dict[str, Any] = {"png": {"Software": None}, "svg": {"Date": None, "Creator": None},
                            "pdf": {"CreationDate": None, "Creator": None, "Producer": None}}

#: the contract every figure is checked against
MIN_PANEL_IN = 1.2
MIN_FONT_PT = 7.0
MAX_ASPECT = 3.0


@dataclass(frozen=True)
class Paper:
    name: str
    width: float           # inches: the figure's width
    font: float            # pt: labels and titles
    tick: float            # pt: tick labels and legend (>= MIN_FONT_PT)
    panel_h: float         # inches: a panel's height at most
    dpi: int               # PNG resolution

    @property
    def char_in(self) -> float:
        """Width of an average character of the tick font (inches), for planning only: the
        figures are checked with the renderer's own extents."""
        return self.tick * 0.56 / 72

    @property
    def line_in(self) -> float:
        """Height of a line of text (inches)."""
        return self.font * 1.35 / 72


PAPERS = {
    "single": Paper("single", 3.3, 7.5, 7.0, 1.35, 300),
    "double": Paper("double", 7.0, 8.0, 7.0, 1.6, 200),
    "slides": Paper("slides", 10.0, 12.0, 10.5, 2.4, 150),
}


# open-shaped: matplotlib rc parameters
def rc_for(paper: Paper) -> dict[str, Any]:
    """matplotlib settings for this paper (combined with style.RC)."""
    return {"font.size": paper.font, "axes.titlesize": paper.font, "axes.labelsize": paper.font,
            "xtick.labelsize": paper.tick, "ytick.labelsize": paper.tick,
            "legend.fontsize": paper.tick, "figure.titlesize": paper.font,
            "figure.dpi": 72, "savefig.dpi": paper.dpi,
            "lines.linewidth": 1.0 if paper.name != "slides" else 1.6,
            "lines.markersize": 2.6 if paper.name != "slides" else 4.0,
            "xtick.major.size": 2.5, "ytick.major.size": 2.5, "xtick.minor.size": 1.5,
            "ytick.minor.size": 1.5, "xtick.major.pad": 2.0, "ytick.major.pad": 2.0,
            "axes.titlepad": 3.0, "axes.labelpad": 2.0, "legend.handlelength": 2.0,
            "legend.columnspacing": 1.2, "legend.handletextpad": 0.5,
            "legend.borderaxespad": 0.2}


@dataclass
class Grid:
    """Panels in rows and columns at fixed positions (inches from the figure's edges)."""

    paper: Paper
    count: int             # panels on this page
    ncols: int
    nrows: int
    panel_w: float
    panel_h: float
    left: float
    right: float
    gap_w: float
    gap_h: float
    top: float
    bottom: float

    @classmethod
    def plan(cls, paper: Paper, count: int, *, header: int = 1, legend_rows: int = 0,
             left_chars: int = 6, ylabel: bool = True, min_w: float = MIN_PANEL_IN,
             max_cols: int | None = None, panel_h: float | None = None, gap_chars: int = 0,
             titled: int = 1, xlabel: bool = True, footer_in: float = 0.0,
             aspect: float | None = None, rows_of: int | None = None,
             gap_in: float = 0.0) -> list[Grid]:
        """The pages of `count` panels: as many columns as fit at least `min_w` wide (and
        at most `max_cols`), as many rows per page as keep the figure within MAX_ASPECT.
        left_chars: the y tick labels' width in characters; gap_chars: between columns
        (0: the panels share y and only the first column has tick labels); header: title
        lines above the panels; legend_rows: legend lines under them; aspect: panel height
        over width (overrides panel_h); titled: lines of each panel's title; rows_of: the
        panels come in groups of this many, each group starting a row where a group fits
        in one (the collectives of one world size); gap_in: more room between rows (for
        what a panel draws under its x tick labels)."""
        line = paper.line_in
        tick_h = paper.tick * 1.3 / 72
        left = left_chars * paper.char_in + (line + 0.06 if ylabel else 0.0) + 0.08
        right = max(0.08, 2.2 * paper.char_in)   # part of a size label at the right edge
        # shared y: room for half of a size label either side of the gap
        gap_w = (gap_chars * paper.char_in + 0.14) if gap_chars else 4 * paper.char_in
        usable = paper.width - left - right
        cols = max(1, int((usable + gap_w) // (min_w + gap_w)))
        cols = min(cols, count, max_cols or count)
        if rows_of and rows_of <= cols:
            cols = rows_of
        panel_w = (usable - (cols - 1) * gap_w) / cols
        if aspect is not None:
            height = panel_w * aspect
        else:
            height = min(panel_h or paper.panel_h, max(0.9, panel_w * 0.85))
        title_h = titled * line + 0.03 if titled else 0.0
        x_h = tick_h + 0.06 + (line if xlabel else 0.0)
        gap_h = title_h + tick_h + 0.1 + gap_in
        top = 0.05 + header * line + (0.04 if header else 0.0) + title_h
        bottom = x_h + 0.05 + legend_rows * (paper.tick * 1.75 / 72) + (0.1 if legend_rows
                                                                          else 0.0) + footer_in
        rows_all = math.ceil(count / cols)
        most = max(1, int((MAX_ASPECT * paper.width - top - bottom + gap_h)
                          // (height + gap_h)))
        pages = []
        left_count = count
        for start in range(0, rows_all, most):
            rows = min(most, rows_all - start)
            n = min(left_count, rows * cols)
            left_count -= n
            page = cls(paper, n, cols, math.ceil(n / cols), panel_w, height, left, right,
                       gap_w, gap_h, top, bottom)
            short = paper.width / MAX_ASPECT + 0.01 - page.height
            if short > 0:            # one row of wide panels: taller, not a strip
                page.panel_h += short / page.nrows
            pages.append(page)
        return pages

    @property
    def height(self) -> float:
        return self.top + self.nrows * self.panel_h + (self.nrows - 1) * self.gap_h + \
            self.bottom

    def figure(self, **subplot: Any) -> tuple[Any, list[Any]]:
        """A figure of the paper's width with this page's axes, row by row."""
        from matplotlib.figure import Figure

        fig = Figure(figsize=(self.paper.width, self.height))
        axes: list[Any] = []
        w, h = self.paper.width, self.height
        for k in range(self.count):
            i, j = divmod(k, self.ncols)
            x0 = self.left + j * (self.panel_w + self.gap_w)
            y0 = h - self.top - i * (self.panel_h + self.gap_h) - self.panel_h
            share: dict[str, Any] = {key: (axes[0] if value is True else value)
                                     for key, value in subplot.items()
                                     if value is not False and axes}
            axes.append(fig.add_axes((x0 / w, y0 / h, self.panel_w / w, self.panel_h / h),
                                     **share))
        return fig, axes

    def is_lowest(self, k: int) -> bool:
        """Whether panel k has no panel under it (its x tick labels and label are drawn)."""
        return k + self.ncols >= self.count

    def legend_y(self) -> float:
        """The legend's top, as a figure fraction (under the x labels)."""
        tick_h = self.paper.tick * 1.3 / 72
        return (self.bottom - tick_h - 0.06 - self.paper.line_in - 0.03) / self.height


def wrap_text(text: str, paper: Paper, width_in: float, size: float | None = None) -> str:
    """`text` broken into lines of at most width_in at the paper's font (planning estimate;
    the figures are checked with the renderer)."""
    import textwrap

    chars = max(10, int(width_in / ((size or paper.font) * 0.56 / 72)))
    return "\n".join(textwrap.wrap(text, chars, break_on_hyphens=False))


# --- the check ------------------------------------------------------------------------------


def _texts(fig: Any) -> list[Any]:
    """Every text drawn: tick labels only where their tick is in view (matplotlib keeps the
    others, undrawn)."""
    from matplotlib.text import Text

    ticks: dict[int, bool] = {}
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
                shown = lo - 1e-9 * abs(lo) <= tick.get_loc() <= hi + 1e-9 * abs(hi)
                ticks[id(tick.label1)] = ticks[id(tick.label2)] = shown
    out = []
    for artist in fig.findobj(Text):
        if artist.get_visible() and artist.get_text().strip() and ticks.get(id(artist), True):
            out.append(artist)
    return out


def _overlaps(boxes: list[Any], pad: float = 0.0) -> list[tuple[int, int]]:
    bad = []
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            a, b = boxes[i], boxes[j]
            if a.x1 - pad > b.x0 and b.x1 - pad > a.x0 and a.y1 - pad > b.y0 and \
                    b.y1 - pad > a.y0:
                bad.append((i, j))
    return bad


def _tick_labels(axis: Any, renderer: Any) -> list[Any]:
    out = []
    lo, hi = sorted(axis.get_view_interval())
    for tick in axis.get_major_ticks():
        loc = tick.get_loc()
        for label in (tick.label1, tick.label2):
            if label.get_visible() and label.get_text() and lo <= loc <= hi:
                out.append(label.get_window_extent(renderer))
    return out


def _data_extent(ax: Any) -> tuple[float, float] | None:
    """The fraction of the panel's width and height that its data spans (lines, markers,
    images, bars), or None where it draws nothing to measure."""
    import numpy as np

    xs: list[float] = []
    ys: list[float] = []
    trans = ax.transData
    for line in ax.get_lines():
        x, y = line.get_xdata(orig=False), line.get_ydata(orig=False)
        if len(x) < 2 or line.get_color() in ("0.3", "0.25"):
            continue
        pts = trans.transform(np.column_stack([np.asarray(x, float), np.asarray(y, float)]))
        pts = pts[np.isfinite(pts).all(axis=1)]
        if len(pts):
            xs += [pts[:, 0].min(), pts[:, 0].max()]
            ys += [pts[:, 1].min(), pts[:, 1].max()]
    for image in ax.get_images():
        x0, x1, y0, y1 = image.get_extent()
        pts = trans.transform([(x0, y0), (x1, y1)])
        xs += list(pts[:, 0])
        ys += list(pts[:, 1])
    for patch in ax.patches:
        box = patch.get_window_extent()
        if box.width > 0:
            xs += [box.x0, box.x1]
            ys += [box.y0, box.y1]
    if not xs:
        return None
    box = ax.get_window_extent()
    fx = (min(max(xs), box.x1) - max(min(xs), box.x0)) / box.width
    fy = (min(max(ys), box.y1) - max(min(ys), box.y0)) / box.height
    return fx, fy


def check_figure(fig: Any, paper: Paper, min_data: float = 0.5) -> list[str]:
    """What is wrong with a drawn figure at its paper size (empty: nothing). Measured with
    the figure's renderer: text under MIN_FONT_PT, text outside the figure, overlapping tick
    labels, texts or panels, panels narrower than MIN_PANEL_IN, an aspect ratio beyond
    MAX_ASPECT, panels whose data spans less than `min_data` of their width (or a quarter of
    their height)."""
    problems: list[str] = []
    width, height = fig.get_size_inches()
    if abs(width - paper.width) > 0.01:
        problems.append(f"width {width:.2f} in, not the {paper.name} paper's {paper.width} in")
    if max(width / height, height / width) > MAX_ASPECT + 1e-6:
        problems.append(f"aspect {width:.2f} x {height:.2f} in beyond 1:{MAX_ASPECT:g}")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = _texts(fig)
    problems += _text_problems(fig, texts, renderer)
    problems += _panel_problems(fig, renderer, min_data)
    return problems


def _text_problems(fig: Any, texts: list[Any], renderer: Any) -> list[str]:
    """Texts too small, outside the figure, or overlapping (layout texts: titles, labels,
    tick labels, legends; not the values written inside a panel)."""
    problems = []
    frame = fig.bbox
    boxes, names = [], []
    for text in texts:
        if text.get_fontsize() < MIN_FONT_PT - 1e-6:
            problems.append(f"text {text.get_text()[:30]!r} at {text.get_fontsize():.1f} pt")
        box = text.get_window_extent(renderer)
        if box.x0 < frame.x0 - 1 or box.x1 > frame.x1 + 1 or box.y0 < frame.y0 - 1 or \
                box.y1 > frame.y1 + 1:
            problems.append(f"text {text.get_text()[:30]!r} outside the figure")
        if text.get_rotation() in (0.0, 90.0) and not _inside_axes(text, fig):
            boxes.append(box)
            names.append(text.get_text()[:25])
    for i, j in _overlaps(boxes, pad=-1.5):     # at least 1.5 pt apart
        problems.append(f"texts overlap: {names[i]!r} and {names[j]!r}")
    return problems


def _panel_problems(fig: Any, renderer: Any, min_data: float) -> list[str]:
    problems = []
    dpi = fig.dpi
    shown = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
    for ax in shown:
        box = ax.get_window_extent(renderer)
        is_bar = ax.get_label() == "<colorbar>"
        if not is_bar and box.width / dpi < MIN_PANEL_IN - 1e-6:
            problems.append(f"panel {ax.get_title()[:30]!r} {box.width / dpi:.2f} in wide")
        for axis in (ax.xaxis, ax.yaxis):
            if _overlaps(_tick_labels(axis, renderer), pad=-1.0):
                problems.append(f"overlapping {axis.axis_name} tick labels in panel "
                                f"{ax.get_title()[:30]!r}: "
                                + ", ".join(t.get_text() for t in axis.get_ticklabels()))
        extent = None if is_bar else _data_extent(ax)
        if extent is not None and (extent[0] < min_data or extent[1] < 0.25):
            problems.append(f"panel {ax.get_title()[:30]!r}: data spans {extent[0]:.0%} "
                            f"of its width, {extent[1]:.0%} of its height")
    for i, j in _overlaps([ax.get_window_extent(renderer) for ax in shown]):
        problems.append(f"panels overlap: {shown[i].get_title()[:20]!r} and "
                        f"{shown[j].get_title()[:20]!r}")
    return problems


def _inside_axes(text: Any, fig: Any) -> bool:
    """Annotations drawn inside a panel (a heat map's cell values) are not layout text."""
    return any(text in ax.texts for ax in fig.axes)
