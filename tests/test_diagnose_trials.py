"""ccbench diagnose: what operators' trials on the dual-plane testbed found wrong, each from
synthetic measurements shaped as the runs were (tests/test_diagnose_intermittent.py has the
same helpers' kind)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from ccbench.diagnose.analyse import Expectation, PairMeasure, analyse
from ccbench.diagnose.plan import round_robin

ROOT = Path(__file__).resolve().parents[1]
NAMES8 = [f"h{i}" for i in range(8)]
LINK = 50e6
ABSOLUTE = Expectation(LINK, None, "--link-rate")


def _tries(n, rate, kind="pairs", plane=None, seed=0, rounds=None, down=()):
    rng = random.Random(seed)
    out = []
    for number, r in enumerate(rounds if rounds is not None else round_robin(n)):
        for a, b in r:
            if {a, b} & set(down):
                out.append(PairMeasure(kind, number, a, b, plane=plane,
                                       error=f"no answer on {plane}"))
                continue
            out.append(PairMeasure(kind, number, a, b, 300.0,
                                   rate(a, b, number) * rng.uniform(0.93, 1.0),
                                   rate(b, a, number) * rng.uniform(0.93, 1.0), plane=plane))
    return out


def _kinds(findings):
    return sorted((f.kind, f.component) for f in findings)


def test_two_faults_on_one_plane_do_not_make_the_other_ports_intermittent():
    """h2's eth1 port down and h5's eth1 port at 1/4: every other host has two bad pairs on
    eth1 (with h2 and with h5), which flagged all six of them `intermittent` (3 of 3 runs).
    The pairs a flagged port explains are not evidence against their other host."""
    fine = 0.95 * LINK
    measures = _tries(8, lambda a, b, r: fine)
    measures += _tries(8, lambda a, b, r: fine, kind="planes", plane="eth0")

    def slow5(a, b, r):
        return LINK / 4 if 5 in (a, b) else fine
    for seed in range(2):            # the first pass and the repeat of its slow pairs
        measures += _tries(8, slow5, kind="planes", plane="eth1", seed=seed, down=(2,),
                           rounds=None if seed == 0 else [[p] for r in round_robin(8)
                                                          for p in r if 5 in p and 2 not in p])
    findings = analyse(measures, ABSOLUTE, NAMES8)
    assert _kinds(findings) == [("port down", "host h2's plane eth1 port"),
                                ("slow port", "host h5's plane eth1 port")], _kinds(findings)


def test_two_slow_hosts_do_not_make_the_others_intermittent():
    """The same on the unpinned pairs: h1 and h6 slow (their links), every other host has
    two slow pairs; only h1 and h6 are named."""
    fine = 0.95 * LINK

    def slow(a, b, r):
        return LINK / 4 if {a, b} & {1, 6} else fine
    measures = _tries(8, slow)
    measures += _tries(8, slow, kind="repeat", seed=1,
                       rounds=[[p] for r in round_robin(8) for p in r if {1, 6} & set(p)])
    findings = analyse(measures, ABSOLUTE, NAMES8)
    assert _kinds(findings) == [("slow link", "host h1's link"),
                                ("slow link", "host h6's link")], _kinds(findings)


def test_a_healthy_host_under_load_is_not_slow_compute():
    """Load 15-30 on 2 cores: every host's repeats spread 3x (a burst of other work lands on
    a round); one healthy host caught bursts in 4 of 5 rounds at 2.2-3x the others' median
    and read `slow compute`. The factor is now at least the hosts' own repeat spread."""
    rng = random.Random(3)
    compute = {}
    for h in range(8):
        times = [0.15 * rng.uniform(0.95, 1.05) for _ in range(5)]
        times[h % 5] = 0.48                      # each host's burst, in some round
        compute[h] = times
    compute[6] = [0.36, 0.40, 0.15, 0.45, 0.35]  # the healthy host hit in 4 rounds
    measures = _tries(8, lambda a, b, r: 0.95 * LINK)
    assert analyse(measures, ABSOLUTE, NAMES8, compute) == []
    compute[6] = [1.6, 1.5, 1.7, 1.4, 1.6]       # a host held to a tenth of a core: named
    assert _kinds(analyse(measures, ABSOLUTE, NAMES8, compute)) == [
        ("slow compute", "host h6 compute")]


