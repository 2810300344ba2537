"""nccl and rccl: torch.distributed's "nccl" process group on device tensors.

On a CUDA build of torch this is NCCL; on a ROCm build (torch.version.hip set) the same
process group is backed by RCCL and is labelled "rccl" in results. Each rank drives the device
with index `local_rank` (one rank per device; sharing a device is refused because NCCL rejects
duplicate devices in one communicator).

Timing: collectives are launched asynchronously on NCCL's stream, so `synchronize` waits for
the device (torch.cuda.synchronize); the harness calls it after every op in per-op timing and
once per batch in pipelined timing.

Out-of-place allreduce: ncclAllReduce itself has separate send and receive buffers, but
torch.distributed.all_reduce is in-place only. The out-of-place case therefore copies send into
recv on the device and reduces recv in place; the copy is inside the timed region and the
record says so (environment["allreduce_out_of_place"]); reduce (ncclReduce behind
torch.distributed.reduce, also in place only) does the same. allgather, reduce-scatter and all-to-all
map to NCCL's own out-of-place calls; their in-place cases use NCCL's in-place layout (the
rank's shard inside the full buffer).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ccbench.backend_facts import BACKENDS
from ccbench.backends.base import BackendInfo, PointToPoint, RankContext
from ccbench.backends.torch_dist import (
    GroupedTorchTransport,
    TorchDistBackend,
    TorchMessages,
    torch_missing_reason,
)
from ccbench.dtypes import is_float8
from ccbench.errors import UsageError

if TYPE_CHECKING:
    from algorithms.transport import Transport

__all__ = ["NCCLBackend", "RCCLBackend", "format_nccl_version", "nccl_version"]

#: NCCL learned bfloat16 in 2.10
_BF16_SINCE = (2, 10)


def format_nccl_version(raw: Any) -> str:
    """torch.cuda.nccl.version() as text: a tuple (2, 21, 5) or (2, 21, 5, 'a0') in recent torch,
    an int code (2708 = 2.7.8, 21905 = 2.19.5) in old ones."""
    if isinstance(raw, tuple):
        numbers = [str(part) for part in raw if isinstance(part, int)]
        suffix = "".join(str(part) for part in raw if not isinstance(part, int))
        return ".".join(numbers) + (f"-{suffix}" if suffix else "")
    if isinstance(raw, int):
        # NCCL_VERSION_CODE: major*1000 + minor*100 + patch before 2.9, major*10000 + minor*100
        # + patch since
        if raw >= 20900:
            return f"{raw // 10000}.{raw // 100 % 100}.{raw % 100}"
        return f"{raw // 1000}.{raw // 100 % 10}.{raw % 100}"
    return str(raw)


def nccl_version() -> tuple[str | None, str | None]:
    """(version text, None) or (None, why not). Never raises; does not initialise a device."""
    missing = torch_missing_reason()
    if missing:
        return None, missing
    import torch

    try:
        raw = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError) as exc:     # CPU builds lack torch._C._nccl_version
        return None, f"this torch build has no NCCL ({type(exc).__name__}: {exc})"
    return format_nccl_version(raw), None


def nccl_version_tuple(text: str) -> tuple[int, ...]:
    """`2.18.3-1` -> (2, 18, 3): the leading numeric parts."""
    parts = []
    for part in text.split("-")[0].split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


class NCCLBackend(TorchDistBackend):
    """NCCL through torch.distributed on CUDA tensors."""

    name = "nccl"
    display_name = BACKENDS[name].display_name
    process_group_backend = "nccl"
    default_device = "cuda"
    reads_options = frozenset({"nccl_algo", "nccl_proto"})
    library_environment = {"nccl_algo": "NCCL_ALGO", "nccl_proto": "NCCL_PROTO"}
    carries_algorithms = True
    #: what results call the library
    library: ClassVar[str] = "nccl"
    #: variables that steer the library, copied into every record
    env_prefixes: ClassVar[tuple[str, ...]] = ("NCCL_", "TORCH_NCCL_", "CUDA_VISIBLE_DEVICES",
                                               "CUDA_DEVICE_MAX_CONNECTIONS")

    # -- availability -----------------------------------------------------------------------
    @classmethod
    def unavailable_reason(cls) -> str | None:
        missing = torch_missing_reason()
        if missing:
            return missing
        import torch

        build = cls._build_reason(torch)
        if build:
            return build
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_nccl_available():
            return f"torch {torch.__version__} was built without NCCL (torch.distributed has no nccl)"
        if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
            return cls._no_device_reason()
        return None

    @classmethod
    def _build_reason(cls, torch: Any) -> str | None:
        if getattr(torch.version, "hip", None):
            return (f"torch {torch.__version__} is a ROCm build (HIP {torch.version.hip}): its "
                    f"nccl process group is RCCL; use --backend rccl")
        if not getattr(torch.version, "cuda", None):
            return (f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None); "
                    f"install a CUDA build of torch")
        return None

    @classmethod
    def _no_device_reason(cls) -> str:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        return f"no CUDA device is visible{where}"

    @classmethod
    def probe_version(cls) -> str | None:
        """The library version, for `ccbench doctor`, without initialising a device."""
        return nccl_version()[0]

    # -- setup ------------------------------------------------------------------------------
    def __init__(self, ctx: RankContext) -> None:
        super().__init__(ctx)
        self._library_version = nccl_version()[0] or "unknown"

    def _device(self) -> Any:
        torch, ctx = self.torch, self.ctx
        if ctx.device != "cuda":
            raise UsageError(f"backend {self.name!r} runs on device tensors only: use --device "
                             f"cuda (or auto), not --device {ctx.device}")
        count = torch.cuda.device_count()
        # every rank of the node sees the same counts, so all of them (rank 0 too, which is the
        # one that prints) refuse before any rendezvous instead of leaving the others waiting
        if ctx.local_world_size > count or ctx.local_rank >= count:
            raise UsageError(f"{ctx.local_world_size} ranks on {ctx.hostname} but only {count} "
                             f"device(s) visible: {self.name} needs one device per rank")
        torch.cuda.set_device(ctx.local_rank)
        return torch.device("cuda", ctx.local_rank)

    # -- capabilities -----------------------------------------------------------------------
    @classmethod
    def refuses(cls, dtype: np.dtype, op: str | None) -> str | None:
        if op is not None and is_float8(dtype):
            return (f"unsupported by {cls.name}: {op} on {dtype.name} (ccbench moves float8 "
                    f"through torch's NCCL group as bytes and does not reduce it)")
        return None

    def unsupported_case(self, collective: str, dtype: np.dtype, op: str | None
                         ) -> str | None:
        refused = self.refuses(dtype, op)
        if refused:
            return refused
        if op == "avg" and nccl_version_tuple(self._library_version) < _BF16_SINCE:
            return (f"unsupported by {self.name}: avg needs NCCL >= 2.10, "
                    f"this is {self._library_version}")
        if dtype.name == "bfloat16" and nccl_version_tuple(self._library_version) < _BF16_SINCE:
            return (f"unsupported by {self.name}: bfloat16 needs NCCL >= 2.10, "
                    f"this is {self._library_version}")
        return None

    @property
    def transport(self) -> str:
        """How ccbench reaches the library (records: library nccl, transport torch)."""
        return "torch"

    # -- point to point: the algorithms over NCCL -------------------------------------------
    @property
    def p2p(self) -> PointToPoint[TorchDistBackend]:
        return NCCLMessages(self)

    def _tensor_of(self) -> Callable[[Any], Any]:
        """CuPy slice -> the uint8 CUDA tensor over the same memory (no copy)."""
        import cupy

        torch, device = self.torch, self.device

        def tensor_of(buf: Any) -> Any:
            return torch.as_tensor(buf.view(cupy.uint8), device=device)
        return tensor_of

    def barrier(self) -> None:
        # naming the device keeps torch from guessing it (and warning) for the barrier's allreduce
        self.dist.barrier(group=self.group, device_ids=[self.device.index])

    def synchronize(self) -> None:
        self.torch.cuda.synchronize(self.device)

    # -- metadata ---------------------------------------------------------------------------
    def info(self) -> BackendInfo:
        torch = self.torch
        props = torch.cuda.get_device_properties(self.device)
        options = self.ctx.options
        return {
            "library": self.library,
            "library_version": self._library_version,
            "device": f"cuda:{self.device.index}",
            "env": self._env(*self.env_prefixes),
            "gpu": props.name,
            "gpu_count": torch.cuda.device_count(),
            "gpu_memory_bytes": int(props.total_memory),
            "compute_capability": f"{props.major}.{props.minor}",
            "torch": torch.__version__,
            "cuda_runtime": torch.version.cuda,
            "hip_runtime": getattr(torch.version, "hip", None),
            # what the user asked for (--nccl-algo/--nccl-proto); None: the library chose
            "nccl_algo": options.nccl_algo or os.environ.get("NCCL_ALGO"),
            "nccl_proto": options.nccl_proto or os.environ.get("NCCL_PROTO"),
            "allreduce_out_of_place": "device copy send->recv, then in-place all_reduce "
                                      "(torch.distributed has no out-of-place all_reduce)",
            "reduce_out_of_place": "device copy send->recv, then in-place reduce "
                                   "(torch.distributed's reduce works in place)",
        }


class NCCLMessages(TorchMessages):
    """torch.distributed's send and recv, and the algorithms' transport on CUDA memory."""

    def _nccl(self) -> NCCLBackend:
        backend = self.backend
        assert isinstance(backend, NCCLBackend)
        return backend

    def transport(self, device: bool) -> Transport | None:
        """torch.distributed send/recv on CuPy arrays' memory, one NCCL group per step, waited
        for on the stream (see GroupedTorchTransport)."""
        backend = self._nccl()
        if not device or backend.group is not None:     # the transport addresses global ranks
            return None
        return GroupedTorchTransport(backend.dist, backend._tensor_of(), on_stream=True)

    def stream(self) -> Any:
        """torch's current stream, as CuPy sees it: NCCL's point-to-point calls wait for it
        before they start and make it wait for them, so kernels queued there are ordered with
        the transfers without the host waiting."""
        import cupy

        backend = self._nccl()
        cupy.cuda.Device(backend.device.index).use()
        return cupy.cuda.ExternalStream(
            backend.torch.cuda.current_stream(backend.device).cuda_stream)


class RCCLBackend(NCCLBackend):
    """RCCL: the same process group on a ROCm build of torch (devices are still 'cuda' there)."""

    name = "rccl"
    display_name = BACKENDS[name].display_name
    library = "rccl"
    carries_algorithms = False       # ring@rccl has not been run on a ROCm device
    env_prefixes = ("NCCL_", "RCCL_", "TORCH_NCCL_", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                    "CUDA_VISIBLE_DEVICES", "HSA_")

    @classmethod
    def _build_reason(cls, torch: Any) -> str | None:
        if getattr(torch.version, "hip", None):
            return None
        if getattr(torch.version, "cuda", None):
            return (f"torch {torch.__version__} is a CUDA build (torch.version.hip is None): "
                    f"RCCL needs a ROCm build of torch; use --backend nccl")
        return (f"torch {torch.__version__} is a CPU-only build (torch.version.hip is None); "
                f"install a ROCm build of torch")

    @classmethod
    def _no_device_reason(cls) -> str:
        shown = [f"{name}={os.environ[name]!r}" for name in
                 ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
                 if name in os.environ]
        where = f" ({', '.join(shown)})" if shown else ""
        return f"no ROCm device is visible{where}"
