"""What a GPU check ran on, one `key: value` line each: Python, numpy, torch (its CUDA and NCCL),
CuPy (its CUDA runtime, the driver it sees, its NCCL), the device, mpi4py and its MPI library.

    python tests/gpu/environment.py            # never fails: a probe that cannot answer says why

Each probe is separate, so a broken CuPy does not hide torch's versions; nothing here starts
an MPI job (the MPI library names itself without MPI_Init).
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable, Iterator

Probe = Callable[[], Iterator[tuple[str, object]]]


def _python() -> Iterator[tuple[str, object]]:
    yield "python", platform.python_version()
    import numpy

    yield "numpy", numpy.__version__
    import ml_dtypes

    yield "ml_dtypes", ml_dtypes.__version__


def _torch() -> Iterator[tuple[str, object]]:
    import torch

    yield "torch", torch.__version__
    yield "torch.version.cuda", torch.version.cuda
    yield "torch.version.hip", getattr(torch.version, "hip", None)
    from ccbench.backends.nccl import nccl_version

    version, why = nccl_version()
    yield "torch nccl", version or why
    yield "torch.cuda.device_count", torch.cuda.device_count()
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        yield "gpu", props.name
        yield "gpu memory bytes", props.total_memory
        yield "compute capability", f"{props.major}.{props.minor}"


def _cupy() -> Iterator[tuple[str, object]]:
    import cupy

    yield "cupy", cupy.__version__
    runtime = cupy.cuda.runtime
    yield "cupy cuda runtime", runtime.runtimeGetVersion()
    yield "cupy cuda driver", runtime.driverGetVersion()
    yield "cupy device count", runtime.getDeviceCount()
    from ccbench.backends.nccl_cupy import nccl_cupy_version

    version, why = nccl_cupy_version()
    yield "cupy nccl", version or why


def _mpi() -> Iterator[tuple[str, object]]:
    import mpi4py

    yield "mpi4py", mpi4py.__version__
    mpi4py.rc.initialize = False          # the library's name needs no MPI_Init (nor a hang)
    from mpi4py import MPI

    yield "mpi library", MPI.Get_library_version().splitlines()[0].strip()


PROBES: dict[str, Probe] = {"python": _python, "torch": _torch, "cupy": _cupy, "mpi4py": _mpi}


def main() -> int:
    for name, probe in PROBES.items():
        try:
            for key, value in probe():
                print(f"{key}: {value}")
        except Exception as exc:  # noqa: BLE001  a probe that cannot answer says why, then the next
            print(f"{name}: unavailable ({type(exc).__name__}: {exc})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
