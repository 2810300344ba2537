"""A recorded trace's communication as ASTRA-sim inputs: one Chakra ET per NPU, the
communicator groups, the network and system configs (`ccbench export astra-sim --trace`).

The ops and their sizes, groups and order are those `simulate --trace` prices
(ccbench.model.tracesim at the same rank count), so the congestion-unaware binary's time
is comparable with its total:

* every NPU gets the ops of the recorded rank it plays (q mod N), chained in trace order
  by data and control dependencies (ASTRA-sim's feeder follows data_deps only); an op on
  a process group names its communicator group (`pg_name`, an integer id) and
  `comm_groups.json` lists each group's NPUs (--comm-group-configuration); world ops
  name none;
* all-reduce, all-gather, reduce-scatter and all-to-all are COMM_COLL nodes that ASTRA-sim
  runs with its own implementation of the fitted formula (ccbench.formats.astra);
* ops ASTRA-sim has no implementation for (broadcast, reduce, a barrier), and all-to-alls
  priced by the direct formula on more than 2 ranks (ASTRA-sim's direct1 charges alpha
  p-1 times, and the link latency is the whole run's), are compute nodes carrying
  ccbench's predicted time as their duration, rounded to the whole microseconds Chakra
  stores: ASTRA-sim then adds them as given (the manifest says which and why, and the
  expected total includes the rounding);
* one set of link parameters per run: the ops' fits must share alpha and beta (and the
  reducing ones gamma); otherwise the export is refused with the fits named.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypedDict

import numpy as np

from ccbench.collectives import REDUCING
from ccbench.errors import UsageError
from ccbench.formats.astra import (
    _ASTRA_KEYS,
    NO_REDUCTION_COST,
    AstraDim,
    _dims,
    _intra,
    _safe,
    astra_comm_size,
    astra_implementation,
    network_yaml,
    out_path,
    system_json,
)
from ccbench.formats.chakra import NODE_TYPES, _attr, classes, comm_coll_node, write_trace
from ccbench.model.modelfile import ModelFile
from ccbench.model.simulate import LinkOverrides
from ccbench.model.tracesim import (
    NotModelled,
    TraceFit,
    TraceRow,
    plan_trace,
    simulate_trace,
)
from ccbench.trace.ops import Trace

__all__ = ["export_astra_trace", "trace_export_lines", "AstraTraceWorkload", "AstraTraceExport"]


def _astra_collective(row: TraceRow) -> str:
    """The collective ASTRA-sim runs for a priced row: an uneven all-to-all as the even
    all-to-all simulate --trace priced (ccbench.model.tracesim.even_stand_in)."""
    return "alltoall" if row["collective"] == "alltoallv" else row["collective"]


#: why an op ASTRA-sim implements is still written as a compute node of its predicted time
DIRECT_ALLTOALL = ("all-to-all priced by the direct formula (every message at once, one "
                   "alpha): ASTRA-sim's all-to-all (direct1) charges alpha per step, p-1 "
                   "times, and its direct shares no link in the congestion-unaware binary; "
                   "-a alltoall=pairwise runs it natively")


def _not_native(row: TraceRow, coll: str) -> str:
    """Why this op, of a collective ASTRA-sim implements, cannot run as its COMM_COLL node
    with the time simulate --trace gives it ('' when it can). The one network of a run has
    one latency, so the direct all-to-all's single alpha (which a one-collective export
    gets by dividing the link latency by p-1) cannot be given to it beside other ops."""
    if coll == "alltoall" and row["algorithm"] == "direct" and row["group_size"] > 2:
        return DIRECT_ALLTOALL
    return ""


def _delay_node(node_id: int, name: str, micros: int, row: TraceRow, pg: str | None
                ) -> Any:
    """A compute node ASTRA-sim replays for `micros` (it has no model of this op). Its
    ccbench_* attributes say which op it stands for, so that ccbench reads the export back
    as the communication it is (ccbench.formats.chakra_et); ASTRA-sim reads none of them."""
    node = classes()["Node"](id=node_id, name=name, type=NODE_TYPES["COMP_NODE"],
                             duration_micros=micros)
    node.attr.append(_attr("is_cpu_op", False))
    node.attr.append(_attr("ccbench_collective", _astra_collective(row)))
    node.attr.append(_attr("ccbench_size", int(row["size"])))
    if pg is not None:
        node.attr.append(_attr("ccbench_pg_name", pg))
    return node


def _one_value(rows: list[TraceRow], key: Literal["alpha_s", "beta_s_per_byte"], what: str,
               given: float | None, option: str) -> float:
    """The one link value every op uses: `given` (an override) or the fits' common one."""
    if given is not None:
        return given
    values = sorted({r[key] for r in rows})
    if len(values) > 1 and values[-1] > values[0] * (1 + 1e-9):
        named = sorted({f"{r['fit_collective']} ({r[key]:.4g})" for r in rows})
        raise UsageError(f"cannot export this trace in one ASTRA-sim run: its ops' fits have "
                         f"different {what} ({', '.join(named)}) and ASTRA-sim has one network "
                         f"per run; give the network's with {option} (and the same to "
                         f"simulate --trace to compare)")
    return values[0] if values else 0.0


