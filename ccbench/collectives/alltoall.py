"""alltoall: rank r's block d goes to rank d's block r. S = count x n x elsize (what one
rank sends), busbw factor (n-1)/n."""

from __future__ import annotations

import numpy as np

from ccbench.collectives.spec import Collective, Layout
from ccbench.collectives.values import moved


def _counts(size: int, elsize: int, n: int) -> tuple[int, int, int, int]:
    block = size // (elsize * n)
    return block * n, block * n, block * n, block * n * elsize


def _inputs(lay: Layout, op: str | None, rank: int, root: int, index: np.ndarray,
            dtype: np.dtype) -> np.ndarray:
    return moved(rank, index, lay.world_size)


def _expected(lay: Layout, op: str | None, rank: int, root: int, index: np.ndarray,
              dtype: np.dtype) -> np.ndarray:
    block = max(lay.block, 1)
    return moved(index // block, rank * block + index % block, lay.world_size)



ALLTOALL = Collective(
    name="alltoall", aliases=("all_to_all", "all-to-all"), reduces=False, rooted=False,
    busbw=lambda n: (n - 1) / n, counts=_counts,
    block=lambda lay: lay.send_count // lay.world_size, inplace="same", inputs=_inputs,
    expected=_expected, result_on="all", input_on="all",
    chakra="ALL_TO_ALL", astra="all-to-all-implementation", comm_size=lambda size, p: size,
    size_meaning="count x n x elsize", schedule_unit="block")
