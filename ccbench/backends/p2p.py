"""algorithms.transport implementations over the libraries' point-to-point messages.

A backend's `point_to_point(device)` builds one of these on its own communicator; the
algorithm backends (ccbench.backends.algorithmic) run schedules over it. Buffers are numpy
arrays on the host or CuPy arrays on a device; every message travels as raw bytes
(bfloat16 has no MPI datatype, and moving bytes needs none).

* `MPITransport`: mpi4py Isend/Irecv and persistent Send_init/Recv_init. Device arrays go
  to a CUDA-aware MPI as they are; MPI does not order itself after CUDA streams, so each
  step's transfers start only after the device finished the work queued before them.
* `StagedTransport`: any transport over host arrays, carrying device arrays through host
  copies (for an MPI that cannot read device memory).
* `TorchTransport`: torch.distributed isend/irecv (gloo: CPU tensors sharing the numpy
  memory). `GroupedTorchTransport` posts one step's transfers as one batch_isend_irecv (one
  NCCL group: sends and receives to the same peer cannot deadlock) and, on a device, waits
  for them on the stream, not on the host: the reductions that follow are queued behind
  the receives on the current stream and nothing blocks the CPU inside a step.
* `OneCCLTransport`: onecclSend/onecclRecv inside onecclGroupStart/End.
* `NcclCupyTransport`: ncclSend/ncclRecv through CuPy's binding, one step's transfers as one
  NCCL group on the backend's stream; the reductions that follow are CuPy kernels queued on
  the same stream, so nothing waits on the host inside a step.
"""

from __future__ import annotations

import datetime
import functools
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ccbench.bench_options import DEFAULT_TIMEOUT_S

__all__ = ["GroupedTorchTransport", "MPITransport", "NcclCupyTransport", "OneCCLTransport",
           "StagedTransport", "TorchTransport", "poll"]

_MISSES_PER_CLOCK = 256        # read the clock every this many failed tests
_DEFAULT_WAIT_S = DEFAULT_TIMEOUT_S


def _raw(buf: Any) -> Any:
    """The bytes of a contiguous numpy or CuPy slice."""
    return buf.view(np.uint8)


def poll(test: Callable[[], bool], timeout: float | None, what: str) -> None:
    """Test until done, giving the core away after every miss, until `timeout` passed.

    Yielding at once matters when ranks outnumber cores: on a shared 2-core host, 4 ranks of
    an 8-byte recursive-doubling allreduce took 86-206 us when 64 tests spun before each
    yield and ~40 us yielding at once, close to a blocking MPI_Waitall (which has no
    timeout). With a core to itself a rank pays well under a microsecond per miss."""
    if test():
        return
    limit = _DEFAULT_WAIT_S if timeout is None else timeout
    deadline = time.monotonic() + limit
    misses = 0
    while not test():
        os.sched_yield()
        misses += 1
        if misses % _MISSES_PER_CLOCK == 0 and time.monotonic() > deadline:
            from algorithms.transport import TransportTimeout

            raise TransportTimeout(f"{what}: not done after {limit:g} s")


# -- MPI ---------------------------------------------------------------------------------------

class _MPIRequest:
    __slots__ = ("req", "what")

    def __init__(self, req: Any, what: str) -> None:
        self.req, self.what = req, what

    def wait(self, timeout: float | None = None) -> None:
        poll(self.req.Test, timeout, self.what)


class MPITransport:
    """algorithms.transport over an mpi4py communicator. `device_sync`, when given, is called
    before each step's transfers start (device arrays on a CUDA-aware MPI)."""

    def __init__(self, comm: Any, device_sync: Callable[[], None] | None = None) -> None:
        from mpi4py import MPI

        self.MPI, self.comm, self.device_sync = MPI, comm, device_sync
        self.rank, self.size = comm.Get_rank(), comm.Get_size()

    def isend(self, buf: Any, peer: int, tag: int) -> _MPIRequest:
        if self.device_sync is not None:
            self.device_sync()
        return _MPIRequest(self.comm.Isend([_raw(buf), self.MPI.BYTE], dest=peer, tag=tag),
                           f"rank {self.rank}: send to {peer}")

    def irecv(self, buf: Any, peer: int, tag: int) -> _MPIRequest:
        return _MPIRequest(self.comm.Irecv([_raw(buf), self.MPI.BYTE], source=peer, tag=tag),
                           f"rank {self.rank}: recv from {peer}")

    def prepare(self, sends: list[tuple[Any, int, int]],
                recvs: list[tuple[Any, int, int]]) -> _MPIPrepared:
        """Persistent requests for one step (buffers parsed once, not per call)."""
        byte = self.MPI.BYTE
        rq = [self.comm.Recv_init([_raw(b), byte], source=peer, tag=tag) for b, peer, tag in recvs]
        sq = [self.comm.Send_init([_raw(b), byte], dest=peer, tag=tag) for b, peer, tag in sends]
        return _MPIPrepared(self.MPI, rq, sq, self.rank, self.device_sync)


