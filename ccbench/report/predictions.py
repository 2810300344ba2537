"""Predictions from `ccbench simulate -o FILE.jsonl` beside measurements.

Predicted records (method.predicted) carry a world size and a topology nobody measured,
so they get their own figure per collective: bus bandwidth against size, measured
medians as markers (one colour per measured series and world size), predictions as
lines (solid: replay, dashed: analytical), labelled with ranks, topology and fidelity.
Bus bandwidth, not time, so that 2 measured ranks and 16384 predicted ones share an axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["is_prediction", "split_predictions", "prediction_figure", "prediction_figures"]


def is_prediction(record: Any) -> bool:
    return bool((record.method or {}).get("predicted"))


def split_predictions(records: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """(measured, predicted)."""
    measured = [r for r in records if not is_prediction(r)]
    return measured, [r for r in records if is_prediction(r)]


def _curves(records: Sequence[Any]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        method = r.method or {}
        label = (f"{r.backend} {r.algorithm}, {r.world_size} ranks, {r.transport}, "
                 f"{method.get('fidelity', '?')}")
        out.setdefault(label, []).append((r.size_used, r.busbw_gbps))
    return out


def prediction_figures(measured: Sequence[Any], predicted: Sequence[Any], directory: str | Path,
                       formats: Sequence[str] = ("png",), paper: str = "double") -> list[Path]:
    """One figure per predicted collective; returns the files written."""
    import matplotlib.pyplot as plt

    from ccbench.report.paper import METADATA, PAPERS

    sheet = PAPERS[paper]
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for collective in sorted({r.collective for r in predicted}):
        fig = prediction_figure(collective, [r for r in predicted if r.collective == collective],
                                [r for r in measured if r.collective == collective], paper)
        for fmt in formats:
            path = directory / f"predictions-{collective}.{fmt}"
            fig.savefig(path, dpi=sheet.dpi, metadata=METADATA[fmt])
            written.append(path)
        plt.close(fig)
    return written


def prediction_figure(collective: str, preds: Sequence[Any], meas: Sequence[Any],
                      paper: str = "double") -> Any:
    """Bus bandwidth against size: measured medians as markers, predictions as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ccbench.report.data import series_label
    from ccbench.report.paper import PAPERS, rc_for
    from ccbench.report.style import RC, set_size_axis

    sheet = PAPERS[paper]
    with plt.rc_context(RC | rc_for(sheet)):
        fig, ax = plt.subplots(figsize=(sheet.width, max(3.0, sheet.width * 0.8)),
                               layout="constrained")
        groups: dict[str, list[tuple[int, float]]] = {}
        for r in meas:
            groups.setdefault(f"{series_label(r)}, {r.world_size} ranks (measured)",
                              []).append((r.size_used, r.busbw_gbps))
        for label, points in sorted(groups.items()):
            points.sort()
            ax.plot([s for s, _ in points], [b for _, b in points], linestyle="none",
                    marker="o", label=label)
        for label, points in sorted(_curves(preds).items()):
            points.sort()
            ax.plot([s for s, _ in points], [b for _, b in points],
                    linestyle="--" if label.endswith("analytical") else "-",
                    label=f"{label} (predicted)")
        sizes = [r.size_used for r in list(preds) + list(meas)]
        set_size_axis(ax, min(sizes), max(sizes), max_ticks=int(sheet.width / 0.5))
        ax.set_yscale("log")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"{collective}: predictions beside measurements")
        fig.legend(loc="outside lower center", ncols=1)
    return fig
