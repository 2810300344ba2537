"""A real 4-rank job (tests/jobs/parallel_job.py: tensor-, data- and pipeline-parallel groups,
an uneven MoE all-to-all, a broadcast from root 3, a MIN reduce-scatter, a world barrier)
traced on gloo, then read and replayed; every call is checked against the job's own list of
its calls, which the job writes while it runs (not read back from the trace)."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ccbench.formats import load_trace
from ccbench.records import load_records
from tests.conftest import have_mpi, run_ccbench

_COLLECTIVE = {"all_reduce": "allreduce", "all_gather_into_tensor": "allgather",
               "all_to_all_single": "alltoallv", "send": "sendrecv", "recv": "sendrecv",
               "broadcast": "broadcast", "reduce_scatter_tensor": "reduce-scatter",
               "barrier": "barrier"}


@pytest.fixture
def job(parallel_job: Path) -> Path:
    return parallel_job


def _job_calls(job: Path) -> Counter[tuple[Any, ...]]:
    """Each call once, as its group's first rank wrote it: (collective, group, S, global
    root, reduction, send splits)."""
    calls: Counter[tuple[Any, ...]] = Counter()
    for rank in range(4):
        for call in json.loads((job / "calls" / f"rank{rank}.json").read_text()):
            if rank != call["group"][0]:
                continue
            size = call["out_bytes"] if call["op"] == "all_gather_into_tensor" else \
                max(call["in_bytes"], call["out_bytes"]) if call["op"] == "recv" else \
                call["in_bytes"]
            calls[(_COLLECTIVE[call["op"]], tuple(call["group"]), size, call.get("root"),
                   call.get("reduce_op"), tuple(call.get("in_splits") or ()))] += 1
    return calls


def _replayed(records: list[Any]) -> Counter[tuple[Any, ...]]:
    out: Counter[tuple[Any, ...]] = Counter()
    for rec in records:
        tag = rec.method["trace"]
        group = tuple(tag["group"])
        root = group[rec.root] if rec.collective == "broadcast" else None
        out[(rec.collective, group, rec.size_used, root, rec.op,
             tuple(tag["in_splits"] or ()))] += 1
    return out


def test_job_calls_are_what_the_trace_reads_with_its_capture(job: Path) -> None:
    trace = load_trace([job])
    assert all(op.group_source == "named" for op in trace.all_ops())
    want = _job_calls(job)
    assert sum(want.values()) == 10
    for rank in range(4):
        calls = json.loads((job / "calls" / f"rank{rank}.json").read_text())
        ops = trace.ops[rank]
        assert len(ops) == len(calls)
        for op, call in zip(ops, calls, strict=True):
            members = sorted((op.rank, op.peer)) if op.peer is not None else list(op.group.ranks)
            assert members == call["group"], (op.node_id, call)
            assert op.reduce_op == call.get("reduce_op")


def _without_capture(job: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "et-only"
    folder.mkdir()
    for rank in range(4):
        shutil.copy(job / f"rank{rank}.json", folder)
    return folder


def test_trace_alone_flags_every_group_it_cannot_know(job: Path, tmp_path: Path) -> None:
    """Without the capture files: an op whose group the trace cannot tell says 'ambiguous';
    every other op is on its true group; the user's --group settles the rest."""
    folder = _without_capture(job, tmp_path)
    trace = load_trace([folder])
    settle: dict[str, list[int]] = {}
    for rank in range(4):
        calls = json.loads((job / "calls" / f"rank{rank}.json").read_text())
        for op, call in zip(trace.ops[rank], calls, strict=True):
            members = sorted((op.rank, op.peer)) if op.peer is not None else list(op.group.ranks)
            if op.group_source != "ambiguous":
                assert members == call["group"], (rank, op.node_id, op.group_source)
            else:
                settle[f"{rank}:{op.node_id}"] = call["group"]
            if op.reduce_op:
                assert op.op_source == ""                # the trace does not say: assumed
    ambiguous = {op.collective for op in trace.all_ops() if op.group_source == "ambiguous"}
    assert ambiguous == {"allreduce", "allgather", "barrier"}
    assert any("ambiguous" in note for note in trace.notes)
    settled = load_trace([folder], group_settings=settle)
    for rank in range(4):
        calls = json.loads((job / "calls" / f"rank{rank}.json").read_text())
        for op, call in zip(settled.ops[rank], calls, strict=True):
            if op.peer is None:
                assert list(op.group.ranks) == call["group"]
    assert 1 + max(op.call for op in settled.all_ops()) == 10