class _MPIPrepared:
    __slots__ = ("MPI", "_testall", "all", "rank", "recvs", "start")

    def __init__(self, MPI: Any, recvs: list[Any], sends: list[Any], rank: int,
                 device_sync: Callable[[], None] | None) -> None:
        self.MPI, self.recvs, self.all, self.rank = MPI, recvs, recvs + sends, rank
        startall = functools.partial(MPI.Prequest.Startall, self.all)
        self.start: Callable[[], None]
        if device_sync is None:
            self.start = startall
        else:
            def start() -> None:
                device_sync()
                startall()
            self.start = start
        self._testall = functools.partial(MPI.Request.Testall, self.all)

    def wait_recv(self, i: int, timeout: float | None) -> None:
        poll(self.recvs[i].Test, timeout, f"rank {self.rank}: recv {i} of a step")

    def wait_all(self, timeout: float | None) -> None:
        if not self._testall():
            poll(self._testall, timeout, f"rank {self.rank}: a step's transfers")

    def free(self) -> None:
        for req in self.all:
            if req != self.MPI.REQUEST_NULL:
                req.Free()
        self.all = self.recvs = []


# -- device arrays through host copies ---------------------------------------------------------

class _StagedRecv:
    __slots__ = ("buf", "host", "req")

    def __init__(self, req: Any, host: np.ndarray, buf: Any) -> None:
        self.req, self.host, self.buf = req, host, buf

    def wait(self, timeout: float | None = None) -> None:
        self.req.wait(timeout)
        self.buf.view(np.uint8).set(self.host)


class StagedTransport:
    """Device arrays over a host transport: a send copies its slice to the host first (which
    waits for the device work before it), a receive lands in host memory and is copied up
    when waited for. Host slices are allocated per message: this path measures staging."""

    def __init__(self, host: Any) -> None:
        self.host, self.rank, self.size = host, host.rank, host.size

    def isend(self, buf: Any, peer: int, tag: int) -> Any:
        return self.host.isend(buf.view(np.uint8).get(), peer, tag)

    def irecv(self, buf: Any, peer: int, tag: int) -> _StagedRecv:
        landing = np.empty(int(buf.nbytes), dtype=np.uint8)
        return _StagedRecv(self.host.irecv(landing, peer, tag), landing, buf)


# -- torch.distributed -------------------------------------------------------------------------

def _host_tensor(torch: Any) -> Callable[[Any], Any]:
    def tensor_of(buf: Any) -> Any:
        return torch.from_numpy(_raw(buf))
    return tensor_of


class _TorchRequest:
    __slots__ = ("on_stream", "work")

    def __init__(self, work: Any, on_stream: bool) -> None:
        self.work, self.on_stream = work, on_stream

    def wait(self, timeout: float | None = None) -> None:
        # on a device, wait() orders the current stream after the transfer; with a timeout
        # torch would block the host instead, so the op timeout is left to NCCL's watchdog
        # (process-group timeout) and ccbench's
        if timeout is None or self.on_stream:
            self.work.wait()
        else:
            self.work.wait(datetime.timedelta(seconds=timeout))


class TorchTransport:
    """algorithms.transport over torch.distributed isend/irecv. `tensor_of` makes the uint8
    tensor sharing a slice's memory (host: torch.from_numpy; device: torch.as_tensor on the
    CuPy array); `on_stream`: the process group orders waits on the device stream (NCCL)."""

    def __init__(self, dist: Any, tensor_of: Callable[[Any], Any], *, on_stream: bool = False,
                 group: Any = None) -> None:
        self.dist, self.tensor_of, self.on_stream, self.group = dist, tensor_of, on_stream, group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)

    @classmethod
    def host(cls, dist: Any, torch: Any, group: Any = None) -> TorchTransport:
        return cls(dist, _host_tensor(torch), group=group)

    def isend(self, buf: Any, peer: int, tag: int) -> _TorchRequest:
        return _TorchRequest(self.dist.isend(self.tensor_of(buf), peer, group=self.group,
                                             tag=tag), self.on_stream)

    def irecv(self, buf: Any, peer: int, tag: int) -> _TorchRequest:
        return _TorchRequest(self.dist.irecv(self.tensor_of(buf), peer, group=self.group,
                                             tag=tag), self.on_stream)


class GroupedTorchTransport(TorchTransport):
    """TorchTransport whose steps are prepared once and posted as one batch_isend_irecv."""

    def prepare(self, sends: list[tuple[Any, int, int]],
                recvs: list[tuple[Any, int, int]]) -> _TorchPrepared:
        dist, group = self.dist, self.group
        ops = [dist.P2POp(dist.irecv, self.tensor_of(b), peer, group, tag)
               for b, peer, tag in recvs]
        ops += [dist.P2POp(dist.isend, self.tensor_of(b), peer, group, tag)
                for b, peer, tag in sends]
        return _TorchPrepared(dist, ops, len(recvs), self.on_stream)


