"""Run `python -m ccbench ...` with test-only substitutions, for the device-buffer checks.

    python tests/gpu/ccbench_with.py [--fake-cupy] [--cupy-mpi] -- COLLECTIVE --backend mpi ...

--fake-cupy  `import cupy` gives tests/gpu/fake_cupy.py (device arrays over host memory), so the
             CuPy code paths run on a machine without a GPU.
--cupy-mpi   the mpi backend is ccbench.backends.cuda_mpi:CudaMPIBackend (what the registry
             gives for --device cuda once it chooses classes by device).
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("usage: ccbench_with.py [--fake-cupy] [--cupy-mpi] -- CCBENCH-ARGS", file=sys.stderr)
        return 2
    split = argv.index("--")
    flags, bench = argv[:split], argv[split + 1:]
    if "--fake-cupy" in flags:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import fake_cupy

        fake_cupy.install()
    if "--cupy-mpi" in flags:
        from ccbench.backends import REGISTRY

        REGISTRY["mpi"] = "ccbench.backends.cuda_mpi:CudaMPIBackend"
    from ccbench.cli import main as ccbench_main

    return ccbench_main(bench)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