def test_a_world_collective_slow_only_in_its_median_under_load_is_not_flagged():
    """The world allreduce under load: a median at 30 % of the link while its best
    iteration reached 80 % read `slow collective`; the run's own best iteration counts."""
    healthy = _tries(8, lambda a, b, r: 0.95 * LINK)
    world = {"label": "allreduce", "time_us": 2.7e6, "busbw_bps": 0.3 * LINK,
             "best_busbw_bps": 0.8 * LINK}
    assert analyse(healthy, ABSOLUTE, NAMES8, world=world) == []
    world["best_busbw_bps"] = 0.2 * LINK         # slow in every iteration: flagged
    assert _kinds(analyse(healthy, ABSOLUTE, NAMES8, world=world)) == [
        ("slow collective", "cluster (world allreduce)")]


def test_a_library_start_up_that_timed_out_is_a_finding():
    """gloo's start-up not finished within --timeout, rank 2 never at it: the verdict said
    `healthy (no finding)` with exit 1 and `ranks that did not arrive: unknown`."""
    startup = {"library": "gloo", "timeout_s": 15.0, "arrived": False, "never_arrived": [3, 6],
               "ranks": [3, 6], "world_size": 8}
    findings = analyse([], ABSOLUTE, NAMES8, startup=startup)
    assert _kinds(findings) == [("start-up timed out", "gloo start-up")]
    assert findings[0].measured == "never arrived: h3, h6" and findings[0].hosts == ["h3", "h6"]
    startup.update(arrived=True, never_arrived=[0, 1, 2, 3, 4, 5, 6, 7], ranks=list(range(8)))
    assert analyse([], ABSOLUTE, NAMES8, startup=startup)[0].measured.startswith(
        "never finished: h0, h1")


