"""gloo: torch.distributed's CPU library."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ccbench.backend_facts import BACKENDS
from ccbench.backends.base import BackendInfo, PointToPoint
from ccbench.backends.torch_dist import (
    TORCH_TIMED_CALL,
    TorchDistBackend,
    TorchMessages,
    TorchTransport,
    torch_missing_reason,
)
from ccbench.dtypes import is_float8

if TYPE_CHECKING:
    from algorithms.transport import Transport


class GlooBackend(TorchDistBackend):
    name = "gloo"
    display_name = BACKENDS[name].display_name
    process_group_backend = "gloo"
    carries_algorithms = True
    interface_variable = "GLOO_SOCKET_IFNAME"

    @classmethod
    def probe_version(cls) -> str | None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"torch {version('torch')}"
        except PackageNotFoundError:
            return None

    @classmethod
    def unavailable_reason(cls) -> str | None:
        missing = torch_missing_reason()
        if missing:
            return missing
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_gloo_available():
            return "this torch build has no gloo"
        return None

    @classmethod
    def unavailable_before_launch(cls) -> str | None:
        # importing torch to ask for gloo would cost the launcher ~1.2 s of CPU before the
        # first rank starts; a torch without gloo is refused by every rank in one line
        return torch_missing_reason()

    @classmethod
    def refuses(cls, dtype: np.dtype, op: str | None) -> str | None:
        if is_float8(dtype) and op is not None:
            return (f"unsupported by gloo: {op} on {dtype.name} (gloo has no float8 type: "
                    f"it moves float8 as bytes but cannot reduce it)")
        if op == "avg" and dtype.kind in "iu":
            return (f"unsupported by gloo: avg on {dtype.name} (torch's gloo averages "
                    f"floating-point types only)")
        return None

    def info(self) -> BackendInfo:
        return {"library": "gloo", "library_version": f"torch {self.torch.__version__}",
                "device": "cpu", "env": self._env("GLOO_", "TORCH_", "OMP_"),
                "torch_threads": self.torch.get_num_threads(), "timed_call": TORCH_TIMED_CALL,
                "allreduce_out_of_place": "recv.copy_(send), then in-place all_reduce, both "
                                          "timed (torch.distributed has no out-of-place "
                                          "all_reduce); method.local_copy_us: the copy alone",
                "reduce_out_of_place": "recv.copy_(send), then in-place reduce, both timed "
                                       "(torch.distributed's reduce works in place)"}

    @property
    def p2p(self) -> PointToPoint[TorchDistBackend]:
        return _GlooMessages(self)


class _GlooMessages(TorchMessages):
    def transport(self, device: bool) -> Transport | None:
        backend = self.backend
        if device or backend.group is not None:     # the transport addresses global ranks
            return None
        return TorchTransport.host(backend.dist, backend.torch)
