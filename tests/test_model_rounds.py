"""The rounds replay engine: vectorised routes, array round programs against the algorithms/
schedules, known answers with and without contention, the XOR-symmetric quotient, and
memory at a medium scale."""

from __future__ import annotations

import dataclasses
import io
import os
import signal
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from ccbench.model.costs import predict_time
from ccbench.model.netsim import replay, replay_collective, replay_rounds, round_time, schedule_program
from ccbench.model.progress import StderrProgress
from ccbench.model.rounds import ROUND_ALGORITHMS, Round, round_program
from ccbench.model.topology import LinkClass, build_topology
from ccbench.model.torus_xor import ring_xor_loads

A, B, G = 10e-6, 1 / 10e9, 1 / 40e9
LC = LinkClass(A, B)
INTRA = LinkClass(2e-6, 1 / 40e9)
N = float(1 << 20)
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("spec", [
    "ring:7", "ring:2", "switch:5", "fat-tree:20:leaf=4:oversub=2", "torus:4x3", "torus:2x3x4",
    "torus:3x1x5", "hypercube:16", "dual-plane:40:gpus=4:tor=3", "dual-plane:16:gpus=8",
    "fully-connected:5"])
def test_vectorised_paths_equal_scalar_routes(spec):
    topo = build_topology(spec, None, LC, INTRA)
    p = topo.ranks
    src, dst = (a.ravel() for a in np.meshgrid(np.arange(p), np.arange(p), indexing="ij"))
    paths = topo.paths(src, dst)
    for i in range(src.size):
        want = sorted((sorted(links), frac) for links, frac in topo.routes(int(src[i]), int(dst[i])))
        rows = np.flatnonzero(paths.msg == i)
        got = sorted((sorted(int(x) for x in paths.links[r] if x >= 0), float(paths.frac[r]))
                     for r in rows)
        assert got == want, (spec, int(src[i]), int(dst[i]))


def _steps_from_rounds(program) -> list[list[tuple]]:
    p = program.p
    out: list[list[tuple]] = [[] for _ in range(p)]
    for rnd in program.rounds():
        for _ in range(rnd.repeat):
            sends: list[Counter] = [Counter() for _ in range(p)]
            recvs: list[Counter] = [Counter() for _ in range(p)]
            for s, d, b, red in zip(rnd.src.tolist(), rnd.dst.tolist(), rnd.nbytes.tolist(),
                                    rnd.reduce.tolist(), strict=True):
                sends[s][d] += b
                recvs[d][(s, red > 0)] += b
            for r in range(p):
                if sends[r] or recvs[r]:
                    out[r].append((sorted(sends[r].items()), sorted(recvs[r].items())))
    return out


def _steps_from_schedule(collective: str, algorithm: str, p: int, n: float) -> list[list[tuple]]:
    """Per rank and step: bytes to each peer and from each peer (messages to the same peer
    in one step summed: the round programs send a wrapped window as one flow)."""
    out = []
    for steps in schedule_program(collective, algorithm, p, n):
        rank = []
        for st in steps:
            sends: Counter = Counter()
            recvs: Counter = Counter()
            for peer, b in st.sends:
                sends[peer] += b
            for peer, b, red in st.recvs:
                recvs[(peer, red > 0)] += b
            rank.append((sorted(sends.items()), sorted(recvs.items())))
        out.append(rank)
    return out


@pytest.mark.parametrize("name,collective", ROUND_ALGORITHMS)
def test_round_programs_match_algorithms_schedules(name, collective):
    for p in (1, 2, 3, 5, 6, 8, 12, 13, 16):
        n = N * p
        program = round_program(collective, name, p, n)
        assert program is not None
        assert _steps_from_rounds(program) == _steps_from_schedule(collective, name, p, n), p
        assert sum(r.repeat for r in program.rounds()) == program.num_rounds


