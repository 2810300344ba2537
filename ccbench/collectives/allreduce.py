"""allreduce: every rank gets the reduction of every rank's buffer. S = count x elsize,
busbw factor 2(n-1)/n."""

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
    backend.allreduce(send, recv, op)


ALLREDUCE = Collective(
    name="allreduce", aliases=("all_reduce", "all-reduce"), reduces=True, rooted=False,
    busbw=lambda n: 2.0 * (n - 1) / n, counts=whole_buffer, block=lambda lay: lay.send_count,
    inplace="same", inputs=_inputs, expected=_expected, result_on="all", input_on="all",
    method="allreduce", call=_call, chakra="ALL_REDUCE", astra="all-reduce-implementation",
    comm_size=lambda size, p: size, size_meaning="count x elsize")
