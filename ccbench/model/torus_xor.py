"""An XOR round on a torus whose sides are powers of two, solved one dimension at a time.

Rank ids are the torus coordinates in C order, so with power-of-two sides r XOR s is
each coordinate XOR-ed with its own field of s, and dimension-order routing walks
dimension d from c to c XOR s_d on a line that the earlier dimensions chose. Every line
of dimension d carries the whole 1-D pattern c -> c XOR s_d once (one flow per
coordinate of the line), so a link of dimension d at coordinate c (either direction)
carries the same number of flows on every line, L_d(c), and a flow's fair share on its
first filling step is min over d of cap / (the most loaded link of its route in d).

The replay's fluid solve (replay._fair_rates, replay._fluid) ends in one step when every
flow gets the smallest share (max-min) and every flow ends together; then a round takes
alpha + bytes / share (+ gamma x the bytes each rank reduces). Those conditions, and that
time, need only the largest link load of each dimension and the smallest "most loaded
link on a route" of each: the float operations below are the ones the full solve makes,
on the same values, so the answer is the same to the last bit. Where the conditions do
not hold (or links differ in capacity, alpha, or carry hop latencies) this returns None
and the caller solves the p flows. tests/test_model_rounds.py compares the two.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ccbench.model.topology import Topology

__all__ = ["ring_xor_loads", "torus_xor_round_time"]


def _pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


@lru_cache(maxsize=4096)
def ring_xor_loads(n: int, s: int) -> tuple[int, int]:
    """On a ring of n (shorter direction, ties forward, as Topology routes), the pattern
    c -> c XOR s for every c: (most flows on one directed link, smallest over flows of
    the most flows on a link of its route)."""
    a = np.arange(n, dtype=np.int64)
    fwd = ((a ^ s) - a) % n
    forward = fwd <= n - fwd
    hops = np.where(forward, fwd, n - fwd)
    j = np.arange(int(hops.max()))[:, None]
    pos = (a + np.where(forward, 1, -1) * j) % n       # coordinate each hop leaves
    link = np.where(forward, pos, n + pos)              # forward links 0..n-1, backward n..2n-1
    used = j < hops
    load = np.bincount(link[used], minlength=2 * n)
    route_max = np.where(used, load[link], 0).max(axis=0)
    return int(load.max()), int(route_max.min())


def torus_xor_round_time(topo: Topology, s: int, nbytes: float, reduce: float, gamma: float,
                         sharing: str, cap: float, alpha: float) -> tuple[float, int] | None:
    """(seconds, most flows on one link) of the round r -> r XOR s, every rank sending
    `nbytes` and reducing `reduce` bytes on arrival, on a torus whose links all have
    capacity `cap`, alpha `alpha` and no hop latency; None where the one-step solve does
    not hold (the caller solves the flows)."""
    shape = [n for _, n in topo.dims]
    if topo.kind != "torus" or not all(_pow2(n) for n in shape) or s <= 0 or nbytes <= 0:
        return None
    shift = topo.ranks
    most = bottleneck = 0
    for n in shape:
        shift //= n
        s_d = (s // shift) % n
        if s_d:
            lmax, lbot = ring_xor_loads(n, s_d)
            most, bottleneck = max(most, lmax), max(bottleneck, lbot)
    if not most:
        return None
    low = cap / most                  # the smallest fair share (fshare.min())
    high = cap / bottleneck           # the largest (fshare.max())
    if sharing == "max-min" and not high <= low * (1 + 1e-9):
        return None                   # progressive filling would take further steps
    slow, quick = nbytes / low, nbytes / high
    if not slow <= quick * (1 + 1e-9):
        return None                   # flows end apart: rates change mid-round
    end = alpha + slow
    if gamma and reduce:
        end = end + gamma * reduce
    return float(end), most
