"""Predict a collective's time on a topology from a calibrated model.

Two fidelities:

* analytical: the alpha-beta-gamma formula with the topology's worst uncontended
  path (largest alpha plus hop latencies, slowest bottleneck bandwidth; a message
  split over two planes counts each half on its own plane). Congestion-unaware, like
  ASTRA-sim's analytical backend.
* replay: the algorithm's schedule (lazy array rounds from ccbench.model.rounds, or the
  algorithms/ schedule for pipelined segments and the double binary tree) run on the
  topology with links shared max-min fair by concurrent transfers
  (ccbench.model.netsim; row["replay_engine"] says which engine ran).

Without contention both give the same time; where several transfers share a link
(recursive doubling on a ring, all-to-all through an oversubscribed fat tree) the
replay is slower, and the ratio says by how much.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict, cast

from ccbench.collectives import busbw_factor, layout
from ccbench.errors import UsageError
from ccbench.model.costs import canonical_algorithm, coefficients, predict_time
from ccbench.model.fit import FitLine, Piece
from ccbench.model.hierarchical import ALGORITHM as HIER
from ccbench.model.hierarchical import COLLECTIVES as HIER_COLLECTIVES
from ccbench.model.hierarchical import hierarchical_steps, hierarchical_time, link_dims
from ccbench.model.modelfile import ModelFile, default_algorithm, select_fit
from ccbench.model.netsim import replay_collective
from ccbench.model.sanity import fit_scope, prediction_flags, row_flags
from ccbench.model.topology import LinkClass, Topology, build_topology

__all__ = ["LinkOverrides", "simulate", "FIDELITIES", "prediction_records", "SimulateRow",
           "SimulateFit", "Simulation"]

FIDELITIES = ("analytical", "replay", "both")


@dataclass
class LinkOverrides:
    """Per-class link parameters that replace the fitted alpha / beta (None = fitted)."""

    inter_alpha: float | None = None     # seconds
    inter_beta: float | None = None      # seconds per byte
    intra_alpha: float | None = None
    intra_beta: float | None = None
    hop_latency: float = 0.0


def _params(fit: FitLine, n: float) -> tuple[int, float, float, float]:
    """(piece index, alpha, beta, gamma) of the piece that size n falls in."""
    for index, piece in enumerate(fit.get("pieces") or []):
        if piece["max_bytes"] is None or n <= piece["max_bytes"]:
            return index, piece["alpha"], piece["beta"], piece["gamma"]
    return 0, fit["alpha"], fit["beta"], fit["gamma"]


ELEMENT_BYTES = 4     # sizes are laid out as float32 elements, as measurements default to


def used_size(collective: str, size: int, ranks: int) -> int:
    """The bytes a collective of nominal size S moves at `ranks` (per-rank counts rounded
    down to divisibility, as the harness does); 0 when no element fits per rank."""
    return layout(collective, size, ELEMENT_BYTES, ranks).size_used


def _labelled(progress: Callable[[str, int, int], None] | None,
              label: str) -> Callable[[int, int], None] | None:
    if progress is None:
        return None
    return lambda done, total: progress(label, done, total)


class SimulateRow(TypedDict):
    """One size of `simulate`: the fit's piece, the time of the chosen fidelity (time_us,
    algbw_gbps, busbw_gbps) and, with fidelity replay or both, the replayed schedule's."""

    collective: str
    algorithm: str
    world_size: int
    topology: str
    size_asked: int
    size_used: int
    piece: int
    alpha_s: float
    beta_s_per_byte: float
    gamma_s_per_byte: float
    bottleneck_link_gbps: float
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    replay_engine: NotRequired[str]
    replay_time_us: NotRequired[float]
    replay_algbw_gbps: NotRequired[float]
    replay_busbw_gbps: NotRequired[float]
    replay_vs_analytical: NotRequired[float]
    max_flows_per_link: NotRequired[int]
    flags: list[str]


class SimulateFit(TypedDict):
    """The fit a prediction used (the model file's fit, these keys only; None where the
    fit has no such key)."""

    backend: str
    library: str
    collective: str
    algorithm: str | None
    model_algorithm: str
    world_sizes: list[int]
    alpha: float
    beta: float
    gamma: float
    pieces: list[Piece] | None


