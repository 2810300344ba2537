"""Buffer policies: where a backend's buffers live and how data crosses to the host.

A backend holds one policy and delegates `alloc`, `view`, `copy_from_numpy` and `to_numpy` to
it. The library-facing side is two more calls, used by backends that hand buffers to a host
library (MPI) no matter where they live:

* ``wire(buf)``: what the library is given (the buffer itself, or its host mirror);
* ``stage_in(buf)`` before the library reads ``buf``, ``stage_out(buf)`` after it wrote it
  (no-ops unless the policy stages through the host).

Policies: `HostBuffers` (numpy), `TorchBuffers` (torch tensors on a torch device),
`CupyBuffers` (CuPy arrays, handed over as device memory: CUDA-aware MPI, NCCL) and
`CupyStagedBuffers` (CuPy arrays with page-locked host mirrors; the copies are timed).
``array(buf)`` gives the array ccbench's own algorithms run on (numpy or CuPy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from ccbench.dtypes import DTYPES, wire_dtype

#: the ml_dtypes types (bfloat16, float8) by name: no library reads them, their bits it can
_ML_DTYPES = {name: dtype for name, dtype in DTYPES.items() if wire_dtype(dtype) != dtype}

__all__ = ["BufferPolicy", "CupyBuffers", "CupyStagedBuffers", "DeviceBuffer", "HostBuffers",
           "TorchBuffers", "spans_overlap"]


def _span(buf: Any) -> tuple[int, int]:
    """[first byte, one past the last) of a contiguous numpy or device array."""
    iface = getattr(buf, "__array_interface__", None) or buf.__cuda_array_interface__
    start = int(iface["data"][0])
    return start, start + int(buf.nbytes)


def spans_overlap(a: Any, b: Any) -> bool:
    """Whether two contiguous buffers (numpy, CuPy, DeviceBuffer) share memory."""
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


class BufferPolicy:
    """Host numpy arrays; the base of every policy (its library-facing calls are no-ops)."""

    #: recorded as environment["buffers"]
    kind: ClassVar[str] = "host"
    #: buffers are handed to libraries as they are (no staging copies in the timed call)
    direct: ClassVar[bool] = True

    def alloc(self, count: int, dtype: np.dtype) -> Any:
        return np.empty(count, dtype=dtype)

    def view(self, buf: Any, start: int, stop: int) -> Any:
        return buf[start:stop]

    def copy_from_numpy(self, buf: Any, values: np.ndarray) -> None:
        np.copyto(buf, values)

    def to_numpy(self, buf: Any) -> np.ndarray:
        return np.array(buf, copy=True)

    def array(self, buf: Any) -> Any:
        """The numpy/CuPy array the algorithms' executor works on, sharing buf's memory."""
        return buf

    def wire(self, buf: Any) -> Any:
        return buf

    def stage_in(self, buf: Any) -> Any:
        """Before a library reads `buf`; returns what to give it."""
        return buf

    def stage_out(self, buf: Any) -> None:
        """After a library wrote `buf`."""


class HostBuffers(BufferPolicy):
    """numpy arrays in host memory (MPI, oneCCL, the algorithms over host transports)."""


class TorchBuffers(BufferPolicy):
    """torch tensors on one torch device (gloo on the CPU, nccl/rccl on a GPU)."""

    kind = "torch"

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch, self.device = torch, device

    def _torch_dtype(self, dtype: np.dtype) -> Any:
        if dtype.name.startswith("float8"):    # held as bytes: gloo has no float8 type, and
            return self.torch.uint8            # moving one needs none (reductions are refused)
        return getattr(self.torch, dtype.name)

    def _bits(self, dtype: np.dtype) -> tuple[np.dtype, Any] | None:
        """(numpy, torch) integer types of the same width that carry an ml_dtypes type's bits
        (torch reads no ml_dtypes array); None for numpy's own types."""
        if dtype.name not in _ML_DTYPES:
            return None
        return (np.dtype(np.int16), self.torch.int16) if dtype.itemsize == 2 else \
            (np.dtype(np.uint8), self.torch.uint8)

    def alloc(self, count: int, dtype: np.dtype) -> Any:
        return self.torch.empty(count, dtype=self._torch_dtype(dtype), device=self.device)

    def copy_from_numpy(self, buf: Any, values: np.ndarray) -> None:
        bits = self._bits(values.dtype)
        if bits is not None:                    # torch cannot read ml_dtypes' arrays: bits
            source = self.torch.from_numpy(values.view(bits[0])).view(
                self._torch_dtype(values.dtype))
        else:
            source = self.torch.from_numpy(np.ascontiguousarray(values))
        buf.copy_(source)

    def to_numpy(self, buf: Any) -> np.ndarray:
        host = buf.detach().cpu()
        logical = _ML_DTYPES.get(str(host.dtype).removeprefix("torch."))
        if logical is not None:
            bits = self._bits(logical)
            assert bits is not None
            return host.view(bits[1]).numpy().view(logical).copy()
        return host.numpy().copy()

    def array(self, buf: Any) -> Any:
        logical = _ML_DTYPES.get(str(buf.dtype).removeprefix("torch."))
        if logical is not None:
            bits = self._bits(logical)
            assert bits is not None
            return buf.view(bits[1]).numpy().view(logical)
        return buf.numpy()


