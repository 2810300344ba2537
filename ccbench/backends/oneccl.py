"""oneccl: Intel oneCCL's C API (onecclCommInitRank, onecclAllReduce, ...) through ctypes, on
host numpy buffers.

Rank 0 makes the 4096-byte onecclUniqueId and publishes it through the control store; the
other ranks read it and every rank joins with onecclCommInitRank. Buffers are plain numpy
arrays (bfloat16 through ml_dtypes: its raw 16-bit buffer is what oneCCL reads), passed by
pointer with a NULL stream, which the CPU plugin runs to completion before returning.
Library discovery and loading: ccbench/backends/_oneccl_lib.py; install: scripts/install-oneccl.sh.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ccbench.backend_facts import BACKENDS
from ccbench.backends._oneccl_lib import OneCCLLib, OneCCLLoadError, UniqueId, load
from ccbench.backends.base import (
    AlltoallvCall,
    Backend,
    BackendInfo,
    Library,
    Message,
    PointToPoint,
    RankContext,
    ReplayExtras,
    SubCommunicators,
    found_or_why,
    library_line,
    timed_as,
)
from ccbench.backends.p2p import Done, GroupPrepared
from ccbench.collectives.sendrecv import peers as sendrecv_peers
from ccbench.errors import RunFailure

if TYPE_CHECKING:
    from algorithms.transport import Transport

__all__ = ["DTYPES", "OPS", "OneCCLBackend", "OneCCLTransport"]

# onecclDataType_t
DTYPES: dict[str, int] = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4,
                          "uint64": 5, "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}
# onecclRedOp_t
OPS: dict[str, int] = {"sum": 0, "prod": 1, "max": 2, "min": 3}
#: ops the C API names that the CPU plugin does not run (onecclAvg = 4: 2022.2.0 raises
#: "Unsupported onecclRedOp_t value" at 2 and 3 ranks)
_NOT_RUN = {"avg": "the CPU plugin raises 'Unsupported onecclRedOp_t value' for onecclAvg"}

#: (dtype, op) pairs the CPU plugin gets wrong or refuses. None in 2022.2.0: every op on every
#: dtype above was bit-exact at 1-4 ranks (tests/test_oneccl.py); add one here with its reason.
_BROKEN: dict[tuple[str, str], str] = {}

_ENV_PREFIXES = ("CCL_", "FI_", "ONECCL_")
_generation = itertools.count()        # one unique-id key per communicator made in this process


def _tuning_defaults(ctx: RankContext) -> dict[str, str]:
    """Settings the measured library needs to behave on a small or shared machine; a value the
    user set wins, and every CCL_* variable is recorded with the results.

    * all ranks on one node: CCL_ATL_SHM=1 (libfabric's shm provider between local ranks,
      instead of tcp over loopback);
    * CCL_LOG_LEVEL=error: oneCCL warns, on its stdout, about every variable set here;
    * more busy threads than cores (each rank runs its main thread and one oneCCL worker that
      polls): CCL_YIELD=sched_yield, without which an 8-byte allreduce took 20-90 ms at 2-4
      ranks on 2 cores instead of 0.1-0.3 ms (docs/oneccl.md).
    """
    out = {"CCL_LOG_LEVEL": "error"}    # not a warning per setting made here
    if ctx.local_world_size == ctx.world_size:
        out["CCL_ATL_SHM"] = "1"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = int(os.environ.get("CCL_WORKER_COUNT", "1") or 1)
    if ctx.local_world_size * (1 + workers) > (cores or 1):
        out["CCL_YIELD"] = "sched_yield"
    return out


#: what oneCCL logs, at its default level warn, about the CCL_LOG_LEVEL=error set here to quiet
#: it: read before that level takes effect, so it came on every run
_OWN_LEVEL_WARNING = b"|CCL_WARN| value of CCL_LOG_LEVEL changed to be error"


@contextlib.contextmanager
def _start_up_log_filtered() -> Iterator[None]:
    """oneCCL's log (file descriptor 1) while it starts goes through a file and comes back
    whole, less the line about the CCL_LOG_LEVEL this backend sets (_OWN_LEVEL_WARNING):
    every other line of its, a real warning or error, still reaches the rank's output."""
    import tempfile

    try:
        saved = os.dup(1)
        capture = tempfile.TemporaryFile()
    except OSError:                           # no descriptor 1 to borrow: leave it as it is
        yield
        return
    with capture:
        os.dup2(capture.fileno(), 1)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, AttributeError):
                ctypes.CDLL(None).fflush(None)      # what the C library still buffers
            os.dup2(saved, 1)
            os.close(saved)
            capture.seek(0)
            kept = [line for line in capture.read().splitlines(keepends=True)
                    if _OWN_LEVEL_WARNING not in line]
            if kept:
                with contextlib.suppress(OSError):
                    os.write(1, b"".join(kept))