class Simulation(TypedDict):
    """What `simulate` returns (and `ccbench simulate --format json` prints)."""

    collective: str
    algorithm: str
    world_size: int
    topology: str
    fidelity: str
    sharing: str
    segments: int
    fit: SimulateFit
    fit_choice: str
    fit_scope: str
    fit_sizes: list[float] | None
    flags: list[str]
    rows: list[SimulateRow]


def _check_arguments(fidelity: str, segments: int, ranks: int) -> None:
    if fidelity not in FIDELITIES:
        raise UsageError(f"unknown fidelity {fidelity!r} (valid: {', '.join(FIDELITIES)})")
    if segments < 1:
        raise UsageError(f"--segments must be >= 1, got {segments}")
    if ranks < 2:
        raise UsageError(f"--ranks must be >= 2, got {ranks}")


def _algorithm(fit: Any, collective: str, algorithm: str | None, fidelity: str) -> str:
    """The algorithm asked (or the fit's default); the hierarchical one only analytically and
    only for the collectives it has a formula for."""
    if not (algorithm and str(algorithm).lower() in (HIER, "hierarchical")):
        return canonical_algorithm(collective, algorithm) if algorithm \
            else default_algorithm(fit, collective)
    if fidelity != "analytical":
        raise UsageError(f"-a {HIER} has no replayable schedule; use --fidelity analytical")
    if collective not in HIER_COLLECTIVES:
        raise UsageError(f"no {HIER} formula for {collective} "
                         f"(valid: {', '.join(HIER_COLLECTIVES)})")
    return HIER


def simulate(model: ModelFile, collective: str, ranks: int, topology: str,
             sizes: Sequence[int], algorithm: str | None = None, fidelity: str = "analytical",
             sharing: str = "max-min", backend: str | None = None,
             links: LinkOverrides | None = None, segments: int = 1,
             progress: Callable[[str, int, int], None] | None = None) -> Simulation:
    _check_arguments(fidelity, segments, ranks)
    links = links or LinkOverrides()
    fit, why = select_fit(model, collective, ranks, backend)
    algo = _algorithm(fit, collective, algorithm, fidelity)
    hierarchical = algo == HIER
    topos: dict[tuple[float, float, float, float], Topology] = {}
    rows: list[SimulateRow] = []
    for size in sizes:
        used = used_size(collective, size, ranks) or size
        piece, alpha, beta, gamma = _params(fit, used)
        inter = LinkClass(links.inter_alpha if links.inter_alpha is not None else alpha,
                          links.inter_beta if links.inter_beta is not None else beta,
                          links.hop_latency)
        intra = LinkClass(links.intra_alpha if links.intra_alpha is not None else inter.alpha,
                          links.intra_beta if links.intra_beta is not None else inter.beta,
                          links.hop_latency)
        key = (inter.alpha, inter.beta, intra.alpha, intra.beta)
        topo = topos.get(key)
        if topo is None:
            topo = topos[key] = build_topology(topology, ranks, inter, intra)
        row: dict[str, Any] = {"collective": collective, "algorithm": algo, "world_size": ranks,
                               "topology": topology, "size_asked": size, "size_used": used,
                               "piece": piece, "alpha_s": alpha, "beta_s_per_byte": beta,
                               "gamma_s_per_byte": gamma}
        a_eff, b_eff = topo.flat_parameters()
        if hierarchical:       # a ring per dimension (ccbench.model.hierarchical)
            dims = link_dims(topo, inter, intra)
            t_an = hierarchical_time(collective, dims, used, gamma)
            steps = float(hierarchical_steps(collective, dims))
        else:
            t_an = predict_time(collective, algo, ranks, used, a_eff, b_eff, gamma)
            steps = coefficients(collective, algo, ranks).a
        factor = busbw_factor(collective, ranks)
        row["bottleneck_link_gbps"] = 1e-9 / b_eff if b_eff > 0 else float("inf")
        if fidelity in ("analytical", "both"):
            row.update(time_us=t_an * 1e6, algbw_gbps=used / t_an / 1e9,
                       busbw_gbps=used / t_an / 1e9 * factor)
        if fidelity in ("replay", "both"):
            res = replay_collective(collective, algo, ranks, used, topo, gamma, sharing, segments,
                                    progress=_labelled(progress, f"{collective} {algo} {used} B"))
            t_rp = res.time
            row["replay_engine"] = res.engine
            row.update(replay_time_us=t_rp * 1e6, replay_algbw_gbps=used / t_rp / 1e9,
                       replay_busbw_gbps=used / t_rp / 1e9 * factor,
                       replay_vs_analytical=t_rp / t_an if t_an > 0 else float("nan"),
                       max_flows_per_link=res.max_link_flows)
            if fidelity == "replay":
                row.update(time_us=t_rp * 1e6, algbw_gbps=used / t_rp / 1e9,
                           busbw_gbps=used / t_rp / 1e9 * factor)
        row["flags"] = row_flags(
            fit, used, a_eff, steps,
            [row[k] for k in ("busbw_gbps", "replay_busbw_gbps") if k in row],
            row["bottleneck_link_gbps"], ranks)
        rows.append(cast(SimulateRow, row))     # every key of SimulateRow is set above
    return {"collective": collective, "algorithm": algo, "world_size": ranks,
            "topology": topology, "fidelity": fidelity, "sharing": sharing, "segments": segments,
            "fit": {"backend": fit.get("backend"), "library": fit.get("library"),
                    "collective": fit.get("collective"), "algorithm": fit.get("algorithm"),
                    "model_algorithm": fit.get("model_algorithm"),
                    "world_sizes": fit.get("world_sizes"), "alpha": fit.get("alpha"),
                    "beta": fit.get("beta"), "gamma": fit.get("gamma"),
                    "pieces": fit.get("pieces")},
            "fit_choice": why, "fit_scope": fit_scope(fit),
            "fit_sizes": fit.get("sizes"),
            "flags": prediction_flags(fit, why, collective, algo, ranks), "rows": rows}


