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

The formulas live with their collective (`Collective.model.costs`, ccbench/collectives/<name>.py);
this module evaluates them.
"""

from __future__ import annotations

from ccbench.collectives import every
from ccbench.collectives.cost_terms import Coefficients, CostFormula
from ccbench.errors import UsageError, choices_error

__all__ = ["Coefficients", "FORMULAS", "candidates", "coefficients", "canonical_algorithm",
           "predict_time"]


#: collective -> algorithm key -> p -> Coefficients: each collective's own formulas
FORMULAS: dict[str, dict[str, CostFormula]] = {
    c.name: dict(c.model.costs) for c in every() if c.model is not None}

# names used in records / by algorithms/ -> the formula key: these for every collective, then
# each collective's own (`Collective.model.aliases`: hypercube allreduce is recursive doubling ...)
_ALIASES: dict[str, dict[str, str]] = {
    "*": {
        "binomial": "tree", "binomial-tree": "tree", "recursive_doubling": "recursive-doubling",
        "recdbl": "recursive-doubling", "recursive_halving": "recursive-halving",
        "rechalv": "recursive-halving", "dbt": "double-binary-tree",
        "double_binary_tree": "double-binary-tree",
        "scatter_allgather": "scatter-allgather", "halving-doubling": "rabenseifner",
        "reduce-scatter-allgather": "rabenseifner", "dbtree": "double-binary-tree",
    },
    **{c.name: dict(c.model.aliases) for c in every() if c.model is not None},
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