@pytest.mark.parametrize("coll,algo,spec", [
    ("allreduce", "ring", "ring:8"), ("allreduce", "ring", "switch:7"),
    ("allreduce", "ring", "dual-plane:16:gpus=8"), ("allreduce", "recursive-doubling", "switch:8"),
    ("allreduce", "recursive-doubling", "switch:6"), ("allreduce", "recursive-doubling", "hypercube:8"),
    ("allreduce", "rabenseifner", "switch:8"), ("allreduce", "rabenseifner", "switch:13"),
    ("allreduce", "tree", "switch:8"), ("allreduce", "tree", "switch:7"),
    ("allgather", "ring", "ring:6"), ("allgather", "bruck", "switch:6"),
    ("allgather", "recursive-doubling", "fat-tree:16:leaf=4"),
    ("reduce-scatter", "ring", "switch:5"), ("reduce-scatter", "recursive-halving", "switch:8"),
    ("broadcast", "tree", "switch:8"), ("broadcast", "ring", "ring:6"),
    ("alltoall", "pairwise", "switch:8"), ("alltoall", "pairwise", "switch:7"),
    ("alltoall", "bruck", "switch:8"), ("alltoall", "pairwise", "fully-connected:5"),
])
def test_rounds_equal_formula_without_contention(coll, algo, spec):
    topo = build_topology(spec, None, LC)
    p = topo.ranks
    want = predict_time(coll, algo, p, N * p, A, B, G)
    for sharing in ("max-min", "equal"):
        res = replay_collective(coll, algo, p, N * p, topo, G, sharing)
        assert res.engine == "rounds"
        assert res.time == pytest.approx(want, rel=1e-9)


def test_rounds_equal_formula_at_16k_ranks():
    for spec in ("switch:16384", "fat-tree:16384:leaf=32", "torus:32x32x16"):
        topo = build_topology(spec, None, LC)
        res = replay_collective("allreduce", "ring", 16384, 1 << 30, topo, G)
        want = predict_time("allreduce", "ring", 16384, 1 << 30, A, B, G)
        assert res.time == pytest.approx(want, rel=1e-9)


def test_recursive_doubling_on_a_ring_by_hand():
    # partners at distance 1, 2, 4 on ring:8: 1, 2 and 4 flows share every link used
    topo = build_topology("ring:8", None, LC)
    res = replay_collective("allreduce", "recursive-doubling", 8, N, topo, G)
    assert res.time == pytest.approx(3 * A + 7 * N * B + 3 * N * G, rel=1e-12)
    assert res.max_link_flows == 4


def test_pairwise_through_an_oversubscribed_fat_tree_by_hand():
    # leaves of 32 ranks; an uplink carries 32 x bw / 4: a cross-leaf flow runs at bw / 4
    p, n = 1024, 64.0 * 2 ** 20
    m = n / p
    topo = build_topology(f"fat-tree:{p}:leaf=32:oversub=4", None, LC)
    res = replay_collective("alltoall", "pairwise", p, n, topo)
    assert res.time == pytest.approx(31 * (A + m * B) + (p - 32) * (A + 4 * m * B), rel=1e-12)
    assert res.max_link_flows == 32


def test_pairwise_on_a_dual_plane_by_hand():
    # 4 ranks per host, 2 hosts per ToR, uplinks 8 x bw / 2: half a message per plane
    p, n = 32, 32 * N
    m = n / p
    topo = build_topology("dual-plane:32:gpus=4:tor=2:oversub=2", None, LC, LinkClass(A, B))
    res = replay_collective("alltoall", "pairwise", p, n, topo)
    assert res.time == pytest.approx(31 * A + (3 + 4 / 2 + 24) * m * B, rel=1e-12)


def test_max_min_progressive_filling_by_hand():
    # A: 0->2 (N bytes) through rank 0's uplink at a quarter rate; B: 1->2 (4N bytes).
    # max-min: A C/4, B 3C/4 until A ends at 4N/C, then B alone: 5N/C in all.
    # equal share: B C/2 (half the shared downlink) until 4N/C, then C: 6N/C.
    topo = build_topology("switch:3", None, LC)
    topo.cap[topo.link(0, 3)] = 0.25 / B
    rnd = Round(np.array([0, 1]), np.array([2, 2]), np.array([N, 4 * N]), np.zeros(2))
    assert round_time(rnd, topo, 0.0, "max-min")[0] == pytest.approx(A + 5 * N * B, rel=1e-12)
    assert round_time(rnd, topo, 0.0, "equal")[0] == pytest.approx(A + 6 * N * B, rel=1e-12)


def test_gamma_reduces_after_arrival():
    topo = build_topology("switch:4", None, LC)
    rnd = Round(np.array([0, 1]), np.array([2, 2]), np.array([N, N]), np.array([N, N]))
    # two flows into rank 2 share its downlink (2N at C), then rank 2 reduces 2N
    assert round_time(rnd, topo, G)[0] == pytest.approx(A + 2 * N * B + 2 * N * G, rel=1e-12)


@pytest.mark.parametrize("spec", ["switch:8", "hypercube:16", "fat-tree:16:leaf=4:oversub=4",
                                  "fat-tree:64:leaf=8:oversub=3",
                                  "dual-plane:64:gpus=4:tor=2:oversub=2"])
