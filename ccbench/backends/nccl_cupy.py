"""nccl-cupy: NCCL called directly through CuPy's binding (cupy.cuda.nccl), as nccl-tests calls it.

Next to the `nccl` backend (torch.distributed's process group), this one makes the NCCL calls
itself, so what is timed is the library call and nothing around it:

* one communicator per run: rank 0 draws the unique id (ncclGetUniqueId) and hands it to the
  others through ccbench's control store; every rank then joins with ncclCommInitRank;
* every call is issued on one dedicated non-blocking stream of the rank's device
  (`local_rank`; one rank per device, as NCCL requires); `synchronize` waits for that stream;
* allreduce is out of place when the harness asks for it: ncclAllReduce(send, recv), no copy
  (torch.distributed's all_reduce is in-place only); broadcast, reduce, allgather and reduce-scatter
  are NCCL's own calls with their in-place layouts; all-to-all is what nccl-tests runs, one
  ncclSend and one ncclRecv per peer inside ncclGroupStart/ncclGroupEnd (its in-place case
  copies the input aside first on the stream, timed alone as `local_copy_us`);
* the barrier is a one-element ncclAllReduce on the stream followed by a stream synchronize;
* `--cuda-graph`: the measured call is captured once in a CUDA graph (after one uncaptured
  call: NCCL connects peers on first use) and the graph is launched instead; validation runs
  the same graph, so the results checked are the graph's.

Records say library "nccl" (or "rccl" on a ROCm build of CuPy) and transport "cupy"; the torch
path says transport "torch". As a transport for ccbench's own algorithms (`ring@nccl-cupy`)
each step's sends and receives are one NCCL group on the same stream, and CuPy kernels queued
there do the reductions (NcclCupyTransport, below).
"""

from __future__ import annotations

import functools
import itertools
import os
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ccbench.backend_facts import BACKENDS
from ccbench.backends.base import Backend, BackendInfo, Batch, PointToPoint, RankContext, starmap_batch
from ccbench.backends.buffers import CupyBuffers, DeviceBuffer, spans_overlap
from ccbench.backends.cupy_device import CUPY, cupy_missing_reason
from ccbench.backends.nccl import _BF16_SINCE, format_nccl_version, nccl_version_tuple
from ccbench.backends.p2p import Done, GroupPrepared
from ccbench.collectives.sendrecv import peers as sendrecv_peers
from ccbench.errors import UsageError

if TYPE_CHECKING:
    from algorithms.transport import Transport

__all__ = ["NCCL_OP_NAMES", "NCCL_TYPE_NAMES", "NCCLCupyBackend", "nccl_cupy_version",
           "unique_id_from_store", "unique_id_to_store"]

#: ccbench's op -> the constant of cupy.cuda.nccl (ncclRedOp_t)
NCCL_OP_NAMES = {"sum": "NCCL_SUM", "prod": "NCCL_PROD", "max": "NCCL_MAX", "min": "NCCL_MIN",
                 "avg": "NCCL_AVG"}
#: ccbench's dtype -> the constant of cupy.cuda.nccl (ncclDataType_t)
NCCL_TYPE_NAMES = {"int8": "NCCL_INT8", "int32": "NCCL_INT32", "float16": "NCCL_FLOAT16",
                   "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
                   "bfloat16": "NCCL_BFLOAT16", "int64": "NCCL_INT64", "uint8": "NCCL_UINT8"}
#: the values of nccl.h for names older CuPy releases do not export (ncclBfloat16, ncclAvg)
_NCCL_CODES = {"NCCL_BFLOAT16": 9, "NCCL_AVG": 4, "NCCL_INT64": 4, "NCCL_UINT8": 1}
#: CUDA graphs kept per backend (one per bound (collective, buffers, op, root))
_MAX_GRAPHS = 8
#: communicators this process has created (every rank creates them in the same order)
_COMMS = itertools.count()

_DIRECT_CALL = ("the binding's own NcclCommunicator method with its arguments bound up front "
                "(functools.partial): one call into NCCL per operation")
_GROUP_CALL = "ncclGroupStart, one ncclSend and ncclRecv per peer, ncclGroupEnd (as nccl-tests)"
_GRAPH_CALL = "CUDA graph launch of the captured NCCL call (cupy Graph.launch on the stream)"


