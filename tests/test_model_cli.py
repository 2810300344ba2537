"""calibrate / simulate / export through the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ccbench.cli import main as cli_main
from ccbench.model.synthetic import synthetic_records
from ccbench.records import append_record
from tests.conftest import run_ccbench


class _Proc:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def ccb(capsys):
    """Run ccbench in this process (fast); one test below goes through a real subprocess."""
    def run(*args: str) -> _Proc:
        capsys.readouterr()
        rc = cli_main(list(args))
        out = capsys.readouterr()
        return _Proc(rc, out.out, out.err)
    return run

SIZES = [2 ** k for k in range(10, 22)]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "results.jsonl"
    recs = synthetic_records("allgather", "ring", [2, 3, 4], SIZES, 20e-6, 2e-10, 0, seed=1)
    recs += synthetic_records("allreduce", "ring", [2, 3, 4], SIZES, 20e-6, 2e-10, 5e-11, seed=2)
    for r in recs:
        append_record(path, r)
    return path


@pytest.fixture(scope="module")
def model(results) -> Path:
    out = results.parent / "model.json"
    proc = run_ccbench("calibrate", str(results), "-o", str(out), "--bootstrap", "20",
                       "--validate", "2,4:3", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "R2_log" in proc.stdout and "median_rel_err" in proc.stdout
    assert "validation: fitted on world sizes 2,4, predicted 3" in proc.stdout
    return out


def test_calibrate_writes_model(model):
    data = json.loads(model.read_text())
    assert data["schema"] == "ccbench.model" and data["units"]["time"] == "seconds"
    across = [f for f in data["fits"] if f["scope"] == "all-world-sizes"]
    assert {f["collective"] for f in across} == {"allgather", "allreduce"}
    assert all(f["ci95"]["alpha"][0] <= f["alpha"] <= f["ci95"]["alpha"][1] for f in across)


def test_simulate_table_and_json(model, ccb):
    proc = ccb("simulate", str(model), "allreduce", "--topology", "ring:8",
                       "--sizes", "1K-1M:32", "--fidelity", "both")
    assert proc.returncode == 0, proc.stderr
    assert "busbw_GBps" in proc.stdout and "replay/analytical" in proc.stdout
    proc = ccb("simulate", str(model), "allgather", "--ranks", "16", "--topology",
                       "fat-tree:oversub=2", "--sizes", "1M", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    row = out["rows"][0]
    assert row["size_used"] == 1 << 20 and row["algbw_gbps"] > 0
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 15 / 16)


def test_simulate_writes_records(model, ccb, tmp_path):
    from ccbench.records import load_records

    out = tmp_path / "pred.jsonl"
    proc = ccb("simulate", str(model), "allreduce", "--topology", "switch:8", "--sizes",
               "1K,1M", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    recs = load_records(out)
    assert [r.size_used for r in recs] == [1024, 1 << 20]
    assert recs[0].backend == "model/synthetic" and recs[0].method["predicted"] is True
    assert recs[1].busbw_gbps == pytest.approx(recs[1].algbw_gbps * 2 * 7 / 8)


def test_simulate_both_writes_a_record_per_fidelity(model, ccb, tmp_path):
    """--fidelity both -o: an analytical and a replay record per size, each with its own
    time, so that report draws both curves (recursive doubling on a ring contends)."""
    from ccbench.records import load_records

    out = tmp_path / "pred.jsonl"
    args = ["simulate", str(model), "allreduce", "--topology", "ring:8", "-a",
            "recursive-doubling", "--sizes", "1M,4M", "--fidelity", "both"]
    proc = ccb(*args, "--format", "json", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    recs = load_records(out)
    assert [(r.size_used, r.method["fidelity"]) for r in recs] == [
        (1 << 20, "analytical"), (1 << 20, "replay"), (4 << 20, "analytical"), (4 << 20, "replay")]
    for row, (an, rp) in zip(rows, zip(recs[::2], recs[1::2], strict=True), strict=True):
        assert an.time_us["median"] == pytest.approx(row["time_us"])
        assert rp.time_us["median"] == pytest.approx(row["replay_time_us"])
        assert rp.busbw_gbps == pytest.approx(row["replay_busbw_gbps"])
        assert rp.time_us["median"] > an.time_us["median"] * 1.01     # contention shows


@pytest.mark.parametrize("args,needle", [
    (["--topology", "mesh:4"], "unknown topology"),
    (["--topology", "ring:4", "--sizes", "1Q"], "malformed size"),
    (["--topology", "hypercube:6"], "power-of-two"),
    (["--topology", "ring:4", "--algorithm", "nope"], "no cost formula"),
])
def test_simulate_bad_input(model, args, needle, ccb):
    proc = ccb("simulate", str(model), "allreduce", *args)
    assert proc.returncode == 2
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_calibrate_bad_input(tmp_path, ccb):
    proc = ccb("calibrate", str(tmp_path / "none.jsonl"), "-o", str(tmp_path / "m.json"))
    assert proc.returncode == 2 and "no such results" in proc.stderr
    bad = tmp_path / "m.json"
    bad.write_text("{}")
    proc = ccb("simulate", str(bad), "allreduce", "--topology", "ring:4")
    assert proc.returncode == 2 and "not a ccbench model" in proc.stderr


def test_export_commands(model, results, tmp_path, ccb):
    proc = ccb("export", "astra-sim", str(model), "-o", str(tmp_path / "a"), "--ranks",
                       "4", "--collective", "allreduce", "--sizes", "1M,4M")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "a").glob("*.et")) == \
        [f"workload.{r}.et" for r in range(4)]
    proc = ccb("export", "chakra", str(results), "-o", str(tmp_path / "c"))
    assert proc.returncode == 0, proc.stderr
    assert len(list((tmp_path / "c").glob("*.et"))) == 2 * (2 + 3 + 4)


def test_malformed_fit_in_model(model, ccb, tmp_path):
    data = json.loads(model.read_text())
    del data["fits"][0]["alpha"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    proc = ccb("simulate", str(bad), "allreduce", "--topology", "ring:4")
    assert proc.returncode == 2 and "fit 0: lacks alpha" in proc.stderr


def test_a_piece_without_its_end_in_model(model, ccb, tmp_path):
    """Only a fit's last piece covers every larger size: a hand-edited model whose first piece
    has no max_bytes is refused when read, in one line, not deep inside a prediction."""
    data = json.loads(model.read_text())
    fit = data["fits"][0]
    fit["pieces"] = [{"max_bytes": None, "alpha": fit["alpha"], "beta": fit["beta"],
                      "gamma": fit["gamma"]},
                     {"max_bytes": None, "alpha": fit["alpha"], "beta": fit["beta"],
                      "gamma": fit["gamma"]}]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    proc = ccb("simulate", str(bad), "allreduce", "--topology", "ring:4")
    assert proc.returncode == 2, proc.stderr
    assert "fit 0: piece 0 has no max_bytes (only the last piece has none)" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


@pytest.mark.parametrize("case", ["one-record", "torus-zero", "all-algorithm"])
def test_model_bad_input_one_line(tmp_path, model, case):
    """As a user meets them: exit 2, one `ccbench: error:` line naming the bad value, no
    traceback, and an existing output file left byte-identical."""
    out = tmp_path / "m.json"
    out.write_text("keep")
    if case == "one-record":
        one = tmp_path / "one.jsonl"
        append_record(one, synthetic_records("allreduce", "ring", [2], [1 << 20], 2e-5, 2e-10,
                                             0.0)[0])
        args = ["calibrate", str(one), "-o", str(out)]
        needle = "one size (1048576 B); alpha and beta cannot be told apart"
    elif case == "torus-zero":
        args = ["simulate", str(model), "allreduce", "--topology", "torus:3x0"]
        needle = "--topology 'torus:3x0': every dimension must be >= 1, got 0"
    else:
        args = ["simulate", str(model), "all", "--algorithm", "ring", "--topology", "ring:4"]
        needle = "--algorithm names one collective's formula"
    proc = run_ccbench(*args, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ccbench: error:") and needle in lines[0], lines
    assert "Traceback" not in proc.stderr
    assert out.read_text() == "keep"


def test_calibrate_fits_one_measurement_per_group(tmp_path, ccb):
    """Records measured with --combine mean beside the default ones are another measurement:
    calibrate fits the default ones and says it left the others out (one fit of both would fit
    neither); records all measured with --combine mean are fitted as they are."""
    default = synthetic_records("allgather", "ring", [2, 4], SIZES, 20e-6, 2e-10, 0, seed=1)
    mean = synthetic_records("allgather", "ring", [2, 4], SIZES, 90e-6, 9e-10, 0, seed=3)
    for rec in mean:
        rec.method = {**(rec.method or {}), "combine": "mean over ranks"}
    both, only_mean = tmp_path / "both.jsonl", tmp_path / "mean.jsonl"
    for rec in default + mean:
        append_record(both, rec)
    for rec in mean:
        append_record(only_mean, rec)
    proc = ccb("calibrate", str(both), "-o", str(tmp_path / "m.json"), "--bootstrap", "0")
    assert proc.returncode == 0, proc.stderr
    assert (f"{len(mean)} record(s) measured with combine=mean over ranks left out"
            in proc.stderr), proc.stderr
    fit = next(f for f in json.loads((tmp_path / "m.json").read_text())["fits"]
               if f["scope"] == "all-world-sizes")
    assert fit["alpha"] == pytest.approx(20e-6, rel=0.2)
    proc = ccb("calibrate", str(only_mean), "-o", str(tmp_path / "n.json"), "--bootstrap", "0")
    assert proc.returncode == 0 and "left out" not in proc.stderr, proc.stderr
    fit = next(f for f in json.loads((tmp_path / "n.json").read_text())["fits"]
               if f["scope"] == "all-world-sizes")
    assert fit["alpha"] == pytest.approx(90e-6, rel=0.2)