def test_xor_quotient_equals_the_full_solve(spec):
    topo = build_topology(spec, None, LC, INTRA)
    assert topo.xor_orbits() is not None
    for name, coll in (("pairwise", "alltoall"), ("hypercube", "allreduce"),
                       ("rabenseifner", "allreduce"), ("hypercube", "allgather")):
        program = round_program(coll, name, topo.ranks, N * topo.ranks)
        for rnd in program.rounds():
            assert rnd.xor_symmetric
            for sharing in ("max-min", "equal"):
                fast = round_time(rnd, topo, G, sharing)
                full = round_time(dataclasses.replace(rnd, xor_symmetric=False), topo, G, sharing)
                assert fast[0] == pytest.approx(full[0], rel=1e-12) and fast[1] == full[1]


@pytest.mark.parametrize("spec", ["torus:4x4", "torus:8x2", "torus:2x2x2", "torus:4x1x8",
                                  "torus:4x4x4", "torus:8x4x2", "torus:16x8x8"])
def test_torus_xor_rounds_per_dimension_equal_the_full_solve(spec):
    """The per-dimension solve of XOR rounds on power-of-two tori gives the full fluid
    solve's answer to the last bit (every pairwise shift; the XOR rounds of recursive
    doubling, Rabenseifner and the allgather, with gamma, both sharings)."""
    topo = build_topology(spec, None, LC)
    p = topo.ranks
    rounds = []
    for name, coll in (("pairwise", "alltoall"), ("hypercube", "allreduce"),
                       ("rabenseifner", "allreduce"), ("hypercube", "allgather")):
        rounds += list(round_program(coll, name, p, N * p).rounds())
    if p > 256:                       # every shift class of the big one would take a minute
        rounds = rounds[:64] + rounds[p - 1 - 64:]
    for rnd in rounds:
        assert rnd.xor_symmetric
        for sharing in ("max-min", "equal"):
            fast = round_time(rnd, topo, G, sharing)
            full = round_time(dataclasses.replace(rnd, xor_symmetric=False), topo, G, sharing)
            assert fast == full, (spec, int(rnd.dst[0]), sharing)


def test_torus_xor_loads_by_hand():
    # ring of 8, c -> c XOR 3: 0->3 forward over 0,1,2; 1->2 over 1; 4->7 and 5->6 alike;
    # the mirror flows go backward: links (1,+), (5,+), (2,-), (6,-) carry two flows, and
    # every route crosses one of them
    assert ring_xor_loads(8, 3) == (2, 2)
    # c -> c XOR 4 is half way round, ties forward: four flows on every forward link
    assert ring_xor_loads(8, 4) == (4, 4)
    assert ring_xor_loads(4, 3) == (1, 1)
    topo = build_topology("torus:8x2", None, LC)
    xor = round_program("alltoall", "pairwise", 16, 16 * N)
    by_mask = {int(r.dst[0]): r for r in xor.rounds()}
    # rank = 2x + y: mask 6 is x XOR 3 (two flows on the busiest x links), 8 is x XOR 4
    assert round_time(by_mask[6], topo)[0] == pytest.approx(A + 2 * N * B, rel=1e-12)
    assert round_time(by_mask[7], topo)[0] == pytest.approx(A + 2 * N * B, rel=1e-12)
    assert round_time(by_mask[8], topo) == (pytest.approx(A + 4 * N * B, rel=1e-12), 4)


def test_torus_xor_falls_back_to_the_flows_where_links_differ():
    topo = build_topology("torus:4x4", None, LC)
    topo.cap[topo.link(0, 4)] = 0.5 / B     # one slow link: lines are no longer alike
    rnd = next(r for r in round_program("alltoall", "pairwise", 16, 16 * N).rounds()
               if int(r.dst[0]) == 4)
    full = round_time(dataclasses.replace(rnd, xor_symmetric=False), topo)
    assert round_time(rnd, topo) == full
    assert full[0] == pytest.approx(A + 2 * N * B, rel=1e-12)


def test_xor_quotient_refused_where_xor_is_no_automorphism():
    for spec in ("fat-tree:24:leaf=8", "fat-tree:32:leaf=6", "torus:4x4", "ring:8",
                 "dual-plane:48:gpus=4:tor=3"):
        assert build_topology(spec, None, LC).xor_orbits() is None


