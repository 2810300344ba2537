"""scatter: rank r gets block r of the root's buffer (nccl-tests' scatter_perf). S =
recvcount x n x elsize (the root's whole input), busbw factor (n-1)/n. Only the root's send
buffer holds inputs, so a block that does not arrive shows as the sentinel."""

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
    one_block_out,
)
from ccbench.collectives.values import block_of, moved


def _root_values(lay: Layout, op: str | None, rank: int, root: int, index: np.ndarray,
                 dtype: np.dtype) -> np.ndarray:
    return moved(root, index, lay.world_size)


def _expected(lay: Layout, op: str | None, rank: int, root: int, index: np.ndarray,
              dtype: np.dtype) -> np.ndarray:
    return moved(root, rank * max(lay.block, 1) + index, lay.world_size)


def _binomial(p: int) -> Coefficients:
    # lg p rounds; the root's link carries the (p-1)/p of n that is not its own
    return Coefficients(lg(p), frac(p), 0.0)


def _direct(p: int) -> Coefficients:
    # the root sends the p-1 others one message each (single port)
    return Coefficients(p - 1, frac(p), 0.0)


def _resized(in_bytes: int, out_bytes: int, old: int, new: int) -> tuple[int, int]:
    """Each rank's block kept; the root's input (the others have none) is p blocks."""
    return out_bytes * new if in_bytes else 0, out_bytes


SCATTER = Collective(
    name="scatter", aliases=(), reduces=False, rooted=True,
    busbw=lambda n: (n - 1) / n, counts=one_block_out, block=lambda lay: lay.recv_count,
    inplace="recv-in-send", inputs=_root_values, expected=_expected,
    reference=lambda inputs, op, rank, root: block_of(inputs[root], rank, len(inputs)),
    result_on=ALL_RANKS,
    input_on="root", size_meaning="recvcount x n x elsize",
    # ASTRA-sim's system file has no scatter implementation to choose: no astra key
    export=ExportNames("SCATTER", comm_size=lambda size, p: size // p),  # one rank's block
    model=ModelTerms(
        {"tree": _binomial, "direct": _direct},
        aliases={"linear": "direct"}, schedule_unit="block"),
    tools=ToolNames(("scatter_perf", "osu_scatter"), mpi="MPI_Scatter"),
    trace=TraceRules(("c10d::scatter_",), size=lambda in_bytes, out_bytes, p: out_bytes * p,
                     resize=_resized))
