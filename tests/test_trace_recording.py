"""The recording (ccbench.formats.capture) against a job written with torch's own libraries
(tests/jobs/torch_libs_job.py: DDP, ZeRO sharding, FSDP2 on a mesh, a GPipe pipeline
(torch.distributed.pipelining) on a sub-group, a P2POp ring, MoE
all_to_all_single, group send/recv, bf16/fp16 PROD/MIN/MAX, async, object and functional
collectives, calls before and after the trace window), at 3 and at 4 gloo ranks: every call
the job logged itself is read back with every fact right, replayed call for call on gloo and
mpi (a call a backend cannot run is skipped with its reason), and the 1024-rank prediction
from the recording is the prediction from the job's own log."""

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

from ccbench.formats import load_trace
from ccbench.formats.capture import capture_file
from ccbench.records import load_records
from tests.conftest import have_mpi, run_ccbench
from tests.trace_fixtures import ROOT, TORCH_TEARDOWN_ABORT

JOB = ROOT / "tests" / "jobs" / "torch_libs_job.py"
_FAMILY = {"alltoallv": "alltoall"}


def _record(out: Path, nprocs: int) -> Path:
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(nprocs), str(JOB), str(out), "--capture"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    if done.returncode != 0 and TORCH_TEARDOWN_ABORT in done.stderr:
        shutil.rmtree(out)
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


# CI runs the odd world (3 ranks); 4 ranks (FSDP2 as HSDP on a 2-D mesh) is a further cell
# (scripts/test-matrix.sh)
@pytest.fixture(scope="module", params=[3, pytest.param(4, marks=pytest.mark.matrix)])
def job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _record(tmp_path_factory.mktemp(f"libs{request.param}"), request.param)


def _truth(job: Path, rank: int) -> list[dict[str, Any]]:
    return list(json.loads((job / "calls" / f"rank{rank}.json").read_text()))


def _as_read(op: Any) -> dict[str, Any]:
    """An op as the trace reads it, in the job log's terms (global ranks)."""
    group = sorted((op.rank, op.peer)) if op.peer is not None else list(op.group.ranks)
    return {"op": _FAMILY.get(op.collective, op.collective), "group": group,
            "dtype": op.dtype if op.collective != "barrier" else None,
            "in_bytes": op.in_bytes, "out_bytes": op.out_bytes,
            "reduce_op": op.op if op.op_source else None,
            "root": op.group.ranks[op.root] if op.root is not None else None,
            "peer": op.peer, "in_splits": list(op.in_splits) or None,
            "out_splits": list(op.out_splits) or None}


def test_recording_reads_as_the_job_call_for_call(job: Path) -> None:
    trace = load_trace([job])
    for rank in range(trace.world_size):
        truth = _truth(job, rank)
        assert len(trace.ops[rank]) == len(truth), rank
        for op, call in zip(trace.ops[rank], truth, strict=True):
            read = _as_read(op)
            assert read == {k: call.get(k) for k in read}, (rank, op.node_id, call["by"])
            assert op.group_source == "named" and op.dur_us is not None
    libraries = {call["by"] for rank in range(trace.world_size) for call in _truth(job, rank)}
    assert libraries >= {"ddp", "fsdp", "job", "broadcast_object_list", "functional",
                         "pipelining"}


def test_calls_outside_the_window_are_recorded_and_passed_over(job: Path) -> None:
    """DDP's construction (the broadcast of the replica's state from rank 0, as DDP says it
    syncs), its warm-up steps and the MAX all-reduce come before the trace's window, one
    all-reduce after it: recorded, marked outside, and never matched to a traced call."""
    entries = [json.loads(line) for line in capture_file(job, 0).read_text().splitlines()]
    before = entries[:next(i for i, e in enumerate(entries) if e["traced"])]
    after = entries[max(i for i, e in enumerate(entries) if e["traced"]) + 1:]
    state = (64 * 256 + 256 + 256 * 64 + 64) * 4
    assert {"op": "broadcast", "root": 0, "in_bytes": state, "dtype": "float32"}.items() <= \
        next(e for e in before if e["in_bytes"] == state and e["op"] == "broadcast").items()
    assert [e["reduce_op"] for e in before if e["dtype"] == "float32" and e["in_bytes"] == 4] \
        == ["max"]
    assert [(e["op"], e["in_bytes"]) for e in after] == [("allreduce", 256)]
    assert sum(e["traced"] for e in entries) == len(_truth(job, 0))


def _key(collective: str, group: list[int], size: int, root: int | None,
         reduce_op: str | None, dtype: str | None, splits: Any) -> tuple[Any, ...]:
    return (collective, tuple(group), size, root, reduce_op, dtype, tuple(splits or ()))


