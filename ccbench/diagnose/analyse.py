"""Measurements -> findings: which host's link, pair's path, uplink, plane port or host's
compute is out of line, against what was expected.

Expected values come, in this order, from `--link-rate` / `--latency-us`, a calibrated
model (its beta and alpha), the NIC speed the OS reports, or, failing all, the pairs
themselves (median over pairs; a path counts as slow only when it is also far outside their
spread, MAD). Attribution, so that one fault gives one finding:

* a host whose pairs are slow in most of its pairs (at least 2, at least 2/3): its link;
* the plane partition names a host's plane port (down: no answer on that plane; slow: all its
  ring pairs on that plane slow), or a whole plane; the host's slow pairs are explained by it;
* the leaf partition names an uplink when the flows between two leaves are slow and the
  hosts' own links are not; cross-leaf pairs slow only by sharing it are explained by it;
* each host's time for the same fixed work, round by round against the others': its compute (a host that
  is slow to compute also sends slowly; that is explained by it);
* whatever slow pair is left: that pair's path.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict

from ccbench.units import rate_text

if TYPE_CHECKING:
    from ccbench.diagnose.counters import CounterDelta, MidRun

__all__ = ["SLOW", "Expectation", "Finding", "FindingJson", "PairMeasure", "PairMeasureJson", "first_clause",
           "PairRow", "StartupEvidence", "WorldResult", "analyse", "pair_table",
           "port_component", "suspicious_pairs"]

SLOW = 0.6              # a path below 60 % of what is expected is slow
MAD_SIGMAS = 4.0        # relative expectation: and more than 4 robust sigmas below the median
LAT_FACTOR = 3.0        # a latency above 3x the expected one ...
LAT_EXTRA_US = 100.0    # ... and at least 100 us above it is high
HOST_SHARE = 2 / 3      # a host is blamed when at least this share of its pairs is slow
COMPUTE_FACTOR = 2.0    # a host taking 2x the others' median time for the same work ...
COMPUTE_ROUNDS_SHARE = 0.8   # ... in 4 of 5 rounds
COMPUTE_EXTRA_S = 0.02
INTERMITTENT_TRIES = 4       # a pair slow in some tries, fine in others: tried up to 4 times
INTERMITTENT_MIN_SLOW = 2    # ... and intermittent when slow in at least 2 of them


class TryFields(TypedDict):
    """What one try of one pair says in the verdict JSON, but for which pair it was."""

    kind: str
    round: int
    lat_us: NotRequired[float]
    bw_ab: NotRequired[float]
    bw_ba: NotRequired[float]
    plane: NotRequired[str]
    leaves: NotRequired[tuple[int, int]]
    error: NotRequired[str]


class PairMeasureJson(TryFields):
    """PairMeasure in the verdict JSON: the fields that are not None, the hosts by number."""

    a: int
    b: int


@dataclass(slots=True)
class PairMeasure:
    """One pair in one step. Rates are payload bits per second of a one-way transfer
    (a's broadcast to b, then b's to a); None where the step did not measure it."""

    kind: str                    # pairs | repeat | leaves | planes
    round: int
    a: int
    b: int
    lat_us: float | None = None
    bw_ab: float | None = None
    bw_ba: float | None = None
    plane: str | None = None
    leaves: tuple[int, int] | None = None
    error: str | None = None     # the pair could not be measured (planes: no answer)

    @property
    def bw(self) -> float | None:
        rates = [r for r in (self.bw_ab, self.bw_ba) if r is not None]
        return min(rates) if rates else None

    def to_json(self) -> PairMeasureJson:
        out: PairMeasureJson = {"kind": self.kind, "round": self.round, "a": self.a, "b": self.b}
        if self.lat_us is not None:
            out["lat_us"] = self.lat_us
        if self.bw_ab is not None:
            out["bw_ab"] = self.bw_ab
        if self.bw_ba is not None:
            out["bw_ba"] = self.bw_ba
        if self.plane is not None:
            out["plane"] = self.plane
        if self.leaves is not None:
            out["leaves"] = self.leaves
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass(slots=True)
class Expectation:
    link_bps: float | None = None
    latency_us: float | None = None
    source: str = "relative"          # link-rate | model | nic | relative

    def rate_percent(self, bps: float | None) -> float | None:
        """A measured rate as % of the expected link rate (None: no absolute expectation)."""
        return _percent(bps, self.link_bps)

    def latency_percent(self, us: float | None) -> float | None:
        """Expected / measured latency as %: below 100 is worse than expected, as a rate's."""
        return _percent(self.latency_us, us)


def port_component(host: str, plane: str) -> str:
    """`host h3's plane eth1 port`; a rail's NIC (`h5 rail 1`, --rails): `host h5 rail 1
    plane 1 port`, and its NIC itself (`NIC`): `host h5 rail 1 NIC`."""
    if " rail " in host:
        return f"host {host} NIC" if plane == "NIC" else f"host {host} plane {plane} port"
    return f"host {host}'s plane {plane} port"


def link_component(host: str) -> str:
    """`host h3's link`; a rail's NIC (--rails): `host h5 rail 1 NIC`."""
    return f"host {host} NIC" if " rail " in host else f"host {host}'s link"


def _percent(part: float | None, whole: float | None) -> float | None:
    if part is None or whole is None or part <= 0 or whole <= 0:
        return None
    return round(100.0 * part / whole, 1)


class FindingJson(TypedDict):
    component: str
    kind: str
    measured: str
    expected: str
    evidence: str
    confidence: str
    hosts: list[str]
    pairs: list[list[str]]


