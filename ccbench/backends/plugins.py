"""Backends from other distributions: entry points of group `ccbench.backends`.

An installed distribution declares, in its metadata,

    [ccbench.backends]
    mybackend = mypackage.mybackend:MyBackend

and `--backend mybackend` runs it like a built-in one (sweeps, launch, records, doctor).
Each entry point is checked once, when the registry is built: its module must import, the
object it names must be a concrete `Backend` subclass whose `name` is the entry point's
name, and the name must not be a built-in backend's. One that fails any check is skipped
and kept with its reason (`ccbench doctor` lists it); nothing it raises leaves this module.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from importlib.metadata import Distribution, EntryPoint, distributions

from ccbench.backends.base import Backend

__all__ = ["GROUP", "BrokenPlugin", "Plugin", "discover"]

#: the entry-point group a distribution registers its backends in
GROUP = "ccbench.backends"
#: what a backend name may be: it travels in comma lists, `algo@transport` and file names
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*\Z")


@dataclass(frozen=True)
class Plugin:
    """A backend an installed distribution adds: its name, `module:Class` and where from."""

    name: str
    target: str
    distribution: str


@dataclass(frozen=True)
class BrokenPlugin:
    """An entry point that was skipped, and why."""

    name: str
    target: str
    distribution: str
    reason: str


def _distribution(entry: EntryPoint) -> str:
    dist = getattr(entry, "dist", None)
    if dist is None:
        return "unknown distribution"
    return f"{dist.metadata['Name']} {dist.version}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else repr(exc)}"


def _why_not(entry: EntryPoint, taken: Collection[str]) -> str | None:
    """None when the entry point names a usable backend class, else why it is skipped."""
    if not _NAME.match(entry.name):
        return f"{entry.name!r} is not a usable backend name (letters, digits, _ . + -)"
    if entry.name in taken:
        return f"its name clashes with the backend {entry.name!r} already registered"
    if ":" not in entry.value or entry.extras:
        return f"{entry.value!r} is not of the form module:Class"
    try:
        obj = entry.load()
    except (Exception, SystemExit) as exc:  # noqa: BLE001  a plugin's failure is its row
        return f"import failed: {_first_line(exc)}"
    if not (isinstance(obj, type) and issubclass(obj, Backend)):
        return (f"{entry.value} is a {type(obj).__name__}, not a subclass of "
                "ccbench.backends.base.Backend")
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
        return f"{entry.value} is abstract: it does not define {missing}"
    declared = getattr(obj, "name", None)
    if declared != entry.name:
        return f"{entry.value}.name is {declared!r}, not its entry point's name {entry.name!r}"
    return None


def _dist_name(dist: Distribution) -> str:
    """Its normalised name: from the folder's name where the path says it (as
    importlib.metadata does: reading every METADATA would cost each process ~0.1 s)."""
    name = getattr(dist, "_normalized_name", None) or dist.metadata["Name"] or ""
    return re.sub(r"[-_.]+", "_", str(name)).lower()


def _installed() -> tuple[list[EntryPoint], list[BrokenPlugin]]:
    """The group's entry points of every distribution on the path (the first of a name, as
    importlib.metadata.entry_points takes it), and a distribution whose entry_points.txt
    declares the group but cannot be read (one bad distribution must not stop ccbench)."""
    entries: list[EntryPoint] = []
    broken: list[BrokenPlugin] = []
    seen: set[str] = set()
    for dist in distributions():
        name = _dist_name(dist)
        if name in seen:
            continue
        seen.add(name)
        text = dist.read_text("entry_points.txt") or ""
        if f"[{GROUP}]" not in text:
            continue
        try:
            entries += [entry for entry in dist.entry_points if entry.group == GROUP]
        except Exception as exc:  # noqa: BLE001  its row says why
            where = f"{dist.metadata['Name']} {dist.version}"
            broken.append(BrokenPlugin(name, "entry_points.txt", where,
                                       f"its entry points cannot be read: {_first_line(exc)}"))
    return entries, broken


def discover(builtin: Collection[str], found: Iterable[EntryPoint] | None = None
             ) -> tuple[list[Plugin], list[BrokenPlugin]]:
    """The usable backends of the installed distributions' entry points (or `found`), in
    the order they are declared, and those skipped with their reasons."""
    plugins: list[Plugin] = []
    broken: list[BrokenPlugin] = []
    if found is None:
        entries, broken = _installed()
    else:
        entries = list(found)
    for entry in entries:
        taken = {*builtin, *(plugin.name for plugin in plugins)}
        reason = _why_not(entry, taken)
        where = _distribution(entry)
        if reason is None:
            plugins.append(Plugin(entry.name, entry.value, where))
        else:
            broken.append(BrokenPlugin(entry.name, entry.value, where, reason))
    return plugins, broken
