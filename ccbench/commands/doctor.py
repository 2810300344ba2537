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
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ccbench import __version__
from ccbench.sysinfo import cpu_model

if TYPE_CHECKING:
    pass

__all__ = ["collect", "main", "register", "render_table"]

#: launcher variables worth showing (values of secrets never live in these)
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "TORCHELASTIC_RUN_ID", "CCBENCH_CONTROL", "PMI_RANK", "PMI_SIZE",
                "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALRANKID",
                "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NODELIST")
#: the (rank, size) pairs from which ccbench.launchers reads an MPI launch without MPI itself
_MPI_PAIRS = (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
              ("PMIX_RANK", "PMIX_SIZE"))


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
def _no_mpi_init() -> None:
    """Whatever imports mpi4py.MPI after this loads libmpi without calling MPI_Init."""
    if importlib.util.find_spec("mpi4py") is None:
        return
    import mpi4py

    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else repr(exc)}"


def _torch() -> dict[str, Any]:
    if importlib.util.find_spec("torch") is None:
        return {"found": False, "reason": "torch is not installed (pip install 'ccbench[torch]')"}
    import torch
    import torch.distributed as dist

    from ccbench.backends.nccl import nccl_version

    nccl, why = nccl_version()
    return {"found": True, "version": torch.__version__,
            "cuda_build": torch.version.cuda, "hip_build": getattr(torch.version, "hip", None),
            "distributed": dist.is_available(),
            "gloo": dist.is_available() and dist.is_gloo_available(),
            "nccl": nccl, "nccl_reason": why}


def _mpi() -> dict[str, Any]:
    if importlib.util.find_spec("mpi4py") is None:
        return {"found": False, "reason": "mpi4py is not installed (pip install 'ccbench[mpi]')"}
    import mpi4py

    out: dict[str, Any] = {"found": True, "mpi4py": mpi4py.__version__}
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:
        out.update(found=False, reason=f"mpi4py cannot load an MPI library: {exc}")
        return out
    version = MPI.Get_library_version().replace("\x00", "").strip()
    major, minor = MPI.Get_version()
    out.update(library=version.splitlines()[0] if version else "", standard=f"{major}.{minor}",
               initialized=bool(MPI.Is_initialized()))
    from ccbench.backends.cuda_mpi import cuda_query_symbol

    path, has_query = cuda_query_symbol()
    out.update(libmpi=path, cuda_query_symbol=has_query,
               cuda_aware="asked at run time (needs MPI_Init)" if has_query else
               "cannot be asked (no MPIX_Query_cuda_support); device buffers are host-staged")
    return out


def _oneccl() -> dict[str, Any]:
    if importlib.util.find_spec("ccbench.backends._oneccl_lib") is None:
        return {"found": False, "reason": "this ccbench has no oneccl backend"}
    from ccbench.backends.oneccl import OneCCLBackend

    reason = OneCCLBackend.unavailable_reason()
    if reason:
        return {"found": False, "reason": reason}
    from ccbench.backends._oneccl_lib import load

    lib = load()
    return {"found": True, "version": lib.version, "path": str(lib.path)}


def _cupy() -> dict[str, Any]:
    from ccbench.backends.cuda_mpi import cupy_missing_reason

    if importlib.util.find_spec("cupy") is None:
        return {"found": False, "reason": cupy_missing_reason()}
    import cupy

    return {"found": True, "version": cupy.__version__, "device_reason": cupy_missing_reason()}