def _replay(job: Path, backends: str, out: Path, summary: Path) -> str:
    done = run_ccbench("launch", "-n", "4", "replay", str(job), "--backend", backends,
                       "--iters", "2", "--repeat", "1", "-O", str(out), "--summary",
                       str(summary), timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("backends", ["gloo", "mpi,ring@mpi"])
def test_replay_matches_the_job_call_for_call(job: Path, tmp_path: Path, backends: str) -> None:
    if "mpi" in backends and not have_mpi():
        pytest.skip("mpiexec is not installed")
    out, summary = tmp_path / "rec.jsonl", tmp_path / "summary.json"
    out.write_text('{"torn": ')           # a run killed mid-write left half a line
    _replay(job, backends, out, summary)
    assert (tmp_path / "rec.jsonl.torn").read_text() == '{"torn": \n'     # moved aside once
    records = load_records(out)
    want = _job_calls(job)
    data = json.loads(summary.read_text())
    for name in backends.split(","):
        mine = [r for r in records if r.backend == name]
        assert all(r.wrong == 0 for r in mine), name
        ops = next(b for b in data["backends"] if b["backend"] == name)["ops"]
        assert len(ops) == 10
        for op in ops:          # every call measured or skipped with a reason, never both
            assert (op["time_us"] is not None) != bool(op["reason"]), (name, op)
        if name == "ring@mpi":  # no uneven all-to-all schedule: said, not a traceback
            skipped = {op["collective"] for op in ops if op["reason"]}
            assert skipped == {"alltoallv"}, ops
            assert len(mine) == 9
            continue
        assert _replayed(mine) == want, name          # every call, one record each
        assert all(op["group_source"] == "named" for op in ops)
    _same_numbers_as_the_report(records, data)


def _same_numbers_as_the_report(records: list[Any], data: dict[str, Any]) -> None:
    """The summary's per-backend time and speed-up are those report's figures draw."""
    from ccbench.report.traces import breakdown, latest_runs, timeline

    runs = next(iter(latest_runs(records).values()))
    _, per = breakdown(runs)
    for backend in data["backends"]:
        name, summary = backend["backend"], backend["summary"]
        assert sum(per[name].values()) == pytest.approx(summary["total_time_us"], rel=1e-9)
        assert max(s["end"] for s in timeline(runs[name])) == pytest.approx(
            summary["schedule_us"], rel=1e-9)
    calls = {b: {r.method["trace"]["call"]: r.time_us["median"] for r in recs}
             for b, recs in runs.items()}
    common = set.intersection(*(set(c) for c in calls.values()))
    for entry in data["speedups"]:
        totals = {b: sum(c[k] for k in common) for b, c in calls.items()}
        assert entry["times"] == pytest.approx(totals[entry["other"]] / totals[entry["fastest"]])
        assert entry["statistic"] == "sum of per-call medians"
        assert entry["calls"] == len(common)


def _with_param_comms(job: Path, tmp_path: Path) -> Path:
    """The job's trace as an NCCL trace has it: a record_param_comms child under each c10d
    op naming its process group (pg_name from the trace's own process-group table)."""
    folder = tmp_path / "named"
    folder.mkdir()
    for rank in range(4):
        data = json.loads((job / f"rank{rank}.json").read_text())
        table = next(n for n in data["nodes"] if n["name"] == "## process_group:init ##")
        groups = json.loads(table["inputs"]["values"][0])
        pg_of = {tuple(g["ranks"]) or tuple(range(4)): g["pg_name"] for g in groups}
        calls = json.loads((job / "calls" / f"rank{rank}.json").read_text())
        comm = [n for n in data["nodes"] if n["name"].startswith("c10d::")]
        next_id = 1 + max(int(n["id"]) for n in data["nodes"])
        for node, call in zip(comm, calls, strict=True):
            group = tuple(range(4)) if call["op"] in ("send", "recv") else tuple(call["group"])
            data["nodes"].append({"id": next_id, "name": "record_param_comms",
                                  "ctrl_deps": node["id"], "inputs": {"values": [],
                                                                      "types": []},
                                  "attrs": [{"name": "pg_name", "type": "string",
                                             "value": pg_of[group]}]})
            next_id += 1
        (folder / f"rank{rank}.json").write_text(json.dumps(data))
    return folder


def test_named_groups_keep_world_ops_on_the_world(job: Path, tmp_path: Path) -> None:
    """pg_name '0' is the world: its ops stay on the group the replay splits as the world."""
    trace = load_trace([_with_param_comms(job, tmp_path)])
    world = trace.groups[0]
    assert world.ranks == (0, 1, 2, 3)
    assert all(op.group_source == "named" for op in trace.all_ops() if op.peer is None)
    on_world = [op for op in trace.all_ops() if op.group == world]
    assert {op.collective for op in on_world} >= {"alltoallv", "broadcast", "reduce-scatter",
                                                  "barrier"}
    assert all(op.group in trace.groups for op in trace.all_ops())
    assert 1 + max(op.call for op in trace.all_ops()) == 10


def test_no_communication_is_refused(job: Path, tmp_path: Path) -> None:
    for rank in range(4):
        data = json.loads((job / f"rank{rank}.json").read_text())
        data["nodes"] = [n for n in data["nodes"] if not n["name"].startswith("c10d::")]
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(data))
    done = run_ccbench("replay", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"ccbench: error: {tmp_path / 'rank0.json'}: no communication ops in the trace "
        f"(4 rank files): nothing to replay"]


