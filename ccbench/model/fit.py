"""Fit alpha, beta, gamma to measured records.

Method
------
* A point is one record: p = world_size, n = size_used (bytes), t = median of the
  per-iteration samples (seconds). Rows of the design matrix are the cost-formula
  coefficients (a(p), b(p) n, c(p) n) of the algorithm (ccbench.model.costs).
* Non-negative least squares on *relative* error: every row and target is divided by
  t, so a 10 us point weighs as much as a 10 s one. With three unknowns the NNLS is
  solved exactly by trying every subset of free variables (the KKT optimum is one of
  the 7 unconstrained least-squares solutions on a subset); no scipy needed.
* beta and gamma both multiply n. For every formula of one collective the ratio
  c(p)/b(p) is fixed (ring allreduce: 1/2 at every p), so gamma cannot be separated
  from beta using that collective alone. When a non-reducing collective (allgather,
  broadcast, all-to-all) of the same backend/transport/device was measured, its beta
  is taken as given and only alpha and gamma are fitted ("gamma_source"); otherwise
  gamma is 0 and beta carries the reduction cost (said so in the fit's notes).
* Groups: per (backend, library, transport, device, collective, algorithm, world
  size) and, because alpha/beta/gamma are per-link constants and the coefficients
  carry p, across the world sizes of one (backend, ..., algorithm). Prediction at a
  new p uses the across-p fit.
* algorithm "native" (the library chooses): every candidate formula is fitted and the
  one with the lowest median relative error is kept (ties: the first in the formula
  table order). At one world size, formulas that differ only in a(p)/b(p) scaling fit
  equally well; the across-p fit is what tells them apart.
* Bootstrap: each replicate resamples every record's iteration samples with
  replacement, takes the median again and refits: 95 % percentile interval on alpha,
  beta, gamma.
* Piecewise: when one line leaves a max relative error above 10 %, every split of the
  sorted sizes into two ranges (each >= 3 sizes) is tried; the best split is kept
  when it at least halves the sum of squared relative errors (a protocol switch, an
  eager/rendezvous threshold). The breakpoint is reported in bytes.
* Goodness: R^2 of log t against log prediction, median and max relative error.
  Held-out: fit on every other size, predict the rest; across p, leave one world size
  out and predict it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

import numpy as np

from ccbench.collectives import COLLECTIVES, REDUCING
from ccbench.errors import UsageError
from ccbench.model.costs import candidates, canonical_algorithm, coefficients
from ccbench.model.library_algorithms import library_algorithm
from ccbench.records import CaseId, Record

__all__ = ["Candidate", "FitEntry", "FitGroup", "FitLine", "Goodness", "GroupFit", "HeldOut",
           "Holdout", "LineFit", "Piece", "Point", "SizesHoldout", "ValidationRow",
           "ValidationSummary", "FIT_GROUP_FIELDS", "calibrate", "fit_key", "fit_line",
           "nnls_small", "piece_end", "points_from_records", "predict_from_fit", "summarize_validation",
           "validate_world_sizes"]

NON_REDUCING = tuple(c for c in COLLECTIVES if c not in REDUCING)
# A fit group: the case identity fields one alpha-beta-gamma fit is made for (it pools dtypes,
# ops, modes, world sizes and runs). Not the case identity itself: see ccbench.records.CaseId.
FIT_GROUP_FIELDS = ("backend", "library", "transport", "device", "collective", "algorithm")
LINK_FIELDS = ("backend", "library", "transport", "device")
SELECTION = "lowest median relative error over the group's points (ties: formula-table order)"


class FitGroup(TypedDict):
    """The group one fit is made for: the case fields FIT_GROUP_FIELDS names."""

    backend: str
    library: str
    transport: str
    device: str
    collective: str
    algorithm: str                      # as measured: "native" or a named algorithm


def fit_group_of(case: CaseId) -> FitGroup:
    return {"backend": case.backend, "library": case.library, "transport": case.transport,
            "device": case.device, "collective": case.collective, "algorithm": case.algorithm}


def group_fields(entry: FitGroup) -> FitGroup:
    """The FitGroup fields alone of a fit, a validation row or a summary."""
    return {"backend": entry["backend"], "library": entry["library"],
            "transport": entry["transport"], "device": entry["device"],
            "collective": entry["collective"], "algorithm": entry["algorithm"]}


def _group_values(group: FitGroup) -> tuple[str, ...]:
    return (group["backend"], group["library"], group["transport"], group["device"],
            group["collective"], group["algorithm"])


class Piece(TypedDict):
    """One size range of a piecewise fit: its constants up to `max_bytes` (None: every larger
    size)."""

    max_bytes: float | None
    alpha: float
    beta: float
    gamma: float
    alpha_source: NotRequired[str]      # the upper piece: its own alpha or the lower piece's


def piece_end(piece: Piece) -> int:
    """The largest size (bytes) a piece covers; only the last piece of a fit has none."""
    end = piece["max_bytes"]
    if end is None:
        raise UsageError("a piece other than the last has no max_bytes")
    return int(end)


class Goodness(TypedDict):
    r2_log: float
    median_rel_err: float
    max_rel_err: float
    points: int


class Candidate(TypedDict):
    """A formula tried for a "native" group, and how well it fitted."""

    algorithm: str
    median_rel_err: float
    max_rel_err: float


class HeldOut(TypedDict):
    """How far off predictions were on points the fit did not see."""

    median_rel_err: float
    max_rel_err: float


class SizesHoldout(HeldOut):
    method: str


class Holdout(TypedDict, total=False):
    sizes: SizesHoldout | str           # text: why there is none ("too few sizes")
    world_sizes: dict[str, str | HeldOut]   # "method": how; "<p>": that world size left out


class FitLine(TypedDict):
    """What a prediction reads from a fit (predict_from_fit)."""

    collective: str
    model_algorithm: str                # the formula's key (ccbench.model.costs)
    alpha: float
    beta: float
    gamma: float
    pieces: NotRequired[list[Piece] | None]


class FitEntry(FitLine):
    """One fit of model.json, as GroupFit.to_json writes it; `load_model` checks the
    required keys (and the pieces, sizes and flags where a fit has them)."""

    backend: str
    library: str
    scope: str                          # "world-size" | "all-world-sizes"
    world_sizes: list[int]
    goodness: Goodness
    transport: NotRequired[str]
    device: NotRequired[str]
    algorithm: NotRequired[str]
    gamma_source: NotRequired[str]
    ci95: NotRequired[dict[str, list[float]] | None]
    candidates: NotRequired[list[Candidate]]
    holdout: NotRequired[Holdout]
    notes: NotRequired[list[str]]
    sizes: NotRequired[list[float]]     # [smallest, largest] bytes seen
    flags: NotRequired[list[str]]
    algorithm_source: NotRequired[str]


class ValidationRow(FitGroup):
    """One record predicted from the fits of other world sizes (validate_world_sizes)."""

    world_size: int
    size: int
    dtype: str
    inplace: bool
    measured_s: float
    predicted_s: float
    rel_err: float


class ValidationSummary(FitGroup):
    """The prediction errors of one group at one world size (summarize_validation)."""

    world_size: int
    sizes: int
    median_rel_err: float
    p90_rel_err: float
    max_rel_err: float


@dataclass(slots=True)
class Point:
    p: int
    n: float              # bytes
    t: float              # seconds (median of samples)
    samples: np.ndarray   # seconds
    source: str = ""


def points_from_records(records: Iterable[Record]) -> list[Point]:
    out = []
    for r in records:
        samples = np.asarray(r.samples_us, dtype=float) * 1e-6
        if samples.size == 0:
            t = float(r.time_us["median"]) * 1e-6
            samples = np.array([t])
        else:
            t = float(np.median(samples))
        if t <= 0 or r.size_used <= 0:
            continue
        out.append(Point(r.world_size, float(r.size_used), t, samples, r.run_id))
    return out


def nnls_small(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """min ||a x - y|| subject to x >= 0, exactly, for a with few columns."""
    m, k = a.shape
    best, best_res = np.zeros(k), float(np.dot(y, y))
    for size in range(1, k + 1):
        for cols in itertools.combinations(range(k), size):
            sub = a[:, cols]
            if not np.any(sub):
                continue
            sol, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if np.any(sol < 0):
                continue
            x = np.zeros(k)
            x[list(cols)] = sol
            res = float(np.sum((a @ x - y) ** 2))
            if res < best_res * (1 - 1e-12):
                best, best_res = x, res
    return best


def _design(collective: str, algorithm: str, ps: np.ndarray, ns: np.ndarray) -> np.ndarray:
    cache: dict[int, Any] = {}
    rows = np.empty((len(ps), 3))
    for i, (p, n) in enumerate(zip(ps, ns, strict=True)):
        k = cache.get(int(p))
        if k is None:
            k = cache[int(p)] = coefficients(collective, algorithm, int(p))
        rows[i] = (k.a, k.b * n, k.c * n)
    return rows


def _collinear(x: np.ndarray) -> bool:
    """Whether the gamma column is a fixed multiple of the beta column (or zero)."""
    b, c = x[:, 1], x[:, 2]
    if not np.any(c):
        return True
    if not np.any(b):
        return False
    ratio = c[b > 0] / b[b > 0]
    return bool(np.ptp(ratio) <= 1e-9 * max(1.0, float(np.max(np.abs(ratio)))))


@dataclass
class LineFit:
    collective: str
    algorithm: str          # formula key
    alpha: float
    beta: float
    gamma: float
    gamma_source: str = "fitted"

    def predict(self, p: np.ndarray | int, n: np.ndarray | float) -> np.ndarray:
        ps = np.atleast_1d(np.asarray(p, dtype=float))
        ns = np.atleast_1d(np.asarray(n, dtype=float))
        ps, ns = np.broadcast_arrays(ps, ns)
        x = _design(self.collective, self.algorithm, ps, ns)
        return x @ np.array([self.alpha, self.beta, self.gamma])


def fit_line(collective: str, algorithm: str, ps: np.ndarray, ns: np.ndarray, ts: np.ndarray,
             fixed_beta: float | None = None, fixed_alpha: float | None = None) -> LineFit:
    """NNLS on relative error; gamma identified only through fixed_beta (see module doc).

    fixed_alpha holds alpha at a given value and fits the rest (the upper piece of a
    piecewise fit measured at one world size, see _piecewise)."""
    if fixed_alpha is not None:
        x = _design(collective, algorithm, ps, ns)
        xw = x / ts[:, None]
        target = 1.0 - xw[:, 0] * fixed_alpha      # what alpha leaves, relative to t
        if not np.any(x[:, 2]):
            sol = nnls_small(xw[:, [1]], target)
            return LineFit(collective, algorithm, fixed_alpha, float(sol[0]), 0.0, "not used")
        if fixed_beta is not None:
            sol = nnls_small(xw[:, [2]], target - xw[:, 1] * fixed_beta)
            return LineFit(collective, algorithm, fixed_alpha, fixed_beta, float(sol[0]),
                           "fitted with beta fixed from a non-reducing collective")
        if _collinear(x):
            sol = nnls_small(xw[:, [1]], target)
            return LineFit(collective, algorithm, fixed_alpha, float(sol[0]), 0.0,
                           "not identifiable: set to 0, beta includes the reduction cost")
        sol = nnls_small(xw[:, 1:], target)
        return LineFit(collective, algorithm, fixed_alpha, float(sol[0]), float(sol[1]))
    x = _design(collective, algorithm, ps, ns)
    w = 1.0 / ts
    xw = x * w[:, None]
    ones = np.ones_like(ts)
    if not np.any(x[:, 2]):
        sol = nnls_small(xw[:, :2], ones)
        return LineFit(collective, algorithm, sol[0], sol[1], 0.0, "not used")
    if _collinear(x):
        sol = nnls_small(xw[:, :2], ones)
        free = LineFit(collective, algorithm, sol[0], sol[1], 0.0,
                       "not identifiable: set to 0, beta includes the reduction cost")
        if fixed_beta is None:
            return free
        target = ones - xw[:, 1] * fixed_beta
        sol = nnls_small(xw[:, [0, 2]], target)
        fixed = LineFit(collective, algorithm, sol[0], fixed_beta, sol[1],
                        "fitted with beta fixed from a non-reducing collective")
        err_fixed = float(np.sum((xw @ np.array([fixed.alpha, fixed.beta, fixed.gamma]) - 1) ** 2))
        err_free = float(np.sum((xw @ np.array([free.alpha, free.beta, 0.0]) - 1) ** 2))
        if err_fixed <= 1.5 * err_free:
            return fixed
        free.gamma_source = ("not identifiable: the non-reducing collective's beta fits "
                             "much worse, so gamma = 0 and beta includes the reduction cost")
        return free
    sol = nnls_small(xw, ones)
    return LineFit(collective, algorithm, sol[0], sol[1], sol[2])


def goodness(pred: np.ndarray, ts: np.ndarray) -> Goodness:
    rel = np.abs(pred - ts) / ts
    lt, lp = np.log(ts), np.log(np.maximum(pred, 1e-300))
    ss_tot = float(np.sum((lt - lt.mean()) ** 2))
    ss_res = float(np.sum((lt - lp) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res < 1e-12 else 0.0)
    return {"r2_log": r2, "median_rel_err": float(np.median(rel)),
            "max_rel_err": float(np.max(rel)), "points": int(len(ts))}


@dataclass
class GroupFit:
    """One fitted group, as written into model.json."""

    key: FitGroup
    scope: str                       # "world-size" | "all-world-sizes"
    world_sizes: list[int]
    line: LineFit
    pieces: list[Piece] | None
    goodness: Goodness
    ci95: dict[str, list[float]] | None
    candidates: list[Candidate]
    holdout: Holdout
    notes: list[str] = field(default_factory=list)
    sizes: list[float] = field(default_factory=list)     # smallest and largest bytes seen
    flags: list[str] = field(default_factory=list)       # what the fit cannot tell
    # where the formula comes from when the records say "native" but the library's
    # algorithm is known (ccbench.model.library_algorithms); "" otherwise
    algorithm_source: str = ""

    def to_json(self) -> FitEntry:
        return {
            **self.key,
            "scope": self.scope, "world_sizes": self.world_sizes,
            "model_algorithm": self.line.algorithm,
            "alpha": self.line.alpha, "beta": self.line.beta, "gamma": self.line.gamma,
            "gamma_source": self.line.gamma_source,
            "pieces": self.pieces, "goodness": self.goodness, "ci95": self.ci95,
            "candidates": self.candidates, "holdout": self.holdout, "notes": self.notes,
            "sizes": self.sizes, "flags": self.flags,
            "algorithm_source": self.algorithm_source or "the records",
        }


def _sse(pred: np.ndarray, ts: np.ndarray) -> float:
    return float(np.sum(((pred - ts) / ts) ** 2))


def _piecewise(collective: str, algorithm: str, ps, ns, ts, fixed_beta, one: LineFit,
               min_sizes: int = 3) -> list[Piece] | None:
    """Two pieces split at a size, or None. The lower piece is fitted freely. The upper
    piece keeps its own alpha only when its points span two world sizes or more: at one
    world size its intercept a(p) alpha is a constant of that p (a protocol switch, a
    rendezvous), and read as a per-step latency it would be multiplied by a(p) at other
    rank counts (2046 x at 1024 ranks for ring allreduce). So there it shares the lower
    piece's alpha and only beta (and gamma) change."""
    pred = one.predict(ps, ns)
    if np.max(np.abs(pred - ts) / ts) <= 0.10:
        return None
    sizes = np.unique(ns)
    if len(sizes) < 2 * min_sizes:
        return None
    base = _sse(pred, ts)
    best = None
    for i in range(min_sizes, len(sizes) - min_sizes + 1):
        thr = sizes[i - 1]
        lo, hi = ns <= thr, ns > thr
        f1 = fit_line(collective, algorithm, ps[lo], ns[lo], ts[lo], fixed_beta)
        own_alpha = len(np.unique(ps[hi])) >= 2
        f2 = fit_line(collective, algorithm, ps[hi], ns[hi], ts[hi], fixed_beta,
                      None if own_alpha else f1.alpha)
        sse = _sse(f1.predict(ps[lo], ns[lo]), ts[lo]) + _sse(f2.predict(ps[hi], ns[hi]), ts[hi])
        if best is None or sse < best[0]:
            best = (sse, thr, f1, f2, own_alpha)
    if best is None or best[0] > 0.5 * base:
        return None
    _, thr, f1, f2, own_alpha = best
    return [{"max_bytes": float(thr), "alpha": f1.alpha, "beta": f1.beta, "gamma": f1.gamma},
            {"max_bytes": None, "alpha": f2.alpha, "beta": f2.beta, "gamma": f2.gamma,
             "alpha_source": "fitted across world sizes" if own_alpha else
             "the lower piece's (one world size: an intercept there is not a per-step "
             "latency)"}]


