"""The terms the collectives' cost formulas are written in: T(n, p) = a(p) alpha + b(p) n beta
+ c(p) n gamma (ccbench.model.costs). Each collective's module holds its own formulas, keyed by
algorithm (`Collective.model`: `ModelTerms.costs`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Coefficients", "CostFormula", "frac", "is_pow2", "lg"]


@dataclass(frozen=True, slots=True)
class Coefficients:
    """a: number of alpha terms; b, c: multipliers of n beta and n gamma."""

    a: float
    b: float
    c: float


#: world size p -> the coefficients of one algorithm
CostFormula = Callable[[int], Coefficients]


def lg(p: int) -> int:
    """ceil(lg p): the rounds of a binomial tree or Bruck's algorithm."""
    return max(0, math.ceil(math.log2(p))) if p > 1 else 0


def is_pow2(p: int) -> bool:
    return p >= 1 and (p & (p - 1)) == 0


def frac(p: int) -> float:
    """(p - 1) / p: the share of n that leaves (or reaches) one rank."""
    return (p - 1) / p
