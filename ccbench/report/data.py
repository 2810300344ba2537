"""Records -> one tidy table (pandas) with the columns the figures and tables use."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from ccbench.records import Record

__all__ = ["series_label", "colour_key", "to_frame", "library_versions", "key_numbers",
           "half_peak_size", "COLLECTIVE_ORDER"]

COLLECTIVE_ORDER = ("allreduce", "allgather", "reduce-scatter", "broadcast", "alltoall", "reduce")
_DISPLAY = {"gloo": "gloo", "oneccl": "oneCCL", "nccl": "NCCL", "rccl": "RCCL"}


def _mpi_name(record: Record) -> str:
    text = f"{record.library} {record.library_version}"
    for marker, name in (("Intel", "Intel MPI"), ("Open MPI", "Open MPI"),
                         ("MVAPICH", "MVAPICH"), ("MPICH", "MPICH")):
        if marker in text:
            return name
    return record.library or "MPI"


def colour_key(record: Record) -> str:
    """What the colour is keyed by: library for native backends, algorithm for ccbench's own."""
    if "@" in record.backend:
        return record.backend.split("@", 1)[0]
    if record.backend == "mpi":
        return _mpi_name(record)
    return _DISPLAY.get(record.backend, record.backend)


def series_label(record: Record) -> str:
    """The legend entry: `Intel MPI`, `gloo`, `ring@mpi (Intel MPI)`."""
    if "@" in record.backend:
        algo, transport = record.backend.split("@", 1)
        if transport == "mpi":
            return f"{record.backend} ({_mpi_name(record)})"
        return record.backend
    if record.backend == "mpi":
        return _mpi_name(record)
    name = _DISPLAY.get(record.backend, record.backend)
    if record.algorithm not in ("native", "", None):
        name = f"{name} {record.algorithm}"
    return name


def short_version(record: Record) -> str:
    """`Intel MPI 2021.18.1`, `gloo (torch 2.13.0+cpu)`, `MPICH 5.0.2`."""
    text = record.library_version or ""
    if record.backend == "gloo":
        return f"gloo ({text})" if text else "gloo"
    name = _mpi_name(record) if (record.backend == "mpi" or record.transport == "mpi") \
        else _DISPLAY.get(record.backend, record.library or record.backend)
    match = re.search(r"(\d+\.\d+(?:\.\d+)*)", text)
    return f"{name} {match.group(1)}" if match else name


def library_versions(records: Sequence[Record]) -> list[str]:
    seen: dict[str, None] = {}
    for rec in records:
        seen.setdefault(short_version(rec), None)
    return sorted(seen)


def _factor(rec: Record) -> float:
    return rec.busbw_gbps / rec.algbw_gbps if rec.algbw_gbps > 0 else 1.0