def predict_from_fit(fit: FitLine, p: int | np.ndarray, n: float | np.ndarray,
                     algorithm: str | None = None) -> np.ndarray:
    """Seconds predicted by a model.json fit entry (pieces honoured)."""
    algo = canonical_algorithm(fit["collective"], algorithm) if algorithm else \
        fit["model_algorithm"]
    ns = np.atleast_1d(np.asarray(n, dtype=float))
    ps = np.broadcast_to(np.atleast_1d(np.asarray(p, dtype=float)), ns.shape)
    out = np.empty(ns.shape)
    whole: Piece = {"max_bytes": None, "alpha": fit["alpha"], "beta": fit["beta"],
                    "gamma": fit["gamma"]}
    pieces = fit.get("pieces") or [whole]
    done = np.zeros(ns.shape, bool)
    for piece in pieces:
        sel = ~done if piece["max_bytes"] is None else (~done & (ns <= piece["max_bytes"]))
        if np.any(sel):
            line = LineFit(fit["collective"], algo, piece["alpha"], piece["beta"], piece["gamma"])
            out[sel] = line.predict(ps[sel], ns[sel])
        done |= sel
    return out


def _predict_pieces(line: LineFit, pieces: list[Piece], ps: np.ndarray, ns: np.ndarray
                    ) -> np.ndarray:
    fit: FitLine = {"collective": line.collective, "model_algorithm": line.algorithm, "alpha": line.alpha,
           "beta": line.beta, "gamma": line.gamma, "pieces": pieces}
    return predict_from_fit(fit, ps, ns)


