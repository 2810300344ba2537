"""A trace's communication predicted at another scale and on another network.

`simulate_trace(model, trace, ranks, topology)` takes a parsed trace (ccbench.trace), maps
it onto `ranks` ranks as `ccbench replay --world-size` does (ccbench.trace.scale: new rank
q runs the op sequence of recorded rank q mod N; world calls stay on the world with per-rank
bytes kept; a group of k consecutive ranks is re-tiled into groups of k, a strided group
into the groups of every d-th rank) and prices every op with the calibrated model.

It never matches ops rank by rank at the new scale (that is O(ranks x ops) and slow at
thousands of ranks): the recorded trace is matched once, at its own (small) world size,
and each of its calls becomes one op whose group *shape* (world, tile of k, every d-th
rank) and the set of recorded ranks running it say everything about the new scale:

* calls that are the same step of the job on disjoint groups (the first tensor-parallel
  allreduce of group [0,1] and of group [2,3]) merge into one op running on every copy of
  that group at once;
* an op's time is that of one group copy: the formula with the worst uncontended path
  inside the group (analytical), or the schedule of every active copy replayed together on
  the topology, links shared (replay), so copies that cross the same spine slow each other;
* the ops of a rank run one after the other (the trace's order; async ops are timed as if
  waited on at once): a rank's communication time is the sum of its ops, the trace's
  total is the slowest rank's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from ccbench.collectives import busbw_factor
from ccbench.errors import UsageError
from ccbench.model.costs import FORMULAS, coefficients, predict_time
from ccbench.model.modelfile import ModelFile, default_algorithm, select_fit
from ccbench.model.netsim import no_schedule, replay_collective, replay_rounds
from ccbench.model.rounds import Round, RoundProgram, round_program
from ccbench.model.sanity import fit_scope, prediction_flags, row_flags
from ccbench.model.simulate import LinkOverrides, _params
from ccbench.model.topology import LinkClass, Topology, build_topology
from ccbench.trace.groups import ambiguous_calls, other_reading
from ccbench.trace.ops import CommOp, Group, Trace
from ccbench.trace.scale import resize_op, retile_group

__all__ = ["TraceOp", "parse_algorithms", "plan_trace", "simulate_trace", "TRACE_FIDELITIES",
           "OpPrice", "TraceFit", "TraceRow", "CollectiveTime", "NotModelled", "OtherReading",
           "TraceSimulation"]

TRACE_FIDELITIES = ("analytical", "replay")
#: the flag of an op whose group the trace leaves open (ccbench.trace.groups)
UNCERTAIN = ("group uncertain: the trace does not name it and a smaller group fits too "
             "(other_reading prices that reading)")
#: collectives priced with another collective's formula, and how
_STAND_IN = {"barrier": ("allreduce", "barrier: a zero-byte allreduce (latency steps only)"),
             "alltoallv": ("alltoall", "alltoallv: priced as the even all-to-all of its largest "
                                       "per-peer block (the exchange that sets a direct "
                                       "all-to-all's time)")}


class OpPrice(TypedDict):
    """One op's price (the same for every copy of its group): the fit's piece, the
    predicted time and bandwidths, the engine that timed it (formula, a replay engine or
    rounds) and its flags."""

    algorithm: str
    fit_collective: str
    piece: int
    alpha_s: float
    beta_s_per_byte: float
    gamma_s_per_byte: float
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    engine: str
    flags: list[str]


class TraceFit(TypedDict):
    """The fit that priced a collective of the trace."""

    fit_choice: str
    fit_scope: str
    algorithm: str | None
    backend: str
    library: str
    collective: str
    model_algorithm: str
    world_sizes: list[int]
    alpha: float
    beta: float
    gamma: float


#: one row of `simulate_trace`'s ops: the op at the new scale (TraceOp) and its OpPrice
#: (functional form: "async" is a keyword)
TraceRow = TypedDict("TraceRow", {
    "index": int, "calls": list[int], "node_id": int, "name": str, "collective": str,
    "dtype": str, "size": int, "group_shape": str, "group_size": int, "group_stride": int,
    "group_copies": int, "group_first": list[int], "recorded_group": list[int],
    "recorded_ranks": list[int], "async": bool,
    "algorithm": str, "fit_collective": str, "piece": int, "alpha_s": float,
    "beta_s_per_byte": float, "gamma_s_per_byte": float, "time_us": float,
    "algbw_gbps": float, "busbw_gbps": float, "engine": str, "flags": list[str]})


class CollectiveTime(TypedDict):
    """A collective's share of the slowest rank's communication."""

    ops: int
    bytes: int
    time_us: float


class NotModelled(TypedDict):
    reason: str
    recorded_ops: int


class UncertainCounts(TypedDict):
    uncertain_calls: int
    uncertain_priced_calls: int
    uncertain_rows: int


class OtherReading(TypedDict):
    """The total with the trace's uncertain calls on the smallest groups that fit."""

    total_us: float
    slowest_rank: int
    calls: int
    ops: int
    reading: str


