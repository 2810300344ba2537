"""ccbench report on synthetic records: figures (PNG + SVG), Markdown and HTML, key numbers."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
from conftest import run_ccbench
from test_compare import make_record, write

from ccbench.errors import UsageError
from ccbench.report import build_report
from ccbench.report.data import (
    colour_key,
    half_peak_size,
    key_numbers,
    series_label,
    short_version,
    to_frame,
)
from ccbench.report.style import colour, set_size_axis
from ccbench.units import size_label

SIZES = [8 << (4 * k) for k in range(6)]          # 8 B ... 8 MiB, factor 16


def synthetic(collectives=("allreduce", "broadcast"), worlds=(2, 4),
              backends=("gloo", "mpi")) -> list:
    records = []
    seed = 0
    libs = {"gloo": ("gloo", "torch 2.13.0+cpu", 30.0, 2.0),
            "mpi": ("Intel MPI", "Intel(R) MPI Library 2021.18.1 for Linux* OS", 3.0, 6.0),
            "ring@mpi": ("Intel MPI", "Intel(R) MPI Library 2021.18.1 for Linux* OS", 8.0, 5.0)}
    for coll in collectives:
        for p in worlds:
            for backend in backends:
                lib, version, alpha_us, gbps = libs[backend]
                for inplace in ((True,) if coll == "broadcast" else (False, True)):
                    for size in SIZES:
                        seed += 1
                        t = alpha_us * math.log2(2 * p) + size / (gbps * 1e3) * (1.1 if inplace
                                                                                  else 1.0)
                        records.append(make_record(
                            collective=coll, backend=backend, size=size, median_us=t, seed=seed,
                            world_size=p, inplace=inplace, library=lib, version=version,
                            algorithm="ring" if "@" in backend else "native",
                            straggler=1.5 if p == 4 else 1.0))
    return records


def test_report_writes_figures_and_documents(tmp_path: Path) -> None:
    records = synthetic(collectives=("allreduce",)) + synthetic(collectives=("broadcast",),
                                                                worlds=(2,))[:6]
    report = build_report(records, tmp_path / "out", sources=["synthetic"],
                          formats=("png", "svg", "pdf"))
    names = {p.stem for p in report.figures}
    assert {"overview-busbw", "overview-latency", "allreduce", "broadcast", "rank-spread-n2",
            "rank-spread-n4"} <= names
    for png in report.figures:
        assert png.stat().st_size > 10_000
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        svg = png.with_suffix(".svg")
        assert svg.exists() and "<svg" in svg.read_text()[:2000]
        assert png.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-"
    md = report.markdown.read_text()
    assert "![" in md and "allreduce.png" in md
    assert "| series | ranks | mode | peak busbw GB/s | time 8 B | time 1 KiB | half-peak size |" in md
    assert "Intel MPI" in md and "Gloo (torch.distributed)" in md      # the display names
    page = report.html.read_text()
    assert page.startswith("<!DOCTYPE html>") and '<img src="allreduce.png"' in page
    assert (tmp_path / "out" / "key-numbers.csv").exists()
    # captions from the data: what the figure draws, not what was meant to be measured
    assert "*broadcast: bus bandwidth (first row) and time per operation (second row) against " \
        "message size at 2 ranks; Gloo (torch.distributed) 2.13.0" in md
    assert "2 collectives (broadcast and allreduce) at 2 and 4 ranks" in md


def test_algorithms_get_their_own_figures(tmp_path: Path) -> None:
    records = synthetic(collectives=("allreduce",), worlds=(2,), backends=("mpi", "ring@mpi"))
    report = build_report(records, tmp_path / "a", formats=("png",))
    names = {p.stem for p in report.figures}
    assert {"allreduce", "algorithms-allreduce", "algorithms-overview-busbw"} <= names
    assert "ring@mpi (Intel MPI)" in report.markdown.read_text()
    assert not list((tmp_path / "a").glob("*.svg"))
    serial = build_report(records, tmp_path / "b", formats=("png",), workers=1)
    assert [p.name for p in serial.figures] == [p.name for p in report.figures]


def test_key_numbers() -> None:
    frame = to_frame(synthetic(collectives=("allreduce",), worlds=(2,), backends=("mpi",)))
    keys = key_numbers(frame)
    row = keys[(keys["series"] == "Intel MPI") & (keys["mode"] == "out-of-place")].iloc[0]
    assert row["peak_at"] == SIZES[-1]
    assert row["lat_8B_us"] == pytest.approx(3.0 * 2 + 8 / 6e3, rel=1e-6)
    assert 0 < row["half_peak_size"] < SIZES[-1]


def test_half_peak_size_interpolates() -> None:
    assert half_peak_size([1, 2, 4, 8], [1, 2, 4, 8]) == pytest.approx(4.0)
    assert half_peak_size([1024, 4096], [1.0, 3.0]) == pytest.approx(2 ** 10.5)
    assert math.isnan(half_peak_size([], []))


def test_labels_and_colours_are_stable() -> None:
    rec = make_record(backend="mpi", library="MPICH", version="MPICH Version: 5.0.2")
    assert series_label(rec) == "MPICH"
    assert colour("Gloo (torch.distributed)") == "#0072B2" != colour("Intel MPI")
    assert colour("ring@mpi") == colour("ring")
    assert colour("some-new-lib") == colour("some-new-lib")
    assert [size_label(s) for s in (8, 1024, 4096, 1 << 20, 1 << 30)] == \
        ["8", "1K", "4K", "1M", "1G"]


def test_series_are_labelled_by_the_display_name_of_their_entry() -> None:
    """The registry's data names a native series; MPI by the implementation its record names
    (the most specific: MVAPICH's text also says MPICH); a plugin backend by the display name
    its records carry, else by its registry name and library (never as its library alone)."""
    from ccbench.backend_facts import BACKENDS

    assert series_label(make_record(backend="nccl-cupy", library="nccl", version="2.21.5")) \
        == BACKENDS["nccl-cupy"].display_name == "NCCL (CuPy)"
    mvapich = make_record(backend="mpi", library="MVAPICH", version="MVAPICH2 2.3.7 (MPICH 3.2)")
    assert series_label(mvapich) == "MVAPICH" and colour_key(mvapich) == "MVAPICH"
    ring = make_record(backend="ring@mpi", library="MPICH", version="MPICH Version: 5.0.2")
    assert series_label(ring) == "ring@mpi (MPICH)" and colour_key(ring) == "ring"
    plugin = make_record(backend="copyonly", library="copylib", version="1.2")
    assert series_label(plugin) == "copyonly (copylib)"
    plugin.environment["backend_display_name"] = "Copy-only (a plugin)"
    assert series_label(plugin) == "Copy-only (a plugin)" == colour_key(plugin)
    assert short_version(make_record(backend="gloo", library="gloo", version="torch 2.13.0")) \
        == "Gloo (torch.distributed) 2.13.0"


def test_size_axis_ticks() -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    set_size_axis(ax, 1024, 1 << 30)
    labels = [size_label(t) for t in ax.xaxis.get_major_locator()()]
    assert labels[:3] == ["1K", "4K", "16K"] and labels[-1] == "1G" and len(labels) <= 11
    plt.close(fig)


def test_model_overlay(tmp_path: Path) -> None:
    records = synthetic(collectives=("allreduce",), worlds=(4,), backends=("mpi",))
    fit = {"backend": "mpi", "library": "Intel MPI", "transport": "mpi", "device": "cpu",
           "collective": "allreduce", "algorithm": "native", "scope": "all-world-sizes",
           "world_sizes": [2, 4], "model_algorithm": "ring", "alpha": 3e-6, "beta": 1.6e-10,
           "gamma": 0.0, "pieces": None}
    model = {"schema": "ccbench.model", "version": 1, "formula": "alpha-beta-gamma",
             "fits": [fit]}
    report = build_report(records, tmp_path / "m", model=model, formats=("png",))
    assert any(p.stem == "model-allreduce" for p in report.figures)
    assert "Model against measurement" in report.markdown.read_text()
    # calibrate names the library's own algorithm for a "native" record where it is known
    known = dict(fit, algorithm="ring", algorithm_source="the library's documented ring")
    report = build_report(records, tmp_path / "k", model=dict(model, fits=[known]),
                          formats=("png",))
    assert any(p.stem == "model-allreduce" for p in report.figures)
    guessed = dict(fit, algorithm="ring")          # an algorithm the records did not run
    report = build_report(records[:8], tmp_path / "g", model=dict(model, fits=[guessed]),
                          formats=("png",))
    assert report.notes and "no fit" in report.notes[0]
    # a model with nothing matching is a note, not a failure
    other = dict(model, fits=[dict(fit, backend="nccl")])
    report = build_report(records[:8], tmp_path / "n", model=other, formats=("png",))
    assert report.notes and "no fit" in report.notes[0]


def test_cli(tmp_path: Path) -> None:
    data = write(tmp_path / "r.jsonl", synthetic(collectives=("allreduce",), worlds=(2,),
                                               backends=("mpi",))[:6])
    proc = run_ccbench("report", str(data), "-o", str(tmp_path / "out"), "--formats", "png",
                       timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "report.md").exists()
    proc = run_ccbench("report", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "x"))
    assert proc.returncode == 2 and proc.stderr.startswith("ccbench: error: no such results")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "other"}))
    proc = run_ccbench("report", str(data), "-o", str(tmp_path / "y"), "--model", str(bad))
    assert proc.returncode == 2 and "model" in proc.stderr
    proc = run_ccbench("report", str(data), "-o", str(tmp_path / "z"), "--collective", "alltoall")
    assert proc.returncode == 2 and "no records" in proc.stderr
    # -o naming a file: one line, and no folder of that name
    proc = run_ccbench("report", str(data), "-o", str(tmp_path / "r.html"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "names a file" in proc.stderr and not (tmp_path / "r.html").exists()
    proc = run_ccbench("report", str(data), "-o", str(tmp_path / "f"), "--formats", "png,gif")
    assert proc.returncode == 2 and "png,svg,pdf" in proc.stderr and proc.stderr.count("\n") == 1
    proc = run_ccbench("report", str(data), "-o", str(tmp_path / "s"), "--paper", "a4")
    assert proc.returncode == 2 and "single" in proc.stderr


def test_no_records(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        build_report([], tmp_path)


def test_several_runs_of_a_case_are_pooled_shown_each_or_latest() -> None:
    from ccbench.report.data import runs_note

    first = make_record(size=1024, median_us=10.0, seed=1, iters=30)
    second = make_record(size=1024, median_us=20.0, seed=2, iters=30)
    second.run_id, second.timestamp = "r1", "2026-12-02T13:00:00+00:00"
    records = [first, second]
    pooled = to_frame(records, "pooled")
    assert len(pooled) == 1 and int(pooled["iterations"].iloc[0]) == 60
    assert 10.0 < float(pooled["median_us"].iloc[0]) < 20.0
    each = to_frame(records, "each")
    assert sorted(each["series"]) == ["Intel MPI [run r0]", "Intel MPI [run r1]"]
    latest = to_frame(records, "latest")
    assert len(latest) == 1 and float(latest["median_us"].iloc[0]) == pytest.approx(20.0)
    assert runs_note(records, "pooled").startswith("1 (case, size) point(s) were measured in "
                                                   "several runs (up to 2); shown: their runs'")
    assert runs_note([first], "pooled") is None
    with pytest.raises(UsageError, match="unknown run view 'all'"):
        to_frame(records, "all")


def test_bands_only_where_they_do_not_hide_the_lines() -> None:
    """p5-p95 bands in a panel of at most two lines (one library in and out of place); none
    where more lines share it (they would cover each other)."""
    from matplotlib.collections import PolyCollection

    from ccbench.report.figures import collective_figure

    frame = to_frame(synthetic(collectives=("allreduce",), worlds=(2,), backends=("mpi",))
                     + synthetic(collectives=("allreduce",), worlds=(4,),
                                 backends=("gloo", "mpi")))
    from ccbench.report.paper import PAPERS

    fig = collective_figure(frame, "allreduce", PAPERS["double"])[0]
    bands = [sum(isinstance(c, PolyCollection) for c in ax.collections) for ax in fig.axes]
    assert bands == [2, 0, 2, 0]        # busbw at 2 and 4 ranks, then latency at 2 and 4


def test_library_colours_differ_in_hue() -> None:
    """The libraries shown together, and the algorithms beside their library, are told apart
    by hue: no two closer than 30 degrees unless one is near black."""
    import colorsys

    from matplotlib.colors import to_rgb

    def hue(name: str) -> tuple[float, float]:
        h, lightness, _ = colorsys.rgb_to_hls(*to_rgb(colour(name)))
        return h * 360, lightness

    for group in (["Gloo (torch.distributed)", "Intel MPI", "MPICH", "Open MPI", "oneCCL"],
                  ["Intel MPI", "ring@mpi", "tree@mpi", "hypercube@mpi"]):
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                (ha, la), (hb, lb) = hue(a), hue(b)
                gap = min(abs(ha - hb), 360 - abs(ha - hb))
                assert gap >= 30 or min(la, lb) < 0.15, (a, b, gap)


def test_html_shows_figures_in_proportion_to_their_print_width() -> None:
    """A single-column figure (3.3 in) is shown at 330 px, a double column's at 700 px: the
    page keeps the proportions they will be printed at."""
    from ccbench.report import _Doc
    from ccbench.report.paper import PAPERS

    widths = {}
    for paper in ("single", "double"):
        doc = _Doc()
        doc.print_width_in = PAPERS[paper].width
        doc.figure("allreduce", "a caption")
        doc.pages = {"allreduce": ["allreduce.png"]}
        widths[paper] = doc.html("t")
    assert "figure img{width:330px;" in widths["single"]
    assert "figure img{width:700px;" in widths["double"]


def test_times_in_tables_are_written_as_the_figures_write_them() -> None:
    from ccbench.units import duration_text

    assert [duration_text(x) for x in (12.34, 4567.0, 2.5e6, math.nan)] == \
        ["12.3 µs", "4.57 ms", "2.5 s", "-"]


def test_rank_spread_columns_are_the_sizes_asked_for() -> None:
    """allgather at 3 ranks uses 1020 B where allreduce uses 1024 B: both are the 1 KiB
    column, not two half-empty columns."""
    import pandas as pd

    from ccbench.report.figures import _spread_matrix

    rows = [("allreduce", 1024, 1024, [1.0, 2.0, 1.0]), ("allgather", 1020, 1024, [1.0, 1.0, 3.0]),
            ("allreduce", 4096, 4096, [1.0, 1.0, 1.0]), ("allgather", 4092, 4096, [2.0, 1.0, 1.0])]
    frame = pd.DataFrame([{"series": "gloo", "collective": c, "size": used, "size_asked": asked,
                           "rank_median_us": ranks, "inplace": False}
                          for c, used, asked, ranks in rows])
    colls, ratio, sizes = _spread_matrix(frame, "gloo", ["allreduce", "allgather"], 3)
    assert sizes == [1024, 4096] and colls == ["allreduce", "allgather"]
    assert ratio.shape == (7, 2)      # 3 rows, a blank row, 3 rows; one column per size
    assert list(ratio[2]) == [1.0, 1.0] and list(ratio[6]) == [3.0, 1.0]


def test_a_series_measured_with_different_method_options_is_named(tmp_path: Path) -> None:
    """Records of one series measured with another --warmup (any Method option, as records
    carry it) make one note naming the series and the differing options; series measured
    alike get none."""
    from ccbench.report.data import method_notes

    records = synthetic(collectives=("allreduce",), worlds=(2,))
    for i, rec in enumerate(records):
        rec.method = {**rec.method, "warmup": 5 if rec.backend != "mpi" or i % 2 else 1,
                      "combine": "max"}
    mpi = {series_label(r) for r in records if r.backend == "mpi"}
    assert len(mpi) == 1 and len({series_label(r) for r in records}) > 1
    notes = method_notes(records)
    assert notes == [f"{next(iter(mpi))} was measured with different method options: "
                     "warmup (1, 5); its points are not alike"]
    report = build_report(records, tmp_path / "out", sources=["synthetic"], formats=("png",))
    assert f"**Note:** {notes[0]}." in report.markdown.read_text()
    assert notes[0] in report.notes
    for rec in records:
        rec.method["warmup"] = 5
    assert method_notes(records) == []


def test_an_option_that_changes_the_measurement_makes_a_series_of_its_own(tmp_path: Path) -> None:
    """Runs of one case measured with --combine mean and with the default are two series,
    never pooled into one distribution; runs that differ only in a precision option (--warmup)
    stay one series (with method_notes' note)."""
    from ccbench.report.data import combine_runs, to_frame

    base = synthetic(collectives=("allreduce",), worlds=(2,), backends=("gloo",))
    other = copy.deepcopy(base)
    for rec in other:
        rec.run_id, rec.method = "run-b", {**rec.method, "combine": "mean over ranks"}
    labels = {series_label(r) for r in base + other}
    assert len(labels) == 2 and any(label.endswith("[combine=mean over ranks]")
                                    for label in labels)
    assert len(combine_runs(base + other, "pooled")) == len(base) + len(other)
    frame = to_frame(base + other)
    assert set(frame["series"]) == labels
    for rec in other:
        rec.method = {**rec.method, "combine": base[0].method.get("combine", "max over ranks"),
                      "warmup": 0}
    assert len({series_label(r) for r in base + other}) == 1
    assert len(combine_runs(base + other, "pooled")) == len(base)


def test_the_time_definition_names_the_combinations_used(tmp_path: Path) -> None:
    """The report's method bullets say a point's time is the slowest rank's only when every
    record combined ranks so; with --combine mean records beside them, both are named."""
    base = synthetic(collectives=("allreduce",), worlds=(2,), backends=("gloo",))
    report = build_report(base, tmp_path / "a", sources=["s"], formats=("png",))
    assert "median over iterations of the slowest rank's time" in report.markdown.read_text()
    other = copy.deepcopy(base)
    for rec in other:
        rec.run_id, rec.method = "run-b", {**rec.method, "combine": "mean over ranks"}
    text = build_report(base + other, tmp_path / "b", sources=["s"],
                        formats=("png",)).markdown.read_text()
    assert "slowest rank's time" not in text
    assert "max over ranks, mean over ranks" in text
