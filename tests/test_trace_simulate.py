"""`ccbench simulate MODEL --trace TRACE`: traces recorded by real PyTorch runs (gloo,
ExecutionTraceObserver) predicted at 1024 ranks; known answers from single-collective
`simulate` predictions of the same ops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ccbench.formats import load_trace
from ccbench.model.simulate import simulate
from ccbench.model.synthetic import known_model
from ccbench.model.tracesim import simulate_trace
from tests.conftest import run_ccbench

MODEL = known_model(alpha=5e-6, beta=1e-10, gamma=2e-11)


def _single(collective: str, ranks: int, topology: str, size: int) -> float:
    """The time of one collective from plain `simulate` (a barrier: a zero-byte allreduce)."""
    coll = "allreduce" if collective == "barrier" else collective
    return simulate(MODEL, coll, ranks, topology, [size])["rows"][0]["time_us"]


def test_ddp_at_1024_ranks_is_the_sum_of_single_collective_predictions(traces4: Path) -> None:
    trace = load_trace([traces4 / "ddp"])
    out = simulate_trace(MODEL, trace, 1024, "fat-tree:1024")
    # every call of the trace, in order, none invented: DDP's calls all run on the world
    recorded = [(op.collective, op.dtype) for op in trace.ops[0]]
    assert [(r["collective"], r["dtype"]) for r in out["ops"]] == recorded
    assert [r["calls"] for r in out["ops"]] == [[op.call] for op in trace.ops[0]]
    total = 0.0
    for row, op in zip(out["ops"], trace.ops[0], strict=True):
        assert row["group_shape"] == "world" and row["group_size"] == 1024
        # world calls keep each rank's bytes: an all-gather's output grows with the ranks
        want = op.in_bytes * 1024 if op.collective == "allgather" else op.size
        assert row["size"] == want
        expected = _single(op.collective, 1024, "fat-tree:1024", row["size"])
        assert row["time_us"] == pytest.approx(expected, rel=1e-12)
        total += expected
    assert out["total_us"] == pytest.approx(total, rel=1e-12)
    assert set(out["per_rank_us"]) == {"0", "1", "2", "3"}
    assert any("extrapolated 256x in ranks" in f for f in out["flags"])
    assert "allreduce" in out["fits"] and out["fits"]["allreduce"]["algorithm"] == "ring"


def test_process_groups_are_re_tiled_and_priced_per_group(traces4: Path) -> None:
    trace = load_trace([traces4 / "groups"])
    out = simulate_trace(MODEL, trace, 1024, "fat-tree:1024:leaf=16")
    ops = out["ops"]
    tiles = [r for r in ops if r["group_shape"] == "tile"]
    strided = [r for r in ops if r["group_shape"] == "stride"]
    # tensor-parallel all-gathers of groups [0,1] and [2,3] are one step on 512 pairs; their
    # all-reduces (each pair's activations of its own size) one step on the 256 copies of
    # each pair
    gathers = [r for r in tiles if r["collective"] == "allgather"]
    assert len(gathers) == 2 and all(r["group_copies"] == 512 for r in gathers)
    assert all(sorted(r["recorded_ranks"]) == [0, 1, 2, 3] for r in gathers)
    reduces = [r for r in tiles if r["collective"] == "allreduce"]
    assert len(reduces) == 4 and all(r["group_copies"] == 256 for r in reduces)
    assert sorted(tuple(r["recorded_ranks"]) for r in reduces) == [(0, 1)] * 2 + [(2, 3)] * 2
    assert all(r["group_size"] == 2 for r in tiles)
    # data-parallel allreduce: even and odd ranks carry different gradients (uneven shard)
    assert {r["group_size"] for r in strided} == {512} and len(strided) == 4
    sizes = {tuple(r["recorded_ranks"]): r["size"] for r in strided}
    assert sizes[(0, 2)] == 4096 * 4 and sizes[(1, 3)] == (4096 + 256) * 4
    assert all(r["group_copies"] == 1 and r["group_stride"] == 2 for r in strided)
    # a pair inside one leaf switch costs what two ranks on one switch cost
    for r in tiles:
        assert r["time_us"] == pytest.approx(_single(r["collective"], 2, "switch:2", r["size"]),
                                             rel=1e-12)
    # every rank's total is the sum of its own ops; the odd ranks' bigger shard is slower
    for rank in range(4):
        mine = sum(r["time_us"] for r in ops if rank in r["recorded_ranks"])
        assert out["per_rank_us"][str(rank)] == pytest.approx(mine, rel=1e-12)
    assert out["per_rank_us"]["1"] > out["per_rank_us"]["0"]
    assert out["total_us"] == max(out["per_rank_us"].values()) and out["slowest_rank"] in (1, 3)


def test_replay_equals_formula_without_contention_and_is_slower_with_it(traces4: Path) -> None:
    trace = load_trace([traces4 / "groups"])
    flat = simulate_trace(MODEL, trace, 64, "switch:64", "analytical")
    rep = simulate_trace(MODEL, trace, 64, "switch:64", "replay")
    assert rep["total_us"] == pytest.approx(flat["total_us"], rel=1e-6)
    moe = load_trace([traces4 / "moe"])
    flat = simulate_trace(MODEL, moe, 1024, "fat-tree:1024:oversub=4")
    rep = simulate_trace(MODEL, moe, 1024, "fat-tree:1024:oversub=4", "replay")
    # all-to-all through an oversubscribed spine: the flows share its links
    assert rep["total_us"] > flat["total_us"] * 1.05
    assert any(r["engine"] == "rounds" for r in rep["ops"])
    # the uneven all-to-all: priced as the even one of its largest block, block per peer kept
    assert flat["not_modelled"] == []
    uneven = next(r for r in flat["ops"] if r["collective"] == "alltoallv")
    block = max(max(op.in_splits + op.out_splits) for op in moe.all_ops()
                if op.collective == "alltoallv")
    assert uneven["size"] == block * 4 * 1024 and uneven["fit_collective"] == "alltoall"


def test_ops_without_a_formula_are_listed_not_invented(traces4: Path) -> None:
    out = simulate_trace(MODEL, load_trace([traces4 / "p2p"]), 8, "switch:8")
    assert [r["collective"] for r in out["ops"]] == ["broadcast", "reduce", "gather",
                                                     "scatter", "barrier", "allgather"]
    # the send and its receive, each listed as what it is
    reasons = {s["reason"]: s["recorded_ops"] for s in out["not_modelled"]}
    assert reasons == {"send: point-to-point ops are not modelled": 1,
                       "recv: point-to-point ops are not modelled": 1}


def test_cli_table_and_json_at_1024_ranks(traces4: Path, tmp_path: Path) -> None:
    model = tmp_path / "model.json"
    model.write_text(json.dumps(MODEL))
    done = run_ccbench("simulate", str(model), "--trace", str(traces4 / "groups"),
                       "--topology", "fat-tree:1024", "--fidelity", "replay")
    assert done.returncode == 0, done.stderr
    assert "recorded at 4 ranks" in done.stdout and "512x2 consecutive" in done.stdout
    assert "# total" in done.stdout and "fit across world sizes" in done.stdout
    done = run_ccbench("simulate", str(model), "--trace", str(traces4 / "ddp"), "--ranks", "1024",
                       "--topology", "fat-tree:1024", "--format", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["world_size"] == 1024 and data["recorded_world_size"] == 4
    assert data["total_us"] == pytest.approx(sum(r["time_us"] for r in data["ops"]))


@pytest.mark.parametrize("args,needle", [
    (["allreduce", "--trace", "{trace}"], "not both"),
    (["--trace", "{trace}", "--fidelity", "both"], "--fidelity both"),
    (["--trace", "{trace}", "--sizes", "1K"], "with --trace"),
    (["--trace", "/nonexistent/trace"], "no such trace file"),
    ([], "give a collective"),
])
def test_cli_bad_input_is_one_line(traces4: Path, tmp_path: Path, args: list[str],
                                   needle: str) -> None:
    model = tmp_path / "model.json"
    model.write_text(json.dumps(MODEL))
    args = [a.replace("{trace}", str(traces4 / "ddp")) for a in args]
    done = run_ccbench("simulate", str(model), *args, "--topology", "switch:8")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ccbench: error:") and needle in lines[0]


@pytest.mark.parametrize("workload", ["tp", "groups"])
def test_chakra_export_reads_back_as_the_same_trace(traces4: Path, tmp_path: Path,
                                                    workload: str) -> None:
    """export astra-sim --trace writes Chakra ET + comm_groups.json; read back as a trace
    (all-gather shards and reduce-scatter inputs sized by their groups, pg_name -> group)
    it predicts what the PyTorch trace predicts, the ops written as compute nodes (broadcast)
    included: they carry the op they stand for."""
    from ccbench.formats.astra_trace import export_astra_trace

    trace = load_trace([traces4 / workload])
    export_astra_trace(MODEL, trace, tmp_path, 8, "switch:8")
    chakra = load_trace([tmp_path])
    assert chakra.kind == "chakra-et" and chakra.world_size == 8
    back = simulate_trace(MODEL, chakra, 8, "switch:8")
    orig = simulate_trace(MODEL, trace, 8, "switch:8")
    assert [(r["collective"], r["size"], r["group_size"], r["group_copies"])
            for r in back["ops"]] == \
        [(r["collective"], r["size"], r["group_size"], r["group_copies"]) for r in orig["ops"]]
    assert back["total_us"] == pytest.approx(orig["total_us"], rel=1e-9)


def test_replay_fidelity_lists_a_gather_as_not_modelled_and_prices_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No algorithms/ schedule runs a gather: --fidelity replay lists it (found before any
    schedule runs) and prices the all-reduce; the analytical path prices both, flagged."""
    import ccbench.model.tracesim as tracesim
    from tests.trace_fixtures import record_small_job

    trace = load_trace([record_small_job("gather_job.py", 2, tmp_path / "gather")])
    replayed: list[str] = []
    real = tracesim.replay_collective

    def spy(collective: str, *args: object, **kwargs: object) -> object:
        replayed.append(collective)
        return real(collective, *args, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setattr(tracesim, "replay_collective", spy)
    out = simulate_trace(MODEL, trace, 64, "fat-tree:64", fidelity="replay")
    assert [r["collective"] for r in out["ops"]] == ["allreduce"] and replayed == ["allreduce"]
    [skipped] = out["not_modelled"]
    assert skipped["reason"].startswith("gather: no algorithms/ schedule") \
        and skipped["recorded_ops"] == 2
    assert out["total_us"] == pytest.approx(out["ops"][0]["time_us"])
    analytical = simulate_trace(MODEL, trace, 64, "fat-tree:64")
    assert [r["collective"] for r in analytical["ops"]] == ["allreduce", "gather"]
    assert analytical["not_modelled"] == []


def test_uneven_mapping_is_warned(tmp_path: Path) -> None:
    """1024 is no multiple of 3, and {0, 2} of 3 ranks has no copies: both said on stderr,
    the group's op listed as not modelled, the world all-reduce priced."""
    from tests.trace_fixtures import record_small_job

    folder = record_small_job("subgroup_job.py", 3, tmp_path / "sub")
    out = simulate_trace(MODEL, load_trace([folder]), 1024, "fat-tree:1024")
    assert [r["group_shape"] for r in out["ops"]] == ["world"]
    [skipped] = out["not_modelled"]
    assert "group [0, 2] is not one of the groups" in skipped["reason"]
    assert len(out["warnings"]) == 2 and "not a multiple of the recorded 3" in out["warnings"][0]
    model = tmp_path / "model.json"
    model.write_text(json.dumps(MODEL))
    done = run_ccbench("simulate", str(model), "--trace", str(folder), "--topology",
                       "fat-tree:1024")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("ccbench: warning:") == 2


def _ring_trace(world: int) -> object:
    """A synthetic trace: every rank sends to the next and receives from the one before, as
    one exchange (batch_isend_irecv), then a world all-reduce."""
    from ccbench.trace.groups import match_calls
    from ccbench.trace.ops import CommOp, Group, Trace

    whole = Group("world", tuple(range(world)))
    ops = [[CommOp(rank=r, index=0, node_id=10, name="c10d::send", collective="send",
                   dtype="float32", elsize=4, in_bytes=64, out_bytes=0, peer=(r + 1) % world),
            CommOp(rank=r, index=1, node_id=11, name="c10d::recv_", collective="recv",
                   dtype="float32", elsize=4, in_bytes=0, out_bytes=64, peer=(r - 1) % world),
            CommOp(rank=r, index=2, node_id=12, name="c10d::allreduce_",
                   collective="allreduce", dtype="float32", elsize=4, in_bytes=64,
                   out_bytes=64)] for r in range(world)]
    match_calls(ops, [whole])
    return Trace(kind="pytorch-et", paths=["ring"], world_size=world, ops=ops, groups=[whole],
                 schema="synthetic")


def test_exchange_sends_and_receives_are_listed_each_as_its_own_kind() -> None:
    from ccbench.model.tracesim import plan_trace

    ops, skipped = plan_trace(_ring_trace(4), 8)          # type: ignore[arg-type]
    assert skipped == {"send: point-to-point ops are not modelled": 4,
                       "recv: point-to-point ops are not modelled": 4}
    assert [op.collective for op in ops] == ["allreduce"]


@pytest.mark.parametrize("algorithm, world_engine, group_engine", [
    ("ring", "events", "formula"), ("tree", "rounds", "rounds")])
def test_replay_fidelity_of_reduce_as_docs_replay_md_says(algorithm: str, world_engine: str,
                                                          group_engine: str) -> None:
    """--fidelity replay: a world reduce runs the algorithms/ schedule; a reduce on process
    groups (every copy at once) needs a round schedule, else keeps the formula's time,
    flagged (docs/replay.md's table)."""
    from ccbench.trace.groups import match_calls
    from ccbench.trace.ops import CommOp, Group, Trace

    world = Group("world", (0, 1, 2, 3))
    pairs = [Group("tp0", (0, 1)), Group("tp1", (2, 3))]
    ops = [[CommOp(rank=r, index=i, node_id=10 + i, name="c10d::reduce_", collective="reduce",
                   dtype="float32", elsize=4, in_bytes=4096, out_bytes=4096, root=0,
                   group=group, group_source="named")
            for i, group in enumerate((world, pairs[r // 2]))] for r in range(4)]
    match_calls(ops, [world, *pairs])
    trace = Trace(kind="pytorch-et", paths=["reduce"], world_size=4, ops=ops,
                  groups=[world, *pairs], schema="synthetic")
    out = simulate_trace(MODEL, trace, 16, "switch:16", "replay",
                         algorithms={"reduce": algorithm})
    rows = {r["group_shape"]: r for r in out["ops"]}
    assert (rows["world"]["engine"], rows["tile"]["engine"]) == (world_engine, group_engine)
    flagged = f"no round schedule for reduce {algorithm}: analytical time"
    assert (flagged in rows["tile"]["flags"]) == (group_engine == "formula")
    assert flagged not in rows["world"]["flags"]