class _TorchPrepared:
    __slots__ = ("dist", "num_recvs", "on_stream", "ops", "works")

    def __init__(self, dist: Any, ops: list[Any], num_recvs: int, on_stream: bool) -> None:
        self.dist, self.ops, self.num_recvs, self.on_stream = dist, ops, num_recvs, on_stream
        self.works: list[_TorchRequest | None] = []

    def start(self) -> None:
        self.works = [_TorchRequest(w, self.on_stream)
                      for w in self.dist.batch_isend_irecv(self.ops) or ()]

    def wait_recv(self, i: int, timeout: float | None) -> None:
        if len(self.works) != len(self.ops):   # a coalesced group: one work for all its ops
            self.wait_all(timeout)
            return
        work = self.works[i]
        if work is not None:
            # each work is waited for once: a second wait on a finished gloo receive blocks
            self.works[i] = None
            work.wait(timeout)

    def wait_all(self, timeout: float | None) -> None:
        works, self.works = self.works, []
        for work in works:
            if work is not None:
                work.wait(timeout)

    def free(self) -> None:
        self.ops, self.works = [], []


# -- oneCCL ------------------------------------------------------------------------------------

class _Done:
    __slots__ = ()

    def wait(self, timeout: float | None = None) -> None:
        return None


class OneCCLTransport:
    """onecclSend/onecclRecv on host memory. oneCCL has no tags and no requests: messages
    between a pair stay in order, and a step's transfers run as one group that is complete
    when onecclGroupEnd returns (so isend/irecv are each a group of one)."""

    def __init__(self, backend: Any) -> None:
        self.backend, self.lib = backend, backend.lib
        self.rank, self.size = backend.ctx.rank, backend.ctx.world_size

    def _group(self, sends: list[tuple[Any, int, int]], recvs: list[tuple[Any, int, int]]
               ) -> None:
        lib, comm, check = self.lib, self.backend._handle, self.backend._check
        check(lib.onecclGroupStart(), "onecclGroupStart")
        for buf, peer, _ in recvs:
            check(lib.onecclRecv(buf.ctypes.data, buf.nbytes, 1, peer, comm, None), "onecclRecv")
        for buf, peer, _ in sends:
            check(lib.onecclSend(buf.ctypes.data, buf.nbytes, 1, peer, comm, None), "onecclSend")
        check(lib.onecclGroupEnd(), "onecclGroupEnd")

    def isend(self, buf: np.ndarray, peer: int, tag: int) -> _Done:
        self._group([(buf, peer, tag)], [])
        return _Done()

    def irecv(self, buf: np.ndarray, peer: int, tag: int) -> _Done:
        self._group([], [(buf, peer, tag)])
        return _Done()

    def prepare(self, sends: list[tuple[Any, int, int]],
                recvs: list[tuple[Any, int, int]]) -> _GroupPrepared:
        return _GroupPrepared(functools.partial(self._group, sends, recvs))


class _GroupPrepared:
    __slots__ = ("start",)

    def __init__(self, start: Callable[[], None]) -> None:
        self.start = start

    def wait_recv(self, i: int, timeout: float | None) -> None:
        return None

    def wait_all(self, timeout: float | None) -> None:
        return None

    def free(self) -> None:
        return None


# -- NCCL through CuPy -------------------------------------------------------------------------

class NcclCupyTransport:
    """ncclSend/ncclRecv (cupy.cuda.nccl) on CuPy arrays, as bytes (ncclUint8), on `stream`
    (a raw stream pointer). NCCL matches messages of a pair in issue order and has no tags;
    the executor's tags are sequence numbers of the pair, so the order is the same. A step is
    one group: its sends and receives to one peer cannot deadlock, and the group is complete
    on the stream, not on the host, when ncclGroupEnd returns: waits are no-ops, and what the
    schedule does next (kernels, copies, the next step) is queued behind it on the stream."""

    def __init__(self, nccl: Any, comm: Any, rank: int, size: int, stream: int) -> None:
        self.nccl, self.comm, self.stream = nccl, comm, stream
        self.rank, self.size = rank, size
        self.byte = int(nccl.NCCL_UINT8)

    def _resolved(self, messages: list[tuple[Any, int, int]]) -> list[tuple[int, int, int]]:
        return [(int(buf.data.ptr), int(buf.nbytes), peer) for buf, peer, _ in messages]

    def _group(self, sends: list[tuple[int, int, int]], recvs: list[tuple[int, int, int]]
               ) -> None:
        nccl, comm, stream, byte = self.nccl, self.comm, self.stream, self.byte
        nccl.groupStart()
        try:
            for ptr, nbytes, peer in recvs:
                comm.recv(ptr, nbytes, byte, peer, stream)
            for ptr, nbytes, peer in sends:
                comm.send(ptr, nbytes, byte, peer, stream)
        finally:
            nccl.groupEnd()

    def isend(self, buf: Any, peer: int, tag: int) -> _Done:
        self._group(self._resolved([(buf, peer, tag)]), [])
        return _Done()

    def irecv(self, buf: Any, peer: int, tag: int) -> _Done:
        self._group([], self._resolved([(buf, peer, tag)]))
        return _Done()

    def prepare(self, sends: list[tuple[Any, int, int]],
                recvs: list[tuple[Any, int, int]]) -> _GroupPrepared:
        """The step's group with the pointers resolved once (waits are the stream's)."""
        return _GroupPrepared(functools.partial(self._group, self._resolved(sends),
                                                self._resolved(recvs)))
