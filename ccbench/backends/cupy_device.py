"""What the CuPy-based backends (mpi --device cuda, nccl-cupy) ask of CuPy before they start."""

from __future__ import annotations

import importlib.util
from typing import Any

from ccbench.backends.base import Library, found_or_why, library_line

__all__ = ["CUPY", "cupy_missing_reason"]


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


def _cupy_facts() -> dict[str, Any]:
    if importlib.util.find_spec("cupy") is None:
        return {"found": False, "reason": cupy_missing_reason()}
    import cupy

    return {"found": True, "version": cupy.__version__, "device_reason": cupy_missing_reason()}


def _cupy_lines(cupy: dict[str, Any]) -> list[str]:
    text = found_or_why(cupy, str(cupy.get("version")))
    if cupy.get("found") and cupy.get("device_reason"):
        text += f" ({cupy['device_reason']})"
    return [library_line("cupy", text)]


#: CuPy, for the backends whose buffers are CuPy arrays
CUPY = Library("cupy", _cupy_facts, _cupy_lines)
