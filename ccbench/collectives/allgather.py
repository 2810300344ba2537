"""allgather: every rank gets every rank's block, in rank order. S = sendcount x n x elsize
(the gathered output), busbw factor (n-1)/n."""

from __future__ import annotations

from ccbench.collectives.cost_terms import Coefficients, frac, is_pow2, lg
from ccbench.collectives.spec import (
    ALL_RANKS,
    Collective,
    ExportNames,
    ModelTerms,
    ToolNames,
    TraceRules,
    one_block_in,
)
from ccbench.collectives.values import concatenated, gathered_blocks, own_moved


def _ag_ring(p: int) -> Coefficients:
    return Coefficients(p - 1, frac(p), 0.0)


def _ag_recdbl(p: int) -> Coefficients:
    if is_pow2(p):
        return Coefficients(lg(p), frac(p), 0.0)
    return Coefficients(2 * lg(p), frac(p) + 1.0, 0.0)   # MPICH: extra steps, extra data


def _ag_bruck(p: int) -> Coefficients:
    return Coefficients(lg(p), frac(p), 0.0)


ALLGATHER = Collective(
    name="allgather", aliases=("all_gather", "all-gather"), reduces=False, rooted=False,
    busbw=lambda n: (n - 1) / n, counts=one_block_in, block=lambda lay: lay.send_count,
    inplace="send-in-recv", inputs=own_moved, expected=gathered_blocks, reference=concatenated,
    result_on=ALL_RANKS,
    input_on="all", size_meaning="sendcount x n x elsize",
    export=ExportNames("ALL_GATHER",
                       comm_size=lambda size, p: size // p,   # Chakra's: the shard, the input
                       astra="all-gather-implementation",
                       astra_impls={"ring": "ring", "recursive-doubling": "halvingDoubling",
                                    "bruck": "halvingDoubling"}),
    model=ModelTerms(
        {"ring": _ag_ring, "recursive-doubling": _ag_recdbl, "bruck": _ag_bruck},
        aliases={"hypercube": "bruck", "direct": "ring"}, schedule_unit="block"),
    tools=ToolNames(("all_gather_perf", "osu_allgather"), mpi="MPI_Allgather"),
    trace=TraceRules(
        ("c10d::allgather_", "c10d::_allgather_base_", "c10d::allgather_into_tensor_coalesced_",
         "c10d::allgather_coalesced_"),
        size=lambda in_bytes, out_bytes, p: out_bytes,
        resize=lambda in_bytes, out_bytes, old, new: (in_bytes, in_bytes * new)))
