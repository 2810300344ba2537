"""A stand-in for `cupy.cuda.nccl` over host memory: the CPU twin of the nccl-cupy backend.

The real binding (cupy_backends/cuda/libs/nccl.pyx) is mirrored call for call: the same names,
argument order and types (pointers, counts, ncclDataType_t/ncclRedOp_t values, a raw stream
pointer), `NcclCommunicator(ndev, commId: bytes, rank)` from `get_unique_id()`'s 128 bytes as
CuPy 14 has them (with $CCBENCH_FAKE_NCCL_ID=tuple: CuPy 13's tuple of 128 signed chars, which
its NcclCommunicator requires instead), groupStart/groupEnd. Underneath, each communicator is a
gloo process group of its own (torch's ProcessGroupGloo on a TCPStore named by the unique id),
and the buffers are the fake CuPy's host memory read through their addresses, so the backend's
real code runs in real multi-process runs and its results are checked bit for bit by the harness.

Semantics kept from NCCL: calls inside a group run when the outermost groupEnd is reached,
sends and receives of a pair match in issue order, a call issued on a stream that is
capturing a CUDA graph is recorded into that graph and runs only when the graph is launched.
Every call's stream pointer is counted ($CCBENCH_TWIN_COUNTS.<rank>.nccl.json at destroy).
"""

from __future__ import annotations

import ctypes
import datetime
import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np

available = True

NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = 0, 1, 2, 3, 4
NCCL_INT8 = NCCL_CHAR = 0
NCCL_UINT8 = 1
NCCL_INT32 = NCCL_INT = 2
NCCL_UINT32 = 3
NCCL_INT64 = 4
NCCL_UINT64 = 5
NCCL_FLOAT16 = NCCL_HALF = 6
NCCL_FLOAT32 = NCCL_FLOAT = 7
NCCL_FLOAT64 = NCCL_DOUBLE = 8
NCCL_BFLOAT16 = 9
NCCL_UNIQUE_ID_BYTES = 128
#: the NCCL whose API this mirrors (2.27.4); the records' library_version shows it
VERSION_CODE = 22704

_STORAGE = {NCCL_INT8: np.int8, NCCL_UINT8: np.uint8, NCCL_INT32: np.int32,
            NCCL_UINT32: np.uint32, NCCL_INT64: np.int64, NCCL_UINT64: np.uint64,
            NCCL_FLOAT16: np.float16, NCCL_FLOAT32: np.float32, NCCL_FLOAT64: np.float64,
            NCCL_BFLOAT16: np.int16}

#: TCPStore servers made by get_unique_id (alive for the process, as a unique id's listener)
_SERVERS: list[Any] = []
#: calls queued between groupStart and groupEnd, and the group depth
_GROUP: list[Callable[[], None]] = []
_P2P: list[tuple[str, Any, int, int, Any]] = []
_DEPTH = [0]
#: transfers of the open group issued on a capturing stream: stream id -> (stream, transfers)
_CAPTURED: dict[int, tuple[Any, list[tuple[str, Any, int, int, Any]]]] = {}


class NcclError(RuntimeError):
    def __init__(self, status: int, what: str = "") -> None:
        self.status = status
        super().__init__(f"NCCL_ERROR {status}: {what}")


def get_build_version() -> int:
    return VERSION_CODE


def get_version() -> int:
    return VERSION_CODE


def _id_type() -> type:
    """What this stand-in's get_unique_id returns and NcclCommunicator takes: bytes (CuPy
    14) unless $CCBENCH_FAKE_NCCL_ID=tuple (CuPy 13)."""
    return tuple if os.environ.get("CCBENCH_FAKE_NCCL_ID") == "tuple" else bytes