def _bootstrap(collective, algorithm, pts: Sequence[Point], fixed_beta, reps: int,
               rng: np.random.Generator) -> dict[str, list[float]] | None:
    if reps <= 0:
        return None
    ps = np.array([q.p for q in pts], float)
    ns = np.array([q.n for q in pts], float)
    draws = np.empty((reps, 3))
    medians = np.empty((reps, len(pts)))
    for j, q in enumerate(pts):
        idx = rng.integers(0, q.samples.size, (reps, q.samples.size))
        medians[:, j] = np.median(q.samples[idx], axis=1)
    for i in range(reps):
        f = fit_line(collective, algorithm, ps, ns, medians[i], fixed_beta)
        draws[i] = (f.alpha, f.beta, f.gamma)
    lo, hi = np.percentile(draws, [2.5, 97.5], axis=0)
    return {name: [float(lo[j]), float(hi[j])] for j, name in enumerate(("alpha", "beta", "gamma"))}


def _holdout_sizes(collective, algorithm, ps, ns, ts, fixed_beta) -> Holdout:
    sizes = np.unique(ns)
    if len(sizes) < 4:
        return {"sizes": "too few sizes"}
    train_sizes = set(sizes[::2])
    train = np.array([n in train_sizes for n in ns])
    f = fit_line(collective, algorithm, ps[train], ns[train], ts[train], fixed_beta)
    rel = np.abs(f.predict(ps[~train], ns[~train]) - ts[~train]) / ts[~train]
    return {"sizes": {"method": "fit on every other size, predict the rest",
                      "median_rel_err": float(np.median(rel)), "max_rel_err": float(np.max(rel))}}


