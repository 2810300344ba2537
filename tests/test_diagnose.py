"""ccbench diagnose: the plan's schedules and the analysis on synthetic measurements."""

from __future__ import annotations

import itertools
import random

import pytest

from ccbench.diagnose.analyse import Expectation, PairMeasure, analyse, suspicious_pairs
from ccbench.diagnose.plan import (
    bisection_rounds,
    build_plan,
    leaf_pairs,
    ring_rounds,
    round_robin,
)

NAMES8 = [f"h{i}" for i in range(8)]
LINK = 100e6


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8, 16, 17])
def test_round_robin_covers_every_pair_once_in_disjoint_rounds(n):
    rounds = round_robin(n)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    seen = [p for r in rounds for p in r]
    assert sorted(seen) == sorted(itertools.combinations(range(n), 2))
    for r in rounds:
        hosts = [h for p in r for h in p]
        assert len(hosts) == len(set(hosts))
        assert len(r) == n // 2                     # odd n: exactly one bye per round


@pytest.mark.parametrize("n", [2, 4, 5, 8, 16])
def test_bisection_is_log_rounds_of_disjoint_pairs(n):
    rounds = bisection_rounds(n)
    assert len(rounds) <= max(1, (n - 1).bit_length())
    for r in rounds:
        hosts = [h for p in r for h in p]
        assert len(hosts) == len(set(hosts))
    if n & (n - 1) == 0:                              # powers of two: every host every round
        assert all(len(r) == n // 2 for r in rounds)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_ring_rounds_cover_the_ring(n):
    edges = sorted((min(i, (i + 1) % n), max(i, (i + 1) % n)) for i in range(n))
    rounds = ring_rounds(n)
    assert sorted({p for r in rounds for p in r}) == sorted(set(edges))
    for r in rounds:
        hosts = [h for p in r for h in p]
        assert len(hosts) == len(set(hosts))


def test_plan_kinds_and_leaf_pairs():
    leaves = [[0, 2, 4], [1, 3, 5]]
    assert leaf_pairs(leaves) == [(0, 1, [(0, 1), (2, 3), (4, 5)])]
    steps = build_plan(6, leaves=leaves, planes=["eth0", "eth1"])
    kinds = [s.kind for s in steps]
    assert kinds.count("pairs") == 5 and kinds.count("leaves") == 1
    # every pair on every plane (one flow per plane: a bad ECMP member is hit every run)
    assert kinds.count("planes") == 10 and kinds[0] == "world" and kinds[-1] == "compute"
    per_plane = [p for s in steps if s.plane == "eth1" for p in s.pairs]
    assert sorted(per_plane) == sorted(itertools.combinations(range(6), 2))
    quick = build_plan(16, quick=True)
    assert [s.kind for s in quick].count("pairs") == 4


# -- synthetic measurements ---------------------------------------------------------------

def _pairs(n, rate, noise=0.05, seed=0, lat=150.0, kind="pairs", rounds=None):
    rng = random.Random(seed)
    out = []
    for number, r in enumerate(rounds if rounds is not None else round_robin(n)):
        for a, b in r:
            out.append(PairMeasure(kind, number, a, b,
                                   lat * rng.uniform(1 - noise, 1 + 3 * noise),
                                   rate(a, b, number) * rng.uniform(1 - noise, 1 + noise),
                                   rate(b, a, number) * rng.uniform(1 - noise, 1 + noise)))
    return out


def _kinds(findings):
    return [(f.kind, f.component) for f in findings]


@pytest.mark.parametrize("expect", [Expectation(), Expectation(LINK, None, "--link-rate")])
@pytest.mark.parametrize("seed", range(5))
def test_healthy_noisy_cluster_gives_no_finding(expect, seed):
    measures = _pairs(8, lambda a, b, r: 0.9 * LINK, noise=0.15, seed=seed, lat=200)
    rng = random.Random(seed)                     # bursts of other work: any host, any round
    compute = {h: [0.1 * rng.choice([1, 1, 1, 1.5, 4]) for _ in range(5)] for h in range(8)}
    assert analyse(measures, expect, NAMES8, compute) == []
    assert suspicious_pairs(measures, expect) == []


@pytest.mark.parametrize("expect", [Expectation(), Expectation(LINK, None, "--link-rate")])
@pytest.mark.parametrize("victim", [0, 3, 7])
def test_slow_host_link_shows_in_all_its_pairs(expect, victim):
    measures = _pairs(8, lambda a, b, r: LINK / 3 if victim in (a, b) else 0.9 * LINK)
    findings = analyse(measures, expect, NAMES8)
    assert _kinds(findings) == [("slow link", f"host h{victim}'s link")]
    assert "7 of its 7 pairs" in findings[0].evidence


def test_slow_pair_path_shows_in_one_pair():
    measures = _pairs(8, lambda a, b, r: LINK / 3 if {a, b} == {2, 6} else 0.9 * LINK)
    assert _kinds(analyse(measures, Expectation(), NAMES8)) == [("slow path",
                                                                  "pair h2-h6 path")]


def test_one_noisy_round_is_outvoted_by_the_repeat():
    first = _pairs(8, lambda a, b, r: LINK / 4 if {a, b} == {1, 5} else 0.9 * LINK)
    assert suspicious_pairs(first, Expectation()) == [(1, 5)]
    again = _pairs(8, lambda a, b, r: 0.9 * LINK, kind="repeat", rounds=[[(1, 5)]])
    assert analyse(first + again, Expectation(), NAMES8) == []
    still = _pairs(8, lambda a, b, r: LINK / 4, kind="repeat", rounds=[[(1, 5)]])
    findings = analyse(first + still, Expectation(), NAMES8)
    assert _kinds(findings) == [("slow path", "pair h1-h5 path")]
    assert findings[0].confidence in ("medium", "high")


def test_slow_uplink_in_cross_leaf_pairs():
    leaves = [[0, 2, 4, 6], [1, 3, 5, 7]]
    rng = random.Random(1)

    def contended(a, b, r):               # cross-leaf pairs share leaf1's halved uplink
        return 0.9 * LINK * (rng.choice([0.4, 1.0]) if a % 2 != b % 2 else 1.0)
    measures = _pairs(8, contended)
    measures += [PairMeasure("leaves", 0, a, b, 150, 0.45 * LINK, 0.47 * LINK, leaves=(0, 1))
                 for a, b in leaf_pairs(leaves)[0][2]]
    findings = analyse(measures, Expectation(), NAMES8, leaves=leaves)
    assert [f.kind for f in findings] == ["slow uplink"]
    assert findings[0].component == "uplink leaf0-spine or uplink leaf1-spine"


def test_slow_uplink_of_one_of_three_leaves():
    names = [f"h{i}" for i in range(6)]
    leaves = [[0, 3], [1, 4], [2, 5]]
    measures = _pairs(6, lambda a, b, r: 0.9 * LINK)
    for la, lb, pairs in leaf_pairs(leaves):
        rate = 0.4 * LINK if 2 in (la, lb) else 0.9 * LINK
        measures += [PairMeasure("leaves", 0, a, b, 150, rate, rate, leaves=(la, lb))
                     for a, b in pairs]
    findings = analyse(measures, Expectation(), names, leaves=leaves)
    assert _kinds(findings) == [("slow uplink", "uplink leaf2-spine")]


def test_plane_port_down_and_slow_port_and_slow_plane():
    ring = round_robin(8)

    def plane(name, rate, error_host=None):
        out = []
        for number, r in enumerate(ring):
            for a, b in r:
                if error_host in (a, b):
                    out.append(PairMeasure("planes", number, a, b, plane=name,
                                           error="no answer on " + name))
                else:
                    out.append(PairMeasure("planes", number, a, b, 150, rate(a, b), rate(b, a),
                                           plane=name))
        return out

    # h3's eth1 port is down: its pairs over ECMP still work (failover), the plane shows it
    measures = _pairs(8, lambda a, b, r: 0.9 * LINK)
    down = measures + plane("eth0", lambda a, b: 0.9 * LINK) + plane("eth1", lambda a, b: 0.9 * LINK, 3)
    assert _kinds(analyse(down, Expectation(), NAMES8)) == [("port down",
                                                             "host h3's plane eth1 port")]
    # h5's eth1 port at 1/4: the flows hashed onto it are slow, the others not
    mixed = _pairs(8, lambda a, b, r: LINK / 4 if 5 in (a, b) and (a + b + r) % 2 else 0.9 * LINK)
    slow = mixed + plane("eth0", lambda a, b: 0.9 * LINK) + plane(
        "eth1", lambda a, b: LINK / 4 if 5 in (a, b) else 0.9 * LINK)
    assert _kinds(analyse(slow, Expectation(), NAMES8)) == [("slow port",
                                                             "host h5's plane eth1 port")]
    whole = measures + plane("eth0", lambda a, b: 0.9 * LINK) + plane("eth1", lambda a, b:
                                                                       LINK / 4)
    assert _kinds(analyse(whole, Expectation(), NAMES8)) == [("slow plane", "plane eth1")]


def test_compute_slow_host_in_arrivals_explains_its_slow_pairs():
    compute = {h: [0.1, 0.11, 0.1, 0.3, 0.1] for h in range(8)}
    compute[4] = [0.52, 0.5, 0.55, 0.6, 0.5]
    measures = _pairs(8, lambda a, b, r: 0.5 * LINK if 4 in (a, b) else 0.9 * LINK)
    findings = analyse(measures, Expectation(), NAMES8, compute)
    assert _kinds(findings) == [("slow compute", "host h4 compute")]


def test_stopped_host_is_a_finding_and_absolute_expectation_misses():
    measures = _pairs(4, lambda a, b, r: 0.9 * LINK, rounds=round_robin(4)[:1])
    findings = analyse(measures, Expectation(), NAMES8[:4], stopped={2: "no TCP answer"})
    assert _kinds(findings) == [("stopped", "host h2")]
    slow_all = _pairs(8, lambda a, b, r: 0.2 * LINK)
    assert _kinds(analyse(slow_all, Expectation(LINK, None, "--link-rate"), NAMES8)) == [
        ("below expected", "every path")]


@pytest.mark.parametrize("victim", [0, 3])
def test_one_slow_host_of_four_is_not_every_path(victim):
    """At 4 hosts one host is in half the pairs: their median sits at the midpoint of slow
    and fast, about SLOW of the link; it was read as 'every path below expected' (seen on the
    testbed: a plane port at 1/4, pairs at 12 and 48 Mbit/s against 50)."""
    measures = _pairs(4, lambda a, b, r: 0.22 * LINK if victim in (a, b) else 0.96 * LINK,
                      noise=0.0, rounds=round_robin(4))
    findings = analyse(measures, Expectation(LINK, None, "--link-rate"), NAMES8[:4])
    assert _kinds(findings) == [("slow link", f"host h{victim}'s link")]
    slow_all = _pairs(4, lambda a, b, r: 0.22 * LINK if victim in (a, b) else 0.5 * LINK,
                      noise=0.0, rounds=round_robin(4))
    assert ("below expected", "every path") in _kinds(
        analyse(slow_all, Expectation(LINK, None, "--link-rate"), NAMES8[:4]))


def test_high_latency_host():
    measures = _pairs(8, lambda a, b, r: 0.9 * LINK)
    for m in measures:
        if 6 in (m.a, m.b):
            m.lat_us = 2000.0
    assert _kinds(analyse(measures, Expectation(), NAMES8)) == [("high latency",
                                                                 "host h6's link")]


def test_host_slow_on_every_plane_is_its_link():
    ring = round_robin(8)
    measures = _pairs(8, lambda a, b, r: LINK / 3 if 2 in (a, b) else 0.9 * LINK)
    for name in ("eth0", "eth1"):
        for number, r in enumerate(ring):
            for a, b in r:
                rate = LINK / 3 if 2 in (a, b) else 0.9 * LINK
                measures.append(PairMeasure("planes", number, a, b, 150, rate, rate, plane=name))
    findings = analyse(measures, Expectation(LINK, None, "--link-rate"), NAMES8)
    assert _kinds(findings) == [("slow link", "host h2's link (every plane)")]


def test_world_collective_flagged_only_when_nothing_explains_it():
    healthy = _pairs(8, lambda a, b, r: 0.9 * LINK)
    world = {"label": "allreduce", "time_us": 1e6, "busbw_bps": 0.1 * LINK}
    absolute = Expectation(LINK, None, "--link-rate")
    assert _kinds(analyse(healthy, absolute, NAMES8, world=world)) == [
        ("slow collective", "cluster (world allreduce)")]
    assert analyse(healthy, Expectation(), NAMES8, world=world) == []   # pairs alone: no
    slow_host = _pairs(8, lambda a, b, r: LINK / 3 if 1 in (a, b) else 0.9 * LINK)
    assert [f.kind for f in analyse(slow_host, absolute, NAMES8, world=world)] == [
        "slow link"]


# -- records -> heat map ------------------------------------------------------------------

def _records(measures, names, expect_bps):
    from types import SimpleNamespace

    out = [SimpleNamespace(run_id="r1", timestamp="t", backend="gloo", hosts=names,
                           collective="allreduce", size_used=1 << 20,
                           time_us={"median": 1000.0},
                           method={"diagnose": {"step": "world", "label": "world", "round": 0,
                                                "pair": None}})]
    for m in measures:
        pair = [names[m.a], names[m.b]]
        base = {"step": m.kind, "label": f"{m.kind} {m.round}", "round": m.round, "pair": pair,
                "expected": {"link_bps": expect_bps, "latency_us": None,
                             "source": "--link-rate"}}
        size = 1 << 20
        out.append(SimpleNamespace(run_id="r1", timestamp="t", backend="gloo", hosts=pair,
                                   collective="sendrecv", size_used=8,
                                   time_us={"median": m.lat_us},
                                   method={"diagnose": {**base, "direction": None}}))
        for direction, rate in (("a->b", m.bw_ab), ("b->a", m.bw_ba)):
            out.append(SimpleNamespace(run_id="r1", timestamp="t", backend="gloo", hosts=pair,
                                       collective="broadcast", size_used=size,
                                       time_us={"median": size * 8 / rate * 1e6},
                                       method={"diagnose": {**base, "direction": direction}}))
    return out


def test_records_give_back_the_measurements_and_the_heat_map(tmp_path):
    pytest.importorskip("matplotlib")
    from ccbench.report.diagnose import diagnose_figures, measures_of, split_diagnose

    measures = _pairs(8, lambda a, b, r: LINK / 3 if 5 in (a, b) else 0.9 * LINK)
    records = _records(measures, NAMES8, LINK)
    rest, diagnosed = split_diagnose(records)
    assert rest == [] and len(diagnosed) == len(records)
    names, back, expect = measures_of(diagnosed)
    assert names == NAMES8 and expect.link_bps == LINK and len(back) == len(measures)
    for original, again in zip(measures, back, strict=True):
        assert (again.a, again.b) == (original.a, original.b)
        assert again.bw_ab == pytest.approx(original.bw_ab)
        assert again.lat_us == pytest.approx(original.lat_us)
    assert _kinds(analyse(back, expect, names)) == [("slow link", "host h5's link")]
    written = diagnose_figures(diagnosed, tmp_path)
    assert [p.name for p in written] == ["diagnose-r1.png"] and written[0].stat().st_size > 0


# -- the command's bad input: one line, exit 2 --------------------------------------------

def _ccbench(*args, env=None):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-m", "ccbench", *args], capture_output=True,
                          text=True, timeout=300, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root), **(env or {})})