@pytest.mark.matrix
def test_start_up_timeout_under_the_local_launcher_ends_with_a_verdict_and_1():
    """One rank held back before gloo's start-up (CCBENCH_FAULT=init:2:late) past --timeout
    15: a verdict naming its host, exit 1 from every rank, the line naming the rank."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), CCBENCH_FAULT="init:2:late",
               CCBENCH_FAULT_LATE_S="120")
    proc = subprocess.run([sys.executable, "-m", "ccbench", "launch", "-n", "4", "diagnose",
                           "--backend", "gloo", "--timeout", "15", "--no-compute", "--iters",
                           "2", "--format", "json"], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 1, proc.stderr[-2000:]
    findings = json.loads(proc.stdout)["findings"]
    assert [(f["kind"], f["measured"]) for f in findings] == [
        ("start-up timed out", "never arrived: " + findings[0]["hosts"][0])]
    assert findings[0]["hosts"][0].endswith(":r2")
    assert "ranks that did not arrive: 2" in proc.stderr


def test_a_port_down_mid_run_is_found_by_probing_again_when_the_run_stops():
    """A plane port set down mid-run hung its pair's connection; the run stopped with `host
    stopped` (rank 0) or no verdict (exit 3, another rank first). Rank 0 now probes every
    host's addresses again: the port that stopped answering is a `port down`, the hosts
    that waited on it are not stopped."""
    from ccbench.diagnose.counters import mid_run_down

    labels = {h: ["eth0", "eth1"] for h in range(8)}
    groups = dict.fromkeys(range(8), 0)
    down, silent = mid_run_down(0, [[2, ["eth1"]]], labels, groups)
    assert down == [(2, "eth1")] and silent == []
    # this host's own eth1 down: no other host answers on eth1
    down, _ = mid_run_down(0, [[h, ["eth1"]] for h in range(1, 8)], labels, groups)
    assert down == [(0, "eth1")]
    # a host that answers on nothing is silent (stopped or all its links down), not a port
    down, silent = mid_run_down(0, [[5, ["eth0", "eth1", "*"]]], labels, groups)
    assert down == [] and silent == [5]
    # rails: units host x 2 + rail; h0's rail-1 plane-1 port down: every other host's rail 1
    # gives no answer on plane 1 (h0's own rail 1, on this machine, answers)
    rails = {u: ["0", "1"] for u in range(8)}
    down, _ = mid_run_down(0, [[u, ["1"]] for u in (3, 5, 7)], rails,
                           {u: u % 2 for u in range(8)}, local={0, 1})
    assert down == [(1, "1")]
    before = _tries(8, lambda a, b, r: 0.95 * LINK, kind="planes", plane="eth1",
                    rounds=round_robin(8)[:1])          # the plane's first round, fine
    findings = analyse(before, ABSOLUTE, NAMES8, midrun={"step": "plane eth1 pairs round 2/7",
                                                     "why": "timed out after 30 s",
                                                     "down": [[2, "eth1"]]})
    assert _kinds(findings) == [("port down", "host h2's plane eth1 port")]


def test_a_port_its_counters_found_down_explains_its_pair_on_that_plane():
    """Set down between two plane rounds: its counters say so, and its one pair probed after
    got no answer; that pair read as a second finding, `path down`."""
    fine = 0.95 * LINK
    measures = _tries(8, lambda a, b, r: fine)
    measures += _tries(8, lambda a, b, r: fine, kind="planes", plane="eth1",
                       rounds=round_robin(8)[:6])
    measures += _tries(8, lambda a, b, r: fine, kind="planes", plane="eth1",
                       rounds=round_robin(8)[6:], down=(2,))
    counters = {2: {"eth1": {"carrier_changes": 1, "state_before": "up", "state": "down"}}}
    findings = analyse(measures, ABSOLUTE, NAMES8, counters=counters)
    assert _kinds(findings) == [("port down", "host h2's plane eth1 port")], _kinds(findings)


def _compute(slow_host, hosts=8, rounds=5, typical=0.24, slow=3.3):
    return {h: [slow if h == slow_host else typical * (1 + 0.05 * ((h + k) % 3))
                for k in range(rounds)] for h in range(hosts)}


def test_a_host_slow_to_compute_is_no_evidence_of_a_path_on_a_plane():
    """h2 held to 5 % of a core (cgroup CPU quota): named `host h2 compute`, and also
    `pair h2-h7 path on plane eth0  slow path` (h7 -> h2 at 21 Mbit/s in 2 of 2 tries) and
    `pair h2-h3 path on plane eth1  intermittent` (2 of 4 tries). A host slow to compute
    explains its own pairs on every plane: they are set aside, and the evidence says so."""
    fine = 0.96 * LINK

    def on(slow_pair, slow_rounds):          # into h2, in those rounds
        def rate(a, b, r):
            return 21e6 if {a, b} == set(slow_pair) and b == 2 and r in slow_rounds else fine
        return rate
    measures = _tries(8, lambda a, b, r: 0.5 * LINK if (a, b) == (1, 2) else fine)
    measures += _tries(8, lambda a, b, r: fine, kind="repeat", seed=1,
                       rounds=[[(1, 2)]])
    measures += _tries(8, on((2, 7), {6}), kind="planes", plane="eth0")
    measures += _tries(8, on((2, 7), {0}), kind="planes", plane="eth0", seed=1,
                       rounds=[[(2, 7)]])
    measures += _tries(8, on((2, 3), {1}), kind="planes", plane="eth1")
    for seed, slow_round in ((1, set()), (2, set()), (3, {0})):
        measures += _tries(8, on((2, 3), slow_round), kind="planes", plane="eth1", seed=seed,
                           rounds=[[(2, 3)]])
    findings = analyse(measures, ABSOLUTE, NAMES8, compute_s=_compute(2))
    assert _kinds(findings) == [("slow compute", "host h2 compute")], _kinds(findings)
    evidence = findings[0].evidence
    assert "set aside" in evidence and "h2-h7 on eth0" in evidence \
        and "h2-h3 on eth1" in evidence, evidence


def test_a_flapping_port_does_not_hide_a_bad_ecmp_member_on_its_plane():
    """h1<->h4 on eth1 at 16 Mbit/s (one bad ECMP member) while h6's eth1 flaps: the flap
    was named from its counters, but h1-h6's `no answer` on eth1 counted against h1, so the
    ECMP member read as `host h1's plane eth1 port  intermittent` and the path was never
    named. A pair with a port its own counters found flapping is that port's evidence."""
    fine = 0.96 * LINK

    def ecmp(a, b, r):
        return 15.3e6 if {a, b} == {1, 4} else fine
    measures = _tries(8, lambda a, b, r: fine)
    measures += _tries(8, lambda a, b, r: fine, kind="planes", plane="eth0")
    measures += _tries(8, ecmp, kind="planes", plane="eth1")
    measures = [m if not (m.plane == "eth1" and {m.a, m.b} == {1, 6}) else
                PairMeasure("planes", m.round, m.a, m.b, plane="eth1",
                            error="no answer on eth1") for m in measures]
    measures += _tries(8, ecmp, kind="planes", plane="eth1", seed=1, rounds=[[(1, 4)]])
    counters = {6: {"eth1": {"carrier_changes": 23, "state_before": "up", "state": "down",
                             "rx_dropped": 1, "tx_dropped": 4}}}
    findings = analyse(measures, ABSOLUTE, NAMES8, counters=counters)
    assert _kinds(findings) == [("intermittent", "host h6's plane eth1 port"),
                                ("slow path", "pair h1-h4 path on plane eth1")], \
        _kinds(findings)