def _holdout_world_sizes(collective, algorithm, ps, ns, ts, fixed_beta) -> Holdout:
    worlds = sorted(set(int(p) for p in ps))
    if len(worlds) < 2:
        return {}
    out: dict[str, str | HeldOut] = {"method": "fit without this world size, predict it"}
    for w in worlds:
        test = ps == w
        f = fit_line(collective, algorithm, ps[~test], ns[~test], ts[~test], fixed_beta)
        rel = np.abs(f.predict(ps[test], ns[test]) - ts[test]) / ts[test]
        out[str(w)] = {"median_rel_err": float(np.median(rel)), "max_rel_err": float(np.max(rel))}
    return {"world_sizes": out}


def fit_group(key: FitGroup, pts: Sequence[Point], scope: str,
              fixed_beta: float | None = None, bootstrap: int = 200, seed: int = 0,
              forced_algorithm: str | None = None) -> GroupFit:
    collective = key["collective"]
    ps = np.array([q.p for q in pts], float)
    ns = np.array([q.n for q in pts], float)
    ts = np.array([q.t for q in pts], float)
    algo = key["algorithm"]
    if forced_algorithm:
        names = [forced_algorithm]
    elif algo == "native":
        names = candidates(collective)
    else:
        names = [canonical_algorithm(collective, algo)]
    tried: list[tuple[float, int, str, LineFit, Goodness]] = []
    for name in names:
        try:
            line = fit_line(collective, name, ps, ns, ts, fixed_beta)
        except UsageError:
            continue
        g = goodness(line.predict(ps, ns), ts)
        tried.append((g["median_rel_err"], len(tried), name, line, g))
    if not tried:
        raise UsageError(f"no cost formula fits {collective} {algo}")
    tried.sort(key=lambda item: (round(item[0], 12), item[1]))
    _, _, name, line, _ = tried[0]
    notes = []
    if algo == "native" and not forced_algorithm:
        ties = [t[2] for t in tried[1:] if abs(t[0] - tried[0][0]) <= 1e-9 + 1e-6 * tried[0][0]]
        notes.append(f"native: kept {name} by {SELECTION}")
        if ties:
            notes.append(f"indistinguishable from {', '.join(ties)} on these points")
    flags = []
    if line.gamma_source.startswith("not identifiable"):
        notes.append("gamma not identifiable without a non-reducing collective: beta includes it")
        flags.append("gamma not identified (no non-reducing collective of this backend fits "
                     "its beta): beta includes the reduction cost")
    nsizes = len(np.unique(ns))
    unknowns = 2 if line.gamma_source in ("not used",) or line.gamma_source.startswith(
        ("not identifiable", "fitted with beta fixed")) else 3
    if nsizes * len(np.unique(ps)) <= unknowns:
        flags.append(f"{len(pts)} points at {nsizes} sizes for {unknowns} unknowns: the fit is "
                     f"exact by construction, its R^2 and errors say nothing")
    pieces = _piecewise(collective, name, ps, ns, ts, fixed_beta, line)
    if pieces:
        notes.append(f"piecewise: breakpoint at {piece_end(pieces[0])} bytes "
                     f"(one line left max relative error above 10 %)")
        if not pieces[1]["alpha_source"].startswith("fitted"):
            notes.append("piecewise: the upper piece shares the lower piece's alpha "
                         "(one world size cannot tell an intercept from a per-step latency)")
        pred = _predict_pieces(line, pieces, ps, ns)
    else:
        pred = line.predict(ps, ns)
    g = goodness(pred, ts)
    rng = np.random.default_rng(seed)
    ci = _bootstrap(collective, name, pts, fixed_beta, bootstrap, rng)
    holdout = _holdout_sizes(collective, name, ps, ns, ts, fixed_beta)
    holdout.update(_holdout_world_sizes(collective, name, ps, ns, ts, fixed_beta))
    cands: list[Candidate] = [{"algorithm": t[2], "median_rel_err": t[4]["median_rel_err"],
                               "max_rel_err": t[4]["max_rel_err"]}
                              for t in sorted(tried, key=lambda t: t[1])]
    return GroupFit(key, scope, sorted(set(int(p) for p in ps)), line, pieces, g, ci, cands,
                    holdout, notes, [float(ns.min()), float(ns.max())], flags)


