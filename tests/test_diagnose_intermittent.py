"""ccbench diagnose: every try is evidence (intermittent faults, one bad ECMP member, a
flapping port and its counters) and one-way faults name their direction."""

from __future__ import annotations

import random

from ccbench.diagnose.analyse import (
    Expectation,
    PairMeasure,
    analyse,
    suspicious_pairs,
    suspicious_tries,
)
from ccbench.diagnose.counters import counter_deltas, counter_findings, read_counters
from ccbench.diagnose.plan import round_robin

NAMES8 = [f"h{i}" for i in range(8)]
LINK = 50e6
ABSOLUTE = Expectation(LINK, None, "--link-rate")


def _tries(n, rate, kind="pairs", plane=None, seed=0, rounds=None):
    rng = random.Random(seed)
    out = []
    for number, r in enumerate(rounds if rounds is not None else round_robin(n)):
        for a, b in r:
            out.append(PairMeasure(kind, number, a, b, 300.0,
                                   rate(a, b, number) * rng.uniform(0.93, 1.0),
                                   rate(b, a, number) * rng.uniform(0.93, 1.0), plane=plane))
    return out


def _kinds(findings):
    return [(f.kind, f.component) for f in findings]


def test_a_slow_try_is_not_cancelled_by_a_fast_one():
    """One run of the issue: h1-h4 below 32 % in one try, 96 % in the other; the best try
    said healthy. Now the pair is tried until decided and named intermittent."""
    first = _tries(8, lambda a, b, r: 0.3 * LINK if {a, b} == {1, 4} else 0.95 * LINK)
    assert suspicious_pairs(first, ABSOLUTE) == [(1, 4)]
    fast = _tries(8, lambda a, b, r: 0.96 * LINK, kind="repeat", rounds=[[(1, 4)]])
    assert suspicious_pairs(first + fast, ABSOLUTE) == [(1, 4)]     # 1 slow of 2: undecided
    slow = _tries(8, lambda a, b, r: 0.3 * LINK, kind="repeat", rounds=[[(1, 4)]], seed=2)
    measures = first + fast + slow
    assert suspicious_pairs(measures, ABSOLUTE) == []
    findings = analyse(measures, ABSOLUTE, NAMES8)
    assert _kinds(findings) == [("intermittent", "pair h1-h4 path")]
    assert "slow in 2 of 3 tries" in findings[0].measured


def test_a_single_slow_try_of_four_is_noise():
    measures = _tries(8, lambda a, b, r: 0.95 * LINK)
    for seed in range(3):
        rate = 0.4 * LINK if seed == 0 else 0.95 * LINK
        measures += _tries(8, lambda a, b, r, rate=rate: rate, kind="repeat",
                           rounds=[[(2, 6)]], seed=seed)
    assert suspicious_pairs(measures, ABSOLUTE) == []
    assert analyse(measures, ABSOLUTE, NAMES8) == []


def test_bad_ecmp_member_is_named_on_its_plane():
    """h1<->h4 at 16 Mbit/s on plane eth1 only: the unpinned tries hash onto either plane,
    the pinned ones show it every run."""
    def bad(a, b, r):
        return 16e6 if {a, b} == {1, 4} and r % 2 else 0.95 * LINK
    measures = _tries(8, bad)
    measures += _tries(8, lambda a, b, r: 0.95 * LINK, kind="planes", plane="eth0")
    measures += _tries(8, lambda a, b, r: 16e6 if {a, b} == {1, 4} else 0.95 * LINK,
                       kind="planes", plane="eth1")
    assert ("eth1", 1, 4) in suspicious_tries(measures, ABSOLUTE)
    measures += [PairMeasure("planes", 0, 1, 4, 300.0, 16e6, 15.5e6, plane="eth1")]
    findings = analyse(measures, ABSOLUTE, NAMES8)
    assert _kinds(findings) == [("slow path", "pair h1-h4 path on plane eth1")]
    assert findings[0].measured.startswith("h1 -> h4: 15.9 Mbit/s; h4 -> h1: 15")


