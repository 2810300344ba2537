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
import os
from typing import TYPE_CHECKING, Any

from ccbench.backends.base import BackendInfo, PointToPoint, RankContext
from ccbench.backends.buffers import CupyBuffers, CupyStagedBuffers, DeviceBuffer, pinned_allocator
from ccbench.backends.cupy_device import CUPY, cupy_missing_reason
from ccbench.backends.mpi import MPIBackend, MPIMessages, MPITransport
from ccbench.backends.mpi_loop import loaded_libmpi
from ccbench.backends.p2p import StagedTransport
from ccbench.errors import UsageError

if TYPE_CHECKING:
    from algorithms.transport import Transport

__all__ = ["CudaMPIBackend", "DeviceBuffer", "cuda_query_symbol", "cuda_support",
           "cupy_missing_reason"]

#: set to 1 or 0 to say whether the MPI library is CUDA-aware, overriding what it reports
OVERRIDE_VAR = "CCBENCH_MPI_CUDA_AWARE"


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


class CudaMPIBackend(MPIBackend):
    """The mpi backend on CuPy device arrays: the same collectives, with a buffer policy that
    hands MPI device memory (CUDA-aware) or host mirrors (host staging)."""

    name = "mpi"
    display_name = "MPI on CuPy device buffers"
    libraries = (*MPIBackend.libraries, CUPY)

    @classmethod
    def probe_version(cls) -> str | None:
        """The CuPy that holds its buffers (the MPI library is the host backend's)."""
        if cls.unavailable_reason() is not None:
            return None
        import cupy

        return f"cupy {cupy.__version__}"

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
        self.buffers = (CupyBuffers(cupy) if self.cuda_aware
                        else CupyStagedBuffers(cupy, pinned_allocator()))

    # -- metadata ---------------------------------------------------------------------------
    def info(self) -> BackendInfo:
        meta = super().info()
        runtime = self.cupy.cuda.runtime
        try:
            gpu = runtime.getDeviceProperties(self.device_index)["name"]
            gpu = gpu.decode() if isinstance(gpu, bytes) else str(gpu)
        except (AttributeError, KeyError, RuntimeError):
            gpu = "unknown"
        staged = self.buffers if isinstance(self.buffers, CupyStagedBuffers) else None
        meta.update({
            "device": f"cuda:{self.device_index}",
            "buffers": self.buffers.kind,
            "buffers_detected_by": self.detection,
            "device_shared": self.device_shared,
            "host_mirror": None if staged is None else "pinned" if staged.pinned else "pageable",
            "cupy": getattr(self.cupy, "__version__", "unknown"),
            "gpu": gpu,
        })
        meta["env"] = {**meta["env"], **{k: v for k, v in os.environ.items()
                                         if k.startswith(("CUDA_VISIBLE", OVERRIDE_VAR))}}
        return meta

    @property
    def p2p(self) -> PointToPoint[MPIBackend]:
        return _CudaMPIMessages(self)

    def synchronize(self) -> None:
        self.cupy.cuda.Device(self.device_index).synchronize()


class _CudaMPIMessages(MPIMessages):
    def transport(self, device: bool) -> Transport | None:
        backend = self.backend
        assert isinstance(backend, CudaMPIBackend)
        if not device:
            return None
        if backend.cuda_aware:
            return MPITransport(backend.comm, device_sync=backend.synchronize)
        return StagedTransport(MPITransport(backend.comm))
