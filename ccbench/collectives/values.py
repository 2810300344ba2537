"""Input values whose every result is exact in every dtype, shared by the collectives.

Values are small integers: every partial sum, max, min or product any reduction order can
form is an integer the dtype represents exactly (sums of 0..3 per rank while 3 x ranks fits,
else one rank holds 1 per element; no negatives in unsigned types), so results compare bit
for bit whatever algorithm the library picks. avg: one rank per element holds n*k and the
others 0, with k chosen so that every way libraries compute the mean gives exactly k
(`ccbench.dtypes.avg_scales`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ccbench.collectives.spec import Layout
from ccbench.dtypes import avg_scales, exact_integers

__all__ = ["block_of", "concatenated", "gathered_blocks", "moved", "own_moved", "reduce_all", "reduced",
           "reducing_inputs", "values", "whole_reduction"]


def _sum_values(rank: int | np.ndarray, index: np.ndarray, world_size: int, dtype: np.dtype
                ) -> np.ndarray:
    if 3 * world_size <= min(exact_integers(dtype), 120):   # every partial sum <= 3n is exact
        return (rank + 2 * index) % 4
    return ((rank + index) % world_size == 0).astype(np.int64)   # every sum is exactly 1


def _avg_values(rank: int | np.ndarray, index: np.ndarray, world_size: int, dtype: np.dtype
                ) -> np.ndarray:
    """One rank per element holds n*k, the others 0: the mean k is exact whether a library
    sums then divides or scales each input by 1/n first."""
    scales = avg_scales(dtype, world_size)
    if not scales:
        return np.zeros(np.shape(index), dtype=np.int64)
    k = np.asarray(scales)[(index // world_size) % len(scales)]
    return np.where(index % world_size == rank, world_size * k, 0)


def values(op: str | None, rank: int | np.ndarray, index: np.ndarray, world_size: int,
           dtype: np.dtype) -> np.ndarray:
    """Rank `rank`'s input at `index` for a reduction by `op` (None: data movement)."""
    if op == "sum":
        return _sum_values(rank, index, world_size, dtype)
    if op == "avg":
        return _avg_values(rank, index, world_size, dtype)
    if op == "prod":                        # one rank holds 2, the rest 1, per element: product 2
        return np.where(index % world_size == rank, 2, 1)
    if op in ("max", "min"):               # -5..5, or 0..10 where there are no negatives
        return (rank * 3 + index) % 11 - (0 if dtype.kind == "u" else 5)
    return moved(rank, index, world_size)


def moved(rank: int | np.ndarray, index: np.ndarray, world_size: int) -> np.ndarray:
    """What a data-moving collective's rank `rank` holds at `index`: distinct per rank and
    index, 0..12 (exact in every dtype or, in float8, rounded the same on both sides)."""
    return (rank * 7 + index * 3) % 13


def reduced(op: str, index: np.ndarray, world_size: int, dtype: np.dtype) -> np.ndarray:
    """Reduction of every rank's input at `index`, accumulated rank by rank (no p x n array)."""
    result = values(op, 0, index, world_size, dtype).astype(np.int64)
    for rank in range(1, world_size):
        part = values(op, rank, index, world_size, dtype)
        if op in ("sum", "avg"):
            result += part
        elif op == "prod":
            result *= part
        elif op == "max":
            np.maximum(result, part, out=result)
        else:
            np.minimum(result, part, out=result)
    if op == "avg":
        result //= world_size               # exact: the sum is n*k
    return result


def reducing_inputs(lay: Layout, op: str | None, rank: int, root: int, index: np.ndarray,
                    dtype: np.dtype) -> np.ndarray:
    """Every reducing collective's input on `rank` (allreduce, reduce, reduce-scatter)."""
    return values(op, rank, index, lay.world_size, dtype)


def whole_reduction(lay: Layout, op: str | None, rank: int, root: int, index: np.ndarray,
                    dtype: np.dtype) -> np.ndarray:
    """The reduction of every rank's whole buffer (allreduce everywhere, reduce on the root)."""
    return reduced(op or "sum", index, lay.world_size, dtype)


def own_moved(lay: Layout, op: str | None, rank: int, root: int, index: np.ndarray,
              dtype: np.dtype) -> np.ndarray:
    """A data-moving collective's input on `rank`: its own values (allgather, gather, alltoall,
    sendrecv)."""
    return moved(rank, index, lay.world_size)


def gathered_blocks(lay: Layout, op: str | None, rank: int, root: int, index: np.ndarray,
                    dtype: np.dtype) -> np.ndarray:
    """Every rank's block, in rank order (allgather everywhere, gather on the root)."""
    block = max(lay.block, 1)
    return moved(index // block, index % block, lay.world_size)


# brute-force references (Collective.reference): every rank's whole input at once, in float64

_REDUCERS: dict[str, Callable[..., np.ndarray]] = {
    "sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min, "avg": np.mean}


def reduce_all(inputs: Sequence[np.ndarray], op: str | None) -> np.ndarray:
    """The element-wise reduction of every rank's input by `op`."""
    stacked = np.stack([np.asarray(x).astype(np.float64) for x in inputs])
    return np.asarray(_REDUCERS[op or "sum"](stacked, axis=0))


def block_of(values: np.ndarray, rank: int, ranks: int) -> np.ndarray:
    """Block `rank` of `values` cut in `ranks` equal blocks."""
    block = np.asarray(values).size // ranks
    return np.asarray(values, dtype=np.float64).reshape(-1)[rank * block:(rank + 1) * block]


def concatenated(inputs: Sequence[np.ndarray], op: str | None, rank: int, root: int
                 ) -> np.ndarray:
    """Every rank's input, one after the other in rank order (allgather; gather's root)."""
    return np.concatenate([np.asarray(x, dtype=np.float64) for x in inputs])
