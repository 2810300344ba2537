"""MPI collectives called N times from a compiled C loop: no Python between two operations.

`--timing pipelined` on the mpi backend times a batch of N calls. Issued from Python, every
call costs mpi4py's argument handling (about 1 us on a small x86 VM, several times an 8-byte
allreduce on shared memory); issued from this loop, the harness adds nothing between calls, as
in IMB-MPI1 and the OSU benchmarks. The loop calls the very functions mpi4py loaded (looked up
in the same libmpi), with handles mpi4py resolved, so it measures the same library. The loop
reads the clock itself, right before the first call and after the last, as IMB-MPI1 does: the
Python call into it (about 0.8 us per batch on that VM, 4% of an 8-byte allreduce in a batch
of 50) stays outside the time.

The C source needs no MPI header: the MPI handle type is `int` in the MPICH ABI (MPICH, Intel
MPI, MVAPICH) and a pointer in Open MPI's, and mpi4py says which (`MPI._sizeof`). Without a C
compiler the loop is `itertools.starmap` over mpi4py's bound call (still no Python bytecode
between calls, but mpi4py's cost per call); the record says which one ran.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from ccbench.backends.base import Batch
from ccbench.collectives import get as get_collective

C_LOOP = ("the MPI function called N times from a compiled C loop, the clock read in C "
          "around the N calls")

__all__ = ["C_LOOP", "batch_call", "compiled_loop_library", "loaded_libmpi", "predefined_datatype"]

_SOURCE = r"""
#include <time.h>
typedef HANDLE H;
typedef int (*allreduce_t)(const void *, void *, int, H, H, H);
typedef int (*bcast_t)(void *, int, H, int, H);
typedef int (*gather_t)(const void *, int, H, void *, int, H, H);   /* allgather, alltoall */
typedef int (*rsb_t)(const void *, void *, int, H, H, H);         /* reduce_scatter_block */
typedef int (*reduce_t)(const void *, void *, int, H, H, int, H);

/* CLOCK_MONOTONIC is the clock time.perf_counter reads on Linux; reading it here, right around
   the calls as IMB-MPI1 does, keeps the Python call into this loop out of the time */
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
#define LOOP(call) \
    int rc = 0; \
    double start = now(); \
    for (long i = 0; i < times && rc == 0; i++) rc = (call); \
    *seconds = now() - start; \
    return rc;

int loop_allreduce(void *fn, const void *s, void *r, int n, H t, H op, H c, long times,
                   double *seconds) {
    LOOP(((allreduce_t)fn)(s, r, n, t, op, c))
}
int loop_reduce_scatter_block(void *fn, const void *s, void *r, int n, H t, H op, H c,
                              long times, double *seconds) {
    LOOP(((rsb_t)fn)(s, r, n, t, op, c))
}
int loop_reduce(void *fn, const void *s, void *r, int n, H t, H op, int root, H c,
                long times, double *seconds) {
    LOOP(((reduce_t)fn)(s, r, n, t, op, root, c))
}
int loop_bcast(void *fn, void *b, int n, H t, int root, H c, long times, double *seconds) {
    LOOP(((bcast_t)fn)(b, n, t, root, c))
}
int loop_gather(void *fn, const void *s, int sn, H st, void *r, int rn, H rt, H c,
                long times, double *seconds) {
    LOOP(((gather_t)fn)(s, sn, st, r, rn, rt, c))
}
"""


def loaded_libmpi() -> str | None:
    """The path of the libmpi this process loaded (mpi4py dlopens it RTLD_LOCAL, so it is not
    in the global symbol namespace)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as handle:
            for line in handle:
                path = line.split()[-1] if line.strip() else ""
                if "/libmpi" in path and ".so" in path:
                    return path
    except OSError:
        return None
    return None


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ccbench"