@dataclass(slots=True)
class Finding:
    component: str
    kind: str
    measured: str
    expected: str
    evidence: str
    confidence: str
    hosts: list[str] = field(default_factory=list)
    pairs: list[list[str]] = field(default_factory=list)

    def to_json(self) -> FindingJson:
        return {"component": self.component, "kind": self.kind, "measured": self.measured,
                "expected": self.expected, "evidence": self.evidence,
                "confidence": self.confidence, "hosts": list(self.hosts),
                "pairs": [list(pair) for pair in self.pairs]}


class WorldResult(TypedDict):
    """The world step's allreduce as rank 0 measured it (`Collected.world`)."""

    label: str
    time_us: float               # the median iteration
    busbw_bps: float
    best_busbw_bps: float        # the fastest iteration's: the run's own spread


class StartupEvidence(TypedDict):
    """The library's start-up that did not finish within --timeout (`Collected.startup`)."""

    library: str
    timeout_s: float
    arrived: bool                # every rank reached it (then never_arrived: never finished)
    never_arrived: list[int]     # hosts
    ranks: list[int]
    world_size: int


class PairRow(TypedDict):
    """One pair of `pair_table`: the best of its tries and the tries themselves."""

    bw_ab: float | None
    bw_ba: float | None
    lat_us: float | None
    tries: int
    rounds: list[str]
    samples: list[PairMeasure]
    bw: float | None             # the slower direction of the best rates


def pair_table(measures: list[PairMeasure]) -> dict[tuple[int, int], PairRow]:
    """(a, b) -> the best of its tries (pairs and repeat steps): the highest rate per
    direction and the lowest latency, how many tries there were, and every try itself
    (`samples`: one PairMeasure per try, in order). The best try draws the pair's place in
    the table; every try is evidence (`slow_tries`, `intermittent_findings`): one bad ECMP
    member or a flapping port is slow in some tries and fine in others."""
    table: dict[tuple[int, int], PairRow] = {}
    for m in measures:
        if m.kind not in ("pairs", "repeat") or m.error:
            continue
        row = table.setdefault((m.a, m.b), {"bw_ab": None, "bw_ba": None, "lat_us": None,
                                            "tries": 0, "rounds": [], "samples": [],
                                            "bw": None})
        row["tries"] += 1
        row["rounds"].append(f"{m.kind} {m.round + 1}")
        row["samples"].append(m)
        directions: tuple[tuple[Literal["bw_ab", "bw_ba"], float | None], ...] = \
            (("bw_ab", m.bw_ab), ("bw_ba", m.bw_ba))
        for key, value in directions:
            if value is not None:
                best = row[key]
                row[key] = value if best is None else max(best, value)
        if m.lat_us is not None:
            row["lat_us"] = m.lat_us if row["lat_us"] is None else min(row["lat_us"], m.lat_us)
    for row in table.values():
        rates = [r for r in (row["bw_ab"], row["bw_ba"]) if r is not None]
        row["bw"] = min(rates) if rates else None
    return table


def _mad(values: list[float]) -> tuple[float, float]:
    median = statistics.median(values)
    return median, 1.4826 * statistics.median(abs(v - median) for v in values)


def _cluster_misses(table: dict[tuple[int, int], PairRow], expect: Expectation) -> bool:
    """Every path misses the absolute expectation: the pairs' median is below SLOW of it and
    no one host explains that (the pairs without it miss too). One slow host is in 2/n of
    the pairs: at 4 hosts in half of them, where the median alone falls either side."""
    if expect.link_bps is None:
        return False
    rates = {pair: row["bw"] for pair, row in table.items() if row["bw"] is not None}
    bound = SLOW * expect.link_bps
    if not rates or statistics.median(rates.values()) >= bound:
        return False
    for host in {h for pair in rates for h in pair}:
        others = [bw for pair, bw in rates.items() if host not in pair]
        if others and statistics.median(others) >= bound:
            return False                  # this host's pairs pulled the median down
    return True


class _Reference:
    """What a pair's rate and latency are held against."""

    def __init__(self, table: dict[tuple[int, int], PairRow], expect: Expectation):
        rates = [row["bw"] for row in table.values() if row["bw"] is not None]
        lats = [row["lat_us"] for row in table.values() if row["lat_us"] is not None]
        self.expect = expect
        self.median_bw, self.mad_bw = _mad(rates) if rates else (math.nan, 0.0)
        self.median_lat, self.mad_lat = _mad(lats) if lats else (math.nan, 0.0)
        # against an absolute expectation that the whole cluster misses, the outliers are
        # still found against the pairs' own median
        self.cluster_slow = _cluster_misses(table, expect)
        self.bw = (expect.link_bps if expect.link_bps is not None and not self.cluster_slow
                   else self.median_bw)
        self.lat = expect.latency_us if expect.latency_us is not None else self.median_lat
        # the good pairs (upper quartile; 3 or more pairs): a rate is slow only when it is
        # also out of line with them, so that a cluster all a little below the expectation
        # (CPU-starved ranks: 26-42 Mbit/s of 50 at load 30 on 2 cores) has no slow paths
        self.good_bw = (statistics.quantiles(rates, n=4, method="inclusive")[2]
                        if len(rates) >= 3 else None)

    def slow(self, bw: float | None, scale: float = 1.0) -> bool:
        if bw is None or math.isnan(self.bw):
            return False
        if bw >= SLOW * self.bw * scale:
            return False
        if self.good_bw is not None and bw >= SLOW * self.good_bw * scale:
            return False
        if self.expect.link_bps is None or self.cluster_slow:       # relative: also an outlier
            return bw < self.median_bw * scale - MAD_SIGMAS * self.mad_bw
        return True

    def high_latency(self, lat: float | None) -> bool:
        if lat is None or math.isnan(self.lat):
            return False
        if lat <= LAT_FACTOR * self.lat or lat <= self.lat + LAT_EXTRA_US:
            return False
        if self.expect.latency_us is None:
            return lat > self.median_lat + MAD_SIGMAS * self.mad_lat
        return True

    def expected_text(self, scale: float = 1.0) -> str:
        source = "pairs' median" if self.bw == self.median_bw else self.expect.source
        return f"{rate_text(self.bw * scale)} ({source})"