def _key(record: Record, fields: Sequence[str]) -> CaseId:
    return record.case.only(fields)


def fit_key(record: Record) -> tuple[CaseId, str]:
    """The fit group of a record, and why its algorithm is what it is: a native record
    whose library's algorithm is known (gloo's all-to-all, Intel MPI with I_MPI_ADJUST_*)
    is grouped under that algorithm's formula, apart from records the library chose for."""
    key = _key(record, FIT_GROUP_FIELDS)
    known = library_algorithm(record)
    if known is None:
        return key, ""
    return dataclasses.replace(key, algorithm=known[0]), known[1]


def _group_of(fit_key: FitGroup) -> CaseId:
    return CaseId(**group_fields(fit_key))


def _order(case: CaseId) -> tuple[str, ...]:
    return tuple(str(getattr(case, name)) for name in FIT_GROUP_FIELDS)


def _flag_mixed_networks(fit: GroupFit, records: Sequence[Record]) -> None:
    """Records from one host and from several hosts went over different links (memory vs the
    network): one alpha and beta cannot describe both, so the fit says so."""
    if len({r.nodes <= 1 for r in records}) > 1:
        fit.flags.append("mixes single-host and multi-host records (different links): "
                         "calibrate each network separately")


def _library_source(fit: GroupFit, why: str) -> None:
    if why:
        fit.algorithm_source = why
        fit.notes.append(f"formula {fit.line.algorithm}: the library's own algorithm, not "
                         f"chosen by fit quality ({why})")