class AstraTraceWorkload(TypedDict):
    prefix: str                   # the Chakra files are <prefix>.<npu>.et
    ops: int
    simulate_total_us: float      # what `simulate --trace` predicts
    total_us: float               # what ASTRA-sim should give: the slowest NPU's expected
    per_npu_us: list[float]
    predicted_duration_ops: list[str]        # collectives written as compute nodes
    predicted_duration_why: dict[str, str]


class AstraTraceExport(TypedDict):
    """What `export_astra_trace` returns and writes as ccbench-export.json."""

    ranks: int
    topology: str
    trace: str
    recorded_world_size: int
    dims: list[AstraDim]
    alpha_s: float
    beta_s_per_byte: float
    local_mem_bw: float
    implementations: dict[str, str]
    comm_groups: int
    workload: AstraTraceWorkload
    not_modelled: list[NotModelled]
    flags: list[str]
    fits: dict[str, TraceFit]
    run: str


def export_astra_trace(model: ModelFile, trace: Trace, out_dir: str | os.PathLike[str],
                       ranks: int, topology: str | None = None, backend: str | None = None,
                       prefix: str = "workload", links: LinkOverrides | None = None,
                       algorithms: dict[str, str] | None = None) -> AstraTraceExport:
    """Write the workload, comm groups and configs; return the manifest (also written as
    ccbench-export.json) with the `simulate --trace` prediction it should match (the same
    link overrides given to both)."""
    topology = topology or f"switch:{ranks}"
    links = links or LinkOverrides()
    if links.hop_latency:
        raise UsageError("a per-hop latency is not exported (ASTRA-sim's latency is per hop "
                         "already); leave --hop-latency-us out")
    pred = simulate_trace(model, trace, ranks, topology, "analytical", backend=backend,
                          links=links, algorithms=algorithms)
    ops, _ = plan_trace(trace, ranks)
    rows = pred["ops"]
    if not rows:
        raise UsageError("the trace has no op that can be exported (see simulate --trace)")
    alpha, beta, dims = _network(rows, ops, links, topology, ranks)
    impls = _implementations(rows, dims[0]["topology"])
    groups = _npu_groups(ops, ranks)
    out = out_path(out_dir)
    work = out / _safe(prefix)
    per_npu_us = []
    for q in range(ranks):
        nodes, expected = _npu_nodes(q, rows, ops, impls.native, groups)
        write_trace(f"{work}.{q}.et", nodes, metadata={"source": "ccbench export astra-sim "
                                                                 "--trace"})
        per_npu_us.append(expected)
    _write_configs(out, groups.ids, dims, impls)
    delayed = sorted({_astra_collective(r) for r, n in zip(rows, impls.native, strict=True)
                      if not n})
    manifest: AstraTraceExport = {
        "ranks": ranks, "topology": topology, "trace": pred["trace"],
        "recorded_world_size": pred["recorded_world_size"], "dims": dims,
        "alpha_s": alpha, "beta_s_per_byte": beta, "local_mem_bw": impls.local_mem_bw,
        "implementations": impls.names, "comm_groups": len(groups.ids),
        "workload": {"prefix": str(work), "ops": len(rows),
                     "simulate_total_us": pred["total_us"],
                     "total_us": max(per_npu_us), "per_npu_us": per_npu_us,
                     "predicted_duration_ops": delayed,
                     "predicted_duration_why": {c: impls.why[c] for c in delayed}},
        "not_modelled": pred["not_modelled"], "flags": pred["flags"], "fits": pred["fits"],
        "run": (f"AstraSim_Analytical_Congestion_Unaware --workload-configuration={work} "
                f"--system-configuration={out / 'system.json'} "
                f"--network-configuration={out / 'network.yml'} "
                f"--remote-memory-configuration={out / 'remote_memory.json'} "
                f"--comm-group-configuration={out / 'comm_groups.json'}"),
    }
    (out / "ccbench-export.json").write_text(json.dumps(manifest, indent=1) + "\n",
                                             encoding="utf-8")
    return manifest


