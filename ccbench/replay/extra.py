"""The calls of a trace that are not collectives of ccbench's registry: barrier, send/recv
and the uneven all-to-all (all_to_all_single with split sizes, all_to_all of a tensor list).

`prepare(sub, op, rank, timeout)` gives, for one rank of the call, the call to time and the
check that counts wrong bytes afterwards (bit for bit against what the peers sent), or the
reason the backend cannot run it:

- barrier: the backend's barrier on the group;
- send/recv: the backend's `replay_extras.blocking_messages` (its own point-to-point messages, or an
  <algorithm>@<transport> backend's transport), else refused;
- exchanges (sends and receives issued together): the backend's `replay_extras.exchanges`;
- alltoallv: the backend's `replay_extras.uneven_alltoall` (torch.distributed's all_to_all_single with
  split sizes, MPI's Alltoallv), else refused with the backend's reason.

What each backend can do is its own module's answer (ccbench.backends); nothing here asks
which backend it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ccbench.backends.base import Backend
from ccbench.dtypes import DTYPES, numpy_dtype
from ccbench.trace.ops import CommOp

__all__ = ["EXTRA", "SAME_WIDTH", "ExtraCall", "element_type", "prepare", "prepare_exchange"]

#: the calls this module runs
EXTRA = frozenset({"barrier", "send", "recv", "alltoallv"})
# element types the harness does not offer, measured as one of the same width (same bytes)
SAME_WIDTH = {"int64": "float64", "uint8": "int8", "bool": "int8", "int16": "float16"}


@dataclass
class ExtraCall:
    run: Callable[[], Any]
    check: Callable[[], int]          # wrong bytes on this rank (0 where nothing arrives)
    members: tuple[int, ...]          # global ranks of the call
    count: int                        # elements this rank sends (or receives: recv)


def element_type(dtype: str) -> np.dtype:
    return numpy_dtype(dtype if dtype in DTYPES else SAME_WIDTH.get(dtype, "int8"))


def _pattern(src: int, dst: int, count: int, dtype: np.dtype) -> np.ndarray:
    """What `src` sends `dst`: small integers, exact in every element type."""
    return ((np.arange(count) + 3 * src + 5 * dst) % 61).astype(dtype)


def _wrong(got: np.ndarray, want: np.ndarray) -> int:
    return int(np.count_nonzero(got.view(np.uint8) != want.view(np.uint8)))


def _library_peer(op: CommOp) -> int:
    """The peer as the op's communicator numbers it: ops hold global ranks (the trace's
    reader translates a PyTorch trace's group ranks), a sub-communicator its own."""
    assert op.peer is not None
    if op.group is not None and op.peer in op.group.ranks:
        return op.group.local(op.peer)
    return op.peer


def _p2p(sub: Backend, op: CommOp, rank: int, timeout: float) -> ExtraCall | str:
    if op.peer is None or op.peer < 0:
        return f"{op.collective} from any source: the peer is not in the trace"
    pair = sub.replay_extras.blocking_messages(timeout)
    if isinstance(pair, str):
        return pair
    send, recv = pair
    dtype = element_type(op.dtype)
    count = op.size // dtype.itemsize
    src, dst = (rank, op.peer) if op.collective == "send" else (op.peer, rank)
    want = _pattern(src, dst, count, dtype)
    buf = sub.alloc(count, dtype)
    peer, members = _library_peer(op), tuple(sorted((rank, op.peer)))
    if op.collective == "send":
        sub.copy_from_numpy(buf, want)
        return ExtraCall(lambda: send(buf, peer), lambda: 0, members, count)
    return ExtraCall(lambda: recv(buf, peer), lambda: _wrong(sub.to_numpy(buf), want),
                     members, count)


def prepare_exchange(sub: Backend, ops: list[CommOp], rank: int, timeout: float
                     ) -> ExtraCall | str:
    """This rank's sends and receives of one exchange (ccbench.trace.groups), posted together
    so that no order of the peers' posts can deadlock: every receive posted, then every send,
    then all waited for, or as one group where the library's messages complete before they
    return (the backend's `exchanges`)."""
    exchange = sub.replay_extras.exchanges(timeout)
    if isinstance(exchange, str):
        return exchange
    sends: list[tuple[np.ndarray, int, int]] = []
    recvs: list[tuple[np.ndarray, int, int]] = []
    checks: list[tuple[np.ndarray, np.ndarray]] = []
    for op in ops:
        if op.peer is None or op.peer < 0:
            return f"{op.collective} from any source: the peer is not in the trace"
        dtype = element_type(op.dtype)
        count = op.size // dtype.itemsize
        src, dst = (rank, op.peer) if op.collective == "send" else (op.peer, rank)
        want = _pattern(src, dst, count, dtype)
        buf = np.array(want) if op.collective == "send" else np.zeros_like(want)
        (sends if op.collective == "send" else recvs).append((buf.view(np.uint8),
                                                              _library_peer(op), 0))
        if op.collective == "recv":
            checks.append((buf, want))
    members = tuple(sorted({rank, *(op.peer for op in ops if op.peer is not None)}))
    check = lambda: sum(_wrong(got, want) for got, want in checks)  # noqa: E731
    return ExtraCall(exchange(sends, recvs), check, members, sum(b.size for b, _, _ in sends))


def _alltoallv(sub: Backend, op: CommOp, rank: int) -> ExtraCall | str:
    assert op.group is not None
    call = sub.replay_extras.uneven_alltoall()
    if isinstance(call, str):
        return call
    if len(op.in_splits) != op.group.size or len(op.out_splits) != op.group.size:
        return f"alltoallv: the trace gives no split sizes for a group of {op.group.size}"
    dtype = element_type(op.dtype)
    s_in, s_out = list(op.in_splits), list(op.out_splits)
    send, recv = sub.alloc(sum(s_in), dtype), sub.alloc(sum(s_out), dtype)
    members = op.group.ranks
    sub.copy_from_numpy(send, np.concatenate([_pattern(rank, peer, n, dtype)
                                              for peer, n in zip(members, s_in, strict=True)]))
    want = np.concatenate([_pattern(peer, rank, n, dtype)
                           for peer, n in zip(members, s_out, strict=True)])
    return ExtraCall(lambda: call(send, recv, s_in, s_out),
                     lambda: _wrong(sub.to_numpy(recv), want), members, sum(s_in))


def prepare(sub: Backend, op: CommOp, rank: int, timeout: float) -> ExtraCall | str:
    """This rank's part of one call of the trace outside the registry, or why not."""
    if op.collective == "barrier":
        members = op.group.ranks if op.group else (rank,)
        return ExtraCall(sub.barrier, lambda: 0, members, 0)
    if op.collective in ("send", "recv"):
        return _p2p(sub, op, rank, timeout)
    if op.collective == "alltoallv":
        return _alltoallv(sub, op, rank)
    return f"{op.collective}: not replayed (ccbench replays its registry's collectives, " \
           f"barrier, send/recv and alltoallv)"