class TraceSimulation(UncertainCounts):
    """What `simulate_trace` returns (and `ccbench simulate --trace --format json` prints)."""

    trace: str
    kind: str
    recorded_world_size: int
    world_size: int
    topology: str
    fidelity: str
    sharing: str
    ops: list[TraceRow]
    total_us: float
    slowest_rank: int
    per_rank_us: dict[str, float]
    by_collective: dict[str, CollectiveTime]
    fits: dict[str, TraceFit]
    not_modelled: list[NotModelled]
    flags: list[str]
    notes: list[str]
    warnings: list[str]
    other_reading: OtherReading | None


@dataclass(kw_only=True)
class TraceOp:
    """One op of the trace at the new scale: one step of the job on every copy of a group."""

    index: int                       # order in the trace (by first recorded call)
    calls: list[int]                 # recorded call ids merged into it
    node_id: int                     # node id of the first of them, on its first rank
    name: str
    collective: str
    dtype: str
    size: int                        # the op's S in bytes at the new scale
    shape: str                       # world | tile | stride
    group_size: int
    stride: int                      # 1 for world and tiles
    recorded_ranks: list[int]        # recorded ranks whose sequence holds this op
    recorded_group: list[int]        # its group in the recorded trace (first call)
    table: np.ndarray = field(repr=False)   # (copies, group_size) ranks of every active copy
    async_op: bool = False
    uncertain: bool = False          # the trace does not name its group and another fits

    @property
    def copies(self) -> int:
        return int(self.table.shape[0])


def _shape(group: Group, world: int) -> tuple[str, int]:
    if group.size == world:
        return "world", 1
    if group.size == 1 or group.ranks[1] - group.ranks[0] == 1:
        return "tile", 1
    return "stride", group.ranks[1] - group.ranks[0]