def _nccl_module() -> Any:
    from cupy.cuda import nccl

    return nccl


def nccl_cupy_version() -> tuple[str | None, str | None]:
    """(the NCCL version CuPy loaded, None) or (None, why not); never raises."""
    try:
        nccl = _nccl_module()
    except ImportError as exc:
        return None, f"cupy.cuda.nccl cannot be imported: {exc}"
    if not getattr(nccl, "available", True):
        return None, "cupy.cuda.nccl.available is False (CuPy found no NCCL library)"
    try:
        return format_nccl_version(int(nccl.get_version())), None
    except (AttributeError, RuntimeError) as exc:
        return None, f"ncclGetVersion failed: {exc}"


def unique_id_to_store(raw: bytes | tuple[int, ...]) -> str | list[int]:
    """A unique id as the control store keeps it (JSON): bytes (CuPy >= 14) as hex text,
    CuPy 13's tuple of signed chars as a list of ints."""
    if isinstance(raw, (bytes, bytearray)):
        return bytes(raw).hex()
    return [int(b) for b in raw]


def unique_id_from_store(value: str | list[int]) -> bytes | tuple[int, ...]:
    """The inverse of unique_id_to_store: the same type the binding's get_unique_id gave."""
    if isinstance(value, str):
        return bytes.fromhex(value)
    return tuple(int(b) for b in value)