def _tries_of(measures: list[PairMeasure], kinds: tuple[str, ...]
              ) -> dict[tuple[str | None, int, int], list[PairMeasure]]:
    """(plane, a, b) -> every try of that pair in steps of `kinds` (plane None: unpinned)."""
    out: dict[tuple[str | None, int, int], list[PairMeasure]] = defaultdict(list)
    for m in measures:
        if m.kind in kinds:
            out[(m.plane if m.kind == "planes" else None, m.a, m.b)].append(m)
    return out


def _bad_try(m: PairMeasure, ref: _Reference) -> bool:
    return bool(m.error) or ref.slow(m.bw)


def _again(tries: list[PairMeasure], ref: _Reference, lat_high: bool) -> bool:
    """Whether a pair needs another try: slow (or high-latency) in its only try; or slow in
    some tries and fine in others, until it has INTERMITTENT_MIN_SLOW slow tries or
    INTERMITTENT_TRIES tries (so that a path slow in some tries is decided on several, not
    cancelled by one fast try). A plane pair that got no answer is not tried again (the
    probe's answer does not change with a repeat)."""
    if any(m.error for m in tries):
        return False
    slow = sum(_bad_try(m, ref) for m in tries)
    if slow == len(tries) or (lat_high and len(tries) == 1):
        return len(tries) < 2 and (slow > 0 or lat_high)
    return 0 < slow < INTERMITTENT_MIN_SLOW and len(tries) < INTERMITTENT_TRIES


def suspicious_pairs(measures: list[PairMeasure], expect: Expectation
                     ) -> list[tuple[int, int]]:
    """Unpinned pairs to measure again (see `_again`)."""
    return [(a, b) for plane, a, b in suspicious_tries(measures, expect) if plane is None]


def suspicious_tries(measures: list[PairMeasure], expect: Expectation
                     ) -> list[tuple[str | None, int, int]]:
    """(plane or None, a, b) of the pairs to measure again before any is blamed or cleared:
    the unpinned pairs (pairs and repeat steps) and the pairs pinned to a plane."""
    table = pair_table(measures)
    ref = _Reference(table, expect)
    out = []
    for key, tries in sorted(_tries_of(measures, ("pairs", "repeat", "planes")).items(),
                             key=lambda item: (item[0][0] or "", item[0][1:])):
        lat_high = key[0] is None and ref.high_latency(table[key[1:]]["lat_us"]) \
            if key[1:] in table else False
        if _again(tries, ref, lat_high):
            out.append(key)
    return out


def _confidence(tries: int, evidence_pairs: int) -> str:
    if tries >= 2 and evidence_pairs >= 2:
        return "high"
    if tries >= 2 or evidence_pairs >= 3:
        return "medium"
    return "low"


def first_clause(text: str, limit: int = 100) -> str:
    """A library's error cut to its first sentence, at a word, at most `limit` characters
    (gloo's run on for several hundred)."""
    head = text.split(". ", 1)[0].strip()
    if len(head) <= limit:
        return head
    return head[:limit].rsplit(" ", 1)[0].rstrip(",;:") + " ..."


def _lost_hosts(stopped: dict[int, str], ended: dict[int, str], names: list[str]
                ) -> list[Finding]:
    """The hosts lost mid-plan: one that stopped answering, or whose rank's process ended
    while the host still answered on every port (the process, not the network)."""
    found = [Finding(f"host {names[host]}", "stopped", why, "answers",
                     "it stopped answering during the plan", "high", [names[host]])
             for host, why in sorted(stopped.items())]
    return found + [Finding(f"host {names[host]}'s rank", "rank ended",
                            "its process ended mid-plan", "runs to the end",
                            f"its control connection closed while {names[host]} still "
                            f"answered on every port: the process, not the network "
                            f"({first_clause(why)})", "high", [names[host]])
                    for host, why in sorted(ended.items())]


