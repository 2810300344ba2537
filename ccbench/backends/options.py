"""Typed settings a backend receives from the run (`RankContext.options`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ccbench.timeouts import DEFAULT_TIMEOUT_S

__all__ = ["DEFAULT_TIMEOUT_S", "BackendOptions"]



@dataclass(frozen=True, kw_only=True, slots=True)
class BackendOptions:
    """What a backend may be told besides where its rank stands."""

    #: seconds an operation may take; also bounds library initialisation (rendezvous, unique id
    #: exchange) so a missing peer ends the run instead of hanging it
    timeout: float = DEFAULT_TIMEOUT_S
    #: ranks live on more than one host (rendezvous addresses must not be loopback)
    multi_host: bool = False
    #: --nccl-algo / --nccl-proto as the user gave them (None: the library chooses)
    nccl_algo: str | None = None
    nccl_proto: str | None = None
    #: capture the measured call in a CUDA graph and time graph launches (nccl-cupy only)
    cuda_graph: bool = False
    #: --mpi-thread-level: the thread level MPI is initialised at (None: mpi4py's default)
    mpi_thread_level: str | None = None

    def __post_init__(self) -> None:
        if not self.timeout > 0:
            raise ValueError(f"timeout must be positive, not {self.timeout!r}")

    # values open-shaped: an older caller's plain dict, checked here against the fields
    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> BackendOptions:
        """From a plain dict (older callers); unknown keys are an error that names them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown backend option(s) {', '.join(unknown)} "
                             f"(valid: {', '.join(sorted(known))})")
        return cls(**{k: v for k, v in values.items() if v is not None})
