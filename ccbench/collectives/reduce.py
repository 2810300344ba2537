"""reduce: the root gets the reduction of every rank's buffer. S = count x elsize, busbw
factor 1 (as nccl-tests' reduce_perf); only the root's output is defined, so only the root's
is checked (the others' receive buffers may serve the library as scratch)."""

from __future__ import annotations

from ccbench.collectives.cost_terms import Coefficients, frac, lg
from ccbench.collectives.spec import (
    ROOT_ONLY,
    Collective,
    ExportNames,
    ModelTerms,
    ToolNames,
    TraceRules,
    whole_buffer,
)
from ccbench.collectives.values import reduce_all, reducing_inputs, whole_reduction


def _reduce_binomial(p: int) -> Coefficients:
    rounds = lg(p)
    return Coefficients(rounds, rounds, rounds)


def _reduce_ring(p: int) -> Coefficients:
    # ring reduce-scatter ((p-1) steps of n/p, each reduced), then the p-1 finished blocks to
    # the root, one message each under the single-port model (algorithms/ring.ring_reduce)
    return Coefficients(2 * (p - 1), 2 * frac(p), frac(p))


REDUCE = Collective(
    name="reduce", aliases=(), reduces=True, rooted=True,
    busbw=lambda n: 1.0, counts=whole_buffer, block=lambda lay: lay.send_count,
    inplace="same", inputs=reducing_inputs, expected=whole_reduction,
    reference=lambda inputs, op, rank, root: reduce_all(inputs, op), result_on=ROOT_ONLY,
    input_on="all", size_meaning="count x elsize",
    # ASTRA-sim's system file has no reduce implementation to choose: no astra key
    export=ExportNames("REDUCE", comm_size=lambda size, p: size),
    model=ModelTerms(
        {"tree": _reduce_binomial, "ring": _reduce_ring},
        aliases={"hypercube": "tree", "binomial": "tree"}),
    tools=ToolNames(("reduce_perf", "osu_reduce"), mpi="MPI_Reduce"),
    trace=TraceRules(("c10d::reduce_",), in_place=True))
