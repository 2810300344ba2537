"""Every figure kind of `ccbench report`, at single and double column, held to the paper
contract (ccbench.report.paper.check_figure: no text under 7 pt, no overlapping tick labels
or texts, panels at least 1.2 in wide, aspect within 1:3 and 3:1, data spanning its panels),
measured with matplotlib's renderer: from a first run (one world size, `ccbench launch -n 2
all --backend gloo,mpi --sizes 1K-64K`, tests/fixtures/first-run-n2.jsonl.gz) and from the
shipped multi-world results (results/data)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("matplotlib")

from ccbench.records import load_records  # noqa: E402
from ccbench.report import FigureJob, _draw  # noqa: E402
from ccbench.report.data import to_frame  # noqa: E402
from ccbench.report.paper import PAPERS, check_figure  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIRST_RUN = ROOT / "tests" / "fixtures" / "first-run-n2.jsonl.gz"
#: the shipped results at 2, 3 and 4 ranks: five libraries, ccbench's algorithms
SHIPPED = [ROOT / "results" / "data" / f"{name}.jsonl.gz"
           for name in ("gloo-n2", "impi-n2", "impi-n4", "oneccl-n4", "mpich-n2",
                        "openmpi-n4", "validation-n3", "algorithms-n4")]
PAPER_NAMES = ("single", "double")


@pytest.fixture(scope="module")
def first_run():
    return to_frame(load_records(FIRST_RUN))


@pytest.fixture(scope="module")
def shipped():
    return to_frame(load_records(*SHIPPED))


def _native(frame):
    return frame[~frame["backend"].str.contains("@", regex=False)]


def _jobs(frame) -> list[FigureJob]:
    native = _native(frame)
    colls = list(native["collective"].unique())
    worlds = sorted(int(p) for p in frame["world_size"].unique())
    allreduce = native[native["collective"] == "allreduce"]
    algos = frame[frame["collective"] == "allreduce"]
    return [FigureJob("overview-busbw", "overview", native, ("busbw",)),
            FigureJob("overview-latency", "overview", native, ("latency",)),
            FigureJob("allreduce", "collective", allreduce, ("allreduce",)),
            FigureJob("last", "collective", native[native["collective"] == colls[-1]],
                      (colls[-1],)),
            FigureJob("algorithms", "collective", algos, ("allreduce",)),
            FigureJob("spread", "spread", frame[frame["world_size"] == worlds[-1]],
                      (worlds[-1],))]


def _check(job: FigureJob, paper: str) -> list[str]:
    problems = []
    for page, fig in enumerate(_draw(job, paper), start=1):
        problems += [f"{job.name} page {page} at {paper}: {p}"
                     for p in check_figure(fig, PAPERS[paper])]
    return problems


@pytest.mark.parametrize("paper", PAPER_NAMES)
def test_first_run_figures_fit_the_paper(first_run, paper) -> None:
    """One run, one world size, nine collectives, two libraries: the overview wraps its nine
    panels into a grid (the first-run figure was a 7:1 strip with 3 pt labels)."""
    problems = [p for job in _jobs(first_run) for p in _check(job, paper)]
    assert not problems, "\n".join(problems)
    pages = _draw(_jobs(first_run)[0], paper)
    width, height = pages[0].get_size_inches()
    assert width == PAPERS[paper].width and height / width > 0.5      # a grid, not a strip
    # nor a column: at 7 in the nine panels of one world size sit side by side on one page
    # (they were stacked in one column 18.5 in tall)
    columns = {round(ax.get_position().x0, 3) for ax in pages[0].axes if ax.has_data()}
    assert len(columns) >= (3 if paper == "double" else 2), sorted(columns)
    assert paper != "double" or len(pages) == 1


@pytest.mark.parametrize("paper", PAPER_NAMES)
def test_shipped_figures_fit_the_paper(shipped, paper) -> None:
    """2, 3 and 4 ranks, five libraries and ccbench's algorithms: the kinds whose layout
    depends on how many world sizes and series there are (the others are the first run's)."""
    jobs = {job.name: job for job in _jobs(shipped)}
    three = shipped[shipped["world_size"] == 3]
    problems = [p for name in ("overview-busbw", "algorithms")
                for p in _check(jobs[name], paper)]
    problems += _check(FigureJob("spread", "spread", three, (3,)), paper)
    assert not problems, "\n".join(problems)


def test_the_model_figure_fits_the_paper(shipped) -> None:
    from ccbench.report.model import load, predictions

    model = load(str(ROOT / "results" / "model.json"))
    sub = _native(shipped)
    sub = sub[sub["collective"] == "allreduce"]
    preds, _ = predictions(sub, model)
    mine = {(s, p): v for (c, s, p), v in preds.items() if c == "allreduce"}
    assert mine
    for paper in PAPER_NAMES:
        problems = _check(FigureJob("model", "model", sub, ("allreduce", mine)), paper)
        assert not problems, "\n".join(problems)


def test_busbw_is_log_where_the_series_differ_tenfold(first_run) -> None:
    """gloo peaks near 0.1 GB/s at 64 KiB, Intel MPI near 10: a linear axis lays gloo flat."""
    from ccbench.report.figures import busbw_is_log

    assert busbw_is_log(_native(first_run))
    fig = _draw(_jobs(first_run)[0], "double")[0]
    assert fig.axes[0].get_yscale() == "log"
    one = first_run[first_run["backend"] == "mpi"]
    assert not busbw_is_log(one)
    fig = _draw(FigureJob("o", "overview", one, ("busbw",)), "double")[0]
    assert fig.axes[0].get_yscale() == "linear" and fig.axes[0].get_ylim()[0] == 0


def test_busbw_is_log_where_series_meet_only_at_their_peaks() -> None:
    """Two series whose peaks are within 3x but that lie 50x apart at most sizes (gloo
    beside MPI on a reduce): on a linear axis the slow one lies on the baseline."""
    import pandas as pd

    from ccbench.report.figures import busbw_is_log

    sizes = [1 << k for k in range(10, 19)]
    fast = [0.05 * 2 ** k for k in range(9)]
    slow = [v / 50 for v in fast[:-1]] + [fast[-1] / 3]
    rows = [{"collective": "reduce", "world_size": 3, "size": s, "series": name, "busbw": v}
            for name, values in (("fast", fast), ("slow", slow))
            for s, v in zip(sizes, values, strict=True)]
    assert busbw_is_log(pd.DataFrame(rows))
    close = [{**row, "busbw": row["busbw"] * (25 if row["series"] == "slow" else 1)}
             for row in rows]
    assert not busbw_is_log(pd.DataFrame(close))


def test_axes_say_their_units_and_sizes_have_binary_suffixes(first_run) -> None:
    fig = _draw(_jobs(first_run)[2], "double")[0]
    labels = {ax.get_ylabel() for ax in fig.axes} | {ax.get_xlabel() for ax in fig.axes}
    assert {"busbw (GB/s)", "time per op", "message size"} <= labels
    fig.canvas.draw()
    ticks = [t.get_text() for ax in fig.axes for t in ax.get_xticklabels() if t.get_text()]
    assert ticks and all(t.endswith(("KiB", "B")) for t in ticks), ticks
    times = [t.get_text() for t in fig.axes[-1].get_yticklabels() if t.get_text()]
    assert times and all(t.endswith(("µs", "ms", " s")) for t in times), times


def test_captions_name_what_is_drawn(first_run, shipped) -> None:
    from ccbench.report.captions import collective_caption, overview_caption

    text = overview_caption(_native(first_run), "busbw")
    assert "9 collectives" in text and "at 2 ranks" in text
    assert "Gloo (torch.distributed) 2.13.0 and Intel MPI 2021.18.1" in text
    assert "log axis" in text
    native = _native(shipped)
    text = overview_caption(native, "busbw")
    assert "at 2, 3 and 4 ranks" in text
    for version in ("Open MPI", "MPICH", "oneCCL", "Intel MPI", "Gloo"):
        assert version in text
    sub = native[native["collective"] == "broadcast"]
    assert "broadcast: " in collective_caption(sub, "broadcast")



# -- series measured with options other than the defaults ----------------------------------

GLOO = "Gloo (torch.distributed) 2.13.0"
MEAN = f"{GLOO} [combine=mean over ranks]"
MIN = f"{GLOO} [combine=min over ranks]"


def _variant_records() -> list:
    """allreduce at 2 and 4 ranks: gloo and Intel MPI as the defaults measure, and gloo again
    with --combine mean and with --combine min (runs of their own, a little faster)."""
    from dataclasses import replace

    from test_report import synthetic

    base = synthetic(collectives=("allreduce",), worlds=(2, 4), backends=("gloo", "mpi"))
    out = list(base)
    for combine, factor in (("mean over ranks", 0.8), ("min over ranks", 0.6)):
        out += [replace(r, run_id=f"r-{combine}", time_us={k: v * factor
                                                           for k, v in r.time_us.items()},
                        method={**r.method, "combine": combine})
                for r in base if r.backend == "gloo"]
    return out


def _line_look(line) -> tuple:
    return (line.get_color(), line.get_linestyle(), line.get_marker(),
            line.get_markerfacecolor())


@pytest.mark.parametrize("paper", PAPER_NAMES)
def test_series_measured_otherwise_are_told_apart_in_figures(paper) -> None:
    """A series measured with --combine mean beside the default one: its legend entry and
    the captions name its options (they read `Gloo (torch.distributed) 2.13.0 and Gloo
    (torch.distributed) 2.13.0`), its lines differ from the default's (they had the same
    colour, marker and line), the default series look as before, and every figure still fits
    its paper (the per-rank panel titles, longer by the options, included)."""
    from ccbench.report.captions import collective_caption, overview_caption, spread_caption
    from ccbench.report.figures import _legend_entries
    from ccbench.report.style import LINESTYLE, colour, marker

    frame = to_frame(_variant_records())
    labels = [label for _, label, _ in _legend_entries(frame)]
    assert labels == [GLOO, MEAN, MIN, "Intel MPI 2021.18.1"], labels
    for caption in (overview_caption(frame, "busbw"), collective_caption(frame, "allreduce"),
                    spread_caption(frame, 4)):
        assert f"{GLOO} and {MEAN}" in caption or f"{GLOO}, {MEAN}" in caption, caption
        assert MIN in caption
    assert "Dotted lines" in overview_caption(frame, "latency")
    defaults = frame[~frame["series"].str.contains("[", regex=False)]
    assert "Dotted lines" not in overview_caption(defaults, "latency")
    jobs = [FigureJob("overview", "overview", frame, ("latency",)),
            FigureJob("allreduce", "collective", frame, ("allreduce",)),
            FigureJob("spread", "spread", frame[frame["world_size"] == 4], (4,))]
    problems = [p for job in jobs for p in _check(job, paper)]
    assert not problems, "\n".join(problems)
    for job in jobs[:2]:
        fig = _draw(job, paper)[0]
        handles = {t.get_text(): h for t, h in zip(fig.legends[0].get_texts(),
                                                   fig.legends[0].legend_handles, strict=True)}
        assert {GLOO, MEAN, MIN} <= set(handles), sorted(handles)
        looks = {label: _line_look(handles[label]) for label in (GLOO, MEAN, MIN)}
        assert len(set(looks.values())) == 3, looks
        # the default series as before; the others in their library's colour
        gloo = colour("Gloo (torch.distributed)")
        assert looks[GLOO][:3] == (gloo, LINESTYLE[False], marker("Gloo (torch.distributed)"))
        assert looks[MEAN][0] == looks[MIN][0] == gloo
        for ax in fig.axes:
            lines = [_line_look(ln) for ln in ax.get_lines() if len(ln.get_xdata())]
            assert len(lines) == len(set(lines)), f"{job.name}: two lines look alike"
    spread = _draw(jobs[2], paper)[0]
    titles = [ax.get_title().replace("\n", " ") for ax in spread.axes if ax.get_title()]
    assert "Gloo (torch.distributed) [combine=mean over ranks]" in titles, titles


def test_runs_shown_each_are_told_apart_in_legends() -> None:
    """--runs each: a series' runs of one case are series of their own, in the legend too."""
    from dataclasses import replace

    from test_report import synthetic

    from ccbench.report.figures import _legend_entries

    first = synthetic(collectives=("allreduce",), worlds=(2,), backends=("gloo",))
    again = [replace(r, run_id="r9", timestamp=r.timestamp.replace("12:00", "13:00"))
             for r in first]
    labels = [label for _, label, _ in _legend_entries(to_frame(first + again, runs="each"))]
    assert len(labels) == 2 == len(set(labels)) and all(GLOO in t for t in labels), labels

# -- the diagnose heat map -----------------------------------------------------------------

NAMES = [f"h{i}" for i in range(8)]


def _diagnose_records(findings: list[dict] | None, leaves: bool = False) -> list:
    """One run's records: every pair at 48 Mbit/s but h5's at 15 (its plane port down), with
    the verdict the run recorded (or none)."""
    out = [SimpleNamespace(run_id="r1", timestamp="2026-12-05T06:00:00+00:00",
                           backend="gloo", hosts=NAMES, collective="allreduce",
                           size_used=1 << 20, time_us={"median": 1000.0},
                           method={"diagnose": {"step": "world", "label": "world", "round": 0,
                                                "pair": None}})]
    size = 1 << 20
    for a in range(8):
        for b in range(a + 1, 8):
            rate = 15e6 if 5 in (a, b) else 48e6
            base = {"step": "pairs", "label": "pairs 0", "round": 0,
                    "pair": [NAMES[a], NAMES[b]],
                    "expected": {"link_bps": 50e6, "latency_us": None, "source": "--link-rate"}}
            if leaves:
                base["leaf_hosts"] = [NAMES[:4], NAMES[4:]]
            for direction in ("a->b", "b->a"):
                out.append(SimpleNamespace(
                    run_id="r1", timestamp="2026-12-05T06:00:01+00:00", backend="gloo",
                    hosts=base["pair"], collective="broadcast", size_used=size,
                    time_us={"median": size * 8 / rate * 1e6},
                    method={"diagnose": {**base, "direction": direction}}))
            out.append(SimpleNamespace(
                run_id="r1", timestamp="2026-12-05T06:00:01+00:00", backend="gloo",
                hosts=base["pair"], collective="sendrecv", size_used=8,
                time_us={"median": 150.0}, method={"diagnose": {**base, "direction": None}}))
    if findings is not None:
        out[-1].method["diagnose"]["findings"] = findings
    return out


FINDINGS = [
    {"component": "host h5's plane eth1 port", "kind": "port down", "measured": "no traffic",
     "expected": "up", "evidence": "carrier changes 1", "confidence": "high",
     "hosts": ["h5"], "pairs": []},
    {"component": "pair h1-h4 path on plane eth1", "kind": "slow path",
     "measured": "16 Mbit/s", "expected": "50 Mbit/s", "evidence": "", "confidence": "high",
     "hosts": [], "pairs": [["h1", "h4"]]},
    {"component": "host h3's link", "kind": "intermittent", "measured": "60 % in 2 of 5 tries",
     "expected": "48 Mbit/s", "evidence": "carrier changes 17", "confidence": "medium",
     "hosts": ["h3"], "pairs": []},
    {"component": "uplink of leaf 0", "kind": "slow uplink", "measured": "12 Mbit/s",
     "expected": "48 Mbit/s", "evidence": "", "confidence": "high",
     "hosts": NAMES[:4], "pairs": []},
    {"component": "plane eth1", "kind": "slow plane", "measured": "20 Mbit/s",
     "expected": "48 Mbit/s", "evidence": "", "confidence": "low", "hosts": [], "pairs": []},
    {"component": "host h2 compute", "kind": "slow compute", "measured": "3.1 s",
     "expected": "1.0 s", "evidence": "", "confidence": "high", "hosts": ["h2"], "pairs": []},
]


@pytest.mark.parametrize("paper", PAPER_NAMES)
def test_diagnose_map_draws_the_recorded_verdict(paper, tmp_path) -> None:
    """Six findings of six kinds, port down among them: a one-line title, every finding
    numbered and listed under the maps and drawn on them; the run's own verdict is drawn,
    not one recomputed from the records (which would find h5's link slow instead)."""
    from ccbench.report.diagnose import _figure, diagnose_figures, measures_of, recorded_findings

    records = _diagnose_records(FINDINGS, leaves=True)
    findings = recorded_findings(records)
    assert [f.kind for f in findings] == [f["kind"] for f in FINDINGS]
    names, measures, _ = measures_of(records)
    fig = _figure(names, measures, findings, "diagnose r1: 8 hosts, gloo", paper)
    assert not check_figure(fig, PAPERS[paper], min_data=0.9)
    assert "\n" not in fig._suptitle.get_text()
    listing = [t.get_text() for t in fig.texts if "port down" in t.get_text()]
    assert listing and all(f"{k}. {f['component']}: {f['kind']}" in listing[0]
                           for k, f in enumerate(FINDINGS, start=1))
    rate = fig.axes[0]
    drawn = {k for t in rate.texts if t.get_color() == "red" for k in t.get_text().split(",")}
    assert drawn == {str(k) for k in range(1, len(FINDINGS) + 1)}
    red = [t.get_text() for t in rate.get_yticklabels() if t.get_color() == "red"]
    assert set(red) == {"h0", "h1", "h2", "h3", "h5"}
    written = diagnose_figures(records, tmp_path, paper=paper)
    assert [p.name for p in written] == ["diagnose-r1.png"]


def test_diagnose_map_without_a_recorded_verdict_says_it_recomputed() -> None:
    from ccbench.report.diagnose import _figure, analyse, measures_of, recorded_findings

    records = _diagnose_records(None)
    assert recorded_findings(records) is None
    names, measures, expect = measures_of(records)
    found = analyse(measures, expect, names)
    assert found
    fig = _figure(names, measures, found, "t", "single", recomputed=True)
    assert any("recomputed" in t.get_text() for t in fig.texts)
    assert not check_figure(fig, PAPERS["single"], min_data=0.9)


# -- the replay figures --------------------------------------------------------------------

def _replayed() -> list:
    """A replayed trace on two backends: 4 ranks, two tensor-parallel pairs and the world."""
    out = []
    calls = [("allreduce", (0, 1), 16 << 10), ("allreduce", (2, 3), 16 << 10),
             ("allgather", (0, 1, 2, 3), 1 << 20), ("broadcast", (0, 1, 2, 3), 256),
             ("allreduce", (0, 1, 2, 3), 64 << 20), ("reduce-scatter", (0, 1, 2, 3), 4 << 20)]
    for backend, library, scale in (("gloo", "gloo", 3.0), ("mpi", "Intel MPI", 1.0)):
        for call, (collective, group, size) in enumerate(calls):
            out.append(SimpleNamespace(
                run_id=f"run-{backend}", timestamp="2026-12-05T06:00:00+00:00",
                backend=backend, library=library, library_version="1.0", collective=collective,
                size_asked=size, size_used=size, world_size=len(group),
                time_us={"median": scale * (20.0 + size / 2e3)},
                method={"trace": {"file": "traces/job/rank0.json", "call": call,
                                  "node_id": 10 + call, "group": list(group),
                                  "trace_world_size": 4}}))
    return out


@pytest.mark.parametrize("paper", PAPER_NAMES)
def test_replay_figures_fit_the_paper(paper) -> None:
    from ccbench.report.traces import _breakdown_figure, _timeline_figure, latest_runs

    backends = latest_runs(_replayed())["job"]
    for draw in (_timeline_figure, _breakdown_figure):
        fig = draw("job", backends, PAPERS[paper])
        problems = check_figure(fig, PAPERS[paper], min_data=0.2)
        assert not problems, "\n".join(problems)


@pytest.mark.parametrize("paper", PAPER_NAMES)
def test_prediction_figure_fits_the_paper(paper) -> None:
    """`simulate -o` records beside the first run's: predictions at 16 and 1024 ranks."""
    import dataclasses

    from ccbench.report.predictions import prediction_figure

    measured = [r for r in load_records(FIRST_RUN) if r.collective == "allreduce"
                and r.backend == "mpi" and not r.inplace]
    predicted = [dataclasses.replace(r, world_size=p, busbw_gbps=r.busbw_gbps * f,
                                     method={"predicted": True, "fidelity": fid})
                 for r in measured for p, f, fid in ((16, 0.8, "analytical"),
                                                     (1024, 0.5, "replay"))]
    fig = prediction_figure("allreduce", predicted, measured, paper)
    problems = check_figure(fig, PAPERS[paper])
    assert not problems, "\n".join(problems)


def test_the_in_place_note_names_the_collectives_of_the_registry(first_run) -> None:
    """Per-rank captions say which collectives are shown in place from the registry's
    one-buffer collectives present, not a written-in "broadcast"."""
    from ccbench.collectives import IN_PLACE_ONLY
    from ccbench.report.captions import spread_caption
    from ccbench.report.figures import modes_note

    p = int(first_run["world_size"].iloc[0])
    no_one_buffer = first_run[~first_run["collective"].isin(IN_PLACE_ONLY)]
    assert modes_note(no_one_buffer) == "out-of-place"
    assert "(out-of-place)" in spread_caption(no_one_buffer, p)
    assert "in-place" not in spread_caption(no_one_buffer, p).split(".")[0]
    with_them = first_run[first_run["collective"].isin(IN_PLACE_ONLY)]
    assert sorted(IN_PLACE_ONLY) == sorted(set(with_them["collective"]))
    assert modes_note(first_run) == f"out-of-place; {', '.join(sorted(IN_PLACE_ONLY))} in-place"


def test_report_replay_and_formats_ask_the_registry_not_a_name() -> None:
    """No comparison of a collective with a written-in name in report/ and replay/, and no
    hand list of names in the Chakra reader: a property of the Collective (rooted, in place
    only, its trace rules) answers, so a new collective needs no edit there. sendrecv is
    exempt: it is the one point-to-point measure diagnose and replay time messages with."""
    import ast

    from ccbench.collectives import COLLECTIVES

    names = set(COLLECTIVES) - {"sendrecv"}
    offenders = []
    files = [*sorted((ROOT / "ccbench" / "report").glob("*.py")),
             *sorted((ROOT / "ccbench" / "replay").glob("*.py")),
             ROOT / "ccbench" / "formats" / "chakra_et.py"]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            if not any("collective" in ast.unparse(side) or "coll" == ast.unparse(side)
                       for side in (node.left, *node.comparators)):
                continue
            literals = {c.value for c in ast.walk(node)
                        if isinstance(c, ast.Constant) and isinstance(c.value, str)} & names
            if literals and (path.parent.name != "formats" or len(literals) > 1):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not offenders, "\n".join(offenders)


def test_a_narrow_time_axis_reads_with_more_than_one_label() -> None:
    """Times within a decade (gloo at 1K-1M on one host: 0.3-2.5 ms) get 2x and 5x labels
    beside the powers of ten; a wide range keeps powers of ten only."""
    import matplotlib.pyplot as plt

    from ccbench.report.figures import _time_axis

    def labels(lo: float, hi: float) -> list[str]:
        fig, ax = plt.subplots()
        ax.plot([1, 2], [lo, hi])
        _time_axis(ax)
        ax.set_ylim(lo, hi)
        fig.canvas.draw()
        shown = [t.get_text() for t in ax.get_yticklabels() if lo <= t.get_position()[1] <= hi]
        plt.close(fig)
        return shown

    assert labels(300, 2500) == ["500 \u00b5s", "1 ms", "2 ms"]
    assert labels(1, 1e6) == ["1 \u00b5s", "100 \u00b5s", "10 ms", "1 s"]
