"""Run `python -m ccbench ...` with test-only substitutions, for the device-buffer checks.

    python tests/gpu/ccbench_with.py [--fake-cupy] [--fake-devices N] [--cupy-mpi] [--nccl-twin]
                                     -- CCBENCH-ARGS

--fake-cupy  `import cupy` gives tests/gpu/fake_cupy.py (device arrays over host memory) and
             `cupy.cuda.nccl` tests/gpu/fake_nccl.py (NCCL's calls over gloo), so the CuPy code
             paths, the nccl-cupy backend's among them, run on a machine without a GPU.
--fake-devices N  the fake runtime reports N devices (default 1; one per rank for nccl-cupy).
--cupy-mpi   the mpi backend is ccbench.backends.cuda_mpi:CudaMPIBackend (what the registry
             gives for --device cuda once it chooses classes by device).
--nccl-twin  the nccl backend is tests/gpu/cpu_twins.py:NCCLCpuTwin (the nccl backend's code
             over gloo on the CPU, device calls counted).
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("usage: ccbench_with.py [--fake-cupy] [--fake-devices N] [--cupy-mpi] [--nccl-twin] "
              "-- CCBENCH-ARGS",
              file=sys.stderr)
        return 2
    split = argv.index("--")
    flags, bench = argv[:split], argv[split + 1:]
    here = str(Path(__file__).resolve().parent)
    if "--fake-cupy" in flags:
        sys.path.insert(0, here)
        import fake_cupy

        fake_cupy.install()
        if "--fake-devices" in flags:
            fake_cupy.DEVICE_COUNT = int(flags[flags.index("--fake-devices") + 1])
    if "--cupy-mpi" in flags:
        from ccbench.backends import REGISTRY

        REGISTRY["mpi"] = "ccbench.backends.cuda_mpi:CudaMPIBackend"
    if "--nccl-twin" in flags:
        sys.path.insert(0, here)
        from ccbench.backends import REGISTRY

        REGISTRY["nccl"] = "cpu_twins:NCCLCpuTwin"
    import ccbench.cli as cli

    if "--fake-cupy" in flags or "--nccl-twin" in flags:
        # the twin's "device" is the CPU: the command line's GPU presence check would refuse
        # --device cuda before the substituted code could run
        cli._check_device = lambda device: None
    from ccbench.cli import main as ccbench_main

    return ccbench_main(bench)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
