"""Figures of `ccbench diagnose` records: the host-pair matrix as heat maps.

A diagnose record (method.diagnose) is one measurement of one pair (latency: a small
sendrecv; bandwidth: one direction's broadcast) or of the world. Per run, two heat maps:
payload rate from row host to column host (best of the pair's tries) and pair latency,
laid out for the paper's width, under a one-line title. Every finding of the run is
numbered and listed under the maps, and drawn on them: a pair's cells outlined, a host's
row and column outlined and its name in red (a port, a NIC, a link of that host), a finding
of no one pair or host (every path, a plane, the cluster) as a frame around both maps.

The findings are the run's own, as it recorded them (method.diagnose.findings on its
records, whatever --leaves form the run had); records of a run that recorded none get the
findings recomputed from the measurements, and the figure says so.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ccbench.diagnose.analyse import Expectation, Finding, PairMeasure, analyse, pair_table

__all__ = ["diagnose_figures", "is_diagnose_record", "leaves_of", "measures_of",
           "recorded_findings", "split_diagnose"]


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


def recorded_findings(records: Sequence[Any]) -> list[Finding] | None:
    """The verdict the run recorded (the last record that carries one), None if none did."""
    found = None
    for r in sorted(records, key=lambda r: r.timestamp):
        value = r.method["diagnose"].get("findings")
        if isinstance(value, list):
            found = value
    if found is None:
        return None
    names = set(Finding.__dataclass_fields__)
    return [Finding(**{k: v for k, v in f.items() if k in names}) for f in found
            if isinstance(f, dict) and {"component", "kind"} <= set(f)]


def _finding_line(number: int, f: Finding) -> str:
    measured = f" ({f.measured} vs {f.expected})" if f.measured or f.expected else ""
    return f"{number}. {f.component}: {f.kind}{measured}"


def _mark_findings(ax: Any, names: list[str], findings: list[Finding]) -> None:
    """Outline every finding's pairs and hosts, with its number (several findings of one
    cell or host: their numbers together)."""
    from matplotlib.patches import Rectangle

    n = len(names)
    cells: dict[tuple[int, int], list[int]] = {}
    columns: dict[int, list[int]] = {}
    whole: list[int] = []
    dashed = (0, (3, 1.5))
    for number, f in enumerate(findings, start=1):
        pairs = [p for p in f.pairs if len(p) == 2 and p[0] in names and p[1] in names]
        hosts = [names.index(h) for h in f.hosts if h in names]
        for a, b in pairs:
            i, j = names.index(a), names.index(b)
            for r, c in ((i, j), (j, i)):
                cells.setdefault((r, c), []).append(number)
        if not pairs and hosts and len(hosts) < n:
            for k in hosts:
                columns.setdefault(k, []).append(number)
        elif not pairs:      # every host, or none: the whole matrix
            whole.append(number)
    for (r, c), numbers in cells.items():
        ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="red",
                               linewidth=1.4))
        ax.text(c + 0.45, r - 0.45, ",".join(map(str, numbers)), color="red", fontsize=7,
                ha="right", va="top", fontweight="bold")
    for k, numbers in columns.items():
        ax.add_patch(Rectangle((-0.5, k - 0.5), n, 1, fill=False, edgecolor="red",
                               linewidth=1.0, linestyle=dashed))
        ax.add_patch(Rectangle((k - 0.5, -0.5), 1, n, fill=False, edgecolor="red",
                               linewidth=1.0, linestyle=dashed))
        ax.text(k, -0.55, ",".join(map(str, numbers)), color="red", fontsize=7, ha="center",
                va="bottom", fontweight="bold", clip_on=False)
    if whole:
        ax.add_patch(Rectangle((-0.5, -0.5), n, n, fill=False, edgecolor="red", linewidth=2.0))
        ax.text(-0.6, -0.55, ",".join(map(str, whole)), color="red", fontsize=7, ha="right",
                va="bottom", fontweight="bold", clip_on=False)


def _figure(names: list[str], measures: list[PairMeasure], findings: list[Finding],
            title: str, paper_name: str = "double", recomputed: bool = False) -> Any:
    import matplotlib
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from ccbench.report import style
    from ccbench.report.paper import PAPERS, Grid, rc_for, wrap_text

    paper = PAPERS[paper_name]
    rate, lat = _matrices(names, measures)
    n = len(names)
    lines = [_finding_line(k, f) for k, f in enumerate(findings, start=1)] or \
        ["healthy: no finding"]
    if recomputed:
        lines.append("(findings recomputed from the records: the run recorded no verdict)")
    text = "\n".join(wrap_text(line, paper, paper.width - 0.3, paper.tick) for line in lines)
    footer = (text.count("\n") + 1) * paper.tick * 1.4 / 72 + 0.6
    host_chars = max(len(h) for h in names)
    under = (host_chars + 1) * paper.char_in + 0.32 + 0.1     # host names, colour bar
    grid = Grid.plan(paper, 2, header=1, left_chars=host_chars, gap_chars=host_chars + 2,
                     min_w=max(1.3, 0.17 * n + 0.55), aspect=0.82, footer_in=footer,
                     ylabel=False, xlabel=False, gap_in=under)[0]
    flagged = {h for f in findings for h in f.hosts}
    with matplotlib.rc_context(style.RC | rc_for(paper) | {"axes.grid": False}):
        fig, axes = grid.figure()
        FigureCanvasAgg(fig)
        for k, (ax, matrix, label, cmap) in enumerate((
                (axes[0], rate, "payload rate, row -> column (Mbit/s)", "viridis"),
                (axes[1], lat, "pair latency (µs)", "viridis_r"))):
            image = ax.imshow(np.ma.masked_invalid(matrix), cmap=cmap, aspect="auto")
            _cell_values(ax, image, matrix, cmap, n, grid.panel_w / n)
            ax.set_xticks(range(n), names, rotation=90)
            ax.set_yticks(range(n), names)
            ax.tick_params(length=1.5)
            for tick in [*ax.get_xticklabels(), *ax.get_yticklabels()]:
                if tick.get_text() in flagged:
                    tick.set_color("red")
                    tick.set_fontweight("bold")
            _mark_findings(ax, names, findings)
            _colour_bar(fig, ax, image, label, grid, k)
        fig.suptitle(title, y=1 - 0.04 / grid.height, va="top")
        fig.text(0.02, 0.04 / grid.height, text, fontsize=paper.tick, va="bottom",
                 ha="left", color="0.1")
    return fig


def _cell_values(ax: Any, image: Any, matrix: Any, cmap: str, n: int, cell_in: float) -> None:
    """Each cell's value, where a cell is wide enough for three digits at 7 pt."""
    import numpy as np

    if cell_in < 0.24:
        return
    for i in range(n):
        for j in range(n):
            if np.isfinite(matrix[i, j]):
                bright = image.norm(matrix[i, j]) > 0.5
                if cmap.endswith("_r"):
                    bright = not bright
                ax.text(j, i, f"{matrix[i, j]:.0f}", ha="center", va="center", fontsize=7,
                        color="black" if bright else "white")


