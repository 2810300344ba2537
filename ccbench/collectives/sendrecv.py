"""sendrecv: every rank sends its buffer to rank+1 and receives rank-1's, as nccl-tests'
sendrecv_perf. S = count x elsize, busbw factor 1. Measured out of place only: sending from
and receiving into one buffer at once would race."""

from __future__ import annotations

import numpy as np

from ccbench.collectives.cost_terms import Coefficients
from ccbench.collectives.spec import ALL_RANKS, Collective, Layout, ModelTerms, ToolNames, whole_buffer
from ccbench.collectives.values import moved, own_moved


def peers(rank: int, world_size: int) -> tuple[int, int]:
    """(the rank this one sends to, the rank it receives from)."""
    return (rank + 1) % world_size, (rank - 1) % world_size


def _expected(lay: Layout, op: str | None, rank: int, root: int, index: np.ndarray,
              dtype: np.dtype) -> np.ndarray:
    return moved(peers(rank, lay.world_size)[1], index, lay.world_size)



def _sendrecv(p: int) -> Coefficients:
    # one message of n to rank+1 while one of n arrives from rank-1 (full duplex links)
    return Coefficients(1.0, 1.0, 0.0)


SENDRECV = Collective(
    name="sendrecv", aliases=("send_recv", "send-recv"), reduces=False, rooted=False,
    busbw=lambda n: 1.0, counts=whole_buffer, block=lambda lay: lay.send_count,
    inplace="never", inputs=own_moved, expected=_expected,
    reference=lambda inputs, op, rank, root: np.asarray(
        inputs[peers(rank, len(inputs))[1]], dtype=np.float64),
    result_on=ALL_RANKS, input_on="all",
    # no export names: Chakra's CollectiveCommType has no send-receive (only p2p nodes)
    size_meaning="count x elsize",
    model=ModelTerms(
        {"direct": _sendrecv},
        aliases={"direct": "direct", "pairwise": "direct", "ring": "direct"}),
    tools=ToolNames(("sendrecv_perf",), mpi="MPI_Sendrecv"))