def _ptr(buf: np.ndarray) -> int:
    if not buf.flags.c_contiguous:
        raise RunFailure("oneccl: buffers must be contiguous")
    return int(buf.ctypes.data)


def _oneccl_facts() -> dict[str, Any]:
    reason = OneCCLBackend.unavailable_reason()
    if reason:
        return {"found": False, "reason": reason}
    lib = load()
    return {"found": True, "version": lib.version, "path": str(lib.path)}


def _oneccl_lines(oneccl: dict[str, Any]) -> list[str]:
    return [library_line("oneccl", found_or_why(oneccl, str(oneccl.get("version"))))]


class OneCCLBackend(Backend):
    name = "oneccl"
    display_name = BACKENDS[name].display_name
    libraries = (Library("oneccl", _oneccl_facts, _oneccl_lines),)
    carries_algorithms = True

    @classmethod
    def probe_version(cls) -> str | None:
        try:
            return load().version
        except Exception:  # noqa: BLE001  (a probe never raises; unavailable_reason says why)
            return None

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            load()
        except OneCCLLoadError as exc:
            return str(exc)
        except Exception as exc:  # noqa: BLE001  (a probe never raises)
            return f"oneCCL cannot be loaded: {type(exc).__name__}: {exc}"
        return None

    def __init__(self, ctx: RankContext) -> None:
        super().__init__(ctx)
        # the plugin reads these when it first initialises: set them before loading it
        os.environ.setdefault("CCL_PROCESS_LAUNCHER", "none")
        os.environ.setdefault("CCL_LOCAL_RANK", str(ctx.local_rank))
        os.environ.setdefault("CCL_LOCAL_SIZE", str(ctx.local_world_size))
        for name, value in _tuning_defaults(ctx).items():
            os.environ.setdefault(name, value)
        try:
            self.ccl: OneCCLLib = load()
        except OneCCLLoadError as exc:
            raise RunFailure(f"oneccl: {exc}") from None
        self.lib = self.ccl.lib
        self.rank, self.world = ctx.rank, ctx.world_size
        self.comm = ctypes.c_void_p()
        self._destroyed = False
        with _start_up_log_filtered():      # where oneCCL reads its variables and logs them
            uid = self._unique_id(f"lib/oneccl/unique-id/{next(_generation)}",
                                  ctx.options.timeout)
            self._join(uid)
        self._bar = np.zeros(1, dtype=np.int32)
        self._bar_ptr = _ptr(self._bar)

    def _unique_id(self, key: str, timeout: float) -> UniqueId:
        """The communicator's id: made by its rank 0 and published under `key` in the control
        store, read there by the others."""
        if self.rank == 0:
            uid = UniqueId()
            self._check(self.lib.onecclGetUniqueId(ctypes.byref(uid)), "onecclGetUniqueId")
            self.ctx.store.set(key, uid.to_bytes())
            return uid
        try:
            data = self.ctx.store.get(key, timeout)
        except TimeoutError:
            raise RunFailure(f"oneccl: rank 0 did not publish the unique id within "
                             f"{timeout:.0f} s") from None
        return UniqueId.from_bytes(bytes(data))

    def _join(self, uid: UniqueId) -> None:
        """onecclCommInitRank as `self.rank` of `self.world` (a fresh communicator)."""
        self.comm, self._destroyed = ctypes.c_void_p(), False
        self._check(self.lib.onecclCommInitRank(ctypes.byref(self.comm), self.world, uid,
                                                self.rank), "onecclCommInitRank")
        self._handle = self.comm.value

    # -- errors ----------------------------------------------------------------------
    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise RunFailure(f"oneccl: {what} failed on rank {self.ctx.rank}: "
                             f"{self.ccl.error_text(rc)}")

    # -- what it can do --------------------------------------------------------------
    @classmethod
    def refuses(cls, dtype: np.dtype, op: str | None) -> str | None:
        if dtype.name not in DTYPES:
            return f"unsupported by oneccl: no oneCCL datatype for {dtype.name}"
        if op is not None:
            if op in _NOT_RUN:
                return f"unsupported by oneccl: {op} ({_NOT_RUN[op]})"
            if op not in OPS:
                return f"unsupported by oneccl: reduction {op!r}"
            broken = _BROKEN.get((dtype.name, op))
            if broken:
                return f"unsupported by oneccl: {op} on {dtype.name} ({broken})"
        return None

    @property
    def transport(self) -> str:
        return f"oneccl/{os.environ.get('CCL_ATL_TRANSPORT', 'ofi')}"

    def info(self) -> BackendInfo:
        env = {k: v for k, v in os.environ.items()
               if k.startswith(_ENV_PREFIXES) and k != "CCL_LOCAL_RANK"}
        return {"library": "oneCCL", "library_version": self.ccl.version, "device": "cpu",
                "library_path": str(self.ccl.path),
                "libfabric": str(self.ccl.libfabric) if self.ccl.libfabric else None,
                "env": env}

    # -- calls with every argument resolved once -------------------------------------
    def _dtype(self, buf: np.ndarray) -> int:
        code = DTYPES.get(buf.dtype.name)
        if code is None:
            raise RunFailure(f"unsupported by oneccl: no oneCCL datatype for {buf.dtype.name}")
        return code

    def _op(self, op: str) -> int:
        code = OPS.get(op)
        if code is None:
            raise RunFailure(f"unsupported by oneccl: reduction {op!r}")
        return code

    def _call(self, fn: Any, what: str, *args: Any) -> Callable[[], None]:
        check = self._check

        def call() -> None:
            rc = fn(*args)
            if rc:
                check(rc, what)
        return call

    # -- the collectives: one C call each, every argument resolved once ----------------
    def _broadcast(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        return self._call(self.lib.onecclBroadcast, "onecclBroadcast", _ptr(recv), _ptr(recv),
                          recv.size, self._dtype(recv), root, self._handle, None)

    def _allreduce(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        return self._call(self.lib.onecclAllReduce, "onecclAllReduce", _ptr(send), _ptr(recv),
                          recv.size, self._dtype(recv), self._op(op), self._handle, None)

    def _allgather(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        return self._call(self.lib.onecclAllGather, "onecclAllGather", _ptr(send), _ptr(recv),
                          send.size, self._dtype(recv), self._handle, None)

    def _reduce_scatter(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        return self._call(self.lib.onecclReduceScatter, "onecclReduceScatter", _ptr(send),
                          _ptr(recv), recv.size, self._dtype(recv), self._op(op), self._handle,
                          None)

    def _reduce(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        return self._call(self.lib.onecclReduce, "onecclReduce", _ptr(send), _ptr(recv),
                          recv.size, self._dtype(recv), self._op(op), root, self._handle, None)

    def _alltoall(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        return self._call(self.lib.onecclAllToAll, "onecclAllToAll", _ptr(send), _ptr(recv),
                          send.size // self.world, self._dtype(recv), self._handle, None)

    @timed_as("onecclSend to rank+1 and onecclRecv from rank-1, one after the other (even "
              "ranks sending first), each through ctypes and completed before it returns: two "
              "library calls per operation")
    def _sendrecv(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        """onecclSend to rank+1 and onecclRecv from rank-1, even ranks sending first and odd
        ranks receiving first, so that every blocking send meets a posted receive.

        Not a onecclGroupStart/End pair: the CPU plugin completes each C API call by waiting
        on its event, which oneCCL does not support inside a group (a CCL_WARN line per call,
        then a CCL_ERROR line per event it destroys uncompleted), and its group end runs the
        grouped calls one after the other anyway. Without a group and in this order, a large
        message cannot deadlock (all ranks sending first hangs from 8 KiB on)."""
        lib, comm, check = self.lib, self._handle, self._check
        dst, src = sendrecv_peers(self.ctx.rank, self.world)
        send_args = (_ptr(send), send.size, self._dtype(send), dst, comm, None)
        recv_args = (_ptr(recv), recv.size, self._dtype(recv), src, comm, None)
        steps = [(lib.onecclSend, send_args, "onecclSend"),
                 (lib.onecclRecv, recv_args, "onecclRecv")]
        if self.ctx.rank % 2:
            steps.reverse()

        def call() -> None:
            for fn, args, what in steps:
                check(fn(*args), what)
        return call

    builders = {"broadcast": _broadcast, "allreduce": _allreduce, "allgather": _allgather,
                "reduce-scatter": _reduce_scatter, "alltoall": _alltoall, "reduce": _reduce,
                "sendrecv": _sendrecv}
    lacks = {"gather": "oneCCL's C API has no gather (libccl exports no onecclGather)",
             "scatter": "libccl exports onecclScatter, but the install (scripts/install-oneccl.sh) "
                        "has no header giving its signature, so ccbench does not call it"}

    # -- point to point (ordered per peer; oneCCL has no tags) -----------------------
    @property
    def p2p(self) -> PointToPoint[OneCCLBackend]:
        return _OneCCLMessages(self)

    @property
    def replay_extras(self) -> ReplayExtras[OneCCLBackend]:
        return _OneCCLReplay(self)

    # -- sub-communicators -----------------------------------------------------------
    @property
    def groups(self) -> SubCommunicators[OneCCLBackend]:
        return _OneCCLGroups(self)

    # -- control ---------------------------------------------------------------------
    def barrier(self) -> None:
        # the C API has no barrier: a one-element allreduce is one
        rc = self.lib.onecclAllReduce(self._bar_ptr, self._bar_ptr, 1, 2, 0, self._handle, None)
        if rc:
            self._check(rc, "barrier (onecclAllReduce)")

    def finalize(self) -> None:
        if self._destroyed or not self.comm.value:
            return
        self._destroyed = True
        self._check(self.lib.onecclCommDestroy(self.comm), "onecclCommDestroy")


class _OneCCLMessages(PointToPoint[OneCCLBackend]):
    blocking = True

    def send(self, buf: Any, peer: int, tag: int = 0) -> None:
        b = self.backend
        b._check(b.lib.onecclSend(_ptr(buf), buf.size, b._dtype(buf), peer, b._handle, None),
                 "onecclSend")

    def recv(self, buf: Any, peer: int, tag: int = 0) -> None:
        b = self.backend
        b._check(b.lib.onecclRecv(_ptr(buf), buf.size, b._dtype(buf), peer, b._handle, None),
                 "onecclRecv")

    def transport(self, device: bool) -> OneCCLTransport | None:
        if device:
            return None
        return OneCCLTransport(self.backend)


class _OneCCLReplay(ReplayExtras[OneCCLBackend]):
    def post_exchange(self, transport: Transport, sends: list[Message], recvs: list[Message],
                      timeout: float) -> Callable[[], None]:
        """One group (onecclSend/Recv complete before they return: posted one by one, the
        first would wait for a peer still in its own)."""
        assert isinstance(transport, OneCCLTransport)
        step = transport.prepare(sends, recvs)

        def group() -> None:
            step.start()
            step.wait_all(timeout)
        return group

    def uneven_alltoall(self) -> AlltoallvCall | str:
        return (f"{self.backend.name}: ccbench binds oneCCL's NCCL-style C API, whose "
                f"all-to-all takes one count for every peer (no all-to-allv)")


class _OneCCLGroups(SubCommunicators[OneCCLBackend]):
    def split(self, groups: Sequence[Sequence[int]], timeout: float
              ) -> list[Backend | str | None]:
        """A new communicator per group, from a unique id the group's first rank publishes."""
        out: list[Backend | str | None] = []
        for ranks in groups:
            key = f"lib/oneccl/unique-id/{next(_generation)}"   # every rank counts every group
            if self.backend.ctx.rank not in ranks:
                out.append(None)
                continue
            sub = self.on_group(ranks)
            sub.rank, sub.world = sub.ctx.rank, sub.ctx.world_size
            sub._join(sub._unique_id(key, timeout))
            out.append(sub)
        return out


# -- point to point: algorithms.transport over onecclSend/onecclRecv ---------------------------

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

    def isend(self, buf: np.ndarray, peer: int, tag: int) -> Done:
        self._group([(buf, peer, tag)], [])
        return Done()

    def irecv(self, buf: np.ndarray, peer: int, tag: int) -> Done:
        self._group([], [(buf, peer, tag)])
        return Done()

    def prepare(self, sends: list[tuple[Any, int, int]],
                recvs: list[tuple[Any, int, int]]) -> GroupPrepared:
        return GroupPrepared(functools.partial(self._group, sends, recvs))
