"""Predictions from a model.json (written by `ccbench calibrate`) for the measured series.

Optional and forgiving: a fit that cannot be matched or evaluated is skipped with a
note; a model file that cannot be read at all is a UsageError (the user named it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, cast

from ccbench.units import size_label

__all__ = ["load", "predictions"]


# open-shaped: read forgivingly; without ccbench.model a model file is unchecked JSON
def load(path: str) -> Mapping[str, Any]:
    try:
        from ccbench.model.modelfile import load_model
    except ImportError:          # a build without the model package: read the JSON plainly
        pass
    else:
        return load_model(path)
    from ccbench.errors import UsageError
    from ccbench.safeio import load_json

    try:
        model = load_json(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read model file {path!r}: {exc}") from None
    if not isinstance(model, dict) or "fits" not in model:
        raise UsageError(f"{path}: not a ccbench model file (no fits)")
    return model


def _alpha_beta(fit: dict[str, Any], p: int, sizes) -> list[float] | None:
    """Seconds, through ccbench.model when present; None when the fit cannot be evaluated."""
    try:
        from ccbench.model.fit import FitLine, predict_from_fit

        return [float(x) for x in predict_from_fit(cast(FitLine, fit), p, sizes)]
    except Exception:  # noqa: BLE001 -- any failure of an optional overlay is a skipped curve
        return None


def _matches(fit: dict[str, Any], row: dict[str, Any]) -> bool:
    for name in ("backend", "collective", "device", "transport"):
        if name in fit and fit[name] is not None and str(fit[name]) != str(row[name]):
            return False
    if fit.get("library") and row.get("library") and fit["library"] != row["library"]:
        return False
    algo = fit.get("algorithm")
    # calibrate prices a "native" record with its library's own algorithm where that is
    # known (the fit's algorithm_source says from where): the fit names that algorithm
    if row.get("algorithm") == "native" and fit.get("algorithm_source", "the records") \
            != "the records":
        return True
    return not (algo and row.get("algorithm") and algo != row["algorithm"])


def _choose(fits: list[dict[str, Any]], p: int) -> tuple[dict[str, Any] | None, str]:
    at_p = [f for f in fits if p in (f.get("world_sizes") or []) and
            f.get("scope") != "all-world-sizes"]
    across = [f for f in fits if f.get("scope") == "all-world-sizes"]
    if at_p:
        return at_p[0], f"fit at {p} ranks"
    if across:
        return across[0], f"fit across {across[0].get('world_sizes')} ranks"
    return None, "no fit"


# model open-shaped: as load returns it (unchecked JSON without ccbench.model)
def predictions(frame, model: Mapping[str, Any]):
    """{(collective, series, world size): (sizes, predicted us)} and the same keys: note."""
    preds: dict[tuple[str, str, int], tuple[list[int], list[float]]] = {}
    notes: dict[tuple[str, str, int], str] = {}
    fits = [f for f in model.get("fits", []) if isinstance(f, dict)]
    if frame.empty or not fits:
        return preds, notes
    firsts = frame.drop_duplicates(["series", "collective", "world_size"])
    for _, row in firsts.iterrows():
        row = row.to_dict()
        mine = [f for f in fits if _matches(f, row)]
        key = (row["series"], int(row["world_size"]))
        chosen, why = _choose(mine, int(row["world_size"]))
        if chosen is None:
            continue
        sizes = sorted(int(s) for s in frame[(frame["series"] == row["series"]) &
                                             (frame["collective"] == row["collective"]) &
                                             (frame["world_size"] == row["world_size"])]["size"]
                       .unique())
        seconds = _alpha_beta(chosen, int(row["world_size"]), sizes)
        if seconds is None or not all(math.isfinite(x) for x in seconds):
            notes[(row["collective"],) + key] = "fit could not be evaluated"
            continue
        preds[(row["collective"],) + key] = (sizes, [x * 1e6 for x in seconds])
        pieces = chosen.get("pieces") or []
        split = next((pc.get("max_bytes") for pc in pieces if pc.get("max_bytes")), None)
        notes[(row["collective"],) + key] = (
            f"{why}, {chosen.get('model_algorithm', '?')}"
            + (f", two pieces split at {size_label(split)}" if split else ""))
    return preds, notes
