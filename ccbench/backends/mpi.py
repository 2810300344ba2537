"""mpi: MPI collectives through mpi4py (MPICH, Open MPI or Intel MPI: whichever libmpi mpi4py
loads; MPI.Get_library_version() goes into every record).

The collectives are written once against the buffer policy: numpy here, CuPy arrays in
ccbench.backends.cuda_mpi (handed over as device memory, or staged through host mirrors).
`wire` is what MPI is given, `stage_in` / `stage_out` the copies a staging policy makes."""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ccbench.backend_facts import BACKENDS
from ccbench.backends.base import (
    AlltoallvCall,
    Backend,
    BackendInfo,
    Batch,
    Library,
    PointToPoint,
    RankContext,
    ReplayExtras,
    SubCommunicators,
    found_or_why,
    library_line,
)
from ccbench.backends.buffers import spans_overlap
from ccbench.backends.mpi_loop import (
    batch_call,
    loaded_libmpi,
    predefined_datatype,
)
from ccbench.backends.options import BackendOptions
from ccbench.backends.p2p import poll, raw_bytes
from ccbench.collectives.sendrecv import peers as sendrecv_peers
from ccbench.dtypes import wire_dtype
from ccbench.errors import RunFailure

if TYPE_CHECKING:
    from algorithms.transport import Transport

THREAD_LEVELS = ("single", "funneled", "serialized", "multiple")
#: IMB-MPI1 and the OSU benchmarks call MPI_Init (a single-threaded level); ccbench's own helper
#: threads (watchdog, control store) never call MPI, so funneled is the true level it needs.
DEFAULT_THREAD_LEVEL = "funneled"


def set_thread_level(level: str) -> None:
    """Ask mpi4py to initialise MPI at `level` (mpi4py's own default is multiple, which costs
    every call a lock in MPICH and Intel MPI). Must run before the first `from mpi4py import
    MPI` of this process; an explicit MPI4PY_RC_THREAD_LEVEL in the environment wins."""
    try:
        import mpi4py
    except ImportError:
        return
    if "MPI4PY_RC_THREAD_LEVEL" not in os.environ:
        mpi4py.rc.thread_level = level


def _provided_level(mpi: Any) -> str:
    levels = {mpi.THREAD_SINGLE: "single", mpi.THREAD_FUNNELED: "funneled",
              mpi.THREAD_SERIALIZED: "serialized", mpi.THREAD_MULTIPLE: "multiple"}
    return levels.get(mpi.Query_thread(), str(mpi.Query_thread()))


def _library_name(version: str) -> str:
    for marker, name in (("Intel", "Intel MPI"), ("Open MPI", "Open MPI"),
                         ("MPICH", "MPICH"), ("MVAPICH", "MVAPICH")):
        if marker in version:
            return name
    return version.split()[0] if version else "MPI"


#: dtypes the loaded MPI library has no usable datatype for (Open MPI 4.1 has no float16:
#: MPI_ERR_TYPE on an H200 machine's Debian Open MPI), found by MPIBackend's probe; one libmpi
#: per process, so one set per process
_NO_DATATYPE: set[str] = set()


def _apart_on_host(send: Any, recv: Any) -> bool:
    """Two numpy buffers that share no memory (MPI's own call takes them as they are)."""
    host = isinstance(send, np.ndarray) and isinstance(recv, np.ndarray)
    return host and not np.may_share_memory(send, recv)


def _raw(buf: Any) -> Any:
    """bfloat16 and float8 have no MPI datatype, nor float16 in some libraries; moving them
    needs none: send their bit patterns (device buffers already store them so)."""
    if buf.dtype.name in _NO_DATATYPE:
        return buf.view(np.dtype(f"u{buf.dtype.itemsize}"))
    wire = wire_dtype(buf.dtype)
    return buf if wire == buf.dtype else buf.view(wire)


