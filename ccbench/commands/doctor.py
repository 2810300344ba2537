"""`ccbench doctor [--format table|json]`: what this machine can run, and why not.

Reports every registered backend (and every <algorithm>@<transport> backend) as available or
unavailable with the reason, the library versions found (torch, gloo, NCCL, MPI, oneCCL, CuPy),
the devices seen (CUDA/ROCm devices, CPU model and cores) and the launch environment detected.

It only probes: mpi4py is imported with mpi4py.rc.initialize = False (doctor never becomes an
MPI process and never calls an MPI routine that needs MPI_Init), nothing connects to a
rendezvous, no process group or communicator is created.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import shutil
from collections.abc import Callable
from typing import Any, NotRequired, TypedDict, TypeVar, cast

from ccbench import __version__
from ccbench.backends.base import Backend, Library, library_line
from ccbench.errors import UsageError
from ccbench.run.launcher_env import MPI_ENVS
from ccbench.run.launcher_env import variables as launcher_variables
from ccbench.sysinfo import cpu_model

__all__ = ["BackendRow", "CpuFacts", "Devices", "DoctorReport", "GpuFacts", "LaunchFacts",
           "collect", "main", "register", "render_table"]

#: launcher variables worth showing (values of secrets never live in these)
_LAUNCH_VARS = launcher_variables()
#: the (rank, size) pairs from which ccbench.run.launchers reads an MPI launch without MPI itself
_MPI_PAIRS = tuple((mpi.rank, mpi.size) for mpi in MPI_ENVS)


class BackendRow(TypedDict):
    """A backend as available here or not (reason), with its library's version."""

    name: str
    kind: str                          # library | plugin | algorithm | device buffers
    display: NotRequired[str]          # absent where its class did not load
    available: bool
    reason: str | None
    version: NotRequired[str | None]


class CpuFacts(TypedDict):
    model: str
    cores: int | None
    usable_cores: int | None
    machine: str


class GpuFacts(TypedDict, total=False):
    """The devices torch sees (count None: no torch); found and reason alone where the probe
    itself failed."""

    count: int | None
    reason: str
    visible: dict[str, str]            # the *_VISIBLE_DEVICES variables set
    names: list[str]
    kind: str                          # cuda | rocm
    found: bool


class LaunchFacts(TypedDict, total=False):
    """The launch detected (launcher None: none, with the error); found and reason alone
    where the probe itself failed."""

    variables: dict[str, str]
    tools: dict[str, str | None]
    launcher: str | None
    rank: int | None
    world_size: int | None
    local_rank: int
    local_world_size: int
    note: str
    error: str
    found: bool
    reason: str


class Devices(TypedDict):
    cpu: CpuFacts
    gpu: GpuFacts


class DoctorReport(TypedDict):
    """`ccbench doctor --format json`."""

    ccbench: str
    python: str
    platform: str
    backends: list[BackendRow]
    # name -> the library's facts: the keys its Library.probe names (a plugin's too)
    libraries: dict[str, dict[str, Any]]
    devices: Devices
    launch: LaunchFacts


_Facts = TypeVar("_Facts", dict[str, Any], GpuFacts, LaunchFacts)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("doctor", help="which backends work here, and why not")
    parser.add_argument("--format", choices=("table", "json"), default="table",
                        help="print a table or JSON (default table)")


def main(args: argparse.Namespace) -> int:
    report = collect()
    if args.format == "json":
        print(json.dumps(report, indent=2, sort_keys=False))
    else:
        print(render_table(report), end="")
    return 0


# -- probes -----------------------------------------------------------------------------------
def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else repr(exc)}"


def _guarded(probe: Callable[[], _Facts]) -> _Facts:
    """One broken library must not hide the rest of the report; its error is shown."""
    try:
        return probe()
    except Exception as exc:  # noqa: BLE001  reported in full below, never swallowed
        # every kind of facts has found and reason
        return cast(_Facts, {"found": False, "reason": f"probe failed: {_first_line(exc)}"})


def _cpu() -> CpuFacts:
    model = cpu_model()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"model": model, "cores": os.cpu_count(), "usable_cores": usable,
            "machine": platform.machine()}


