"""Input values whose every result is exact in every dtype, shared by the collectives.

Values are small integers: every partial sum, max, min or product any reduction order can
form is an integer that float16, bfloat16 and int8 represent exactly, so results compare bit
for bit whatever algorithm the library picks.
"""

from __future__ import annotations

import numpy as np

__all__ = ["moved", "reduced", "values"]


def _sum_values(rank: int | np.ndarray, index: np.ndarray, world_size: int) -> np.ndarray:
    if world_size <= 40:                   # 3 * 40 = 120 < 127 (int8) and < 256 (bfloat16)
        return (rank + 2 * index) % 4
    return ((rank + index) % world_size == 0).astype(np.int64)   # every sum is exactly 1


def values(op: str | None, rank: int | np.ndarray, index: np.ndarray, world_size: int
           ) -> np.ndarray:
    """Rank `rank`'s input at `index` for a reduction by `op` (None: data movement)."""
    if op == "sum":
        return _sum_values(rank, index, world_size)
    if op == "prod":                        # one rank holds 2, the rest 1, per element: product 2
        return np.where(index % world_size == rank, 2, 1)
    if op in ("max", "min"):
        return (rank * 3 + index) % 11 - 5
    return (rank * 7 + index * 3) % 13      # data movement: distinct per rank and index


def moved(rank: int | np.ndarray, index: np.ndarray, world_size: int) -> np.ndarray:
    """What a data-moving collective's rank `rank` holds at `index`."""
    return values(None, rank, index, world_size)


def reduced(op: str, index: np.ndarray, world_size: int) -> np.ndarray:
    """Reduction of every rank's input at `index`, accumulated rank by rank (no p x n array)."""
    result = values(op, 0, index, world_size).astype(np.int64)
    for rank in range(1, world_size):
        part = values(op, rank, index, world_size)
        if op == "sum":
            result += part
        elif op == "prod":
            result *= part
        elif op == "max":
            np.maximum(result, part, out=result)
        else:
            np.minimum(result, part, out=result)
    return result
