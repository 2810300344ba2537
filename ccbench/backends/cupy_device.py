"""What the CuPy-based backends (mpi --device cuda, nccl-cupy) ask of CuPy before they start."""

from __future__ import annotations

import importlib.util

__all__ = ["cupy_missing_reason"]


def cupy_missing_reason() -> str | None:
    """None when CuPy imports and sees a device, else why not."""
    if importlib.util.find_spec("cupy") is None:
        return "cupy is not installed (pip install 'ccbench[cuda]')"
    try:
        import cupy

        count = int(cupy.cuda.runtime.getDeviceCount())
    except ImportError as exc:
        return f"cupy cannot be imported: {exc}"
    except RuntimeError as exc:       # cupy's CUDARuntimeError derives from RuntimeError
        return f"cupy sees no CUDA runtime or device: {exc}"
    if count == 0:
        return "cupy sees no CUDA device"
    return None