def analyse(measures: list[PairMeasure], expect: Expectation, names: list[str],
            compute_s: dict[int, list[float]] | None = None,
            leaves: list[list[int]] | None = None, oversub: float = 1.0,
            world: WorldResult | None = None,
            stopped: dict[int, str] | None = None,
            counters: dict[int, dict[str, CounterDelta]] | None = None,
            reach: dict[int, dict[int, list[str]]] | None = None,
            startup: StartupEvidence | None = None,
            midrun: MidRun | None = None,
            ended: dict[int, str] | None = None) -> list[Finding]:
    """counters: per host, per interface, how its counters changed during the run; reach: per
    host, the interfaces that gave no answer before the library started (diagnose.counters)."""
    from ccbench.diagnose.counters import counter_findings, mid_run_findings, reach_findings

    measures = _before_the_port_went_down(measures, midrun)
    table = pair_table(measures)
    ref = _Reference(table, expect)
    findings: list[Finding] = []
    explained: set[int] = set()              # hosts whose slow pairs another finding explains
    if startup:
        findings.append(_startup_finding(startup, names))
        explained |= {h for h in startup.get("never_arrived", []) if 0 <= h < len(names)}
    lost = _lost_hosts(stopped or {}, ended or {}, names)
    findings += lost
    explained |= {names.index(f.hosts[0]) for f in lost}
    if ref.cluster_slow:
        findings.append(Finding("every path", "below expected", rate_text(ref.median_bw),
                                rate_text(float(expect.link_bps or 0)) + f" ({expect.source})",
                                f"median of {len(table)} pairs", "high"))
    compute = _compute_findings(compute_s or {}, names)
    slow_cpu = {names.index(h) for f in compute for h in f.hosts}
    for f in compute:                     # its pairs are not evidence of a path or a port
        f.evidence += _set_aside_text(measures, ref, names, names.index(f.hosts[0]))
    findings += compute
    explained |= slow_cpu
    plane_names = sorted({m.plane for m in measures if m.plane})
    own = ((mid_run_findings(midrun, names, plane_names) if midrun else [])
           + reach_findings(reach or {}, names, plane_names)
           + counter_findings(counters or {}, names, plane_names))
    # a port its own counters or the probes found flapping or down: its pairs on that plane
    # are its evidence, not its partners'
    ports = _merge(own + _plane_findings(measures, ref, names, slow_cpu,
                                         {f.component for f in own if f.hosts}))
    # a pair's path on a plane where one of its hosts' port is found down or slow by its
    # counters or the probes (not only by that plane's pairs): that port, not the path
    flagged_ports = {f.component for f in ports if f.hosts}
    # a rail's NIC address is reached over its ports (ECMP): no answer on it while one of
    # its ports is down is that port (a probe hashed onto the dead next hop)
    port_hosts = {f.hosts[0] for f in ports if f.hosts and f.kind == "port down"
                  and f.component.endswith(" port") and " plane " in f.component}
    ports = [f for f in ports if not (f.kind == "port down" and f.hosts
                                      and f.component == link_component(f.hosts[0])
                                      and f.hosts[0] in port_hosts)]
    ports = [f for f in ports if not (
        f.component.startswith("pair ") and " path on plane " in f.component and f.pairs
        and any(port_component(h, f.component.rsplit(" path on plane ", 1)[1])
                in flagged_ports for h in f.pairs[0]))]
    findings += ports
    explained |= {names.index(h) for f in ports for h in f.hosts}
    done_pairs = {(names.index(a), names.index(b)) for f in ports for a, b in f.pairs
                  if not f.hosts}
    findings += _host_findings(table, ref, names, explained)
    explained |= {names.index(h) for f in findings if f.kind in ("slow link", "high latency")
                  for h in f.hosts}
    flaky = _intermittent_hosts(table, ref, names, explained)
    findings += flaky
    explained |= {names.index(h) for f in flaky for h in f.hosts}
    uplinks = _uplink_findings(measures, ref, names, leaves or [], oversub, explained)
    findings += uplinks
    pairs = _pair_findings(table, ref, names, explained, leaves or [], bool(uplinks),
                           done_pairs)
    findings += pairs
    done_pairs |= {(names.index(a), names.index(b)) for f in pairs for a, b in f.pairs}
    if uplinks:                 # the cross-leaf pairs share the flagged uplink: explained
        leaf_of = {h: i for i, members in enumerate(leaves or []) for h in members}
        done_pairs |= {p for p in table if leaf_of.get(p[0]) != leaf_of.get(p[1])}
    findings += _intermittent_pairs(table, ref, names, explained, done_pairs)
    if not findings:                       # a slow world collective a finding explains is not news
        findings += _world_finding(world, ref)
    return findings


def _before_the_port_went_down(measures: list[PairMeasure], midrun: MidRun | None
                               ) -> list[PairMeasure]:
    """Without the pair steps measured after a port went down mid-run (MidRun's set_aside):
    the library's traffic as a whole was disturbed then, not only the port's (under MPI,
    pairs without its host measured 15 ms latencies, named `high latency` in 3 of 12 runs)."""
    if not midrun or not midrun.get("set_aside"):
        return measures
    later = {(kind, number, plane) for kind, number, plane in midrun["set_aside"]}
    return [m for m in measures if (m.kind, m.round, m.plane) not in later]


def _startup_finding(startup: StartupEvidence, names: list[str]) -> Finding:
    """The library's start-up did not finish within --timeout: which hosts never arrived at
    it (or, every rank having arrived, never finished it)."""
    hosts = [names[h] for h in startup.get("never_arrived", []) if 0 <= h < len(names)]
    library, limit = startup.get("library", "library"), startup.get("timeout_s", 0)
    ranks = startup.get("ranks", [])
    if startup.get("arrived"):
        measured = f"never finished: {', '.join(hosts) or 'unknown'}"
        evidence = (f"every rank reached {library}'s start-up; {len(ranks)} of "
                    f"{startup.get('world_size', '?')} had not finished it after {limit:g} s "
                    f"(a port or path the library needs: see the reachability findings)")
    else:
        measured = f"never arrived: {', '.join(hosts) or 'unknown'}"
        evidence = (f"{len(ranks)} of {startup.get('world_size', '?')} ranks never reached "
                    f"{library}'s start-up within {limit:g} s (rank"
                    f"{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))})")
    return Finding(f"{library} start-up", "start-up timed out", measured,
                   f"every host within {limit:g} s", evidence, "high", hosts)


def _merge(findings: list[Finding]) -> list[Finding]:
    """One finding per component: a port that changed state during the run (its counters)
    and the same port seen down or slow in the plane steps are one fault."""
    out: dict[str, Finding] = {}
    order = ["intermittent", "port errors", "slow port", "port down"]
    for f in findings:
        seen = out.get(f.component)
        if seen is None:
            out[f.component] = f
            continue
        first, second = sorted((seen, f), key=lambda x: order.index(x.kind)
                               if x.kind in order else len(order))
        out[f.component] = Finding(
            f.component, first.kind, f"{first.measured}; {second.measured}", first.expected,
            f"{first.evidence} | {second.evidence}", "high", first.hosts or second.hosts,
            first.pairs + second.pairs)
    return list(out.values())


def _slow_counts(table: dict[tuple[int, int], PairRow], ref: _Reference
                 ) -> dict[tuple[int, int], int]:
    return {p: sum(_bad_try(m, ref) for m in row["samples"]) for p, row in table.items()}