def _ports_shared(gkey: CaseId, group: list[Record]) -> list[Record]:
    """The records of a fit across world sizes. A direct all-to-all sends p-1 messages through
    each rank's port at once, and they do not end together: plain TCP transfers on the testbed
    (benchmarks/tcp_alltoall.py, 100 Mbit/s links) moved 0.97 of the link at 2 hosts, where
    each port carries one flow, and 0.72-0.86 at 3-8 hosts, the first flow ending at
    0.45-0.7 of the last; Intel MPI and MPICH measured alike (results/testbed). 2 ranks then say nothing of
    the larger world sizes and are left out when those are there."""
    if gkey.collective != "alltoall" or gkey.algorithm != "direct":
        return group
    shared = [r for r in group if r.world_size > 2]
    return shared or group


def calibrate(records: Sequence[Record], bootstrap: int = 200, seed: int = 0,
              world_sizes: Sequence[int] | None = None,
              skipped: list[str] | None = None) -> list[GroupFit]:
    """Every group fit (per world size, then across world sizes), non-reducing first.

    Groups whose algorithm has no cost formula are left out, with a line in `skipped`.
    """
    recs = [r for r in records if world_sizes is None or r.world_size in world_sizes]
    recs = [r for r in recs if r.world_size > 1 and r.collective in COLLECTIVES]
    if not recs:
        raise UsageError("no records to calibrate on (need world size > 1)")
    by_group, sources = _fit_groups(recs, skipped)
    _drop_one_size_groups(by_group, skipped)
    order = sorted(by_group, key=lambda k: (k.collective not in NON_REDUCING, _order(k)))
    fits: list[GroupFit] = []
    betas: dict[CaseId, tuple[int, float | None]] = {}    # link key -> (points, beta)
    for gkey in order:
        _fit_one_group(gkey, by_group[gkey], sources.get(gkey, ""),
                       _Budget(bootstrap, seed, skipped), fits, betas)
    return fits


