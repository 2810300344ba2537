"""Hierarchical ring collectives on multi-dimensional networks, as ASTRA-sim runs them.

A network of dimensions d = 0..D-1 (p_d ranks each, product p) runs a collective
dimension by dimension with a ring on each:

* reduce-scatter: dims in order, each on what the previous left (m_0 = n, m_{d+1} = m_d / p_d):
  sum over d of (p_d - 1) alpha_d + (p_d - 1)/p_d m_d (beta_d + gamma)
* allreduce: that reduce-scatter, then the all-gather back in reverse order:
  sum over d of 2 (p_d - 1) alpha_d + 2 (p_d - 1)/p_d m_d beta_d + (p_d - 1)/p_d m_d gamma
* all-gather (n = the gathered output, shard s = n / p): dims in reverse order, each
  gathering what the inner dims built: sum of (p_d - 1) alpha_d + (p_d - 1) s_d beta_d with
  s_{D-1} = s, s_{d-1} = s_d p_d.

With one dimension these are the ring formulas; with equal links the bytes are the flat
ring's (the sums telescope to (p-1)/p n) and only the latency terms differ. The link
classes of each dimension come from the topology (`link_dims`), the same mapping the
ASTRA-sim export writes into network.yml.
"""

from __future__ import annotations

from dataclasses import dataclass

from ccbench.errors import UsageError
from ccbench.model.topology import LinkClass, Topology

__all__ = ["ALGORITHM", "COLLECTIVES", "Dim", "hierarchical_steps", "hierarchical_time",
           "link_dims"]

ALGORITHM = "hierarchical-ring"
COLLECTIVES = ("allreduce", "allgather", "reduce-scatter")


@dataclass(frozen=True, slots=True)
class Dim:
    kind: str          # ASTRA-sim dimension: Ring | Switch | FullyConnected
    npus: int
    alpha: float       # seconds per message
    beta: float        # seconds per byte


def link_dims(topo: Topology, inter: LinkClass, intra: LinkClass | None = None) -> list[Dim]:
    """The topology's dimensions with the link class each one runs on: dual-plane's first
    dimension is the intra-host switch and its second has two NIC ports (half the beta);
    a fat tree's spine dimension has the leaf's uplink share (beta x oversubscription)."""
    intra = intra or inter
    dims = []
    for index, (kind, npus) in enumerate(topo.dims):
        alpha, beta = inter.alpha, inter.beta
        if topo.kind == "dual-plane" and index == 0:
            alpha, beta = intra.alpha, intra.beta
        elif topo.kind == "dual-plane":
            beta = inter.beta / 2
        elif topo.kind == "fat-tree" and index == 1:
            beta = inter.beta * float(topo.params["oversub"])
        dims.append(Dim(kind, npus, alpha, beta))
    product = 1
    for d in dims:
        product *= d.npus
    if product != topo.ranks:
        raise UsageError(f"{topo.spec}: its dimensions ({' x '.join(str(d.npus) for d in dims)})"
                         f" do not multiply to {topo.ranks} ranks (a partial leaf or host); "
                         f"the hierarchical ring needs full ones")
    return dims


def hierarchical_steps(collective: str, dims: list[Dim]) -> int:
    """Messages on a rank's critical path (the alpha terms)."""
    steps = sum(d.npus - 1 for d in dims)
    return 2 * steps if collective == "allreduce" else steps


def hierarchical_time(collective: str, dims: list[Dim], n: float, gamma: float) -> float:
    """Seconds for n bytes (the nccl-tests S) with a ring per dimension (module doc)."""
    if collective not in COLLECTIVES:
        raise UsageError(f"no {ALGORITHM} formula for {collective} "
                         f"(valid: {', '.join(COLLECTIVES)})")
    t = 0.0
    if collective == "allgather":
        total = 1
        for d in dims:
            total *= d.npus
        shard = n / total
        for d in reversed(dims):
            t += (d.npus - 1) * (d.alpha + shard * d.beta)
            shard *= d.npus
        return t
    m = n
    for d in dims:
        frac = (d.npus - 1) / d.npus
        if collective == "allreduce":
            t += 2 * (d.npus - 1) * d.alpha + 2 * frac * m * d.beta + frac * m * gamma
        else:
            t += (d.npus - 1) * d.alpha + frac * m * (d.beta + gamma)
        m /= d.npus
    return t
