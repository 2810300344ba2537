"""A plain execution trace (no capture file) of a job with process groups: which group each
call ran on, as far as the trace can tell, and what the trace cannot tell.

The traces are written as torch 2.13's ExecutionTraceObserver writes a gloo job's
(tests/et_synth.py): each call's group an '<Object>', a send's peer a rank of its group.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ccbench.formats import load_trace
from ccbench.model.synthetic import known_model
from ccbench.model.tracesim import simulate_trace
from ccbench.trace.groups import other_reading
from tests.conftest import run_ccbench, run_ccbench_forked
from tests.et_synth import write_et
from tests.trace_fixtures import TORCH_TEARDOWN_ABORT

MODEL = known_model(alpha=5e-6, beta=1e-10, gamma=2e-11)
TP = [[0, 1], [2, 3]]           # tensor-parallel pairs
DP = [[0, 2], [1, 3]]           # data-parallel pairs


def _two_d(folder: Path) -> Path:
    """4 ranks, tp pairs x dp pairs: a tp all-reduce of a size every rank has (the trace
    cannot tell it from a world call), a dp all-reduce whose size differs by tp rank (only
    the dp pairs fit), world calls (all-reduce, broadcast from 1, barrier) and a send on each
    tp pair (peer 1 of the pair: global 1 and 3)."""
    calls = []
    for rank in range(4):
        calls.append([
            {"op": "allreduce", "count": 64},                        # tp, alike everywhere
            {"op": "allreduce", "count": 100 + 28 * (rank % 2)},     # dp: differs by tp rank
            {"op": "allreduce", "count": 16},                        # world
            {"op": "broadcast", "count": 16, "root": 1},             # world, root 1
            {"op": "send" if rank % 2 == 0 else "recv", "count": 8, "peer": 1 - rank % 2},
            {"op": "barrier"}])
    return write_et(folder, calls, TP + DP)


def test_world_calls_stay_world_calls_and_group_peers_become_global(tmp_path: Path) -> None:
    trace = load_trace([_two_d(tmp_path / "t")])
    for rank, ops in enumerate(trace.ops):
        got = [(op.collective, op.group.ranks if op.group else None, op.group_source)
               for op in ops]
        world = (0, 1, 2, 3)
        assert got[0] == ("allreduce", world, "ambiguous")       # the trace cannot tell
        assert got[1] == ("allreduce", tuple(DP[rank % 2]), "inferred")
        assert got[2] == ("allreduce", world, "ambiguous")
        assert got[3] == ("broadcast", world, "ambiguous") and ops[3].root == 1
        assert got[5] == ("barrier", world, "ambiguous")
        # the send's peer is rank 1 of the rank's tp pair: global 1 (pair 0) and 3 (pair 1)
        assert ops[4].peer == (rank ^ 1) and ops[4].group_source == "inferred"
    # no invented calls: one call per world op, one per pair for the dp all-reduce
    assert len({op.call for op in trace.all_ops()}) == 1 + 2 + 1 + 1 + 2 + 1
    assert any("4 of 8 calls' process groups are ambiguous" in n for n in trace.notes)


def _reading(trace) -> list[list[tuple[object, ...]]]:  # noqa: ANN001
    return [[(op.collective, op.group.ranks if op.group else None, op.group_source, op.root,
              op.peer, op.call) for op in ops] for ops in trace.ops]


def test_torch_writes_the_2d_job_as_the_synthetic_trace(tmp_path: Path) -> None:
    """The same job recorded by torch's ExecutionTraceObserver reads call for call as the
    synthetic trace (whose format the other tests rely on)."""
    job = Path(__file__).with_name("torch_2d_job.py")
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "4", str(job), str(tmp_path / "real")]
    (tmp_path / "real").mkdir()
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    if done.returncode != 0 and TORCH_TEARDOWN_ABORT in done.stderr:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    real = load_trace([tmp_path / "real"])
    assert _reading(real) == _reading(load_trace([_two_d(tmp_path / "synthetic")]))


def test_the_other_reading_puts_them_on_the_smallest_groups(tmp_path: Path) -> None:
    trace = load_trace([_two_d(tmp_path / "t")])
    other = other_reading(trace)
    assert other is not None
    for rank, ops in enumerate(other.ops):
        sizes = [op.group.size for op in ops if op.collective != "send" and op.group]
        assert sizes[:4] == [2, 2, 2, 2] and sizes[-1] == 2, rank
    # the reading of the trace itself is untouched
    assert trace.ops[0][0].group is not None and trace.ops[0][0].group.size == 4
    out = simulate_trace(MODEL, trace, 64, "switch:64")
    alt = simulate_trace(MODEL, other, 64, "switch:64", both_readings=False)
    assert out["uncertain_calls"] == 4 and alt["other_reading"] is None
    assert out["other_reading"]["total_us"] == pytest.approx(alt["total_us"], rel=1e-12)
    assert out["other_reading"]["total_us"] < out["total_us"]
    # which ops: flagged where they are priced
    flagged = [r["node_id"] for r in out["ops"] if any("group uncertain" in f
                                                       for f in r["flags"])]
    assert flagged == [10, 14, 16, 20]


def test_odd_world_lockstep_call_is_one_world_call(tmp_path: Path) -> None:
    """3 ranks and a group {0, 1}: an all-reduce every rank makes alike is one world call;
    one only ranks 0 and 1 make runs on {0, 1}, inferred."""
    calls = [[{"op": "allreduce", "count": 12}] + ([{"op": "allreduce", "count": 6}]
                                                    if rank < 2 else [])
             for rank in range(3)]
    trace = load_trace([write_et(tmp_path / "t", calls, [[0, 1]])])
    assert [op.group.ranks for op in trace.ops[2]] == [(0, 1, 2)]
    assert trace.ops[0][0].group_source == "ambiguous"
    assert (trace.ops[0][1].group.ranks, trace.ops[0][1].group_source) == ((0, 1), "inferred")
    assert len({op.call for op in trace.all_ops()}) == 2


def test_a_scatter_whose_list_fits_the_world_only_is_inferred(tmp_path: Path) -> None:
    """The root's list of a scatter (one tensor per member) says the group's size."""
    calls = [[{"op": "scatter", "count": 4, "root": 1, "blocks": 4 if rank == 1 else 0}]
             for rank in range(4)]
    trace = load_trace([write_et(tmp_path / "t", calls, TP + DP)])
    assert {(op.group.ranks, op.group_source, op.root) for op in trace.all_ops()} == \
        {((0, 1, 2, 3), "inferred", 1)}
    assert trace.ops[1][0].size == 4 * 4 * 4


def test_a_send_to_a_rank_no_group_has_is_one_line(tmp_path: Path) -> None:
    folder = write_et(tmp_path / "t", [[{"op": "send", "count": 4, "peer": 5}],
                                       [{"op": "recv", "count": 4, "peer": 0}]])
    model = tmp_path / "model.json"
    model.write_text(json.dumps(MODEL))
    done = run_ccbench_forked("simulate", str(model), "--trace", str(folder))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "send peer 5" in done.stderr and "node 10" in done.stderr


def test_simulate_and_export_take_the_group_settings(tmp_path: Path) -> None:
    folder = _two_d(tmp_path / "t")
    model = tmp_path / "model.json"
    model.write_text(json.dumps(MODEL))
    plain = run_ccbench_forked("simulate", str(model), "--trace", str(folder), "--ranks", "8",
                               "--topology", "switch:8")
    assert plain.returncode == 0, plain.stderr
    # one count, one definition: the note's, priced on 4 rows, and the JSON's
    assert "# uncertain: 4 calls' process groups are ambiguous (4 priced, on the 4 rows " \
        "flagged 'group uncertain')" in plain.stdout
    assert "# note: 4 of 8 calls' process groups are ambiguous" in plain.stdout
    # the tp all-reduce (node 10) on each pair, from a file and from --group
    groups = tmp_path / "groups.json"
    groups.write_text(json.dumps({"10": [0, 1], "2:10": [2, 3], "3:10": [2, 3]}))
    settled = run_ccbench_forked("simulate", str(model), "--trace", str(folder), "--ranks",
                                 "8", "--topology", "switch:8", "--groups-file", str(groups),
                                 "--format", "json")
    assert settled.returncode == 0, settled.stderr
    out = json.loads(settled.stdout)
    # settling one tp all-reduce leaves 3, in the JSON and in the note alike
    assert out["uncertain_calls"] == 3 and out["uncertain_priced_calls"] == 3
    assert any(n.startswith("3 of ") for n in out["notes"]), out["notes"]
    first = next(r for r in out["ops"] if r["node_id"] == 10)
    assert first["group_shape"] == "tile" and first["group_size"] == 2
    export = run_ccbench_forked("export", "astra-sim", str(model), "--trace", str(folder),
                                "--ranks", "8", "-o", str(tmp_path / "astra"),
                                "--group", "0:10=0,1", "--group", "1:10=0,1",
                                "--group", "2:10=2,3", "--group", "3:10=2,3")
    assert export.returncode == 0, export.stderr
    manifest = json.loads((tmp_path / "astra" / "ccbench-export.json").read_text())
    assert manifest["workload"]["simulate_total_us"] == pytest.approx(out["total_us"])
    for command in (["simulate", str(model), "allreduce", "--group", "10=0,1"],
                    ["export", "astra-sim", str(model), "-o", str(tmp_path / "x"),
                     "--groups-file", str(groups)]):
        done = run_ccbench_forked(*command)
        assert done.returncode == 2 and "give --trace" in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1


def test_replay_sends_on_a_sub_group_to_its_own_rank(tmp_path: Path) -> None:
    """A send named on a sub-group (--group, or a capture file) replays on that group's
    communicator with the peer as that communicator numbers it."""
    folder = _two_d(tmp_path / "t")
    summary = tmp_path / "s.json"
    done = run_ccbench("launch", "-n", "4", "replay", str(folder), "--backend", "gloo",
                       "--iters", "2", "--repeat", "1", "--summary", str(summary),
                       "--group", "2:18=2,3", "--group", "3:18=2,3", "--timeout", "120",
                       timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ops = json.loads(summary.read_text())["backends"][0]["ops"]
    sends = [op for op in ops if op["collective"] == "sendrecv"]
    assert sorted(tuple(op["group"]) for op in sends) == [(0, 1), (2, 3)]
    assert all(op["wrong"] == 0 and op["time_us"] > 0 for op in sends)
    assert "uncertain: 4 calls' process groups are ambiguous" in done.stdout
    assert json.loads(summary.read_text())["backends"][0]["summary"]["uncertain_calls"] == 4


def test_a_call_is_ambiguous_when_any_rank_s_op_is() -> None:
    """A send matched on one side only (its receive fits two groups) is one ambiguous call,
    for the note, replay and simulate alike."""
    from ccbench.trace.groups import ambiguous_calls, uncertain_calls
    from ccbench.trace.ops import CommOp, Group, Trace

    world = Group("world", (0, 1))
    ops = [[CommOp(rank=r, index=0, node_id=10, name=name, collective=coll, dtype="float32",
                   elsize=4, in_bytes=8, out_bytes=8, peer=1 - r, group=world, call=0,
                   group_source=source)]
           for r, (name, coll, source) in enumerate((("c10d::send", "send", "inferred"),
                                                     ("c10d::recv_", "recv", "ambiguous")))]
    trace = Trace(kind="pytorch-et", paths=["p2p"], world_size=2, ops=ops, groups=[world])
    assert ambiguous_calls(trace) == {0} and uncertain_calls(trace) == 1
