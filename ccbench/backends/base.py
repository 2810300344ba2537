"""The backend interface every library (and every algorithms/ schedule) plugs into.

A backend owns one communicator over all ranks of the run. The harness calls it
with the backend's *native* buffers (numpy arrays, torch tensors, cupy arrays),
made by `alloc` and filled with `copy_from_numpy`, so that nothing is converted
inside the timed region. In-place calls pass the same buffer (or, for allgather
and reduce-scatter, a `view` of it) as send and receive buffer: the collective's rule
(`ccbench.collectives.<name>.inplace`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NotRequired, Protocol, Required, TypedDict, TypeVar

import numpy as np

from ccbench.backends.buffers import BufferPolicy, HostBuffers
from ccbench.backends.options import BackendOptions
from ccbench.collectives import get as get_collective
from ccbench.errors import RunFailure

if TYPE_CHECKING:
    from algorithms.transport import Transport
    from ccbench.run.control import ControlClient

__all__ = ["AlltoallvCall", "Backend", "BackendFactory", "BackendInfo", "BackendOptions", "Builder",
           "Exchange",
           "HostBuffers", "Library", "Message", "MessageCall", "PointToPoint", "RankContext", "ReplayExtras",
           "SubCommunicators",
           "Support",
           "in_sequence", "timed_as"]


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
    # the global rank of each rank of this communicator, on a sub-communicator (empty: the
    # world, where the two agree); the control store knows each process by its global rank
    members: tuple[int, ...] = ()

    def global_rank(self, rank: int) -> int:
        """The global rank of this communicator's `rank` (the store's name for it)."""
        return self.members[rank] if self.members else rank

    def __post_init__(self) -> None:
        if not isinstance(self.options, BackendOptions):     # a dict from an older caller
            self.options = BackendOptions.from_mapping(self.options)


@dataclass(frozen=True)
class Library:
    """A library backends are built on, as `ccbench doctor`'s libraries table shows it:
    `probe()` its facts as plain data (found, version ...; a missing library is found False
    with a reason, never an exception), `lines(facts)` the table's lines for them. Backends
    sharing a library share the object (doctor lists each name once)."""

    name: str
    probe: Callable[[], dict[str, Any]]
    lines: Callable[[dict[str, Any]], list[str]]


class BackendInfo(TypedDict, total=False):
    """What `Backend.info()` says about the library a run measured. The first four keys are
    every backend's: records hold library, library_version and device as fields, env under
    environment.backend. Of the rest, those that change what is measured (buffers, nccl_algo,
    nccl_proto, mpi_thread_level, cuda_graph, timed_call ...; `<collective>_out_of_place`, how
    that collective's out-of-place call is made, on its out-of-place records only) go to the
    record's method block, every other one to its environment."""

    library: Required[str]
    library_version: Required[str]
    device: Required[str]                   # cpu | cuda:<index>
    env: Required[dict[str, str]]           # the environment variables that steer the library
    # -- how the measured call is made
    timed_call: NotRequired[str]
    allreduce_out_of_place: NotRequired[str]
    reduce_out_of_place: NotRequired[str]
    stream: NotRequired[str]
    cuda_graph: NotRequired[bool | None]
    algorithm: NotRequired[str]             # an algorithms/ schedule run over the library
    transport_display_name: NotRequired[str]    # the display name of that library's backend
    reductions: NotRequired[str]
    # -- the library's settings
    mpi_thread_level: NotRequired[str | None]
    nccl_algo: NotRequired[str | None]
    nccl_proto: NotRequired[str | None]
    torch_threads: NotRequired[int]
    library_path: NotRequired[str]
    libfabric: NotRequired[str | None]
    # -- buffers and devices
    buffers: NotRequired[str]
    buffers_detected_by: NotRequired[str]
    device_shared: NotRequired[bool]
    host_mirror: NotRequired[str | None]
    gpu: NotRequired[str]
    gpu_count: NotRequired[int]
    gpu_memory_bytes: NotRequired[int]
    compute_capability: NotRequired[str]
    torch: NotRequired[str]
    cupy: NotRequired[str]
    cuda_runtime: NotRequired[str | int | None]
    hip_runtime: NotRequired[str | None]


class BackendFactory(Protocol):
    """What the registry hands out: a Backend class, or an object that builds one (an
    algorithm over a transport). Both answer these before any rank is set up."""

    @property
    def needs_mpi_launcher(self) -> bool: ...

    @property
    def display_name(self) -> str: ...

    @property
    def interface_variable(self) -> str | None: ...

    def quiet_probes(self) -> None: ...

    def prepare_process(self, options: BackendOptions) -> None: ...

    def unavailable_reason(self) -> str | None: ...

    def unavailable_before_launch(self) -> str | None: ...

    def refuses(self, dtype: np.dtype, op: str | None) -> str | None: ...

    def probe_version(self) -> str | None: ...

    def __call__(self, ctx: RankContext) -> Backend: ...


class Backend(ABC):
    """One library's collectives on one communicator. Its buffers are those of its buffer
    policy (`self.buffers`, host numpy unless the backend sets another).

    The core every backend has: availability and doctor's probes, buffers, its collectives
    (`builders`, `bind`, `run`), `barrier`, `synchronize`, `finalize` and `info`. What only
    some libraries have is a capability, each one object of its own type, overridden where the
    library has it: `p2p` (`PointToPoint`), `groups` (`SubCommunicators`) and `replay_extras`
    (`ReplayExtras`, by default derived from `p2p`)."""

    #: the registry name (an algorithm backend's is per instance: ring@mpi, tree@nccl)
    name: str
    #: what tables and reports show the user for it ("NCCL", "Gloo (torch.distributed)")
    display_name: ClassVar[str] = ""
    #: the libraries `ccbench doctor` reports for it (versions, builds, what they can do)
    libraries: ClassVar[tuple[Library, ...]] = ()
    #: the ranks must be started by an MPI launcher (mpiexec) for this backend
    needs_mpi_launcher: ClassVar[bool] = False
    #: the algorithm recorded for this backend's collectives ("native": the library's choice)
    algorithm: str = "native"
    #: where its buffers live when --device is auto (cpu, or cuda for the device libraries)
    default_device: ClassVar[str] = "cpu"
    #: the BackendOptions fields it reads beyond the common ones (nccl_algo, cuda_graph ...):
    #: their flags apply to it alone
    reads_options: ClassVar[frozenset[str]] = frozenset()
    #: its point-to-point messages carry the algorithms/ schedules (`<algorithm>@<name>`)
    carries_algorithms: ClassVar[bool] = False
    #: the environment variable naming the interface its new communicators bind to (None: the
    #: library picks its own); diagnose --planes pins each plane's traffic through it
    interface_variable: ClassVar[str | None] = None
    #: BackendOptions field -> the environment variable its library reads it from at start-up
    #: (--nccl-algo: NCCL_ALGO); set by prepare_process in the rank, where given
    library_environment: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def quiet_probes(cls) -> None:
        """Make the probes below side-effect free in this process (doctor calls it before any
        probe: loading MPI must not initialise it)."""

    @classmethod
    def prepare_process(cls, options: BackendOptions) -> None:
        """Set what its library reads from this process before it starts (environment
        variables, initialisation settings such as MPI's thread level). The rank calls it
        before its control plane connects (which may initialise MPI); parsing a command line
        and launching ranks never do. By default: `library_environment`'s variables."""
        for option, variable in cls.library_environment.items():
            value = getattr(options, option)
            if value:
                os.environ[variable] = str(value)

    @classmethod
    def probe_version(cls) -> str | None:
        """The library's version for `ccbench doctor`, without a communicator or a device
        (None: it cannot say before it runs)."""
        return None

    @classmethod
    @abstractmethod
    def unavailable_reason(cls) -> str | None:
        """None when the backend can be used in this process, else why not (no import side effects
        beyond probing the library)."""

    @classmethod
    def unavailable_before_launch(cls) -> str | None:
        """What `ccbench launch` checks before it starts any rank (to refuse in one line, once).
        The whole probe, unless a backend says less is enough: its ranks run the whole probe
        anyway, so a probe that only imports a library the launcher itself never uses may stay
        with them."""
        return cls.unavailable_reason()

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
        """None if (collective, dtype, op) can run, else a short reason: the library lacks the
        collective, the collective defines no such op (`Collective.ops`), or `unsupported_case`."""
        support = self.supports(collective)
        if not support:
            return support.reason
        return (get_collective(collective).undefined_op(op)
                or self.unsupported_case(collective, dtype, op))

    def unsupported_case(self, collective: str, dtype: np.dtype, op: str | None) -> str | None:
        """Why this supported collective cannot run `op` on `dtype` here (None: it can)."""
        return self.refuses(dtype, op)

    @property
    def transport(self) -> str:
        return self.name

    @abstractmethod
    def info(self) -> BackendInfo:
        """library, library_version, device and an `env` dict of the variables that steer it
        (with what else the backend says about how it measured: `BackendInfo`)."""

    # -- buffers (the policy's) ------------------------------------------------------
    def alloc(self, count: int, dtype: np.dtype) -> Any:
        return self.buffers.alloc(count, dtype)

    def copy_from_numpy(self, buf: Any, values: np.ndarray) -> None:
        self.buffers.copy_from_numpy(buf, values)

    def to_numpy(self, buf: Any) -> np.ndarray:
        return self.buffers.to_numpy(buf)

    def view(self, buf: Any, start: int, stop: int) -> Any:
        return self.buffers.view(buf, start, stop)

    # -- collectives: one table of builders -----------------------------------------
    #: collective name -> builder(backend, send, recv, op, root) -> the call the timed loop
    #: makes (op is one of sum, max, min, prod, avg; "sum" where the collective has none).
    #: A collective without a builder is not offered; `lacks` may say why.
    builders: ClassVar[Mapping[str, Builder]] = {}
    #: collective name -> why this library cannot run it (what `supports` says)
    lacks: ClassVar[Mapping[str, str]] = {}

    def describe_call(self, collective: str) -> str | None:
        """What the timed loop calls for `collective`, where its builder says (`timed_as`: a
        builder that is not one library function with its arguments bound); None: what
        `info()['timed_call']` says of every collective holds."""
        return getattr(self.builders.get(collective), "timed_call", None)

    def supports(self, collective: str) -> Support:
        """Whether this backend runs `collective`, and if not, why (truthy when it does)."""
        if collective in self.builders:
            return Support(True)
        why = self.lacks.get(collective) or f"{self.name} binds no {collective}"
        return Support(False, f"unsupported by {self.name}: {why}")

    # -- optional capabilities ------------------------------------------------------
    @property
    def p2p(self) -> PointToPoint[Any] | None:
        """Its point-to-point messages (algorithms/ schedules, trace replay); None: none."""
        return None

    @property
    def replay_extras(self) -> ReplayExtras[Any]:
        """The calls of a trace outside the registry that trace replay runs on it (by default
        from its `p2p`; each answers why where it has none)."""
        return ReplayExtras(self)

    @property
    def groups(self) -> SubCommunicators[Any] | None:
        """Its sub-communicators (trace replay, diagnose); None: it has none."""
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
        loop measures the library and not Python dispatch: this backend's builder of the
        collective (often the library's own function with its arguments bound)."""
        builder = self.builders.get(collective)
        if builder is None:
            raise RunFailure(self.supports(collective).reason)
        return builder(self, send, recv, op or "sum", root)

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
        """One call of `collective` (validation and warm-up; the timed loops use `bind`)."""
        self.bind(collective, send, recv, op, root)()


AnyBackend = TypeVar("AnyBackend", bound=Backend)


class PointToPoint(Generic[AnyBackend]):
    """A backend's point-to-point messages (`Backend.p2p`): blocking `send` and `recv` of one
    buffer where its library has them (`blocking`), the transport the algorithms/ schedules
    run over, and the stream device kernels queue on."""

    #: `send` and `recv` are the library's own, each complete when it returns
    blocking: ClassVar[bool] = False

    def __init__(self, backend: AnyBackend) -> None:
        self.backend = backend

    def send(self, buf: Any, peer: int, tag: int = 0) -> None:
        raise NotImplementedError(f"{self.backend.name} has no blocking point-to-point send")

    def recv(self, buf: Any, peer: int, tag: int = 0) -> None:
        raise NotImplementedError(f"{self.backend.name} has no blocking point-to-point recv")

    def transport(self, device: bool) -> Transport | None:
        """An algorithms.transport over the backend's communicator, moving numpy arrays
        (device False) or CuPy arrays (device True); None when it has no such messages."""
        return None

    def stream(self) -> Any:
        """The CuPy stream the library orders its device work on, for the kernels of
        algorithms run over it (None: CuPy's current stream)."""
        return None


class ReplayExtras(Generic[AnyBackend]):
    """The calls of a trace outside the registry that trace replay (ccbench.replay.extra) asks
    a backend for (`Backend.replay_extras`): blocking send and recv, exchanges (sends and
    receives issued together) and the uneven all-to-all. Each answers the call, or why the
    backend has none; the defaults come from the backend's `p2p`, so a backend need override
    only what its library does otherwise."""

    def __init__(self, backend: AnyBackend) -> None:
        self.backend = backend

    def blocking_messages(self, timeout: float) -> tuple[MessageCall, MessageCall] | str:
        """(send, recv) of one buffer to or from one peer of this communicator, each complete
        when it returns (trace replay's send and recv), or why there are none: the library's
        own blocking `p2p.send` and `p2p.recv` where the backend has them."""
        p2p = self.backend.p2p
        if p2p is None or not p2p.blocking:
            return f"{self.backend.name}: no point-to-point messages, and no transport to carry them"
        return p2p.send, p2p.recv

    def exchanges(self, timeout: float) -> Exchange | str:
        """How this communicator moves one exchange (trace replay's sends and receives issued
        together, on host numpy arrays): a function of (sends, recvs) giving the one call that
        moves them all whatever order the peers post theirs in, or why it cannot. Here: over
        `p2p.transport(False)`, posted as `post_exchange` posts them."""
        p2p = self.backend.p2p
        transport = p2p.transport(False) if p2p is not None else None
        if transport is None:
            return (f"{self.backend.name}: no non-blocking point-to-point messages to post an "
                    f"exchange with")
        return functools.partial(self.post_exchange, transport, timeout=timeout)

    def post_exchange(self, transport: Transport, sends: list[Message], recvs: list[Message],
                      timeout: float) -> Callable[[], None]:
        """The one call that moves an exchange over this library's `transport`: every receive
        posted, then every send, then all waited for (torch.distributed isend/irecv, MPI
        Irecv/Isend). A library whose messages complete before they return overrides it."""
        def post() -> None:
            posted = [transport.irecv(b, peer, tag) for b, peer, tag in recvs]
            posted += [transport.isend(b, peer, tag) for b, peer, tag in sends]
            for request in posted:
                request.wait(timeout)
        return post

    def uneven_alltoall(self) -> AlltoallvCall | str:
        """This communicator's all-to-all with a count per peer (MPI's Alltoallv, trace
        replay's all_to_all_single with split sizes), or why it has none."""
        return f"{self.backend.name}: no uneven all-to-all"


class SubCommunicators(ABC, Generic[AnyBackend]):
    """A backend's sub-communicators (`Backend.groups`): trace replay's process groups and
    diagnose's pairs and planes."""

    def __init__(self, backend: AnyBackend) -> None:
        self.backend = backend

    @abstractmethod
    def split(self, groups: Sequence[Sequence[int]], timeout: float
              ) -> list[Backend | str | None]:
        """The backend on each of `groups` (global ranks, ascending), made collectively: every
        rank calls it with the same groups in the same order. Per group: this rank's backend
        on that group (its ctx gives the group rank and size, so layouts, inputs and
        validation are the group's), why there is none, or None where this rank is not in it.
        A sub-communicator is released with its `finalize`; the whole one stays its owner's."""

    def on_group(self, ranks: Sequence[int]) -> AnyBackend:
        """A shallow copy of the backend whose ctx is this rank's place in `ranks`: what a
        `split` fills in with the group's communicator."""
        sub = copy.copy(self.backend)
        sub.ctx = dataclasses.replace(sub.ctx, rank=list(ranks).index(sub.ctx.rank),
                                      world_size=len(ranks), members=tuple(ranks))
        return sub


@dataclass(frozen=True, slots=True)
class Support:
    """A backend's answer to `supports(collective)`: truthy when it runs it, else the reason."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


def library_line(label: str, text: str) -> str:
    """One line of doctor's libraries table: the library's name (blank: a continuation)."""
    return f"  {label:<8} {text}"


# facts open-shaped: each Library's probe names its keys (a plugin's too); found, reason common
def found_or_why(facts: dict[str, Any], text: str) -> str:
    """`text` when the library was found, else `none: <why not>`."""
    return text if facts.get("found") else f"none: {facts.get('reason')}"


#: (backend, send, recv, op, root) -> the bound call of one collective on those buffers
Builder = Callable[[Any, Any, Any, str, int], Callable[[], None]]
#: (buffer, peer) -> None: one message to or from `peer`, complete when it returns
MessageCall = Callable[[Any, int], None]
#: (buffer, peer, tag): one message of an exchange
Message = tuple[Any, int, int]
#: (sends, recvs) -> the one call that moves them all
Exchange = Callable[[list[Message], list[Message]], Callable[[], None]]
#: (send, recv, send counts, receive counts) -> None: one all-to-all with a count (in
#: elements) per peer, in the group's rank order
AlltoallvCall = Callable[[Any, Any, list[int], list[int]], None]


AnyBuilder = TypeVar("AnyBuilder", bound=Callable[..., Callable[[], None]])


def timed_as(text: str) -> Callable[[AnyBuilder], AnyBuilder]:
    """Mark a builder whose call is not one library function with its arguments bound (a
    collective made of several messages, a chain of sends and receives): `text` says what the
    timed loop calls, and that collective's records carry it as `method.timed_call` in place
    of the backend's `info()['timed_call']` (`Backend.describe_call`)."""
    def mark(builder: AnyBuilder) -> AnyBuilder:
        builder.timed_call = text  # type: ignore[attr-defined]
        return builder
    return mark


def in_sequence(*calls: Callable[[], object]) -> Callable[[], None]:
    """One call that makes `calls` in order (a local copy, then the library's collective)."""
    def call() -> None:
        for step in calls:
            step()
    return call


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

