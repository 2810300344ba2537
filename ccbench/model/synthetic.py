"""Synthetic records from a known alpha-beta-gamma model, with multiplicative noise.

Used by the tests, the model benchmark and the docs to check that calibration recovers
the parameters it was given.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ccbench.collectives import COLLECTIVES, REDUCING, busbw_factor, layout
from ccbench.model.costs import FORMULAS, candidates, predict_time
from ccbench.records import Record

__all__ = ["known_model", "synthetic_records"]


def synthetic_records(collective: str, formula: str, world_sizes: Sequence[int],
                      sizes: Sequence[int], alpha: float, beta: float, gamma: float,
                      noise: float = 0.02, iterations: int = 20, seed: int = 0,
                      backend: str = "synthetic", algorithm: str = "native",
                      breakpoint: tuple[int, float, float] | None = None,
                      run_id: str = "synthetic") -> list[Record]:
    """Records whose samples are t (1 + noise N(0,1)), t from `formula` at each (p, size).

    breakpoint=(bytes, alpha2, beta2) switches to a second line above that size.
    """
    rng = np.random.default_rng(seed)
    out = []
    for p in world_sizes:
        for size in sizes:
            lay = layout(collective, size, 4, p)
            n = lay.size_used
            if n <= 0:
                continue
            a, b = alpha, beta
            if breakpoint is not None and n > breakpoint[0]:
                a, b = breakpoint[1], breakpoint[2]
            t = predict_time(collective, formula, p, n, a, b, gamma)
            samples = t * (1 + noise * rng.standard_normal(iterations))
            samples = np.maximum(samples, t * 0.05) * 1e6
            med = float(np.median(samples))
            algbw = n / (med * 1e-6) / 1e9
            out.append(Record(
                run_id=run_id, timestamp="2026-01-01T00:00:00+00:00", ccbench_version="0",
                collective=collective, backend=backend, library=backend,
                library_version="0", algorithm=algorithm, transport=backend, device="cpu",
                dtype="float32", op="sum" if collective in REDUCING
                else None, inplace=False, timing="per-op", world_size=p, nodes=1,
                ranks_per_node=p, hosts=["localhost"], root=0, size_asked=size, size_used=n,
                count=lay.count, iterations=iterations, warmup=0,
                time_us={"median": med, "mean": float(samples.mean()),
                         "min": float(samples.min()), "max": float(samples.max()),
                         "p5": float(np.percentile(samples, 5)),
                         "p95": float(np.percentile(samples, 95)),
                         "stdev": float(samples.std())},
                samples_us=[float(s) for s in samples], rank_median_us=[med] * p,
                algbw_gbps=algbw, busbw_gbps=algbw * busbw_factor(collective, p), wrong=0))
    return out


def known_model(alpha: float, beta: float, gamma: float, world_sizes: Sequence[int] = (2, 4),
                backend: str = "synthetic") -> dict:
    """A model file (as `calibrate` writes it) with exactly these constants for every
    collective with cost formulas: the known answer for simulate / export tests. gamma is
    given to the reducing collectives only."""
    from ccbench.model.modelfile import SCHEMA, VERSION

    fits = []
    for coll in COLLECTIVES:
        if coll not in FORMULAS:             # no cost formulas (Collective.model is None)
            continue
        reducing = coll in REDUCING
        formulas = candidates(coll)
        fits.append({"backend": backend, "library": backend, "transport": backend,
                     "device": "cpu", "collective": coll, "algorithm": "native",
                     "scope": "all-world-sizes", "world_sizes": list(world_sizes),
                     "sizes": [1024, 1 << 30], "model_algorithm": "ring" if "ring" in formulas
                     else formulas[0], "alpha": alpha, "beta": beta,
                     "gamma": gamma if reducing else 0.0,
                     "gamma_source": "given" if reducing else "not used", "pieces": None,
                     "goodness": {"points": 100, "r2_log": 1.0, "median_rel_err": 0.0,
                                  "max_rel_err": 0.0}, "notes": []})
    return {"schema": SCHEMA, "version": VERSION, "fits": fits}
