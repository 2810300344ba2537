"""Topologies, schedule replay, and agreement with the analytical formula."""

from __future__ import annotations

import pytest

from ccbench.errors import UsageError
from ccbench.model.costs import predict_time
from ccbench.model.netsim import SimStep, replay, ring_program, schedule_program
from ccbench.model.topology import LinkClass, build_topology

A, B, G = 10e-6, 1 / 10e9, 1 / 40e9
LC = LinkClass(A, B)
N = 1 << 20


def test_topology_sanity():
    ring = build_topology("ring:8", None, LC)
    assert len(ring.cap) == 16
    assert len(ring.routes(0, 3)[0][0]) == 3 and len(ring.routes(0, 6)[0][0]) == 2
    star = build_topology("switch:8", None, LC)
    assert all(len(star.routes(0, j)[0][0]) == 2 for j in range(1, 8))
    cube = build_topology("hypercube:16", None, LC)
    assert len(cube.routes(0, 15)[0][0]) == 4 and len(cube.cap) == 16 * 4
    torus = build_topology("torus:4x4", None, LC)
    assert len(torus.routes(0, 10)[0][0]) == 4          # (0,0) -> (2,2)
    t3 = build_topology("torus:2x2x2", None, LC)
    assert t3.ranks == 8 and len(t3.dims) == 3
    fc = build_topology("fully-connected:6", None, LC)
    assert all(len(fc.routes(i, j)[0][0]) == 1 for i in range(6) for j in range(6) if i != j)
    ft = build_topology("fat-tree:32:leaf=8:oversub=4", None, LC)
    assert len(ft.routes(0, 7)[0][0]) == 2 and len(ft.routes(0, 8)[0][0]) == 4
    up = ft.link(32, 36)                                  # leaf 0 -> spine
    assert ft.cap[up] == pytest.approx(8 / 4 / B)
    dp = build_topology("dual-plane:32:gpus=8:tor=2", None, LC, LinkClass(2e-6, 1 / 100e9))
    intra = dp.routes(0, 7)
    assert len(intra) == 1 and dp.klass[intra[0][0][0]] == "intra"
    inter = dp.routes(0, 8)
    assert len(inter) == 2 and [f for _, f in inter] == [0.5, 0.5]
    assert dp.path_cost(0, 7) == (2e-6, pytest.approx(1 / 100e9))
    assert dp.path_cost(0, 8) == (A, pytest.approx(B / 2))      # two ports
    assert dp.dims == [("Switch", 8), ("Switch", 4)]


@pytest.mark.parametrize("spec", ["hypercube:6", "torus:4", "ring:0", "mesh:4", "fat-tree:8:foo=1"])
def test_bad_topology(spec):
    with pytest.raises(UsageError):
        build_topology(spec, None, LC)


def test_ranks_must_match():
    with pytest.raises(UsageError, match="does not match"):
        build_topology("ring:8", 4, LC)


@pytest.mark.parametrize("coll,algo,spec", [
    ("allreduce", "ring", "ring:8"), ("allreduce", "ring", "switch:7"),
    ("allreduce", "ring", "dual-plane:16:gpus=8"),
    ("allreduce", "recursive-doubling", "hypercube:8"), ("allreduce", "rabenseifner", "switch:8"),
    ("allreduce", "tree", "switch:8"), ("allgather", "ring", "ring:6"),
    ("allgather", "bruck", "switch:6"), ("reduce-scatter", "ring", "switch:5"),
    ("reduce-scatter", "recursive-halving", "fully-connected:8"),
    ("broadcast", "tree", "switch:8"), ("broadcast", "ring", "ring:6"),
    ("alltoall", "pairwise", "switch:8"),
    ("alltoall", "pairwise", "fully-connected:5"),
])
def test_replay_equals_formula_without_contention(coll, algo, spec):
    topo = build_topology(spec, None, LC)
    res = replay(schedule_program(coll, algo, topo.ranks, N), topo, G)
    assert res.time == pytest.approx(predict_time(coll, algo, topo.ranks, N, A, B, G), rel=1e-9)
    eq = replay(schedule_program(coll, algo, topo.ranks, N), topo, G, sharing="equal")
    assert eq.time == pytest.approx(res.time, rel=1e-9)