def _gpus() -> GpuFacts:
    visible = {k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                                          "ROCR_VISIBLE_DEVICES") if k in os.environ}
    if importlib.util.find_spec("torch") is None:
        return {"count": None, "reason": "torch is not installed", "visible": visible}
    import torch

    if not (torch.version.cuda or getattr(torch.version, "hip", None)):
        return {"count": 0, "reason": f"torch {torch.__version__} is a CPU-only build",
                "visible": visible}
    if not torch.cuda.is_available():
        return {"count": 0, "reason": "no device visible to torch", "visible": visible}
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"count": len(names), "names": names, "visible": visible,
            "kind": "rocm" if getattr(torch.version, "hip", None) else "cuda"}


def _launch() -> LaunchFacts:
    from ccbench.run.launchers import detect_launch, mpiexec_beside, under_mpi_launcher

    env = os.environ
    seen = {k: env[k] for k in _LAUNCH_VARS if k in env}
    tools = {name: shutil.which(name) for name in ("mpiexec", "torchrun", "srun")}
    tools["mpiexec"] = mpiexec_beside() or tools["mpiexec"]
    out: LaunchFacts = {"variables": seen, "tools": tools}
    earlier = ("CCBENCH_CONTROL" in env and "RANK" in env) or "TORCHELASTIC_RUN_ID" in env \
        or ("RANK" in env and "MASTER_ADDR" in env)
    if not earlier and under_mpi_launcher() and not any(r in env and s in env
                                                       for r, s in _MPI_PAIRS):
        # detect_launch would ask MPI itself, which needs MPI_Init: doctor does not
        out.update({"launcher": "mpiexec", "rank": None, "world_size": None,
                    "note": "rank and size are known only after MPI_Init"})
        return out
    try:
        info = detect_launch()
    except UsageError as exc:
        out.update({"launcher": None, "error": str(exc)})
        return out
    out.update({"launcher": info.launcher, "rank": info.rank, "world_size": info.world_size,
                "local_rank": info.local_rank, "local_world_size": info.local_world_size})
    return out


# -- backends -----------------------------------------------------------------------------------
def _backend_names() -> list[tuple[str, str]]:
    from ccbench.backends import PLUGINS, REGISTRY, transports

    plugins = {plugin.name for plugin in PLUGINS}
    names = [(name, "plugin" if name in plugins else "library") for name in REGISTRY]
    if importlib.util.find_spec("ccbench.backends.algorithmic") is not None:
        algorithmic = importlib.import_module("ccbench.backends.algorithmic")
        for algorithm in algorithmic.algorithm_names():
            for transport in transports():
                names.append((f"{algorithm}@{transport}", "algorithm"))
    return names


def _backend(name: str, kind: str, device: str = "cpu") -> BackendRow:
    """The backend's own answers: what it is called, whether it runs here (else why not), and
    the version of its library."""
    from ccbench.backends import backend_class

    try:
        cls = backend_class(name, device)
    except UsageError as exc:            # its module is missing or broken
        return {"name": name, "kind": kind, "available": False, "reason": str(exc)}
    try:
        reason = cls.unavailable_reason()
    except Exception as exc:  # noqa: BLE001  a probe that raises breaks the contract: show it
        return {"name": name, "kind": kind, "available": False,
                "reason": f"availability probe raised {_first_line(exc)}"}
    return {"name": name, "kind": kind, "display": cls.display_name or name,
            "available": reason is None, "reason": reason,
            "version": cls.probe_version() if reason is None else None}


def _broken_plugin_rows() -> list[BackendRow]:
    """The entry points of group ccbench.backends that were skipped, each with why."""
    from ccbench.backends import BROKEN_PLUGINS

    return [{"name": plugin.name, "kind": "plugin", "available": False,
             "reason": f"plugin skipped ({plugin.target} from {plugin.distribution}): "
                       f"{plugin.reason}"} for plugin in BROKEN_PLUGINS]


def _backend_classes() -> list[type[Backend]]:
    """Every registered backend class that imports here, device variants included."""
    from ccbench.backends import DEVICE_VARIANTS, REGISTRY, backend_class

    classes = []
    for name, device in [*((n, "cpu") for n in REGISTRY), *DEVICE_VARIANTS]:
        try:
            factory = backend_class(name, device)
        except UsageError:               # its module is missing or broken: its row says so
            continue
        if isinstance(factory, type) and issubclass(factory, Backend):
            classes.append(factory)
    return classes