class NCCLCupyBackend(Backend):
    """NCCL through cupy.cuda.nccl.NcclCommunicator on CuPy device buffers."""

    name = "nccl-cupy"
    display_name = BACKENDS[name].display_name
    libraries = (CUPY,)
    default_device = "cuda"
    reads_options = frozenset({"nccl_algo", "nccl_proto", "cuda_graph"})
    library_environment = {"nccl_algo": "NCCL_ALGO", "nccl_proto": "NCCL_PROTO"}
    carries_algorithms = True
    env_prefixes: ClassVar[tuple[str, ...]] = ("NCCL_", "CUDA_VISIBLE_DEVICES",
                                               "CUDA_DEVICE_MAX_CONNECTIONS", "CUPY_")

    # -- availability -----------------------------------------------------------------------
    @classmethod
    def unavailable_reason(cls) -> str | None:
        missing = cupy_missing_reason()
        if missing:
            return missing
        return nccl_cupy_version()[1]

    @classmethod
    def probe_version(cls) -> str | None:
        return nccl_cupy_version()[0]

    # -- setup ------------------------------------------------------------------------------
    def __init__(self, ctx: RankContext) -> None:
        super().__init__(ctx)
        if ctx.device != "cuda":
            raise UsageError(f"backend {self.name!r} runs on device buffers only: use --device "
                             f"cuda (or auto), not --device {ctx.device}")
        import cupy

        self.cupy, self.nccl = cupy, _nccl_module()
        count = int(cupy.cuda.runtime.getDeviceCount())
        # every rank of the node sees the same count: all refuse before the rendezvous
        if ctx.local_world_size > count or ctx.local_rank >= count:
            raise UsageError(f"{ctx.local_world_size} ranks on {ctx.hostname} but only {count} "
                             f"device(s) visible: {self.name} needs one device per rank (NCCL "
                             f"refuses two ranks of a communicator on one device)")
        self.device_index = ctx.local_rank
        cupy.cuda.Device(self.device_index).use()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._stream_ptr = int(self.stream.ptr)
        self.buffers = CupyBuffers(cupy)
        # CuPy built for ROCm binds RCCL under the same module name
        self.library_name = "rccl" if getattr(cupy.cuda.runtime, "is_hip", False) else "nccl"
        self._version = nccl_cupy_version()[0] or "unknown"
        self.comm = self.nccl.NcclCommunicator(ctx.world_size, self._unique_id(), ctx.rank)
        self._ops = {op: int(getattr(self.nccl, const, _NCCL_CODES.get(const, -1)))
                     for op, const in NCCL_OP_NAMES.items()}
        self._types = {name: int(getattr(self.nccl, const, _NCCL_CODES.get(const, -1)))
                       for name, const in NCCL_TYPE_NAMES.items()}
        self._flag = cupy.empty(1, dtype=np.int32)          # the barrier's allreduce
        self._graphs: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._scratch: dict[tuple[int, int], DeviceBuffer] = {}

    def _unique_id(self) -> bytes | tuple[int, ...]:
        """ncclGetUniqueId on rank 0, read by the others from the control store, in the form
        the binding gave it and its NcclCommunicator takes: bytes since CuPy 14, a tuple of
        128 signed chars before."""
        key = f"lib/nccl-cupy/unique-id/{next(_COMMS)}"
        if self.ctx.rank == 0:
            self.ctx.store.set(key, unique_id_to_store(self.nccl.get_unique_id()))
        return unique_id_from_store(self.ctx.store.get(key, timeout=self.ctx.options.timeout))

    # -- capabilities -----------------------------------------------------------------------
    @classmethod
    def refuses(cls, dtype: np.dtype, op: str | None) -> str | None:
        if dtype.name not in NCCL_TYPE_NAMES:
            return (f"unsupported by {cls.name}: dtype {dtype.name} (CuPy has no such array "
                    f"type; its NCCL binding takes {', '.join(NCCL_TYPE_NAMES)})")
        return None

    def unsupported_case(self, collective: str, dtype: np.dtype, op: str | None
                         ) -> str | None:
        refused = self.refuses(dtype, op)
        if refused:
            return refused
        if op == "avg" and nccl_version_tuple(self._version) < _BF16_SINCE:
            return f"unsupported by {self.name}: avg needs NCCL >= 2.10, this is {self._version}"
        if dtype.name == "bfloat16" and nccl_version_tuple(self._version) < _BF16_SINCE:
            return (f"unsupported by {self.name}: bfloat16 needs NCCL >= 2.10, "
                    f"this is {self._version}")
        return None

    @property
    def transport(self) -> str:
        """How ccbench reaches the library (records: library nccl, transport cupy)."""
        return "cupy"

    # -- the calls --------------------------------------------------------------------------
    def _type(self, buf: DeviceBuffer) -> int:
        return self._types[buf.logical.name]

    def _call(self, collective: str, send: DeviceBuffer, recv: DeviceBuffer, op: str | None,
              root: int) -> Callable[[], Any]:
        """The NCCL call for one operation on these buffers, every argument resolved (the
        builder's, uncaptured)."""
        return Backend.bind(self, collective, send, recv, op, root)

    def _allreduce(self, send: DeviceBuffer, recv: DeviceBuffer, op: str, root: int
                   ) -> Callable[[], Any]:
        return functools.partial(self.comm.allReduce, send.ptr, recv.ptr, recv.size,
                                 self._type(recv), self._ops[op], self._stream_ptr)

    def _broadcast(self, send: DeviceBuffer, recv: DeviceBuffer, op: str, root: int
                   ) -> Callable[[], Any]:
        return functools.partial(self.comm.broadcast, recv.ptr, recv.ptr, recv.size,
                                 self._type(recv), root, self._stream_ptr)

    def _allgather(self, send: DeviceBuffer, recv: DeviceBuffer, op: str, root: int
                   ) -> Callable[[], Any]:
        return functools.partial(self.comm.allGather, send.ptr, recv.ptr, send.size,
                                 self._type(recv), self._stream_ptr)

    def _reduce_scatter(self, send: DeviceBuffer, recv: DeviceBuffer, op: str, root: int
                        ) -> Callable[[], Any]:
        return functools.partial(self.comm.reduceScatter, send.ptr, recv.ptr, recv.size,
                                 self._type(recv), self._ops[op], self._stream_ptr)

    def _reduce(self, send: DeviceBuffer, recv: DeviceBuffer, op: str, root: int
                ) -> Callable[[], Any]:
        return functools.partial(self.comm.reduce, send.ptr, recv.ptr, recv.size,
                                 self._type(recv), self._ops[op], root, self._stream_ptr)

    def _alltoall(self, send: DeviceBuffer, recv: DeviceBuffer, op: str, root: int
                  ) -> Callable[[], None]:
        nccl, comm, stream, kind = self.nccl, self.comm, self._stream_ptr, self._type(recv)
        world = self.ctx.world_size
        block = recv.size // world
        step = block * recv.array.itemsize
        copy = self.local_copy("alltoall", send, recv)
        source = self._scratch_for(send) if copy is not None else send
        sends = [(source.ptr + peer * step, peer) for peer in range(world)]
        recvs = [(recv.ptr + peer * step, peer) for peer in range(world)]

        def alltoall() -> None:
            if copy is not None:          # NCCL must not read blocks it is overwriting
                copy()
            nccl.groupStart()
            try:
                for (sptr, peer), (rptr, _) in zip(sends, recvs, strict=True):
                    comm.send(sptr, block, kind, peer, stream)
                    comm.recv(rptr, block, kind, peer, stream)
            finally:
                nccl.groupEnd()
        return alltoall

    def _sendrecv(self, send: DeviceBuffer, recv: DeviceBuffer, op: str, root: int
                  ) -> Callable[[], None]:
        """ncclSend to rank+1 and ncclRecv from rank-1 in one group, as nccl-tests."""
        nccl, comm, stream, kind = self.nccl, self.comm, self._stream_ptr, self._type(recv)
        dst, src = sendrecv_peers(self.ctx.rank, self.ctx.world_size)

        def sendrecv() -> None:
            nccl.groupStart()
            try:
                comm.send(send.ptr, send.size, kind, dst, stream)
                comm.recv(recv.ptr, recv.size, kind, src, stream)
            finally:
                nccl.groupEnd()
        return sendrecv

    builders = {"broadcast": _broadcast, "allreduce": _allreduce, "allgather": _allgather,
                "reduce-scatter": _reduce_scatter, "alltoall": _alltoall, "reduce": _reduce,
                "sendrecv": _sendrecv}
    lacks = {name: f"CuPy's NCCL binding has no {name} call (nccl-tests composes it from "
                   f"ncclSend/ncclRecv; ccbench does not, here)" for name in ("gather", "scatter")}

    def _scratch_for(self, buf: DeviceBuffer) -> DeviceBuffer:
        key = (buf.size, buf.array.itemsize)
        scratch = self._scratch.get(key)
        if scratch is None:
            self._scratch.clear()             # one size at a time: the harness goes size by size
            scratch = self._scratch[key] = self.buffers.alloc(buf.size, buf.logical)
            self._graphs.clear()              # captured copies may point at the old scratch
        return scratch

    def local_copy(self, collective: str, send: Any, recv: Any) -> Callable[[], Any] | None:
        """In-place all-to-all copies its input aside on the stream before the group."""
        if collective != "alltoall" or not spans_overlap(send, recv):
            return None
        scratch = self._scratch_for(send)
        return functools.partial(self.cupy.cuda.runtime.memcpyAsync, scratch.ptr, send.ptr,
                                 send.nbytes, self.cupy.cuda.runtime.memcpyDeviceToDevice,
                                 self._stream_ptr)

    def _graph_key(self, collective: str, send: DeviceBuffer, recv: DeviceBuffer,
                   op: str | None, root: int) -> tuple[Any, ...]:
        return (collective, send.ptr, send.size, recv.ptr, recv.size, recv.logical.name, op, root)

    def _graph_launch(self, collective: str, send: DeviceBuffer, recv: DeviceBuffer,
                      op: str | None, root: int) -> Callable[[], Any]:
        """The captured graph of the call (captured on first use), as a bound launch."""
        key = self._graph_key(collective, send, recv, op, root)
        graph = self._graphs.get(key)
        if graph is None:
            call = self._call(collective, send, recv, op, root)
            call()                        # uncaptured first: NCCL connects peers on first use
            stream = self.stream
            stream.synchronize()
            stream.begin_capture()
            try:
                call()
            finally:
                graph = stream.end_capture()
            self._graphs[key] = graph
            while len(self._graphs) > _MAX_GRAPHS:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(key)
        return functools.partial(graph.launch, self.stream)

    def bind(self, collective: str, send: Any, recv: Any, op: str | None, root: int
             ) -> Callable[[], Any]:
        if self.ctx.options.cuda_graph:
            return self._graph_launch(collective, send, recv, op, root)
        return self._call(collective, send, recv, op, root)

    def bind_batch(self, collective: str, send: Any, recv: Any, op: str | None, root: int
                   ) -> Batch:
        batch = starmap_batch(self.bind(collective, send, recv, op, root))
        return Batch(batch.run, f"{self._timed_call(collective)}; N of them driven by "
                                f"itertools.starmap, no Python bytecode between calls")

    def _timed_call(self, collective: str) -> str:
        if self.ctx.options.cuda_graph:
            return _GRAPH_CALL
        return _GROUP_CALL if collective in ("alltoall", "sendrecv") else _DIRECT_CALL

    # -- point to point: the algorithms over NCCL -------------------------------------------
    @property
    def p2p(self) -> PointToPoint[NCCLCupyBackend]:
        return _NcclCupyMessages(self)

    # -- control ----------------------------------------------------------------------------
    def barrier(self) -> None:
        """A one-element allreduce on the stream, waited for: no rank leaves before every rank
        has issued it, and the stream holds nothing older afterwards."""
        flag = self._flag
        self.comm.allReduce(flag.data.ptr, flag.data.ptr, 1, self._types["int32"],
                            self._ops["sum"], self._stream_ptr)
        self.stream.synchronize()

    def synchronize(self) -> None:
        self.stream.synchronize()

    def finalize(self) -> None:
        comm = getattr(self, "comm", None)
        if comm is None:
            return
        self.stream.synchronize()
        self._graphs.clear()
        self._scratch.clear()
        comm.destroy()
        self.comm = None

    # -- metadata ---------------------------------------------------------------------------
    def info(self) -> BackendInfo:
        cupy, options = self.cupy, self.ctx.options
        runtime = cupy.cuda.runtime
        try:
            props = runtime.getDeviceProperties(self.device_index)
            gpu = props["name"]
            gpu = gpu.decode() if isinstance(gpu, bytes) else str(gpu)
            memory = int(props.get("totalGlobalMem", 0))
        except (AttributeError, KeyError, RuntimeError):
            gpu, memory = "unknown", 0
        return {
            "library": self.library_name,
            "library_version": self._version,
            "device": f"cuda:{self.device_index}",
            "env": {k: v for k, v in os.environ.items() if k.startswith(self.env_prefixes)},
            "gpu": gpu,
            "gpu_count": int(runtime.getDeviceCount()),
            "gpu_memory_bytes": memory,
            "cupy": getattr(cupy, "__version__", "unknown"),
            "cuda_runtime": int(runtime.runtimeGetVersion()),
            "nccl_algo": options.nccl_algo or os.environ.get("NCCL_ALGO"),
            "nccl_proto": options.nccl_proto or os.environ.get("NCCL_PROTO"),
            "stream": "one non-blocking cupy.cuda.Stream per rank; synchronize waits for it",
            "allreduce_out_of_place": "ncclAllReduce(send, recv): out of place, no copy "
                                      "(as nccl-tests)",
            "cuda_graph": True if options.cuda_graph else None,
            "timed_call": _GRAPH_CALL if options.cuda_graph
            else f"{_DIRECT_CALL}; all-to-all: {_GROUP_CALL}",
        }


# -- point to point: algorithms.transport over ncclSend/ncclRecv -------------------------------

class _NcclCupyMessages(PointToPoint[NCCLCupyBackend]):
    """The algorithms' transport on device memory (no blocking host messages)."""

    def transport(self, device: bool) -> Transport | None:
        b = self.backend
        if not device:
            return None
        return NcclCupyTransport(b.nccl, b.comm, b.ctx.rank, b.ctx.world_size, b._stream_ptr)

    def stream(self) -> Any:
        return self.backend.stream


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

    def isend(self, buf: Any, peer: int, tag: int) -> Done:
        self._group(self._resolved([(buf, peer, tag)]), [])
        return Done()

    def irecv(self, buf: Any, peer: int, tag: int) -> Done:
        self._group([], self._resolved([(buf, peer, tag)]))
        return Done()

    def prepare(self, sends: list[tuple[Any, int, int]],
                recvs: list[tuple[Any, int, int]]) -> GroupPrepared:
        """The step's group with the pointers resolved once (waits are the stream's)."""
        return GroupPrepared(functools.partial(self._group, self._resolved(sends),
                                                self._resolved(recvs)))
