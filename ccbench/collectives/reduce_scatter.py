"""reduce-scatter: rank r gets block r of the reduction of every rank's buffer.
S = recvcount x n x elsize (the whole input), busbw factor (n-1)/n."""

from __future__ import annotations

import math

import numpy as np

from ccbench.collectives.cost_terms import Coefficients, frac, is_pow2, lg
from ccbench.collectives.spec import (
    ALL_RANKS,
    Collective,
    ExportNames,
    Layout,
    ModelTerms,
    ToolNames,
    TraceRules,
    one_block_out,
)
from ccbench.collectives.values import block_of, reduce_all, reduced, reducing_inputs


def _expected(lay: Layout, op: str | None, rank: int, root: int, index: np.ndarray,
              dtype: np.dtype) -> np.ndarray:
    return reduced(op or "sum", rank * max(lay.block, 1) + index, lay.world_size, dtype)



def _rs_ring(p: int) -> Coefficients:
    return Coefficients(p - 1, frac(p), frac(p))


def _rs_rechalv(p: int) -> Coefficients:
    if is_pow2(p):
        return Coefficients(lg(p), frac(p), frac(p))
    rounds = math.floor(math.log2(p))
    return Coefficients(rounds + 1, frac(p) + 1.0, frac(p) + 1.0)


REDUCE_SCATTER = Collective(
    name="reduce-scatter", aliases=("reduce_scatter", "reducescatter"), reduces=True,
    rooted=False, busbw=lambda n: (n - 1) / n, counts=one_block_out,
    block=lambda lay: lay.recv_count, inplace="recv-in-send", inputs=reducing_inputs,
    expected=_expected,
    reference=lambda inputs, op, rank, root: block_of(reduce_all(inputs, op), rank, len(inputs)),
    result_on=ALL_RANKS,
    input_on="all", size_meaning="recvcount x n x elsize",
    export=ExportNames("REDUCE_SCATTER", comm_size=lambda size, p: size,
                       astra="reduce-scatter-implementation",
                       astra_impls={"ring": "ring", "recursive-halving": "halvingDoubling"}),
    model=ModelTerms(
        {"ring": _rs_ring, "recursive-halving": _rs_rechalv},
        aliases={"hypercube": "recursive-halving", "pairwise": "ring"}, schedule_unit="block"),
    tools=ToolNames(("reduce_scatter_perf", "osu_reduce_scatter"), mpi="MPI_Reduce_scatter_block"),
    trace=TraceRules(
        ("c10d::reduce_scatter_", "c10d::_reduce_scatter_base_",
         "c10d::reduce_scatter_tensor_coalesced_"),
        resize=lambda in_bytes, out_bytes, old, new: (out_bytes * new, out_bytes)))