def _libraries(classes: list[type[Backend]]) -> dict[str, dict[str, Any]]:
    """name -> facts of every library the backends name, once each, in registry order."""
    found: dict[str, Library] = {}
    for cls in classes:
        for library in cls.libraries:
            found.setdefault(library.name, library)
    out = {name: _guarded(library.probe) for name, library in found.items()}
    import numpy

    out["numpy"] = {"found": True, "version": numpy.__version__}
    return out


def _device_rows() -> list[BackendRow]:
    """A backend whose buffers live elsewhere on a device (mpi --device cuda: CuPy buffers)
    has requirements of its own."""
    from ccbench.backends import DEVICE_VARIANTS

    rows = []
    for name, device in DEVICE_VARIANTS:
        row = _backend(name, "device buffers", device)
        row["name"] = f"{name} --device {device}"
        rows.append(row)
    return rows


def _library_lines(libraries: dict[str, dict[str, Any]], classes: list[type[Backend]]
                   ) -> list[str]:
    owners = {lib.name: lib for cls in classes for lib in cls.libraries}
    lines = [line for name, facts in libraries.items() if name in owners
             for line in owners[name].lines(facts)]
    return [*lines, library_line("numpy", libraries["numpy"]["version"])]


def collect() -> DoctorReport:
    """The whole report as plain data (what --format json prints)."""
    classes = _backend_classes()
    for cls in classes:
        cls.quiet_probes()
    libraries = _libraries(classes)
    backends = [_backend(name, kind) for name, kind in _backend_names()]
    backends += _device_rows() + _broken_plugin_rows()
    return {
        "ccbench": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "backends": backends,
        "libraries": libraries,
        "devices": {"cpu": _cpu(), "gpu": _guarded(_gpus)},
        "launch": _guarded(_launch),
    }


# -- the table ----------------------------------------------------------------------------------
def _backend_lines(rows: list[BackendRow]) -> list[str]:
    """name, what it is (the backend's display name), verdict and version or reason."""
    width = max(len(row["name"]) for row in rows)
    shown = max(len(row.get("display") or row["name"]) for row in rows)
    lines = []
    for row in rows:
        if row["available"]:
            detail = f"available    {row.get('version') or ''}".rstrip()
        else:
            detail = f"unavailable  {row['reason']}"
        display = row.get("display") or row["name"]
        lines.append(f"  {row['name']:<{width}}  {display:<{shown}}  {detail}")
    return lines


def render_table(report: DoctorReport) -> str:
    lines = [f"ccbench {report['ccbench']}  python {report['python']}  {report['platform']}", "",
             "backends", *_backend_lines(report["backends"])]
    lines += ["", "libraries", *_library_lines(report["libraries"], _backend_classes()), "",
              "devices"]
    cpu, gpu = report["devices"]["cpu"], report["devices"]["gpu"]
    lines.append(f"  cpu      {cpu['model']}, {cpu['cores']} cores ({cpu['usable_cores']} usable)")
    if gpu.get("count"):
        lines.append(f"  gpu      {gpu['count']} {gpu['kind']} device(s): {', '.join(gpu['names'])}")
    else:
        lines.append(f"  gpu      none: {gpu.get('reason')}")
    if gpu.get("visible"):
        lines.append(f"           {' '.join(f'{k}={v}' for k, v in gpu['visible'].items())}")
    launch = report["launch"]
    lines += ["", "launch"]
    if launch.get("launcher"):
        where = (f"rank {launch['rank']} of {launch['world_size']}"
                 if launch.get("rank") is not None else launch.get("note", ""))
        lines.append(f"  detected {launch['launcher']} ({where})")
    else:
        lines.append(f"  detected nothing usable: {launch.get('error') or launch.get('reason')}")
    tools = launch.get("tools", {})
    lines.append("  tools    " + ", ".join(f"{k}: {v or 'not found'}" for k, v in tools.items()))
    if launch.get("variables"):
        lines.append("  vars     " + " ".join(f"{k}={v}" for k, v in launch["variables"].items()))
    return "\n".join(lines) + "\n"
