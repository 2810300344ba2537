"""broadcast: the root's buffer to every rank. S = count x elsize, busbw factor 1."""

from __future__ import annotations

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
    whole_buffer,
)
from ccbench.collectives.values import moved


def _root_values(lay: Layout, op: str | None, rank: int, root: int, index: np.ndarray,
                 dtype: np.dtype) -> np.ndarray:
    return moved(root, index, lay.world_size)



def _bc_binomial(p: int) -> Coefficients:
    rounds = lg(p)
    return Coefficients(rounds, rounds, 0.0)


def _bc_scatter_ag(p: int) -> Coefficients:
    return Coefficients(lg(p) + p - 1, 2 * frac(p), 0.0)


def _bc_ring(p: int) -> Coefficients:            # chain, one message per hop, unpipelined
    return Coefficients(p - 1, p - 1, 0.0)


BROADCAST = Collective(
    name="broadcast", aliases=("bcast",), reduces=False, rooted=True,
    busbw=lambda n: 1.0, counts=whole_buffer, block=lambda lay: lay.send_count,
    inplace="one-buffer", inputs=_root_values, expected=_root_values,
    reference=lambda inputs, op, rank, root: np.asarray(inputs[root], dtype=np.float64),
    result_on=ALL_RANKS, input_on="root", size_meaning="count x elsize",
    export=ExportNames("BROADCAST", comm_size=lambda size, p: size),
    model=ModelTerms(
        {"tree": _bc_binomial, "scatter-allgather": _bc_scatter_ag, "ring": _bc_ring},
        aliases={"hypercube": "tree", "chain": "ring"}),
    tools=ToolNames(("broadcast_perf", "osu_bcast"), mpi="MPI_Bcast"),
    trace=TraceRules(("c10d::broadcast_",), in_place=True))