def get_unique_id() -> bytes | tuple[int, ...]:
    """128 bytes (CuPy 14) or 128 signed chars (CuPy 13), as CuPy returns them; here they spell
    the address of a TCPStore."""
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=300))
    _SERVERS.append(server)
    text = f"127.0.0.1:{server.port}".encode()
    raw = text + bytes(NCCL_UNIQUE_ID_BYTES - len(text))
    if _id_type() is bytes:
        return raw
    return tuple(int(b) - 256 if b > 127 else int(b) for b in raw)


def _address(comm_id: bytes | tuple[int, ...]) -> tuple[str, int]:
    raw = bytes((b + 256) % 256 for b in comm_id).rstrip(b"\0").decode()
    host, _, port = raw.rpartition(":")
    return host, int(port)


def _int(name: str, value: Any) -> int:
    """What Cython does with an `intptr_t`/`size_t`/`int` parameter: Python ints only."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"an integer is required for {name}, got {type(value).__name__}")
    return int(value)


def _array(ptr: int, count: int, datatype: int) -> np.ndarray:
    """`count` elements of `datatype` at address `ptr` (fake device memory is host memory)."""
    storage = np.dtype(_STORAGE[datatype])
    if count == 0:
        return np.empty(0, storage)
    buf = (ctypes.c_char * (count * storage.itemsize)).from_address(ptr)
    return np.frombuffer(memoryview(buf), dtype=storage)


def groupStart() -> None:  # noqa: N802  (CuPy's name)
    _DEPTH[0] += 1


def groupEnd() -> None:  # noqa: N802
    if _DEPTH[0] <= 0:
        raise NcclError(5, "ncclGroupEnd without ncclGroupStart")
    _DEPTH[0] -= 1
    if _DEPTH[0] > 0:
        return
    for owner, captured in _CAPTURED.values():   # a captured group replays as one call
        if captured and owner.capturing is not None:
            owner.capturing.append(lambda ops=list(captured): _run_p2p(ops))
    _CAPTURED.clear()
    calls, p2p = list(_GROUP), list(_P2P)
    _GROUP.clear()
    _P2P.clear()
    for call in calls:
        call()
    if p2p:
        _run_p2p(p2p)


def _run_p2p(ops: list[tuple[str, Any, int, int, Any]]) -> None:
    """Sends and receives of one group, posted together and waited for (pairs match in issue
    order: each direction of a pair numbers its messages; a rank's messages to itself are
    copied)."""
    by_comm: dict[int, list[tuple[str, Any, int, int, Any]]] = {}
    for op in ops:
        by_comm.setdefault(id(op[1]), []).append(op)
    for group in by_comm.values():
        comm = group[0][1]
        works: list[Any] = []
        selfs_out: list[np.ndarray] = []
        selfs_in: list[np.ndarray] = []
        for kind, _, peer, _, array in group:
            if peer == comm._rank:
                (selfs_out if kind == "send" else selfs_in).append(array)
                continue
            tensor = comm._tensor(array)
            seq = comm._sequence(kind, peer)
            works.append(comm._pg.send([tensor], peer, seq) if kind == "send"
                         else comm._pg.recv([tensor], peer, seq))
        if len(selfs_out) != len(selfs_in):
            raise NcclError(5, "unmatched send/recv to self in a group")
        for src, dst in zip(selfs_out, selfs_in, strict=True):
            if src.nbytes != dst.nbytes:
                raise NcclError(5, "send/recv to self of different sizes")
            np.copyto(dst.view(np.uint8), src.view(np.uint8))
        for work in works:
            work.wait()


class NcclCommunicator:
    """One rank of a communicator: the binding's methods over a gloo process group."""

    def __init__(self, ndev: int, commId: bytes | tuple, rank: int) -> None:  # noqa: N803
        import torch
        import torch.distributed as dist

        wanted = _id_type()       # Cython's `bytes commId` (CuPy 14) or `tuple commId` (13)
        if not isinstance(commId, wanted):
            raise TypeError(f"Argument 'commId' has incorrect type (expected "
                            f"{wanted.__name__}, got {type(commId).__name__})")
        if len(commId) != NCCL_UNIQUE_ID_BYTES:
            raise ValueError(f"commId length {len(commId)} != {NCCL_UNIQUE_ID_BYTES}.")
        ndev, rank = _int("ndev", ndev), _int("rank", rank)
        if not 0 <= rank < ndev:
            raise NcclError(4, f"rank {rank} outside 0..{ndev - 1}")
        host, port = _address(commId)
        timeout = datetime.timedelta(seconds=300)
        self._store = dist.TCPStore(host, port, is_master=False, timeout=timeout)
        self._pg: Any = dist.ProcessGroupGloo(self._store, rank, ndev, timeout)
        self._torch, self._dist = torch, dist
        self._rank, self._size = rank, ndev
        self._sequences: dict[tuple[str, int], int] = {}
        self._ops = {NCCL_SUM: dist.ReduceOp.SUM, NCCL_PROD: dist.ReduceOp.PRODUCT,
                     NCCL_MAX: dist.ReduceOp.MAX, NCCL_MIN: dist.ReduceOp.MIN}
        self.counts: dict[str, Any] = {"calls": 0, "streams": [], "group_calls": 0}
        self.alive = True

    # -- bookkeeping ------------------------------------------------------------------------
    def _sequence(self, kind: str, peer: int) -> int:
        key = (kind, peer)
        seq = self._sequences.get(key, 0)
        self._sequences[key] = seq + 1
        return seq % 32768

    def _tensor(self, array: np.ndarray) -> Any:
        torch = self._torch
        return torch.from_numpy(array)

    def _typed(self, array: np.ndarray, datatype: int) -> Any:
        tensor = self._tensor(array)
        return tensor.view(self._torch.bfloat16) if datatype == NCCL_BFLOAT16 else tensor

    def _issue(self, stream: int, call: Callable[[], None]) -> None:
        """Run the call now, at groupEnd, or when a graph captured on `stream` is launched."""
        if not self.alive:
            raise NcclError(5, "communicator destroyed")
        stream = _int("stream", stream)
        self.counts["calls"] += 1
        if stream not in self.counts["streams"]:
            self.counts["streams"].append(stream)
        import fake_cupy

        owner = fake_cupy._STREAMS.get(stream)
        if owner is not None and owner.capturing is not None:
            owner.capturing.append(call)
        elif _DEPTH[0] > 0:
            self.counts["group_calls"] += 1
            _GROUP.append(call)
        else:
            call()

    def _reduce_op(self, op: int) -> Any:
        if _int("op", op) not in self._ops:
            raise NcclError(4, f"reduction op {op} not supported here")
        return self._ops[op]

    # -- the binding's methods --------------------------------------------------------------
    def allReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int,  # noqa: N802
                  op: int, stream: int) -> None:
        src = _array(_int("sendbuf", sendbuf), _int("count", count), _int("datatype", datatype))
        dst = _array(_int("recvbuf", recvbuf), count, datatype)
        reduce_op = self._reduce_op(op)

        def call() -> None:
            if src.ctypes.data != dst.ctypes.data:
                np.copyto(dst, src)
            self._pg.allreduce([self._typed(dst, datatype)], reduce_op).wait()
        self._issue(stream, call)

    def broadcast(self, sendbuff: int, recvbuff: int, count: int, datatype: int,
                  root: int, stream: int) -> None:
        src = _array(_int("sendbuff", sendbuff), _int("count", count), _int("datatype", datatype))
        dst = _array(_int("recvbuff", recvbuff), count, datatype)
        root = _int("root", root)

        def call() -> None:
            if self._rank == root and src.ctypes.data != dst.ctypes.data:
                np.copyto(dst, src)
            self._pg.broadcast(self._typed(dst, datatype), root).wait()
        self._issue(stream, call)

    def bcast(self, buff: int, count: int, datatype: int, root: int, stream: int) -> None:
        self.broadcast(buff, buff, count, datatype, root, stream)

    def reduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int,
               root: int, stream: int) -> None:
        src = _array(_int("sendbuf", sendbuf), _int("count", count), _int("datatype", datatype))
        dst = _array(_int("recvbuf", recvbuf), count, datatype)
        reduce_op, root = self._reduce_op(op), _int("root", root)

        def call() -> None:
            work = src.copy()
            self._pg.allreduce([self._typed(work, datatype)], reduce_op).wait()
            if self._rank == root:
                np.copyto(dst, work)
        self._issue(stream, call)

    def allGather(self, sendbuf: int, recvbuf: int, count: int, datatype: int,  # noqa: N802
                  stream: int) -> None:
        src = _array(_int("sendbuf", sendbuf), _int("count", count), _int("datatype", datatype))
        dst = _array(_int("recvbuf", recvbuf), count * self._size, datatype)

        def call() -> None:
            mine = src.copy()                 # in place: the shard lies inside the output
            self._pg._allgather_base(self._typed(dst, datatype),
                                     self._typed(mine, datatype)).wait()
        self._issue(stream, call)

    def reduceScatter(self, sendbuf: int, recvbuf: int, recvcount: int,  # noqa: N802
                      datatype: int, op: int, stream: int) -> None:
        count = _int("recvcount", recvcount)
        src = _array(_int("sendbuf", sendbuf), count * self._size, _int("datatype", datatype))
        dst = _array(_int("recvbuf", recvbuf), count, datatype)
        reduce_op = self._reduce_op(op)
        options = self._dist.ReduceScatterOptions()
        options.reduceOp = reduce_op

        def call() -> None:
            whole = src.copy()                # in place: the output lies inside the input
            out = np.empty_like(dst)
            self._pg._reduce_scatter_base(self._typed(out, datatype),
                                          self._typed(whole, datatype), options).wait()
            np.copyto(dst, out)
        self._issue(stream, call)

    def send(self, sendbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        self._p2p("send", sendbuf, count, datatype, peer, stream)

    def recv(self, recvbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        self._p2p("recv", recvbuf, count, datatype, peer, stream)

    def _p2p(self, kind: str, ptr: int, count: int, datatype: int, peer: int,
             stream: int) -> None:
        array = _array(_int("buf", ptr), _int("count", count), _int("datatype", datatype))
        peer = _int("peer", peer)
        if not 0 <= peer < self._size:
            raise NcclError(4, f"peer {peer} outside 0..{self._size - 1}")
        op = (kind, self, peer, count, array)
        if _DEPTH[0] > 0:
            # a group's transfers are posted together at groupEnd (captured ones too: the
            # graph replays the whole group)
            self._issue_group_p2p(stream, op)
        else:
            self._issue(stream, lambda: _run_p2p([op]))

    def _issue_group_p2p(self, stream: int, op: tuple[str, Any, int, int, Any]) -> None:
        import fake_cupy

        owner = fake_cupy._STREAMS.get(_int("stream", stream))
        self.counts["calls"] += 1
        if stream not in self.counts["streams"]:
            self.counts["streams"].append(stream)
        self.counts["group_calls"] += 1
        if owner is not None and owner.capturing is not None:
            _CAPTURED.setdefault(id(owner), (owner, []))[1].append(op)
        else:
            _P2P.append(op)

    # -- management -------------------------------------------------------------------------
    def device_id(self) -> int:
        return 0

    def rank_id(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def check_async_error(self) -> None:
        return None

    def abort(self) -> None:
        self.destroy()

    def destroy(self) -> None:
        if not self.alive:
            return
        self.alive = False
        path = os.environ.get("CCBENCH_TWIN_COUNTS")
        if path:
            import fake_cupy

            with open(f"{path}.{self._rank}.nccl.json", "w", encoding="utf-8") as handle:
                json.dump({**self.counts, "cupy": dict(fake_cupy.COUNTERS)}, handle)
        self._pg = None
