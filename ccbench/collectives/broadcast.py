"""broadcast: the root's buffer to every rank. S = count x elsize, busbw factor 1."""

from __future__ import annotations

import numpy as np

from ccbench.collectives.spec import Collective, Layout, whole_buffer
from ccbench.collectives.values import moved


def _root_values(lay: Layout, op: str | None, rank: int, root: int, index: np.ndarray,
                 dtype: np.dtype) -> np.ndarray:
    return moved(root, index, lay.world_size)



BROADCAST = Collective(
    name="broadcast", aliases=("bcast",), reduces=False, rooted=True,
    busbw=lambda n: 1.0, counts=whole_buffer, block=lambda lay: lay.send_count,
    inplace="one-buffer", inputs=_root_values, expected=_root_values,
    result_on="all", input_on="root", chakra="BROADCAST", astra=None, comm_size=lambda size, p: size,
    size_meaning="count x elsize")
