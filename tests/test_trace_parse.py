"""Extraction from traces made by real PyTorch runs: every comm op found, none invented."""

from __future__ import annotations

from pathlib import Path

import pytest

from ccbench.formats import load_trace
from tests.trace_fixtures import raw_comm_nodes

WORKLOADS4 = ("ddp", "tp", "moe", "p2p", "groups")


@pytest.mark.parametrize("workload", WORKLOADS4)
def test_every_comm_op_found_none_invented_4_ranks(traces4: Path, workload: str) -> None:
    trace = load_trace([traces4 / workload])
    assert trace.world_size == 4 and trace.kind == "pytorch-et"
    for rank in range(4):
        raw = raw_comm_nodes(traces4 / workload / f"rank{rank}.json")
        assert raw, "the workload made no communication"
        assert [op.node_id for op in trace.ops[rank]] == [n["id"] for n in raw]
        assert [op.name for op in trace.ops[rank]] == [n["name"] for n in raw]
        assert all(op.group is not None and op.call >= 0 for op in trace.ops[rank])


@pytest.mark.parametrize("workload", ("ddp", "tp", "moe", "p2p"))
def test_every_comm_op_found_3_ranks(traces3: Path, workload: str) -> None:
    trace = load_trace([traces3 / workload])
    assert trace.world_size == 3
    for rank in range(3):
        raw = raw_comm_nodes(traces3 / workload / f"rank{rank}.json")
        assert [op.node_id for op in trace.ops[rank]] == [n["id"] for n in raw]


def test_ddp_allreduce_buckets_cover_the_parameters(traces4: Path) -> None:
    trace = load_trace([traces4 / "ddp"])
    params = 64 * 256 + 256 + 256 * 256 + 256 + 256 * 8 + 8
    allreduces = [op for op in trace.ops[0] if op.collective == "allreduce"]
    assert len(allreduces) >= 2
    assert all(op.dtype == "float32" and op.group and op.group.size == 4 for op in allreduces)
    # the last step's buckets together hold every gradient once
    last = [op for op in allreduces if op.index > allreduces[0].index]
    assert sum(op.size for op in last) == params * 4
    assert all(op.async_op for op in allreduces)         # DDP launches them async


def test_tensor_parallel_shards(traces4: Path) -> None:
    trace = load_trace([traces4 / "tp"])
    ops = trace.ops[1]
    gathers = [op for op in ops if op.collective == "allgather"]
    scatters = [op for op in ops if op.collective == "reduce-scatter"]
    assert len(gathers) == len(scatters) == 2
    assert gathers[0].in_bytes == 512 * 4 and gathers[0].out_bytes == 4 * 512 * 4
    assert scatters[0].in_bytes == 4 * 512 * 4 and scatters[0].out_bytes == 512 * 4
    bf16 = [op for op in ops if op.dtype == "bfloat16"]
    assert [op.collective for op in bf16] == ["allreduce", "allreduce"]


def test_moe_all_to_all_and_uneven_splits(traces4: Path) -> None:
    trace = load_trace([traces4 / "moe"])
    for rank, ops in enumerate(trace.ops):
        assert [op.collective for op in ops] == ["alltoall", "alltoallv", "alltoall"]
        v = ops[1]
        assert v.in_splits == tuple(((rank + p) % 3 + 1) * 16 for p in range(4))
        assert v.in_bytes == sum(v.in_splits) * 4


def test_two_process_groups_matched_to_their_ranks(traces4: Path) -> None:
    trace = load_trace([traces4 / "groups"])
    for rank, ops in enumerate(trace.ops):
        tp = (2 * (rank // 2), 2 * (rank // 2) + 1)
        dp = (rank % 2, rank % 2 + 2)
        got = [(op.collective, op.group.ranks if op.group else None) for op in ops]
        assert got == [("allreduce", tp), ("allgather", tp), ("allreduce", dp)] * 2 \
            + [("broadcast", (0, 1, 2, 3))]
    assert {g.ranks for g in trace.groups} == {(0, 1), (2, 3), (0, 2), (1, 3), (0, 1, 2, 3)}
    # every call's members agree on what it was
    calls: dict[int, set[tuple[object, ...]]] = {}
    for op in trace.all_ops():
        calls.setdefault(op.call, set()).add((op.collective, op.size, op.group))
    assert all(len(v) == 1 for v in calls.values())


def test_ops_beyond_the_five(traces4: Path) -> None:
    trace = load_trace([traces4 / "p2p"])
    names = [op.collective for op in trace.ops[0]]
    assert names == ["broadcast", "reduce", "gather", "scatter", "barrier", "send", "allgather"]
    assert [op.collective for op in trace.ops[1]][5] == "recv"
    assert trace.ops[0][0].root == 3 and trace.ops[0][1].root == 0
    assert trace.ops[0][5].peer == 1 and trace.ops[1][5].peer == 0
    assert trace.ops[2][2].size == 4 * 256 * 4            # gather: the root's whole output


def test_rescale_keeps_per_rank_sizes_and_retiles_groups(traces4: Path) -> None:
    from ccbench.trace.scale import rescale

    trace = rescale(load_trace([traces4 / "groups"]), 8)
    for rank, ops in enumerate(trace.ops):
        tp = (rank // 2 * 2, rank // 2 * 2 + 1)
        dp = tuple(range(rank % 2, 8, 2))
        assert [op.group.ranks if op.group else None for op in ops] == [tp, tp, dp] * 2 \
            + [tuple(range(8))]
        assert ops[2].size == (4096 + 256 * (rank % 2)) * 4      # the per-rank gradient kept
    ddp = rescale(load_trace([traces4 / "ddp"]), 7)
    assert [op.size for op in ddp.ops[6] if op.collective == "allreduce"] == \
        [op.size for op in load_trace([traces4 / "ddp"]).ops[0] if op.collective == "allreduce"]
    p2p = rescale(load_trace([traces4 / "p2p"]), 6)
    assert any("send: point-to-point peers are not rescaled" in n for n in p2p.notes)


def test_rescale_down_says_which_groups_became_one_rank() -> None:
    """Data-parallel groups (every 2nd rank of 4) at 2 ranks are one rank each: said in one
    warning naming them; at 8 ranks (groups of 4) nothing is said."""
    from ccbench.trace.groups import match_calls
    from ccbench.trace.ops import CommOp, Group, Trace
    from ccbench.trace.scale import rescale

    world = Group("world", (0, 1, 2, 3))
    dp = [Group("dp0", (0, 2)), Group("dp1", (1, 3))]
    ops = [[CommOp(rank=r, index=0, node_id=10, name="c10d::allreduce_",
                   collective="allreduce", dtype="float32", elsize=4, in_bytes=64,
                   out_bytes=64, group=dp[r % 2], group_source="named"),
            CommOp(rank=r, index=1, node_id=11, name="c10d::allreduce_",
                   collective="allreduce", dtype="float32", elsize=4, in_bytes=64,
                   out_bytes=64, group=world, group_source="named")] for r in range(4)]
    match_calls(ops, [world, *dp])
    trace = Trace(kind="pytorch-et", paths=["dp"], world_size=4, ops=ops,
                  groups=[world, *dp], schema="synthetic")
    down = rescale(trace, 2)
    assert [op.group.ranks for op in down.ops[1] if op.group] == [(1,), (0, 1)]
    assert down.warnings == ["--world-size 2: recorded groups [0, 2], [1, 3] of the 4 ranks "
                             "became one-rank groups: allreduce on them replay on one rank "
                             "and move no data"]
    assert rescale(trace, 8).warnings == [] and trace.warnings == []
