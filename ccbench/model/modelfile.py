"""model.json: the versioned file `ccbench calibrate` writes and `simulate` / `export` read."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import IO, Any, NotRequired, TypedDict, cast

from ccbench import __version__
from ccbench.errors import UsageError
from ccbench.model.costs import canonical_algorithm
from ccbench.model.fit import SELECTION, FitEntry, GroupFit
from ccbench.records import SCHEMA as RECORD_SCHEMA
from ccbench.records import Record
from ccbench.safeio import load_json, write_atomic

SCHEMA = "ccbench.model"
VERSION = 1
UNITS = {"alpha": "seconds", "beta": "seconds per byte", "gamma": "seconds per byte",
         "size": "bytes (the nccl-tests S of the collective)", "time": "seconds",
         "bandwidth": "GB/s, 1 GB = 1e9 bytes"}

_MODEL_CAP = 64 << 20      # a model of every backend and collective is tens of KiB

__all__ = ["SCHEMA", "VERSION", "ModelFile", "ModelSources", "build_model", "load_model",
           "save_model", "select_fit"]


class ModelSources(TypedDict):
    """What a model was calibrated from."""

    files: list[str]
    run_ids: list[str]
    records: int


class ModelFile(TypedDict):
    """model.json's top level. `load_model` checks schema, version and every fit (a
    `FitEntry`, as `GroupFit.to_json` writes it); the rest describes the model."""

    schema: str                             # SCHEMA
    version: int                            # VERSION
    fits: list[FitEntry]
    ccbench_version: NotRequired[str]
    created: NotRequired[str]               # ISO 8601, UTC
    units: NotRequired[dict[str, str]]
    formula: NotRequired[str]
    fit_method: NotRequired[str]
    selection: NotRequired[str]
    sources: NotRequired[ModelSources]


def build_model(fits: Sequence[GroupFit], records: Sequence[Record],
                sources: Sequence[str]) -> ModelFile:
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


def save_model(model: ModelFile, path: str | os.PathLike[str]) -> None:
    """Replace the model file whole or not at all (safeio.write_atomic): a full disk keeps
    the previous model and ends with one line."""
    text = (json.dumps(model, indent=1, sort_keys=False) + "\n").encode("utf-8")
    def write(handle: IO[bytes]) -> None:
        handle.write(text)

    write_atomic(path, write)


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


def load_model(path: str | os.PathLike[str]) -> ModelFile:
    try:
        model = load_json(path, cap=_MODEL_CAP, fixed="a model file of every backend and "
                          "collective is tens of KiB")
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
    if not isinstance(model["fits"], list):
        raise UsageError(f"{path}: \"fits\" is not a list of fits")
    for i, fit in enumerate(model["fits"]):
        try:
            _check_fit(fit)
        except UsageError as exc:
            raise UsageError(f"{path}: fit {i}: {exc} (a damaged or hand-edited model; "
                             f"`ccbench calibrate` writes a valid one)") from None
    return cast(ModelFile, model)


_NEED = ("backend", "library", "collective", "scope", "world_sizes", "model_algorithm",
         "alpha", "beta", "gamma", "goodness")
# what a fit's constants may hold, so that every prediction is a finite time: alpha at most
# an hour per step, beta and gamma at most a second per byte (1 B/s); records allow 2^50 B
_BOUNDS = {"alpha": 3600.0, "beta": 1.0, "gamma": 1.0}
_MAX_WORLD = 1 << 24
_MAX_BYTES = float(1 << 50)


def _number(value: Any, what: str, high: float, low: float = 0.0) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{what} is {value!r}, not a number")
    if not low <= value <= high:        # NaN fails both comparisons
        raise UsageError(f"{what} is {value!r}: must be finite, {low:g} to {high:g}")


def _check_constants(entry: Any, where: str) -> None:
    if not isinstance(entry, dict):
        raise UsageError(f"{where} is not an object")
    for name, high in _BOUNDS.items():
        if name not in entry:
            raise UsageError(f"{where} lacks {name}")
        _number(entry[name], f"{where}{' ' if where else ''}{name}".strip(), high)


def _check_fit(fit: Any) -> None:
    """UsageError naming the first field of a fit that cannot be predicted with."""
    missing = [k for k in _NEED if not isinstance(fit, dict) or k not in fit]
    if missing:
        raise UsageError(f"lacks {', '.join(missing)}")
    for name in ("backend", "library", "collective", "scope", "model_algorithm"):
        if not isinstance(fit[name], str):
            raise UsageError(f"{name} is {fit[name]!r}, not text")
    canonical_algorithm(fit["collective"], fit["model_algorithm"])
    for name, high in _BOUNDS.items():
        _number(fit[name], name, high)
    worlds = fit["world_sizes"]
    if not isinstance(worlds, list) or not worlds:
        raise UsageError(f"world_sizes is {worlds!r}, not a list of rank counts")
    for p in worlds:
        if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= _MAX_WORLD:
            raise UsageError(f"world_sizes holds {p!r}: rank counts are 1 to 2^24")
    goodness = fit["goodness"]
    if not isinstance(goodness, dict) or "points" not in goodness:
        raise UsageError(f"goodness is {goodness!r}, without its points")
    _number(goodness["points"], "goodness points", float(1 << 40))
    _check_optional(fit)


def _check_optional(fit: dict[str, Any]) -> None:   # a fit not yet checked
    """Pieces, the sizes seen and the flags, where a fit has them."""
    pieces = fit.get("pieces")
    if pieces is not None:
        if not isinstance(pieces, list):
            raise UsageError(f"pieces is {pieces!r}, not a list")
        for k, piece in enumerate(pieces):
            _check_constants(piece, f"piece {k}")
            if piece.get("max_bytes") is not None:
                _number(piece["max_bytes"], f"piece {k} max_bytes", _MAX_BYTES)
            elif k < len(pieces) - 1:
                raise UsageError(f"piece {k} has no max_bytes (only the last piece has none)")
    sizes = fit.get("sizes")
    if sizes is not None:
        if not isinstance(sizes, list) or len(sizes) != 2:
            raise UsageError(f"sizes is {sizes!r}, not [smallest, largest]")
        for value in sizes:
            _number(value, "sizes", _MAX_BYTES, 1e-300)
        if sizes[0] > sizes[1]:
            raise UsageError(f"sizes is {sizes!r}: the smallest comes first ([smallest, "
                             f"largest])")
    flags = fit.get("flags")
    if flags is not None and (not isinstance(flags, list)
                              or not all(isinstance(f, str) for f in flags)):
        raise UsageError(f"flags is {flags!r}, not a list of text")


def matches(fit: FitEntry, backend: str | None) -> bool:
    """`backend` may name the backend (mpi), the library (Open MPI) or both (mpi/Open MPI)."""
    if backend is None:
        return True
    b = backend.lower()
    return b in (fit["backend"].lower(), fit["library"].lower(),
                 f"{fit['backend']}/{fit['library']}".lower())


def select_fit(model: ModelFile, collective: str, ranks: int,
               backend: str | None = None) -> tuple[FitEntry, str]:
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


def default_algorithm(fit: FitEntry, collective: str) -> str:
    """The fit's formula when it is for this collective, else this collective's ring."""
    if fit["collective"] == collective:
        return fit["model_algorithm"]
    for name in ("ring", "pairwise", "tree"):
        try:
            return canonical_algorithm(collective, name)
        except UsageError:
            continue
    raise UsageError(f"no default algorithm for {collective}")
