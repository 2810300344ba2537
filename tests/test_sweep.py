"""Sweep files (schema and errors), the case cross product, resume logic on synthetic records,
torn-line repair, and `ccbench merge` dedupe. No processes are started here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ccbench.backends import backend_names
from ccbench.collectives import COLLECTIVES, OPS
from ccbench.commands.merge import merge_records
from ccbench.dtypes import DTYPES
from ccbench.errors import UsageError
from ccbench.records import Record, RecordKey, append_record, cut_torn_tail, load_records
from ccbench.sweep import (
    SweepCase,
    build_case_command,
    done_sizes,
    load_sweep,
    missing_sizes,
    plan_runs,
    sweep_from_dict,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "slurm" / "sweeps").glob("*.yaml"))


def make_record(**overrides: Any) -> Record:
    fields: dict[str, Any] = dict(
        run_id="abc", timestamp="2026-12-02T00:00:00+00:00", ccbench_version="0.1.0",
        collective="allreduce", backend="gloo", library="gloo", library_version="2.13",
        algorithm="native", transport="gloo", device="cpu", dtype="float32", op="sum",
        inplace=False, timing="per-op", world_size=2, nodes=1, ranks_per_node=2, hosts=["h"],
        root=0, size_asked=8, size_used=8, count=2, iterations=3, warmup=1,
        time_us={"median": 2.0, "mean": 2.0, "min": 1.0, "p5": 1.0, "p95": 3.0, "max": 3.0,
                 "stdev": 1.0},
        samples_us=[1.0, 2.0, 3.0], rank_median_us=[2.0, 1.9], algbw_gbps=0.004,
        busbw_gbps=0.004, wrong=0)
    fields.update(overrides)
    return Record(**fields)


def write_sweep(tmp_path: Path, data: dict[str, Any], name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


# -- schema ---------------------------------------------------------------------------------

def test_defaults(tmp_path: Path) -> None:
    sweep = load_sweep(write_sweep(tmp_path, {}, "mine.yaml"))
    assert sweep.name == "mine"
    assert sweep.collectives == ["allreduce"] and sweep.backends == ["gloo"]
    assert sweep.dtypes == ["float32"] and sweep.ops == ["sum"]
    assert sweep.nodes == [1] and sweep.ranks_per_node == [2]
    assert sweep.modes == ["out-of-place", "in-place"]
    assert sweep.results == "results/mine"
    assert len(sweep.cases()) == 2


@pytest.mark.parametrize("data, message", [
    ({"colectives": "allreduce"}, "colectives: unknown key (valid: name, collectives,"),
    ({"collectives": ["allreduce", "allfoo"]},
     f"collectives: unknown collective 'allfoo' (valid: {', '.join(COLLECTIVES)})"),
    ({"backends": ["gloo", "nope"]},
     f"backends: unknown backend 'nope' (valid: {', '.join(backend_names())},"),
    ({"dtypes": "float33"}, f"dtypes: unknown dtype 'float33' (valid: {', '.join(DTYPES)})"),
    ({"ops": ["sum", "mean"]}, f"ops: unknown op 'mean' (valid: {', '.join(OPS)})"),
    ({"modes": ["inplace"]}, "modes: unknown mode 'inplace' (valid: out-of-place, in-place)"),
    ({"sizes": "1X-2M"}, "sizes:"),
    ({"nodes": [1, 0]}, "nodes: expected positive integers, got 0"),
    ({"ranks_per_node": "two"}, "ranks_per_node: expected positive integers, got 'two'"),
    ({"iters": 0}, "iters: must be >= 1, got 0"),
    ({"warmup": 1.5}, "warmup: expected an integer, got 1.5"),
    ({"timing": "fast"}, "timing: unknown timing 'fast' (valid: per-op, pipelined)"),
    ({"launcher": "ssh"}, "launcher: unknown launcher 'ssh' (valid: auto, srun, mpiexec)"),
    ({"group_by": ["host"]}, "group_by: unknown group_by 'host' (valid: backend, collective,"),
    ({"name": "a b"}, "name: 'a b': use letters, digits"),
    ({"env": {"1X": "y"}}, "env: '1X' is not a variable name"),
    ({"env": {"X": "a\nb"}}, "env: X: control characters are not allowed"),
    ({"slurm": {"partitoin": "x"}}, "slurm: partitoin: unknown key (valid: partition, account,"),
    ({"slurm": {"time": "soon"}}, "slurm: time: 'soon' is not a Slurm time"),
    ({"slurm": {"max_parallel": 0}}, "slurm: max_parallel: must be >= 1, got 0"),
    ({"slurm": {"partition": "a\nb"}}, "slurm: partition: control characters are not allowed"),
    ({"slurm": {"extra": ["exclusive"]}}, "slurm: extra: expected sbatch options like"),
])
def test_schema_errors(tmp_path: Path, data: dict[str, Any], message: str) -> None:
    path = write_sweep(tmp_path, data)
    with pytest.raises(UsageError) as info:
        load_sweep(path)
    assert str(info.value).startswith(f"{path}: "), str(info.value)
    assert message in str(info.value), str(info.value)


def test_not_a_mapping_and_bad_yaml(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- allreduce\n")
    with pytest.raises(UsageError, match="a sweep file is a mapping of keys"):
        load_sweep(path)
    path.write_text("collectives: [allreduce\n")
    with pytest.raises(UsageError, match="not valid YAML"):
        load_sweep(path)
    with pytest.raises(UsageError, match="no such sweep file"):
        load_sweep(tmp_path / "missing.yaml")


def test_cli_schema_error_is_one_line_exit_2(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, {"backends": "gloo", "dtypes": ["float32", "complex64"]})
    proc = subprocess.run([sys.executable, "-m", "ccbench", "sweep", str(path), "--slurm",
                           "--dry-run"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (f"ccbench: error: {path}: dtypes: unknown dtype 'complex64' "
                                   f"(valid: {', '.join(DTYPES)})")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_load(path: Path) -> None:
    sweep = load_sweep(path)
    assert sweep.cases() and sweep.tasks()


def test_calibration_sweep_covers_what_the_models_need() -> None:
    sweep = load_sweep(ROOT / "slurm" / "sweeps" / "calibration.yaml")
    assert set(sweep.collectives) == {"allreduce", "allgather", "reduce-scatter", "broadcast",
                                      "alltoall"}
    assert set(sweep.backends) == {"mpi", "ring@mpi", "tree@mpi", "hypercube@mpi"}
    assert sweep.ranks_per_node == [2, 3, 4] and sweep.nodes == [1]
    assert sweep.sizes[0] == 8 and sweep.sizes[-1] == 16 << 20


# -- cross product and grouping -------------------------------------------------------------

def test_cross_product_collapses_ops_for_non_reducing() -> None:
    sweep = sweep_from_dict({"collectives": ["allreduce", "allgather"], "ops": ["sum", "max"],
                             "backends": ["gloo", "mpi"], "modes": ["out-of-place"],
                             "ranks_per_node": [2, 3], "sizes": "8-64"})
    cases = sweep.cases()
    # allreduce: 2 ops, allgather: 1 (op None), x 2 backends x 2 worlds
    assert len(cases) == (2 + 1) * 2 * 2
    assert {c.op for c in cases if c.collective == "allgather"} == {None}
    tasks = sweep.tasks()
    assert [(t.nodes, t.ranks_per_node) for t in tasks] == [(1, 2), (1, 2), (1, 3), (1, 3)]
    assert [t.task_id for t in tasks] == [0, 1, 2, 3]
    assert {c.backend for c in tasks[0].cases} == {"gloo"}
    assert sum(len(t.cases) for t in tasks) == len(cases)


def test_plan_is_a_stable_resolved_sweep(tmp_path: Path) -> None:
    sweep = sweep_from_dict({"name": "n", "sizes": "8-1K", "backends": "gloo,mpi"})
    again = sweep_from_dict(json.loads(json.dumps(sweep.to_dict())))
    assert again.to_dict() == sweep.to_dict()
    assert again.digest() == sweep.digest()
    assert [t.cases for t in again.tasks()] == [t.cases for t in sweep.tasks()]


# -- resume ---------------------------------------------------------------------------------

def _case(**kw: Any) -> SweepCase:
    base: dict[str, Any] = dict(collective="allreduce", backend="gloo", dtype="float32",
                                op="sum", inplace=False, timing="per-op", nodes=1,
                                ranks_per_node=2, sizes=(8, 16, 32))
    base.update(kw)
    return SweepCase(**base)


def test_missing_sizes_from_records() -> None:
    records = [make_record(size_asked=8), make_record(size_asked=32),
               make_record(size_asked=16, inplace=True),
               make_record(size_asked=16, wrong=3),            # failed validation: not done
               make_record(size_asked=16, timing="pipelined"),  # another timing mode
               make_record(size_asked=16, ranks_per_node=3, world_size=3)]
    done = done_sizes(records)
    assert missing_sizes(_case(), done) == [16]
    assert missing_sizes(_case(inplace=True), done) == [8, 32]
    assert missing_sizes(_case(backend="mpi"), done) == [8, 16, 32]
    assert missing_sizes(_case(ranks_per_node=3), done) == [8, 32]
    assert missing_sizes(_case(timing="pipelined"), done) == [8, 32]


def test_plan_runs_joins_modes_only_when_they_miss_the_same_sizes() -> None:
    out, inp = _case(), _case(inplace=True)
    assert [(r.modes, r.sizes) for r in plan_runs([out, inp], {})] == [
        (("out-of-place", "in-place"), (8, 16, 32))]
    done = done_sizes([make_record(size_asked=8)])
    runs = plan_runs([out, inp], done)
    assert [(r.modes, r.sizes) for r in runs] == [(("out-of-place",), (16, 32)),
                                                  (("in-place",), (8, 16, 32))]
    complete = done_sizes([make_record(size_asked=s, inplace=m) for s in (8, 16, 32)
                           for m in (False, True)])
    assert plan_runs([out, inp], complete) == []


def test_case_commands() -> None:
    sweep = sweep_from_dict({"backends": ["gloo", "mpi"], "sizes": "8-32", "iters": 5,
                             "min_time": 0.5, "ranks_per_node": 2, "nodes": [1]})
    runs = plan_runs(sweep.cases(), {})
    gloo, mpi = runs
    local = build_case_command(sweep, gloo, "out.jsonl", "local", python="py")
    assert local == ["py", "-m", "ccbench", "launch", "-n", "2", "allreduce", "--backend", "gloo",
                     "--sizes", "8,16,32", "--dtype", "float32", "--op", "sum", "--timing",
                     "per-op", "--iters", "5", "--min-time", "0.5", "--output", "out.jsonl",
                     "--quiet"]
    srun = build_case_command(sweep, gloo, "out.jsonl", "slurm", python="py")
    assert srun[:6] == ["srun", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2",
                        "--kill-on-bad-exit=1", "py"]
    mpiexec = build_case_command(sweep, mpi, "out.jsonl", "slurm", python="/v/bin/py")
    assert mpiexec[1:5] == ["-n", "2", "-ppn", "2"] and mpiexec[5] == "/v/bin/py"
    one_mode = plan_runs([_case(inplace=True)], {})[0]
    assert "--inplace" in build_case_command(sweep, one_mode, "o", "local", python="py")


def test_local_sweep_refuses_more_than_one_node() -> None:
    sweep = sweep_from_dict({"nodes": [2]}, "f.yaml")
    run = plan_runs(sweep.cases(), {})[0]
    with pytest.raises(UsageError, match="f.yaml: nodes: a local sweep runs on one node"):
        build_case_command(sweep, run, "o", "local")


def test_repair_tail_cuts_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "task-0.jsonl"
    append_record(path, make_record(size_asked=8))
    with open(path, "a") as handle:
        handle.write('{"schema": "ccbench.rec')          # killed mid-write
    cut_torn_tail(path)
    append_record(path, make_record(size_asked=16))
    assert [r.size_asked for r in load_records(path)] == [8, 16]
    cut_torn_tail(path)                                     # intact file: untouched
    assert len(load_records(path)) == 2


def test_cut_torn_tail_keeps_the_piece_aside_when_asked(tmp_path: Path) -> None:
    path, aside = tmp_path / "r.jsonl", tmp_path / "r.jsonl.torn"
    append_record(path, make_record(size_asked=8))
    whole = path.read_bytes()
    with open(path, "ab") as handle:
        handle.write(b'{"schema": "ccbench.rec')
    assert cut_torn_tail(path, aside=aside) == len(b'{"schema": "ccbench.rec')
    assert path.read_bytes() == whole and aside.read_bytes() == b'{"schema": "ccbench.rec\n'
    assert cut_torn_tail(path, aside=aside) == 0 and aside.read_bytes().count(b"\n") == 1
    path.write_bytes(b"no newline at all")                  # one torn line, nothing whole
    assert cut_torn_tail(path, aside=aside) == 17 and path.read_bytes() == b""


# -- merge ----------------------------------------------------------------------------------

def test_merge_records_keeps_one_per_case_and_size() -> None:
    a, b = make_record(size_asked=8, run_id="1"), make_record(size_asked=16, run_id="1")
    again = make_record(size_asked=8, run_id="2")          # same case and size, another run
    other = make_record(size_asked=8, backend="mpi")
    same = make_record(size_asked=8, run_id="1")           # the same measurement again
    result = merge_records([a, b, again, other, same])
    assert result.records == [a, b, again, other] and result.duplicates == 1
    assert not result.conflicts
    bad = make_record(size_asked=32, wrong=4)
    good = make_record(size_asked=32, wrong=0)             # same run, case, size: a conflict
    result = merge_records([bad, good])
    assert result.records == [good] and result.duplicates == 1
    assert result.conflicts and "measured twice with different results" in result.conflicts[0]


def test_merge_refuses_one_run_id_with_different_metadata() -> None:
    a = make_record(size_asked=8, run_id="1")
    b = make_record(size_asked=16, run_id="1", ccbench_version="9.9")
    result = merge_records([a, b])
    assert result.conflicts == ["run 1: records differ in ccbench_version"]


def test_merge_command(tmp_path: Path) -> None:
    one, two = tmp_path / "task-0.jsonl", tmp_path / "sub" / "task-1.jsonl"
    two.parent.mkdir()
    for size in (8, 16):
        append_record(one, make_record(size_asked=size))
    for size in (16, 32):
        append_record(two, make_record(size_asked=size))
    out = tmp_path / "merged.jsonl"
    proc = subprocess.run([sys.executable, "-m", "ccbench", "merge", str(one), str(tmp_path / "sub"),
                           "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "4 records in, 3 written" in proc.stderr and "1 duplicates dropped" in proc.stderr
    merged = load_records(out)
    assert sorted(r.size_asked for r in merged) == [8, 16, 32]
    assert len({RecordKey.of(r) for r in merged}) == len(merged)


def test_merge_refuses_another_schema(tmp_path: Path) -> None:
    good, bad = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    append_record(good, make_record())
    data = json.loads(make_record().to_json())
    data["schema_version"] = 99
    bad.write_text(json.dumps(data) + "\n")
    out = tmp_path / "m.jsonl"
    proc = subprocess.run([sys.executable, "-m", "ccbench", "merge", str(good), str(bad), "-o",
                           str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "unknown record schema version 99" in proc.stderr
    assert proc.stderr.startswith("ccbench: error: ")
    assert not out.exists()


def test_cases_ask_only_for_what_produces_a_record() -> None:
    sweep = sweep_from_dict({"collectives": ["alltoall", "broadcast", "allreduce"],
                             "modes": ["out-of-place"], "sizes": "8-64",
                             "ranks_per_node": [4]})
    by_collective = {c.collective: c for c in sweep.cases()}
    # alltoall at 4 ranks of float32: 8 B is less than one element per rank
    assert by_collective["alltoall"].sizes == (16, 32, 64)
    assert by_collective["allreduce"].sizes == (8, 16, 32, 64)
    assert by_collective["broadcast"].inplace          # the benchmark's broadcast is in place
    tiny = sweep_from_dict({"collectives": ["alltoall"], "sizes": "8", "ranks_per_node": [4]})
    assert tiny.cases() == []


def test_skipped_sizes_count_as_complete(tmp_path: Path) -> None:
    from ccbench.sweep import completed, skipped_file, write_skipped

    sweep = sweep_from_dict({"results": str(tmp_path), "sizes": "8-32",
                             "modes": ["out-of-place"]})
    case = sweep.cases()[0]
    append_record(sweep.task_output(0), make_record(size_asked=8))
    write_skipped(sweep, 0, case, [16])
    entry = json.loads(skipped_file(sweep, 0).read_text())
    assert entry["version"] == 2 and entry["case"]["collective"] == "allreduce"
    done, skipped = completed(sweep)
    assert missing_sizes(case, done) == [32]
    assert skipped == {case.identity: {16}}
    assert len(load_records(tmp_path)) == 1             # the skipped file is not a results file


def test_version_1_state_files_still_read(tmp_path: Path) -> None:
    """A sweep folder written before state files had a version: cases as value lists."""
    from ccbench.sweep import completed, current_case_file, read_current_cases, skipped_file

    sweep = sweep_from_dict({"results": str(tmp_path), "sizes": "8-32",
                             "modes": ["out-of-place"]})
    case = sweep.cases()[0]
    tmp_path.mkdir(exist_ok=True)
    skipped_file(sweep, 0).write_text(json.dumps(
        {"case": ["allreduce", "gloo", "float32", "sum", False, 1, 2], "sizes": [16]}) + "\n")
    current_case_file(sweep, 0).write_text(json.dumps(
        [{"collective": "allreduce", "backend": "gloo", "dtype": "float32", "op": "sum",
          "inplace": False, "nodes": 1, "ranks_per_node": 2, "sizes": [8, 16, 32]}]) + "\n")
    done, skipped = completed(sweep)
    assert skipped == {case.identity: {16}} and missing_sizes(case, done) == [8, 32]
    assert read_current_cases(sweep, 0) == {case.identity}


def test_case_environment_drops_inherited_launcher_identity() -> None:
    # an MPI singleton (Intel MPI's MPI_Init without mpiexec) leaves MPI_LOCALRANKID and
    # MPI_LOCALNRANKS behind; under srun every rank of a case would then take itself for rank
    # 0 of a one-rank MPI world and write every record once per rank
    from ccbench.sweep import case_environment

    sweep = sweep_from_dict({"env": {"I_MPI_WAIT_MODE": "1", "MASTER_PORT": "29500"}})
    inherited = {"PATH": "/bin", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1",
                 "PMI_RANK": "0", "PMI_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0",
                 "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "PMIX_RANK": "0", "RANK": "1",
                 "WORLD_SIZE": "2", "CCBENCH_CONTROL": "h:1", "TORCHELASTIC_RUN_ID": "x",
                 "SLURM_JOB_ID": "7", "SLURM_NODELIST": "n1", "I_MPI_FABRICS": "shm"}
    assert case_environment(sweep, inherited) == {
        "PATH": "/bin", "SLURM_JOB_ID": "7", "SLURM_NODELIST": "n1", "I_MPI_FABRICS": "shm",
        "I_MPI_WAIT_MODE": "1", "MASTER_PORT": "29500"}   # the sweep's own env: is kept


def test_detect_launch_under_srun_ignores_what_case_environment_drops(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ccbench.run.launchers import detect_launch
    from ccbench.sweep import case_environment

    leaked = {"MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}
    srun_rank = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1",
                 "SLURM_STEP_ID": "0", "SLURM_TASKS_PER_NODE": "2"}
    env = {**case_environment(sweep_from_dict({}), {"PATH": "/bin", **leaked}), **srun_rank}
    for name in list(os.environ):
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    info = detect_launch()
    assert (info.launcher, info.rank, info.world_size) == ("srun", 1, 2)


def test_merge_command_refuses_a_run_id_conflict_unless_forced(tmp_path: Path) -> None:
    one, two = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    append_record(one, make_record(size_asked=8))
    append_record(two, make_record(size_asked=16, hosts=["other"]))
    out = tmp_path / "m.jsonl"
    argv = [sys.executable, "-m", "ccbench", "merge", str(one), str(two), "-o", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and not out.exists()
    assert proc.stderr.strip() == ("ccbench: error: refusing to merge: run abc: records differ in "
                                   "hosts; pass --force to merge anyway")
    proc = subprocess.run([*argv, "--force"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and len(load_records(out)) == 2
