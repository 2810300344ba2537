"""`ccbench launch --repeat N`: N separate launches, each a run of its own that says which
launch it was, and the spread between them (ccbench/bench/repeats.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import run_ccbench
from test_compare import make_record

from ccbench.bench.repeats import ENV, format_spread, repeat_env, repeat_from_env, spread_rows
from ccbench.commands.compare import compare_records
from ccbench.errors import UsageError
from ccbench.records import load_records


def test_env_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert repeat_from_env() == {}
    monkeypatch.setenv(ENV, repeat_env(2, 3, "abc123")[ENV])
    assert repeat_from_env() == {"repeat": 2, "repeats": 3, "repeat_group": "abc123"}
    for bad in ("2/3", "4/3/abc", "0/3/abc", "x/3/abc"):
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(UsageError, match="malformed"):
            repeat_from_env()


def _launch_records(group: str, medians: list[float], size: int = 1024) -> list:
    out = []
    for index, median in enumerate(medians, start=1):
        rec = make_record(size=size, median_us=median, seed=index)
        rec.run_id = f"run{index}"
        rec.method.update({"repeat": index, "repeats": len(medians), "repeat_group": group})
        out.append(rec)
    return out


def test_spread_is_between_launch_medians() -> None:
    records = _launch_records("g1", [10.0, 12.0, 20.0]) + _launch_records("other", [1.0, 99.0])
    rows = spread_rows(records, "g1")
    assert len(rows) == 1
    row = rows[0]
    assert row.medians_us == pytest.approx((10.0, 12.0, 20.0))
    assert row.middle_us == pytest.approx(12.0)
    assert row.spread == pytest.approx((20.0 - 10.0) / 12.0)
    text = "\n".join(format_spread(rows, 3, ["run1", "run2", "run3"]))
    assert "3 launches (runs run1, run2, run3)" in text and "83%" in text


def test_compare_sees_each_launch_as_a_run() -> None:
    base = _launch_records("b", [10.0, 10.5, 9.8])
    new = _launch_records("n", [10.1, 10.2, 9.9])
    rows, _ = compare_records(base, new)
    assert [(r.base_runs, r.new_runs, r.basis) for r in rows] == [(3, 3, "between-run")]


def test_repeat_2_at_2_ranks(tmp_path: Path) -> None:
    out = tmp_path / "rep.jsonl"
    proc = run_ccbench("launch", "-n", "2", "--repeat", "2", "allreduce", "--backend", "gloo",
                       "--sizes", "8,64", "--iters", "5", "--warmup", "1", "-q", "-O", str(out),
                       timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert "launch 1 of 2" in proc.stderr and "launch 2 of 2" in proc.stderr
    records = load_records(out)
    assert len(records) == 2 * 2 * 2            # launches x sizes x modes
    by_launch = {r.method["repeat"]: r.run_id for r in records}
    assert sorted(by_launch) == [1, 2] and len(set(by_launch.values())) == 2
    assert {r.method["repeats"] for r in records} == {2}
    assert len({r.method["repeat_group"] for r in records}) == 1
    assert all(r.run_id == by_launch[r.method["repeat"]] for r in records)
    assert f"2 launches (runs {by_launch[1]}, {by_launch[2]})" in proc.stdout
    assert proc.stdout.count("allreduce gloo float32 sum") == 4 and "spread between launches" \
        in proc.stdout
    rows, _ = compare_records(records, records)
    assert {(r.base_runs, r.new_runs, r.basis) for r in rows} == {(2, 2, "between-run")}


def test_without_output_the_records_are_not_left_behind(tmp_path: Path) -> None:
    env = {"TMPDIR": str(tmp_path)}
    proc = run_ccbench("launch", "-n", "2", "--repeat", "2", "broadcast", "--backend", "gloo",
                       "--sizes", "64", "--iters", "3", "--warmup", "0", "-q", "--format",
                       "json", env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 2          # JSON lines only: one record a launch
    assert "2 launches" in proc.stderr and "spread between launches" in proc.stderr
    assert not [p for p in os.listdir(tmp_path) if p.startswith("ccbench-repeat-")]


def test_repeat_launches_each_with_its_index_and_stops_at_the_first_failure(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The launches of --repeat (ccbench.bench.repeats.repeat_launches) without a launcher: each is
    told its index through the environment and writes to the same output; the spread is read
    back from there. A failed launch ends them with its status, and no spread is printed."""
    from ccbench.bench.repeats import repeat_launches
    from ccbench.records import append_record

    out = tmp_path / "r.jsonl"
    seen: list[tuple[dict[str, str], list[str]]] = []

    def launch(env: dict[str, str], bench: list[str]) -> int:
        seen.append((env, bench))
        index, count, group = env[ENV].split("/")
        append_record(out, _launch_records(group, [10.0] * int(count))[int(index) - 1])
        return 0

    assert repeat_launches(2, launch, ["allreduce", "--output", str(out)], str(out),
                           "table") == 0
    assert [env[ENV].split("/")[:2] for env, _ in seen] == [["1", "2"], ["2", "2"]]
    assert all(bench == ["allreduce", "--output", str(out)] for _, bench in seen)
    assert "2 launches (runs run1, run2)" in capsys.readouterr().out
    seen.clear()

    def failing(env: dict[str, str], bench: list[str]) -> int:
        seen.append((env, bench))
        return 3

    assert repeat_launches(3, failing, ["allreduce"], None, "table") == 3
    assert len(seen) == 1 and seen[0][1][:2] == ["allreduce", "--output"]
    captured = capsys.readouterr()
    assert "launches (runs" not in captured.out and "launch 1 of 3" in captured.err
