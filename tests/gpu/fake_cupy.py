"""A stand-in for CuPy over host memory, so the device-buffer code paths run without a GPU.

Arrays live in numpy memory but behave like CuPy's where ccbench relies on it: no implicit
conversion to numpy (np.asarray raises, as with CuPy), explicit get()/set() transfers, slicing
returns views, and __cuda_array_interface__ hands mpi4py a raw pointer (host memory here, which
an MPI library reads fine). Counters record transfers and synchronizations for the tests.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import types
from typing import Any

import numpy as np

__version__ = "0.0.0+fake"

COUNTERS = {"get": 0, "set": 0, "synchronize": 0, "empty": 0, "kernel": 0, "stream_use": 0,
            "memcpy": 0, "graph_launch": 0, "capture": 0, "event_record": 0, "wait_event": 0}
_COUNT_LOCK = threading.Lock()


def _count(name: str) -> None:
    with _COUNT_LOCK:          # ranks as threads count into the same table
        COUNTERS[name] += 1


#: devices the fake runtime reports (ccbench_with.py --fake-devices N)
DEVICE_COUNT = 1

uint8, uint16 = np.uint8, np.uint16


class ndarray:  # noqa: N801  (the CuPy name)
    __slots__ = ("_host",)

    def __init__(self, host: np.ndarray) -> None:
        self._host = host

    # -- what CuPy arrays have --------------------------------------------------------------
    @property
    def dtype(self) -> np.dtype:
        return self._host.dtype

    @property
    def size(self) -> int:
        return int(self._host.size)

    @property
    def nbytes(self) -> int:
        return int(self._host.nbytes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._host.shape)

    @property
    def itemsize(self) -> int:
        return int(self._host.itemsize)

    @property
    def data(self) -> types.SimpleNamespace:
        """CuPy's MemoryPointer: .ptr is the address (host memory here)."""
        return types.SimpleNamespace(ptr=int(self._host.ctypes.data))

    def copy(self) -> ndarray:
        return ndarray(self._host.copy())

    def __len__(self) -> int:
        return len(self._host)

    def __getitem__(self, index: Any) -> ndarray:
        view = self._host[index]
        if not isinstance(view, np.ndarray):
            raise TypeError("fake cupy: only slices are supported")
        return ndarray(view)

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(value, np.ndarray):
            raise TypeError("fake cupy: assigning a numpy array to a device array; use set()")
        self._host[index] = value._host if isinstance(value, ndarray) else value

    def get(self, stream: Any = None, order: str = "C", out: np.ndarray | None = None
            ) -> np.ndarray:
        _count("get")
        if out is None:
            return self._host.copy()
        np.copyto(out, self._host)
        return out

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        _count("set")
        if not isinstance(arr, np.ndarray):
            raise TypeError("fake cupy: set() takes a numpy array")
        if arr.shape != self._host.shape or arr.dtype != self._host.dtype:
            raise ValueError(f"fake cupy: set() of {arr.dtype}{arr.shape} into "
                             f"{self._host.dtype}{self._host.shape}")
        np.copyto(self._host, arr)

    def view(self, dtype: Any) -> ndarray:
        return ndarray(self._host.view(dtype))

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError("Implicit conversion to a NumPy array is not allowed. "
                        "Please use `.get()` to construct a NumPy array explicitly.")

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        if not self._host.flags.c_contiguous:
            raise ValueError("fake cupy: non-contiguous array")
        return {"shape": self._host.shape, "typestr": self._host.dtype.str,
                "data": (int(self._host.ctypes.data), False), "version": 3,
                "strides": None, "stream": None}


def empty(shape: Any, dtype: Any = float) -> ndarray:
    _count("empty")
    return ndarray(np.empty(shape, dtype=dtype))


def empty_like(array: ndarray) -> ndarray:
    return empty(array.shape, array.dtype)


def asnumpy(array: ndarray) -> np.ndarray:
    return array.get()


class ElementwiseKernel:
    """A kernel of algorithms.kernels.CupyReducer, run by its CPU twin (TwinReducer) on the
    host memory: the kernel's parameter types are checked against the arrays, as CuPy would."""

    def __init__(self, in_params: str, out_params: str, body: str, name: str) -> None:
        _, op, dtype = name.split("_", 2)             # ccbench_<op>_<dtype>
        from algorithms.kernels import TwinReducer

        self.types = [part.split()[0] for part in f"{in_params}, {out_params}".split(",")]
        self.reduce = TwinReducer()(op, dtype)

    def __call__(self, a: ndarray, b: ndarray, out: ndarray) -> None:
        got = [np.dtype(x.dtype).name for x in (a, b, out)]
        if got != self.types:
            raise TypeError(f"fake cupy: kernel of {self.types} called on {got}")
        _count("kernel")
        self.reduce(a._host, b._host, out._host)


