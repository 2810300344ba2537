"""`ccbench compare BASE NEW`: did NEW get slower or faster than BASE, beyond noise?

For every (case, size) present in both, the ratio NEW/BASE of the median time with a
bootstrap confidence interval; for every case (collective, backend, algorithm, mode), the
geometric mean of those ratios over the sizes both measured, with its own interval. Which
noise an interval covers depends on the data:

- several runs on each side (records of one case with different run ids): each run gives one
  value (its median's log; for a case, the mean of those over the sizes, since a launch's
  state moves all of them), the ratio is the geometric mean NEW/BASE and Welch's t interval
  over the runs covers run-to-run variation (process placement, the machine's state), the
  larger noise on real machines; threshold BETWEEN_RUN_THRESHOLD.
- one run on a side: only the iterations of the run can be resampled, so the interval covers
  within-run noise only. Launch-to-launch noise is then unmeasured, and on the 2-core test
  machine it is far larger than the changes worth finding (benchmarks/compare_noise.py), so
  these verdicts are marked as indicative ("SLOWER?") and do not set the exit status, unless
  --threshold is given: a user who knows their machine's run-to-run spread sets it and the
  verdicts count.

A change is marked only when it is significant (the interval excludes 1) AND larger than
the threshold: a regression when ratio > 1 + threshold, an improvement when
ratio < 1 / (1 + threshold). Exit status 1 when a case regressed by a verdict that counts, 0
otherwise, 2 on bad input. Size rows are marked too but do not set the status: they are many
tests at once (84 for every collective at 7 sizes), and with 3-10 identical gloo runs a side
2.8-4.8 % of them came out changed on the test machine, so nearly every comparison would have
failed; a case pools its sizes into one test (0-1 of 12 cases changed with 5-10 runs a side).

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

from ccbench.bench.stats import boot_medians, bootstrap_ratio, percentile_interval, welch_ratio
from ccbench.errors import UsageError
from ccbench.records import CaseId, Record, load_records
from ccbench.units import format_size

__all__ = ["CaseComparison", "Comparison", "compare_cases", "compare_records", "regressed",
           "register", "main", "BETWEEN_RUN_THRESHOLD", "WITHIN_RUN_THRESHOLD"]

# What a case is for compare: records pair when these agree (and the size).
IDENTITY = ("collective", "backend", "algorithm", "transport", "inplace")
# What must agree for two measurements of a case to be comparable.
COMPARABLE = ("world_size", "nodes", "ranks_per_node", "dtype", "op", "timing", "device", "root")
# Threshold when each side has several runs: the interval already holds run-to-run noise.
# 10 %: with 10 identical gloo runs a side on the 2-core test machine, case verdicts at 5 %
# still called 2 of 12 cases changed (geometric means 0.92-1.05), at 10 % none.
BETWEEN_RUN_THRESHOLD = 0.10
# Threshold for marking a change when a side has one run: the run-to-run spread between
# identical back-to-back runs (benchmarks/compare_noise.py). Such marks are indicative only (see
# the module text). Measured on the 2-core test machine quiet (load 1.5-2.5, 2026-12-03): 10
# pairs (2 ranks, gloo, every collective, 1K-64K, 20 iterations) differed per case by a
# median 1.22x, a 95th percentile of 4.5x and a 99th of 5.9x. The cause is the VM: a wakeup
# across its two vCPUs costs a median 37 us and over 1 ms in 1.7 % of pipe ping-pongs at load
# 0.8 (8 us on one vCPU; benchmarks/bench_wakeup.py), so gloo's thread hand-offs land in a
# 4 ms mode in 13-61 % of operations and a size's median flips between the modes from launch
# to launch.
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
    indicative: bool      # within-run basis at the default threshold: does not set the status


@dataclass
class CaseComparison:
    """One case over every size both sides measured: the geometric mean of the size ratios."""
    collective: str
    backend: str
    algorithm: str
    inplace: bool
    sizes: int
    ratio: float
    ci_low: float
    ci_high: float
    significant: bool
    verdict: str
    base_runs: int
    new_runs: int
    basis: str
    indicative: bool


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


#: the time of one side that a ratio of each basis divides, as the table's header names it
STATISTIC = {"between-run": "geometric mean of the runs' medians",
             "within-run": "median of every iteration"}


def _side_time(records: list[Record], basis: str) -> float:
    """The time of one side the ratio of `basis` is made of (so the row's ratio is new/base)."""
    if basis == "between-run":
        return math.exp(sum(math.log(_run_median(r)) for r in records) / len(records))
    return float(np.median([t for r in records for t in _samples(r)]))


def _ratio(base: list[Record], new: list[Record], resamples: int, confidence: float,
           seed: int) -> tuple[float, float, float, str]:
    """(ratio, low, high, basis): between runs when both sides have several, else pooled
    iterations of each side."""
    if len(base) >= 2 and len(new) >= 2:
        ratio, low, high = welch_ratio([math.log(_run_median(r)) for r in base],
                                       [math.log(_run_median(r)) for r in new], confidence)
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


def _limit(basis: str, threshold: float | None) -> tuple[float, bool]:
    """(threshold, indicative) for a verdict on this basis."""
    if threshold is not None:
        return threshold, False
    if basis == "between-run":
        return BETWEEN_RUN_THRESHOLD, False
    return WITHIN_RUN_THRESHOLD, True


def _library(records: list[Record]) -> str:
    return "; ".join(sorted({f"{r.library} {r.library_version}".strip() for r in records}))


def _checked_pairs(base: list[Record], new: list[Record], threshold: float | None,
                   confidence: float, force: bool) -> tuple[list[Pair], str | None]:
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
    return pairs, note


CaseKey = tuple[str, str, str, bool]      # collective, backend (BASE->NEW when they differ), ...


def _case_key(base: list[Record], new: list[Record]) -> CaseKey:
    first_b, first_n = base[0], new[0]
    backend = first_n.backend if first_n.backend == first_b.backend \
        else f"{first_b.backend}->{first_n.backend}"
    return first_n.collective, backend, first_n.algorithm, first_n.inplace


def compare_records(base: list[Record], new: list[Record], *, threshold: float | None = None,
                    force: bool = False, confidence: float = 0.95, resamples: int = 2000,
                    seed: int = 0) -> tuple[list[Comparison], str | None]:
    """Per (case, size). threshold None: BETWEEN_RUN_THRESHOLD where both sides have several
    runs of a case, WITHIN_RUN_THRESHOLD (indicative) where a side has one."""
    pairs, note = _checked_pairs(base, new, threshold, confidence, force)
    out: list[Comparison] = []
    for b, n in pairs:
        ratio, low, high, basis = _ratio(b, n, resamples, confidence, seed)
        limit, indicative = _limit(basis, threshold)
        significant, verdict = _verdict(ratio, low, high, limit)
        collective, backend, algorithm, inplace = _case_key(b, n)
        out.append(Comparison(
            collective=collective, backend=backend, algorithm=algorithm, inplace=inplace,
            size=n[0].size_asked,
            base_us=_side_time(b, basis), new_us=_side_time(n, basis), ratio=ratio,
            ci_low=low, ci_high=high, significant=significant, verdict=verdict,
            base_library=_library(b), new_library=_library(n), base_runs=len(b),
            new_runs=len(n), basis=basis, indicative=indicative))
    out.sort(key=lambda c: (c.collective, c.backend, c.algorithm, c.inplace, c.size))
    return out, note


def _run_case_logs(side: list[list[Record]]) -> list[float]:
    """Per run that measured every size of the case: the mean over sizes of its log median
    (a launch's state moves all its sizes together, so the run is the unit)."""
    by_run: dict[str, list[float]] = {}
    for records in side:
        for rec in records:
            by_run.setdefault(rec.run_id, []).append(math.log(_run_median(rec)))
    return [sum(logs) / len(logs) for logs in by_run.values() if len(logs) == len(side)]


def _case_ratio(pairs: list[Pair], resamples: int, confidence: float, seed: int
                ) -> tuple[float, float, float, str]:
    """(geometric-mean ratio, low, high, basis) of one case over its sizes."""
    base = _run_case_logs([b for b, _ in pairs])
    new = _run_case_logs([n for _, n in pairs])
    if len(base) >= 2 and len(new) >= 2:
        return (*welch_ratio(base, new, confidence), "between-run")
    rng = np.random.default_rng(seed)
    logs_b, logs_n, boot_b, boot_n = [], [], [], []
    for b, n in pairs:
        pooled_b = np.asarray([t for r in b for t in _samples(r)])
        pooled_n = np.asarray([t for r in n for t in _samples(r)])
        logs_b.append(math.log(float(np.median(pooled_b))))
        logs_n.append(math.log(float(np.median(pooled_n))))
        boot_b.append(boot_medians(pooled_b, resamples, rng))
        boot_n.append(boot_medians(pooled_n, resamples, rng))
    ratios = np.exp(np.mean(np.log(np.stack(boot_n, axis=1) / np.stack(boot_b, axis=1)),
                            axis=1))
    ratio = math.exp(sum(logs_n) / len(logs_n) - sum(logs_b) / len(logs_b))
    return (ratio, *percentile_interval(ratios, confidence), "within-run")


def compare_cases(base: list[Record], new: list[Record], *, threshold: float | None = None,
                  force: bool = False, confidence: float = 0.95, resamples: int = 2000,
                  seed: int = 0) -> list[CaseComparison]:
    """Per case: the geometric mean over sizes of the size ratios, with Welch's interval over
    the runs (several runs per side; each run's mean log time over the sizes) or a bootstrap
    of the iterations (one run).
    A change that moves a whole case (a throttled backend, a slower library) shows here even
    where each size alone is within its noise."""
    pairs, _ = _checked_pairs(base, new, threshold, confidence, force)
    groups: dict[CaseKey, list[Pair]] = {}
    for b, n in pairs:
        groups.setdefault(_case_key(b, n), []).append((b, n))
    out: list[CaseComparison] = []
    for key, group in sorted(groups.items()):
        ratio, low, high, basis = _case_ratio(group, resamples, confidence, seed)
        limit, indicative = _limit(basis, threshold)
        significant, verdict = _verdict(ratio, low, high, limit)
        out.append(CaseComparison(
            collective=key[0], backend=key[1], algorithm=key[2], inplace=key[3],
            sizes=len(group), ratio=ratio, ci_low=low, ci_high=high, significant=significant,
            verdict=verdict, base_runs=max(len(b) for b, _ in group),
            new_runs=max(len(n) for _, n in group), basis=basis, indicative=indicative))
    return out


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


_MARK = {"regression": "SLOWER", "improvement": "faster", "same": "", "n/a": "n/a"}


def _mark(verdict: str, indicative: bool) -> str:
    mark = _MARK[verdict]
    return f"{mark}?" if indicative and verdict in ("regression", "improvement") else mark


def _interval_text(low: float, high: float) -> str:
    return "-" if math.isnan(low) else f"[{low:.3f}, {high:.3f}]"


def _counts(items: Sequence[Comparison | CaseComparison]) -> str:
    def count(verdict: str, indicative: bool) -> int:
        return sum(c.verdict == verdict and c.indicative == indicative for c in items)

    slower, faster = count("regression", False), count("improvement", False)
    text = f"{slower} slower, {faster} faster"
    marked = count("regression", True) + count("improvement", True)
    if marked:
        text += (f", {marked} indicative only ({count('regression', True)} slower?, "
                 f"{count('improvement', True)} faster?)")
    return f"{text}, {len(items) - slower - faster - marked} unchanged"


def _print_table(rows: list[Comparison], cases: list[CaseComparison], note: str | None,
                 threshold: float | None, confidence: float, stream=sys.stdout) -> None:
    if note:
        print(f"# {note}", file=stream)
    used = [basis for basis in STATISTIC if any(c.basis == basis for c in rows)]
    mixed = len(used) > 1
    statistic = " or ".join(STATISTIC[basis] + (" (one run on a side)" if mixed and
                                                basis == "within-run" else "")
                            for basis in used)
    print(f"# base us, new us: {statistic}; ratio = new us / base us; [{confidence:.0%} "
          f"interval]; marked when significant and beyond the threshold", file=stream)
    print(f"# {basis_note(rows, threshold)}", file=stream)
    head = (f"{'collective':<15}{'backend':<18}{'mode':<6}{'size':>6}{'base us':>12}"
            f"{'new us':>12}{'ratio':>8}  {'interval':<17}{'':<8}")
    print(head, file=stream)
    for c in rows:
        print(f"{c.collective:<15}{c.backend:<18}{'in' if c.inplace else 'out':<6}"
              f"{format_size(c.size):>6}{c.base_us:>12.2f}{c.new_us:>12.2f}{c.ratio:>8.3f}  "
              f"{_interval_text(c.ci_low, c.ci_high):<17}{_mark(c.verdict, c.indicative):<8}"
              .rstrip(), file=stream)
    finite = [c.ratio for c in rows if c.ratio > 0 and math.isfinite(c.ratio)]
    geo = math.exp(sum(map(math.log, finite)) / len(finite)) if finite else math.nan
    print(f"# {len(rows)} compared: {_counts(rows)}; geometric mean ratio {geo:.3f}",
          file=stream)
    if not cases:
        return
    print("# per case: geometric mean of its size ratios (a change that moves every size)",
          file=stream)
    print(f"{'collective':<15}{'backend':<18}{'mode':<6}{'sizes':>6}{'ratio':>8}  "
          f"{'interval':<17}{'':<8}", file=stream)
    for k in cases:
        print(f"{k.collective:<15}{k.backend:<18}{'in' if k.inplace else 'out':<6}"
              f"{k.sizes:>6}{k.ratio:>8.3f}  {_interval_text(k.ci_low, k.ci_high):<17}"
              f"{_mark(k.verdict, k.indicative):<8}".rstrip(), file=stream)
    print(f"# {len(cases)} cases: {_counts(cases)}", file=stream)
    marked: list[Comparison | CaseComparison] = [*rows, *cases]
    if any(c.indicative and c.verdict in ("regression", "improvement") for c in marked):
        print("# marks with '?' come from one run on a side and do not set the exit status: "
              "run each side several times (launch --repeat N) for a verdict, or pass "
              "--threshold with your machine's run-to-run spread", file=stream)


def _json_line(row: Comparison | CaseComparison, level: str) -> str:
    data = {"level": level, **asdict(row)}
    return json.dumps({k: (None if isinstance(v, float) and math.isnan(v) else v)
                       for k, v in data.items()})


def regressed(rows: Sequence[Comparison | CaseComparison]) -> bool:
    """A regression by a verdict that counts (not an indicative one-run mark)."""
    return any(c.verdict == "regression" and not c.indicative for c in rows)


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
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    parser.add_argument("--force", action="store_true",
                        help="compare even when world size, dtype, timing mode ... differ")
    parser.add_argument("--format", choices=("table", "json", "csv"), default="table",
                        help="print a table, JSON lines or CSV (default table)")


def main(args: argparse.Namespace) -> int:
    if args.resamples < 100:
        raise UsageError(f"--resamples must be >= 100, got {args.resamples}")
    base = load_records(args.base, require=True)
    new = load_records(args.new, require=True)
    rows, note = compare_records(base, new, threshold=args.threshold, force=args.force,
                                 confidence=args.confidence, resamples=args.resamples,
                                 seed=args.seed)
    cases = compare_cases(base, new, threshold=args.threshold, force=args.force,
                          confidence=args.confidence, resamples=args.resamples, seed=args.seed)
    if args.format == "table":
        _print_table(rows, cases, note, args.threshold, args.confidence)
    elif args.format == "json":
        for row in rows:
            print(_json_line(row, "size"))
        for case in cases:
            print(_json_line(case, "case"))
    else:
        writer = csv.DictWriter(sys.stdout, fieldnames=list(asdict(rows[0]).keys()))
        writer.writeheader()
        for row in rows:
            writer.writerow(asdict(row))
    return 1 if regressed(cases) else 0
