import json
from pathlib import Path

import pytest

from ccbench.errors import UsageError
from ccbench.records import (
    SCHEMA_VERSION,
    CaseId,
    Record,
    RecordKey,
    append_record,
    load_records,
    read_records,
)

FIXTURE = Path(__file__).parent / "fixtures" / "records-v1.jsonl"


def make_record(**overrides: object) -> Record:
    fields = dict(
        run_id="abc", timestamp="2026-12-02T00:00:00+00:00", ccbench_version="0.1.0",
        collective="allreduce", backend="mpi", library="Intel MPI", library_version="2021",
        algorithm="native", transport="mpi", device="cpu", dtype="float32", op="sum",
        inplace=False, timing="per-op", world_size=2, nodes=1, ranks_per_node=2, hosts=["h"],
        root=0, size_asked=1024, size_used=1024, count=256, iterations=3, warmup=1,
        time_us={"median": 2.0, "mean": 2.0, "min": 1.0, "p5": 1.0, "p95": 3.0, "max": 3.0,
                 "stdev": 1.0},
        samples_us=[1.0, 2.0, 3.0], rank_median_us=[2.0, 1.9], algbw_gbps=0.512,
        busbw_gbps=0.512, wrong=0)
    fields.update(overrides)
    return Record(**fields)  # type: ignore[arg-type]


def test_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    first, second = make_record(), make_record(size_asked=2048, size_used=2048)
    append_record(path, first)
    append_record(path, second)
    assert load_records(path) == [first, second]
    assert RecordKey.of(first) != RecordKey.of(second)
    assert first.case == second.case == CaseId.of(first)


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    append_record(path, make_record())
    with open(path, "a") as handle:
        handle.write('{"schema": "ccbench.rec')
    assert len(load_records(path)) == 1


def test_unknown_version_refused(tmp_path: Path) -> None:
    data = json.loads(make_record().to_json())
    data["schema_version"] = SCHEMA_VERSION + 1
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(data) + "\n")
    with pytest.raises(UsageError, match="unknown record schema version"):
        load_records(path)


def test_not_a_record_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"hello": 1}\n')
    records, report = read_records(path)
    assert records == [] and len(report.skipped) == 1
    assert "not a ccbench record" in str(report.skipped[0])
    with pytest.raises(UsageError, match="no ccbench records"):
        load_records(path, require=True)


def test_v1_fixture_still_loads() -> None:
    records = load_records(FIXTURE)
    assert records and all(r.schema_version == 1 for r in records)