@pytest.mark.parametrize("coll,algo,spec,low", [
    ("allreduce", "recursive-doubling", "ring:8", 1.5),       # distance-2^k partners share links
    ("alltoall", "pairwise", "fat-tree:16:leaf=4:oversub=4", 1.5),
])
def test_contention_makes_replay_slower(coll, algo, spec, low):
    topo = build_topology(spec, None, LC)
    res = replay(schedule_program(coll, algo, topo.ranks, N), topo, G)
    ana = predict_time(coll, algo, topo.ranks, N, A, B, G)
    assert res.time > low * ana and res.max_link_flows > 1


def test_array_ring_program_matches_algorithms_schedule():
    for coll in ("allreduce", "reduce-scatter", "allgather"):
        for p in (2, 3, 5, 8):
            topo = build_topology(f"ring:{p}", None, LC)
            fast = replay(ring_program(coll, p, N), topo, G).time
            slow = replay(schedule_program(coll, "ring", p, N), topo, G).time
            assert fast == pytest.approx(slow, rel=1e-12)


def test_max_min_vs_equal_share_differ():
    # flows 0->2 and 1->2 share link 2 (into rank 2 via switch); flow 3->4 alone.
    # A flow 0->2 also crossing a slow link would make max-min give the spare to the other.
    topo = build_topology("switch:3", None, LC)
    topo.cap[topo.link(0, 3)] = 0.25 / B             # rank 0's uplink is slow
    prog = [[SimStep(sends=[(2, N)])], [SimStep(sends=[(2, N)])],
            [SimStep(recvs=[(0, N, 0.0), (1, N, 0.0)])]]
    mm = replay(prog, topo, 0.0, "max-min").time
    eq = replay(prog, topo, 0.0, "equal").time
    # max-min: rank 1's flow takes 0.75 of the shared downlink while rank 0 is limited
    assert mm == pytest.approx(A + N * B * 4, rel=1e-9)
    assert eq == pytest.approx(A + N * B * 4, rel=1e-9)
    one = [[SimStep(sends=[(2, N)])], [], [SimStep(recvs=[(0, N, 0.0)])]]
    assert replay(one, topo, 0.0).time == pytest.approx(A + 4 * N * B)
    # with rank 1's finish time visible
    r = replay(prog, topo, 0.0, "max-min")
    e = replay(prog, topo, 0.0, "equal")
    assert r.rank_finish[1] < e.rank_finish[1]


def test_deadlock_reported():
    prog = [[SimStep(recvs=[(1, 8, 0.0)])], [SimStep(recvs=[(0, 8, 0.0)])]]
    with pytest.raises(UsageError, match="deadlock"):
        replay(prog, build_topology("ring:2", None, LC))


def test_pipelined_dbtree_approaches_its_formula():
    topo = build_topology("switch:8", None, LC)
    ana = predict_time("allreduce", "double-binary-tree", 8, N, 0.0, B, 0.0)
    one = replay(schedule_program("allreduce", "double-binary-tree", 8, N, 1), topo).time
    many = replay(schedule_program("allreduce", "double-binary-tree", 8, N, 32),
                  build_topology("switch:8", None, LinkClass(0.0, B))).time
    assert many < one and many == pytest.approx(ana, rel=0.35)


def test_replay_finds_the_schedule_by_another_name_of_its_formula(monkeypatch) -> None:
    """A collective whose cost formula is keyed "pipelined" and whose algorithms/ schedule is
    "tree" ({"tree": "pipelined"} in its ModelTerms.aliases) replays that schedule under either
    name, as a new collective's formula and schedule names may differ."""
    import dataclasses

    from ccbench import collectives
    from ccbench.collectives.spec import ModelTerms
    from ccbench.model.netsim import replay_collective

    reduce = collectives.get("reduce")
    assert reduce.model is not None
    renamed = dataclasses.replace(reduce, model=ModelTerms(
        {"pipelined": reduce.model.costs["tree"]}, aliases={"tree": "pipelined"}))
    monkeypatch.setitem(collectives._BY_NAME, "reduce", renamed)
    topo = build_topology("switch:6", None, LC)
    for engine in ("rounds", "events"):
        want = replay_collective("reduce", "tree", 6, N, topo, engine=engine).time
        assert replay_collective("reduce", "pipelined", 6, N, topo, engine=engine
                                 ).time == pytest.approx(want), engine
    assert len(schedule_program("reduce", "pipelined", 6, N)) == 6
    with pytest.raises(UsageError, match=r"no schedule to replay for reduce 'linear' "
                                         r"\(valid: .*tree"):
        schedule_program("reduce", "linear", 6, N)