def _mpi_facts() -> dict[str, Any]:
    """libmpi as mpi4py loads it, asked only what it answers before MPI_Init."""
    if importlib.util.find_spec("mpi4py") is None:
        return {"found": False, "reason": "mpi4py is not installed (pip install 'ccbench[mpi]')"}
    import mpi4py

    out: dict[str, Any] = {"found": True, "mpi4py": mpi4py.__version__}
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:
        out.update(found=False, reason=f"mpi4py cannot load an MPI library: {exc}")
        return out
    version = MPI.Get_library_version().replace("\x00", "").strip()
    major, minor = MPI.Get_version()
    out.update(library=version.splitlines()[0] if version else "", standard=f"{major}.{minor}",
               initialized=bool(MPI.Is_initialized()))
    from ccbench.backends.cuda_mpi import cuda_query_symbol

    path, has_query = cuda_query_symbol()
    out.update(libmpi=path, cuda_query_symbol=has_query,
               cuda_aware="asked at run time (needs MPI_Init)" if has_query else
               "cannot be asked (no MPIX_Query_cuda_support); device buffers are host-staged")
    return out


def _mpi_lines(mpi: dict[str, Any]) -> list[str]:
    if not mpi.get("found"):
        return [library_line("mpi", found_or_why(mpi, ""))]
    return [library_line("mpi", f"{mpi['library']} (MPI {mpi['standard']}, mpi4py "
                                f"{mpi['mpi4py']})"),
            library_line("", f"CUDA-aware: {mpi['cuda_aware']}")]


#: the MPI library mpi4py loads
MPI_LIBRARY = Library("mpi", _mpi_facts, _mpi_lines)