def _all_groups(shape: str, k: int, stride: int, ranks: int) -> np.ndarray:
    """Every group of this shape at `ranks` ranks, one row each."""
    if shape == "world":
        return np.arange(ranks, dtype=np.int64)[None, :]
    if shape == "tile":
        return np.arange(ranks, dtype=np.int64).reshape(ranks // k, k)
    return np.arange(ranks, dtype=np.int64).reshape(k, stride).T.copy()


def _skip_reason(op: CommOp, old: int, ranks: int) -> str:
    """Why an op cannot be priced at the new scale ('' when it can): rescale's reasons,
    then the collectives without a cost formula."""
    if op.collective in ("send", "recv") or op.group is None:
        return f"{op.collective}: point-to-point ops are not modelled"
    if op.collective not in FORMULAS and op.collective not in _STAND_IN:
        return f"{op.collective}: no cost formula"      # the registry's (Collective.model)
    return ""


def plan_trace(trace: Trace, ranks: int) -> tuple[list[TraceOp], dict[str, int]]:
    """The trace's ops at `ranks` ranks, in order, and {reason: recorded ops} of those
    that cannot be mapped or priced."""
    old = trace.world_size
    calls: dict[int, list[CommOp]] = {}
    for op in trace.all_ops():
        calls.setdefault(op.call, []).append(op)
    skipped: dict[str, int] = {}
    seen: dict[tuple[int, tuple[object, ...]], int] = {}     # (rank, key) -> occurrences
    merged: dict[tuple[object, ...], TraceOp] = {}
    for call in sorted(calls):
        members = sorted(calls[call], key=lambda o: o.rank)
        live = [o for o in members if o.rank < ranks]
        if not live:
            why = f"runs only on recorded ranks {[o.rank for o in members]}, beyond {ranks}"
            skipped[why] = skipped.get(why, 0) + len(members)
            continue
        first = live[0]
        why = _skip_reason(first, old, ranks)
        group: Group | str = ""
        if not why:
            assert first.group is not None
            group = retile_group(first.group, old, ranks, first.rank)
            if isinstance(group, str):
                why = f"{first.collective} on {list(first.group.ranks)}: {group}"
            elif first.root is not None and first.root >= group.size:
                why = f"{first.collective} root {first.root} outside a group of {group.size}"
        if why:
            for o in members:      # an exchange's sends and receives, each by its own kind
                own = _skip_reason(o, old, ranks) if o.collective != first.collective else ""
                skipped[own or why] = skipped.get(own or why, 0) + 1
            continue
        assert first.group is not None and isinstance(group, Group)
        new = resize_op(even_stand_in(first, members), first.group.size, group.size)
        new.group = group
        shape, stride = _shape(group, ranks)
        key = (first.collective, first.dtype, new.size, first.root, shape, group.size, stride)
        occurrence = seen.get((first.rank, key), 0)
        for o in live:
            seen[(o.rank, key)] = seen.get((o.rank, key), 0) + 1
        step = merged.get((key, occurrence))
        if step is None:
            step = merged[(key, occurrence)] = TraceOp(
                index=len(merged), calls=[], node_id=first.node_id, name=first.name,
                collective=first.collective, dtype=first.dtype, size=new.size, shape=shape,
                group_size=group.size, stride=stride, recorded_ranks=[],
                recorded_group=list(first.group.ranks), table=np.zeros((0, 0), np.int64),
                async_op=first.async_op)
        step.calls.append(call)
        step.uncertain |= any(o.group_source == "ambiguous" for o in members)
        step.recorded_ranks = sorted(set(step.recorded_ranks) | {o.rank for o in live})
    ops = sorted(merged.values(), key=lambda s: s.calls[0])
    for i, step in enumerate(ops):
        step.index = i
        table = _all_groups(step.shape, step.group_size, step.stride, ranks)
        active = np.isin(table % old, step.recorded_ranks).any(axis=1)
        step.table = table[active]
    return ops, skipped


def even_stand_in(op: CommOp, members: list[CommOp]) -> CommOp:
    """An uneven all-to-all as the even one of its largest per-peer block, over every member
    of the call (sent or received): its size then rescales as an all-to-all's (the block per
    peer kept). Other ops as they are."""
    if op.collective != "alltoallv" or op.group is None:
        return op
    block = max((s for o in members for s in (*o.in_splits, *o.out_splits)), default=0)
    whole = block * max(op.elsize, 1) * op.group.size
    return dataclasses.replace(op, collective="alltoall", in_bytes=whole, out_bytes=whole,
                               in_splits=(), out_splits=(), notes=list(op.notes))


class _Tiled:
    """A round program of one group copy, run by every copy in `table` at once."""

    def __init__(self, inner: RoundProgram, table: np.ndarray, ranks: int) -> None:
        self.inner, self.table, self.p = inner, table, ranks
        self.num_rounds = inner.num_rounds

    def rounds(self) -> Any:
        copies = self.table.shape[0]
        for rnd in self.inner.rounds():
            nbytes = np.broadcast_to(rnd.nbytes, rnd.src.shape)
            yield Round(self.table[:, rnd.src].ravel(), self.table[:, rnd.dst].ravel(),
                        np.tile(nbytes, copies), np.tile(rnd.reduce, copies), rnd.repeat)


def _sample_pairs(group: np.ndarray) -> list[tuple[int, int]]:
    """Pairs (first member, j-th member) reaching every link class a group uses: the
    neighbours, powers of two, the middle and 16 evenly spaced members."""
    k = group.size
    js = {1, k - 1, k // 2}
    js.update(1 << i for i in range(max(1, k.bit_length())))
    js.update(int(x) for x in np.linspace(1, k - 1, 16))
    return [(int(group[0]), int(group[j])) for j in sorted(js) if 0 < j < k]


@dataclass
class _Pricer:
    model: ModelFile
    ranks: int
    topology: str
    fidelity: str
    sharing: str
    backend: str | None
    links: LinkOverrides
    algorithms: dict[str, str] = field(default_factory=dict)
    topos: dict[tuple[float, ...], Topology] = field(default_factory=dict)
    cache: dict[tuple[Any, ...], OpPrice] = field(default_factory=dict)
    fits: dict[str, TraceFit] = field(default_factory=dict)

    def topo(self, alpha: float, beta: float) -> tuple[Topology, LinkClass, LinkClass]:
        lk = self.links
        inter = LinkClass(lk.inter_alpha if lk.inter_alpha is not None else alpha,
                          lk.inter_beta if lk.inter_beta is not None else beta, lk.hop_latency)
        intra = LinkClass(lk.intra_alpha if lk.intra_alpha is not None else inter.alpha,
                          lk.intra_beta if lk.intra_beta is not None else inter.beta,
                          lk.hop_latency)
        key = (inter.alpha, inter.beta, intra.alpha, intra.beta)
        if key not in self.topos:
            self.topos[key] = build_topology(self.topology, self.ranks, inter, intra)
        return self.topos[key], inter, intra

    def price(self, op: TraceOp, progress: Callable[[str, int, int], None] | None) \
            -> OpPrice:
        coll, note = _STAND_IN.get(op.collective, (op.collective, ""))
        k = op.group_size
        fit, why = select_fit(self.model, coll, k, self.backend)
        algo = self.algorithms.get(coll) or default_algorithm(fit, coll)
        piece, alpha, beta, gamma = _params(fit, op.size)
        key = (coll, algo, k, op.size, op.shape, op.stride, op.table.tobytes(), piece)
        if key in self.cache:
            return self.cache[key].copy()
        topo, _, _ = self.topo(alpha, beta)
        if op.shape == "world":
            a_eff, b_eff = topo.flat_parameters()
        else:
            a_eff, b_eff = topo.flat_parameters(_sample_pairs(op.table[0]))
        t = predict_time(coll, algo, k, op.size, a_eff, b_eff, gamma)
        engine = "formula"
        flags = prediction_flags(fit, why, coll, algo, k)
        if note:
            flags.append(note)
        if self.fidelity == "replay" and k > 1:
            label = f"{op.collective} {algo} {op.size} B x{op.copies}"
            tick = None if progress is None else \
                (lambda done, total: progress(label, done, total))
            if op.shape == "world":
                res = replay_collective(coll, algo, k, op.size, topo, gamma, self.sharing,
                                        progress=tick)
                t, engine = res.time, res.engine
            else:
                inner = round_program(coll, algo, k, op.size)
                if inner is None:
                    flags.append(f"no round schedule for {coll} {algo}: analytical time")
                else:
                    res = replay_rounds(_Tiled(inner, op.table, self.ranks), topo, gamma,
                                        self.sharing, tick)
                    t, engine = res.time, "rounds"
        try:
            factor = busbw_factor(coll, k)
        except UsageError:
            factor = 1.0
        bw = op.size / t / 1e9 if t > 0 else float("nan")
        steps = coefficients(coll, algo, k).a
        link = 1e-9 / b_eff if b_eff > 0 else float("inf")
        flags += [f for f in row_flags(fit, op.size, a_eff, steps,
                                       [bw * factor] if t > 0 and op.size else [], link, k)
                  if f not in flags]
        self.fits.setdefault(coll, {"fit_choice": why, "fit_scope": fit_scope(fit),
                                    "algorithm": algo, "backend": fit.get("backend"),
                                    "library": fit.get("library"),
                                    "collective": fit.get("collective"),
                                    "model_algorithm": fit.get("model_algorithm"),
                                    "world_sizes": fit.get("world_sizes"),
                                    "alpha": fit.get("alpha"), "beta": fit.get("beta"),
                                    "gamma": fit.get("gamma")})
        out: OpPrice = {"algorithm": algo, "fit_collective": fit["collective"], "piece": piece,
               "alpha_s": alpha, "beta_s_per_byte": beta, "gamma_s_per_byte": gamma,
               "time_us": t * 1e6, "algbw_gbps": bw, "busbw_gbps": bw * factor,
               "engine": engine, "flags": flags}
        self.cache[key] = out
        return out.copy()


def parse_algorithms(spec: str | dict[str, str]) -> dict[str, str]:
    """{collective: formula key} from "allreduce=ring,allgather=bruck" (or such a dict)."""
    from ccbench.collectives import canonical_collective
    from ccbench.model.costs import canonical_algorithm

    pairs = spec.items() if isinstance(spec, dict) else \
        [part.partition("=")[::2] for part in spec.split(",") if part.strip()]
    out: dict[str, str] = {}
    for coll, algo in pairs:
        if not coll.strip() or not algo.strip():
            raise UsageError(f"--algorithm with --trace takes COLLECTIVE=FORMULA pairs "
                             f"(e.g. allreduce=ring,allgather=ring), got {spec!r}")
        name = "reduce" if coll.strip() == "reduce" else canonical_collective(coll.strip())
        out[name] = canonical_algorithm(name, algo.strip())
    return out


def _where(paths: list[str]) -> str:
    """The trace's folder when its files share one, else its first file and a count."""
    parents = {str(Path(p).parent) for p in paths}
    if len(paths) > 1 and len(parents) == 1:
        return parents.pop()
    return paths[0] + (f" (+{len(paths) - 1} files)" if len(paths) > 1 else "")


def _first_ranks(n: int) -> str:
    return "recorded rank 0 has" if n == 1 else f"recorded ranks 0-{n - 1} have"


def mapping_warnings(trace: Trace, ranks: int) -> list[str]:
    """Where the recorded ranks map onto `ranks` unevenly: rank q runs recorded rank q mod N,
    so at a size N does not divide, some recorded ranks have one copy more than others."""
    from ccbench.trace.scale import unscalable

    old = trace.world_size
    out = []
    if ranks % old:
        out.append(f"{ranks} ranks is not a multiple of the recorded {old}: rank q runs "
                   f"recorded rank q mod {old}, so {_first_ranks(ranks % old)} one copy "
                   f"more than the others and groups are mapped unevenly")
    why = unscalable(trace)
    if why:
        out.append(f"{why}: its ops are listed as not modelled")
    return out


def _replayable(ops: list[TraceOp], skipped: dict[str, int]) -> list[TraceOp]:
    """The ops a schedule can replay (checked before any is run); the others join `skipped`
    (not modelled) with the recorded ops they stand for."""
    kept = []
    for op in ops:
        coll = _STAND_IN.get(op.collective, (op.collective, ""))[0]
        why = no_schedule(coll) if op.group_size > 1 else ""
        if not why:
            kept.append(op)
            continue
        why += " (--fidelity replay; --fidelity analytical prices it by its formula)"
        skipped[why] = skipped.get(why, 0) + len(op.calls) * len(op.recorded_group)
    for i, op in enumerate(kept):
        op.index = i
    return kept


def simulate_trace(model: ModelFile, trace: Trace, ranks: int, topology: str,
                   fidelity: str = "analytical", sharing: str = "max-min",
                   backend: str | None = None, links: LinkOverrides | None = None,
                   progress: Callable[[str, int, int], None] | None = None,
                   algorithms: dict[str, str] | None = None,
                   both_readings: bool = True) -> TraceSimulation:
    """Every op's predicted time at `ranks` ranks on `topology`, the per-rank and total
    communication time, the fits used and what could not be priced. `algorithms` replaces
    the fitted formula of a collective ({"allreduce": "ring"}). Where the trace leaves some
    calls' groups open, `other_reading` is the total with them read on the smallest groups
    that fit (ccbench.trace.groups.other_reading): the two totals bound the prediction."""
    if fidelity not in TRACE_FIDELITIES:
        raise UsageError(f"unknown fidelity {fidelity!r} for a trace "
                         f"(valid: {', '.join(TRACE_FIDELITIES)})")
    if ranks < 2:
        raise UsageError(f"--ranks must be >= 2, got {ranks}")
    ops, skipped = plan_trace(trace, ranks)
    if fidelity == "replay":
        ops = _replayable(ops, skipped)
    pricer = _Pricer(model, ranks, topology, fidelity, sharing, backend,
                     links or LinkOverrides(), parse_algorithms(algorithms or {}))
    rows: list[TraceRow] = []
    per_rank = dict.fromkeys(range(min(trace.world_size, ranks)), 0.0)
    for op in ops:
        priced = pricer.price(op, progress)
        if op.uncertain:
            priced["flags"] = [*priced["flags"], UNCERTAIN]
        for r in op.recorded_ranks:
            per_rank[r] += priced["time_us"]
        first = op.table[0]
        rows.append({"index": op.index, "calls": op.calls, "node_id": op.node_id,
                     "name": op.name, "collective": op.collective, "dtype": op.dtype,
                     "size": op.size, "group_shape": op.shape, "group_size": op.group_size,
                     "group_stride": op.stride, "group_copies": op.copies,
                     "group_first": [int(first[0]), int(first[-1])],
                     "recorded_group": op.recorded_group, "recorded_ranks": op.recorded_ranks,
                     "async": op.async_op, **priced})
    slowest = max(per_rank, key=lambda r: per_rank[r]) if per_rank else 0
    flags: list[str] = []
    for row in rows:
        flags += [f for f in row["flags"] if f not in flags]
    by_coll: dict[str, CollectiveTime] = {}
    for row in rows:
        if slowest in row["recorded_ranks"]:
            entry = by_coll.setdefault(row["collective"], {"ops": 0, "bytes": 0, "time_us": 0.0})
            entry["ops"] += 1
            entry["bytes"] += row["size"]
            entry["time_us"] += row["time_us"]
    return {"trace": _where(trace.paths),
            "kind": trace.kind, "recorded_world_size": trace.world_size, "world_size": ranks,
            "topology": topology, "fidelity": fidelity, "sharing": sharing,
            "ops": rows, "total_us": per_rank.get(slowest, 0.0), "slowest_rank": slowest,
            "per_rank_us": {str(r): t for r, t in per_rank.items()},
            "by_collective": by_coll, "fits": pricer.fits,
            "not_modelled": [{"reason": why, "recorded_ops": n}
                             for why, n in sorted(skipped.items())],
            "flags": flags, "notes": list(trace.notes),
            "warnings": mapping_warnings(trace, ranks),
            **_uncertain_counts(trace, rows),
            "other_reading": _other_reading(trace, both_readings, model, ranks, topology,
                                            fidelity, sharing, backend, links, algorithms)}


def _uncertain_counts(trace: Trace, rows: list[TraceRow]) -> UncertainCounts:
    """The trace's ambiguous calls (ccbench.trace.groups.ambiguous_calls, the count replay
    and the trace's note give), how many of them are priced and on how many rows (calls of
    one step on disjoint groups share a row)."""
    calls = ambiguous_calls(trace)
    flagged = [row for row in rows if UNCERTAIN in row["flags"]]
    return {"uncertain_calls": len(calls),
            "uncertain_priced_calls": len(calls & {c for row in flagged for c in row["calls"]}),
            "uncertain_rows": len(flagged)}


def _other_reading(trace: Trace, wanted: bool, model: ModelFile, ranks: int,
                   topology: str, fidelity: str, sharing: str, backend: str | None,
                   links: LinkOverrides | None, algorithms: dict[str, str] | None
                   ) -> OtherReading | None:
    """The prediction's total with the uncertain calls on the smallest groups that fit."""
    other = other_reading(trace) if wanted else None
    if other is None:
        return None
    out = simulate_trace(model, other, ranks, topology, fidelity, sharing, backend, links,
                         None, algorithms, both_readings=False)
    calls = {op.call for op in other.all_ops() if op.group_source == "ambiguous"}
    return {"total_us": out["total_us"], "slowest_rank": out["slowest_rank"],
            "calls": len(calls), "ops": len(out["ops"]),
            "reading": "the uncertain calls on the smallest groups that fit"}
