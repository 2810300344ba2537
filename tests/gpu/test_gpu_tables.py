"""The H200 tables' module (ccbench.report.gpu_tables) on records made here, in a check.sh-style
records.tar.gz: the numbers it prints are the records' fields and their ratios."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from ccbench.records.schema import Record
from ccbench.records.writer import write_records
from ccbench.report import gpu_tables


def _record(backend: str, algorithm: str, median: float, **overrides: object) -> Record:
    fields = dict(
        run_id="r", timestamp="2026-12-04T17:00:00+00:00", ccbench_version="0.1.0",
        collective="allreduce", backend=backend, library="nccl", library_version="2.28.9",
        algorithm=algorithm, transport="cupy", device="cuda:0", dtype="float32", op="sum",
        inplace=False, timing="per-op", world_size=1, nodes=1, ranks_per_node=1, hosts=["h"],
        root=0, size_asked=1024, size_used=1024, count=256, iterations=3, warmup=1,
        time_us={"median": median, "mean": median, "min": median, "p5": median,
                 "p95": median, "max": median, "stdev": 0.0},
        samples_us=[median], rank_median_us=[median], algbw_gbps=1024 / median / 1e3,
        busbw_gbps=0.0, wrong=0, environment={"gpu": "Test GPU"})
    fields.update(overrides)
    return Record(**fields)  # type: ignore[arg-type]


def _run(tmp_path: Path, steps: dict[str, list[Record]]) -> Path:
    folder = tmp_path / "records"
    folder.mkdir()
    for name, records in steps.items():
        write_records(folder / f"{name}.jsonl", records)
    with tarfile.open(tmp_path / "records.tar.gz", "w:gz") as tar:
        tar.add(folder, arcname="records")
    return tmp_path


def test_ratios_and_bandwidth_come_from_the_records(tmp_path: Path) -> None:
    algorithms = [_record("nccl-cupy", "native", 10.0), _record("ring@nccl-cupy", "ring", 15.0),
                  _record("tree@nccl-cupy", "tree", 5.0),
                  _record("ring@nccl-cupy", "ring", 40.0, dtype="int32"),
                  _record("nccl-cupy", "native", 10.0, dtype="int32")]
    band = [_record("nccl-cupy", "native", 66.3, timing="pipelined", algbw_gbps=2024.5,
                    size_used=134217728)]
    run = _run(tmp_path, {"algorithms-nccl-cupy-w1": algorithms, "bandwidth-w1": band})
    text = gpu_tables.render(gpu_tables.load_steps([run]))
    assert "| allreduce | 1K | 10.0 | 1.50x | 0.50x | - |" in text
    assert "| 1K | 2.75x [1.50x, 4.00x] (2) | 0.50x [0.50x, 0.50x] (1) | - |" in text
    assert "| allreduce | 128M | out of place | 0 | 66.30 | 2024.5 | 0.0 |" in text
    assert "Test GPU, nccl 2.28.9" in text


def test_a_missing_run_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_tables.main([str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.startswith("ccbench: error: ")


def test_a_folder_without_records_is_one_error_line(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_tables.main([str(tmp_path)]) == 2
    assert "no check.sh records" in capsys.readouterr().err
