"""`ccbench compare BASE NEW`: did NEW get slower or faster than BASE, beyond noise?

For every (case, size) present in both, the ratio NEW/BASE of the median time with a
bootstrap confidence interval. Which noise the interval covers depends on the data:

- several runs on each side (records of one case with different run ids): the runs are
  resampled, so the interval covers run-to-run variation (process placement, the machine's
  state), the larger noise on real machines; default threshold 5 %.
- one run on a side: only the iterations of the run can be resampled, so the interval covers
  within-run noise only, and the default threshold is the run-to-run spread measured between
  identical back-to-back runs (WITHIN_RUN_THRESHOLD; benchmarks/compare_noise.py).

A change is marked only when it is significant (the interval excludes 1) AND larger than
the threshold: a regression when ratio > 1 + threshold, an improvement when
ratio < 1 / (1 + threshold). Exit status 1 when any case regressed, 0 otherwise, 2 on bad input.

Records pair on the case identity without run id and library version; they are comparable
when world size, nodes, ranks per node, dtype, op, timing mode, device, root and the
combination of rank times (method.combine) agree; otherwise compare refuses, unless --force.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ccbench.errors import UsageError
from ccbench.records import CaseId, Record, load_records

__all__ = ["Comparison", "compare_records", "bootstrap_ratio", "register", "main",
           "BETWEEN_RUN_THRESHOLD", "WITHIN_RUN_THRESHOLD"]

# What a case is for compare: records pair when these agree (and the size).
IDENTITY = ("collective", "backend", "algorithm", "transport", "inplace")
# What must agree for two measurements of a case to be comparable.
COMPARABLE = ("world_size", "nodes", "ranks_per_node", "dtype", "op", "timing", "device", "root")
# Threshold when each side has several runs: the interval already holds run-to-run noise.
BETWEEN_RUN_THRESHOLD = 0.05
# Threshold when a side has one run: the run-to-run spread between identical back-to-back
# runs (benchmarks/compare_noise.py). Measured on the shared 2-core test machine at load 12-16:
# 10 pairs (2 ranks, gloo, every collective, 1K-64K) differed by a median 55 % and a 99th
# percentile of 13.7x per case, so no threshold is both quiet and sensitive there. On the same
# machine quiet (load 1.5-2.5, 2026-12-03) 0.5 still flagged 99 of 840 cases (11.8 %; every
# pair exited 1), against 3 of 84 with 10 runs per side: gloo's small sizes move 0.5-3.6 ms
# between launches there, so one run per side cannot tell 20 % apart from noise.
WITHIN_RUN_THRESHOLD = 0.50

Key = tuple[CaseId, int]        # (case projected on the fields compared, size asked)


@dataclass
class Comparison:
    collective: str
    backend: str
    algorithm: str
    inplace: bool
    size: int
    base_us: float
    new_us: float
    ratio: float
    ci_low: float
    ci_high: float
    significant: bool
    verdict: str          # regression | improvement | same | n/a
    base_library: str
    new_library: str
    base_runs: int
    new_runs: int
    basis: str            # between-run | within-run: what the interval resamples


def bootstrap_ratio(base: Sequence[float], new: Sequence[float], *, resamples: int = 2000,
                    confidence: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """median(new)/median(base) and a percentile-bootstrap interval (resampling both sides)."""
    b = np.asarray(base, dtype=np.float64)
    n = np.asarray(new, dtype=np.float64)
    if b.size == 0 or n.size == 0:
        raise ValueError("no samples")
    ratio = float(np.median(n) / np.median(b))
    if b.size < 2 or n.size < 2:
        return ratio, math.nan, math.nan
    rng = np.random.default_rng(seed)
    bm = np.median(b[rng.integers(0, b.size, size=(resamples, b.size))], axis=1)
    nm = np.median(n[rng.integers(0, n.size, size=(resamples, n.size))], axis=1)
    ratios = nm / bm
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(ratios, [tail, 100.0 - tail])
    return ratio, float(low), float(high)


def _samples(record: Record) -> list[float]:
    return list(record.samples_us) if record.samples_us else [record.time_us["median"]]


def _case(record: Record, names: Sequence[str]) -> CaseId:
    case = record.case
    if record.collective != "broadcast":
        case = case.without({"root"})      # the root only matters where there is one
    return case.only(names)


def _index(records: list[Record], names: Sequence[str]) -> dict[Key, dict[str, Record]]:
    """Key -> {run id: record}; within one run a repeated key keeps the latest record."""
    out: dict[Key, dict[str, Record]] = {}
    for rec in sorted(records, key=lambda r: r.timestamp):
        out.setdefault((_case(rec, names), rec.size_asked), {})[rec.run_id] = rec
    return out


Pair = tuple[list[Record], list[Record]]      # every run of one (case, size) on each side


def _describe_mismatch(pairs: list[Pair]) -> str:
    seen: dict[str, tuple[set, set]] = {}
    for base, new in pairs:
        for name in COMPARABLE:
            b, n = getattr(_case(base[0], COMPARABLE), name), getattr(_case(new[0], COMPARABLE),
                                                                      name)
            if b != n:
                entry = seen.setdefault(name, (set(), set()))
                entry[0].add(str(b))
                entry[1].add(str(n))
    parts = [f"{name} {','.join(sorted(b))} vs {','.join(sorted(n))}"
             for name, (b, n) in seen.items()]
    return "; ".join(parts)


def _pairs_on(base: list[Record], new: list[Record], names: Sequence[str]) -> list[Pair]:
    bi, ni = _index(base, names), _index(new, names)
    return [(list(bi[k].values()), list(ni[k].values())) for k in bi if k in ni]


def pair_records(base: list[Record], new: list[Record], force: bool = False
                 ) -> tuple[list[Pair], str | None]:
    """Matched (base runs, new runs) per (case, size), and a note about how they were matched
    (None when plain)."""
    if not base:
        raise UsageError("BASE holds no records")
    if not new:
        raise UsageError("NEW holds no records")
    identity: tuple[str, ...] = IDENTITY
    pairs = _pairs_on(base, new, identity + COMPARABLE)
    note = None
    if not pairs:
        backends_b = {(r.backend, r.algorithm, r.transport) for r in base}
        backends_n = {(r.backend, r.algorithm, r.transport) for r in new}
        if (len(backends_b) == 1 and len(backends_n) == 1 and backends_b != backends_n):
            # one backend against another: pair the cases across backends
            identity = ("collective", "inplace")
            pairs = _pairs_on(base, new, identity + COMPARABLE)
            note = (f"comparing backend {next(iter(backends_n))[0]} (NEW) against "
                    f"{next(iter(backends_b))[0]} (BASE)")
    if not pairs:
        loose = _pairs_on(base, new, identity)
        if not loose:
            raise UsageError("BASE and NEW have no (case, size) in common")
        mismatch = _describe_mismatch(loose)
        if not force:
            raise UsageError(f"incomparable records: {mismatch} (pass --force to compare anyway)")
        pairs = loose
        note = ((note + "; ") if note else "") + f"forced despite {mismatch}"
    combine = _combine_mismatch(pairs)
    if combine:
        if not force:
            raise UsageError(f"incomparable records: {combine} (pass --force to compare anyway)")
        note = ((note + "; ") if note else "") + f"forced despite {combine}"
    return pairs, note


def _combine_mismatch(pairs: list[Pair]) -> str | None:
    """Times combined over ranks differently (max against mean, --combine / -a) measure
    different things; records from before the setting existed combined by max."""
    def combine(records: list[Record]) -> set[str]:
        return {str(r.method.get("combine", "max over ranks")) for r in records}

    base = set().union(*(combine(b) for b, _ in pairs))
    new = set().union(*(combine(n) for _, n in pairs))
    if base == new:
        return None
    return f"rank combination {', '.join(sorted(base))} vs {', '.join(sorted(new))}"


def _run_median(record: Record) -> float:
    return float(np.median(_samples(record)))


def _ratio(base: list[Record], new: list[Record], resamples: int, confidence: float,
           seed: int) -> tuple[float, float, float, str]:
    """(ratio, low, high, basis): between runs when both sides have several, else pooled
    iterations of each side."""
    if len(base) >= 2 and len(new) >= 2:
        ratio, low, high = bootstrap_ratio([_run_median(r) for r in base],
                                           [_run_median(r) for r in new], resamples=resamples,
                                           confidence=confidence, seed=seed)
        return ratio, low, high, "between-run"
    pooled_b = [t for r in base for t in _samples(r)]
    pooled_n = [t for r in new for t in _samples(r)]
    ratio, low, high = bootstrap_ratio(pooled_b, pooled_n, resamples=resamples,
                                       confidence=confidence, seed=seed)
    return ratio, low, high, "within-run"


def _verdict(ratio: float, low: float, high: float, threshold: float) -> tuple[bool, str]:
    if math.isnan(low):
        return False, "n/a"
    significant = low > 1.0 or high < 1.0
    if significant and low > 1.0 and ratio > 1.0 + threshold:
        return significant, "regression"
    if significant and high < 1.0 and ratio < 1.0 / (1.0 + threshold):
        return significant, "improvement"
    return significant, "same"


def _library(records: list[Record]) -> str:
    return "; ".join(sorted({f"{r.library} {r.library_version}".strip() for r in records}))


def compare_records(base: list[Record], new: list[Record], *, threshold: float | None = None,
                    force: bool = False, confidence: float = 0.95, resamples: int = 2000,
                    seed: int = 0) -> tuple[list[Comparison], str | None]:
    """threshold None: BETWEEN_RUN_THRESHOLD where both sides have several runs of a case,
    WITHIN_RUN_THRESHOLD where a side has one."""
    if threshold is not None and not 0 <= threshold < 10:
        raise UsageError(f"--threshold must be in [0, 10), got {threshold:g}")
    if not 0.5 <= confidence < 1:
        raise UsageError(f"--confidence must be in [0.5, 1), got {confidence:g}")
    pairs, note = pair_records(base, new, force)
    libs_b = sorted({_library(b) for b, _ in pairs})
    libs_n = sorted({_library(n) for _, n in pairs})
    if libs_b != libs_n:
        line = f"libraries: NEW {'; '.join(libs_n)} against BASE {'; '.join(libs_b)}"
        note = f"{note}; {line}" if note else line
    out: list[Comparison] = []
    for b, n in pairs:
        ratio, low, high, basis = _ratio(b, n, resamples, confidence, seed)
        limit = threshold if threshold is not None else (
            BETWEEN_RUN_THRESHOLD if basis == "between-run" else WITHIN_RUN_THRESHOLD)
        significant, verdict = _verdict(ratio, low, high, limit)
        first_b, first_n = b[0], n[0]
        out.append(Comparison(
            collective=first_n.collective, backend=first_n.backend
            if first_n.backend == first_b.backend else f"{first_b.backend}->{first_n.backend}",
            algorithm=first_n.algorithm, inplace=first_n.inplace, size=first_n.size_asked,
            base_us=float(np.median([t for r in b for t in _samples(r)])),
            new_us=float(np.median([t for r in n for t in _samples(r)])), ratio=ratio,
            ci_low=low, ci_high=high, significant=significant, verdict=verdict,
            base_library=_library(b), new_library=_library(n), base_runs=len(b),
            new_runs=len(n), basis=basis))
    out.sort(key=lambda c: (c.collective, c.backend, c.algorithm, c.inplace, c.size))
    return out, note


def basis_note(rows: list[Comparison], threshold: float | None) -> str:
    """What the intervals cover and which threshold applied, in one line."""
    within = sum(c.basis == "within-run" for c in rows)
    between = len(rows) - within
    parts = []
    if between:
        runs = sorted({(c.base_runs, c.new_runs) for c in rows if c.basis == "between-run"})
        limit = threshold if threshold is not None else BETWEEN_RUN_THRESHOLD
        parts.append(f"{between} case(s) with several runs per side "
                     f"({', '.join(f'{b} vs {n}' for b, n in runs)} runs): the interval covers "
                     f"run-to-run variation; threshold {limit:.0%}")
    if within:
        limit = threshold if threshold is not None else WITHIN_RUN_THRESHOLD
        source = "" if threshold is not None else " (the run-to-run spread measured between " \
            "identical back-to-back runs)"
        parts.append(f"{within} case(s) with one run on a side: the interval covers within-run "
                     f"noise only; threshold {limit:.0%}{source}")
    return "; ".join(parts)


def _size(n: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


_MARK = {"regression": "SLOWER", "improvement": "faster", "same": "", "n/a": "n/a"}


def _print_table(rows: list[Comparison], note: str | None, threshold: float | None,
                 confidence: float, stream=sys.stdout) -> None:
    if note:
        print(f"# {note}", file=stream)
    print(f"# ratio = median time NEW/BASE; [{confidence:.0%} bootstrap interval]; marked when "
          f"significant and beyond the threshold", file=stream)
    print(f"# {basis_note(rows, threshold)}", file=stream)
    head = (f"{'collective':<15}{'backend':<18}{'mode':<6}{'size':>6}{'base us':>12}"
            f"{'new us':>12}{'ratio':>8}  {'interval':<17}{'':<8}")
    print(head, file=stream)
    for c in rows:
        interval = ("-" if math.isnan(c.ci_low) else f"[{c.ci_low:.3f}, {c.ci_high:.3f}]")
        name = c.backend if c.algorithm in ("native", "") else f"{c.backend}"
        print(f"{c.collective:<15}{name:<18}{'in' if c.inplace else 'out':<6}{_size(c.size):>6}"
              f"{c.base_us:>12.2f}{c.new_us:>12.2f}{c.ratio:>8.3f}  {interval:<17}"
              f"{_MARK[c.verdict]:<8}".rstrip(), file=stream)
    slower = sum(c.verdict == "regression" for c in rows)
    faster = sum(c.verdict == "improvement" for c in rows)
    finite = [c.ratio for c in rows if c.ratio > 0 and math.isfinite(c.ratio)]
    geo = math.exp(sum(map(math.log, finite)) / len(finite)) if finite else math.nan
    print(f"# {len(rows)} compared: {slower} slower, {faster} faster, "
          f"{len(rows) - slower - faster} unchanged; geometric mean ratio {geo:.3f}", file=stream)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare", help="NEW/BASE median-time ratios with bootstrap intervals",
        description="Per case and size, the ratio NEW/BASE of the median time with a bootstrap "
                    "confidence interval; exit 1 on a significant regression beyond --threshold.")
    parser.add_argument("base", help="BASE results file or folder (several runs of a case "
                                     "give a run-to-run interval)")
    parser.add_argument("new", help="NEW results file or folder")
    parser.add_argument("--threshold", type=float, default=None,
                        help=f"smallest relative change that counts (default: "
                             f"{BETWEEN_RUN_THRESHOLD:g} with several runs per side, "
                             f"{WITHIN_RUN_THRESHOLD:g} with one run on a side, the measured "
                             f"run-to-run spread)")
    parser.add_argument("--confidence", type=float, default=0.95,
                        help="bootstrap interval level (default 0.95)")
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    parser.add_argument("--force", action="store_true",
                        help="compare even when world size, dtype, timing mode ... differ")
    parser.add_argument("--format", choices=("table", "json", "csv"), default="table")


def main(args: argparse.Namespace) -> int:
    if args.resamples < 100:
        raise UsageError(f"--resamples must be >= 100, got {args.resamples}")
    base = load_records(args.base, require=True)
    new = load_records(args.new, require=True)
    rows, note = compare_records(base, new, threshold=args.threshold, force=args.force,
                                 confidence=args.confidence, resamples=args.resamples,
                                 seed=args.seed)
    if args.format == "table":
        _print_table(rows, note, args.threshold, args.confidence)
    elif args.format == "json":
        for row in rows:
            print(json.dumps({k: (None if isinstance(v, float) and math.isnan(v) else v)
                              for k, v in asdict(row).items()}))
    else:
        writer = csv.DictWriter(sys.stdout, fieldnames=list(asdict(rows[0]).keys()))
        writer.writeheader()
        for row in rows:
            writer.writerow(asdict(row))
    return 1 if any(c.verdict == "regression" for c in rows) else 0
