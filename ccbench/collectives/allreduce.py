"""allreduce: every rank gets the reduction of every rank's buffer. S = count x elsize,
busbw factor 2(n-1)/n."""

from __future__ import annotations

import math

from ccbench.collectives.cost_terms import Coefficients, frac, is_pow2, lg
from ccbench.collectives.spec import (
    ALL_RANKS,
    Collective,
    ExportNames,
    ModelTerms,
    ToolNames,
    TraceRules,
    whole_buffer,
)
from ccbench.collectives.values import reduce_all, reducing_inputs, whole_reduction


def _ar_ring(p: int) -> Coefficients:
    return Coefficients(2 * (p - 1), 2 * frac(p), frac(p))


def _ar_recdbl(p: int) -> Coefficients:
    rounds = math.floor(math.log2(p)) if p > 1 else 0
    if is_pow2(p):
        return Coefficients(rounds, rounds, rounds)
    # fold the extra ranks in and out: two more exchanges of the whole buffer
    return Coefficients(rounds + 2, rounds + 2, rounds + 1)


def _ar_rabenseifner(p: int) -> Coefficients:
    if is_pow2(p):
        rounds = lg(p)
        return Coefficients(2 * rounds, 2 * frac(p), frac(p))
    rounds = math.floor(math.log2(p))
    q = 1 << rounds
    return Coefficients(2 * rounds + 2, 2 * (q - 1) / q + 2, (q - 1) / q + 1)


def _ar_tree(p: int) -> Coefficients:            # binomial reduce + binomial broadcast
    rounds = lg(p)
    return Coefficients(2 * rounds, 2 * rounds, rounds)


def _ar_dbt(p: int) -> Coefficients:             # double binary tree, pipelined
    rounds = lg(p)
    return Coefficients(2 * rounds, 2.0 if p > 1 else 0.0, 1.0 if p > 1 else 0.0)


ALLREDUCE = Collective(
    name="allreduce", aliases=("all_reduce", "all-reduce"), reduces=True, rooted=False,
    busbw=lambda n: 2.0 * (n - 1) / n, counts=whole_buffer, block=lambda lay: lay.send_count,
    inplace="same", inputs=reducing_inputs, expected=whole_reduction,
    reference=lambda inputs, op, rank, root: reduce_all(inputs, op), result_on=ALL_RANKS,
    input_on="all", size_meaning="count x elsize",
    export=ExportNames("ALL_REDUCE", comm_size=lambda size, p: size,
                       astra="all-reduce-implementation",
                       astra_impls={"ring": "ring", "rabenseifner": "halvingDoubling",
                                    "tree": "doubleBinaryTree"}),
    model=ModelTerms(
        {"ring": _ar_ring, "recursive-doubling": _ar_recdbl, "rabenseifner": _ar_rabenseifner,
           "tree": _ar_tree, "double-binary-tree": _ar_dbt},
        aliases={"hypercube": "recursive-doubling", "halving_doubling": "rabenseifner"}),
    tools=ToolNames(("all_reduce_perf", "osu_allreduce"), mpi="MPI_Allreduce"),
    trace=TraceRules(("c10d::allreduce_", "c10d::allreduce_coalesced_"), in_place=True))
