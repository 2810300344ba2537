"""CPU twins of the device backends: the nccl backend's own code (device choice, barrier,
metadata, the torch.distributed collectives, and the point-to-point transport the algorithms
run over as `ring@nccl`) over gloo and host tensors, with the device calls (set_device,
synchronize, device properties, CUDA tensors over CuPy memory) replaced.

Used through tests/gpu/ccbench_with.py --nccl-twin; at the end of the run each rank writes its
counters to $CCBENCH_TWIN_COUNTS.<rank>.json when that variable is set.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any

from ccbench.backends.base import BackendInfo, PointToPoint
from ccbench.backends.nccl import NCCLBackend, NCCLMessages


class _TwinMessages(NCCLMessages):
    def stream(self) -> Any:
        import cupy  # the fake, installed by ccbench_with.py

        return cupy.cuda.ExternalStream(1)


class NCCLCpuTwin(NCCLBackend):
    """NCCLBackend with process group gloo and the device replaced by the CPU."""

    name = "nccl"
    process_group_backend = "gloo"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    def __init__(self, ctx: Any) -> None:
        self.counts = {"set_device": 0, "synchronize": 0, "run": 0, "barrier": 0, "local_copy": 0}
        self._in_bound_call = False
        super().__init__(ctx)
        self._library_version = "cpu-twin (gloo)"

    def _device(self) -> Any:
        torch = self.torch
        real_count, real_set = torch.cuda.device_count, torch.cuda.set_device
        torch.cuda.device_count = lambda: self.ctx.local_world_size
        torch.cuda.set_device = lambda index: self._count("set_device")
        try:
            device = super()._device()        # the real checks and set_device call
        finally:
            torch.cuda.device_count, torch.cuda.set_device = real_count, real_set
        self.device_index = device.index
        return torch.device("cpu")

    def unsupported(self, collective: str, dtype: Any, op: str | None) -> str | None:
        # the class's refusals (float8 reductions); not the NCCL version checks: gloo underneath
        return self.refuses(dtype, op)

    def _tensor_of(self) -> Any:
        """Fake CuPy slices (host memory) -> uint8 CPU tensors over the same memory; the real
        code makes CUDA tensors with torch.as_tensor."""
        import numpy as np

        torch = self.torch

        def tensor_of(buf: Any) -> Any:
            return torch.from_numpy(buf.view(np.uint8)._host)
        return tensor_of

    @property
    def p2p(self) -> PointToPoint[Any]:
        return _TwinMessages(self)

    def _count(self, what: str) -> None:
        self.counts[what] += 1

    def barrier(self) -> None:
        self._count("barrier")
        self.dist.barrier()

    def synchronize(self) -> None:
        self._count("synchronize")

    def local_copy(self, collective: str, send: Any, recv: Any) -> Any:
        copy = super().local_copy(collective, send, recv)
        if copy is None:
            return None

        def counted() -> Any:
            self._count("local_copy")
            return copy()
        return counted

    def bind(self, collective: str, send: Any, recv: Any, op: str | None, root: int) -> Any:
        """The timed call the real backend binds, counted as one run per call."""
        call = super().bind(collective, send, recv, op, root)

        def counted() -> None:
            self._counted_call(call)
        return counted

    def run(self, collective: str, send: Any, recv: Any, op: str | None, root: int) -> None:
        self._counted_call(lambda: super(NCCLCpuTwin, self).run(collective, send, recv, op, root))

    def _counted_call(self, call: Any) -> None:
        """One run per call, whether run() binds and calls or a bound call falls back to run()."""
        if self._in_bound_call:
            call()
            return
        self._count("run")
        self._in_bound_call = True
        try:
            call()
        finally:
            self._in_bound_call = False

    def info(self) -> BackendInfo:
        torch = self.torch
        props = SimpleNamespace(name="CPU twin", total_memory=0, major=0, minor=0)
        real = torch.cuda.get_device_properties, torch.cuda.device_count
        torch.cuda.get_device_properties = lambda device: props
        torch.cuda.device_count = lambda: self.ctx.local_world_size
        saved_device = self.device
        self.device = SimpleNamespace(index=self.device_index)
        try:
            meta = super().info()
        finally:
            torch.cuda.get_device_properties, torch.cuda.device_count = real
            self.device = saved_device
        meta["cpu_twin"] = True  # type: ignore[typeddict-unknown-key]  # a key of the twin
        return meta

    def finalize(self) -> None:
        path = os.environ.get("CCBENCH_TWIN_COUNTS")
        if path:
            with open(f"{path}.{self.ctx.rank}.json", "w", encoding="utf-8") as handle:
                json.dump(self.counts, handle)
        super().finalize()