def test_a_rank_gone_at_the_end_is_named_as_in_the_benchmark(tmp_path):
    """diagnose runs inside the benchmark's rank lifecycle (ccbench.run.lifecycle): its end is
    a step of its own with the benchmark's fault point, so a rank that exits there is found
    at the closing barrier and the verdict names its host's rank as ended (its process, not
    the network: the host still answers on every port; exit 1), in the records too (one
    verdict record, last)."""
    import json

    records = tmp_path / "diag.jsonl"
    proc = _ccbench("launch", "-n", "3", "diagnose", "--quick", "--no-compute", "-O",
                    str(records), env={"CCBENCH_FAULT": "shutdown:2:exit"})
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    ended = [line.split() for line in proc.stdout.splitlines() if "rank ended" in line]
    assert ended and ended[0][0] == "host" and ended[0][1].endswith(":r2's"), proc.stdout
    assert "stopped" not in proc.stdout.split("verdict:", 1)[1], proc.stdout
    assert "the end of the run" in proc.stderr and "did not arrive: 2" in proc.stderr
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    verdicts = [r for r in lines if r["method"]["diagnose"]["step"] == "verdict"]
    assert len(verdicts) == 1 and lines[-1] == verdicts[0]
    found = verdicts[0]["method"]["diagnose"]["findings"]
    host = ended[0][1].removesuffix("'s")
    assert [(f["kind"], f["hosts"]) for f in found if f["kind"] == "rank ended"] == [
        ("rank ended", [host])], found
    assert list(verdicts[0]["method"]["diagnose"]["ended"]) == [host]


