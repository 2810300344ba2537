"""alltoall: rank r's block d goes to rank d's block r. S = count x n x elsize (what one
rank sends), busbw factor (n-1)/n."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ccbench.collectives.cost_terms import Coefficients, frac, lg
from ccbench.collectives.spec import (
    ALL_RANKS,
    Collective,
    ExportNames,
    Layout,
    ModelTerms,
    ToolNames,
    TraceRules,
    blocks_both_ways,
)
from ccbench.collectives.values import block_of, moved, own_moved


def _reference(inputs: Sequence[np.ndarray], op: str | None, rank: int, root: int
               ) -> np.ndarray:
    """Block `rank` of every rank's input, in rank order."""
    return np.concatenate([block_of(x, rank, len(inputs)) for x in inputs])


def _expected(lay: Layout, op: str | None, rank: int, root: int, index: np.ndarray,
              dtype: np.dtype) -> np.ndarray:
    block = max(lay.block, 1)
    return moved(index // block, rank * block + index % block, lay.world_size)



def _a2a_pairwise(p: int) -> Coefficients:
    return Coefficients(p - 1, frac(p), 0.0)     # n = total a rank sends; (p-1)/p leaves it


def _a2a_direct(p: int) -> Coefficients:
    # every message posted at once (gloo, MPI Isend/Irecv + waitall): one latency, and the
    # p-1 messages share the rank's link, so it still carries (p-1)/p of n; where they also
    # share links beyond it (an oversubscribed spine), only the replay sees the difference
    # from pairwise
    return Coefficients(1.0, frac(p), 0.0)


def _a2a_bruck(p: int) -> Coefficients:
    return Coefficients(lg(p), lg(p) / 2, 0.0)


def _resized(in_bytes: int, out_bytes: int, old: int, new: int) -> tuple[int, int]:
    """Each block kept: p blocks each way at the new group size."""
    total = in_bytes // old * new
    return total, total


ALLTOALL = Collective(
    name="alltoall", aliases=("all_to_all", "all-to-all"), reduces=False, rooted=False,
    busbw=lambda n: (n - 1) / n, counts=blocks_both_ways,
    block=lambda lay: lay.send_count // lay.world_size, inplace="same", inputs=own_moved,
    expected=_expected, reference=_reference, result_on=ALL_RANKS, input_on="all",
    size_meaning="count x n x elsize",
    export=ExportNames("ALL_TO_ALL", comm_size=lambda size, p: size,
                       astra="all-to-all-implementation",
                       astra_impls={"direct": "direct1", "pairwise": "direct1"}),
    model=ModelTerms(
        {"pairwise": _a2a_pairwise, "direct": _a2a_direct, "bruck": _a2a_bruck},
        aliases={"hypercube": "bruck", "ring": "pairwise"}, schedule_unit="block"),
    tools=ToolNames(("alltoall_perf", "osu_alltoall"), mpi="MPI_Alltoall"),
    trace=TraceRules(("c10d::alltoall_base_", "c10d::alltoall_"), resize=_resized))
