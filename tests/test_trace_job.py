"""A real 4-rank job (tests/jobs/parallel_job.py: tensor-, data- and pipeline-parallel groups,
an uneven MoE all-to-all, a broadcast from root 3, a MIN reduce-scatter, a world barrier)
traced on gloo, then read and replayed; every call is checked against the job's own list of
its calls, which the job writes while it runs (not read back from the trace)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ccbench.record import load_records
from ccbench.trace import load_trace
from tests.conftest import have_mpi, run_ccbench

JOB = Path(__file__).resolve().parent / "jobs" / "parallel_job.py"
_COLLECTIVE = {"all_reduce": "allreduce", "all_gather_into_tensor": "allgather",
               "all_to_all_single": "alltoallv", "send": "sendrecv", "recv": "sendrecv",
               "broadcast": "broadcast", "reduce_scatter_tensor": "reduce-scatter",
               "barrier": "barrier"}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The job's trace, its capture files and its own call list, from one torchrun run."""
    out = tmp_path_factory.mktemp("job")
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(JOB.parents[2])}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "4", str(JOB), str(out), "--capture"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


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
    settled = load_trace([folder], settle)
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
    _replay(job, backends, out, summary)
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