def _intermittent_hosts(table: dict[tuple[int, int], PairRow], ref: _Reference,
                        names: list[str], explained: set[int]) -> list[Finding]:
    """Every try counts: a host whose pairs are slow in some tries and fine in others, in
    at least 2 of its pairs and 3 tries, more often than the other pairs' tries are (3x
    their share + 10 points: the machine's own noise), is intermittent."""
    slow = _slow_counts(table, ref)
    out: list[Finding] = []
    for host in range(len(names)):
        if host in explained:
            continue
        mine = [p for p in table if host in p]
        hit = [p for p in mine if slow[p]]
        if not any(slow[p] < table[p]["tries"] for p in hit):
            continue                      # slow in every try: slow paths, not intermittent
        others = [p for p in table if host not in p]
        background = (sum(slow[p] for p in others)
                      / max(1, sum(table[p]["tries"] for p in others)))
        count = sum(slow[p] for p in hit)
        tries = sum(table[p]["tries"] for p in mine)
        if len(hit) < 2 or count < 3 or count / max(1, tries) < 3 * background + 0.1:
            continue
        out.append(Finding(
            link_component(names[host]), "intermittent", f"slow in {count} of {tries} tries",
            ref.expected_text(), "; ".join(
                f"{names[a]}-{names[b]}: " + ", ".join(_try_text(m) for m in table[(a, b)]
                                                       ["samples"]) for a, b in hit)
            + f"; the other pairs' tries: {100 * background:.0f} % slow", "medium",
            [names[host]], [[names[a], names[b]] for a, b in hit]))
    return out


def _intermittent_pairs(table: dict[tuple[int, int], PairRow], ref: _Reference,
                        names: list[str], explained: set[int],
                        done_pairs: set[tuple[int, int]]) -> list[Finding]:
    """A single pair slow in INTERMITTENT_MIN_SLOW or more of its tries, fine in others."""
    slow = _slow_counts(table, ref)
    out: list[Finding] = []
    for (a, b), row in sorted(table.items()):
        if ({a, b} & explained or (a, b) in done_pairs or slow[(a, b)] >= row["tries"]
                or slow[(a, b)] < INTERMITTENT_MIN_SLOW):
            continue
        tries = row["samples"]
        out.append(Finding(f"pair {names[a]}-{names[b]} path", "intermittent",
                           f"slow in {slow[(a, b)]} of {len(tries)} tries",
                           ref.expected_text(), "tries: " + "; ".join(
                               _direction_text(names[a], names[b], m.bw_ab, m.bw_ba)
                               for m in tries) + " (ECMP: each try a new connection)",
                           "medium", [], [[names[a], names[b]]]))
    return out


def _host_findings(table: dict[tuple[int, int], PairRow], ref: _Reference,
                   names: list[str], explained: set[int]) -> list[Finding]:
    out = []
    metrics: tuple[tuple[Literal["bw", "lat_us"], Callable[[float | None], bool]], ...] = \
        (("bw", ref.slow), ("lat_us", ref.high_latency))
    for metric, test in metrics:
        per_host: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for pair in table:
            for host in pair:
                per_host[host].append(pair)
        for host, pairs in sorted(per_host.items()):
            if host in explained:
                continue
            bad = [p for p in pairs if test(table[p][metric])]
            if len(pairs) < 2 or len(bad) < max(2, math.ceil(HOST_SHARE * len(pairs))):
                continue
            values = [v for p in bad if (v := table[p][metric]) is not None]   # test(None) fails
            tries = min(table[p]["tries"] for p in bad)
            names_bad = [[names[a], names[b]] for a, b in bad]
            evidence = (f"{len(bad)} of its {len(pairs)} pairs: "
                        + ", ".join(f"{x}-{y}" for x, y in names_bad)
                        + f"; each measured {tries}+ times")
            if metric == "bw":
                measured, one_way = _host_directions(table, bad, host, names, ref)
                out.append(Finding(link_component(names[host]), "slow link", measured,
                                   ref.expected_text(), one_way + evidence,
                                   _confidence(tries, len(bad)), [names[host]], names_bad))
            else:
                out.append(Finding(link_component(names[host]), "high latency",
                                   f"{statistics.median(values):.0f} us", f"{ref.lat:.0f} us",
                                   evidence, _confidence(tries, len(bad)), [names[host]],
                                   names_bad))
    return out


def _host_directions(table: dict[tuple[int, int], PairRow],
                     bad: list[tuple[int, int]], host: int, names: list[str],
                     ref: _Reference) -> tuple[str, str]:
    """`h5 -> others: 15 Mbit/s; others -> h5: 48 Mbit/s` (the medians of its slow pairs'
    best tries per direction) and, when only one direction is slow, `one way (...); `."""
    out = [table[p]["bw_ab"] if p[0] == host else table[p]["bw_ba"] for p in bad]
    into = [table[p]["bw_ba"] if p[0] == host else table[p]["bw_ab"] for p in bad]
    med_out = statistics.median([v for v in out if v is not None] or [0.0])
    med_in = statistics.median([v for v in into if v is not None] or [0.0])
    name = names[host]
    text = (f"{name} -> others: {rate_text(med_out)}; "
            f"others -> {name}: {rate_text(med_in)}")
    slow_out, slow_in = ref.slow(med_out), ref.slow(med_in)
    if slow_out == slow_in:
        return text, ""
    return text, f"one way ({name} -> others); " if slow_out else \
        f"one way (others -> {name}); "