def to_frame(records: Sequence[Record]):
    """One row per (series, case, size); a repeated measurement keeps the latest record."""
    import pandas as pd

    rows: dict[tuple, dict[str, Any]] = {}
    for rec in sorted(records, key=lambda r: r.timestamp):
        t = rec.time_us
        factor = _factor(rec)
        size = rec.size_used

        def bw(us: float, size: int = size, factor: float = factor) -> float:
            return size / (us * 1e-6) / 1e9 * factor if us > 0 else math.nan

        label = series_label(rec)
        row = {
            "series": label, "colour_key": colour_key(rec), "backend": rec.backend,
            "library": rec.library, "library_version": rec.library_version,
            "version": short_version(rec), "algorithm": rec.algorithm,
            "transport": rec.transport, "collective": rec.collective, "dtype": rec.dtype,
            "op": rec.op or "", "inplace": bool(rec.inplace), "timing": rec.timing,
            "device": rec.device, "world_size": rec.world_size, "nodes": rec.nodes,
            "ranks_per_node": rec.ranks_per_node, "size": size, "size_asked": rec.size_asked,
            "iterations": rec.iterations, "warmup": rec.warmup,
            "median_us": t.get("median", math.nan), "mean_us": t.get("mean", math.nan),
            "min_us": t.get("min", math.nan), "p5_us": t.get("p5", math.nan),
            "p95_us": t.get("p95", math.nan), "max_us": t.get("max", math.nan),
            "stdev_us": t.get("stdev", math.nan),
            "busbw": rec.busbw_gbps, "algbw": rec.algbw_gbps,
            "busbw_p95": bw(t.get("p5", math.nan)),     # faster iterations, higher bandwidth
            "busbw_p5": bw(t.get("p95", math.nan)),
            "rank_median_us": list(rec.rank_median_us or []), "wrong": rec.wrong,
            "cpu": str(rec.environment.get("cpu", "")),
            "num_cpus": rec.environment.get("num_cpus"), "hosts": ",".join(rec.hosts),
            "ccbench_version": rec.ccbench_version, "run_id": rec.run_id,
            # more ranks than cores on a node: the times include waiting for a core
            "oversubscribed": bool((rec.method or {}).get("oversubscribed")),
            "cores_per_node": (rec.method or {}).get("cores_per_node"),
        }
        key = (label, rec.collective, rec.dtype, rec.op, rec.inplace, rec.timing, rec.device,
               rec.world_size, rec.nodes, rec.size_asked)
        rows[key] = row
    frame = pd.DataFrame(list(rows.values()))
    if frame.empty:
        return frame
    order = {c: i for i, c in enumerate(COLLECTIVE_ORDER)}
    frame["collective_order"] = frame["collective"].map(lambda c: order.get(c, len(order)))
    return frame.sort_values(["collective_order", "world_size", "series", "inplace", "size"]
                             ).reset_index(drop=True)


def half_peak_size(sizes: Sequence[float], busbw: Sequence[float]) -> float:
    """The size at which busbw first reaches half its peak (interpolated in log2 size)."""
    pairs = sorted(zip(sizes, busbw, strict=False))
    if not pairs:
        return math.nan
    peak = max(b for _, b in pairs)
    if not peak > 0:
        return math.nan
    half = peak / 2
    # first index from which the curve reaches half the peak
    idx = next(i for i, (_, b) in enumerate(pairs) if b >= half)
    if idx == 0:
        return float(pairs[0][0])
    (s0, b0), (s1, b1) = pairs[idx - 1], pairs[idx]
    if b1 == b0:
        return float(s1)
    x0, x1 = math.log2(s0), math.log2(s1)
    return float(2 ** (x0 + (half - b0) / (b1 - b0) * (x1 - x0)))


def _at(group, size: int) -> float:
    hit = group[group["size_asked"] == size]
    return float(hit["median_us"].iloc[0]) if len(hit) else math.nan


def key_numbers(frame):
    """Per (collective, world size, series, in-place): peak busbw, latency at 8 B and 1 KiB,
    half-peak size."""
    import pandas as pd

    out = []
    if frame.empty:
        return pd.DataFrame()
    keys = ["collective_order", "collective", "world_size", "series", "inplace"]
    for (_, coll, p, series, inplace), group in frame.groupby(keys, sort=True):
        best = group.loc[group["busbw"].idxmax()]
        smallest = group.loc[group["size"].idxmin()]
        out.append({
            "collective": coll, "ranks": int(p), "series": series,
            "mode": "in-place" if inplace else "out-of-place",
            "peak_busbw": float(best["busbw"]), "peak_at": int(best["size"]),
            "lat_8B_us": _at(group, 8), "lat_1K_us": _at(group, 1024),
            "smallest": int(smallest["size"]), "lat_smallest_us": float(smallest["median_us"]),
            "half_peak_size": half_peak_size(group["size"].tolist(), group["busbw"].tolist()),
            "oversubscribed": bool(group["oversubscribed"].any())
            if "oversubscribed" in group else False,
        })
    return pd.DataFrame(out)
