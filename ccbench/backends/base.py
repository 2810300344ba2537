"""The backend interface every library (and every algorithms/ schedule) plugs into.

A backend owns one communicator over all ranks of the run. The harness calls it
with the backend's *native* buffers (numpy arrays, torch tensors, cupy arrays),
made by `alloc` and filled with `copy_from_numpy`, so that nothing is converted
inside the timed region. In-place calls pass the same buffer (or, for allgather
and reduce-scatter, a `view` of it) as send and receive buffer: the collective's rule
(`ccbench.collectives.<name>.inplace`).
"""

from __future__ import annotations

import functools
import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from ccbench.backends.buffers import BufferPolicy, HostBuffers
from ccbench.backends.options import BackendOptions
from ccbench.collectives import get as get_collective

if TYPE_CHECKING:
    from algorithms.transport import Transport
    from ccbench.control import ControlClient

__all__ = ["Backend", "BackendFactory", "BackendOptions", "HostBuffers", "RankContext"]


@dataclass(kw_only=True)
class RankContext:
    """Where this process stands in the run, as the launcher described it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    launcher: str                   # torchrun | mpiexec | srun | local | single
    store: ControlClient            # control-plane key/value store hosted by rank 0
    hostname: str
    device: str = "cpu"             # cpu | cuda (the backend picks the index from local_rank)
    options: BackendOptions = field(default_factory=BackendOptions)

    def __post_init__(self) -> None:
        if not isinstance(self.options, BackendOptions):     # a dict from an older caller
            self.options = BackendOptions.from_mapping(self.options)


class BackendFactory(Protocol):
    """What the registry hands out: a Backend class, or an object that builds one (an
    algorithm over a transport). Both answer these before any rank is set up."""

    @property
    def needs_mpi_launcher(self) -> bool: ...

    def unavailable_reason(self) -> str | None: ...

    def refuses(self, dtype: np.dtype, op: str | None) -> str | None: ...

    def __call__(self, ctx: RankContext) -> Backend: ...


class Backend(ABC):
    """One library's collectives on one communicator. Its buffers are those of its buffer
    policy (`self.buffers`, host numpy unless the backend sets another)."""

    #: the registry name (an algorithm backend's is per instance: ring@mpi, tree@nccl)
    name: str
    #: the ranks must be started by an MPI launcher (mpiexec) for this backend
    needs_mpi_launcher: ClassVar[bool] = False
    #: the algorithm recorded for this backend's collectives ("native": the library's choice)
    algorithm: str = "native"

    @classmethod
    @abstractmethod
    def unavailable_reason(cls) -> str | None:
        """None when the backend can be used in this process, else why not (no import side effects
        beyond probing the library)."""

    def __init__(self, ctx: RankContext) -> None:
        self.ctx = ctx
        self.buffers: BufferPolicy = HostBuffers()

    # -- what it can do -------------------------------------------------------------
    @classmethod
    def refuses(cls, dtype: np.dtype, op: str | None) -> str | None:
        """Why this library can never run `op` (None: data movement) on `dtype`, whatever
        the ranks, devices and version: asked before any rank starts, so an explicit request
        is one error line instead of a run that skips it. None where it may run (`unsupported`
        still answers, per run)."""
        return None

    def unsupported(self, collective: str, dtype: np.dtype, op: str | None) -> str | None:
        """None if (collective, dtype, op) can run, else a short reason."""
        return self.refuses(dtype, op)

    @property
    def transport(self) -> str:
        return self.name

    @abstractmethod
    def info(self) -> dict[str, Any]:
        """library, library_version, device and an `env` dict of the variables that steer it."""

    # -- buffers (the policy's) ------------------------------------------------------
    def alloc(self, count: int, dtype: np.dtype) -> Any:
        return self.buffers.alloc(count, dtype)

    def copy_from_numpy(self, buf: Any, values: np.ndarray) -> None:
        self.buffers.copy_from_numpy(buf, values)

    def to_numpy(self, buf: Any) -> np.ndarray:
        return self.buffers.to_numpy(buf)

    def view(self, buf: Any, start: int, stop: int) -> Any:
        return self.buffers.view(buf, start, stop)

    # -- collectives (op is one of sum, max, min, prod, avg) ------------------------
    @abstractmethod
    def broadcast(self, buf: Any, root: int) -> None: ...

    @abstractmethod
    def allreduce(self, send: Any, recv: Any, op: str) -> None: ...

    @abstractmethod
    def allgather(self, send: Any, recv: Any) -> None: ...

    @abstractmethod
    def reduce_scatter(self, send: Any, recv: Any, op: str) -> None: ...

    @abstractmethod
    def alltoall(self, send: Any, recv: Any) -> None: ...

    @abstractmethod
    def reduce(self, send: Any, recv: Any, op: str, root: int) -> None:
        """The reduction lands in the root's recv; the others' recv is undefined afterwards."""

    @abstractmethod
    def sendrecv(self, send: Any, recv: Any) -> None:
        """send goes to rank+1 while recv takes rank-1's (ccbench.collectives.sendrecv.peers)."""

    # -- point to point (the transports of algorithms/) ------------------------------
    def send(self, buf: Any, peer: int, tag: int = 0) -> None:
        raise NotImplementedError(f"{self.name} has no point-to-point send")

    def recv(self, buf: Any, peer: int, tag: int = 0) -> None:
        raise NotImplementedError(f"{self.name} has no point-to-point recv")

    def point_to_point(self, device: bool) -> Transport | None:
        """An algorithms.transport over this backend's communicator, moving numpy arrays
        (device False) or CuPy arrays (device True); None when it has no such messages."""
        return None

    def device_stream(self) -> Any:
        """The CuPy stream this backend's library orders its device work on, for the kernels
        of algorithms run over it (None: CuPy's current stream)."""
        return None

    # -- control --------------------------------------------------------------------
    @abstractmethod
    def barrier(self) -> None: ...

    def synchronize(self) -> None:
        """Wait until the device finished every issued operation (no-op on host backends)."""

    def finalize(self) -> None:
        """Release the communicator; called once, also after a failed case."""

    def bind(self, collective: str, send: Any, recv: Any, op: str | None, root: int
             ) -> Callable[[], None]:
        """The call the timed loop makes, with every argument resolved once up front, so the
        loop measures the library and not Python dispatch. Backends may return the library's
        own bound function."""
        return functools.partial(self.run, collective, send, recv, op, root)

    def bind_batch(self, collective: str, send: Any, recv: Any, op: str | None, root: int
                   ) -> Batch:
        """`run(N)`: N back-to-back calls with no Python bytecode between them (the loop runs in
        C: itertools over the bound call). Backends with a cheaper native loop override it."""
        return starmap_batch(self.bind(collective, send, recv, op, root))

    def local_copy(self, collective: str, send: Any, recv: Any) -> Callable[[], Any] | None:
        """A local copy that the bound call makes besides the library's collective (None: it
        makes none). The harness times it alone and records it next to the collective."""
        return None

    def run(self, collective: str, send: Any, recv: Any, op: str | None, root: int) -> None:
        """Dispatch by collective name (the harness's one call site): the registry says which
        method runs it and with which arguments."""
        get_collective(collective).call(self, send, recv, op or "sum", root)


