"""What `ccbench diagnose` measures, in which order: pure data, no ranks needed.

Hosts are numbered 0..N-1 (sorted host names). A *step* runs its host pairs at once, each on a
sub-communicator of its own, so the pairs of a step must be disjoint:

* `world`: one collective over every rank (the cluster's bus bandwidth);
* `pairs`: every host pair once, in the N-1 rounds of the circle method (N odd: a bye host
  sits out each round), or with `--quick` the ceil(log2 N) rounds of a hypercube (host i
  with host i XOR 2^k): each host is in about log2 N pairs, enough to tell its link from
  a single path;
* `leaves`: every host of one leaf paired with a host of another at once, so the flows
  cross the two leaves' uplinks together (the pairs alone never load an uplink);
* `planes`: per plane, the same pair rounds again (every pair, or with `--quick` the
  hypercube's), the traffic pinned to that plane's interfaces: one flow per plane for each
  pair, so that one bad member of an ECMP group is hit in every run;
* `compute`: each host in turn runs the same fixed work and arrives at a barrier.

Rail-optimized hosts (`rails` K >= 2: one rank per GPU and NIC, NIC i of every host on rail
i): the measured units are the hosts' NICs, numbered host x K + rail, and every pair step
pairs NIC i of host a with NIC i of host b, on every rail at once (the traffic a
rail-optimized network carries; a NIC is never paired across rails).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

__all__ = ["Step", "StepExtra", "StepJson", "bisection_rounds", "build_plan", "estimate_seconds",
           "leaf_pairs", "rail_rounds", "ring_rounds", "round_robin"]

Pair = tuple[int, int]


class StepExtra(TypedDict, total=False):
    """What a kind of step carries besides its pairs."""

    leaves: list[int]              # leaves: the two leaves whose hosts it pairs


class StepJson(TypedDict):
    """A step in the verdict JSON: its fields, the plane where pinned, then its extra."""

    kind: str
    label: str
    round: int
    pairs: list[list[int]]
    plane: NotRequired[str]
    leaves: NotRequired[list[int]]


@dataclass(frozen=True, slots=True)
class Step:
    kind: str                      # world | pairs | leaves | planes | compute | repeat
    label: str
    pairs: tuple[Pair, ...] = ()
    round: int = 0
    plane: str | None = None       # planes: the interface the step is pinned to
    extra: StepExtra = field(default_factory=StepExtra)

    def to_json(self) -> StepJson:
        out: StepJson = {"kind": self.kind, "label": self.label, "round": self.round,
                               "pairs": [list(p) for p in self.pairs]}
        if self.plane is not None:
            out["plane"] = self.plane
        out.update(self.extra)
        return out


def round_robin(n: int) -> list[list[Pair]]:
    """Every pair of n hosts exactly once in n-1 rounds (n odd: n rounds, one bye each) of
    disjoint pairs: the circle method, host 0 fixed and the others rotating around it."""
    if n < 2:
        return []
    slots: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    m = len(slots)
    rounds = []
    for _ in range(m - 1):
        pairs = []
        for i in range(m // 2):
            a, b = slots[i], slots[m - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        slots = [slots[0], slots[-1], *slots[1:-1]]
    return rounds


def bisection_rounds(n: int) -> list[list[Pair]]:
    """ceil(log2 n) rounds: round k pairs host i with i XOR 2^k (where that host exists)."""
    rounds = []
    for bit in range(max(1, math.ceil(math.log2(n))) if n >= 2 else 0):
        pairs = [(i, i ^ (1 << bit)) for i in range(n) if i < i ^ (1 << bit) < n]
        if pairs:
            rounds.append(pairs)
    return rounds


def ring_rounds(n: int) -> list[list[Pair]]:
    """The ring's edges (i, i+1 mod n) in rounds of disjoint pairs: 2 rounds for even n, 3
    for odd n (the closing edge alone), 1 for n = 2."""
    if n < 2:
        return []
    if n == 2:
        return [[(0, 1)]]
    edges = [(i, (i + 1) % n) for i in range(n)]
    even = [edges[i] for i in range(0, n - n % 2, 2)]
    odd = [edges[i] for i in range(1, n - n % 2, 2)]
    rounds = [even, odd] + ([[edges[-1]]] if n % 2 else [])
    return [sorted((min(a, b), max(a, b)) for a, b in r) for r in rounds if r]


def leaf_pairs(leaves: list[list[int]]) -> list[tuple[int, int, list[Pair]]]:
    """(leaf a, leaf b, pairs): per pair of leaves, their hosts matched one to one (the
    smaller leaf's count of flows cross both uplinks at once)."""
    out = []
    for a in range(len(leaves)):
        for b in range(a + 1, len(leaves)):
            pairs = [(min(x, y), max(x, y)) for x, y in zip(leaves[a], leaves[b], strict=False)]
            if pairs:
                out.append((a, b, pairs))
    return out


def rail_rounds(rounds: list[list[Pair]], rails: int) -> list[list[Pair]]:
    """Host rounds -> NIC rounds: each host pair (a, b) becomes K pairs, NIC i of a with NIC
    i of b (NIC index host x K + rail), all in the same round."""
    return [sorted((a * rails + r, b * rails + r) for a, b in pairs for r in range(rails))
            for pairs in rounds]


def build_plan(hosts: int, quick: bool = False, leaves: list[list[int]] | None = None,
               planes: list[str] | None = None, compute: bool = True, rails: int = 1
               ) -> list[Step]:
    """`hosts`: the measured units; with `rails` K >= 2, the NICs (hosts x K)."""
    if rails > 1:
        if hosts % rails:
            raise ValueError(f"{hosts} NICs are not {rails} rails of whole hosts")
        machines = hosts // rails
        rounds = rail_rounds(bisection_rounds(machines) if quick else round_robin(machines),
                             rails)
        steps = [Step("world", f"world allreduce over {machines} hosts x {rails} rails")]
        leaves = None
        tag = " (rail to rail)"
    else:
        steps = [Step("world", f"world allreduce over {hosts} hosts")]
        rounds = bisection_rounds(hosts) if quick else round_robin(hosts)
        tag = ""
    for number, pairs in enumerate(rounds):
        steps.append(Step("pairs", f"pairs round {number + 1}/{len(rounds)}{tag}",
                          tuple(pairs), number))
    for a, b, pairs in leaf_pairs(leaves or []) if leaves and len(leaves) > 1 else []:
        steps.append(Step("leaves", f"leaf{a} x leaf{b} ({len(pairs)} flows each way)",
                          tuple(pairs), extra={"leaves": [a, b]}))
    for plane in planes or []:          # every pair on every plane: one flow per plane, so
        for number, pairs in enumerate(rounds):    # a bad ECMP member is hit in every run
            steps.append(Step("planes", f"plane {plane} pairs round {number + 1}/"
                              f"{len(rounds)}{tag}", tuple(pairs), number, plane=plane))
    if compute:
        steps.append(Step("compute", "compute probe: each host in turn, arrival at a barrier"))
    return steps


def estimate_seconds(steps: list[Step], hosts: int, size: int, link_bps: float,
                     samples: int) -> float:
    """A rough wall time: per pair step, a latency and two one-way bandwidth measurements of
    `samples` operations each (a bandwidth one takes size / link rate), plus setting up the
    step's sub-communicators (about half a second here, more on a loaded machine)."""
    transfer = size * 8 / link_bps
    per_pair_step = 0.5 + samples * (2 * transfer + 0.002)
    total = 0.0
    for step in steps:
        if step.kind in ("pairs", "leaves", "planes", "repeat"):
            total += per_pair_step
        elif step.kind == "world":
            total += 1.0 + samples * 2 * transfer
        elif step.kind == "compute":
            total += hosts * 0.3
    return total