def test_a_one_way_slow_port_says_its_direction():
    """h3's eth0 slow on its sending side only: `slow port` with one rate; a port, as a
    link, is measured per direction, and `one way (h3 -> others)` leads its evidence."""
    fine = 0.96 * LINK

    def oneway(a, b, r):
        return 15e6 if a == 3 else fine
    measures = _tries(8, lambda a, b, r: fine)
    measures += _tries(8, oneway, kind="planes", plane="eth0")
    measures += _tries(8, oneway, kind="planes", plane="eth0", seed=1,
                       rounds=[[p] for r in round_robin(8) for p in r if 3 in p])
    measures += _tries(8, lambda a, b, r: fine, kind="planes", plane="eth1")
    findings = analyse(measures, ABSOLUTE, NAMES8)
    assert _kinds(findings) == [("slow port", "host h3's plane eth0 port")], _kinds(findings)
    port = findings[0]
    assert port.measured.startswith("h3 -> others: 1") and "others -> h3: 4" in port.measured, \
        port.measured
    assert port.evidence.startswith("one way (h3 -> others); "), port.evidence


def test_pairs_measured_after_a_port_went_down_are_no_evidence():
    """MPI, h6's eth1 set down mid-plan: pairs without h6 measured after it were slow to
    answer (15 ms), and h0's and h7's links were named `high latency` beside the port in 3
    of 12 runs. h6's rank noted when it saw its port go down; the pair steps measured after
    that are set aside (the port finding says how many)."""
    from ccbench.diagnose.analyse import PairMeasure

    rounds = round_robin(8)[:3]
    measures = [PairMeasure("pairs", n, a, b, 15000.0 if n >= 1 else 300.0,
                            0.95 * LINK, 0.95 * LINK)
                for n, r in enumerate(rounds) for a, b in r]
    latency = Expectation(LINK, 500.0, "--link-rate")
    midrun = {"step": "pairs round 4/7", "why": "its host's port eth1 went down",
              "down": [[6, "eth1"]]}
    assert ("high latency", "host h0's link") in _kinds(
        analyse(measures, latency, NAMES8, midrun=midrun))
    midrun["set_aside"] = [["pairs", 1, None], ["pairs", 2, None]]
    findings = analyse(measures, latency, NAMES8, midrun=midrun)
    assert _kinds(findings) == [("port down", "host h6's eth1 port")]
    assert findings[0].evidence.endswith("; the 2 pair steps measured after it went down "
                                         "set aside"), findings[0].evidence