def _fit_groups(recs: list[Record], skipped: list[str] | None
                ) -> tuple[dict[CaseId, list[Record]], dict[CaseId, str]]:
    """The records per fit group, and per group why its formula is the library's own; an
    algorithm with no cost formula is left out (its reason once in `skipped`)."""
    by_group: dict[CaseId, list[Record]] = defaultdict(list)
    sources: dict[CaseId, str] = {}
    for r in recs:
        if r.algorithm != "native":
            try:
                canonical_algorithm(r.collective, r.algorithm)
            except UsageError as exc:
                if skipped is not None and str(exc) not in skipped:
                    skipped.append(str(exc))
                continue
        gkey, why = fit_key(r)
        by_group[gkey].append(r)
        if why:
            sources[gkey] = why
    if not by_group:
        raise UsageError("no records with a cost formula to calibrate on"
                         + (f" ({skipped[0]})" if skipped else ""))
    return by_group, sources


def _drop_one_size_groups(by_group: dict[CaseId, list[Record]], skipped: list[str] | None) -> None:
    """Alpha and beta cannot be told apart from one size: such groups go, each said why;
    none left is an error."""
    unidentified: list[str] = []
    for gkey in list(by_group):
        sizes = {r.size_used for r in by_group[gkey]}
        if len(sizes) < 2:
            group = by_group.pop(gkey)
            at = ",".join(map(str, sorted({r.world_size for r in group})))
            line = (f"{gkey.backend} ({gkey.library}) {gkey.collective} {gkey.algorithm} at {at} ranks: "
                    f"{len(group)} record(s) of one size ({sizes.pop()} B); alpha and beta "
                    f"cannot be told apart from one size (measure two sizes or more)")
            if skipped is not None:
                skipped.append(line)
            unidentified.append(line)
    if not by_group:
        raise UsageError(f"cannot fit: {unidentified[0]}"
                         + (f" (and {len(unidentified) - 1} more groups)"
                            if len(unidentified) > 1 else ""))


@dataclass(frozen=True)
class _Budget:
    """The bootstrap resamples and seed of every fit, and where skipped fits are said."""

    bootstrap: int
    seed: int
    skipped: list[str] | None


def _fit_across(gkey: CaseId, group: list[Record], key: FitGroup, fixed: float | None,
                budget: _Budget) -> GroupFit:
    sharing = _ports_shared(gkey, group)
    across = fit_group(key, points_from_records(sharing), "all-world-sizes", fixed,
                       budget.bootstrap, budget.seed)
    if len(sharing) < len(group):
        across.notes.append("2 ranks left out: a direct all-to-all there is one flow "
                            "per port, which cannot tell how p-1 flows share one")
    return across


