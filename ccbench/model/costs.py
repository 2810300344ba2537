"""alpha-beta-gamma cost formulas: T(n, p) = a(p) alpha + b(p) n beta + c(p) n gamma.

Units everywhere in ccbench.model: seconds, bytes, seconds per byte. n is the
nccl-tests S of the collective (see ccbench.collectives): the whole buffer for
allreduce / broadcast / reduce, the full gathered output for allgather, the full input for
reduce-scatter and the total a rank sends for all-to-all. The coefficients are those
of Thakur, Rabenseifner & Gropp (2005) as written in MPICH's cost comments; the
double binary tree entry follows NCCL's pipelined two-tree allreduce (each tree
carries half the data up and down: 2 ceil(lg p) latency terms, about 2n bytes per
rank on the wire, n reduced).

Non-power-of-two world sizes: recursive doubling / halving pay the MPICH fold-in
(two extra steps and an extra n on the wire); Bruck and binomial trees use ceil(lg p).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ccbench.errors import UsageError, choices_error

__all__ = ["Coefficients", "FORMULAS", "candidates", "coefficients", "canonical_algorithm",
           "predict_time"]


@dataclass(frozen=True, slots=True)
class Coefficients:
    """a: number of alpha terms; b, c: multipliers of n beta and n gamma."""

    a: float
    b: float
    c: float


def _lg(p: int) -> int:
    return max(0, math.ceil(math.log2(p))) if p > 1 else 0


def _is_pow2(p: int) -> bool:
    return p >= 1 and (p & (p - 1)) == 0


def _frac(p: int) -> float:
    return (p - 1) / p


# -- per (collective, algorithm): p -> Coefficients ------------------------------------------

def _ar_ring(p: int) -> Coefficients:
    return Coefficients(2 * (p - 1), 2 * _frac(p), _frac(p))


def _ar_recdbl(p: int) -> Coefficients:
    lg = math.floor(math.log2(p)) if p > 1 else 0
    if _is_pow2(p):
        return Coefficients(lg, lg, lg)
    # fold the extra ranks in and out: two more exchanges of the whole buffer
    return Coefficients(lg + 2, lg + 2, lg + 1)


def _ar_rabenseifner(p: int) -> Coefficients:
    if _is_pow2(p):
        lg = _lg(p)
        return Coefficients(2 * lg, 2 * _frac(p), _frac(p))
    lg = math.floor(math.log2(p))
    q = 1 << lg
    return Coefficients(2 * lg + 2, 2 * (q - 1) / q + 2, (q - 1) / q + 1)


def _ar_tree(p: int) -> Coefficients:            # binomial reduce + binomial broadcast
    lg = _lg(p)
    return Coefficients(2 * lg, 2 * lg, lg)


def _ar_dbt(p: int) -> Coefficients:             # double binary tree, pipelined
    lg = _lg(p)
    return Coefficients(2 * lg, 2.0 if p > 1 else 0.0, 1.0 if p > 1 else 0.0)


def _ag_ring(p: int) -> Coefficients:
    return Coefficients(p - 1, _frac(p), 0.0)


def _ag_recdbl(p: int) -> Coefficients:
    if _is_pow2(p):
        return Coefficients(_lg(p), _frac(p), 0.0)
    return Coefficients(2 * _lg(p), _frac(p) + 1.0, 0.0)   # MPICH: extra steps, extra data


def _ag_bruck(p: int) -> Coefficients:
    return Coefficients(_lg(p), _frac(p), 0.0)


def _rs_ring(p: int) -> Coefficients:
    return Coefficients(p - 1, _frac(p), _frac(p))


def _rs_rechalv(p: int) -> Coefficients:
    if _is_pow2(p):
        return Coefficients(_lg(p), _frac(p), _frac(p))
    lg = math.floor(math.log2(p))
    return Coefficients(lg + 1, _frac(p) + 1.0, _frac(p) + 1.0)


def _bc_binomial(p: int) -> Coefficients:
    lg = _lg(p)
    return Coefficients(lg, lg, 0.0)


def _bc_scatter_ag(p: int) -> Coefficients:
    return Coefficients(_lg(p) + p - 1, 2 * _frac(p), 0.0)


def _bc_ring(p: int) -> Coefficients:            # chain, one message per hop, unpipelined
    return Coefficients(p - 1, p - 1, 0.0)


def _a2a_pairwise(p: int) -> Coefficients:
    return Coefficients(p - 1, _frac(p), 0.0)     # n = total a rank sends; (p-1)/p leaves it


def _a2a_direct(p: int) -> Coefficients:
    # every message posted at once (gloo, MPI Isend/Irecv + waitall): one latency, and the
    # p-1 messages share the rank's link, so it still carries (p-1)/p of n; where they also
    # share links beyond it (an oversubscribed spine), only the replay sees the difference
    # from pairwise
    return Coefficients(1.0, _frac(p), 0.0)


def _a2a_bruck(p: int) -> Coefficients:
    return Coefficients(_lg(p), _lg(p) / 2, 0.0)


def _reduce_binomial(p: int) -> Coefficients:
    lg = _lg(p)
    return Coefficients(lg, lg, lg)


def _reduce_ring(p: int) -> Coefficients:
    # ring reduce-scatter ((p-1) steps of n/p, each reduced), then the p-1 finished blocks to
    # the root, one message each under the single-port model (algorithms/ring.ring_reduce)
    return Coefficients(2 * (p - 1), 2 * _frac(p), _frac(p))


def _sendrecv(p: int) -> Coefficients:
    # one message of n to rank+1 while one of n arrives from rank-1 (full duplex links)
    return Coefficients(1.0, 1.0, 0.0)


FORMULAS: dict[str, dict[str, Callable[[int], Coefficients]]] = {
    "allreduce": {
        "ring": _ar_ring, "recursive-doubling": _ar_recdbl, "rabenseifner": _ar_rabenseifner,
        "tree": _ar_tree, "double-binary-tree": _ar_dbt,
    },
    "allgather": {"ring": _ag_ring, "recursive-doubling": _ag_recdbl, "bruck": _ag_bruck},
    "reduce-scatter": {"ring": _rs_ring, "recursive-halving": _rs_rechalv},
    "broadcast": {"tree": _bc_binomial, "scatter-allgather": _bc_scatter_ag,
                  "ring": _bc_ring},
    "alltoall": {"pairwise": _a2a_pairwise, "direct": _a2a_direct, "bruck": _a2a_bruck},
    "reduce": {"tree": _reduce_binomial, "ring": _reduce_ring},
    "sendrecv": {"direct": _sendrecv},
}

# names used in records / by algorithms/ -> the formula key, per collective
_ALIASES: dict[str, dict[str, str]] = {
    "*": {
        "binomial": "tree", "binomial-tree": "tree", "recursive_doubling": "recursive-doubling",
        "recdbl": "recursive-doubling", "recursive_halving": "recursive-halving",
        "rechalv": "recursive-halving", "dbt": "double-binary-tree",
        "double_binary_tree": "double-binary-tree",
        "scatter_allgather": "scatter-allgather", "halving-doubling": "rabenseifner",
        "reduce-scatter-allgather": "rabenseifner", "dbtree": "double-binary-tree",
    },
    # algorithms/ registry names: hypercube allreduce is recursive doubling; hypercube
    # allgather is recursive doubling at powers of two and Bruck otherwise (same cost as
    # Bruck at powers of two); direct allgather costs like ring under the single-port
    # model. Direct all-to-all has its own formula: it sends every message at once.
    "allreduce": {"hypercube": "recursive-doubling", "halving_doubling": "rabenseifner"},
    "allgather": {"hypercube": "bruck", "direct": "ring"},
    "reduce-scatter": {"hypercube": "recursive-halving", "pairwise": "ring"},
    "broadcast": {"hypercube": "tree", "chain": "ring"},
    "alltoall": {"hypercube": "bruck", "ring": "pairwise"},
    "reduce": {"hypercube": "tree", "binomial": "tree"},
    "sendrecv": {"direct": "direct", "pairwise": "direct", "ring": "direct"},
}


def canonical_algorithm(collective: str, algorithm: str) -> str:
    """The formula key for an algorithm name as records and algorithms/ spell it."""
    if collective not in FORMULAS:
        raise choices_error("collective", collective, FORMULAS)
    name = algorithm.lower().replace(" ", "-")
    name = _ALIASES.get(collective, {}).get(name, _ALIASES["*"].get(name, name))
    name = name.replace("_", "-")
    if name not in FORMULAS[collective]:
        raise UsageError(f"no cost formula for {collective} algorithm {algorithm!r} "
                         f"(valid: {', '.join(FORMULAS[collective])})")
    return name


def candidates(collective: str) -> list[str]:
    if collective not in FORMULAS:
        raise choices_error("collective", collective, FORMULAS)
    return list(FORMULAS[collective])


def coefficients(collective: str, algorithm: str, p: int) -> Coefficients:
    if p < 1:
        raise UsageError(f"world size must be >= 1, got {p}")
    if p == 1:
        return Coefficients(0.0, 0.0, 0.0)
    return FORMULAS[collective][canonical_algorithm(collective, algorithm)](p)


def predict_time(collective: str, algorithm: str, p: int, n: float,
                 alpha: float, beta: float, gamma: float) -> float:
    """Seconds for n bytes (the nccl-tests S) at p ranks."""
    k = coefficients(collective, algorithm, p)
    return k.a * alpha + k.b * n * beta + k.c * n * gamma
