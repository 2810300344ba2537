"""Data types offered by the harness, as numpy dtypes (bfloat16 and float8 through ml_dtypes),
and the facts about them that validation and the backends need.

float8_e4m3fn is the e4m3 of NVIDIA, OCP and torch (no infinities; `float8_e4m3` and `fp8_e4m3`
name it too); float8_e5m2 is the one e5m2. Neither has an MPI, gloo or CuPy type: backends that
move them do so as bytes (`wire_dtype`), and reductions on them are refused where the library
has no arithmetic for them.
"""

from __future__ import annotations

from functools import cache

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
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
}
_ALIASES = {"float": "float32", "double": "float64", "half": "float16", "bf16": "bfloat16",
            "fp32": "float32", "fp64": "float64", "fp16": "float16", "int": "int32",
            "long": "int64", "uint8_t": "uint8", "char": "int8",
            "float8_e4m3": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "e4m3": "float8_e4m3fn",
            "fp8_e5m2": "float8_e5m2", "e5m2": "float8_e5m2",
            "f8e4m3": "float8_e4m3fn", "f8e5m2": "float8_e5m2"}       # nccl-tests' -d names

#: the types numpy has no buffer protocol for: moved as unsigned integers of the same width
_WIRE: dict[str, np.dtype] = {"bfloat16": np.dtype(np.uint16),
                               "float8_e4m3fn": np.dtype(np.uint8),
                               "float8_e5m2": np.dtype(np.uint8)}

__all__ = ["DTYPES", "avg_scales", "exact_integers", "is_float8", "numpy_dtype", "parse_dtypes",
           "sentinel", "wire_dtype"]


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


def is_float8(dtype: np.dtype) -> bool:
    return dtype.name.startswith("float8")


def wire_dtype(dtype: np.dtype) -> np.dtype:
    """What a library that only moves bytes is handed: the dtype itself, or for bfloat16 and
    float8 the unsigned integer of the same width (their bit patterns)."""
    return _WIRE.get(dtype.name, dtype)


@cache
def exact_integers(dtype: np.dtype) -> int:
    """The largest M such that every integer 0..M is exact in `dtype` (float8_e5m2: 8,
    float8_e4m3fn: 16, bfloat16: 256, int8: 127, uint8: 255)."""
    if dtype.kind in "iu":
        return int(np.iinfo(dtype).max)
    return 2 ** (int(ml_dtypes.finfo(dtype).nmant) + 1)


def sentinel(value: int, dtype: np.dtype) -> np.ndarray:
    """`value` in `dtype`, wrapping as a cast does (-1 in uint8 is 255: numpy refuses it in
    np.full)."""
    return np.array(value, dtype=np.int64).astype(dtype)


@cache
def avg_scales(dtype: np.dtype, world_size: int) -> tuple[int, ...]:
    """The k in 1..3 for which an avg input of n*k (one rank; the others 0) has the exact mean k
    under every way libraries compute avg: sum then divide (gloo, oneCCL, NCCL on integers),
    divide then sum, and NCCL's on floats, which multiplies each input by 1/n rounded to the
    dtype and rounds the product. Only the last can miss (float32 at 61 ranks, float16 at 109,
    bfloat16 at 95); where every k misses the result is () and the inputs are all 0."""
    n, out = world_size, []
    for k in (1, 2, 3):
        if n * k > exact_integers(dtype):
            continue
        if dtype.kind not in "iu":
            # the float64 product of two values of <= 24 significant bits is exact, so one
            # rounding to the dtype is the dtype's own multiplication (float64: its own)
            reciprocal = np.array(1.0 / n).astype(dtype).astype(np.float64)
            product = np.array(float(n * k) * reciprocal).astype(dtype)
            if float(product) != k:
                continue
        out.append(k)
    return tuple(out)
