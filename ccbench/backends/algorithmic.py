"""Backends that run algorithms/ schedules over another backend's point-to-point messages.

Names are ``<algorithm>[:<chunk>]@<transport>``:

* algorithm: ring, tree, dbtree, hypercube, rabenseifner, bruck, direct, pairwise
  (which collectives each has: ``algorithms.registry``; others are reported by
  ``unsupported()`` and skipped);
* chunk (optional): the pipelining unit in bytes (``ring:256K@mpi``). Messages larger than
  a chunk are split into ceil(size / chunk) segments, at most 64. Without it, broadcast
  and the trees pipeline in 512 KiB segments and everything else sends one message per
  block;
* transport: ``mpi`` (mpi4py persistent Send_init/Recv_init, else Isend/Irecv, on
  the mpi backend's communicator, numpy buffers) or ``gloo`` (torch.distributed
  isend/irecv on CPU tensors). Host buffers only: the executor can run on cupy arrays,
  but no GPU transport is wired in here yet.

The class subclasses the transport's backend, so buffers, barrier and metadata are the
transport's; only the five collectives run the schedule. Records carry
``algorithm`` (e.g. ``ring`` or ``ring:256K``) and ``transport`` (``mpi``).
Reductions are done locally by the executor (numpy), so bfloat16 and every op work on
every transport.
"""

from __future__ import annotations

import datetime
import functools
import math
import os
import time
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from ccbench.backends.base import Backend, RankContext
from ccbench.errors import UsageError, choices_error

__all__ = ["TRANSPORTS", "algorithm_backend_class", "algorithm_names", "parse_name"]

#: transport name -> "module:Class" of the backend whose point-to-point carries the bytes
TRANSPORTS: dict[str, str] = {
    "mpi": "ccbench.backends.mpi:MPIBackend",
    "gloo": "ccbench.backends.gloo:GlooBackend",
}
_MAX_SEGMENTS = 64
_DEFAULT_PIPELINE_CHUNK = 512 << 10            # broadcast and trees
_PIPELINED = frozenset({"broadcast"})
_PIPELINED_ALGOS = frozenset({"tree", "dbtree"})
_MISSES_PER_CLOCK = 256        # read the clock every this many failed tests


def algorithm_names() -> list[str]:
    from algorithms import ALGORITHMS

    return list(ALGORITHMS)


def parse_name(name: str) -> tuple[str, int | None, str]:
    """``ring:256K@mpi`` -> ("ring", 262144, "mpi"); UsageError for unknown parts."""
    algo_part, sep, transport = name.partition("@")
    if not sep or not algo_part or not transport:
        raise UsageError(f"malformed algorithm backend {name!r} (form: <algorithm>@<transport>, "
                         f"e.g. ring@mpi)")
    algorithm, _, chunk_text = algo_part.partition(":")
    valid = algorithm_names()
    if algorithm not in valid:
        raise choices_error("algorithm", algorithm, valid)
    if transport not in TRANSPORTS:
        raise choices_error("transport", transport, TRANSPORTS)
    chunk = None
    if chunk_text:
        from ccbench.sizes import parse_size

        chunk = parse_size(chunk_text)
    return algorithm, chunk, transport


def _transport_class(transport: str) -> type[Backend]:
    from ccbench.backends import backend_class

    return backend_class(transport)


# -- transports over ccbench backends --------------------------------------------------------

class _MPIRequest:
    __slots__ = ("req", "what")

    def __init__(self, req: Any, what: str) -> None:
        self.req, self.what = req, what

    def wait(self, timeout: float | None = None) -> None:
        _poll(self.req.Test, timeout, self.what)


def _raw(buf: np.ndarray) -> np.ndarray:
    """Bytes of a contiguous slice (bfloat16 has no MPI datatype; moving bytes needs none)."""
    return buf.view(np.uint8)


class MPITransport:
    """algorithms.transport over an mpi4py communicator."""

    def __init__(self, comm: Any) -> None:
        from mpi4py import MPI

        self.MPI, self.comm = MPI, comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()

    def isend(self, buf: np.ndarray, peer: int, tag: int) -> _MPIRequest:
        return _MPIRequest(self.comm.Isend([_raw(buf), self.MPI.BYTE], dest=peer, tag=tag),
                           f"rank {self.rank}: send to {peer}")

    def irecv(self, buf: np.ndarray, peer: int, tag: int) -> _MPIRequest:
        return _MPIRequest(self.comm.Irecv([_raw(buf), self.MPI.BYTE], source=peer, tag=tag),
                           f"rank {self.rank}: recv from {peer}")

    def prepare(self, sends: list[tuple[np.ndarray, int, int]],
                recvs: list[tuple[np.ndarray, int, int]]) -> _MPIPrepared:
        """Persistent requests for one step (buffers parsed once, not per call)."""
        byte = self.MPI.BYTE
        rq = [self.comm.Recv_init([_raw(b), byte], source=peer, tag=tag) for b, peer, tag in recvs]
        sq = [self.comm.Send_init([_raw(b), byte], dest=peer, tag=tag) for b, peer, tag in sends]
        return _MPIPrepared(self.MPI, rq, sq, self.rank)