class MPIBackend(Backend):
    name = "mpi"
    display_name = BACKENDS[name].display_name
    libraries: ClassVar[tuple[Library, ...]] = (MPI_LIBRARY,)
    needs_mpi_launcher = True
    carries_algorithms = True

    @classmethod
    def quiet_probes(cls) -> None:
        """Whatever imports mpi4py.MPI after this loads libmpi without calling MPI_Init."""
        try:
            import mpi4py
        except ImportError:
            return                    # unavailable_reason says why, in one line
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False

    @classmethod
    def prepare_process(cls, options: BackendOptions) -> None:
        """--mpi-thread-level, before anything in this process imports mpi4py.MPI."""
        if options.mpi_thread_level:
            set_thread_level(options.mpi_thread_level)

    @classmethod
    def probe_version(cls) -> str | None:
        """The first line of MPI_Get_library_version (callable before MPI_Init)."""
        if cls.unavailable_reason() is not None:
            return None
        from mpi4py import MPI

        version = MPI.Get_library_version().strip()
        return version.splitlines()[0] if version else None

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if importlib.util.find_spec("mpi4py") is None:
            return "mpi4py is not installed (pip install 'ccbench[mpi]')"
        try:
            from mpi4py import MPI  # noqa: F401  (loads libmpi)
        except (ImportError, RuntimeError) as exc:
            return f"mpi4py cannot load an MPI library: {exc}"
        return None

    def __init__(self, ctx: RankContext) -> None:
        super().__init__(ctx)
        from mpi4py import MPI

        self.MPI = MPI
        self.comm: Any = MPI.COMM_WORLD.Dup()   # or a Split of it (a sub-communicator)
        if self.comm.Get_size() != ctx.world_size:
            raise RunFailure(f"MPI world has {self.comm.Get_size()} ranks but the launcher "
                             f"said {ctx.world_size}: start the mpi backend with mpiexec")
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self._ops = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}
        self._probed: dict[tuple[str, str], str | None] = {}
        self.version = MPI.Get_library_version().replace("\x00", "").strip()  # Open MPI 4.1: NUL-ended
        self._libmpi = loaded_libmpi()

    @classmethod
    def refuses(cls, dtype: np.dtype, op: str | None) -> str | None:
        if op == "avg":        # not emulated: a sum and a division would be ccbench's avg
            return "unsupported by mpi: avg (MPI has no MPI_AVG reduction)"
        if op is not None and wire_dtype(dtype) != dtype:
            return f"unsupported by mpi: MPI has no {dtype.name} datatype to reduce"
        return None

    def unsupported_case(self, collective: str, dtype: np.dtype, op: str | None
                         ) -> str | None:
        if op is None:
            self._probe_datatype(dtype)
            return None
        refused = self.refuses(dtype, op)
        if refused:
            return refused
        key = (dtype.name, op)
        if key not in self._probed:       # every rank probes the same keys in the same order
            one = np.ones(1, dtype=dtype)
            out = np.empty_like(one)
            try:
                self.comm.Allreduce(one, out, op=self._ops[op])
                self._probed[key] = None
            except self.MPI.Exception as exc:
                reason = exc.Get_error_string().splitlines()[0]
                self._probed[key] = f"unsupported by mpi: {op} on {dtype.name} ({reason})"
        return self._probed[key]

    def _probe_datatype(self, dtype: np.dtype) -> None:
        """Whether the library moves `dtype` with its own datatype; if not, it is moved as its
        bits (collectively: every rank probes the same dtypes in the same order)."""
        key = (dtype.name, "")
        if key in self._probed or wire_dtype(dtype) != dtype:
            return
        one = np.ones(1, dtype=dtype)
        try:
            self.comm.Bcast(one, root=0)
            self._probed[key] = None
        except (self.MPI.Exception, KeyError, ValueError) as exc:
            self._probed[key] = f"no {dtype.name} datatype ({exc})"
            _NO_DATATYPE.add(dtype.name)

    def info(self) -> BackendInfo:
        first_line = self.version.splitlines()[0] if self.version else ""
        prefixes = ("MPIR_", "MPICH_", "OMPI_MCA_", "I_MPI_", "FI_", "UCX_", "PMI_", "HYDRA_")
        return {"library": _library_name(self.version), "library_version": first_line,
                "device": "cpu", "mpi_thread_level": _provided_level(self.MPI),
                "timed_call": "mpi4py Comm.<Collective>([buffer, datatype], ...) bound up "
                              "front: one Python call into mpi4py per operation",
                "env": {k: v for k, v in os.environ.items()
                        if k.startswith(prefixes) and "RANK" not in k}}

    @property
    def p2p(self) -> PointToPoint[MPIBackend]:
        return MPIMessages(self)

    def _typed(self, buf: np.ndarray) -> list[Any]:
        """[buffer, datatype] with MPI's predefined datatype: mpi4py skips inferring it."""
        if not isinstance(buf, np.ndarray):        # device arrays: mpi4py reads their interface
            return buf
        raw = _raw(buf)
        datatype = predefined_datatype(self.MPI, raw.dtype)
        # [buffer, datatype]: mpi4py derives the count itself, per peer where the call wants it
        return raw if datatype is None else [raw, datatype]

    # -- the collectives: mpi4py's own call with explicit counts and datatypes, bound up front
    # where MPI is handed the buffers themselves; else (staging copies, in-place layouts
    # MPI cannot express) the general method below, whose copies belong to every call
    def _allreduce(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        if not self.buffers.direct:
            return functools.partial(self._allreduce_now, send, recv, op)
        sendbuf = self.MPI.IN_PLACE if send is recv else self._typed(send)
        return functools.partial(self.comm.Allreduce, sendbuf, self._typed(recv), self._ops[op])

    def _broadcast(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        if not self.buffers.direct:
            return functools.partial(self._broadcast_now, recv, root)
        return functools.partial(self.comm.Bcast, self._typed(recv), root)

    def _alltoall(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        if not self.buffers.direct or send is recv:
            return functools.partial(self._alltoall_now, send, recv)
        return functools.partial(self.comm.Alltoall, self._typed(send), self._typed(recv))

    def _sendrecv(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        if not self.buffers.direct:
            return functools.partial(self._sendrecv_now, send, recv)
        dst, src = sendrecv_peers(self.comm.Get_rank(), self.comm.Get_size())
        return functools.partial(self.comm.Sendrecv, self._typed(send), dst, 0,
                                 self._typed(recv), src, 0)

    def _reduce(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        if not self.buffers.direct:
            return functools.partial(self._reduce_now, send, recv, op, root)
        sendbuf, recvbuf = self._reduce_buffers(send, recv, root)
        return functools.partial(self.comm.Reduce, sendbuf, recvbuf, self._ops[op], root)

    def _allgather(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        if not (self.buffers.direct and _apart_on_host(send, recv)):
            return functools.partial(self._allgather_now, send, recv)
        return functools.partial(self.comm.Allgather, self._typed(send), self._typed(recv))

    def _reduce_scatter(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        if not (self.buffers.direct and _apart_on_host(send, recv)):
            return functools.partial(self._reduce_scatter_now, send, recv, op)
        return functools.partial(self.comm.Reduce_scatter_block, self._typed(send),
                                 self._typed(recv), self._ops[op])

    def _gather(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        if not self.buffers.direct:
            return functools.partial(self._gather_now, send, recv, root)
        if self.comm.Get_rank() != root:           # recvbuf matters at the root alone
            return functools.partial(self.comm.Gather, self._typed(send), None, root)
        sendbuf = self.MPI.IN_PLACE if spans_overlap(send, recv) else self._typed(send)
        return functools.partial(self.comm.Gather, sendbuf, self._typed(recv), root)

    def _scatter(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        if not self.buffers.direct:
            return functools.partial(self._scatter_now, send, recv, root)
        if self.comm.Get_rank() != root:           # sendbuf matters at the root alone
            return functools.partial(self.comm.Scatter, None, self._typed(recv), root)
        recvbuf = self.MPI.IN_PLACE if spans_overlap(send, recv) else self._typed(recv)
        return functools.partial(self.comm.Scatter, self._typed(send), recvbuf, root)

    builders = {"broadcast": _broadcast, "allreduce": _allreduce, "allgather": _allgather,
                "reduce-scatter": _reduce_scatter, "alltoall": _alltoall, "reduce": _reduce,
                "sendrecv": _sendrecv, "gather": _gather, "scatter": _scatter}

    def bind_batch(self, collective: str, send: Any, recv: Any, op: str | None, root: int
                   ) -> Batch:
        """N calls from a compiled C loop (mpi_loop), else itertools over the bound call."""
        if self._libmpi is not None and isinstance(recv, np.ndarray):
            raw_recv = _raw(recv)
            run = batch_call(self.MPI, self._libmpi, self.comm, collective,
                             raw_recv if send is recv else _raw(send), raw_recv,
                             self._ops.get(op or "sum"), root)
            if run is not None:
                return run
        return super().bind_batch(collective, send, recv, op, root)

    def _reduce_buffers(self, send: Any, recv: Any, root: int) -> tuple[Any, Any]:
        """MPI_Reduce's (sendbuf, recvbuf): in place, the root passes MPI_IN_PLACE and the
        others their one buffer as input; recvbuf matters at the root alone (None elsewhere,
        so no buffer is both input and output)."""
        is_root = self.comm.Get_rank() == root
        if send is recv:
            return (self.MPI.IN_PLACE, self._typed(recv)) if is_root else (self._typed(send), None)
        return self._typed(send), self._typed(recv) if is_root else None

    def _broadcast_now(self, buf: Any, root: int) -> None:
        b, is_root = self.buffers, self.comm.Get_rank() == root
        self.comm.Bcast(_raw(b.stage_in(buf) if is_root else b.wire(buf)), root=root)
        if not is_root:
            b.stage_out(buf)

    def _allreduce_now(self, send: Any, recv: Any, op: str) -> None:
        b = self.buffers
        data = b.stage_in(send)                   # in place: send is recv, one mirror
        self.comm.Allreduce(self.MPI.IN_PLACE if send is recv else data, b.wire(recv),
                            op=self._ops[op])
        b.stage_out(recv)

    def _allgather_now(self, send: Any, recv: Any) -> None:
        b = self.buffers
        data = b.stage_in(send)                   # a view's mirror aliases: in place stays
        if spans_overlap(send, recv):             # my shard already sits in the output
            self.comm.Allgather(self.MPI.IN_PLACE, _raw(b.wire(recv)))
        else:
            self.comm.Allgather(_raw(data), _raw(b.wire(recv)))
        b.stage_out(recv)

    def _reduce_scatter_now(self, send: Any, recv: Any, op: str) -> None:
        b = self.buffers
        data = b.stage_in(send)
        if spans_overlap(send, recv):
            # MPI's in-place result lands at the start of the buffer; ccbench's (and NCCL's)
            # convention is this rank's slice, so move it there (one block copy)
            self.comm.Reduce_scatter_block(self.MPI.IN_PLACE, data, op=self._ops[op])
            if self.comm.Get_rank() != 0:
                out = b.wire(recv)
                out[...] = data[:recv.size]
                if b.direct:
                    self.synchronize()            # the next MPI call must not read before it
        else:
            self.comm.Reduce_scatter_block(data, b.wire(recv), op=self._ops[op])
        b.stage_out(recv)

    def _alltoall_now(self, send: Any, recv: Any) -> None:
        b = self.buffers
        data = b.stage_in(send)
        self.comm.Alltoall(self.MPI.IN_PLACE if send is recv else _raw(data), _raw(b.wire(recv)))
        b.stage_out(recv)

    def _reduce_now(self, send: Any, recv: Any, op: str, root: int) -> None:
        b, is_root = self.buffers, self.comm.Get_rank() == root
        data = b.stage_in(send)                   # in place: send is recv, one mirror
        if send is recv:
            sendbuf = self.MPI.IN_PLACE if is_root else data
        else:
            sendbuf = data
        self.comm.Reduce(sendbuf, b.wire(recv) if is_root else None, op=self._ops[op],
                         root=root)
        if is_root:
            b.stage_out(recv)

    def _sendrecv_now(self, send: Any, recv: Any) -> None:
        b = self.buffers
        dst, src = sendrecv_peers(self.comm.Get_rank(), self.comm.Get_size())
        self.comm.Sendrecv(_raw(b.stage_in(send)), dst, 0, _raw(b.wire(recv)), src, 0)
        b.stage_out(recv)

    def _gather_now(self, send: Any, recv: Any, root: int) -> None:
        b, is_root = self.buffers, self.comm.Get_rank() == root
        data = _raw(b.stage_in(send))             # a view's mirror aliases: in place stays
        if not is_root:
            self.comm.Gather(data, None, root=root)
            return
        sendbuf = self.MPI.IN_PLACE if spans_overlap(send, recv) else data
        self.comm.Gather(sendbuf, _raw(b.wire(recv)), root=root)
        b.stage_out(recv)

    def _scatter_now(self, send: Any, recv: Any, root: int) -> None:
        b, is_root = self.buffers, self.comm.Get_rank() == root
        if not is_root:
            self.comm.Scatter(None, _raw(b.wire(recv)), root=root)
        elif spans_overlap(send, recv):           # my block already sits in the input
            self.comm.Scatter(_raw(b.stage_in(send)), self.MPI.IN_PLACE, root=root)
            return
        else:
            self.comm.Scatter(_raw(b.stage_in(send)), _raw(b.wire(recv)), root=root)
        b.stage_out(recv)

    @property
    def replay_extras(self) -> ReplayExtras[MPIBackend]:
        return _MPIReplay(self)

    @property
    def groups(self) -> SubCommunicators[MPIBackend]:
        return _MPIGroups(self)

    def barrier(self) -> None:
        self.comm.Barrier()

    def finalize(self) -> None:
        self.comm.Free()


class MPIMessages(PointToPoint[MPIBackend]):
    """Send and Recv on the communicator, and the algorithms' transport over its host buffers
    (CUDA-aware MPI adds device buffers: cuda_mpi)."""

    blocking = True

    # bfloat16 and float8 have no MPI datatype (mpi4py's DLPack refuses them): as in the
    # collectives, their bit patterns travel (_raw)
    def send(self, buf: Any, peer: int, tag: int = 0) -> None:
        backend = self.backend
        backend.comm.Send(_raw(backend.buffers.stage_in(buf)), dest=peer, tag=tag)

    def recv(self, buf: Any, peer: int, tag: int = 0) -> None:
        backend = self.backend
        backend.comm.Recv(_raw(backend.buffers.wire(buf)), source=peer, tag=tag)
        backend.buffers.stage_out(buf)

    def transport(self, device: bool) -> Transport | None:
        if device:
            return None
        return MPITransport(self.backend.comm)


class _MPIReplay(ReplayExtras[MPIBackend]):
    def uneven_alltoall(self) -> AlltoallvCall | str:
        """Alltoallv on this communicator, each peer's block at the sum of the counts before
        it (counts in elements of the buffers' type, whatever travels)."""
        comm, b = self.backend.comm, self.backend.buffers

        def alltoallv(send: Any, recv: Any, s_in: list[int], s_out: list[int]) -> None:
            comm.Alltoallv([_raw(b.stage_in(send)), (s_in, _offsets(s_in))],
                           [_raw(b.wire(recv)), (s_out, _offsets(s_out))])
            b.stage_out(recv)
        return alltoallv


class _MPIGroups(SubCommunicators[MPIBackend]):
    def split(self, groups: Sequence[Sequence[int]], timeout: float
              ) -> list[Backend | str | None]:
        """`Comm.Split` per group (every rank calls it; those outside get MPI_COMM_NULL)."""
        backend = self.backend
        out: list[Backend | str | None] = []
        rank = backend.ctx.rank
        for ranks in groups:
            comm = backend.comm.Split(0 if rank in ranks else backend.MPI.UNDEFINED, rank)
            if rank not in ranks:
                out.append(None)
                continue
            comm.Set_errhandler(backend.MPI.ERRORS_RETURN)
            sub = self.on_group(ranks)
            sub.comm, sub._probed = comm, {}
            out.append(sub)
        return out


def _offsets(counts: list[int]) -> list[int]:
    """Where each of `counts` starts when they lie back to back."""
    return [int(x) for x in np.concatenate(([0], np.cumsum(counts)[:-1]))] if counts else []


# -- point to point: algorithms.transport over the communicator --------------------------------

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
        return _MPIRequest(self.comm.Isend([raw_bytes(buf), self.MPI.BYTE], dest=peer, tag=tag),
                           f"rank {self.rank}: send to {peer}")

    def irecv(self, buf: Any, peer: int, tag: int) -> _MPIRequest:
        return _MPIRequest(self.comm.Irecv([raw_bytes(buf), self.MPI.BYTE], source=peer, tag=tag),
                           f"rank {self.rank}: recv from {peer}")

    def prepare(self, sends: list[tuple[Any, int, int]],
                recvs: list[tuple[Any, int, int]]) -> _MPIPrepared:
        """Persistent requests for one step (buffers parsed once, not per call)."""
        byte = self.MPI.BYTE
        rq = [self.comm.Recv_init([raw_bytes(b), byte], source=peer, tag=tag) for b, peer, tag in recvs]
        sq = [self.comm.Send_init([raw_bytes(b), byte], dest=peer, tag=tag) for b, peer, tag in sends]
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