def test_the_run_ends_with_the_verdicts_status_when_a_host_stopped(tmp_path):
    """srun and mpiexec report the highest status of the ranks: a host that stopped answering
    gave srun 3 (rank 0 ended with the verdict's 1, the other live ranks with the benchmark's
    EXIT_HUNG). Ranks started by hand, as srun starts them: rank 0 prints the verdict and ends
    with 1, the other live ranks end with 0 (before it: a bare mpiexec kills every rank once
    one ends with another status than 0, and then ends with 255)."""
    import os
    import secrets
    import subprocess
    import sys
    from pathlib import Path

    from ccbench.run.addresses import free_port

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "WORLD_SIZE": "3",
           "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "CCBENCH_FAULT": "shutdown:2:exit",
           "CCBENCH_CONTROL": f"127.0.0.1:{free_port('127.0.0.1')}",
           "CCBENCH_CONTROL_SECRET": secrets.token_hex(32)}
    ranks = [subprocess.Popen([sys.executable, "-m", "ccbench", "diagnose", "--quick",
                               "--no-compute", "--format", "json"],
                              env={**env, "RANK": str(rank)}, cwd=root,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(3)]
    ended = [(proc.returncode, out, err) for proc in ranks
             for out, err in [proc.communicate(timeout=240)]]
    assert [rc for rc, _out, _err in ended[:2]] == [1, 0], ended
    assert '"rank ended"' in ended[0][1] and not ended[1][1].strip(), ended


def test_a_flagged_run_ends_with_1_from_rank_0_and_0_from_the_others():
    """A bare mpiexec (hydra) kills every rank once one ends with a status other than 0, and
    then ends with 255: with every rank ending with the verdict's 1, a rank killed while it
    was ending gave 255 in 3 of 24 runs of a port down under MPI. (Rank 0 alone with 1 had
    given 255 before: the others then waited in MPI_Finalize, which they now skip.) Ranks
    started by hand, as srun and mpiexec start them: rank 0 prints the verdict and ends with
    1, the other with 0."""
    import os
    import secrets
    import subprocess
    import sys
    from pathlib import Path

    from ccbench.run.addresses import free_port

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "WORLD_SIZE": "2",
           "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "CCBENCH_CONTROL": f"127.0.0.1:{free_port('127.0.0.1')}",
           "CCBENCH_CONTROL_SECRET": secrets.token_hex(32)}
    ranks = [subprocess.Popen([sys.executable, "-m", "ccbench", "diagnose", "--link-rate", "1T",
                               "--no-compute", "--no-repeat", "--iters", "2"],
                              env={**env, "RANK": str(rank)}, cwd=root,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(2)]
    ended = [(proc.returncode, out, err) for proc in ranks
             for out, err in [proc.communicate(timeout=240)]]
    assert [rc for rc, _out, _err in ended] == [1, 0], ended
    assert "verdict:" in ended[0][1] and "diagnose flagged" in ended[0][2], ended
    assert "verdict:" not in ended[1][1], ended


def test_a_flagged_json_verdict_is_on_stdout_and_stderr_says_so():
    """--format json: the verdict is on stdout, and the line on stderr that gives the reason
    for exit status 1 says where it is (it said '(the verdict above)')."""
    import json

    proc = _ccbench("launch", "-n", "2", "diagnose", "--link-rate", "1T", "--no-compute",
                    "--no-repeat", "--iters", "2", "--format", "json")
    assert proc.returncode == 1, proc.stderr
    findings = json.loads(proc.stdout[proc.stdout.index("{"):])["findings"]
    word = "component" if len(findings) == 1 else "components"
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ccbench: error")]
    assert findings and errors == [f"ccbench: error: diagnose flagged {len(findings)} {word}: "
                                   f"exit status 1 (the verdict is on stdout)"], proc.stderr


@pytest.mark.parametrize("args, words", [
    (["diagnose", "--link-rate", "fast"], "unknown --link-rate 'fast'"),
    (["diagnose", "--planes", "eth0"], "--planes needs 2 or more interfaces"),
    (["diagnose", "--planes", "eth0,eth1", "--backend", "mpi"], "backend 'mpi' has none"),
    (["diagnose", "--planes", "eth0,eth1", "--backend", "ring@gloo"],
     "backend 'ring@gloo' has none"),
    (["diagnose", "--leaves", "1"], "at least 2 leaves"),
    (["diagnose"], "diagnose needs at least 2 hosts"),
    (["launch", "-n", "2", "diagnose", "--planes", "eth0,ccbnosuch9"], "lacks ccbnosuch9"),
])
def test_bad_input_is_one_line_exit_2(args, words):
    proc = _ccbench(*args)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("ccbench: error:") and words in lines[0], \
        proc.stderr


def test_one_pairs_latency_outlier_needs_an_absolute_expectation():
    measures = _pairs(8, lambda a, b, r: 0.9 * LINK)
    for m in measures:
        if {m.a, m.b} == {5, 7}:
            m.lat_us = 4000.0                 # as seen on the loaded testbed, in both tries
    assert analyse(measures, Expectation(), NAMES8) == []
    assert _kinds(analyse(measures, Expectation(None, 300.0, "--latency-us"), NAMES8)) == [
        ("high latency", "pair h5-h7 path")]


# a rank that is still reading the --planes gather when rank 0 has found the bad input: the
# delay makes the race of a loaded machine (srun: extra "lost the control store" lines,
# exit 3) happen every time
_SLOW_GATHER = '''
import time
from ccbench.run import control

_gather = control.ControlClient.gather

def gather(self, key, value, world_size, timeout):
    if key == "diag/planes" and self.rank != 0:
        self.set(f"{key}/{self.rank}", value)
        time.sleep(2.0)
    return _gather(self, key, value, world_size, timeout)

control.ControlClient.gather = gather
'''


def test_planes_missing_under_ranks_started_by_hand_is_one_line_exit_2(tmp_path):
    import os
    import secrets
    import subprocess
    import sys
    from pathlib import Path

    from ccbench.run.addresses import free_port

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "sitecustomize.py").write_text(_SLOW_GATHER)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{root}", "WORLD_SIZE": "3",
           "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "CCBENCH_CONTROL": f"127.0.0.1:{free_port('127.0.0.1')}",
           "CCBENCH_CONTROL_SECRET": secrets.token_hex(32)}
    ranks = [subprocess.Popen([sys.executable, "-m", "ccbench", "diagnose", "--planes",
                               "eth0,ccbnosuch9"], env={**env, "RANK": str(rank)}, cwd=root,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(3)]
    ended = [(proc.returncode, err) for proc in ranks
             for _out, err in [proc.communicate(timeout=120)]]
    lines = [line for _rc, err in ended for line in err.splitlines() if line.strip()]
    assert [rc for rc, _err in ended] == [2, 2, 2], ended
    assert len(lines) == 1 and "lacks ccbnosuch9" in lines[0], lines


def test_percent_of_expected_in_the_pairs_table_and_json():
    from types import SimpleNamespace

    from ccbench.diagnose.verdict import pair_lines, verdict_json

    measures = [PairMeasure("pairs", 0, 0, 1, 600.0, 0.5 * LINK, 0.25 * LINK),
                PairMeasure("pairs", 0, 2, 3, 150.0, 0.9 * LINK, 0.9 * LINK)]
    collected = SimpleNamespace(names=NAMES8[:4], measures=measures, steps=[], world=None,
                                compute_s={}, expect=Expectation(LINK, 300.0, "--link-rate"))
    lines = pair_lines(collected)
    assert "% of expected" in lines[0] and "latency % of expected" in lines[0]
    assert lines[1].split()[0] == "h0-h1" and lines[1].split()[-4:] == ["25", "%", "50", "%"]
    out = verdict_json(collected, [])
    assert out["pairs"][0]["pct_of_expected"] == 25.0           # the slower direction
    assert out["pairs"][0]["latency_pct_of_expected"] == 50.0   # 300 us expected, 600 measured
    assert out["measurements"][1]["pct_of_expected"] == 90.0
    relative = SimpleNamespace(**{**vars(collected), "expect": Expectation()})
    assert "pct_of_expected" not in verdict_json(relative, [])["pairs"][0]
    assert pair_lines(relative)[1].split()[-1] == "-"


def test_records_carry_percent_of_expected(tmp_path):
    import json

    records = tmp_path / "diag.jsonl"
    proc = _ccbench("launch", "-n", "2", "diagnose", "--link-rate", "1G", "--latency-us", "100",
                    "--no-compute", "--no-repeat", "--iters", "2", "--leaves", "2",
                    "--format", "json", "-O", str(records))
    assert proc.returncode in (0, 1), proc.stderr
    assert "pct_of_expected" in proc.stdout
    seen = set()
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    verdict = lines.pop()             # the run's verdict, after its measurements
    assert verdict["collective"] == "diagnose" and verdict["method"]["diagnose"]["step"] == \
        "verdict" and verdict["iterations"] == 0
    assert verdict["method"]["diagnose"]["findings"] == json.loads(
        proc.stdout[proc.stdout.index("{"):])["findings"]
    # --leaves 2, the count form: the leaf of each host, in the leaf step's records too
    leaf_hosts = verdict["method"]["diagnose"]["leaf_hosts"]
    assert sorted(h for members in leaf_hosts for h in members) == verdict["hosts"]
    assert [r["method"]["diagnose"].get("leaf_hosts") for r in lines
            if r["method"]["diagnose"]["step"] == "leaves"] == [leaf_hosts] * 3
    for record in lines:
        median, pct = record["time_us"]["median"], record["method"]["pct_of_expected"]
        if record["collective"] == "sendrecv":
            assert pct == pytest.approx(100 * 100.0 / median, abs=0.1)
        elif record["collective"] == "broadcast":
            assert pct == pytest.approx(100 * record["size_used"] * 8 / median / 1e3, abs=0.1)
        else:
            assert pct == pytest.approx(100 * record["busbw_gbps"] * 8, abs=0.1)
        seen.add(record["collective"])
    assert seen == {"allreduce", "sendrecv", "broadcast"}


def test_plan_of_grows_with_the_hosts_and_quick_grows_slower():
    from ccbench.commands.diagnose import plan_of

    full = {n: plan_of(["--link-rate", "50M", "--planes", "eth0,eth1"], n) for n in (4, 8, 16)}
    quick = {n: plan_of(["--link-rate", "50M", "--planes", "eth0,eth1", "--quick"], n)
             for n in (4, 8, 16)}
    assert [sum(s.kind == "pairs" for s in full[n][0]) for n in (4, 8, 16)] == [3, 7, 15]
    assert [sum(s.kind == "pairs" for s in quick[n][0]) for n in (4, 8, 16)] == [2, 3, 4]
    assert full[4][1] < full[8][1] < full[16][1]
    assert all(quick[n][1] < full[n][1] for n in (4, 8, 16))
    two_tier, _ = plan_of(["--leaves", "2"], 8)
    assert [s.kind for s in two_tier].count("leaves") == 1


def test_report_of_a_leaf_run_uses_the_recorded_leaves():
    from types import SimpleNamespace

    from ccbench.report.diagnose import leaves_of

    leaves = [[0, 2, 4, 6], [1, 3, 5, 7]]
    measures = _pairs(8, lambda a, b, r: 0.9 * LINK)
    measures += [PairMeasure("leaves", 0, a, b, 150, 0.3 * LINK, 0.3 * LINK, leaves=(0, 1))
                 for a, b in leaf_pairs(leaves)[0][2]]
    # records that do not name the leaves (the 2026-12-04 runs'): a finding, no crash
    assert [f.kind for f in analyse(measures, Expectation(), NAMES8)] == ["slow uplink"]
    record = SimpleNamespace(method={"diagnose": {"step": "leaves", "leaf_hosts": [
        [NAMES8[h] for h in members] for members in leaves]}})
    assert leaves_of([record], NAMES8) == leaves
    found = analyse(measures, Expectation(), NAMES8, leaves=leaves_of([record], NAMES8))
    assert [f.kind for f in found] == ["slow uplink"] and found[0].hosts == NAMES8


# -- the run's verdict in its records -> the report's heat map ----------------------------

def _write_run(path, measures, findings, collected, config):
    """The records a rank 0 writes with -O: every measurement, then the verdict record."""
    from types import SimpleNamespace

    from ccbench.diagnose.measure import _Rank, write_verdict
    from ccbench.diagnose.plan import Step

    rank = _Rank(config, SimpleNamespace(world_size=len(collected.names), launcher="local"),
                 None, None)
    rank.names, rank.run_id, rank.collected = collected.names, collected.run_id, collected

    def result(size, us):
        return {"size_asked": size, "size_used": size, "count": size, "iterations": 2,
                "time_us": {"median": us}, "samples_us": [us, us], "rank_median_us": [us, us],
                "algbw_gbps": size / us / 1e3, "busbw_gbps": size / us / 1e3, "wrong": 0}

    size = 1 << 20
    for m in measures:
        if m.error:                      # a port that did not answer: no measurement
            continue
        label = f"leaf{m.leaves[0]}-leaf{m.leaves[1]}" if m.leaves else \
            f"{m.kind} {m.plane or ''} {m.round}"
        step = Step(m.kind, label, [(m.a, m.b)], round=m.round, plane=m.plane)
        rank._records(step, m.a, m.b, {"lat": result(8, m.lat_us),
                                       "ab": result(size, size * 8 / m.bw_ab * 1e6),
                                       "ba": result(size, size * 8 / m.bw_ba * 1e6)})
    write_verdict(config, collected, findings)


def test_report_draws_the_verdict_the_run_recorded_with_leaves_as_a_count(tmp_path,
                                                                          monkeypatch):
    """--leaves 4 (the count form) and a plane port down: the -O file carries the leaf of
    every host and the run's findings in one verdict record after the measurements, which
    `ccbench report` draws as they are (not recomputed: the port that did not answer left
    no measurement), and which no measurement reader counts."""
    import argparse

    pytest.importorskip("matplotlib")
    from ccbench.cli import main as cli_main
    from ccbench.collectives import COLLECTIVES
    from ccbench.commands.diagnose import _config
    from ccbench.commands.diagnose import register as _register
    from ccbench.diagnose.measure import Collected
    from ccbench.errors import UsageError
    from ccbench.model.fit import calibrate
    from ccbench.records import load_records
    from ccbench.report import diagnose as report_diagnose

    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    _register(subparsers)
    out = tmp_path / "diag.jsonl"
    config, leaves = _config(parser.parse_args(["diagnose", "--leaves", "4", "-O", str(out)]))
    assert leaves == 4 and config.leaf_count == 4
    hosts = list(range(8))
    leaf_hosts = [hosts[leaf::4] for leaf in range(4)]
    measures = _pairs(8, lambda a, b, r: LINK / 3 if 5 in (a, b) else 0.9 * LINK)
    measures += [PairMeasure("leaves", 0, a, b, 150, 0.9 * LINK, 0.9 * LINK, leaves=(x, y))
                 for x, y, pairs in leaf_pairs(leaf_hosts) for a, b in pairs]
    for name in ("eth0", "eth1"):
        for number, r in enumerate(round_robin(8)):
            for a, b in r:
                measures.append(PairMeasure("planes", number, a, b, plane=name,
                                            error="no answer on eth1")
                                if name == "eth1" and 3 in (a, b) else
                                PairMeasure("planes", number, a, b, 150, 0.9 * LINK,
                                            0.9 * LINK, plane=name))
    findings = analyse(measures, Expectation(), NAMES8, leaves=leaf_hosts)
    assert {("port down", "host h3's plane eth1 port"), ("slow link", "host h5's link")} <= \
        set(_kinds(findings))
    collected = Collected(NAMES8, measures=measures, run_id="run4leaves",
                          leaves=leaf_hosts, meta={"launcher": "local", "world_size": 8})
    _write_run(out, measures, findings, collected, config)

    records = load_records(out)
    verdicts = [r for r in records if r.method["diagnose"]["step"] == "verdict"]
    assert len(verdicts) == 1 and records[-1] is verdicts[0]
    assert verdicts[0].collective not in COLLECTIVES
    assert verdicts[0].method["diagnose"]["leaf_hosts"] == [
        [NAMES8[h] for h in members] for members in leaf_hosts]
    # the measurements read back without the verdict record; calibrate leaves it out
    names, back, _ = report_diagnose.measures_of(records)
    assert names == NAMES8 and len(back) == sum(1 for m in measures if not m.error)
    with pytest.raises(UsageError, match="no records to calibrate on"):
        calibrate(verdicts)
    assert report_diagnose.leaves_of(records, NAMES8) == leaf_hosts

    drawn = []
    figure = report_diagnose._figure
    monkeypatch.setattr(report_diagnose, "_figure",
                        lambda names, measures, found, *a, **k: drawn.append(
                            (names, found, a, k)) or figure(names, measures, found, *a, **k))
    assert cli_main(["report", str(out), "-o", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "diagnose-run4leaves.png").stat().st_size > 0
    assert len(drawn) == 1
    names, found, _args, kwargs = drawn[0]
    assert names == NAMES8 and [f.to_json() for f in found] == [f.to_json() for f in findings]
    recomputed = _args[2] if len(_args) > 2 else kwargs.get("recomputed", False)
    assert recomputed is False


def test_a_rank_whose_process_ended_is_not_a_network_finding():
    """A rank killed mid-plan on a host that still answers on every port is `rank ended`
    (the process, not the network), its slow pairs explained; the library's long error is cut
    to its first sentence at a word."""
    from ccbench.diagnose.analyse import first_clause

    measures = _pairs(4, lambda a, b, r: 0.9 * LINK, rounds=round_robin(4)[:1])
    gloo = ("pairs round 2: gloo failed: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
            "Connection closed by peer [10.213.8.3]:52449. This is typically caused by a "
            "remote peer that ended")
    findings = analyse(measures, Expectation(), NAMES8[:4], ended={2: gloo})
    assert _kinds(findings) == [("rank ended", "host h2's rank")]
    assert findings[0].measured == "its process ended mid-plan"
    assert "the process, not the network" in findings[0].evidence
    assert "typically" not in findings[0].evidence
    assert first_clause("a b " * 60, 20) == "a b a b a b a b a b ..."


def test_a_flagged_mpi_rank_other_than_0_skips_mpi_finalize_as_rank_0_does(monkeypatch):
    """Rank 0 ends with the verdict's 1 and so skips MPI_Finalize (a failed rank must not
    wait in it); the others, ending with 0, waited there for it until the exit alarm, 5
    minutes with the whole job held (MPI, a slow port: 3 runs). They skip it too."""
    from ccbench.run import exit as run_exit

    ended: list[int] = []
    monkeypatch.setattr(run_exit, "_mpi_running", lambda: True)
    monkeypatch.setattr(run_exit.os, "_exit", lambda code: ended.append(code))
    monkeypatch.setitem(run_exit._SKIP, "finalize", False)
    with pytest.raises(SystemExit):
        run_exit.leave(0)                       # a healthy rank finalizes as usual
    assert ended == []
    run_exit.skip_finalize()
    with pytest.raises(SystemExit):             # (os._exit, stubbed here, returns)
        run_exit.leave(0)
    assert ended == [0]