class _MPIPrepared:
    __slots__ = ("MPI", "recvs", "all", "rank", "start", "_testall")

    def __init__(self, MPI: Any, recvs: list[Any], sends: list[Any], rank: int) -> None:
        self.MPI, self.recvs, self.all, self.rank = MPI, recvs, recvs + sends, rank
        self.start = functools.partial(MPI.Prequest.Startall, self.all)
        self._testall = functools.partial(MPI.Request.Testall, self.all)

    def wait_recv(self, i: int, timeout: float | None) -> None:
        _poll(self.recvs[i].Test, timeout, f"rank {self.rank}: recv {i} of a step")

    def wait_all(self, timeout: float | None) -> None:
        if not self._testall():
            _poll(self._testall, timeout, f"rank {self.rank}: a step's transfers")

    def free(self) -> None:
        for req in self.all:
            if req != self.MPI.REQUEST_NULL:
                req.Free()
        self.all = self.recvs = []


def _poll(test: Callable[[], bool], timeout: float | None, what: str) -> None:
    """Test until done, giving the core away after every miss, until `timeout` passed.

    Yielding at once matters when ranks outnumber cores: on a shared 2-core host, 4 ranks of
    an 8-byte recursive-doubling allreduce took 86-206 us when 64 tests spun before each
    yield and ~40 us yielding at once, close to a blocking MPI_Waitall (which has no
    timeout). With a core to itself a rank pays well under a microsecond per miss."""
    if test():
        return
    deadline = time.monotonic() + (300.0 if timeout is None else timeout)
    misses = 0
    while not test():
        os.sched_yield()
        misses += 1
        if misses % _MISSES_PER_CLOCK == 0 and time.monotonic() > deadline:
            from algorithms.transport import TransportTimeout

            raise TransportTimeout(f"{what}: not done after {timeout:g} s")


class _TorchRequest:
    __slots__ = ("work",)

    def __init__(self, work: Any) -> None:
        self.work = work

    def wait(self, timeout: float | None = None) -> None:
        if timeout is None:
            self.work.wait()
        else:
            self.work.wait(datetime.timedelta(seconds=timeout))


class TorchTransport:
    """algorithms.transport over torch.distributed isend/irecv (gloo: CPU tensors). Slices
    are numpy views of the tensors; they travel as uint8 tensors sharing that memory."""

    def __init__(self, dist: Any, torch: Any, group: Any = None) -> None:
        self.dist, self.torch, self.group = dist, torch, group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)

    def isend(self, buf: np.ndarray, peer: int, tag: int) -> _TorchRequest:
        return _TorchRequest(self.dist.isend(self.torch.from_numpy(_raw(buf)), peer,
                                             group=self.group, tag=tag))

    def irecv(self, buf: np.ndarray, peer: int, tag: int) -> _TorchRequest:
        return _TorchRequest(self.dist.irecv(self.torch.from_numpy(_raw(buf)), peer,
                                             group=self.group, tag=tag))


# -- the backend mixin -------------------------------------------------------------------------

