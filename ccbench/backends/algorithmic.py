"""Backends that run algorithms/ schedules over another backend's point-to-point messages.

Names are ``<algorithm>[:<chunk>]@<transport>``:

* algorithm: ring, tree, dbtree, hypercube, rabenseifner, bruck, direct, pairwise
  (which collectives each has: ``algorithms.registry``; others are reported by
  ``unsupported()`` and skipped);
* chunk (optional): the pipelining unit in bytes (``ring:256K@mpi``). Messages larger than
  a chunk are split into ceil(size / chunk) segments, at most 64. Without it, broadcast
  and the trees pipeline in 512 KiB segments and everything else sends one message per
  block;
* transport: any registered backend whose ``p2p.transport`` gives one: ``mpi``
  (persistent requests; with ``--device cuda`` CuPy arrays, CUDA-aware or host-staged),
  ``gloo`` (torch isend/irecv on host memory), ``oneccl`` (grouped onecclSend/Recv) and
  ``nccl`` (torch.distributed send/recv on CUDA memory, one NCCL group per step) and
  ``nccl-cupy`` (ncclSend/ncclRecv through CuPy's binding, one group per step).

An `AlgorithmBackend` wraps an instance of the transport's backend (communicator, barrier,
synchronize and metadata are that backend's); buffers are numpy arrays on the host and CuPy
arrays on a device, and the reductions are ccbench's own kernels (numpy ufuncs, or the CuPy
ElementwiseKernels of algorithms.kernels queued on the transport's stream), so bfloat16 and
every op work on every transport. Records carry ``algorithm`` (e.g. ``ring`` or
``ring:256K``) and ``transport`` (``mpi``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from ccbench.backends import transports
from ccbench.backends.base import (
    AlltoallvCall,
    Backend,
    BackendFactory,
    BackendInfo,
    Exchange,
    MessageCall,
    RankContext,
    ReplayExtras,
    SubCommunicators,
    Support,
)
from ccbench.backends.buffers import BufferPolicy, CupyBuffers, HostBuffers
from ccbench.backends.options import BackendOptions
from ccbench.collectives import get as get_collective
from ccbench.errors import RunFailure, UsageError, choices_error

__all__ = ["TRANSPORTS", "AlgorithmBackend", "AlgorithmSpec", "algorithm_backend_class",
           "algorithm_names", "parse_name"]

#: backends whose point-to-point messages carry the algorithms (checked in parse_name): those
#: that say so (`Backend.carries_algorithms`)
TRANSPORTS: tuple[str, ...] = transports()
_MAX_SEGMENTS = 64
_DEFAULT_PIPELINE_CHUNK = 512 << 10            # broadcasts and trees
_PIPELINED_ALGOS = frozenset({"tree", "dbtree"})
#: data movement only moves bytes: every dtype; reductions need one of the kernels' types
_MOVED_ONLY = ("float8_e4m3fn", "float8_e5m2")


def _sum_then_divide(total: Callable[[], None], out: np.ndarray, world_size: int) -> None:
    """avg: the sum's schedule, then the division of this rank's result by p (integer types
    divide exactly when the sum is a multiple of p, as validation's inputs make it)."""
    total()
    if out.dtype.kind in "iu":
        np.floor_divide(out, world_size, out=out)
    else:
        np.divide(out, world_size, out=out)


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
        from ccbench.backends import skipped_plugin

        skipped = skipped_plugin(transport)      # an installed one that was skipped: say why
        if skipped is not None:
            raise skipped
        raise choices_error("transport", transport, TRANSPORTS)
    chunk = None
    if chunk_text:
        from ccbench.units import parse_size

        chunk = parse_size(chunk_text)
    return algorithm, chunk, transport


@dataclass(frozen=True, slots=True)
class AlgorithmSpec:
    """`<algorithm>[:<chunk>]@<transport>` as data, and the factory the registry hands out."""

    name: str
    family: str
    label: str                    # what records call the algorithm: ring, ring:256K
    chunk_bytes: int | None
    transport: str
    transport_factory: BackendFactory

    @property
    def needs_mpi_launcher(self) -> bool:
        return bool(self.transport_factory.needs_mpi_launcher)

    @property
    def display_name(self) -> str:
        """`ring over MPI`: ccbench's schedule over the transport library's messages."""
        return f"{self.label} over {self.transport_display_name}"

    @property
    def transport_display_name(self) -> str:
        """The transport's display name (its registry name where it has none)."""
        return self.transport_factory.display_name or self.transport

    @property
    def interface_variable(self) -> str | None:
        """None, as its backend says (diagnose --planes pins the libraries' own traffic)."""
        return AlgorithmBackend.interface_variable

    def quiet_probes(self) -> None:
        self.transport_factory.quiet_probes()

    def prepare_process(self, options: BackendOptions) -> None:
        self.transport_factory.prepare_process(options)

    def unavailable_reason(self) -> str | None:
        return self.transport_factory.unavailable_reason()

    def unavailable_before_launch(self) -> str | None:
        return self.transport_factory.unavailable_before_launch()

    def refuses(self, dtype: np.dtype, op: str | None) -> str | None:
        return AlgorithmBackend.refuses(dtype, op)

    def probe_version(self) -> str | None:
        return self.transport_factory.probe_version()

    def __call__(self, ctx: RankContext) -> AlgorithmBackend:
        return AlgorithmBackend(ctx, self, self.transport_factory(ctx))


@cache
def algorithm_backend_class(name: str, device: str = "cpu") -> AlgorithmSpec:
    """The factory for ``<algorithm>[:<chunk>]@<transport>`` (see the module docstring)."""
    from ccbench.backends import backend_class

    family, chunk, transport = parse_name(name)
    chunk_text = name.partition("@")[0].partition(":")[2]
    return AlgorithmSpec(name=name, family=family,
                         label=family if chunk is None else f"{family}:{chunk_text}",
                         chunk_bytes=chunk, transport=transport,
                         transport_factory=backend_class(transport, device))


class AlgorithmBackend(Backend):
    """ccbench's collectives run algorithms/ schedules over a wrapped backend's messages."""

    def __init__(self, ctx: RankContext, spec: AlgorithmSpec, inner: Backend) -> None:
        super().__init__(ctx)
        self.spec, self.inner = spec, inner
        self.name = spec.name
        self.algorithm = spec.label
        self.op_timeout = ctx.options.timeout
        on_device = ctx.device != "cpu"
        transport = inner.p2p.transport(on_device) if inner.p2p is not None else None
        if transport is None:
            inner.finalize()
            raise RunFailure(f"{spec.name}: backend {spec.transport!r} has no point-to-point "
                             f"messages on device {ctx.device}")
        self._transport = transport
        self.buffers, self._xp, self._reducer = self._arrays(on_device)
        self._executors: dict[tuple[str, int, int], Any] = {}

    def _arrays(self, on_device: bool) -> tuple[BufferPolicy, Any, Any]:
        """(buffer policy, array module, reducer): numpy on the host; on a device CuPy arrays
        and CuPy kernels, queued on the stream the transport orders itself with."""
        if not on_device:
            from algorithms.kernels import NumpyReducer

            return HostBuffers(), np, NumpyReducer()
        import cupy

        from algorithms.kernels import CupyReducer

        stream = self.inner.p2p.stream() if self.inner.p2p is not None else None
        if stream is not None:
            stream.use()
        return CupyBuffers(cupy), cupy, CupyReducer()

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None               # the spec answers for its transport

    @property
    def transport(self) -> str:
        return self.spec.transport

    # -- what it can do -----------------------------------------------------------------
    @classmethod
    def refuses(cls, dtype: np.dtype, op: str | None) -> str | None:
        from algorithms.kernels import DTYPE_NAMES, OPS

        if op is None or (op == "avg" and dtype.name in DTYPE_NAMES):
            return None             # avg: the sum's schedule, then one division (`bind`)
        if op not in OPS:
            return (f"unsupported by the algorithm backends: op {op} (their kernels: "
                    f"{', '.join(OPS)})")
        if dtype.name not in DTYPE_NAMES:
            return (f"unsupported by the algorithm backends: {op} on {dtype.name} (their "
                    f"kernels: {', '.join(DTYPE_NAMES)}; {', '.join(_MOVED_ONLY)} are moved, "
                    f"not reduced)")
        return None

    def supports(self, collective: str) -> Support:
        """The algorithm's schedules are the table: a collective it has no schedule for is
        not offered."""
        from algorithms import REGISTRY, supported

        family = self.spec.family
        if (family, collective) in REGISTRY:
            return Support(True)
        return Support(False, f"unsupported by {family}: no {collective} schedule "
                              f"(has: {', '.join(supported(family))})")

    def unsupported_case(self, collective: str, dtype: np.dtype, op: str | None
                         ) -> str | None:
        from algorithms.kernels import DTYPE_NAMES

        if dtype.name not in (*DTYPE_NAMES, *_MOVED_ONLY):
            return f"unsupported by {self.name}: dtype {dtype.name}"
        if op == "avg" and self._xp is not np:
            return f"unsupported by {self.name}: avg on device buffers (no division kernel)"
        return self.refuses(dtype, op)

    def info(self) -> BackendInfo:
        """The transport's library, and what is timed here: the schedule, not the library's
        collective (the transport's own timed_call and out-of-place notes describe its
        collectives, which this backend never calls)."""
        info = self.inner.info().copy()
        info.pop("timed_call", None)
        info.pop("allreduce_out_of_place", None)
        info.pop("reduce_out_of_place", None)
        reducer = type(self._reducer).__name__
        shown = self.spec.transport_display_name
        info["algorithm"], info["reductions"] = self.algorithm, reducer
        info["transport_display_name"] = shown
        info["timed_call"] = (f"ccbench's {self.algorithm} schedule (algorithms.executor, its "
                              f"buffers bound up front): every step's point-to-point messages "
                              f"over {shown}, local copies and {reducer} reductions, in one "
                              f"Python call per operation")
        return info

    @property
    def groups(self) -> SubCommunicators[AlgorithmBackend] | None:
        """The transport's sub-communicators, where it has them."""
        return _AlgorithmGroups(self) if self.inner.groups is not None else None

    # -- a trace's calls outside the registry: the transport's messages ------------------
    @property
    def replay_extras(self) -> ReplayExtras[AlgorithmBackend]:
        return _AlgorithmReplay(self)

    # -- control: the wrapped backend's ---------------------------------------------------
    def barrier(self) -> None:
        self.inner.barrier()

    def synchronize(self) -> None:
        self.inner.synchronize()

    def finalize(self) -> None:
        for ex in self._executors.values():     # persistent requests go before the comm
            ex.close()
        self._executors.clear()
        self.inner.finalize()

    # -- schedules ----------------------------------------------------------------------
    def _segments(self, collective: str, nbytes: int, root: int) -> int:
        from algorithms import generate

        chunk = self.spec.chunk_bytes
        base = generate(self.spec.family, collective, self.ctx.world_size, root, 1)
        if chunk is None:
            # what the schedule computes, not its collective's name: every broadcast's
            # chain or tree is pipelined by default
            if base.pattern != "broadcast" and self.spec.family not in _PIPELINED_ALGOS:
                return 1
            chunk = _DEFAULT_PIPELINE_CHUNK
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
            schedule = generate(self.spec.family, collective, self.ctx.world_size, root,
                                segments)
            ex = Executor(schedule, self.ctx.rank, self._transport, reducer=self._reducer,
                          xp=self._xp, timeout=self.op_timeout)
            self._executors[key] = ex
        return ex

    def _dtype_name(self, buf: Any) -> str:
        logical = getattr(buf, "logical", None)          # a DeviceBuffer's bfloat16
        return np.dtype(logical if logical is not None else buf.dtype).name

    # -- the collectives ----------------------------------------------------------------
    def bind(self, collective: str, send: Any, recv: Any, op: str | None, root: int
             ) -> Callable[[], None]:
        """The executor's run with the arrays resolved once (never the wrapped backend's own
        collective: that would time the library instead of the schedule). One builder for
        every collective: the schedule (`supports`) is what differs."""
        arr = self.buffers.array
        r, dtype = arr(recv), self._dtype_name(recv)
        spec = get_collective(collective)
        if spec.inplace == "one-buffer":
            return self._executor(collective, r.nbytes, root).bound_call(None, r, None, dtype)
        executor = self._executor(collective, r.nbytes, root if spec.rooted else 0)
        if op == "avg" and spec.reduces:   # as gloo and oneCCL's hosts: sum, then divide by p
            total = executor.bound_call(arr(send), r, "sum", dtype)
            return functools.partial(_sum_then_divide, total, r, self.ctx.world_size)
        return executor.bound_call(arr(send), r, (op or "sum") if spec.reduces else None, dtype)



class _AlgorithmReplay(ReplayExtras[AlgorithmBackend]):
    def blocking_messages(self, timeout: float) -> tuple[MessageCall, MessageCall] | str:
        """The schedules' transport, each message waited for."""
        transport = self.backend._transport
        return ((lambda buf, peer: transport.isend(buf, peer, 0).wait(timeout)),
                (lambda buf, peer: transport.irecv(buf, peer, 0).wait(timeout)))

    def exchanges(self, timeout: float) -> Exchange | str:
        """The schedules' transport, posted as the wrapped library posts an exchange."""
        return functools.partial(self.backend.inner.replay_extras.post_exchange,
                                 self.backend._transport, timeout=timeout)

    def uneven_alltoall(self) -> AlltoallvCall | str:
        return f"{self.backend.name}: ccbench's algorithm schedules have no uneven all-to-all"


class _AlgorithmGroups(SubCommunicators[AlgorithmBackend]):
    def split(self, groups: Sequence[Sequence[int]], timeout: float
              ) -> list[Backend | str | None]:
        """The transport's sub-communicators, the schedules run over each one's messages."""
        backend = self.backend
        inner_groups = backend.inner.groups
        assert inner_groups is not None               # offered only where the transport has them
        out: list[Backend | str | None] = []
        for ranks, inner in zip(groups, inner_groups.split(groups, timeout), strict=True):
            if inner is None or isinstance(inner, str):
                out.append(inner)
                continue
            transport = (inner.p2p.transport(backend._xp is not np) if inner.p2p is not None
                         else None)
            if transport is None:
                inner.finalize()
                out.append(f"{backend.name}: {backend.spec.transport} has no point-to-point "
                           f"messages on a sub-communicator")
                continue
            sub = self.on_group(ranks)
            sub.inner, sub._transport, sub._executors = inner, transport, {}
            out.append(sub)
        return out
