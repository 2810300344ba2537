"""Statistics of iteration samples."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["summarize", "unstable"]


def summarize(samples_us: Sequence[float]) -> dict[str, float]:
    """median, mean, min, p5, p95, max and sample stdev (0 for a single sample)."""
    values = np.asarray(samples_us, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no samples")
    return {
        "median": float(np.median(values)),
        "mean": float(values.mean()),
        "min": float(values.min()),
        "p5": float(np.percentile(values, 5)),
        "p95": float(np.percentile(values, 95)),
        "max": float(values.max()),
        "stdev": float(values.std(ddof=1)) if values.size > 1 else 0.0,
    }


def unstable(stats: dict[str, float]) -> bool:
    """pyperf's rule: stdev >= 10% of the mean, or min/max 50% away from the mean."""
    mean = stats["mean"]
    if mean <= 0 or math.isnan(mean):
        return False
    return (stats["stdev"] >= 0.1 * mean or stats["min"] <= 0.5 * mean
            or stats["max"] >= 1.5 * mean)
