"""Reduction kernels: ``out = a (op) b`` elementwise, for sum, max, min and prod.

* ``NumpyReducer``: numpy ufuncs with ``out=`` (no temporaries); bfloat16 through
  ml_dtypes' ufuncs.
* ``CupyReducer``: one CuPy ElementwiseKernel per (op, dtype), compiled on first use;
  bfloat16 buffers are uint16 views and the kernel widens to float32, reduces and rounds
  back to nearest even (NaN kept quiet). cupy is imported only when this class is built.
* ``TwinReducer``: the CPU twin of the CuPy kernels -- the same arithmetic written with
  numpy (float16 as float16, bfloat16 by the same bit manipulation on uint16), so CI
  without a GPU runs the kernels' logic and checks it bit for bit against numpy.

Every reducer is called as ``reducer(op, dtype_name)(a, b, out)``; ``out`` may be ``a``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["CUDA_OPS", "DTYPE_NAMES", "OPS", "CupyReducer", "NumpyReducer", "Reduce",
           "TwinReducer", "bf16_bits_to_float32", "float32_to_bf16_bits", "get_reducer"]

OPS: tuple[str, ...] = ("sum", "max", "min", "prod")
DTYPE_NAMES: tuple[str, ...] = ("float32", "float64", "float16", "bfloat16", "int32", "int8",
                                 "int64", "uint8")

Reduce = Callable[[Any, Any, Any], None]

_UFUNCS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}

#: the CUDA expression of each op, on operands a and b of one type
CUDA_OPS: dict[str, str] = {
    "sum": "a + b",
    "prod": "a * b",
    "max": "(a > b || a != a) ? a : b",      # NaN propagates, as numpy.maximum
    "min": "(a < b || a != a) ? a : b",
}

#: C type of each dtype inside a kernel body (parameters use the numpy names)
_CUDA_TYPES = {"float32": "float", "float64": "double", "float16": "float16",
               "int32": "int", "int8": "signed char", "int64": "long long",
               "uint8": "unsigned char"}

_BF16_BODY = """
float fa = __uint_as_float(((unsigned int)x) << 16);
float fb = __uint_as_float(((unsigned int)y) << 16);
float a = fa, b = fb;
float r = {expr};
unsigned int u = __float_as_uint(r);
if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {{
    out = (unsigned short)((u >> 16) | 0x0040u);
}} else {{
    out = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}}
"""


def _check(op: str, dtype_name: str) -> None:
    if op not in OPS:
        raise ValueError(f"unknown op {op!r} (valid: {', '.join(OPS)})")
    if dtype_name not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {dtype_name!r} (valid: {', '.join(DTYPE_NAMES)})")


class NumpyReducer:
    """numpy ufuncs writing into ``out``."""

    name = "numpy"

    def __call__(self, op: str, dtype_name: str) -> Reduce:
        _check(op, dtype_name)
        ufunc = _UFUNCS[op]

        def reduce(a: Any, b: Any, out: Any) -> None:
            ufunc(a, b, out=out)
        return reduce


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 patterns -> float32 (exact)."""
    return np.left_shift(bits.astype(np.uint32), 16).view(np.float32)


def float32_to_bf16_bits(values: np.ndarray, out: np.ndarray) -> np.ndarray:
    """float32 -> uint16 bfloat16 patterns, round to nearest even, NaN kept quiet (the same
    arithmetic as the CUDA kernel)."""
    u = values.view(np.uint32)
    nan = ((u & 0x7F800000) == 0x7F800000) & ((u & 0x007FFFFF) != 0)
    rounded = (u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16
    quiet = (u >> 16) | np.uint32(0x0040)
    np.copyto(out, np.where(nan, quiet, rounded).astype(np.uint16))
    return out


class TwinReducer:
    """The CuPy kernels' arithmetic on the CPU (takes numpy arrays; bfloat16 may come as
    ml_dtypes arrays or uint16 views). Allocates temporaries: a test double, not a hot path."""

    name = "twin"

    def __call__(self, op: str, dtype_name: str) -> Reduce:
        _check(op, dtype_name)
        ufunc = _UFUNCS[op]
        if dtype_name != "bfloat16":
            def reduce(a: Any, b: Any, out: Any) -> None:
                r = _twin_expr(op, ufunc, a, b)
                np.copyto(out, r.astype(out.dtype, copy=False))
            return reduce

        def reduce_bf16(a: Any, b: Any, out: Any) -> None:
            fa = bf16_bits_to_float32(a.view(np.uint16))
            fb = bf16_bits_to_float32(b.view(np.uint16))
            r = _twin_expr(op, ufunc, fa, fb).astype(np.float32)
            float32_to_bf16_bits(r, out.view(np.uint16))
        return reduce_bf16


def _twin_expr(op: str, ufunc: np.ufunc, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if op in ("max", "min"):         # the ternary of CUDA_OPS: a wins ties and NaNs
        better = (a > b) if op == "max" else (a < b)
        return np.where(better | (a != a), a, b)
    with np.errstate(over="ignore"):
        return np.asarray(ufunc(a, b)).astype(a.dtype, copy=False)


class CupyReducer:
    """ElementwiseKernels compiled per (op, dtype) on first use."""

    name = "cupy"

    def __init__(self) -> None:
        import cupy  # lazily: only GPU runs build this class

        self.cp = cupy
        self._kernels: dict[tuple[str, str], Any] = {}

    @staticmethod
    def kernel_source(op: str, dtype_name: str) -> tuple[str, str, str]:
        """(in_params, out_params, body) of the ElementwiseKernel; public so CPU-only tests can
        check every (op, dtype) has one."""
        _check(op, dtype_name)
        if dtype_name == "bfloat16":
            return ("uint16 x, uint16 y", "uint16 out", _BF16_BODY.format(expr=CUDA_OPS[op]))
        ctype = _CUDA_TYPES[dtype_name]
        return (f"{dtype_name} a, {dtype_name} b", f"{dtype_name} out",
                f"out = ({ctype})({CUDA_OPS[op]});")

    def __call__(self, op: str, dtype_name: str) -> Reduce:
        key = (op, dtype_name)
        kernel = self._kernels.get(key)
        if kernel is None:
            in_p, out_p, body = self.kernel_source(op, dtype_name)
            kernel = self.cp.ElementwiseKernel(in_p, out_p, body,
                                               f"ccbench_{op}_{dtype_name}")
            self._kernels[key] = kernel
        if dtype_name == "bfloat16":
            def reduce_bf16(a: Any, b: Any, out: Any) -> None:
                kernel(a.view(self.cp.uint16), b.view(self.cp.uint16), out.view(self.cp.uint16))
            return reduce_bf16

        def reduce(a: Any, b: Any, out: Any) -> None:
            kernel(a, b, out)
        return reduce


def get_reducer(name: str) -> Callable[[str, str], Reduce]:
    if name == "numpy":
        return NumpyReducer()
    if name == "twin":
        return TwinReducer()
    if name == "cupy":
        return CupyReducer()
    raise ValueError(f"unknown reducer {name!r} (valid: numpy, twin, cupy)")
