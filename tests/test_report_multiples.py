"""The per-collective figure: one panel per world size while few lines share it, small
multiples (one row per series, the others in grey) when many would."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgb
from test_compare import make_record

from ccbench.report import build_report
from ccbench.report.data import to_frame
from ccbench.report.multiples import CONTEXT_COLOUR, is_crowded, per_collective_figure
from ccbench.units import size_label

SIZES = [8 << (4 * k) for k in range(5)]          # 8 B ... 512 KiB

#: backend -> (library, version, alpha us, GB/s)
SERIES = {
    "gloo": ("gloo", "torch 2.13.0+cpu", 30.0, 2.0),
    "mpi": ("Intel MPI", "Intel(R) MPI Library 2021.18.1 for Linux* OS", 3.0, 6.0),
    "oneccl": ("oneCCL", "2022.2.0", 50.0, 3.0),
    "ring@mpi": ("Intel MPI", "Intel(R) MPI Library 2021.18.1 for Linux* OS", 8.0, 5.0),
    "tree@mpi": ("Intel MPI", "Intel(R) MPI Library 2021.18.1 for Linux* OS", 6.0, 4.0),
    "hypercube@mpi": ("Intel MPI", "Intel(R) MPI Library 2021.18.1 for Linux* OS", 5.0, 4.5),
}
LABELS = {"gloo": "Gloo (torch.distributed)\n2.13.0", "mpi": "Intel MPI\n2021.18.1",
          "oneccl": "oneCCL\n2022.2.0", "ring@mpi": "ring@mpi\n(Intel MPI 2021.18.1)",
          "tree@mpi": "tree@mpi\n(Intel MPI 2021.18.1)",
          "hypercube@mpi": "hypercube@mpi\n(Intel MPI 2021.18.1)"}


def records(backends, worlds=(2, 4), modes=(False, True), collectives=("allreduce",)) -> list:
    out = []
    seed = 0
    for collective, p in ((c, p) for c in collectives for p in worlds):
        for backend in backends:
            lib, version, alpha_us, gbps = SERIES[backend]
            for inplace in modes:
                for size in SIZES:
                    seed += 1
                    t = alpha_us * math.log2(2 * p) + size / (gbps * 1e3)
                    out.append(make_record(
                        collective=collective, backend=backend, size=size, median_us=t,
                        seed=seed, world_size=p, inplace=inplace, library=lib, version=version,
                        algorithm="ring" if "@" in backend else "native"))
    return out


def _panels(fig) -> list:
    """The visible data axes (the legend and the suptitle are not axes)."""
    return [ax for ax in fig.axes if ax.get_visible()]


def _is_grey(line) -> bool:
    return to_rgb(line.get_color()) == to_rgb(CONTEXT_COLOUR)


@pytest.mark.parametrize("backends", [("gloo", "mpi"), ("mpi", "ring@mpi", "tree@mpi"),
                                      tuple(SERIES)])
def test_many_series_get_one_row_each(backends) -> None:
    """N series in and out of place at 2 and 4 ranks: N rows x (busbw, time) x 2 world sizes,
    every panel with its series' two bands and the other series' lines in grey, every row
    labelled with its series."""
    frame = to_frame(records(backends))
    assert is_crowded(frame, "allreduce")
    fig = per_collective_figure(frame, "allreduce")
    n = len(backends)
    panels = _panels(fig)
    assert len(panels) == n * 2 * 2
    for ax in panels:
        assert sum(isinstance(c, PolyCollection) for c in ax.collections) == 2
        grey = [line for line in ax.get_lines() if _is_grey(line)]
        coloured = [line for line in ax.get_lines() if not _is_grey(line)]
        assert len(grey) == 2 * (n - 1) and len(coloured) == 2
    labels = [ax.get_ylabel() for ax in panels if ax.get_ylabel()]
    assert sorted(labels) == sorted(LABELS[b] for b in backends)
    titles = [ax.get_title() for ax in panels if ax.get_title()]
    assert titles == ["busbw (GB/s)\n2 ranks", "busbw (GB/s)\n4 ranks",
                      "time per op\n2 ranks", "time per op\n4 ranks"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["out-of-place", "in-place", "p5-p95", "the other series"]
    assert "one row per series" in fig._suptitle.get_text()


def test_few_lines_keep_one_panel_per_world_size() -> None:
    """One library in and out of place: two lines a panel, both banded, in the overlay."""
    frame = to_frame(records(("mpi",)))
    assert not is_crowded(frame, "allreduce")
    fig = per_collective_figure(frame, "allreduce")
    assert len(_panels(fig)) == 4
    assert "band p5-p95 in panels of at most 2 lines" in fig._suptitle.get_text()
    # two libraries measured in one mode only: two lines, still one panel
    frame = to_frame(records(("gloo", "mpi"), modes=(False,)))
    assert not is_crowded(frame, "allreduce")
    assert len(_panels(per_collective_figure(frame, "allreduce"))) == 4


def test_a_series_missing_at_a_world_size_leaves_its_panel_out() -> None:
    """Only Intel MPI measured at 3 ranks, the others at 2: a column of one panel would be
    mostly empty space, so 3 ranks has none (the title says so); every series is labelled."""
    frame = to_frame(records(("gloo", "mpi", "oneccl"), worlds=(2,))
                     + records(("mpi",), worlds=(3,)))
    fig = per_collective_figure(frame, "allreduce")
    panels = _panels(fig)
    assert len(panels) == 3 * 2
    assert not [ax for ax in panels if "3 ranks" in ax.get_title()]
    assert "3 ranks, measured by Intel MPI" in fig._suptitle.get_text()
    labels = sorted(ax.get_ylabel() for ax in panels if ax.get_ylabel())
    assert labels == sorted(LABELS[b] for b in ("gloo", "mpi", "oneccl"))


def test_report_uses_small_multiples_and_names_the_sizes(tmp_path: Path) -> None:
    report = build_report(records(("gloo", "mpi", "oneccl")), tmp_path / "r",
                          formats=("png",))
    assert any(p.stem == "allreduce" for p in report.figures)
    md = report.markdown.read_text()
    assert "sizes measured: 8 B to 512 KiB (5 sizes)" in md
    assert "each series has its own row (small multiples)" in md


def test_heat_map_sizes_are_labelled_when_they_are_not_powers_of_two() -> None:
    """3 ranks of float32: 12, 24, 48 ... bytes, none a power of two; still 4 labels."""
    from ccbench.report.figures import _heat_ticks

    assert _heat_ticks([12 << k for k in range(20)]) == [0, 6, 13, 19]
    assert _heat_ticks([8 << k for k in range(24)]) == [1, 7, 13, 19]    # 16, 1K, 64K, 4M
    assert _heat_ticks([12]) == [0]
    assert [size_label(n, digits=2) for n in (12, 768, 1536, 2040, 131064, 16 << 20)] == \
        ["12", "768", "1.5K", "2K", "128K", "16M"]


def test_legend_takes_one_row_when_it_fits() -> None:
    """Five libraries in a five-collective overview (14 in): one row, none left alone on a
    second."""
    from ccbench.report.figures import overview_figure

    recs = records(("gloo", "mpi", "oneccl"), worlds=(2,), modes=(False,),
                   collectives=("allreduce", "allgather", "reduce-scatter", "alltoall",
                                "broadcast"))
    for library, version in (("MPICH", "MPICH Version: 5.0.2"), ("Open MPI", "Open MPI v5.0.11")):
        recs += [make_record(collective=r.collective, backend="mpi", size=r.size_used,
                             median_us=r.time_us["median"], library=library, version=version)
                 for r in recs if r.library == "gloo"]
    fig = overview_figure(to_frame(recs), "busbw")
    assert len(fig.legends[0].get_texts()) == 5
    assert fig.legends[0]._ncols == 5


def test_a_world_size_of_one_series_gets_no_empty_column() -> None:
    """3 ranks measured by Intel MPI alone, 2 and 4 by three libraries: no column of empty
    panels for 3 ranks (the title says where it is), and the title wraps instead of
    widening the figure."""
    recs = records(["gloo", "mpi", "oneccl"]) + records(["mpi"], worlds=(3,))
    fig = per_collective_figure(to_frame(recs), "allreduce")
    titles = {ax.get_title() for ax in fig.axes if ax.get_visible()}
    assert not any("3 ranks" in t for t in titles), titles
    suptitle = fig._suptitle.get_text()
    assert suptitle.splitlines()[-1].startswith("3 ranks, measured by Intel MPI")
    columns = {round(ax.get_position().x0, 3) for ax in fig.axes if ax.get_visible()}
    assert len(columns) == 4                      # busbw and time at 2 and 4 ranks


def test_the_rank_spread_title_ends_its_phrase() -> None:
    from ccbench.report.figures import rank_spread_figure

    fig = rank_spread_figure(to_frame(records(["gloo", "mpi"])), 2)
    first = fig._suptitle.get_text().splitlines()[0]
    assert first.endswith("over the fastest rank's median"), first