def _fit_per_world(gkey: CaseId, group: list[Record], key: FitGroup, fixed: float | None,
                   across: GroupFit | None, source: str, budget: _Budget) -> list[GroupFit]:
    """One fit per world size with two sizes or more (a native one takes the formula the
    fit across world sizes chose)."""
    fits = []
    for w in sorted({r.world_size for r in group}):
        sub = [r for r in group if r.world_size == w]
        if len({r.size_used for r in sub}) < 2:
            if budget.skipped is not None:
                budget.skipped.append(f"{gkey.backend} ({gkey.library}) {gkey.collective} "
                                      f"{gkey.algorithm} at {w} ranks "
                                      f"alone: one size, no per-world-size fit (it is in the "
                                      f"fit across world sizes)")
            continue
        forced = across.line.algorithm if (across and key["algorithm"] == "native") else None
        gf = fit_group(key, points_from_records(sub), "world-size", fixed, budget.bootstrap,
                       budget.seed, forced)
        if forced:
            gf.notes.append(f"native: formula chosen by the across-world-size fit ({forced})")
        _flag_mixed_networks(gf, sub)
        _library_source(gf, source)
        fits.append(gf)
    return fits


def _fit_one_group(gkey: CaseId, group: list[Record], source: str, budget: _Budget,
                   fits: list[GroupFit], betas: dict[CaseId, tuple[int, float | None]]) -> None:
    """A group's fits appended to `fits`; a reducing collective takes its beta from the
    non-reducing fit of the same link with the most points (`betas`), which a
    non-reducing group updates."""
    key = fit_group_of(gkey)
    link = gkey.only(LINK_FIELDS)
    fixed = None if key["collective"] in NON_REDUCING else betas.get(link, (0, None))[1]
    across = _fit_across(gkey, group, key, fixed, budget) \
        if len({r.world_size for r in group}) > 1 else None
    fits.extend(_fit_per_world(gkey, group, key, fixed, across, source, budget))
    if across is not None:
        _flag_mixed_networks(across, group)
        _library_source(across, source)
        fits.append(across)
    if key["collective"] in NON_REDUCING and (across or any(f.key == key for f in fits)):
        best = across or max((f for f in fits if f.key == key), key=lambda f: f.goodness["points"])
        npts = int(best.goodness["points"])
        if npts > betas.get(link, (0, None))[0] and best.line.beta > 0:
            betas[link] = (npts, best.line.beta)


def validate_world_sizes(records: Sequence[Record], train: Sequence[int], test: Sequence[int],
                         bootstrap: int = 0) -> list[ValidationRow]:
    """Calibrate on the `train` world sizes, predict every record at the `test` ones.

    Returns one row per predicted record: group, p, size, measured and predicted seconds,
    relative error. Summaries (median, p90) are left to the caller (see summarize_validation).
    """
    fits = calibrate(records, bootstrap=bootstrap, world_sizes=list(train))
    # the across-world-size fit where a group has one; a group measured at one training
    # world size predicts with that fit (the coefficients carry p)
    across = {_group_of(f.key): f for f in fits if f.scope == "world-size"}
    across.update({_group_of(f.key): f for f in fits
                   if f.scope == "all-world-sizes"})
    rows: list[ValidationRow] = []
    for r in records:
        if r.world_size not in test:
            continue
        f = across.get(fit_key(r)[0])
        if f is None:
            continue
        measured = float(np.median(r.samples_us)) * 1e-6 if r.samples_us else \
            r.time_us["median"] * 1e-6
        pred = float(predict_from_fit(f.to_json(), r.world_size, r.size_used)[0])
        rows.append({**f.key, "world_size": r.world_size, "size": r.size_used,
                     "dtype": r.dtype, "inplace": r.inplace,
                     "measured_s": measured, "predicted_s": pred,
                     "rel_err": abs(pred - measured) / measured})
    return rows


def summarize_validation(rows: Sequence[ValidationRow]) -> list[ValidationSummary]:
    groups: dict[tuple[str, ...], tuple[FitGroup, int, list[float]]] = {}
    for row in rows:
        group = group_fields(row)
        key = tuple(map(str, (*_group_values(group), row["world_size"])))
        groups.setdefault(key, (group, row["world_size"], []))[2].append(row["rel_err"])
    out: list[ValidationSummary] = []
    for _, (group, world, errs) in sorted(groups.items()):
        e = np.array(errs)
        out.append({**group, "world_size": world, "sizes": len(e),
                    "median_rel_err": float(np.median(e)),
                    "p90_rel_err": float(np.percentile(e, 90)), "max_rel_err": float(e.max())})
    return out


def format_seconds(s: float) -> str:
    if s == 0 or not math.isfinite(s):
        return f"{s:g}"
    return f"{s:.3e}"