def _truth_calls(job: Path, world: int) -> Counter[tuple[Any, ...]]:
    """Each call once, as its group's first rank (a message: its sender) logged it, with
    the size replay measures (ccbench.trace.ops.CommOp.size)."""
    calls: Counter[tuple[Any, ...]] = Counter()
    for rank in range(world):
        for call in _truth(job, rank):
            if call["op"] in ("send", "recv"):
                if call["op"] == "send":
                    calls[_key("sendrecv", call["group"], call["in_bytes"], None, None,
                               call["dtype"], None)] += 1
                continue
            if rank != call["group"][0]:
                continue
            collective = "alltoallv" if call["op"] == "alltoall" else call["op"]
            size = call["out_bytes"] if call["op"] == "allgather" else call["in_bytes"]
            calls[_key(collective, call["group"], size, call.get("root"),
                       call.get("reduce_op"), call["dtype"] or "uint8",
                       call.get("in_splits"))] += 1
    return calls


def _replayed(records: list[Any], skipped: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    out: Counter[tuple[Any, ...]] = Counter()
    for rec in records:
        tag = rec.method["trace"]
        root = tag["group"][rec.root] if rec.collective in ("broadcast", "reduce") else None
        out[_key(rec.collective, tag["group"], rec.size_used, root, rec.op,
                 tag["trace_dtype"], tag["in_splits"])] += 1
    for op in skipped:
        tag = op["extra"]
        out[_key(op["collective"], op["group"], op["size"], tag.get("root"), op["reduce_op"],
                 tag.get("trace_dtype"), tag.get("in_splits"))] += 1
    return out


def test_replay_matches_the_job_call_for_call(job: Path, tmp_path: Path) -> None:
    world = len(list(job.glob("rank*.json")))
    backends = "gloo,mpi" if have_mpi() else "gloo"
    out, summary = tmp_path / "rec.jsonl", tmp_path / "summary.json"
    done = run_ccbench("launch", "-n", str(world), "replay", str(job), "--backend", backends,
                       "--iters", "1", "--warmup", "0", "--sequence", "none", "-O", str(out),
                       "--summary", str(summary), timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    records = load_records(out)
    data = json.loads(summary.read_text())
    want = _truth_calls(job, world)
    for backend in data["backends"]:
        name = backend["backend"]
        skipped = [op for op in backend["ops"] if op["reason"]]
        mine = [r for r in records if r.backend == name]
        assert all(r.wrong == 0 for r in mine), name
        assert _replayed(mine, skipped) == want, name
        reasons = {op["reason"] for op in skipped}
        if name == "gloo":
            assert not skipped, reasons
        else:            # mpi: no bfloat16 reduction, no average; said on a skipped: line
            assert {(op["reduce_op"], op["extra"].get("trace_dtype")) for op in skipped} <= \
                {("prod", "bfloat16"), ("max", "bfloat16"), ("avg", "float32")}, reasons
            for reason in reasons:
                assert f"#   skipped: {reason}" in done.stdout


def test_replay_issues_each_call_once_as_the_job_did(job: Path, tmp_path: Path) -> None:
    """Beside the warm per-call medians, every measured call is also issued once, as the
    job issued it, and read as the job's own time is read (last issue to last completion on
    the host's clock): each has both times and both ratios are reported."""
    from ccbench.replay.rank import job_time

    world = len(list(job.glob("rank*.json")))
    summary = tmp_path / "summary.json"
    done = run_ccbench("launch", "-n", str(world), "replay", str(job), "--backend", "gloo",
                       "--iters", "1", "--warmup", "0", "--repeat", "1",
                       "--summary", str(summary), timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    gloo = json.loads(summary.read_text())["backends"][0]
    trace = load_trace([job])
    ops = [op for op in gloo["ops"] if op["time_us"] is not None]
    assert len(ops) == gloo["summary"]["measured"] > 0
    for op in ops:
        assert op["extra"]["as_issued_us"] > 0, op
        assert op["original_us"] == pytest.approx(
            job_time([o for o in trace.all_ops() if o.call == op["call"]]))
    for key in ("fidelity", "fidelity_as_issued"):
        assert gloo["summary"][key]["calls"] == len(ops), key
    assert "#   issued once as the job did / the job's own time" in done.stdout


def _ground_truth_trace(job: Path, tmp_path: Path, world: int) -> Path:
    """The job's execution trace with capture files written from the job's own log."""
    folder = tmp_path / "truth"
    folder.mkdir()
    for rank in range(world):
        shutil.copy(job / f"rank{rank}.json", folder)
        lines = [json.dumps({**call, "traced": True}) for call in _truth(job, rank)]
        capture_file(folder, rank).write_text("\n".join(lines) + "\n")
    return folder


def test_prediction_at_1024_ranks_is_the_ground_truths(job: Path, tmp_path: Path) -> None:
    from ccbench.model.synthetic import known_model
    from ccbench.model.tracesim import simulate_trace

    world = len(list(job.glob("rank*.json")))
    model = known_model(alpha=5e-6, beta=1e-10, gamma=2e-11)
    recorded = simulate_trace(model, load_trace([job]), 1024, "fat-tree:1024")
    truth = simulate_trace(model, load_trace([_ground_truth_trace(job, tmp_path, world)]),
                           1024, "fat-tree:1024")
    assert recorded["total_us"] == pytest.approx(truth["total_us"], rel=0.01)
    assert recorded["total_us"] > 0


def _op(collective: str, nbytes: int, **extra: Any) -> Any:
    from ccbench.trace.ops import CommOp

    return CommOp(rank=1, index=0, node_id=7, name=f"c10d::{collective}", collective=collective,
                  dtype="float32", elsize=4, in_bytes=nbytes,
                  out_bytes=0 if collective == "send" else nbytes, **extra)


def test_a_call_before_the_window_is_never_taken_for_a_traced_one(tmp_path: Path) -> None:
    """The same all-reduce before the observer started (MAX) and inside the window (SUM):
    the traced op takes the window's call, its reduction and its time."""
    from ccbench.formats.named import apply_capture

    before = {"op": "allreduce", "group": [0, 1], "in_bytes": 400, "out_bytes": 400,
              "reduce_op": "max", "traced": False, "start_us": 1.0, "dur_us": 9.0}
    inside = {**before, "reduce_op": "sum", "traced": True, "start_us": 50.0, "dur_us": 12.5}
    op = _op("allreduce", 400)
    assert apply_capture([op], [before, inside], 2, tmp_path / "c.jsonl") == 1
    assert (op.op, op.op_source, op.group.ranks, op.dur_us) == ("sum", "named", (0, 1), 12.5)


def test_a_message_on_a_sub_group_keeps_its_global_peer(tmp_path: Path) -> None:
    """A send on the group {1, 3} to its group rank 1: the trace says peer 1, the recording
    peer 3 (global); the message runs between ranks 1 and 3 on the world."""
    from ccbench.formats.named import apply_capture

    op = _op("send", 1200, peer=1)
    entry = {"op": "send", "group": [1, 3], "in_bytes": 1200, "out_bytes": 0, "peer": 3,
             "traced": True}
    assert apply_capture([op], [entry], 4, tmp_path / "c.jsonl") == 1
    assert (op.peer, op.group.ranks, op.group_source) == (3, (0, 1, 2, 3), "named")


def test_reductions_are_named_as_ccbench_names_them() -> None:
    import torch.distributed as dist

    from ccbench.collectives import OPS
    from ccbench.formats.capture import REDUCTIONS

    for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX"):
        assert REDUCTIONS[int(getattr(dist.ReduceOp.RedOpType, name))] in OPS


def test_the_jobs_time_of_a_call_runs_from_its_last_issue_to_its_last_completion(
        tmp_path: Path) -> None:
    """Three ranks issue one all-reduce at different times on the host's clock (rank 1
    last, computing longer before it): the job's own time of the call runs from rank 1's
    issue to the last completion, 40 us, not any rank's own wall time (rank 0 waited 80 us
    for rank 1; rank 1 itself saw 30 us) nor the least of them. A recording without the
    host's clock (per-rank times only) keeps the least of the ranks' own times."""
    from ccbench.formats.named import apply_capture
    from ccbench.replay.rank import call_time, job_time

    issued = {0: (1_000.0, 80.0), 1: (1_040.0, 30.0), 2: (1_010.0, 65.0)}
    ops = []
    for rank, (clock, dur) in issued.items():
        op = _op("allreduce", 400)
        op.rank = rank
        entry = {"op": "allreduce", "group": [0, 1, 2], "in_bytes": 400, "out_bytes": 400,
                 "traced": True, "clock_us": 1.7e15 + clock, "start_us": clock, "dur_us": dur}
        assert apply_capture([op], [entry], 3, tmp_path / f"c{rank}.jsonl") == 1
        ops.append(op)
    assert job_time(ops) == pytest.approx(1_080.0 - 1_040.0)
    assert call_time([(0.0, 10.0), (5.0, 12.0), (8.0, 11.0)]) == 4.0
    for op in ops:
        op.clock_us = None
    assert job_time(ops) == 30.0
