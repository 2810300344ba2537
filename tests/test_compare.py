"""ccbench compare: planted regressions are found, noise is not, incomparable input is refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_ccbench

from ccbench.bench.stats import bootstrap_ratio, t_quantile, welch_ratio
from ccbench.commands.compare import (
    BETWEEN_RUN_THRESHOLD,
    WITHIN_RUN_THRESHOLD,
    compare_cases,
    compare_records,
)
from ccbench.errors import UsageError
from ccbench.records import Record, append_record, load_records, record_from_dict

FACTORS = {"allreduce": 1.0, "allgather": 0.5, "reduce-scatter": 0.5, "broadcast": 1.0,
           "alltoall": 0.5}


def make_record(*, collective: str = "allreduce", backend: str = "mpi", size: int = 1024,
                median_us: float = 10.0, noise: float = 0.03, iters: int = 30, seed: int = 0,
                world_size: int = 2, dtype: str = "float32", timing: str = "per-op",
                inplace: bool = False, library: str = "Intel(R) MPI Library",
                version: str = "2021.18", algorithm: str = "native",
                straggler: float = 1.0) -> Record:
    """A plausible record: lognormal-ish samples around median_us."""
    rng = np.random.default_rng(seed)
    samples = median_us * np.exp(rng.normal(0.0, noise, iters))
    samples = samples * (median_us / np.median(samples))
    stats = {"median": float(np.median(samples)), "mean": float(samples.mean()),
             "min": float(samples.min()), "p5": float(np.percentile(samples, 5)),
             "p95": float(np.percentile(samples, 95)), "max": float(samples.max()),
             "stdev": float(samples.std(ddof=1))}
    ranks = [median_us * (1 - 0.02 * r) for r in range(world_size)]
    ranks[-1] *= straggler
    algbw = size / (stats["median"] * 1e-6) / 1e9
    factor = 2 * (world_size - 1) / world_size if collective == "allreduce" else (
        1.0 if collective == "broadcast" else (world_size - 1) / world_size)
    transport = backend.split("@")[-1]
    return Record(
        run_id="r0", timestamp=f"2026-12-02T12:00:{seed % 60:02d}+00:00", ccbench_version="0.1.0",
        collective=collective, backend=backend, library=library, library_version=version,
        algorithm=algorithm, transport=transport, device="cpu", dtype=dtype,
        op=None if collective in ("allgather", "broadcast", "alltoall") else "sum",
        inplace=inplace, timing=timing, world_size=world_size, nodes=1,
        ranks_per_node=world_size, hosts=["h"], root=0, size_asked=size, size_used=size,
        count=size // 4, iterations=iters, warmup=2, time_us=stats,
        samples_us=[float(x) for x in samples], rank_median_us=ranks, algbw_gbps=algbw,
        busbw_gbps=algbw * factor, wrong=0,
        method={"timing": timing, "combine": "max over ranks"},
        environment={"cpu": "Test CPU", "torch": "2.13.0", "num_cpus": 2})


def write(path: Path, records: list[Record]) -> Path:
    for rec in records:
        append_record(path, rec)
    return path


SIZES = [1 << k for k in range(10, 20, 3)]


def series(factor: float = 1.0, seed: int = 0, **kw) -> list[Record]:
    return [make_record(size=s, median_us=5.0 + s / 1e3 * factor, seed=seed + i, **kw)
            for i, s in enumerate(SIZES)]


def test_bootstrap_interval_contains_true_ratio() -> None:
    rng = np.random.default_rng(1)
    base = 10 * np.exp(rng.normal(0, 0.05, 40))
    new = 12 * np.exp(rng.normal(0, 0.05, 40))
    ratio, low, high = bootstrap_ratio(base, new)
    assert low < 1.2 < high or abs(ratio - 1.2) < 0.05
    assert low > 1.0


def test_planted_regression_is_significant() -> None:
    base = series(seed=0)
    new = series(seed=100)
    new[1] = make_record(size=SIZES[1], median_us=(5.0 + SIZES[1] / 1e3) * 1.2, seed=7)
    rows, note = compare_records(base, new, threshold=0.05)
    assert note is None
    verdicts = {r.size: r.verdict for r in rows}
    assert verdicts[SIZES[1]] == "regression"
    assert [v for s, v in verdicts.items() if s != SIZES[1]] == ["same"] * (len(SIZES) - 1)
    row = next(r for r in rows if r.size == SIZES[1])
    assert row.ci_low > 1.0 and 1.1 < row.ratio < 1.3


def test_noise_is_ignored() -> None:
    # same distribution, different draws, and a noisy 3% shift that is below the threshold
    rows, _ = compare_records(series(seed=0), series(seed=50, factor=1.03), threshold=0.05)
    assert all(r.verdict in ("same", "n/a") for r in rows)
    rows, _ = compare_records(series(seed=0, noise=0.3), series(seed=9, noise=0.3))
    assert all(r.verdict != "regression" for r in rows)


def test_improvement_is_marked() -> None:
    rows, _ = compare_records(series(), series(seed=3, factor=0.5))
    assert {r.verdict for r in rows if r.size >= 1 << 16} == {"improvement"}


@pytest.mark.parametrize("change", [{"world_size": 4}, {"dtype": "bfloat16"},
                                    {"timing": "pipelined"}])
def test_refuses_incomparable(change: dict) -> None:
    with pytest.raises(UsageError, match="incomparable"):
        compare_records(series(), series(seed=5, **change))
    rows, note = compare_records(series(), series(seed=5, **change), force=True)
    assert len(rows) == len(SIZES) and note and "forced" in note


def test_cross_backend_pairs_cases() -> None:
    rows, note = compare_records(series(backend="mpi"), series(backend="gloo", factor=3))
    assert "gloo" in note and len(rows) == len(SIZES)


def test_nothing_in_common() -> None:
    with pytest.raises(UsageError, match="no \\(case, size\\) in common"):
        compare_records(series(collective="allreduce"),
                        series(collective="broadcast", backend="mpi", seed=4))


def test_cli_exit_codes(tmp_path: Path) -> None:
    base = write(tmp_path / "base.jsonl", series())
    same = write(tmp_path / "same.jsonl", series(seed=40))
    slow = write(tmp_path / "slow.jsonl", series(seed=40, factor=1.5))
    other = write(tmp_path / "n4.jsonl", series(seed=40, world_size=4))
    proc = run_ccbench("compare", str(base), str(same))
    assert proc.returncode == 0, proc.stderr
    assert "geometric mean" in proc.stdout
    proc = run_ccbench("compare", str(base), str(slow), "--threshold", "0.1")
    assert proc.returncode == 1 and "SLOWER" in proc.stdout, proc.stdout
    proc = run_ccbench("compare", str(base), str(other))
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("ccbench: error: incomparable records: world_size 2 vs 4")
    assert len(proc.stderr.strip().splitlines()) == 1
    proc = run_ccbench("compare", str(base), str(other), "--force", "--format", "json")
    assert proc.returncode in (0, 1)
    assert json.loads(proc.stdout.splitlines()[0])["collective"] == "allreduce"
    proc = run_ccbench("compare", str(base), str(tmp_path / "missing.jsonl"))
    assert proc.returncode == 2 and "no such results file" in proc.stderr
    proc = run_ccbench("compare", str(base), str(same), "--threshold", "-1")
    assert proc.returncode == 2 and "--threshold" in proc.stderr


def test_record_factory_round_trips() -> None:
    rec = make_record()
    assert record_from_dict(json.loads(rec.to_json())) == rec


def runs(shifts: list[float], seed: int = 0, **kw) -> list[Record]:
    """One record of the same case per run; each run's times shifted by a run-level factor
    (what moves between runs on a real machine: placement, frequency, neighbours)."""
    out = []
    for i, shift in enumerate(shifts):
        rec = make_record(median_us=100.0 * shift, noise=0.01, seed=seed + i, **kw)
        rec.run_id = f"run{seed + i}"
        out.append(rec)
    return out


def test_several_runs_per_side_use_the_spread_between_runs() -> None:
    base = runs([1.0, 1.12, 0.93], seed=0)
    same = runs([1.08, 0.95, 1.03], seed=10)
    rows, _ = compare_records(base, same, threshold=0.05)
    assert [(r.basis, r.base_runs, r.new_runs, r.verdict) for r in rows] == [
        ("between-run", 3, 3, "same")]
    # the same data judged run against run: iterations alone call a 12 % shift significant
    rows, _ = compare_records(base[1:2], same[1:2], threshold=0.05)
    assert rows[0].basis == "within-run" and rows[0].significant
    slower = runs([1.5, 1.62, 1.43], seed=20)
    rows, _ = compare_records(base, slower)
    assert rows[0].verdict == "regression" and rows[0].ci_low > 1.0


def test_default_threshold_depends_on_the_runs() -> None:
    one, two = runs([1.0], seed=0), runs([1.0 + WITHIN_RUN_THRESHOLD / 2], seed=1)
    rows, _ = compare_records(one, two)
    assert rows[0].basis == "within-run" and rows[0].significant
    assert rows[0].verdict == "same"              # below the measured run-to-run threshold
    rows, _ = compare_records(one, runs([(1.0 + WITHIN_RUN_THRESHOLD) * 1.2], seed=1))
    assert rows[0].verdict == "regression"
    assert BETWEEN_RUN_THRESHOLD < WITHIN_RUN_THRESHOLD


def test_cli_says_what_the_interval_covers(tmp_path: Path) -> None:
    base = write(tmp_path / "base.jsonl", series())
    same = write(tmp_path / "same.jsonl", series(seed=40))
    proc = run_ccbench("compare", str(base), str(same))
    assert "one run on a side: the interval covers within-run noise only" in proc.stdout
    folder_a, folder_b = tmp_path / "a", tmp_path / "b"
    folder_a.mkdir()
    folder_b.mkdir()
    write(folder_a / "r.jsonl", runs([1.0, 1.1], seed=0))
    write(folder_b / "r.jsonl", runs([1.05, 0.97], seed=5))
    proc = run_ccbench("compare", str(folder_a), str(folder_b))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "several runs per side (2 vs 2 runs): the interval covers run-to-run" in proc.stdout


def test_refuses_different_rank_combinations() -> None:
    """-a 1 (mean over ranks) against the default max measure different things."""
    mean = series(seed=5)
    for rec in mean:
        rec.method["combine"] = "mean over ranks"
    with pytest.raises(UsageError, match="rank combination max over ranks vs mean over ranks"):
        compare_records(series(), mean)
    rows, note = compare_records(series(), mean, force=True)
    assert len(rows) == len(SIZES) and note and "forced despite rank combination" in note
    legacy = series(seed=7)                  # records from before the setting: max
    for rec in legacy:
        del rec.method["combine"]
    assert len(compare_records(series(), legacy)[0]) == len(SIZES)


@pytest.mark.parametrize(("df", "table"), [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776),
                                           (10, 2.228), (30, 2.042)])
def test_t_quantile_matches_the_table(df: int, table: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(table, rel=6e-3)


def test_welch_ratio_known_answer() -> None:
    shift = np.log(1.5)
    ratio, low, high = welch_ratio([0.0, 0.1, -0.1], [shift, shift + 0.1, shift - 0.1], 0.95)
    half = t_quantile(0.975, 4) * np.sqrt(2 * 0.01 / 3)     # equal variances: df = 4
    assert ratio == pytest.approx(1.5)
    assert low == pytest.approx(1.5 * np.exp(-half)) and high == pytest.approx(1.5 * np.exp(half))


def test_one_run_per_side_marks_are_indicative(tmp_path: Path) -> None:
    """One run a side cannot see launch-to-launch noise: a change beyond the measured spread is
    marked with '?' and the status stays 0, unless the user sets the threshold."""
    base = write(tmp_path / "base.jsonl", series())
    slow = write(tmp_path / "slow.jsonl", series(seed=40, factor=1.0 + 2 * WITHIN_RUN_THRESHOLD))
    rows, _ = compare_records(load_records(base), load_records(slow))
    big = [r for r in rows if r.size >= 1 << 16]
    assert big and all(r.verdict == "regression" and r.indicative for r in big)
    proc = run_ccbench("compare", str(base), str(slow))
    assert proc.returncode == 0, proc.stdout
    assert "SLOWER?" in proc.stdout and "do not set the exit status" in proc.stdout
    proc = run_ccbench("compare", str(base), str(slow), "--threshold", "0.1")
    assert proc.returncode == 1 and "SLOWER?" not in proc.stdout


def test_a_case_wide_slowdown_is_found_where_sizes_alone_are_noise(tmp_path: Path) -> None:
    """Launch noise that differs per size hides a 25 % slowdown at each size; the case pools
    the sizes, so the slowdown of the whole case is a regression and sets the status."""
    rng = np.random.default_rng(1)
    base, slow, same = [], [], []
    for run in range(5):
        for j, size in enumerate(SIZES):
            for side, shift, tag in ((base, 1.0, "b"), (slow, 1.25, "s"), (same, 1.0, "n")):
                rec = make_record(size=size, median_us=100.0 * shift * (1 + 0.1 * j)
                                  * float(np.exp(rng.normal(0.0, 0.25))), noise=0.01,
                                  seed=run * 10 + j)
                rec.run_id = f"{tag}{run}"
                side.append(rec)
    cases = compare_cases(base, slow)
    assert [(c.basis, c.sizes, c.verdict) for c in cases] == [("between-run", len(SIZES),
                                                               "regression")]
    assert 1.1 < cases[0].ratio < 1.45
    assert compare_cases(base, same)[0].verdict == "same"
    write(tmp_path / "base.jsonl", base)
    write(tmp_path / "slow.jsonl", slow)
    proc = run_ccbench("compare", str(tmp_path / "base.jsonl"), str(tmp_path / "slow.jsonl"),
                       "--format", "json")
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [line["level"] for line in lines] == ["size"] * len(SIZES) + ["case"]
    assert proc.returncode == 1 and lines[-1]["verdict"] == "regression"


def test_a_row_shows_the_times_its_ratio_is_of(tmp_path: Path) -> None:
    """With several runs a side the ratio is of the runs' medians' geometric means: the row's
    two times are those, so new/base is the ratio shown, and the header names the statistic."""
    base_runs = runs([1.0, 1.4, 3.0], seed=0)      # skewed: median and geometric mean differ
    new_runs = runs([1.2, 1.5, 1.6], seed=10)
    rows, _ = compare_records(base_runs, new_runs)
    (row,) = rows
    assert row.basis == "between-run"
    assert row.new_us / row.base_us == pytest.approx(row.ratio, rel=1e-9)
    for side, path in ((base_runs, tmp_path / "base.jsonl"), (new_runs, tmp_path / "new.jsonl")):
        for rec in side:
            append_record(path, rec)
    proc = run_ccbench("compare", str(tmp_path / "base.jsonl"), str(tmp_path / "new.jsonl"))
    assert "base us, new us: geometric mean of the runs' medians" in proc.stdout, proc.stdout
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("allreduce"))
    base_us, new_us, ratio = (float(v) for v in line.split()[4:7])
    assert new_us / base_us == pytest.approx(ratio, abs=2e-3)