def test_flapping_port_is_intermittent_with_its_carrier_changes():
    def flap(a, b, r):
        return 5e6 if 3 in (a, b) and r in (1, 4) else 0.95 * LINK
    measures = _tries(8, flap)
    measures += _tries(8, lambda a, b, r: 0.95 * LINK, kind="planes", plane="eth1")
    for m in _tries(8, lambda a, b, r: 0.95 * LINK, kind="planes", plane="eth0"):
        if 3 in (m.a, m.b) and m.round % 2:
            m.error, m.bw_ab, m.bw_ba = "no answer on eth0", None, None
        measures.append(m)
    counters = {3: {"eth0": {"carrier_changes": 34, "state_before": "up", "state": "up"}}}
    findings = analyse(measures, ABSOLUTE, NAMES8, counters=counters)
    assert _kinds(findings) == [("intermittent", "host h3's plane eth0 port")]
    assert findings[0].measured.startswith("34 carrier changes during the run")
    # without the counters (a flap upstream of the host): the tries alone say so
    assert _kinds(analyse(measures, ABSOLUTE, NAMES8)) == [
        ("intermittent", "host h3's plane eth0 port")]


def test_intermittent_host_link_from_unpinned_tries_against_the_others():
    def flaky(a, b, r):
        return 8e6 if 6 in (a, b) and r % 2 == 0 else 0.95 * LINK
    measures = _tries(8, flaky)
    for again in range(3):                     # the repeat passes, as the ranks run them
        rounds = [[p] for p in suspicious_pairs(measures, ABSOLUTE)]
        if not rounds:
            break
        assert all(6 in p for r in rounds for p in r)
        measures += _tries(8, lambda a, b, r, s=again: 8e6 if s == 1 else 0.95 * LINK,
                           kind="repeat", rounds=rounds, seed=again)
    findings = analyse(measures, ABSOLUTE, NAMES8)
    assert _kinds(findings) == [("intermittent", "host h6's link")]


def test_one_way_host_fault_names_the_direction():
    measures = _tries(8, lambda a, b, r: 15e6 if a == 5 else 0.96 * LINK)
    findings = analyse(measures, ABSOLUTE, NAMES8)
    assert _kinds(findings) == [("slow link", "host h5's link")]
    assert findings[0].measured.startswith("h5 -> others: 1")
    assert "; others -> h5: 4" in findings[0].measured
    assert findings[0].evidence.startswith("one way (h5 -> others)")
    both = analyse(_tries(8, lambda a, b, r: 15e6 if 5 in (a, b) else 0.96 * LINK),
                   ABSOLUTE, NAMES8)
    assert not both[0].evidence.startswith("one way")


def test_counters_from_sysfs_and_rdma_ports(tmp_path):
    net = tmp_path / "class" / "net" / "eth1"
    (net / "statistics").mkdir(parents=True)
    ib = tmp_path / "class" / "infiniband" / "mlx5_3" / "ports" / "1"
    (ib / "counters").mkdir(parents=True)

    def write(carrier, errors, state, downed, symbols):
        (net / "operstate").write_text(state + "\n")
        (net / "carrier_changes").write_text(f"{carrier}\n")
        for key in ("rx_errors", "tx_errors", "rx_dropped", "tx_dropped"):
            (net / "statistics" / key).write_text(f"{errors if key == 'rx_errors' else 0}\n")
        (ib / "state").write_text("4: ACTIVE\n")
        (ib / "counters" / "link_downed").write_text(f"{downed}\n")
        (ib / "counters" / "symbol_error").write_text(f"{symbols}\n")
        return read_counters(str(tmp_path))

    before = write(2, 0, "up", 0, 0)
    assert before["eth1"]["carrier_changes"] == 2 and before["mlx5_3/1"]["state"] == "active"
    after = write(36, 5, "up", 3, 0)
    deltas = counter_deltas(before, after)
    assert deltas["eth1"]["carrier_changes"] == 34 and deltas["eth1"]["rx_errors"] == 5
    found = counter_findings({2: deltas}, NAMES8, ["eth0", "eth1"])
    assert _kinds(found) == [("intermittent", "host h2's plane eth1 port"),
                             ("intermittent", "host h2's mlx5_3 port 1")]
    assert "5 rx errors" in found[0].evidence and "3 link downed" in found[1].measured
    quiet = write(36, 5, "up", 3, 7)
    assert _kinds(counter_findings({2: counter_deltas(after, quiet)}, NAMES8, [])) == [
        ("port errors", "host h2's mlx5_3 port 1")]
    gone = write(37, 5, "down", 3, 7)
    assert _kinds(counter_findings({2: counter_deltas(quiet, gone)}, NAMES8, ["eth1"])) == [
        ("port down", "host h2's plane eth1 port")]


