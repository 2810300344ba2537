"""Records -> one tidy table (pandas) with the columns the figures and tables use."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ccbench.backend_facts import facts_of
from ccbench.bench.stats import summarize
from ccbench.collectives import COLLECTIVES
from ccbench.records import CaseId, Record

__all__ = ["series_label", "legend_label", "colour_key", "library_name", "to_frame",
           "library_versions", "key_numbers",
           "half_peak_size", "COLLECTIVE_ORDER", "RUN_VIEWS", "combine_runs", "method_notes", "runs_note"]

# How a case measured in several runs is shown: its runs' iterations together, each run as
# its own series, or only the latest run.
RUN_VIEWS = ("pooled", "each", "latest")

#: the order figures and tables show collectives in: the registry's
COLLECTIVE_ORDER = COLLECTIVES


def library_name(record: Record) -> str:
    """What a native series is called: the implementation its record names where its
    backend may be several (`Intel MPI`, `MPICH`), else the backend's display name (`oneCCL`,
    `Gloo (torch.distributed)`); a backend without an entry (a plugin) by the display name
    its records carry (never its library's name alone: a plugin over gloo is not gloo),
    else by its registry name and library. An algorithm's (`ring@<transport>`) is its
    transport's, as for a built-in transport: `ring@gloo-x (Gloo (x) 2.13.0)`."""
    facts = facts_of(record.backend)
    if facts is None:
        algorithmic = "@" in record.backend
        shown = (record.environment or {}).get(
            "transport_display_name" if algorithmic else "backend_display_name")
        if shown:
            return str(shown)
        name = record.backend.rpartition("@")[2]
        return f"{name} ({record.library})" if record.library \
            and record.library != name else name
    found = facts.implementation(f"{record.library} {record.library_version}")
    if found is not None:
        return found.name
    return (record.library or facts.display_name) if facts.implementations \
        else facts.display_name


def colour_key(record: Record) -> str:
    """What the colour is keyed by: library for native backends, algorithm for ccbench's own."""
    if "@" in record.backend:
        return record.backend.split("@", 1)[0]
    return library_name(record)


def series_label(record: Record) -> str:
    """The legend entry: `Intel MPI`, `Gloo (torch.distributed)`, `ring@mpi (Intel MPI)`;
    measured with an option that changes the measurement set otherwise than its default, its
    own series: `Gloo (torch.distributed) [combine=mean over ranks]`."""
    variant = _variant(record)
    suffix = f" [{variant}]" if variant else ""
    if "@" in record.backend:
        facts = facts_of(record.backend)
        if facts is not None and facts.implementations:
            return f"{record.backend} ({library_name(record)}){suffix}"
        return record.backend + suffix
    name = library_name(record)
    if record.algorithm not in ("native", "", None):
        name = f"{name} {record.algorithm}"
    return name + suffix


def _variant(record: Record) -> str:
    from ccbench.bench.options import measured_variant

    return measured_variant(record.method or {})


def short_version(record: Record) -> str:
    """`Intel MPI 2021.18.1`, `Gloo (torch.distributed) 2.13.0`, `MPICH 5.0.2`."""
    match = re.search(r"(\d+\.\d+(?:\.\d+)*)", record.library_version or "")
    name = library_name(record)
    return f"{name} {match.group(1)}" if match else name


def legend_label(record: Record) -> str:
    """A figure's legend entry and a caption's name for a series: its series_label with the
    library's version, `Intel MPI 2021.18.1`, `ring@mpi (Intel MPI 2021.18.1)`, and the
    options it was measured with where they differ from the defaults, as series_label says
    them: `Gloo (torch.distributed) 2.13.0 [combine=mean over ranks]`."""
    variant = _variant(record)
    suffix = f" [{variant}]" if variant else ""
    if "@" in record.backend:
        return f"{record.backend} ({short_version(record)}){suffix}"
    name = short_version(record)
    if record.algorithm not in ("native", "", None):
        name = f"{name} {record.algorithm}"
    return name + suffix


def library_versions(records: Sequence[Record]) -> list[str]:
    seen: dict[str, None] = {}
    for rec in records:
        seen.setdefault(short_version(rec), None)
    return sorted(seen)


def _factor(rec: Record) -> float:
    return rec.busbw_gbps / rec.algbw_gbps if rec.algbw_gbps > 0 else 1.0


def _point(rec: Record) -> tuple[CaseId, int, str]:
    """What one point of a figure is: the case without its run, the size, and the options
    that change the measurement (runs measured otherwise are never pooled)."""
    return rec.case.without({"run_id"}), rec.size_asked, _variant(rec)


def _by_case(records: Sequence[Record]) -> dict[tuple[CaseId, int, str], dict[str, Record]]:
    """point (_point) -> {run id: record}, latest record of a run kept."""
    groups: dict[tuple[CaseId, int, str], dict[str, Record]] = {}
    for rec in sorted(records, key=lambda r: r.timestamp):
        groups.setdefault(_point(rec), {})[rec.run_id] = rec
    return groups


def _pooled(runs: list[Record]) -> Record:
    """One record holding the iterations of every run of a (case, size)."""
    latest = max(runs, key=lambda r: r.timestamp)
    samples = [t for r in runs for t in (r.samples_us or [r.time_us["median"]])]
    stats = summarize(samples)
    algbw = latest.size_used / (stats["median"] * 1e-6) / 1e9 if stats["median"] > 0 else 0.0
    return replace(latest, run_id=f"pooled:{len(runs)}", time_us=stats, samples_us=samples,
                   iterations=sum(r.iterations for r in runs), algbw_gbps=algbw,
                   busbw_gbps=algbw * _factor(latest),
                   wrong=None if any(r.wrong is None for r in runs)
                   else sum(r.wrong or 0 for r in runs))


def combine_runs(records: Sequence[Record], view: str = "pooled") -> list[Record]:
    """The records a figure shows for `view` (see RUN_VIEWS)."""
    if view not in RUN_VIEWS:
        from ccbench.errors import choices_error

        raise choices_error("run view", view, RUN_VIEWS)
    out: list[Record] = []
    for runs in _by_case(records).values():
        if view == "each" or len(runs) == 1:
            out.extend(runs.values())
        elif view == "latest":
            out.append(max(runs.values(), key=lambda r: r.timestamp))
        else:
            out.append(_pooled(list(runs.values())))
    return out


def runs_note(records: Sequence[Record], view: str) -> str | None:
    """One sentence saying how cases measured in several runs are shown; None if none were."""
    counts = [len(runs) for runs in _by_case(records).values() if len(runs) > 1]
    if not counts:
        return None
    how = {"pooled": "their runs' iterations pooled into one distribution (--runs pooled)",
           "each": "each run as its own series, labelled with its run id (--runs each)",
           "latest": "the latest run only, the others left out (--runs latest)"}[view]
    return (f"{len(counts)} (case, size) point(s) were measured in several runs "
            f"(up to {max(counts)}); shown: {how}")


def method_notes(records: Sequence[Record]) -> list[str]:
    """One sentence per series whose records were measured with different method options
    (a different --warmup, --combine, ...: its points are not alike), naming the options
    and their values. The options are every Method field as records carry it
    (ccbench.bench.options.method_record), so a new option is compared with no edit here;
    a record without a key (from before the option) is left out of that key's comparison."""
    from ccbench.bench.options import Method, method_record

    keys = tuple(method_record(Method()))
    seen: dict[str, dict[str, set[str]]] = {}
    for rec in records:
        values = seen.setdefault(series_label(rec), {})
        for key in keys:
            if key in (rec.method or {}):
                values.setdefault(key, set()).add(str(rec.method[key]))
    notes = []
    for label, values in seen.items():
        differing = [f"{key} ({', '.join(sorted(found))})"
                     for key, found in values.items() if len(found) > 1]
        if differing:
            notes.append(f"{label} was measured with different method options: "
                         f"{'; '.join(differing)}; its points are not alike")
    return notes


def to_frame(records: Sequence[Record], runs: str = "pooled"):
    """One row per (series, case, size) -- and per run with runs="each"; several runs of a
    case are combined as `runs` says (RUN_VIEWS)."""
    import pandas as pd

    multi = {key for key, group in _by_case(records).items() if len(group) > 1}
    # "" (the defaults) first: the default series keep the styles they had before variants
    variants = ["", *sorted({_variant(r) for r in records} - {""})]
    rows: dict[tuple, dict[str, Any]] = {}
    for rec in sorted(combine_runs(records, runs), key=lambda r: r.timestamp):
        t = rec.time_us
        factor = _factor(rec)
        size = rec.size_used

        def bw(us: float, size: int = size, factor: float = factor) -> float:
            return size / (us * 1e-6) / 1e9 * factor if us > 0 else math.nan

        label, legend = series_label(rec), legend_label(rec)
        several = _point(rec) in multi
        if runs == "each" and several:
            label, legend = (f"{text} [run {rec.run_id[:8]}]" for text in (label, legend))
        variant = _variant(rec)
        row = {
            "series": label, "legend": legend, "colour_key": colour_key(rec),
            # the options it was measured with, other than the defaults (measured_variant),
            # and their place among the variants of every record: its line's style
            "variant": variant, "variant_rank": variants.index(variant),
            "backend": rec.backend,
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
        # the label names the backend (and library); two versions of one library under one
        # label: the latest record wins, as before runs were told apart
        key = (label, rec.case.without({"run_id", "library", "library_version"}), rec.size_asked)
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