class AlgorithmicBackend(Backend):
    """Mixed in before a transport backend: the five collectives run algorithms/ schedules."""

    algorithm_family: ClassVar[str]
    chunk_bytes: ClassVar[int | None]
    transport_name: ClassVar[str]

    def __init__(self, ctx: RankContext) -> None:
        super().__init__(ctx)
        self.op_timeout = float(ctx.options.get("timeout", 300))
        self._transport = self._make_transport()
        self._executors: dict[tuple[str, int, int], Any] = {}

    @property
    def transport(self) -> str:
        return self.transport_name

    def _make_transport(self) -> Any:
        if self.transport_name == "mpi":
            return MPITransport(self.comm)           # type: ignore[attr-defined]
        import torch
        import torch.distributed as dist

        return TorchTransport(dist, torch)

    # -- numpy views of native buffers --------------------------------------------------
    def _np(self, buf: Any) -> np.ndarray:
        if isinstance(buf, np.ndarray):
            return buf
        torch = self.torch                           # type: ignore[attr-defined]
        if buf.dtype == torch.bfloat16:
            import ml_dtypes

            return buf.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return buf.numpy()

    def unsupported(self, collective: str, dtype: np.dtype, op: str | None) -> str | None:
        from algorithms import REGISTRY, supported

        if (self.algorithm_family, collective) not in REGISTRY:
            return (f"unsupported by {self.algorithm_family}: no {collective} schedule "
                    f"(has: {', '.join(supported(self.algorithm_family))})")
        if dtype.name not in ("float32", "float64", "float16", "bfloat16", "int32", "int8"):
            return f"unsupported by {self.name}: dtype {dtype.name}"
        if getattr(self.ctx, "device", "cpu") != "cpu":
            return f"unsupported by {self.name}: host buffers only (device {self.ctx.device})"
        return None

    def finalize(self) -> None:
        for ex in self._executors.values():     # persistent requests go before the comm
            ex.close()
        self._executors.clear()
        super().finalize()

    def info(self) -> dict[str, Any]:
        meta = dict(super().info())  # type: ignore[safe-super]
        meta["algorithm"] = self.algorithm
        return meta

    def _segments(self, collective: str, nbytes: int, root: int) -> int:
        from algorithms import generate

        chunk = self.chunk_bytes
        if chunk is None:
            if collective not in _PIPELINED and self.algorithm_family not in _PIPELINED_ALGOS:
                return 1
            chunk = _DEFAULT_PIPELINE_CHUNK
        base = generate(self.algorithm_family, collective, self.ctx.world_size, root, 1)
        units = base.units.get("recv", 1)
        per_block = nbytes / max(1, units * base.blocks_per_unit)
        return max(1, min(_MAX_SEGMENTS, math.ceil(per_block / chunk)))

    def _executor(self, collective: str, nbytes: int, root: int = 0) -> Any:
        from algorithms import generate
        from algorithms.executor import Executor

        segments = self._segments(collective, nbytes, root)
        key = (collective, root, segments)
        ex = self._executors.get(key)
        if ex is None:
            schedule = generate(self.algorithm_family, collective, self.ctx.world_size, root,
                                segments)
            ex = Executor(schedule, self.ctx.rank, self._transport, timeout=self.op_timeout)
            self._executors[key] = ex
        return ex

    # -- the collectives ----------------------------------------------------------------
    def bind(self, collective: str, send: Any, recv: Any, op: str | None, root: int
             ) -> Callable[[], None]:
        """The executor's run with the numpy views resolved once (never the transport's own
        bound collective: that would time the library instead of the schedule)."""
        r = self._np(recv)
        if collective == "broadcast":
                return self._executor("broadcast", r.nbytes, root).bound_call(None, r, None)
        reducing = collective in ("allreduce", "reduce-scatter")
        return self._executor(collective, r.nbytes).bound_call(
            self._np(send), r, (op or "sum") if reducing else None)

    def broadcast(self, buf: Any, root: int) -> None:
        b = self._np(buf)
        self._executor("broadcast", b.nbytes, root).run(None, b, None)

    def allreduce(self, send: Any, recv: Any, op: str) -> None:
        r = self._np(recv)
        self._executor("allreduce", r.nbytes).run(self._np(send), r, op)

    def allgather(self, send: Any, recv: Any) -> None:
        r = self._np(recv)
        self._executor("allgather", r.nbytes).run(self._np(send), r, None)

    def reduce_scatter(self, send: Any, recv: Any, op: str) -> None:
        r = self._np(recv)
        self._executor("reduce-scatter", r.nbytes).run(self._np(send), r, op)

    def alltoall(self, send: Any, recv: Any) -> None:
        r = self._np(recv)
        self._executor("alltoall", r.nbytes).run(self._np(send), r, None)


_CLASSES: dict[str, type[Backend]] = {}


def algorithm_backend_class(name: str) -> type[Backend]:
    """The backend class for ``<algorithm>[:<chunk>]@<transport>`` (see the module docstring)."""
    cached = _CLASSES.get(name)
    if cached is not None:
        return cached
    algorithm, chunk, transport = parse_name(name)
    base = _transport_class(transport)
    label = algorithm if chunk is None else f"{algorithm}:{name.partition('@')[0].partition(':')[2]}"
    cls = type(f"{algorithm.capitalize()}On{base.__name__}", (AlgorithmicBackend, base), {
        "name": name,
        "algorithm": label,
        "algorithm_family": algorithm,
        "chunk_bytes": chunk,
        "transport_name": transport,
        "__doc__": f"algorithms/ {algorithm} schedules over {transport} point-to-point.",
        "__module__": __name__,
    })
    _CLASSES[name] = cls
    return cls
