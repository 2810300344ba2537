"""reduce-scatter: rank r gets block r of the reduction of every rank's buffer.
S = recvcount x n x elsize (the whole input), busbw factor (n-1)/n."""

from __future__ import annotations

import numpy as np

from ccbench.collectives.spec import Collective, Layout
from ccbench.collectives.values import reduced, reducing_inputs


def _counts(size: int, elsize: int, n: int) -> tuple[int, int, int, int]:
    block = size // (elsize * n)
    return block * n, block * n, block, block * n * elsize


def _expected(lay: Layout, op: str | None, rank: int, root: int, index: np.ndarray,
              dtype: np.dtype) -> np.ndarray:
    return reduced(op or "sum", rank * max(lay.block, 1) + index, lay.world_size, dtype)



REDUCE_SCATTER = Collective(
    name="reduce-scatter", aliases=("reduce_scatter", "reducescatter"), reduces=True,
    rooted=False, busbw=lambda n: (n - 1) / n, counts=_counts, block=lambda lay: lay.recv_count,
    inplace="recv-in-send", inputs=reducing_inputs, expected=_expected, result_on="all",
    input_on="all", chakra="REDUCE_SCATTER",
    astra="reduce-scatter-implementation", comm_size=lambda size, p: size,
    size_meaning="recvcount x n x elsize", schedule_unit="block")