@pytest.mark.parametrize("coll,algo,spec", [
    ("allreduce", "recursive-doubling", "ring:8"), ("allreduce", "ring", "torus:2x2x3"),
    ("alltoall", "pairwise", "fat-tree:16:leaf=4:oversub=4"),
    ("allreduce", "rabenseifner", "fat-tree:32:leaf=4:oversub=2"),
    ("alltoall", "bruck", "torus:4x4"),
])
def test_rounds_equal_events_where_ranks_stay_in_lock_step(coll, algo, spec):
    topo = build_topology(spec, None, LC)
    p = topo.ranks
    events = replay(schedule_program(coll, algo, p, N * p), topo, G).time
    rounds = replay_rounds(round_program(coll, algo, p, N * p), topo, G).time
    assert rounds == pytest.approx(events, rel=1e-9)


def test_medium_scale_memory_stays_linear():
    """4096 ranks: every required algorithm on the 3D torus and the oversubscribed fat tree,
    with tracemalloc's peak far below what p^2 messages would need (16M messages)."""
    tracemalloc.start()
    try:
        for spec in ("torus:16x16x16", "fat-tree:4096:leaf=32:oversub=4"):
            topo = build_topology(spec, None, LC)
            for coll, algo in (("allreduce", "ring"), ("allreduce", "tree"),
                               ("allreduce", "recursive-doubling"),
                               ("reduce-scatter", "recursive-halving"),
                               ("allreduce", "rabenseifner"), ("allgather", "bruck"),
                               ("alltoall", "bruck")):
                res = replay_collective(coll, algo, 4096, 1 << 26, topo, G)
                assert res.engine == "rounds" and res.time > 0
        for spec in ("fat-tree:4096:leaf=32:oversub=4", "torus:16x16x16"):
            topo = build_topology(spec, None, LC)
            res = replay_collective("alltoall", "pairwise", 4096, 1 << 26, topo)
            assert res.messages == 4096 * 4095
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2 ** 20


def test_progress_is_quiet_first_then_reports():
    clock = iter([0.0, 0.5, 2.0, 2.1, 8.0, 9.0]).__next__
    out = io.StringIO()
    progress = StderrProgress(out, delay=1.0, every=5.0, clock=clock)
    for done in (1, 2, 3, 4, 5):
        progress("allreduce ring 1024 B", done, 6)
    progress("allreduce ring 1024 B", 6, 6)
    progress.close()
    lines = out.getvalue().splitlines()
    assert lines == ["replay allreduce ring 1024 B: round 3/6 (50%), 2 s",
                     "replay allreduce ring 1024 B: round 5/6 (83%), 8 s",
                     "replay allreduce ring 1024 B: round 6/6 (100%), 9 s"]


def test_simulate_long_replay_shows_progress_and_stops_on_sigint():
    # 3840 ranks is no power of two: pairwise shifts by r + k, which the per-dimension
    # torus solve does not cover, so every one of the 3839 rounds is a full fluid solve
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "ccbench", "simulate", str(ROOT / "results" / "model.json"),
           "alltoall", "--ranks", "3840", "--topology", "torus:16x16x15", "--algorithm",
           "pairwise", "--fidelity", "both", "--sizes", "64M", "--backend", "mpi/Intel MPI"]
    # a shell's background job (`pytest ... &`) starts with SIGINT ignored, which children
    # inherit and Python then keeps: give the child the default, as a terminal's job has
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stderr is not None
    seen = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if line.startswith("replay alltoall pairwise"):
            proc.send_signal(signal.SIGINT)
            break
    out, err = proc.communicate(timeout=120)
    assert any(x.startswith("replay alltoall pairwise") for x in seen), seen
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().endswith("ccbench: interrupted")
    assert "size" not in out


def test_report_draws_simulate_predictions_beside_measurements(tmp_path):
    pytest.importorskip("matplotlib")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    preds = tmp_path / "pred.jsonl"
    base = [sys.executable, "-m", "ccbench"]
    model = str(ROOT / "results" / "model.json")
    for ranks, topo in ((4, "switch:4"), (4096, "fat-tree:4096:leaf=32:oversub=4")):
        subprocess.run(base + ["simulate", model, "allreduce", "--ranks", str(ranks),
                               "--topology", topo, "--fidelity", "replay", "--sizes", "1K-1M:16",
                               "--backend", "mpi/Intel MPI", "-o", str(preds)],
                       check=True, capture_output=True, env=env, cwd=ROOT)
    out = tmp_path / "report"
    proc = subprocess.run(base + ["report", str(ROOT / "results" / "data" / "impi-n2.jsonl.gz"),
                                  str(preds), "-o", str(out), "--collective", "allreduce",
                                  "--formats", "png"],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert (out / "predictions-allreduce.png").stat().st_size > 10_000
    assert not list(out.glob("rank-spread-n4096*"))        # predictions stay out of the rest