class Stream:
    """Streams do nothing on the host (every call is synchronous); they count being made
    current and record CUDA-graph captures so the capture logic runs."""

    _current: Stream | None = None

    def __init__(self, non_blocking: bool = False, ptr: int = 0) -> None:
        self.ptr = ptr or id(self)
        self.capturing: list[Any] | None = None
        _STREAMS[self.ptr] = self

    def use(self) -> Stream:
        _count("stream_use")
        Stream._current = self
        return self

    def synchronize(self) -> None:
        if self.capturing is not None:      # CUDA refuses it: the capture would be invalidated
            raise RuntimeError("fake cupy: synchronize on a capturing stream")
        _count("synchronize")

    def wait_event(self, event: Any) -> None:
        if not isinstance(event, Event):
            raise TypeError("fake cupy: wait_event takes an Event")
        _count("wait_event")

    def begin_capture(self, mode: Any = None) -> None:
        if self.capturing is not None:
            raise RuntimeError("fake cupy: the stream is already capturing")
        _count("capture")
        self.capturing = []

    def is_capturing(self) -> bool:
        return self.capturing is not None

    def end_capture(self) -> _Graph:
        if self.capturing is None:
            raise RuntimeError("fake cupy: the stream is not capturing")
        calls, self.capturing = self.capturing, None
        return _Graph(calls)

    def __enter__(self) -> Stream:
        return self.use()

    def __exit__(self, *exc: Any) -> None:
        Stream._current = None


_STREAMS: dict[int, Stream] = {}


class ExternalStream(Stream):
    def __init__(self, ptr: int) -> None:
        super().__init__(ptr=ptr or 1)


class _Graph:
    def __init__(self, calls: list[Any]) -> None:
        self.calls = calls

    def launch(self, stream: Any = None) -> None:
        _count("graph_launch")
        for call in self.calls:
            call()


class Event:
    def __init__(self, block: bool = False, disable_timing: bool = False,
                 interprocess: bool = False) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        _count("event_record")

    def synchronize(self) -> None:
        _count("synchronize")


def get_current_stream() -> Stream:
    return Stream._current or Stream(ptr=2)


class _Device:
    def __init__(self, index: int = 0) -> None:
        self.id = index

    def use(self) -> None:
        pass

    def synchronize(self) -> None:
        _count("synchronize")


class _Runtime:
    memcpyDeviceToDevice = 3  # noqa: N815  (the CUDA name)
    is_hip = False

    @staticmethod
    def getDeviceCount() -> int:  # noqa: N802  (the CUDA name)
        return DEVICE_COUNT

    @staticmethod
    def memcpyAsync(dst: int, src: int, size: int, kind: int, stream: int) -> None:  # noqa: N802
        """cudaMemcpyAsync between fake device (host) addresses, recorded when the stream is
        capturing a graph."""
        if kind != _Runtime.memcpyDeviceToDevice:
            raise ValueError("fake cupy: only device-to-device copies")

        def copy() -> None:
            _count("memcpy")
            ctypes.memmove(dst, src, size)
        owner = _STREAMS.get(stream)
        if owner is not None and owner.capturing is not None:
            owner.capturing.append(copy)
        else:
            copy()

    @staticmethod
    def getDeviceProperties(index: int) -> dict[str, Any]:  # noqa: N802
        return {"name": b"Fake device over host memory", "totalGlobalMem": 0}

    @staticmethod
    def runtimeGetVersion() -> int:  # noqa: N802
        return 0


cuda = types.SimpleNamespace(Device=_Device, runtime=_Runtime(), Stream=Stream,
                             ExternalStream=ExternalStream, Event=Event,
                             get_current_stream=get_current_stream)


def install() -> types.ModuleType:
    """Make `import cupy` give this module (and `import cupyx` fail, as without pinned memory),
    and `cupy.cuda.nccl` the fake NCCL binding of fake_nccl.py."""
    import fake_nccl

    module = sys.modules[__name__]
    sys.modules["cupy"] = module
    sys.modules["cupy.cuda"] = cuda  # type: ignore[assignment]
    sys.modules["cupy.cuda.nccl"] = fake_nccl
    cuda.nccl = fake_nccl
    return module