def _pair_findings(table: dict[tuple[int, int], PairRow], ref: _Reference,
                   names: list[str], explained: set[int], leaves: list[list[int]],
                   uplink_flagged: bool, done_pairs: set[tuple[int, int]] | None = None
                   ) -> list[Finding]:
    leaf_of = {h: i for i, members in enumerate(leaves) for h in members}
    out = []
    for (a, b), row in sorted(table.items()):
        if a in explained or b in explained or (a, b) in (done_pairs or set()):
            continue
        if uplink_flagged and leaf_of.get(a) != leaf_of.get(b):
            continue                     # slow only while sharing the flagged uplink
        rounds = ", ".join(row["rounds"])
        both = f"{names[a]}-{names[b]}"
        extra = " (or either host's link: 2 hosts cannot tell)" if len(names) == 2 else ""
        if ref.slow(row["bw"]):
            direction = _direction_text(names[a], names[b], row["bw_ab"], row["bw_ba"])
            out.append(Finding(f"pair {both} path{extra}", "slow path", direction,
                               ref.expected_text(), f"{direction}; tries: {rounds}",
                               _confidence(row["tries"], 1), [], [[names[a], names[b]]]))
        # one pair's latency against the pairs' own median: too noisy to blame a path with
        # (3-7 ms outliers of 0.3 ms pairs under load, in both tries); only against
        # --latency-us (a host's latency, seen in most of its pairs, is judged either way)
        if ref.expect.latency_us is not None and ref.high_latency(row["lat_us"]):
            out.append(Finding(f"pair {both} path{extra}", "high latency",
                               f"{row['lat_us']:.0f} us", f"{ref.lat:.0f} us",
                               f"tries: {rounds}", _confidence(row["tries"], 1), [],
                               [[names[a], names[b]]]))
    return out


def _uplink_findings(measures: list[PairMeasure], ref: _Reference, names: list[str],
                     leaves: list[list[int]], oversub: float, explained: set[int]
                     ) -> list[Finding]:
    runs = [m for m in measures if m.kind == "leaves" and m.leaves is not None]
    if not runs:
        return []
    by_run: dict[tuple[int, int], list[PairMeasure]] = defaultdict(list)
    for m in runs:
        assert m.leaves is not None
        by_run[m.leaves].append(m)
    per_flow: dict[tuple[int, int], float] = {}
    for key, flows in by_run.items():
        rates = [f.bw for f in flows if f.bw is not None and f.a not in explained
                 and f.b not in explained]
        if rates:
            per_flow[key] = statistics.median(rates)
    scale = 1.0 / oversub
    slow_runs = {k for k, v in per_flow.items() if ref.slow(v, scale)}
    if not slow_runs:
        return []
    suspects = [leaf for leaf in range(len(leaves))
                if all(k in slow_runs for k in per_flow if leaf in k)
                and any(leaf in k for k in per_flow)]
    if len(leaves) > 2 and 0 < len(suspects) < len(leaves):
        groups = [[s] for s in suspects]
    else:                                 # two leaves: either uplink may be the slow one
        groups = [sorted({leaf for k in slow_runs for leaf in k})]
    out = []
    for group in groups:
        keys = sorted(k for k in slow_runs if set(k) & set(group))
        component = " or ".join(f"uplink leaf{leaf}-spine" for leaf in group)
        evidence = "; ".join(
            f"leaf{a} x leaf{b}: {len(by_run[(a, b)])} flows at once, median "
            f"{rate_text(per_flow[(a, b)])} per flow" for a, b in keys)
        # (`report` of records that do not name the leaves' hosts: none named)
        hosts = sorted(names[h] for leaf in group if leaf < len(leaves) for h in leaves[leaf])
        out.append(Finding(component, "slow uplink",
                           rate_text(statistics.median(per_flow[k] for k in keys)),
                           ref.expected_text(scale) + (f", oversub {oversub:g}"
                                                       if oversub != 1 else ""),
                           evidence + ("" if len(group) == 1 or len(leaves) > 2 else
                                       "; 2 leaves: which of the two needs a third leaf"),
                           "medium" if len(group) == 1 else "low", hosts))
    return out


def _direction_text(a: str, b: str, ab: float | None, ba: float | None) -> str:
    return f"{a} -> {b}: {rate_text(ab or 0.0)}; {b} -> {a}: {rate_text(ba or 0.0)}"


def _try_text(m: PairMeasure) -> str:
    return m.error or rate_text(m.bw or 0.0)


def _set_aside_text(measures: list[PairMeasure], ref: _Reference, names: list[str],
                    host: int) -> str:
    """`; its pairs set aside as evidence of a path or port (slow in some tries: h1-h2,
    h2-h7 on eth0)`: a host slow to compute sends and receives slowly itself."""
    slow = []
    for (plane, a, b), tries in sorted(_tries_of(measures, ("pairs", "repeat", "planes")
                                              ).items(), key=lambda i: (i[0][0] or "", i[0][1:])):
        if host in (a, b) and any(_bad_try(m, ref) for m in tries):
            slow.append(f"{names[a]}-{names[b]}" + (f" on {plane}" if plane else ""))
    return ("; its pairs set aside as evidence of a path or port"
            + (f" (slow in some tries: {', '.join(slow)})" if slow else ""))


