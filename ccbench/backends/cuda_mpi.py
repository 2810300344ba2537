"""mpi with device buffers (--device cuda): the mpi backend's collectives on CuPy arrays.

Two ways to move device memory through MPI, recorded as environment["buffers"]:

* "cuda-aware": the MPI library reads and writes device memory itself; the CuPy arrays go
  straight to mpi4py (through __cuda_array_interface__).
* "host-staging": every buffer has a host mirror (page-locked when CuPy can allocate one); a
  collective copies its input device -> host, runs the host MPI collective, and copies the
  output host -> device. The copies are inside the timed region: that is what this path costs.

Which one: the environment variable CCBENCH_MPI_CUDA_AWARE=1|0 decides when set; otherwise the
MPI library is asked (MPI.Query_cuda_support() where mpi4py has it, else the
MPIX_Query_cuda_support() extension of Open MPI and MPICH found in the loaded libmpi), and a
library that cannot say is treated as not CUDA-aware.

bfloat16 is kept on the device as its 16-bit patterns (uint16): MPI has no bfloat16 datatype
anyway, so only data-moving collectives use it (reductions are refused by `unsupported`, as on
the host mpi backend).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ccbench.backends.base import RankContext
from ccbench.backends.mpi import MPIBackend
from ccbench.backends.mpi_loop import loaded_libmpi
from ccbench.errors import UsageError

__all__ = ["CudaMPIBackend", "DeviceBuffer", "cuda_query_symbol", "cuda_support",
           "cupy_missing_reason"]

#: set to 1 or 0 to say whether the MPI library is CUDA-aware, overriding what it reports
OVERRIDE_VAR = "CCBENCH_MPI_CUDA_AWARE"


def cupy_missing_reason() -> str | None:
    """None when CuPy imports and sees a device, else why not."""
    if importlib.util.find_spec("cupy") is None:
        return "cupy is not installed (pip install 'ccbench[cuda]')"
    try:
        import cupy

        count = int(cupy.cuda.runtime.getDeviceCount())
    except ImportError as exc:
        return f"cupy cannot be imported: {exc}"
    except RuntimeError as exc:       # cupy's CUDARuntimeError derives from RuntimeError
        return f"cupy sees no CUDA runtime or device: {exc}"
    if count == 0:
        return "cupy sees no CUDA device"
    return None


def cuda_query_symbol() -> tuple[str | None, bool]:
    """(path of the loaded libmpi, whether it exports MPIX_Query_cuda_support). Only looks the
    symbol up; calling it before MPI_Init aborts MPICH-based libraries (Intel MPI included)."""
    path = loaded_libmpi()
    if path is None:
        return None, False
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return path, False
    return path, hasattr(lib, "MPIX_Query_cuda_support")


def cuda_support(mpi: Any) -> tuple[bool, str]:
    """(CUDA-aware?, how that was decided). Call it after MPI_Init (the backend does)."""
    forced = os.environ.get(OVERRIDE_VAR)
    if forced is not None:
        if forced not in ("0", "1"):
            raise UsageError(f"{OVERRIDE_VAR}={forced!r} is not valid (valid: 0, 1)")
        return forced == "1", f"{OVERRIDE_VAR}={forced}"
    query = getattr(mpi, "Query_cuda_support", None)
    if query is not None:
        return bool(query()), "MPI.Query_cuda_support()"
    if not mpi.Is_initialized() or mpi.Is_finalized():
        return False, "MPI is not initialised, so it cannot be asked; assumed not CUDA-aware"
    path, present = cuda_query_symbol()
    if path is None:
        return False, "libmpi not found in this process; assumed not CUDA-aware"
    if not present:
        return False, (f"{os.path.basename(path)} has no MPIX_Query_cuda_support; "
                       f"assumed not CUDA-aware")
    symbol = ctypes.CDLL(path).MPIX_Query_cuda_support
    symbol.restype = ctypes.c_int
    symbol.argtypes = []
    return bool(symbol()), "MPIX_Query_cuda_support()"


class DeviceBuffer:
    """A CuPy array, the dtype it stands for (bfloat16 is stored as uint16) and, on the
    host-staging path, its host mirror. A view shares the parent's device memory and mirror, so
    aliasing between send and receive buffers is the same on the host as on the device. It
    passes to mpi4py as the device array itself (__cuda_array_interface__)."""

    __slots__ = ("array", "logical", "host")

    def __init__(self, array: Any, logical: np.dtype, host: np.ndarray | None) -> None:
        self.array, self.logical, self.host = array, logical, host

    def __getitem__(self, index: slice) -> DeviceBuffer:
        return DeviceBuffer(self.array[index], self.logical,
                            None if self.host is None else self.host[index])

    @property
    def dtype(self) -> np.dtype:
        """The storage dtype (uint16 for bfloat16), as MPI sees it."""
        return np.dtype(self.array.dtype)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return self.array.__cuda_array_interface__    # type: ignore[no-any-return]

    @property
    def size(self) -> int:
        return int(self.array.size)

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)


def _span(buf: DeviceBuffer) -> tuple[int, int]:
    """[start, end) device address range of a contiguous buffer."""
    start = int(buf.__cuda_array_interface__["data"][0])
    return start, start + buf.nbytes


def _overlap(a: DeviceBuffer, b: DeviceBuffer) -> bool:
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


class CudaMPIBackend(MPIBackend):
    """The mpi backend on CuPy device arrays, CUDA-aware or host-staged."""

    name = "mpi"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return MPIBackend.unavailable_reason() or cupy_missing_reason()

    def __init__(self, ctx: RankContext) -> None:
        if ctx.device != "cuda":
            raise UsageError(f"the CuPy buffers of backend 'mpi' need --device cuda, "
                             f"not {ctx.device}")
        super().__init__(ctx)
        import cupy

        self.cupy = cupy
        # unlike NCCL, MPI lets ranks share a device: more ranks than devices wrap around, and
        # the record says so (their timings contend for one device)
        count = int(cupy.cuda.runtime.getDeviceCount())
        self.device_index = ctx.local_rank % count
        self.device_shared = ctx.local_world_size > count
        cupy.cuda.Device(self.device_index).use()
        self.cuda_aware, self.detection = cuda_support(self.MPI)
        self.buffers = "cuda-aware" if self.cuda_aware else "host-staging"
        self._pinned = self._pinned_allocator()

    def _pinned_allocator(self) -> Callable[[int, np.dtype], np.ndarray] | None:
        try:
            import cupyx
        except ImportError:
            return None
        return getattr(cupyx, "empty_pinned", None)

    # -- metadata ---------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        meta = super().info()
        runtime = self.cupy.cuda.runtime
        try:
            gpu = runtime.getDeviceProperties(self.device_index)["name"]
            gpu = gpu.decode() if isinstance(gpu, bytes) else str(gpu)
        except (AttributeError, KeyError, RuntimeError):
            gpu = "unknown"
        meta.update({
            "device": f"cuda:{self.device_index}",
            "buffers": self.buffers,
            "buffers_detected_by": self.detection,
            "device_shared": self.device_shared,
            "host_mirror": ("pinned" if self._pinned else "pageable")
            if not self.cuda_aware else None,
            "cupy": getattr(self.cupy, "__version__", "unknown"),
            "gpu": gpu,
        })
        meta["env"] = {**meta["env"], **{k: v for k, v in os.environ.items()
                                         if k.startswith(("CUDA_VISIBLE", OVERRIDE_VAR))}}
        return meta

    # -- buffers ----------------------------------------------------------------------------
    @staticmethod
    def _storage(dtype: np.dtype) -> np.dtype:
        return np.dtype(np.uint16) if dtype.name == "bfloat16" else dtype

    def alloc(self, count: int, dtype: np.dtype) -> DeviceBuffer:
        storage = self._storage(dtype)
        array = self.cupy.empty(count, dtype=storage)
        host = None
        if not self.cuda_aware:
            host = self._pinned(count, storage) if self._pinned else np.empty(count, storage)
        return DeviceBuffer(array, dtype, host)

    def view(self, buf: DeviceBuffer, start: int, stop: int) -> DeviceBuffer:
        return buf[start:stop]

    def copy_from_numpy(self, buf: DeviceBuffer, values: np.ndarray) -> None:
        raw = values.view(np.uint16) if values.dtype.name == "bfloat16" else values
        buf.array.set(np.ascontiguousarray(raw))
        # a copy from pageable memory may return before it lands; MPI (CUDA-aware, possibly
        # over RDMA) must not read the buffer before then. Outside the timed region.
        self.synchronize()

    def to_numpy(self, buf: DeviceBuffer) -> np.ndarray:
        host: np.ndarray = buf.array.get()
        return host.view(buf.logical) if buf.logical.name == "bfloat16" else host

    # -- the host-staging path --------------------------------------------------------------
    @staticmethod
    def _down(buf: DeviceBuffer) -> np.ndarray:
        assert buf.host is not None
        buf.array.get(out=buf.host)
        return buf.host

    @staticmethod
    def _up(buf: DeviceBuffer) -> None:
        buf.array.set(buf.host)

    # -- collectives ------------------------------------------------------------------------
    def bind(self, collective: str, send: Any, recv: Any, op: str | None, root: int
             ) -> Callable[[], None]:
        if self.cuda_aware:
            return super().bind(collective, send, recv, op, root)
        return functools.partial(self.run, collective, send, recv, op, root)

    def broadcast(self, buf: Any, root: int) -> None:
        if self.cuda_aware:
            super().broadcast(buf, root)
            return
        if self.comm.Get_rank() == root:
            self._down(buf)
        super().broadcast(buf.host, root)
        if self.comm.Get_rank() != root:
            self._up(buf)

    def allreduce(self, send: Any, recv: Any, op: str) -> None:
        if self.cuda_aware:
            super().allreduce(send, recv, op)
            return
        super().allreduce(self._down(send), recv.host, op)   # in-place: the same mirror twice
        self._up(recv)

    def allgather(self, send: Any, recv: Any) -> None:
        if not self.cuda_aware:
            self._down(send)
            super().allgather(send.host, recv.host)   # a view's mirror aliases: in-place stays
            self._up(recv)
        elif _overlap(send, recv):
            self.comm.Allgather(self.MPI.IN_PLACE, recv)
        else:
            self.comm.Allgather(send, recv)

    def reduce_scatter(self, send: Any, recv: Any, op: str) -> None:
        if not self.cuda_aware:
            self._down(send)
            super().reduce_scatter(send.host, recv.host, op)
            self._up(recv)
        elif _overlap(send, recv):
            self.comm.Reduce_scatter_block(self.MPI.IN_PLACE, send, op=self._ops[op])
            if self.comm.Get_rank() != 0:
                # MPI leaves the result at the start; ccbench's convention is this rank's slice
                recv.array[...] = send.array[:recv.size]
                self.synchronize()       # the next MPI call must not read before the copy
        else:
            self.comm.Reduce_scatter_block(send, recv, op=self._ops[op])

    def alltoall(self, send: Any, recv: Any) -> None:
        if self.cuda_aware:
            super().alltoall(send, recv)
            return
        self._down(send)
        super().alltoall(send.host, recv.host)     # in-place: the same mirror twice
        self._up(recv)

    def send(self, buf: Any, peer: int, tag: int = 0) -> None:
        if self.cuda_aware:
            super().send(buf, peer, tag)
            return
        super().send(self._down(buf), peer, tag)

    def recv(self, buf: Any, peer: int, tag: int = 0) -> None:
        if self.cuda_aware:
            super().recv(buf, peer, tag)
            return
        super().recv(buf.host, peer, tag)
        self._up(buf)

    def synchronize(self) -> None:
        self.cupy.cuda.Device(self.device_index).synchronize()