def _guarded(probe: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One broken library must not hide the rest of the report; its error is shown."""
    try:
        return probe()
    except Exception as exc:  # noqa: BLE001  reported in full below, never swallowed
        return {"found": False, "reason": f"probe failed: {_first_line(exc)}"}


def _cpu() -> dict[str, Any]:
    model = cpu_model()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"model": model, "cores": os.cpu_count(), "usable_cores": usable,
            "machine": platform.machine()}


def _gpus() -> dict[str, Any]:
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


def _launch() -> dict[str, Any]:
    from ccbench.launchers import detect_launch, under_mpi_launcher

    env = os.environ
    seen = {k: env[k] for k in _LAUNCH_VARS if k in env}
    tools = {name: shutil.which(name) for name in ("mpiexec", "torchrun", "srun")}
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(beside):
        tools["mpiexec"] = beside
    out: dict[str, Any] = {"variables": seen, "tools": tools}
    earlier = ("CCBENCH_CONTROL" in env and "RANK" in env) or "TORCHELASTIC_RUN_ID" in env \
        or ("RANK" in env and "MASTER_ADDR" in env)
    if not earlier and under_mpi_launcher() and not any(r in env and s in env
                                                       for r, s in _MPI_PAIRS):
        # detect_launch would ask MPI itself, which needs MPI_Init: doctor does not
        out.update(launcher="mpiexec", rank=None, world_size=None,
                   note="rank and size are known only after MPI_Init")
        return out
    from ccbench.errors import UsageError

    try:
        info = detect_launch()
    except UsageError as exc:
        out.update(launcher=None, error=str(exc))
        return out
    out.update(launcher=info.launcher, rank=info.rank, world_size=info.world_size,
               local_rank=info.local_rank, local_world_size=info.local_world_size)
    return out


# -- backends -----------------------------------------------------------------------------------
def _backend_names() -> list[tuple[str, str]]:
    from ccbench.backends import REGISTRY

    names = [(name, "library") for name in REGISTRY]
    if importlib.util.find_spec("ccbench.backends.algorithmic") is not None:
        algorithmic = importlib.import_module("ccbench.backends.algorithmic")
        for algorithm in algorithmic.algorithm_names():
            for transport in algorithmic.TRANSPORTS:
                names.append((f"{algorithm}@{transport}", "algorithm"))
    return names


def _backend(name: str, kind: str) -> dict[str, Any]:
    from ccbench.backends import backend_class
    from ccbench.errors import UsageError

    row: dict[str, Any] = {"name": name, "kind": kind}
    try:
        cls = backend_class(name)
    except UsageError as exc:            # its module is missing or broken
        row.update(available=False, reason=str(exc))
        return row
    try:
        reason = cls.unavailable_reason()
    except Exception as exc:  # noqa: BLE001  a probe that raises breaks the contract: show it
        row.update(available=False, reason=f"availability probe raised {_first_line(exc)}")
        return row
    row.update(available=reason is None, reason=reason)
    row["version"] = cls.probe_version() if reason is None else None
    return row


def _device_buffers_row(libraries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The mpi backend with --device cuda (CuPy buffers) has requirements of its own."""
    from ccbench.backends.cuda_mpi import CudaMPIBackend

    reason = CudaMPIBackend.unavailable_reason()
    cupy = libraries["cupy"]
    return {"name": "mpi --device cuda", "kind": "device buffers", "available": reason is None,
            "reason": reason, "version": f"cupy {cupy.get('version')}" if reason is None else None}


def collect() -> dict[str, Any]:
    """The whole report as plain data (what --format json prints)."""
    _no_mpi_init()
    libraries = {"torch": _guarded(_torch), "mpi": _guarded(_mpi), "oneccl": _guarded(_oneccl),
                 "cupy": _guarded(_cupy)}
    import numpy

    libraries["numpy"] = {"found": True, "version": numpy.__version__}
    backends = [_backend(name, kind) for name, kind in _backend_names()]
    backends.append(_device_buffers_row(libraries))
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
def _library_lines(libraries: dict[str, dict[str, Any]]) -> list[str]:
    torch, mpi, oneccl, cupy = (libraries[k] for k in ("torch", "mpi", "oneccl", "cupy"))
    lines = []
    if torch.get("found"):
        build = (f"CUDA {torch['cuda_build']}" if torch.get("cuda_build") else
                 f"ROCm/HIP {torch['hip_build']}" if torch.get("hip_build") else "CPU-only")
        lines.append(f"  torch    {torch['version']} ({build} build)")
        lines.append(f"  gloo     {'yes' if torch.get('gloo') else 'no'} (bundled with torch)")
        lines.append(f"  nccl     {torch.get('nccl') or 'none: ' + str(torch.get('nccl_reason'))}")
    else:
        lines.append(f"  torch    none: {torch.get('reason')}")
    if mpi.get("found"):
        lines.append(f"  mpi      {mpi['library']} (MPI {mpi['standard']}, mpi4py "
                     f"{mpi['mpi4py']})")
        lines.append(f"           CUDA-aware: {mpi['cuda_aware']}")
    else:
        lines.append(f"  mpi      none: {mpi.get('reason')}")
    oneccl_text = (str(oneccl.get("version")) if oneccl.get("found")
                   else f"none: {oneccl.get('reason')}")
    lines.append(f"  oneccl   {oneccl_text}")
    cupy_text = str(cupy.get("version")) if cupy.get("found") else f"none: {cupy.get('reason')}"
    if cupy.get("found") and cupy.get("device_reason"):
        cupy_text += f" ({cupy['device_reason']})"
    lines.append(f"  cupy     {cupy_text}")
    lines.append(f"  numpy    {libraries['numpy']['version']}")
    return lines


def render_table(report: dict[str, Any]) -> str:
    lines = [f"ccbench {report['ccbench']}  python {report['python']}  {report['platform']}", "",
             "backends"]
    width = max(len(row["name"]) for row in report["backends"])
    for row in report["backends"]:
        if row["available"]:
            detail = f"available    {row.get('version') or ''}".rstrip()
        else:
            detail = f"unavailable  {row['reason']}"
        lines.append(f"  {row['name']:<{width}}  {detail}")
    lines += ["", "libraries", *_library_lines(report["libraries"]), "", "devices"]
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