def test_counters_of_this_namespace_over_netlink():
    found = read_counters()
    assert "lo" not in found
    for row in found.values():
        assert isinstance(row["state"], str)


def test_a_port_that_does_not_answer_before_the_library_starts():
    from ccbench.diagnose.counters import reach_findings

    # h6's eth1 gives no answer to 6 of the 7 others (h2's own probe got through); h2 got
    # no answer from anyone at all ('*': a firewall, not a port)
    failed = {p: {6: ["eth1"]} for p in range(8) if p not in (2, 6)}
    failed[3][5] = ["eth0"]                                  # one prober alone: noise
    failed[4][7] = ["eth0", "eth1", "*"]
    found = reach_findings(failed, NAMES8, ["eth0", "eth1"])
    assert _kinds(found) == [("port down", "host h6's plane eth1 port")]
    assert "6 of 7 hosts got no answer" in found[0].evidence
    measures = _tries(8, lambda a, b, r: 0.95 * LINK)
    assert _kinds(analyse(measures, ABSOLUTE, NAMES8, reach=failed)) == [
        ("port down", "host h6's eth1 port")]            # no --planes: no plane named


def _budget_args(*argv):
    from ccbench.cli import OneLineParser
    from ccbench.commands.diagnose import _arguments, _config

    parser = OneLineParser(prog="ccbench diagnose")
    _arguments(parser)
    args = parser.parse_args(list(argv))
    return args, _config(args)[0]


def test_first_run_without_flags_is_sized_from_the_world_step_and_fits_the_budget():
    """The issue's case: 8 hosts at 13 Mbit/s, no --link-rate: 4 MiB per bandwidth step and
    no verdict after 8 minutes. Now the world step measures the rate, the size follows it,
    and the plan is cut to --budget (default 180 s), saying what it cut."""
    from ccbench.commands.diagnose import PROBE_SIZE, fit_budget

    args, config = _budget_args()
    assert config.size == PROBE_SIZE                 # the world step's, before any rate
    settings, seconds, cuts = fit_budget(args, config, 8, 13e6, sized=True)
    assert settings["size"] < 128 << 10 and seconds <= args.budget and cuts == []
    tight, config = _budget_args("--budget", "10", "--planes", "eth0,eth1")
    settings, seconds, cuts = fit_budget(tight, config, 16, 13e6, sized=True)
    assert cuts[0] == "iterations 5 -> 2" and settings["iters"] == 2
    assert "pair rounds: every pair -> log2 N (--quick)" in cuts and settings["quick"]
    assert seconds < fit_budget(args, config, 16, 13e6, sized=True)[1]
    fixed, config = _budget_args("--size", "1M", "--budget", "10000")
    assert fit_budget(fixed, config, 8, 13e6, sized=False)[0]["size"] == 1 << 20


def test_a_cluster_a_little_below_expected_has_no_slow_or_intermittent_path():
    """Seen under MPI at load 30 on 2 cores (busy-polling ranks): every pair at 26-42
    Mbit/s of 50, tries just below 60 % here and there; none is out of line with the others."""
    rng = random.Random(7)
    measures = _tries(8, lambda a, b, r: rng.uniform(26e6, 42e6))
    for again in range(3):
        rounds = [[p] for p in suspicious_pairs(measures, ABSOLUTE)]
        if not rounds:
            break
        measures += _tries(8, lambda a, b, r: rng.uniform(26e6, 42e6), kind="repeat",
                           rounds=rounds, seed=again)
    kinds = {f.kind for f in analyse(measures, ABSOLUTE, NAMES8)}
    assert kinds <= {"below expected"}, kinds          # the cluster as a whole, if anything


def test_one_way_host_fault_on_every_plane_names_the_direction():
    def oneway(a, b, r):
        return 15e6 if a == 5 else 0.96 * LINK
    measures = _tries(8, oneway)
    for plane in ("eth0", "eth1"):
        measures += _tries(8, oneway, kind="planes", plane=plane)
    findings = analyse(measures, ABSOLUTE, NAMES8)
    assert _kinds(findings) == [("slow link", "host h5's link (every plane)")]
    assert findings[0].measured.startswith("h5 -> others: 1")
    assert findings[0].evidence.startswith("one way (h5 -> others); ")
