"""Figures of `ccbench diagnose` records: the host-pair matrix as heat maps.

A diagnose record (method.diagnose) is one measurement of one pair (latency: a small
sendrecv; bandwidth: one direction's broadcast) or of the world. Per run, two heat maps:
payload rate from row host to column host (best of the pair's tries, as the verdict uses)
and pair latency, with the pairs and hosts that the run's findings name outlined in red
(the findings are recomputed from the records with the same analysis; the compute probe is
not recorded, so a compute finding is not drawn).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ccbench.diagnose.analyse import Expectation, Finding, PairMeasure, analyse, pair_table

__all__ = ["diagnose_figures", "is_diagnose_record", "leaves_of", "measures_of", "split_diagnose"]


def is_diagnose_record(record: Any) -> bool:
    return isinstance((record.method or {}).get("diagnose"), dict)


def split_diagnose(records: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """(other records, diagnose records)."""
    return ([r for r in records if not is_diagnose_record(r)],
            [r for r in records if is_diagnose_record(r)])


def measures_of(records: Sequence[Any]) -> tuple[list[str], list[PairMeasure], Expectation]:
    """One run's records back into the analysis' input: host names, measurements and the
    expectation the run used."""
    world = [r for r in records if r.method["diagnose"]["step"] == "world"]
    pairs = [r for r in records if r.method["diagnose"].get("pair")]
    names = (list(world[0].hosts) if world else
             sorted({h for r in pairs for h in r.method["diagnose"]["pair"]}))
    index = {n: i for i, n in enumerate(names)}
    expect = Expectation()
    by_key: dict[tuple[Any, ...], PairMeasure] = {}
    for r in pairs:
        info = r.method["diagnose"]
        if info.get("expected"):
            e = info["expected"]
            expect = Expectation(e.get("link_bps"), e.get("latency_us"),
                                 e.get("source", "relative"))
        a, b = (index.get(h, -1) for h in info["pair"])
        if a < 0 or b < 0:
            continue
        leaves = re.findall(r"leaf(\d+)", info["label"]) if info["step"] == "leaves" else []
        measure = by_key.setdefault((info["step"], info["label"], info["round"], a, b),
                                    PairMeasure(info["step"], info["round"], a, b,
                                                plane=info.get("plane"),
                                                leaves=(int(leaves[0]), int(leaves[1]))
                                                if len(leaves) == 2 else None))
        seconds = r.time_us["median"] * 1e-6
        if r.collective == "sendrecv":
            measure.lat_us = r.time_us["median"]
        elif info.get("direction") == "a->b":
            measure.bw_ab = r.size_used * 8 / seconds
        else:
            measure.bw_ba = r.size_used * 8 / seconds
    return names, list(by_key.values()), expect


def leaves_of(records: Sequence[Any], names: list[str]) -> list[list[int]] | None:
    """The leaves' hosts a run's leaf steps recorded (None: no leaf step, or records from
    before they were recorded)."""
    for r in records:
        hosts = r.method["diagnose"].get("leaf_hosts")
        if hosts:
            return [[names.index(h) for h in members if h in names] for members in hosts]
    return None


def _matrices(names: list[str], measures: list[PairMeasure]) -> tuple[Any, Any]:
    import numpy as np

    n = len(names)
    rate = np.full((n, n), np.nan)
    lat = np.full((n, n), np.nan)
    for (a, b), row in pair_table(measures).items():
        if row["bw_ab"] is not None:
            rate[a, b] = row["bw_ab"] / 1e6
        if row["bw_ba"] is not None:
            rate[b, a] = row["bw_ba"] / 1e6
        if row["lat_us"] is not None:
            lat[a, b] = lat[b, a] = row["lat_us"]
    return rate, lat


def _figure(names: list[str], measures: list[PairMeasure], findings: list[Finding],
            title: str) -> Any:
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.patches import Rectangle

    rate, lat = _matrices(names, measures)
    n = len(names)
    fig, axes = plt.subplots(1, 2, figsize=(5.2 + 0.5 * n, 2.6 + 0.25 * n),
                             constrained_layout=True)
    flagged_hosts = {h for f in findings for h in f.hosts}
    flagged_pairs = {tuple(p) for f in findings for p in f.pairs}
    for ax, matrix, label, cmap in ((axes[0], rate, "payload rate, row -> column (Mbit/s)",
                                     "viridis"),
                                    (axes[1], lat, "latency (us)", "viridis_r")):
        image = ax.imshow(np.ma.masked_invalid(matrix), cmap=cmap)
        fig.colorbar(image, ax=ax, shrink=0.8, label=label)
        ax.set_xticks(range(n), names, rotation=90 if n > 8 else 0, fontsize=8)
        ax.set_yticks(range(n), names, fontsize=8)
        for i in range(n):
            for j in range(n):
                if np.isfinite(matrix[i, j]) and n <= 12:
                    bright = image.norm(matrix[i, j]) > 0.5
                    if cmap.endswith("_r"):
                        bright = not bright
                    ax.text(j, i, f"{matrix[i, j]:.0f}", ha="center", va="center",
                            fontsize=6, color="black" if bright else "white")
                if (names[i], names[j]) in flagged_pairs or (names[j], names[i]) in \
                        flagged_pairs:
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False,
                                           edgecolor="red", linewidth=2))
        for tick in [*ax.get_xticklabels(), *ax.get_yticklabels()]:
            if tick.get_text() in flagged_hosts:
                tick.set_color("red")
                tick.set_fontweight("bold")
    verdict = "; ".join(f"{f.component}: {f.kind} ({f.measured} vs {f.expected})"
                        for f in findings) or "healthy: no finding"
    fig.suptitle(f"{title}\n{verdict}", fontsize=8)
    return fig


def diagnose_figures(records: Sequence[Any], directory: str | Path,
                     formats: Sequence[str] = ("png",)) -> list[Path]:
    """diagnose-<run id> per diagnose run; returns the files."""
    import matplotlib.pyplot as plt

    from ccbench.report import style  # noqa: F401  (selects the Agg backend first)

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[Any]] = {}
    for r in records:
        runs.setdefault(r.run_id, []).append(r)
    written: list[Path] = []
    for run_id, mine in sorted(runs.items()):
        names, measures, expect = measures_of(mine)
        if len(names) < 2 or not measures:
            continue
        findings = analyse(measures, expect, names, leaves=leaves_of(mine, names))
        first = min(r.timestamp for r in mine)
        fig = _figure(names, measures, findings, f"ccbench diagnose {run_id} ({first}, "
                      f"{mine[0].backend}, {len(names)} hosts)")
        for fmt in formats:
            path = directory / f"diagnose-{run_id}.{fmt}"
            fig.savefig(path, bbox_inches="tight", pad_inches=0.08,
                        metadata={"Software": None} if fmt == "png" else
                        {"Date": None, "Creator": None})
            written.append(path)
        plt.close(fig)
    return written