class BoundBackend(Backend):
    """A backend whose collectives are all its `bind()`: every method runs the bound call (the
    algorithm backends, and NCCL through CuPy, where bind builds the call, graph or group)."""

    def run(self, collective: str, send: Any, recv: Any, op: str | None, root: int) -> None:
        self.bind(collective, send, recv, op, root)()

    @abstractmethod
    def bind(self, collective: str, send: Any, recv: Any, op: str | None, root: int
             ) -> Callable[[], None]: ...

    def broadcast(self, buf: Any, root: int) -> None:
        self.run("broadcast", buf, buf, None, root)

    def allreduce(self, send: Any, recv: Any, op: str) -> None:
        self.run("allreduce", send, recv, op, 0)

    def allgather(self, send: Any, recv: Any) -> None:
        self.run("allgather", send, recv, None, 0)

    def reduce_scatter(self, send: Any, recv: Any, op: str) -> None:
        self.run("reduce-scatter", send, recv, op, 0)

    def alltoall(self, send: Any, recv: Any) -> None:
        self.run("alltoall", send, recv, None, 0)

    def reduce(self, send: Any, recv: Any, op: str, root: int) -> None:
        self.run("reduce", send, recv, op, root)

    def sendrecv(self, send: Any, recv: Any) -> None:
        self.run("sendrecv", send, recv, None, 0)


@dataclass(frozen=True)
class Batch:
    """`batch(N)` runs N back-to-back calls; `description` says how, for the record. `timed`,
    where the loop has its own clock (a compiled loop on host buffers), runs N calls and returns
    the seconds they took, read right around them: the harness then times nothing else."""

    run: Callable[[int], None]
    description: str
    timed: Callable[[int], float] | None = None

    def __call__(self, times: int) -> None:
        self.run(times)


STARMAP_LOOP = "itertools.starmap over the bound call: no Python bytecode between calls"


def starmap_batch(call: Callable[[], object]) -> Batch:
    """N calls of `call` driven by itertools (C), stopping at a truthy return (an error code)."""
    def run(times: int) -> None:
        if any(itertools.starmap(call, itertools.repeat((), times))):
            raise RuntimeError("the library call returned an error code")
    return Batch(run, STARMAP_LOOP)