def test_uneven_all_to_all_costed_exported_and_read_back(job: Path, tmp_path: Path) -> None:
    """simulate --trace prices the MoE dispatch (as the even all-to-all of its largest
    block), the ASTRA-sim export carries it, and the export read back holds every op."""
    from ccbench.formats.astra_trace import export_astra_trace
    from ccbench.model.synthetic import known_model
    from ccbench.model.tracesim import simulate_trace

    model = known_model(alpha=5e-6, beta=1e-10, gamma=2e-11)
    trace = load_trace([job])
    out = simulate_trace(model, trace, 1024, "fat-tree:1024")
    rows = {row["collective"]: row for row in out["ops"]}
    block = max(max(op.in_splits + op.out_splits) for op in trace.all_ops()
                if op.collective == "alltoallv")
    assert rows["alltoallv"]["size"] == block * 4 * 1024 and rows["alltoallv"]["group_size"] \
        == 1024
    assert any("largest per-peer block" in f for f in rows["alltoallv"]["flags"])
    man = export_astra_trace(model, trace, tmp_path, 64, "switch:64")
    back = load_trace([tmp_path])
    assert {op.collective for op in back.all_ops()} >= {"alltoall", "broadcast", "barrier"}
    assert simulate_trace(model, back, 64, "switch:64")["total_us"] == pytest.approx(
        man["workload"]["simulate_total_us"], rel=0.005)


def test_export_agrees_with_the_astra_sim_binary(job: Path, tmp_path: Path) -> None:
    from conftest import need_astra_sim

    from ccbench.formats.astra import run_astra
    from ccbench.formats.astra_trace import export_astra_trace
    from ccbench.model.synthetic import known_model
    from ccbench.model.tracesim import simulate_trace

    need_astra_sim("AstraSim_Analytical_Congestion_Unaware")
    model = known_model(alpha=5e-6, beta=1e-10, gamma=2e-11)
    man = export_astra_trace(model, load_trace([job]), tmp_path, 64, "switch:64")
    on_export = simulate_trace(model, load_trace([tmp_path]), 64, "switch:64")["total_us"]
    assert run_astra(man) * 1e6 == pytest.approx(on_export, rel=0.01)


def test_capture_module_wraps_an_unchanged_job(tmp_path: Path) -> None:
    """`torchrun -m ccbench.formats.capture -o DIR -- job.py`: the job as written (no capture
    in it) gets its capture files, and the trace reads with every group named."""
    import os
    import subprocess
    import sys

    from tests.trace_fixtures import JOB, ROOT

    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "4", "-m", "ccbench.formats.capture", "-o",
                           str(tmp_path), "--", str(JOB), str(tmp_path)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    trace = load_trace([tmp_path])
    assert all(op.group_source == "named" for op in trace.all_ops())
    assert _replayed_from_trace(trace) == _job_calls(tmp_path)


def _replayed_from_trace(trace: Any) -> Counter[tuple[Any, ...]]:
    """The calls as the trace reads them, in _job_calls' terms."""
    out: Counter[tuple[Any, ...]] = Counter()
    for op in trace.all_ops():
        group = tuple(sorted((op.rank, op.peer))) if op.peer is not None else op.group.ranks
        if op.rank != group[0]:
            continue
        collective = "sendrecv" if op.collective in ("send", "recv") else op.collective
        root = group[op.root] if op.collective == "broadcast" else None
        out[(collective, group, op.size, root, op.reduce_op if op.op_source else None,
             tuple(op.in_splits) if op.collective == "alltoallv" else ())] += 1
    return out


def test_capture_of_a_missing_script_is_one_line() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "ccbench.formats.capture", "-o", "x", "--",
                           "no-such-job.py"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == "ccbench: error: no such job script: 'no-such-job.py'"
