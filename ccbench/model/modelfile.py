"""model.json: the versioned file `ccbench calibrate` writes and `simulate` / `export` read."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from ccbench import __version__
from ccbench.errors import UsageError
from ccbench.model.costs import canonical_algorithm
from ccbench.model.fit import SELECTION, GroupFit
from ccbench.records import SCHEMA as RECORD_SCHEMA
from ccbench.records import Record
from ccbench.safeio import load_json

SCHEMA = "ccbench.model"
VERSION = 1
UNITS = {"alpha": "seconds", "beta": "seconds per byte", "gamma": "seconds per byte",
         "size": "bytes (the nccl-tests S of the collective)", "time": "seconds",
         "bandwidth": "GB/s, 1 GB = 1e9 bytes"}

_MODEL_CAP = 64 << 20      # a model of every backend and collective is tens of KiB

__all__ = ["SCHEMA", "VERSION", "build_model", "load_model", "save_model", "select_fit"]


def build_model(fits: Sequence[GroupFit], records: Sequence[Record],
                sources: Sequence[str]) -> dict[str, Any]:
    runs: dict[str, set[str]] = defaultdict(set)
    for r in records:
        runs[r.run_id].add(r.collective)
    return {
        "schema": SCHEMA, "version": VERSION, "ccbench_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "units": UNITS,
        "formula": "T(n, p) = a(p) alpha + b(p) n beta + c(p) n gamma "
                   "(coefficients: ccbench.model.costs, Thakur, Rabenseifner & Gropp 2005)",
        "fit_method": "non-negative least squares on relative error (rows weighted 1/t); "
                      "95 % bootstrap intervals over iteration samples",
        "selection": SELECTION,
        "sources": {"files": list(sources), "run_ids": sorted(runs), "records": len(records)},
        "fits": [f.to_json() for f in fits],
    }


def save_model(model: dict[str, Any], path: str | os.PathLike[str]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(model, handle, indent=1, sort_keys=False)
        handle.write("\n")


_RECORDS_NOT_MODEL = ("{path} is a records file (what a run writes), not a model: calibrate "
                      "it first (ccbench calibrate {path} -o model.json), then simulate "
                      "model.json")


def _holds_records(path: str | os.PathLike[str]) -> bool:
    """Whether the file's first line is a ccbench record (JSON lines from a run)."""
    try:
        with open(path, "rb") as handle:
            first = handle.readline(1 << 20)
        data = json.loads(first)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("schema") == RECORD_SCHEMA


def load_model(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        model = load_json(path, cap=_MODEL_CAP)
    except FileNotFoundError:
        raise UsageError(f"no such model file: {str(path)!r}") from None
    except json.JSONDecodeError as exc:
        if _holds_records(path):
            raise UsageError(_RECORDS_NOT_MODEL.format(path=path)) from None
        raise UsageError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a ccbench model file (not UTF-8 text)") from None
    except OSError as exc:
        raise UsageError(f"cannot read model file {str(path)!r}: {exc.strerror or exc}") from None
    if isinstance(model, dict) and model.get("schema") == RECORD_SCHEMA:
        raise UsageError(_RECORDS_NOT_MODEL.format(path=path))
    if not isinstance(model, dict) or model.get("schema") != SCHEMA:
        raise UsageError(f"{path}: not a ccbench model file (run `ccbench calibrate` first)")
    if model.get("version") != VERSION:
        raise UsageError(f"{path}: unknown model version {model.get('version')!r} "
                         f"(this ccbench reads: {VERSION})")
    if not model.get("fits"):
        raise UsageError(f"{path}: the model has no fits")
    need = ("backend", "library", "collective", "scope", "world_sizes", "model_algorithm",
            "alpha", "beta", "gamma", "goodness")
    for i, fit in enumerate(model["fits"]):
        missing = [k for k in need if not isinstance(fit, dict) or k not in fit]
        if missing:
            raise UsageError(f"{path}: fit {i} lacks {', '.join(missing)}")
        try:
            canonical_algorithm(fit["collective"], fit["model_algorithm"])
        except UsageError as exc:
            raise UsageError(f"{path}: fit {i}: {exc}") from None
        if min(fit["alpha"], fit["beta"], fit["gamma"]) < 0:
            raise UsageError(f"{path}: fit {i} has a negative alpha, beta or gamma")
    return model


def matches(fit: dict[str, Any], backend: str | None) -> bool:
    """`backend` may name the backend (mpi), the library (Open MPI) or both (mpi/Open MPI)."""
    if backend is None:
        return True
    b = backend.lower()
    return b in (fit["backend"].lower(), fit["library"].lower(),
                 f"{fit['backend']}/{fit['library']}".lower())


def select_fit(model: dict[str, Any], collective: str, ranks: int,
               backend: str | None = None) -> tuple[dict[str, Any], str]:
    """The fit to predict `collective` at `ranks` with, and a line saying why.

    Preference: same collective across world sizes; same collective at the nearest world
    size; another collective of the same backend (alpha, beta, gamma are link constants;
    its formula is replaced by one of this collective).
    """
    fits = [f for f in model["fits"] if matches(f, backend)]
    if not fits:
        valid = sorted({f"{f['backend']}/{f['library']}" for f in model["fits"]})
        raise UsageError(f"no fit for backend {backend!r} in the model (valid: {', '.join(valid)})")
    libs = sorted({f"{f['backend']}/{f['library']}" for f in fits})
    if len(libs) > 1:
        raise UsageError(f"the model holds fits of {len(libs)} backends; choose one with "
                         f"--backend (valid: {', '.join(repr(x) for x in libs)})")
    more = ""
    same = [f for f in fits if f["collective"] == collective]
    if same:
        across = [f for f in same if f["scope"] == "all-world-sizes"]
        if across:
            best = max(across, key=lambda f: f["goodness"]["points"])
            return best, (f"{best['backend']}/{best['library']} {collective} fit across world "
                          f"sizes {best['world_sizes']}{more}")
        best = min(same, key=lambda f: (abs(f["world_sizes"][0] - ranks),
                                        -f["goodness"]["points"]))
        return best, (f"{best['backend']}/{best['library']} {collective} fit at world size "
                      f"{best['world_sizes'][0]} (nearest){more}")
    other = max(fits, key=lambda f: (f["scope"] == "all-world-sizes", f["goodness"]["points"]))
    return other, (f"no {collective} fit: alpha/beta/gamma of the {other['collective']} fit "
                   f"({other['backend']}/{other['library']}){more}")


def default_algorithm(fit: dict[str, Any], collective: str) -> str:
    """The fit's formula when it is for this collective, else this collective's ring."""
    if fit["collective"] == collective:
        return fit["model_algorithm"]
    for name in ("ring", "pairwise", "tree"):
        try:
            return canonical_algorithm(collective, name)
        except UsageError:
            continue
    raise UsageError(f"no default algorithm for {collective}")
