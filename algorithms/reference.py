"""Reference results of the collectives (numpy, one process holding every rank's input),
and integer-valued inputs whose results are exact in every dtype: what the executor is
compared against, bit for bit."""

from __future__ import annotations

import numpy as np

from algorithms.patterns import PATTERNS

__all__ = ["exact_inputs", "reference"]


def exact_inputs(collective: str, op: str | None, p: int, send_count: int, dtype: np.dtype,
                 seed: int = 0) -> list[np.ndarray]:
    """Per-rank inputs: sums stay below 128 for p <= 40, products are +-1 or +-2, max/min
    within -5..5, so every partial result is exact in int8, float16 and bfloat16 (unsigned
    types: no negatives, which a cast would wrap)."""
    rng = np.random.default_rng(seed)
    signed = np.dtype(dtype).kind != "u"
    out = []
    for r in range(p):
        idx = np.arange(send_count)
        if op == "sum":
            v = rng.integers(0, 4 if p <= 40 else 2, send_count)
        elif op == "prod":
            v = np.where(idx % max(p, 1) == r, 2, 1)
            if signed:
                v = v * rng.choice([-1, 1], send_count)
        elif op in ("max", "min"):
            v = rng.integers(-5 if signed else 0, 6, send_count)
        else:
            v = rng.integers(-100 if signed else 0, 100, send_count)
        out.append(v.astype(dtype))
    return out


def _reduce(op: str, arrays: list[np.ndarray]) -> np.ndarray:
    acc = arrays[0].astype(np.float64)
    for a in arrays[1:]:
        x = a.astype(np.float64)
        if op == "sum":
            acc = acc + x
        elif op == "prod":
            acc = acc * x
        elif op == "max":
            acc = np.maximum(acc, x)
        elif op == "min":
            acc = np.minimum(acc, x)
        else:
            raise ValueError(op)
    return acc.astype(arrays[0].dtype)


def reference(pattern: str, inputs: list[np.ndarray], op: str | None = None,
              root: int = 0) -> list[np.ndarray | None]:
    """Every rank's expected output (None where the pattern defines none); `pattern` is
    what the schedule computes (``Schedule.pattern``; its result is ``Pattern.result`` in
    algorithms.patterns.PATTERNS)."""
    spec = PATTERNS.get(pattern)
    if spec is None:
        raise ValueError(f"no reference for pattern {pattern!r} (valid: {', '.join(PATTERNS)})")
    return spec.result(inputs, lambda arrays: _reduce(op or "sum", list(arrays)), root)
