"""reduce: the root gets the reduction of every rank's buffer. S = count x elsize, busbw
factor 1 (as nccl-tests' reduce_perf); only the root's output is defined, so only the root's
is checked (the others' receive buffers may serve the library as scratch)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ccbench.collectives.spec import Collective, Layout, whole_buffer
from ccbench.collectives.values import reduced, values


def _inputs(lay: Layout, op: str | None, rank: int, root: int, index: np.ndarray,
            dtype: np.dtype) -> np.ndarray:
    return values(op, rank, index, lay.world_size, dtype)


def _expected(lay: Layout, op: str | None, rank: int, root: int, index: np.ndarray,
              dtype: np.dtype) -> np.ndarray:
    return reduced(op or "sum", index, lay.world_size, dtype)


def _call(backend: Any, send: Any, recv: Any, op: str, root: int) -> None:
    backend.reduce(send, recv, op, root)


REDUCE = Collective(
    name="reduce", aliases=(), reduces=True, rooted=True,
    busbw=lambda n: 1.0, counts=whole_buffer, block=lambda lay: lay.send_count,
    inplace="same", inputs=_inputs, expected=_expected, result_on="root", input_on="all",
    method="reduce", call=_call, chakra="REDUCE",
    astra=None,         # ASTRA-sim's system file has no reduce implementation to choose
    comm_size=lambda size, p: size, size_meaning="count x elsize")
