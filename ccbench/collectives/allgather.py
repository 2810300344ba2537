"""allgather: every rank gets every rank's block, in rank order. S = sendcount x n x elsize
(the gathered output), busbw factor (n-1)/n."""

from __future__ import annotations

import numpy as np

from ccbench.collectives.spec import Collective, Layout
from ccbench.collectives.values import moved


def _counts(size: int, elsize: int, n: int) -> tuple[int, int, int, int]:
    block = size // (elsize * n)
    return block * n, block, block * n, block * n * elsize


def _inputs(lay: Layout, op: str | None, rank: int, root: int, index: np.ndarray,
            dtype: np.dtype) -> np.ndarray:
    return moved(rank, index, lay.world_size)


def _expected(lay: Layout, op: str | None, rank: int, root: int, index: np.ndarray,
              dtype: np.dtype) -> np.ndarray:
    block = max(lay.block, 1)
    return moved(index // block, index % block, lay.world_size)



ALLGATHER = Collective(
    name="allgather", aliases=("all_gather", "all-gather"), reduces=False, rooted=False,
    busbw=lambda n: (n - 1) / n, counts=_counts, block=lambda lay: lay.send_count,
    inplace="send-in-recv", inputs=_inputs, expected=_expected, result_on="all",
    input_on="all", chakra="ALL_GATHER",
    astra="all-gather-implementation",
    comm_size=lambda size, p: size // p,          # Chakra's comm_size is the shard: the input
    size_meaning="sendcount x n x elsize", schedule_unit="block")