def prediction_records(out: Simulation, run_id: str = "simulate") -> list[Any]:
    """The rows of `simulate` as Records (schema v1), so reports read predictions like
    measurements: backend `model/<fitted backend>`, transport = the topology, device
    `model`, one sample = the predicted time, method.predicted = true. With fidelity
    `both` every row is two records, method.fidelity `analytical` and `replay`, so that
    a report draws both curves (a row holds both times, a record one)."""
    from datetime import datetime, timezone

    from ccbench import __version__
    from ccbench.collectives import REDUCING
    from ccbench.records import Record

    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    fit = out["fit"]
    recs = []
    for row, fidelity in _per_fidelity(out):
        t = row["time_us"]
        lay = layout(row["collective"], row["size_asked"], 4, row["world_size"])
        recs.append(Record(
            run_id=run_id, timestamp=stamp, ccbench_version=__version__,
            collective=row["collective"], backend=f"model/{fit['backend']}",
            library=fit["library"], library_version="", algorithm=row["algorithm"],
            transport=row["topology"], device="model", dtype="float32",
            op="sum" if row["collective"] in REDUCING else None, inplace=False,
            timing="per-op", world_size=row["world_size"], nodes=1,
            ranks_per_node=row["world_size"], hosts=[], root=0, size_asked=row["size_asked"],
            size_used=row["size_used"], count=lay.count, iterations=1, warmup=0,
            time_us={"median": t, "mean": t, "min": t, "p5": t, "p95": t, "max": t,
                     "stdev": 0.0},
            samples_us=[t], rank_median_us=[], algbw_gbps=row["algbw_gbps"],
            busbw_gbps=row["busbw_gbps"], wrong=None,
            method={"predicted": True, "fidelity": fidelity, "sharing": out["sharing"],
                    "segments": out.get("segments", 1), "fit": fit,
                    "fit_choice": out["fit_choice"],
                    "flags": out.get("flags", []) + row.get("flags", [])}))
    return recs


def _per_fidelity(out: Simulation) -> list[tuple[SimulateRow, str]]:
    """(row with time_us, algbw_gbps, busbw_gbps of one fidelity, that fidelity)."""
    if out["fidelity"] != "both":
        return [(row, out["fidelity"]) for row in out["rows"]]
    pairs = []
    for row in out["rows"]:
        pairs.append((row, "analytical"))
        pairs.append(({**row, "time_us": row["replay_time_us"],
                       "algbw_gbps": row["replay_algbw_gbps"],
                       "busbw_gbps": row["replay_busbw_gbps"]}, "replay"))
    return pairs