def _plane_findings(measures: list[PairMeasure], ref: _Reference, names: list[str],
                    set_aside: set[int] | None = None, own_ports: set[str] | None = None
                    ) -> list[Finding]:
    """Per plane, every try of the pairs pinned to it: a host's port (all its pairs bad on
    that plane), a whole plane, a port slow or down in some tries only (intermittent), and
    what is left: one pair's path on that plane (a bad ECMP member). set_aside: hosts slow
    to compute, whose pairs are no evidence here; own_ports: the components of ports their
    own counters or the probes flagged (their pairs are not evidence against the other
    host)."""
    by_plane: dict[str, dict[tuple[int, int], list[PairMeasure]]] = defaultdict(dict)
    for (plane, a, b), tries in _tries_of(measures, ("planes",)).items():
        if plane is not None and not {a, b} & (set_aside or set()):
            by_plane[plane][(a, b)] = tries
    out: list[Finding] = []
    for plane, pairs in sorted(by_plane.items()):
        bad = {p for p, tries in pairs.items() if all(_bad_try(m, ref) for m in tries)}
        some = {p for p, tries in pairs.items() if any(_bad_try(m, ref) for m in tries)}
        if len(pairs) >= 3 and len(bad) == len(pairs):
            tries = [m for p in pairs for m in pairs[p]]
            out.append(Finding(f"plane {plane}", "slow plane" if not any(m.error for m in tries)
                               else "plane down", rate_text(statistics.median(
                                   [m.bw or 0.0 for m in tries])), ref.expected_text(),
                               f"all {len(pairs)} pairs on plane {plane}", "medium"))
            continue
        own = {h for h in range(len(names))
               if port_component(names[h], plane) in (own_ports or set())}
        ports = _port_findings(plane, pairs, bad, some, ref, names, own)
        out += ports
        flagged = own | {names.index(h) for f in ports for h in f.hosts}
        out += _plane_path_findings(plane, pairs, bad, some, ref, names, flagged)
    tries = [m for pairs in by_plane.values() for ms in pairs.values() for m in ms]
    return _whole_host(out, len(by_plane),
                       lambda host: _tries_directions(tries, names.index(host), names, ref))


def _tries_directions(tries: list[PairMeasure], host: int, names: list[str],
                      ref: _Reference) -> tuple[str, str]:
    """A host's rate out and in over its pairs' tries (medians): the text, and the
    `one way (...); ` prefix of the evidence when only one direction is slow."""
    out = [m.bw_ab if m.a == host else m.bw_ba for m in tries if host in (m.a, m.b)]
    into = [m.bw_ba if m.a == host else m.bw_ab for m in tries if host in (m.a, m.b)]
    med_out = statistics.median([v for v in out if v is not None] or [0.0])
    med_in = statistics.median([v for v in into if v is not None] or [0.0])
    name = names[host]
    text = f"{name} -> others: {rate_text(med_out)}; others -> {name}: {rate_text(med_in)}"
    slow_out, slow_in = ref.slow(med_out), ref.slow(med_in)
    if slow_out == slow_in:
        return text, ""
    return text, (f"one way ({name} -> others); " if slow_out
                  else f"one way (others -> {name}); ")


def _port_findings(plane: str, pairs: dict[tuple[int, int], list[PairMeasure]],
                   bad: set[tuple[int, int]], some: set[tuple[int, int]], ref: _Reference,
                   names: list[str], own: set[int] | None = None) -> list[Finding]:
    """Per host on this plane: its port slow or down in every try of every pair (first, for
    every host), then, held against the pairs of neither the host nor a port so flagged, a
    port slow in some tries only (intermittent). A pair with a flagged port is that port's
    evidence, not its other host's: two bad ports on one plane put two bad pairs on every
    other host, which read as intermittent ports everywhere. `own`: hosts whose port on
    this plane its own counters or the probes flagged (flapping, down): flagged the same.
    A slow port is measured per direction (`h3 -> others: 15 Mbit/s; others -> h3: 48
    Mbit/s`), with `one way (h3 -> others); ` in the evidence when one direction is slow."""
    out = []
    on = f"plane {plane}" if plane.isdigit() else plane

    def evidence(mine: list[tuple[int, int]]) -> str:
        return "; ".join(f"{names[a]}-{names[b]} on {on}: "
                         + ", ".join(_try_text(m) for m in pairs[(a, b)]) for a, b in mine)

    flagged: set[int] = set()
    for host in range(len(names)):
        mine = [p for p in pairs if host in p]
        if not mine or not all(p in bad for p in mine):
            continue
        partners = {a if b == host else b for a, b in mine}
        if len(mine) == 1 and any(all(q in bad for q in pairs if p in q) for p in partners):
            continue            # its only pair is also its partner's: the partner's port
        tries = [m for p in mine for m in pairs[p]]
        down = all(m.error for m in tries)
        flagged.add(host)
        measured, one_way = ("no answer", "") if down else _tries_directions(
            [m for m in tries if not m.error], host, names, ref)
        out.append(Finding(port_component(names[host], plane),
                           "port down" if down else "slow port",  # merged below
                           measured, ref.expected_text(), one_way + evidence(mine),
                           "high" if len(mine) >= 2 else "low", [names[host]],
                           [[names[a], names[b]] for a, b in mine]))
    flagged |= own or set()
    clean = {p: t for p, t in pairs.items() if not set(p) & flagged}
    for host in range(len(names)):
        mine = [p for p in clean if host in p]
        if host in flagged or not mine:
            continue
        tries = [m for p in mine for m in clean[p]]
        hit = [p for p in mine if p in some]
        slow = sum(_bad_try(m, ref) for m in tries)
        others = [m for p, t in clean.items() if host not in p for m in t]
        background = sum(_bad_try(m, ref) for m in others) / max(1, len(others))
        if (len(hit) >= 2 and slow >= INTERMITTENT_MIN_SLOW
                and slow / len(tries) >= 3 * background + 0.1):
            out.append(Finding(port_component(names[host], plane), "intermittent",
                               f"slow or no answer in {slow} of {len(tries)} tries",
                               ref.expected_text(), evidence(mine)
                               + f"; the other pairs' tries on {on}: "
                                 f"{100 * background:.0f} % slow", "medium", [names[host]],
                               [[names[a], names[b]] for a, b in hit]))
    return out


