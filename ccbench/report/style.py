"""Colours, markers and axis formatting shared by every figure.

A series keeps its colour in every figure: the palette is keyed by the library
(for `mpi`, by the MPI implementation) or, for ccbench's own algorithms, by the
algorithm name. Unknown names get a colour from a reserve list chosen by a stable
hash of the name, so they too are the same in every figure and every run.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.ticker as mticker  # noqa: E402

from ccbench.backend_facts import BACKENDS  # noqa: E402
from ccbench.units import size_text  # noqa: E402

__all__ = ["colour", "marker", "set_size_axis", "size_tick", "LINESTYLE", "RC", "line_style",
           "VARIANT_LINESTYLE", "VARIANT_MARKERS"]


def _libraries() -> list[tuple[str, str, str]]:
    """(name a native series has, colour, marker) of every library, in the registry's order:
    the implementations of a backend that may be several (MPI), else the backend itself."""
    out = []
    for facts in BACKENDS.values():
        out += [(impl.name, impl.colour, impl.plot_marker) for impl in facts.implementations]
        if not facts.implementations:
            out.append((facts.display_name, facts.colour, facts.plot_marker))
    return out


# Okabe-Ito and Paul Tol's colour-blind-safe sets, chosen so that the series one figure
# shows together differ in hue, not only in lightness: the libraries' (ccbench/backend_facts.py)
# and the algorithms' against their library's vermillion (sky blue, olive, indigo, wine,
# teal). No two warm hues side by side (Intel MPI and oneCCL were vermillion and orange,
# tree brown). The order is that of the legends.
PALETTE = {name: colour for name, colour, _ in _libraries()} | {
    "ring": "#56B4E9",        # sky blue
    "tree": "#999933",        # olive
    "dbtree": "#117733",      # dark green
    "hypercube": "#332288",   # indigo
    "rabenseifner": "#AA4499",  # purple
    "direct": "#882255",      # wine
    "pairwise": "#882255",
    "bruck": "#44AA99",       # teal
}
RESERVE = ["#117733", "#AA4499", "#DDCC77", "#661100", "#6699CC", "#888888", "#E7298A",
           "#1B9E77", "#7570B3", "#A6761D"]
MARKERS = {name: mark for name, _, mark in _libraries()} | {"ring": "<", "tree": ">",
                                                             "hypercube": "h"}
RESERVE_MARKERS = ["p", "8", "H", "d", "1", "2", "3", "4"]
LINESTYLE: dict[bool, Any] = {False: "-", True: (0, (4, 2))}     # out-of-place solid, in-place dashed
# A series measured with options other than the defaults (a variant: `[combine=mean over
# ranks]`) keeps its library's colour and is told from the default series by its line,
# dotted (dash-dot in place), and by a marker no library has, one per variant of a report.
VARIANT_LINESTYLE: dict[bool, Any] = {False: (0, (1, 1.5)), True: (0, (5, 1.5, 1, 1.5))}
VARIANT_MARKERS = ["x", "+", "1", "2", "3", "4"]

RC: Any = {       # matplotlib types rc keys as literals; this dict is checked by rc_context
    # sizes in points are sizes on paper: ccbench.report.paper sets the fonts per paper
    "axes.grid": True, "grid.alpha": 0.35, "grid.linewidth": 0.5, "lines.linewidth": 1.2,
    "axes.spines.top": False, "axes.spines.right": False, "axes.linewidth": 0.6,
    "xtick.major.width": 0.6, "ytick.major.width": 0.6,
    "svg.fonttype": "none", "legend.frameon": False, "pdf.fonttype": 42,
}


def _pick(name: str, table: dict[str, str], reserve: list[str]) -> str:
    if name in table:
        return table[name]
    for known, value in table.items():          # "ring@mpi" -> ring's colour
        if name.split("@")[0] == known or name.lower() == known.lower():
            return value
    return reserve[zlib.crc32(name.encode()) % len(reserve)]


def colour(key: str) -> str:
    return _pick(key, PALETTE, RESERVE)


def marker(key: str) -> str:
    return _pick(key, MARKERS, RESERVE_MARKERS)


def line_style(key: str, variant_rank: int = 0, inplace: bool = False) -> tuple[Any, str]:
    """(line style, marker) of a series keyed `key` (its colour's key): the library's marker
    and LINESTYLE for the default series (variant_rank 0), else the variant's
    (VARIANT_LINESTYLE, VARIANT_MARKERS by the rank of its options among a report's)."""
    if variant_rank <= 0:
        return LINESTYLE[inplace], marker(key)
    return (VARIANT_LINESTYLE[inplace],
            VARIANT_MARKERS[(variant_rank - 1) % len(VARIANT_MARKERS)])


def set_size_axis(ax, lo: float, hi: float, label: str = "message size",
                  max_ticks: int = 11) -> None:
    """log2 x axis with ticks at powers of two (binary suffixes: 64 KiB), at most
    `max_ticks` labels, one of them at 1 KiB where the range holds it."""
    ax.set_xscale("log", base=2)
    k0, k1 = int(math.floor(math.log2(max(lo, 1)))), int(math.ceil(math.log2(max(hi, 1))))
    step = 1
    while (k1 - k0) // step + 1 > max_ticks:
        step += 1
    start = next(k for k in range(k0, k1 + 1) if (k - 10) % step == 0)   # 1K is a tick
    ticks = [2 ** k for k in range(start, k1 + 1, step) if lo / 1.3 <= 2 ** k <= hi * 1.3]
    ax.xaxis.set_major_locator(mticker.FixedLocator(ticks))
    ax.xaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: size_tick(v)))
    ax.xaxis.set_minor_locator(mticker.NullLocator())
    ax.set_xlim(lo / 1.25, hi * 1.25)
    ax.set_xlabel(label)


def size_tick(v: float) -> str:
    """A size axis' tick: 8 B, 64 KiB, 16 MiB (binary suffixes)."""
    return size_text(v, exact=True).replace(" ", "\u2009")


def time_formatter(v: float, _pos: object = None) -> str:
    """Microseconds on a log axis: 1 us, 10 us, 1 ms, 1 s."""
    if v >= 1e6:
        return f"{v / 1e6:g} s"
    if v >= 1e3:
        return f"{v / 1e3:g} ms"
    return f"{v:g} \u00b5s"