@functools.cache
def compiled_loop_library(handle_bytes: int) -> ctypes.CDLL | None:
    """The loop library for this MPI ABI, compiled once per machine and cached; None without a
    C compiler (or when compiling fails)."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    handle = "int" if handle_bytes == 4 else "void *"
    digest = hashlib.sha256((_SOURCE + handle).encode()).hexdigest()[:16]
    target = _cache_dir() / f"mpi_loop-{digest}.so"
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                source = Path(tmp) / "loop.c"
                source.write_text(_SOURCE, encoding="utf-8")
                built = Path(tmp) / "loop.so"
                subprocess.run([compiler, "-O2", "-shared", "-fPIC", f"-DHANDLE={handle}",
                                "-o", str(built), str(source)], check=True,
                               capture_output=True, timeout=120)
                os.replace(built, target)      # atomic: ranks compiling at once all agree
        except (OSError, subprocess.SubprocessError):
            return None
    return ctypes.CDLL(str(target))


def batch_call(mpi: Any, libmpi: str, comm: Any, collective: str, send: Any, recv: Any,
               op: Any, root: int) -> Batch | None:
    """`run(N)`: N calls of the collective from the compiled loop; None when this collective
    or buffer layout has no loop here (or no compiler), so the caller falls back."""
    loops = compiled_loop_library(mpi._sizeof(mpi.Comm))
    if loops is None:
        return None
    lib = ctypes.CDLL(libmpi)
    if any(predefined_datatype(mpi, buf.dtype) is None for buf in (send, recv)):
        return None
    arguments = _LOOP_ARGUMENTS.get(collective)
    call = arguments(_CArgs(mpi, comm), comm, send, recv, op, root) if arguments else None
    if call is None:
        return None
    loop_name, args = call
    fn = getattr(lib, str(get_collective(collective).tools.mpi))     # MPI_Allreduce ...
    address = ctypes.c_void_p(ctypes.cast(fn, ctypes.c_void_p).value)
    return _timed_batch(mpi, getattr(loops, loop_name), address, args)


class _CArgs:
    """MPI handles and buffers as the C loop takes them: handles of this MPI ABI's width (an
    int in MPICH's, a pointer in Open MPI's), buffers as addresses (None: MPI_IN_PLACE)."""

    def __init__(self, mpi: Any, comm: Any) -> None:
        self.mpi = mpi
        self.narrow = mpi._sizeof(mpi.Comm) == 4
        self.comm = self.handle(comm)

    def handle(self, obj: Any) -> Any:
        value = self.mpi._handleof(obj)
        return ctypes.c_int32(value & 0xFFFFFFFF) if self.narrow else ctypes.c_void_p(value)

    def ptr(self, buf: Any) -> ctypes.c_void_p:
        if buf is None:
            return ctypes.c_void_p(int(self.mpi.IN_PLACE) & (2**64 - 1))
        return ctypes.c_void_p(buf.ctypes.data)

    def datatype(self, buf: Any) -> Any:
        return self.handle(predefined_datatype(self.mpi, buf.dtype))


#: (C loop's name, its arguments before the count and the clock), or None: no loop for it
_LoopCall = tuple[str, tuple[Any, ...]] | None


def _allreduce(c: _CArgs, comm: Any, send: Any, recv: Any, op: Any, root: int) -> _LoopCall:
    return "loop_allreduce", (c.ptr(None if send is recv else send), c.ptr(recv),
                              ctypes.c_int(recv.size), c.datatype(recv), c.handle(op), c.comm)


def _bcast(c: _CArgs, comm: Any, send: Any, recv: Any, op: Any, root: int) -> _LoopCall:
    return "loop_bcast", (c.ptr(recv), ctypes.c_int(recv.size), c.datatype(recv),
                          ctypes.c_int(root), c.comm)


def _gather_like(collective: str) -> Any:
    """allgather and alltoall (MPI's same argument list), out of place only."""
    def arguments(c: _CArgs, comm: Any, send: Any, recv: Any, op: Any, root: int) -> _LoopCall:
        if send is recv or _aliased(send, recv):
            return None
        per_peer = recv.size // comm.Get_size()
        send_count = send.size if collective == "allgather" else per_peer
        return "loop_gather", (c.ptr(send), ctypes.c_int(send_count), c.datatype(send),
                               c.ptr(recv), ctypes.c_int(per_peer), c.datatype(recv), c.comm)
    return arguments


def _reduce(c: _CArgs, comm: Any, send: Any, recv: Any, op: Any, root: int) -> _LoopCall:
    is_root = comm.Get_rank() == root
    no_buffer = ctypes.c_void_p(None)           # a non-root's MPI_Reduce recvbuf
    if send is recv:              # the root reduces into its buffer; the others read theirs
        sendbuf, recvbuf = (c.ptr(None), c.ptr(recv)) if is_root else (c.ptr(send), no_buffer)
    else:
        sendbuf, recvbuf = c.ptr(send), c.ptr(recv) if is_root else no_buffer
    return "loop_reduce", (sendbuf, recvbuf, ctypes.c_int(recv.size), c.datatype(recv),
                           c.handle(op), ctypes.c_int(root), c.comm)


def _reduce_scatter(c: _CArgs, comm: Any, send: Any, recv: Any, op: Any, root: int
                    ) -> _LoopCall:
    if _aliased(send, recv):
        return None
    return "loop_reduce_scatter_block", (c.ptr(send), c.ptr(recv), ctypes.c_int(recv.size),
                                         c.datatype(recv), c.handle(op), c.comm)


#: collective -> the arguments of its C loop
_LOOP_ARGUMENTS = {"allreduce": _allreduce, "broadcast": _bcast,
                   "allgather": _gather_like("allgather"), "alltoall": _gather_like("alltoall"),
                   "reduce": _reduce, "reduce-scatter": _reduce_scatter}


def _timed_batch(mpi: Any, loop: Any, address: ctypes.c_void_p, args: tuple[Any, ...]
                 ) -> Batch:
    """The loop bound to the MPI function and its arguments; it reads its own clock."""
    loop.restype = ctypes.c_int
    bound = functools.partial(loop, address, *args)
    seconds = ctypes.c_double()
    out = ctypes.pointer(seconds)

    def timed(times: int) -> float:
        code = bound(ctypes.c_long(times), out)
        if code:
            raise RuntimeError(f"MPI error {code} ({mpi.Get_error_string(code)})")
        return seconds.value

    def run(times: int) -> None:
        timed(times)
    return Batch(run, C_LOOP, timed)


def predefined_datatype(mpi: Any, dtype: Any) -> Any:
    """MPI's predefined datatype for a numpy dtype (MPI.FLOAT for float32 ...), None if MPI has
    none. Not mpi4py.util.dtlib.from_numpy_dtype: that builds a derived type, on which MPI
    reductions are invalid."""
    return mpi._typedict.get(dtype.char)


def _aliased(send: Any, recv: Any) -> bool:
    import numpy as np

    return bool(np.may_share_memory(send, recv))