def _plane_path_findings(plane: str, pairs: dict[tuple[int, int], list[PairMeasure]],
                         bad: set[tuple[int, int]], some: set[tuple[int, int]],
                         ref: _Reference, names: list[str], flagged: set[int]
                         ) -> list[Finding]:
    """A pair slow on one plane while both hosts' ports on it are fine: that pair's path
    on that plane (one bad member of an ECMP group, a spine port)."""
    out = []
    for a, b in sorted(some):
        if a in flagged or b in flagged:
            continue
        tries = pairs[(a, b)]
        slow = [m for m in tries if _bad_try(m, ref)]
        persistent = (a, b) in bad
        if not persistent and len(slow) < INTERMITTENT_MIN_SLOW:
            continue
        worst = min(slow, key=lambda m: m.bw or 0.0)
        measured = (worst.error or _direction_text(names[a], names[b], worst.bw_ab,
                                                   worst.bw_ba))
        kind = ("path down" if all(m.error for m in slow) else "slow path") if persistent \
            else "intermittent"
        out.append(Finding(f"pair {names[a]}-{names[b]} path on plane {plane}", kind,
                           measured, ref.expected_text(),
                           f"slow in {len(slow)} of {len(tries)} tries on {plane}: "
                           + ", ".join(_try_text(m) for m in tries)
                           + "; both hosts' other pairs on it fine (a bad ECMP member or "
                             "spine port)", _confidence(len(slow), 2), [],
                           [[names[a], names[b]]]))
    return out


def _whole_host(ports: list[Finding], planes: int,
                directions: Any = None) -> list[Finding]:
    """A host whose ports are out of line on every plane: its link(s), one finding (slow:
    measured per direction, `directions(host)`)."""
    by_host: dict[str, list[Finding]] = defaultdict(list)
    for f in ports:
        if f.hosts and f.kind in ("port down", "slow port"):
            by_host[f.hosts[0]].append(f)
    out = [f for f in ports if not f.hosts or f.kind not in ("port down", "slow port")
           or len(by_host[f.hosts[0]]) < planes]
    for host, found in sorted(by_host.items()):
        if planes < 2 or len(found) < planes:
            continue
        down = all(f.kind == "port down" for f in found)
        measured, one_way = (", ".join(f.measured for f in found), "")
        if not down and directions is not None:
            measured, one_way = directions(host)
        out.append(Finding(link_component(host) + " (every plane)", "link down" if down
                           else "slow link", measured,
                           found[0].expected, one_way + " | ".join(f.evidence for f in found),
                           min((f.confidence for f in found), key=["low", "medium",
                                                                   "high"].index),
                           [host], [p for f in found for p in f.pairs]))
    return out


def _compute_findings(compute_s: dict[int, list[float]], names: list[str]) -> list[Finding]:
    """compute_s: per host, its time for the same work in each round (hosts take turns
    within a round). A host is slow to compute when, in nearly every round (4 of 5), it
    took more than `factor` x the other hosts' median of that round, where `factor` is
    COMPUTE_FACTOR or, when larger, the run's own spread: the largest ratio of a repeat to
    its own median that any other host showed (under load a burst of other work makes a
    healthy host 3x slower in a round; a fixed 2x then named a healthy host hit in 4 of 5
    rounds)."""
    rounds = min((len(v) for v in compute_s.values()), default=0)
    out = []
    for host, mine in sorted(compute_s.items()):
        others = [v for h, v in compute_s.items() if h != host]
        if not others or rounds == 0:
            continue
        typical = [statistics.median(o[k] for o in others) for k in range(rounds)]
        spread = max(max(o[:rounds]) / statistics.median(o[:rounds]) for o in others
                     if statistics.median(o[:rounds]) > 0) if any(
            statistics.median(o[:rounds]) > 0 for o in others) else 1.0
        factor = max(COMPUTE_FACTOR, spread)
        slow = [k for k in range(rounds) if mine[k] > factor * typical[k]
                and mine[k] > typical[k] + COMPUTE_EXTRA_S]
        if len(slow) < max(1, math.ceil(COMPUTE_ROUNDS_SHARE * rounds)):
            continue
        out.append(Finding(f"host {names[host]} compute", "slow compute",
                           f"{statistics.median(mine[:rounds]) * 1e3:.0f} ms",
                           f"{statistics.median(typical) * 1e3:.0f} ms (other hosts' median)",
                           f"the same work in {rounds} rounds: slower than "
                           f"{factor:.3g}x the others in {len(slow)} (last at the barrier; "
                           f"{factor:.3g}x: the larger of {COMPUTE_FACTOR:g} and the other "
                           f"hosts' own repeat spread)",
                           "high" if len(slow) == rounds else "medium", [names[host]]))
    return out


def _world_finding(world: WorldResult | None, ref: _Reference) -> list[Finding]:
    """The world collective is flagged only against an absolute expectation (a link rate,
    a model, the NIC speed) and only when it falls far below it with nothing else flagged
    (a gross failure, e.g. a wrong transport). Against the pairs alone it is not: where the
    "link" is faster than the hosts' reduction (loopback, shared memory) a healthy
    allreduce's bus bandwidth is far below a one-way copy's rate."""
    if (not world or not world.get("busbw_bps") or ref.expect.link_bps is None
            or ref.cluster_slow):
        return []
    floor = ref.expect.link_bps * 0.35
    # its best iteration counts (the run's own spread): under load the median of a healthy
    # allreduce fell below the floor while its best iteration reached 80 % of the link
    if max(world["busbw_bps"], world.get("best_busbw_bps") or 0.0) >= floor:
        return []
    return [Finding("cluster (world allreduce)", "slow collective", rate_text(world["busbw_bps"]),
                    f"{rate_text(ref.expect.link_bps)} bus bandwidth ({ref.expect.source})",
                    f"{world.get('label', 'allreduce')}: {world.get('time_us', 0):.0f} us"
                    + (f"; best iteration {rate_text(world['best_busbw_bps'])}"
                       if world.get("best_busbw_bps") else ""),
                    "low")]
