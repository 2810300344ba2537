"""The verdict of `ccbench diagnose`: the plan up front, then findings as a table or JSON."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO, TypedDict, cast

from ccbench.diagnose.analyse import (
    Expectation,
    Finding,
    FindingJson,
    PairMeasure,
    TryFields,
    WorldResult,
    analyse,
    pair_table,
)
from ccbench.diagnose.counters import CounterDelta
from ccbench.diagnose.plan import Step, StepJson
from ccbench.units import rate_text

__all__ = ["MeasurementJson", "PairJson", "VerdictJson", "findings_of", "format_plan",
           "pair_lines", "print_verdict", "verdict_json"]

COLUMNS = ("component", "kind", "measured", "expected", "evidence", "confidence")


class Percents(TypedDict, total=False):
    """Against an absolute expectation only: the slower direction's rate, and expected /
    measured latency, in percent."""

    pct_of_expected: float
    latency_pct_of_expected: float


class PairJson(Percents):
    """A pair's best try, by host name."""

    a: str
    b: str
    bw_ab_bps: float | None
    bw_ba_bps: float | None
    latency_us: float | None
    tries: int


class MeasurementJson(Percents, TryFields):
    """One try of one pair (PairMeasureJson with host names for a and b)."""

    a: str
    b: str


class ExpectedJson(TypedDict):
    link_bps: float | None
    latency_us: float | None
    source: str


class VerdictJson(TypedDict):
    """`ccbench diagnose --format json` and the verdict file."""

    findings: list[FindingJson]
    pairs: list[PairJson]
    plan: list[StepJson]
    measurements: list[MeasurementJson]
    hosts: list[str]
    world: WorldResult | None
    compute_s: dict[str, list[float]]
    counters: dict[str, dict[str, CounterDelta]]
    expected: ExpectedJson


def _rate(bps: float | None) -> str:
    """In Mbit/s throughout, so that the rows of a pair table compare at a glance."""
    return "-" if bps is None else rate_text(bps, unit="M")


def format_plan(steps: list[Step], names: list[str], expect: Expectation, seconds: float,
                backend: str) -> list[str]:
    source = ("relative to the pairs' median" if expect.link_bps is None
              else f"link {_rate(expect.link_bps)} ({expect.source})")
    rails = sum(1 for n in names if n.endswith(" rail 0"))
    shown = (f"{rails} hosts x {len(names) // rails} rails ({', '.join(names)})"
             if rails and all(" rail " in n for n in names) else
             f"{len(names)} hosts ({' '.join(names)})")
    lines = [f"ccbench diagnose: {shown}, backend {backend}, "
             f"{len(steps)} steps, estimated {seconds:.0f} s; expected: {source}"]
    for number, step in enumerate(steps, 1):
        pairs = " ".join(f"{names[a]}-{names[b]}" for a, b in step.pairs)
        lines.append(f"  {number:>3} {step.label}{': ' + pairs if pairs else ''}")
    return lines


def findings_of(collected: Any, oversub: float = 1.0) -> list[Finding]:
    return analyse(collected.measures, collected.expect, collected.names,
                   collected.compute_s, collected.leaves, oversub, collected.world,
                   collected.stopped, getattr(collected, "counters", None),
                   getattr(collected, "reach", None), getattr(collected, "startup", None),
                   getattr(collected, "midrun", None), getattr(collected, "ended", None))


def verdict_json(collected: Any, findings: list[Finding]) -> VerdictJson:
    names, expect = collected.names, collected.expect
    table = pair_table(collected.measures)
    pairs: list[PairJson] = [{"a": names[a], "b": names[b], "bw_ab_bps": row["bw_ab"],
              "bw_ba_bps": row["bw_ba"], "latency_us": row["lat_us"], "tries": row["tries"],
              **_percents(expect, row["bw"], row["lat_us"])}
             for (a, b), row in sorted(table.items())]
    return {"findings": [f.to_json() for f in findings], "pairs": pairs,
            "plan": [s.to_json() for s in collected.steps],
            "measurements": [_measurement(m, names, expect) for m in collected.measures],
            "hosts": names, "world": collected.world,
            "compute_s": {names[h]: v for h, v in collected.compute_s.items()},
            "counters": {names[h]: v for h, v in getattr(collected, "counters", {}).items()
                         if v},
            "expected": {"link_bps": collected.expect.link_bps,
                         "latency_us": collected.expect.latency_us,
                         "source": collected.expect.source}}


def _measurement(m: PairMeasure, names: list[str], expect: Expectation) -> MeasurementJson:
    # PairMeasureJson's keys in its order, a and b (host numbers) replaced by the names
    out = cast(MeasurementJson, {**m.to_json(), "a": names[m.a], "b": names[m.b]})
    out.update(_percents(expect, m.bw, m.lat_us))
    return out


def _percents(expect: Expectation, bps: float | None, lat_us: float | None) -> Percents:
    """`pct_of_expected` (the slower direction's rate) and `latency_pct_of_expected`
    (expected / measured), where there is an absolute expectation."""
    out: Percents = {}
    rate, latency = expect.rate_percent(bps), expect.latency_percent(lat_us)
    if rate is not None:
        out["pct_of_expected"] = rate
    if latency is not None:
        out["latency_pct_of_expected"] = latency
    return out


def _percent_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} %"


def pair_lines(collected: Any) -> list[str]:
    """Every pair's best try, with `% of expected` where an expectation exists."""
    names, expect = collected.names, collected.expect
    table = pair_table(collected.measures)
    if not table:
        return []
    latency = expect.latency_us is not None
    header = ["pair", "a->b", "b->a", "latency", "% of expected"] + (
        ["latency % of expected"] if latency else [])
    rows = []
    for (a, b), row in sorted(table.items()):
        cells = [f"{names[a]}-{names[b]}", _rate(row["bw_ab"]), _rate(row["bw_ba"]),
                 "-" if row["lat_us"] is None else f"{row['lat_us']:.0f} us",
                 _percent_text(expect.rate_percent(row["bw"]))]
        if latency:
            cells.append(_percent_text(expect.latency_percent(row["lat_us"])))
        rows.append(cells)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    return ["  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
            for cells in [header, *rows]]


def print_verdict(collected: Any, findings: list[Finding], fmt: str,
                  stream: TextIO = sys.stdout) -> None:
    if fmt == "json":
        print(json.dumps(verdict_json(collected, findings), indent=1), file=stream)
        return
    table = pair_table(collected.measures)
    rates = sorted(row["bw"] for row in table.values() if row["bw"] is not None)
    lats = sorted(row["lat_us"] for row in table.values() if row["lat_us"] is not None)
    if rates:
        print(f"# {len(table)} pairs: rate min {_rate(rates[0])}, median "
              f"{_rate(rates[len(rates) // 2])}, max {_rate(rates[-1])}; latency median "
              f"{lats[len(lats) // 2]:.0f} us" if lats else "", file=stream)
    if collected.world:
        print(f"# world {collected.world['label']}: {collected.world['time_us']:.0f} us, "
              f"bus bandwidth {_rate(collected.world['busbw_bps'])}", file=stream)
    for line in pair_lines(collected):
        print(line, file=stream)
    if not findings:
        print("verdict: healthy (no finding)", file=stream)
        return
    rows = [[getattr(f, c) for c in COLUMNS] for f in findings]
    widths = [min(60, max(len(c), *(len(r[i]) for r in rows))) for i, c in enumerate(COLUMNS)]
    print(f"verdict: {len(findings)} finding{'s' if len(findings) > 1 else ''}", file=stream)
    print("  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True)).rstrip(),
          file=stream)
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip(),
              file=stream)
