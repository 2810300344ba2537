"""gather: the root gets every rank's block, in rank order (nccl-tests' gather_perf). S =
sendcount x n x elsize (the gathered output), busbw factor (n-1)/n. Only the root's output is
defined, so only the root's is checked."""

from __future__ import annotations

from ccbench.collectives.cost_terms import Coefficients, frac, lg
from ccbench.collectives.spec import (
    ROOT_ONLY,
    Collective,
    ExportNames,
    ModelTerms,
    ToolNames,
    TraceRules,
    one_block_in,
)
from ccbench.collectives.values import concatenated, gathered_blocks, own_moved


def _binomial(p: int) -> Coefficients:
    # lg p rounds; the root's link carries the (p-1)/p of n that is not its own
    return Coefficients(lg(p), frac(p), 0.0)


def _direct(p: int) -> Coefficients:
    # the root receives from the p-1 others one message each (single port)
    return Coefficients(p - 1, frac(p), 0.0)


def _resized(in_bytes: int, out_bytes: int, old: int, new: int) -> tuple[int, int]:
    """Each rank's block kept; the root's output (the others have none) is p blocks."""
    return in_bytes, in_bytes * new if out_bytes else 0


GATHER = Collective(
    name="gather", aliases=(), reduces=False, rooted=True,
    busbw=lambda n: (n - 1) / n, counts=one_block_in, block=lambda lay: lay.send_count,
    inplace="send-in-recv", inputs=own_moved, expected=gathered_blocks, reference=concatenated,
    result_on=ROOT_ONLY,
    input_on="all", size_meaning="sendcount x n x elsize",
    # ASTRA-sim's system file has no gather implementation to choose: no astra key
    export=ExportNames("GATHER", comm_size=lambda size, p: size // p),   # one rank's block
    model=ModelTerms(
        {"tree": _binomial, "direct": _direct},
        aliases={"linear": "direct"}, schedule_unit="block"),
    tools=ToolNames(("gather_perf", "osu_gather"), mpi="MPI_Gather"),
    trace=TraceRules(("c10d::gather_",), size=lambda in_bytes, out_bytes, p: in_bytes * p,
                     resize=_resized))
