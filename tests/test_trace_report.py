"""`ccbench report` on `ccbench replay` records: a trace's timeline and breakdown figures,
from a real replay (gloo, 4 ranks) of a trace recorded by a real PyTorch run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ccbench.records import load_records
from ccbench.report.traces import breakdown, latest_runs, split_traces, timeline
from tests.conftest import run_ccbench


@pytest.fixture(scope="module")
def replayed(traces4: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("replayed") / "groups.jsonl"
    done = run_ccbench("launch", "-n", "4", "replay", str(traces4 / "groups"), "--backend",
                       "gloo", "--iters", "1", "--repeat", "1", "-O", str(out), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_timeline_starts_each_call_when_its_group_is_free(replayed: Path) -> None:
    records = load_records(replayed)
    others, traced = split_traces(records)
    assert not others and len(traced) == 13
    runs = latest_runs(traced)
    assert list(runs) == ["groups"] and list(runs["groups"]) == ["gloo"]
    spans = timeline(runs["groups"]["gloo"])
    free = dict.fromkeys(range(4), 0.0)
    for span, rec in zip(spans, runs["groups"]["gloo"], strict=True):
        group = rec.method["trace"]["group"]
        assert span["start"] == pytest.approx(max(free[r] for r in group))
        assert span["end"] - span["start"] == pytest.approx(rec.time_us["median"])
        for r in group:
            free[r] = span["end"]
    # the two tensor-parallel pairs run side by side: some call starts before another ends
    assert any(a["start"] < b["end"] and b["start"] < a["end"] and
               not set(a["group"]) & set(b["group"]) for a in spans for b in spans)


def test_breakdown_sums_every_call_once_per_backend(replayed: Path) -> None:
    records = load_records(replayed)
    # the same calls on a second backend, twice as fast (an edge case built from real records)
    faster = [dataclasses.replace(r, backend="mpi", run_id="r2",
                                  time_us={**r.time_us, "median": r.time_us["median"] / 2})
              for r in records]
    keys, per = breakdown(latest_runs(records + faster)["groups"])
    assert set(per) == {"gloo", "mpi"}
    total = sum(r.time_us["median"] for r in records)
    assert sum(per["gloo"].values()) == pytest.approx(total)
    assert sum(per["mpi"].values()) == pytest.approx(total / 2)
    assert {k[0] for k in keys} == {"allreduce", "allgather", "broadcast"}
    assert ("allreduce", 16384, "16K") in keys and ("allreduce", 16384, "16K-32K") in keys


def test_report_draws_the_trace_figures(replayed: Path, tmp_path: Path) -> None:
    done = run_ccbench("report", str(replayed), "-o", str(tmp_path / "rep"), "--formats", "png")
    assert done.returncode == 0, done.stderr
    for kind in ("timeline", "breakdown"):
        png = tmp_path / "rep" / f"trace-groups-{kind}.png"
        assert f"trace {png}" in done.stdout
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_speedup_compares_only_the_calls_every_backend_measured() -> None:
    from ccbench.trace.summary import speedups

    # b skipped call 1, the slow one: over all calls it would look 50x faster than a
    [entry] = speedups({"a": {0: 1.0, 1: 100.0, 2: 1.0}, "b": {0: 2.0, 2: 2.0}})
    assert (entry.fastest, entry.other, entry.times) == ("a", "b", 2.0)
    assert (entry.fastest_us, entry.other_us, entry.calls, entry.left_out) == (2.0, 4.0, 2, 1)
    assert "over the 2 calls every compared backend measured: 2.0 vs 4.0 us; 1 calls " \
           "measured by only some backends left out" in entry.line()
    assert entry.to_dict()["calls"] == 2
    assert speedups({"a": {0: 1.0}, "b": {1: 1.0}}) == []          # nothing in common
    assert speedups({"a": {0: 1.0}, "b": {}}) == []                # b measured nothing


def test_op_result_round_trips_through_its_json() -> None:
    """The ranks send OpResult.to_dict() through the store and rebuild it with OpResult(**):
    every field must be in it, under its own name."""
    from ccbench.trace.summary import OpResult, summarize_results

    done = OpResult(call=3, node_id=7, name="ar", collective="allreduce", size=1 << 20,
                    group=[0, 1], time_us=10.0, busbw_gbps=2.0, original_us=8.0, wrong=0,
                    group_source="named", reduce_op="sum", extra={"as_issued_us": 9.0})
    skipped = OpResult(call=4, node_id=8, name="x", collective="allgather", size=64,
                       group=[0, 1], reason="not in the registry")
    for res in (done, skipped):
        data = res.to_dict()
        assert list(data) == [f.name for f in dataclasses.fields(OpResult)]
        assert OpResult(**data) == res
    summary = summarize_results([done, skipped])
    assert (summary["ops"], summary["measured"], summary["skipped"]) == (2, 1, 1)
    assert summary["fidelity"] is not None and summary["fidelity"]["median_ratio"] == 1.25
    assert [(r["collective"], r["ops"], r["skipped"], r["busbw_gbps"])
            for r in summary["by_bucket"]] == [("allgather", 1, 1, None),
                                                ("allreduce", 1, 0, 2.0)]


def test_breakdown_figure_compares_common_calls_and_marks_skipped(replayed: Path) -> None:
    import matplotlib.pyplot as plt

    from ccbench.report.paper import PAPERS
    from ccbench.report.traces import _breakdown_figure

    records = load_records(replayed)
    # mpi: twice as fast, but skipped the largest call (it would look faster still)
    largest = max(records, key=lambda r: r.time_us["median"])
    faster = [dataclasses.replace(r, backend="mpi", run_id="r2",
                                  time_us={**r.time_us, "median": r.time_us["median"] / 2})
              for r in records if r is not largest]
    fig = _breakdown_figure("groups", latest_runs(records + faster)["groups"],
                            PAPERS["double"])
    try:
        ax = fig.axes[0]
        assert f"mpi 2.00x faster than gloo (sum of per-call medians over the " \
               f"{len(records) - 1} calls all measured, 1 left out)" in \
               ax.get_title().replace("\n", " ")
        marks = [t.get_text() for t in ax.texts]
        assert marks and all(m == "skipped" or " of " in m for m in marks)
    finally:
        plt.close(fig)