def _network(rows: list[TraceRow], ops: list[Any], links: LinkOverrides, topology: str,
             ranks: int) -> tuple[float, float, list[AstraDim]]:
    """The one set of link parameters of the run (alpha, beta, network dims), refused where
    ASTRA-sim would time the trace's ops otherwise than simulate --trace."""
    alpha = _one_value(rows, "alpha_s", "alpha", links.inter_alpha, "--inter-alpha-us")
    beta = _one_value(rows, "beta_s_per_byte", "beta", links.inter_beta, "--inter-bw")
    dims = _dims(topology, ranks, alpha, beta,
                 _intra(alpha, beta, links.intra_alpha, links.intra_beta))
    if len(dims) > 1:
        raise UsageError(f"cannot export a trace on {topology}: ASTRA-sim runs each collective "
                         f"dimension by dimension ({len(dims)} dimensions), which the flat "
                         f"formulas of simulate --trace do not describe (use a one-dimension "
                         f"topology: switch, ring, fully-connected)")
    if dims[0]["topology"] == "Ring" and any(op.shape != "world" for op in ops):
        raise UsageError(f"cannot export this trace on {topology}: its process groups' ring "
                         f"neighbours are several hops apart on a Ring network, where ASTRA-sim "
                         f"charges the latency per hop and ccbench's alpha once per message "
                         f"(use switch or fully-connected)")
    return alpha, beta, dims


@dataclass
class _Implementations:
    """ASTRA-sim's implementation per collective, whether each op runs as a COMM_COLL node
    (else as a compute node of its predicted time), and the one local-mem-bw."""

    names: dict[str, str] = field(default_factory=dict)
    native: list[bool] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)    # collective -> why not native
    local_mem_bw: float = NO_REDUCTION_COST


def _implementation(row: TraceRow, rows: list[TraceRow], coll: str, network: str,
                    chosen: dict[str, str]) -> tuple[str, float]:
    """One op's implementation, refused where it cannot share the run with the others."""
    gamma = row["gamma_s_per_byte"] if coll in REDUCING else 0.0
    impl, mult = astra_implementation(coll, row["algorithm"], row["group_size"], network, gamma)
    if impl == "doubleBinaryTree" and (sum(r["collective"] == coll for r in rows) > 1
                                       or row["group_shape"] != "world"):
        raise UsageError("cannot export this trace's tree allreduce: ASTRA-sim's "
                         "doubleBinaryTree releases ranks at different times, so a chain "
                         "of them (or one per group) overlaps where ccbench's formula runs "
                         "them one after the other; pass --algorithm allreduce=ring to "
                         "export and to simulate --trace alike")
    if chosen.setdefault(coll, impl) != impl:
        raise UsageError(f"cannot export this trace: its {coll} ops need ASTRA-sim "
                         f"implementations {chosen[coll]} and {impl} (group sizes "
                         f"differ) and a run has one per collective")
    return impl, mult


def _implementations(rows: list[TraceRow], network: str) -> _Implementations:
    out = _Implementations()
    reducing_bw: set[float] = set()
    for row in rows:
        coll = _astra_collective(row)
        why = "no ASTRA-sim implementation" if coll not in _ASTRA_KEYS \
            else _not_native(row, coll)
        if why:
            out.native.append(False)
            out.why.setdefault(coll, why)
            continue
        _impl, mult = _implementation(row, rows, coll, network, out.names)
        gamma = row["gamma_s_per_byte"] if coll in REDUCING else 0.0
        if gamma > 0 and mult > 0 and row["group_size"] > 1:
            reducing_bw.add(round(3.0 * mult / gamma / 1e9, 9))
        out.native.append(True)
    if len(reducing_bw) > 1:
        raise UsageError(f"cannot export this trace in one ASTRA-sim run: its reducing ops need "
                         f"local-mem-bw {sorted(reducing_bw)} (different gamma or "
                         f"halvingDoubling at different group sizes)")
    out.local_mem_bw = reducing_bw.pop() if reducing_bw else NO_REDUCTION_COST
    return out


@dataclass
class _NpuGroups:
    """Communicator groups (one id per distinct group of a sub-world op, from 1) and, per op
    and NPU, whether one of the op's active copies holds the NPU and that copy's group id."""

    ids: dict[tuple[int, ...], int]
    holds: np.ndarray
    pg_of: np.ndarray