class DeviceBuffer:
    """A CuPy array, the dtype it stands for (bfloat16 is stored as uint16: CuPy has none)
    and, when staged, its host mirror. A view shares the parent's device memory and mirror,
    so aliasing between send and receive buffers is the same on the host as on the device.
    It passes to mpi4py as the device array itself (__cuda_array_interface__)."""

    __slots__ = ("array", "host", "logical")

    def __init__(self, array: Any, logical: np.dtype, host: np.ndarray | None) -> None:
        self.array, self.logical, self.host = array, logical, host

    def __getitem__(self, index: slice) -> DeviceBuffer:
        return DeviceBuffer(self.array[index], self.logical,
                            None if self.host is None else self.host[index])

    def __setitem__(self, index: Any, value: DeviceBuffer) -> None:
        self.array[index] = value.array

    @property
    def dtype(self) -> np.dtype:
        """The storage dtype (uint16 for bfloat16), as a library sees it."""
        return np.dtype(self.array.dtype)

    # open-shaped: the CUDA Array Interface as CuPy gives it (its version decides the keys)
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return self.array.__cuda_array_interface__    # type: ignore[no-any-return]

    @property
    def ptr(self) -> int:
        return int(self.__cuda_array_interface__["data"][0])

    @property
    def size(self) -> int:
        return int(self.array.size)

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)


def _storage(dtype: np.dtype) -> np.dtype:
    return wire_dtype(dtype)        # bfloat16 and float8 as their bit patterns: CuPy has none


class CupyBuffers(BufferPolicy):
    """CuPy arrays handed to the library as device memory."""

    kind = "cuda-aware"

    def __init__(self, cupy: Any) -> None:
        self.cupy = cupy

    def _mirror(self, count: int, storage: np.dtype) -> np.ndarray | None:
        return None

    def alloc(self, count: int, dtype: np.dtype) -> DeviceBuffer:
        storage = _storage(dtype)
        return DeviceBuffer(self.cupy.empty(count, dtype=storage), dtype,
                            self._mirror(count, storage))

    def copy_from_numpy(self, buf: DeviceBuffer, values: np.ndarray) -> None:
        raw = values.view(wire_dtype(values.dtype))
        buf.array.set(np.ascontiguousarray(raw))
        # a copy from pageable memory may return before it lands; a library (CUDA-aware MPI,
        # possibly over RDMA) must not read the buffer before then. Outside the timed region.
        self.cupy.cuda.Device().synchronize()

    def to_numpy(self, buf: DeviceBuffer) -> np.ndarray:
        host: np.ndarray = buf.array.get()
        return host.view(buf.logical)

    def array(self, buf: DeviceBuffer) -> Any:
        return buf.array


class CupyStagedBuffers(CupyBuffers):
    """CuPy arrays with a host mirror each (page-locked when CuPy can allocate it): a library
    that cannot read device memory gets the mirror; the copies are part of the timed call."""

    kind = "host-staging"
    direct = False

    def __init__(self, cupy: Any, pinned: Callable[[int, np.dtype], np.ndarray] | None) -> None:
        super().__init__(cupy)
        self.pinned = pinned

    def _mirror(self, count: int, storage: np.dtype) -> np.ndarray | None:
        return self.pinned(count, storage) if self.pinned else np.empty(count, storage)

    def wire(self, buf: DeviceBuffer) -> np.ndarray:
        assert buf.host is not None
        return buf.host

    def stage_in(self, buf: DeviceBuffer) -> np.ndarray:
        assert buf.host is not None
        buf.array.get(out=buf.host)
        return buf.host

    def stage_out(self, buf: DeviceBuffer) -> None:
        buf.array.set(buf.host)


def pinned_allocator() -> Callable[[int, np.dtype], np.ndarray] | None:
    """cupyx.empty_pinned when CuPy has it (page-locked mirrors copy faster), else None."""
    try:
        import cupyx
    except ImportError:
        return None
    return getattr(cupyx, "empty_pinned", None)
