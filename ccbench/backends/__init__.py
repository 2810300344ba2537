"""The backend registry: names -> classes, imported lazily so a missing library is a clear
'unavailable: <why>' and never an ImportError at start-up."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator

from ccbench.backend_facts import BACKENDS
from ccbench.backends.base import Backend, BackendFactory, RankContext
from ccbench.backends.options import BackendOptions
from ccbench.backends.plugins import BrokenPlugin, Plugin, discover
from ccbench.errors import BackendUnavailable, choices_error

# name -> "module:Class", from ccbench/backend_facts.py (where report/ and model/ read the
# rest of an entry). Each backend is one file; its library is imported only inside it.
REGISTRY: dict[str, str] = {name: facts.target for name, facts in BACKENDS.items()}

#: the backends installed distributions add (entry points of group `ccbench.backends`),
#: registered after the built-in ones; those skipped, with why, in BROKEN_PLUGINS
PLUGINS: list[Plugin]
BROKEN_PLUGINS: list[BrokenPlugin]
PLUGINS, BROKEN_PLUGINS = discover(REGISTRY)
REGISTRY.update((plugin.name, plugin.target) for plugin in PLUGINS)

# (name, device) -> a class that replaces the registry's for that device
DEVICE_VARIANTS: dict[tuple[str, str], str] = {
    ("mpi", "cuda"): "ccbench.backends.cuda_mpi:CudaMPIBackend",
}

__all__ = ["BROKEN_PLUGINS", "DEVICE_DEFAULTS", "HOST_BACKEND", "PLUGINS", "REGISTRY", "Backend",
           "BackendFactory", "RankContext", "backend_class", "backend_names", "builtin_only",
           "check_launchable", "device_backends", "parse_backends", "prepare_process",
           "reading", "skipped_plugin"]


def backend_names() -> list[str]:
    return list(REGISTRY)


@contextlib.contextmanager
def builtin_only() -> Iterator[None]:
    """The registry without the installed plugins while in the block: what ccbench itself
    offers, which every name list and help text then shows (scripts/gen_docs.py writes the
    reference so: the plugins installed beside ccbench are the user's own)."""
    plugins = {p.name: REGISTRY.pop(p.name) for p in PLUGINS if p.name in REGISTRY}
    try:
        yield
    finally:
        REGISTRY.update(plugins)


def skipped_plugin(name: str) -> BackendUnavailable | None:
    """Why `name` cannot be used where it is an installed plugin that was skipped (the reason
    `ccbench doctor` lists), for every path that resolves a backend name to raise; None
    where no skipped plugin has that name."""
    for broken in BROKEN_PLUGINS:
        if broken.name == name:
            return BackendUnavailable(f"backend {name!r} unavailable: plugin skipped "
                                      f"({broken.target} from {broken.distribution}): "
                                      f"{broken.reason}")
    return None


def backend_class(name: str, device: str = "cpu") -> BackendFactory:
    """What builds the backend of a name on a device: a Backend class, or for
    `algo@transport` an AlgorithmSpec wrapping the transport's."""
    if "@" in name:
        from ccbench.backends.algorithmic import algorithm_backend_class

        return algorithm_backend_class(name, device)
    target = DEVICE_VARIANTS.get((name, device)) or REGISTRY.get(name)
    if target is None:
        skipped = skipped_plugin(name)       # an installed one that was skipped: say why
        if skipped is not None:
            raise skipped
        raise choices_error("backend", name, [*REGISTRY, "<algorithm>@<transport>"])
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:   # the backend's own file is missing or broken
        raise BackendUnavailable(f"backend {name!r} unavailable: {exc}") from None
    found: object = module
    for attribute in class_name.split("."):     # an entry point may name Outer.Inner
        found = getattr(found, attribute)
    cls: type[Backend] = found  # type: ignore[assignment]
    return cls


DEFAULT_ALGORITHM_TRANSPORT = "mpi"
#: the backend that runs where no device library is available (and sweeps' default)
HOST_BACKEND = "gloo"
#: the backend the MPI benchmark suites measure: OSU's program names (osu_*) run on it
MPI_SUITE_BACKEND = "mpi"
#: without --backend, the first of these that is available here runs, else HOST_BACKEND
DEVICE_DEFAULTS = ("nccl", "rccl")


def _registered(name: str) -> type[Backend]:
    factory = backend_class(name)
    if not (isinstance(factory, type) and issubclass(factory, Backend)):
        raise TypeError(f"{name} is not a registered backend class")
    return factory


def default_backend() -> str:
    """NCCL (RCCL on a ROCm build) where torch sees a device, else gloo."""
    for name in DEVICE_DEFAULTS:
        if _registered(name).unavailable_reason() is None:
            return name
    return HOST_BACKEND


def default_device(names: list[str]) -> str:
    """cuda when a backend (or an algorithm's transport) keeps its buffers there, else cpu."""
    devices = {_registered(name.rpartition("@")[2]).default_device for name in names}
    return "cuda" if "cuda" in devices else "cpu"


def reading(option: str) -> list[str]:
    """The backends that read a BackendOptions field of their own (nccl_algo, cuda_graph)."""
    return [name for name in REGISTRY if option in _registered(name).reads_options]


def device_backends() -> list[str]:
    """The backends whose buffers live on the GPU when --device is auto."""
    return [name for name in REGISTRY if _registered(name).default_device == "cuda"]


def transports() -> tuple[str, ...]:
    """The backends whose point-to-point messages carry the algorithms/ schedules."""
    return tuple(name for name in REGISTRY if _registered(name).carries_algorithms)


def canonical_backend(name: str) -> str:
    """A bare algorithm name (`ring`) means that algorithm over MPI (`ring@mpi`)."""
    if "@" in name or name in REGISTRY:
        return name
    from ccbench.backends.algorithmic import algorithm_names

    base = name.split(":", 1)[0]
    if base in algorithm_names():
        return f"{name}@{DEFAULT_ALGORITHM_TRANSPORT}"
    return name


def prepare_process(names: list[str], device: str, options: BackendOptions) -> None:
    """In a rank, before its control plane connects: each backend's library settings that
    must be in the process before the library starts (MPI's thread level, NCCL_ALGO ...:
    `Backend.prepare_process`). Parsing and launching leave the process as it was."""
    for name in names:
        backend_class(name, device).prepare_process(options)


def check_launchable(names: list[str]) -> dict[str, bool]:
    """Before any rank starts, in the launching process (which must not become an MPI process
    by probing): BackendUnavailable for the first of `names` that cannot run here (as far as
    each backend's `unavailable_before_launch` asks), else per backend whether its ranks must
    be started by an MPI launcher."""
    needs_mpi = {}
    for name in names:
        factory = backend_class(name)
        factory.quiet_probes()
        reason = factory.unavailable_before_launch()
        if reason:
            raise BackendUnavailable(f"backend {name!r} unavailable: {reason}")
        needs_mpi[name] = factory.needs_mpi_launcher
    return needs_mpi


def parse_backends(text: str) -> list[str]:
    names = [canonical_backend(part.strip()) for part in text.split(",") if part.strip()]
    for name in names:
        backend_class(name)           # raises for unknown names
    return names