def _npu_groups(ops: list[Any], ranks: int) -> _NpuGroups:
    group_ids: dict[tuple[int, ...], int] = {}
    for op in ops:
        if op.shape != "world":
            for row in op.table:
                group_ids.setdefault(tuple(int(x) for x in row), len(group_ids) + 1)
    holds = np.zeros((len(ops), ranks), bool)
    pg_of = np.zeros((len(ops), ranks), np.int64)
    for i, op in enumerate(ops):
        holds[i, op.table.ravel()] = True
        if op.shape != "world":
            for row in op.table:
                pg_of[i, row] = group_ids[tuple(int(x) for x in row)]
    return _NpuGroups(group_ids, holds, pg_of)


def _npu_nodes(q: int, rows: list[TraceRow], ops: list[Any], native: list[bool],
               groups: _NpuGroups) -> tuple[list[Any], float]:
    """NPU q's nodes (its ops in trace order, each after the one before) and the time they
    should take."""
    nodes: list[Any] = []
    expected = 0.0
    for j in np.flatnonzero(groups.holds[:, q]).tolist():
        row, op = rows[j], ops[j]
        deps = [len(nodes) - 1] if nodes else []
        name = f"{row['collective']}:{row['size']}B:node{row['node_id']}"
        pg = str(groups.pg_of[j, q]) if op.shape != "world" else None
        if native[j]:
            comm = astra_comm_size(_astra_collective(row), row["size"], op.group_size)
            node = comm_coll_node(len(nodes), name, _astra_collective(row), comm,
                                  pg_name=pg, involved_dim=[True])
            expected += row["time_us"]
        else:
            micros = max(1, round(row["time_us"]))
            node = _delay_node(len(nodes), f"ccbench-predicted:{name}", micros, row, pg)
            expected += micros
        # ASTRA-sim's feeder orders nodes by data_deps only; a comm op may otherwise
        # run beside a compute node. Chakra readers that follow ctrl_deps see the same.
        node.ctrl_deps.extend(deps)
        node.data_deps.extend(deps)
        nodes.append(node)
    return nodes, expected


def _write_configs(out: Path, group_ids: dict[tuple[int, ...], int], dims: list[AstraDim],
                   impls: _Implementations) -> None:
    (out / "comm_groups.json").write_text(
        json.dumps({str(gid): list(g) for g, gid in group_ids.items()}) + "\n",
        encoding="utf-8")
    (out / "network.yml").write_text(network_yaml(dims), encoding="utf-8")
    (out / "system.json").write_text(
        json.dumps(system_json(impls.names, 1, impls.local_mem_bw), indent=2) + "\n",
        encoding="utf-8")
    (out / "remote_memory.json").write_text(
        json.dumps({"memory-type": "NO_MEMORY_EXPANSION"}, indent=2) + "\n", encoding="utf-8")


def trace_export_lines(manifest: AstraTraceExport) -> list[str]:
    """What `ccbench export astra-sim --trace` prints."""
    w = manifest["workload"]
    lines = [f"wrote {w['prefix']}.<npu>.et for {manifest['ranks']} NPUs ({w['ops']} ops of "
             f"{manifest['trace']}, recorded at {manifest['recorded_world_size']} ranks), "
             f"comm_groups.json ({manifest['comm_groups']} groups), network.yml, system.json, "
             f"remote_memory.json"]
    for d in manifest["dims"]:
        lines.append(f"  {d['topology']}({d['npus']}): bandwidth {d['bandwidth']:.4g} (GiB/s "
                     f"as ASTRA-sim reads it = {1e-9 / d['beta_s_per_byte']:.4g} GB/s), "
                     f"latency {d['latency_ns']:.4g} ns/hop")
    for coll, impl in manifest["implementations"].items():
        fit = manifest["fits"].get(coll)
        algo, choice = (fit["algorithm"], fit["fit_choice"]) if fit else (None, None)
        lines.append(f"  {coll}: {impl} (formula {algo}; {choice})")
    why = w.get("predicted_duration_why", {})
    for reason in dict.fromkeys(why.get(c, "no ASTRA-sim implementation")
                                for c in w["predicted_duration_ops"]):
        colls = [c for c in w["predicted_duration_ops"]
                 if why.get(c, "no ASTRA-sim implementation") == reason]
        lines.append(f"  {', '.join(colls)}: {reason}; written as compute nodes of ccbench's "
                     f"predicted time (whole us)")
    for skip in manifest["not_modelled"]:
        lines.append(f"  not exported ({skip['recorded_ops']} recorded ops): {skip['reason']}")
    lines.append(f"  simulate --trace total {w['simulate_total_us']:.2f} us; expected from "
                 f"ASTRA-sim {w['total_us']:.2f} us")
    lines.append(f"  run: {manifest['run']}")
    return lines
