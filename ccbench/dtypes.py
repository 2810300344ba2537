"""Data types offered by the harness, as numpy dtypes (bfloat16 through ml_dtypes)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ccbench.errors import UsageError, choices_error

DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "int32": np.dtype(np.int32),
    "int8": np.dtype(np.int8),
}
_ALIASES = {"float": "float32", "double": "float64", "half": "float16", "bf16": "bfloat16",
            "fp32": "float32", "fp64": "float64", "fp16": "float16", "int": "int32"}

__all__ = ["DTYPES", "numpy_dtype", "parse_dtypes"]


def numpy_dtype(name: str) -> np.dtype:
    return DTYPES[name]


def parse_dtypes(text: str) -> list[str]:
    if text == "all":
        return list(DTYPES)
    names = [_ALIASES.get(p.strip().lower(), p.strip().lower()) for p in text.split(",") if p.strip()]
    if not names:
        raise UsageError(f"empty --dtype (valid: {', '.join(DTYPES)})")
    for name in names:
        if name not in DTYPES:
            raise choices_error("dtype", name, DTYPES)
    return names