def _colour_bar(fig: Any, ax: Any, image: Any, label: str, grid: Any, k: int) -> None:
    """A horizontal colour bar under the map, below its host names."""
    from matplotlib.ticker import MaxNLocator

    box = ax.get_position()
    names_h = (max(len(t.get_text()) for t in ax.get_xticklabels()) + 1) * grid.paper.char_in
    y = box.y0 - (names_h + 0.32) / grid.height
    bar_ax = fig.add_axes((box.x0, y, box.width, 0.07 / grid.height), label="<colorbar>")
    bar = fig.colorbar(image, cax=bar_ax, orientation="horizontal")
    bar.ax.xaxis.set_major_locator(MaxNLocator(4))
    bar.ax.xaxis.set_label_position("top")
    bar.set_label(label, labelpad=2)
    bar.ax.tick_params(length=1.5)


def diagnose_figures(records: Sequence[Any], directory: str | Path,
                     formats: Sequence[str] = ("png",), paper: str = "double",
                     workers: int | None = None) -> list[Path]:
    """diagnose-<run id> per diagnose run, drawn in worker processes; returns the files."""
    from ccbench.report import parallel_map

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[Any]] = {}
    for r in records:
        runs.setdefault(r.run_id, []).append(r)
    calls = [(run_id, mine, directory, tuple(formats), paper)
             for run_id, mine in sorted(runs.items())]
    return [path for paths in parallel_map(_run_figure, calls, workers) for path in paths]


def _run_figure(run_id: str, mine: list[Any], directory: Path, formats: tuple[str, ...],
                paper: str) -> list[Path]:
    from ccbench.report.paper import METADATA, PAPERS

    names, measures, expect = measures_of(mine)
    if len(names) < 2 or not measures:
        return []
    findings = recorded_findings(mine)
    recomputed = findings is None
    if findings is None:
        findings = analyse(measures, expect, names, leaves=leaves_of(mine, names))
    first = min(r.timestamp for r in mine)
    fig = _figure(names, measures, findings, f"diagnose {run_id[:12]}: {len(names)} hosts, "
                  f"{mine[0].backend}, {first[:16].replace('T', ' ')}", paper, recomputed)
    written = []
    for fmt in formats:
        path = directory / f"diagnose-{run_id}.{fmt}"
        fig.savefig(path, dpi=PAPERS[paper].dpi, metadata=METADATA[fmt])
        written.append(path)
    return written
