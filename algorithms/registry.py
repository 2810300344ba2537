"""Schedule generators registered by (algorithm, collective): the one place that says which
collectives an algorithm has a schedule for (a collective is any name ccbench.collectives
registers; what its schedule computes is the schedule's ``pattern``).

A generator is ``f(p, root=0, segments=1) -> Schedule`` and must accept any p >= 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import lru_cache

from algorithms import alltoall, hypercube, ring, tree
from algorithms.schedule import Schedule

__all__ = ["ALGORITHMS", "REGISTRY", "Generator", "generate", "register",
           "supported"]

Generator = Callable[..., Schedule]

REGISTRY: dict[tuple[str, str], Generator] = {}


def register(algorithm: str, collective: str) -> Callable[[Generator], Generator]:
    def deco(fn: Generator) -> Generator:
        key = (algorithm, collective)
        if key in REGISTRY:
            raise ValueError(f"{algorithm} {collective} registered twice")
        REGISTRY[key] = fn
        return fn
    return deco


def _named(algorithm: str, fn: Generator) -> Generator:
    """The same generator under another algorithm name (the schedule carries that name)."""
    def named(p: int, root: int = 0, segments: int = 1) -> Schedule:
        return dataclasses.replace(fn(p, root, segments), algorithm=algorithm)
    named.__doc__ = fn.__doc__
    return named


for _key, _fn in {
    ("ring", "allreduce"): ring.ring_allreduce,
    ("ring", "reduce-scatter"): ring.ring_reduce_scatter,
    ("ring", "allgather"): ring.ring_allgather,
    ("ring", "broadcast"): ring.ring_broadcast,
    ("ring", "alltoall"): ring.ring_alltoall,
    ("ring", "reduce"): ring.ring_reduce,
    ("tree", "broadcast"): tree.binomial_broadcast,
    ("tree", "reduce"): tree.binomial_reduce,
    ("tree", "allreduce"): tree.tree_allreduce,
    ("dbtree", "allreduce"): tree.dbtree_allreduce,
    ("hypercube", "allreduce"): hypercube.rd_allreduce,
    ("hypercube", "reduce-scatter"): hypercube.halving_reduce_scatter,
    ("hypercube", "allgather"): hypercube.hypercube_allgather,
    ("hypercube", "broadcast"): _named("hypercube", tree.binomial_broadcast),
    ("hypercube", "reduce"): _named("hypercube", tree.binomial_reduce),
    ("rabenseifner", "allreduce"): hypercube.rabenseifner_allreduce,
    ("hypercube", "alltoall"): _named("hypercube", alltoall.bruck_alltoall),
    ("bruck", "allgather"): hypercube.bruck_allgather,
    ("bruck", "alltoall"): alltoall.bruck_alltoall,
    ("direct", "alltoall"): alltoall.direct_alltoall,
    ("direct", "allgather"): alltoall.direct_allgather,
    ("pairwise", "alltoall"): alltoall.pairwise_alltoall,
}.items():
    register(*_key)(_fn)

ALGORITHMS: tuple[str, ...] = tuple(dict.fromkeys(a for a, _ in REGISTRY))


def supported(algorithm: str) -> list[str]:
    """The collectives `algorithm` has a schedule for."""
    return [c for a, c in REGISTRY if a == algorithm]


@lru_cache(maxsize=256)
def generate(algorithm: str, collective: str, p: int, root: int = 0,
             segments: int = 1) -> Schedule:
    """The schedule of (algorithm, collective) on p ranks; KeyError names the valid choices."""
    if p < 1:
        raise ValueError(f"need at least one rank, got p={p}")
    if not 0 <= root < p:
        raise ValueError(f"root {root} outside 0..{p - 1}")
    fn = REGISTRY.get((algorithm, collective))
    if fn is None:
        valid = ", ".join(f"{a} {c}" for a, c in REGISTRY)
        raise KeyError(f"no schedule for {algorithm} {collective} (valid: {valid})")
    return fn(p, root=root, segments=segments)
