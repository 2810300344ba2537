"""ASTRA-sim v2 analytical-backend inputs from a calibrated model, and Chakra workloads.

What the real binaries do (read from ASTRA-sim's source and measured against
../shared/tools/astra-sim; tests/test_model_astra_binary.py runs them), and how the
export maps ccbench's alpha-beta-gamma model onto it so that the congestion-unaware
binary's time equals `ccbench simulate --fidelity analytical` on the same model:

* network `bandwidth` says GB/s but is converted with 2^30 (GiB/s): written as
  (1 / beta) / 2^30, where ccbench's GB/s are 1e9 bytes per second.
* a message costs hops x `latency` + bytes / bandwidth (hops: Switch 2, Ring the shorter
  direction, FullyConnected 1) and every step of a collective also costs `endpoint-delay`
  once, plus once more per collective. endpoint-delay 0 aborts the run (the event queue
  asserts strictly increasing event times), so it is 1 ns and the latency carries the
  rest: latency = (alpha - 1 ns) / hops. The error left is 1 ns per collective.
* a reducing receive costs 3 x its bytes / `local-mem-bw`, with local-mem-bw multiplied
  by 1e9 (decimal). Ring reduces (p-1)/p n bytes, as the formula's c(p) says, so
  local-mem-bw = 3 / gamma / 1e9. halvingDoubling skips the reduction of its first
  step (it reduces n (p-2) / (2p)), so its local-mem-bw is scaled to charge the
  formula's gamma n (p-1)/p; at 2 ranks it reduces nothing, and a gamma there is refused.
* implementations: ring -> `ring`; pairwise all-to-all -> `direct1` (one message in
  flight: p-1 steps); direct all-to-all (every message at once, one alpha) -> `direct1`
  too, with the link latency divided by p-1 so the p-1 steps charge alpha once: ASTRA-sim's
  own `direct` sends all p-1 messages at once but the congestion-unaware binary lets them
  share nothing (measured on Switch, 1 MiB: n/p x beta, where the rank's one link carries
  (p-1)/p x n; the congestion-aware binary gave n x beta at 3, 4 and 8 ranks); Rabenseifner,
  recursive halving, recursive doubling / Bruck all-gather -> `halvingDoubling` at
  powers of two only (elsewhere ASTRA-sim aborts or computes a power of two's time);
  the binomial-tree allreduce -> `doubleBinaryTree` at powers of two without gamma
  (ASTRA-sim's tree is not pipelined: 2 lg p steps of the whole buffer). Everything
  else (recursive-doubling allreduce, the pipelined double binary tree, Bruck
  all-to-all, broadcast) has no ASTRA-sim counterpart and is refused.
* one network per run: a workload whose sizes fall in different pieces of a piecewise
  fit is refused (export each piece's sizes separately); so is a multi-dimensional
  network for a collective workload (ASTRA-sim runs a collective dimension by dimension,
  a hierarchical algorithm ccbench's flat formula does not describe), and, on a Ring
  network, an algorithm whose messages travel more than one hop (ASTRA-sim charges the
  latency per hop, ccbench's alpha once per message).
* Chakra comm_size: all-gather takes the per-rank shard (S / p), allreduce,
  reduce-scatter and all-to-all the whole buffer S, laid out with the same element
  size as `simulate` (float32), so both see the same bytes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict, cast

from ccbench.collectives import COLLECTIVES, every, get
from ccbench.errors import UsageError
from ccbench.formats.chakra import comm_coll_node, write_trace
from ccbench.model.costs import coefficients
from ccbench.model.fit import FitEntry, piece_end
from ccbench.model.hierarchical import ALGORITHM as HIER
from ccbench.model.hierarchical import link_dims
from ccbench.model.modelfile import ModelFile, select_fit
from ccbench.model.topology import LinkClass, build_topology

if TYPE_CHECKING:
    from ccbench.formats.astra_trace import AstraTraceExport
    from ccbench.model.simulate import SimulateFit, SimulateRow, Simulation

__all__ = ["GIB", "astra_bandwidth", "astra_comm_size", "astra_implementation", "chakra_skip_reason",
           "export_astra", "skipped_line",
           "network_yaml", "system_json", "ENDPOINT_DELAY_NS", "AstraDim", "AstraSystem",
           "AstraNode", "AstraWorkload", "AstraExport"]

GIB = float(1 << 30)
HOPS = {"Ring": 1, "FullyConnected": 1, "Switch": 2}
ENDPOINT_DELAY_NS = 1          # the smallest value that does not abort the run
NO_REDUCTION_COST = 1e6        # local-mem-bw (x 1e9 B/s) when gamma is 0: 3 x 1 GiB costs 3 ns

# the collectives ASTRA-sim implements, and their system-file keys (the registry's rule)
_ASTRA_KEYS = {c.name: c.export.astra for c in every()
               if c.export is not None and c.export.astra is not None}
# the system file's keys in the order ASTRA-sim's own examples write them (keys it does not
# list in its examples follow)
_SYSTEM_ORDER = ("all-reduce-implementation", "reduce-scatter-implementation",
                 "all-gather-implementation", "all-to-all-implementation")


def _default_implementations() -> dict[str, str]:
    """The implementation written for collectives the workload does not use (each one's
    first), in the system file's order."""
    named = [(c.name, c.export) for c in every()
             if c.export is not None and c.export.astra and c.export.astra_impls]
    order = {key: i for i, key in enumerate(_SYSTEM_ORDER)}
    named.sort(key=lambda item: order.get(str(item[1].astra), len(order)))
    return {name: next(iter(export.astra_impls.values())) for name, export in named}


_DEFAULT_IMPL = _default_implementations()
# ASTRA-sim implementations that run at powers of two only
_POW2_ONLY = ("halvingDoubling", "doubleBinaryTree")


def astra_bandwidth(beta: float) -> float:
    """The YAML bandwidth for a link of beta seconds per byte (ASTRA-sim reads GiB/s)."""
    if beta <= 0:
        raise UsageError("beta is 0: the fit has no bandwidth term to export")
    return (1.0 / beta) / GIB


def astra_comm_size(collective: str, size_used: int, p: int) -> int:
    """Chakra comm_size for the laid-out size S (all-gather wants the per-rank shard)."""
    names = get(collective).export
    if names is None:
        raise UsageError(f"Chakra cannot express {collective}: it has no comm_size")
    return names.comm_size(size_used, p)


def _pow2(p: int) -> bool:
    return p >= 1 and p & (p - 1) == 0


def astra_implementation(collective: str, algorithm: str, p: int, network: str,
                         gamma: float) -> tuple[str, float]:
    """(ASTRA-sim implementation, gamma multiplier for local-mem-bw) or UsageError saying
    why ASTRA-sim cannot reproduce this formula. local-mem-bw = 3 x multiplier / gamma."""
    what = f"{collective} {algorithm} at {p} ranks"
    if collective not in _ASTRA_KEYS:
        raise UsageError(f"ASTRA-sim has no {collective} implementation "
                         f"(valid: {', '.join(_ASTRA_KEYS)})")
    spec = get(collective)
    impls = spec.export.astra_impls if spec.export is not None else {}
    impl = impls.get(algorithm)
    if impl is None:
        able = "; ".join(f"{a} ({i}{', powers of two' if i in _POW2_ONLY else ''})"
                         for a, i in impls.items())
        raise UsageError(f"cannot export {what}: ASTRA-sim has no implementation with this "
                         f"cost formula (exportable {collective}: {able})")
    if impl in _POW2_ONLY and not _pow2(p):
        raise UsageError(f"cannot export {what}: ASTRA-sim's {impl} needs a power-of-two "
                         f"rank count")
    mult = 1.0
    if impl == "halvingDoubling" and spec.reduces and gamma > 0:
        if p == 2:
            raise UsageError(f"cannot export {what} with gamma > 0: ASTRA-sim's "
                             f"halvingDoubling charges no reduction at 2 ranks")
        mult = (p - 2) / (2 * (p - 1))    # it reduces n(p-2)/(2p), the formula n(p-1)/p
    if impl == "doubleBinaryTree" and gamma > 0:
        raise UsageError(f"cannot export {what} with gamma > 0: ASTRA-sim's "
                         f"doubleBinaryTree reduces other amounts than the binomial formula")
    if network == "Ring" and impl != "ring" and p > 3:
        raise UsageError(f"cannot export {what} on a Ring network: its messages travel more "
                         f"than one hop and ASTRA-sim charges the latency per hop, ccbench's "
                         f"alpha once per message (use switch or fully-connected)")
    return impl, mult


def _fmt_list(values: Sequence[Any]) -> str:
    return "[ " + ", ".join(f"{v:.9g}" if isinstance(v, float) else str(v) for v in values) + " ]"


class AstraDim(TypedDict):
    """One dimension of the exported network (network.yml's columns and the link it models)."""

    topology: str                 # Ring | FullyConnected | Switch
    npus: int
    bandwidth: float              # as ASTRA-sim reads it (GiB/s)
    latency_ns: float             # per hop
    beta_s_per_byte: float
    alpha_s: float


#: system.json: its *-implementation keys are the registry's (Collective.export.astra)
AstraSystem = dict[str, str | int | float | list[str]]


def network_yaml(dims: Sequence[AstraDim]) -> str:
    lines = ["# ASTRA-sim analytical network, written by ccbench export astra-sim",
             "# bandwidth in GB/s as ASTRA-sim reads it (x 2^30 bytes/s); latency ns per hop",
             f"topology: {_fmt_list([d['topology'] for d in dims])}",
             f"npus_count: {_fmt_list([d['npus'] for d in dims])}",
             f"bandwidth: {_fmt_list([d['bandwidth'] for d in dims])}",
             f"latency: {_fmt_list([d['latency_ns'] for d in dims])}"]
    return "\n".join(lines) + "\n"


def _latency_ns(alpha: float, kind: str) -> float:
    return max(0.0, alpha * 1e9 - ENDPOINT_DELAY_NS) / HOPS[kind]


def _dims(topology: str, ranks: int, alpha: float, beta: float,
          intra: LinkClass | None) -> list[AstraDim]:
    inter = LinkClass(alpha, beta)
    topo = build_topology(topology, ranks, inter, intra)
    return [{"topology": d.kind, "npus": d.npus, "bandwidth": astra_bandwidth(d.beta),
             "latency_ns": _latency_ns(d.alpha, d.kind), "beta_s_per_byte": d.beta,
             "alpha_s": d.alpha} for d in link_dims(topo, inter, intra)]


def _intra(alpha: float, beta: float, intra_alpha: float | None,
           intra_beta: float | None) -> LinkClass:
    """The intra-host link class: the given values, else the network's."""
    return LinkClass(alpha if intra_alpha is None else intra_alpha,
                     beta if intra_beta is None else intra_beta)


def system_json(implementations: dict[str, str], ndims: int,
                local_mem_bw: float) -> AstraSystem:
    sysconf: AstraSystem = {"scheduling-policy": "LIFO", "endpoint-delay": ENDPOINT_DELAY_NS,
                               "active-chunks-per-dimension": 1, "preferred-dataset-splits": 1}
    for coll, default in _DEFAULT_IMPL.items():        # the order ASTRA-sim's own examples use
        sysconf[_ASTRA_KEYS[coll]] = [implementations.get(coll, default)] * ndims
    sysconf["collective-optimization"] = "localBWAware"
    sysconf["local-mem-bw"] = local_mem_bw
    sysconf["boost-mode"] = 0
    return sysconf


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def _fit_line(fit: FitEntry | SimulateFit, algorithm: str, piece: str) -> str:
    worlds = ",".join(map(str, fit["world_sizes"]))
    return (f"{fit['backend']}/{fit['library']} {fit['collective']} fit "
            f"(measured algorithm {fit.get('algorithm', '?')}, formula {algorithm}, "
            f"world sizes {worlds}, {piece})")


def _piece_name(fit: FitEntry | SimulateFit, index: int) -> str:
    pieces = fit.get("pieces") or []
    if len(pieces) < 2:
        return "one piece"
    lo = 0 if index == 0 else piece_end(pieces[index - 1]) + 1
    hi = pieces[index]["max_bytes"]
    span = f"{lo} B and up" if hi is None else f"{lo}-{int(hi)} B"
    return f"piece {index + 1} of {len(pieces)}: {span}"


class AstraNode(TypedDict):
    """One COMM_COLL node of a collective workload and the time simulate gives it."""

    size: int
    size_used: int
    comm_size: int
    ccbench_analytical_us: float


class AstraWorkload(TypedDict):
    prefix: str                   # the Chakra files are <prefix>.<rank>.et
    collective: str
    algorithm: str
    implementation: str
    nodes: list[AstraNode]
    total_us: float
    comm_size_rule: str


class AstraExport(TypedDict):
    """What `export_astra` returns and writes as ccbench-export.json; the workload, its
    flags and the command to run it only with a collective."""

    ranks: int
    topology: str
    flags: NotRequired[list[str]]
    workload: NotRequired[AstraWorkload]
    fit_used: str
    run: NotRequired[str]
    alpha_s: float
    beta_s_per_byte: float
    dims: list[AstraDim]
    system_notes: list[str]
    units: str


@dataclass
class _Export:
    """What an export writes: the manifest as it grows, its notes, the implementations
    chosen, and the link parameters of the configs."""

    manifest: dict[str, Any]      # an AstraExport once _write_configs has run
    notes: list[str] = field(default_factory=list)
    implementations: dict[str, str] = field(default_factory=dict)
    alpha: float = 0.0
    beta: float = 0.0
    dims: list[AstraDim] = field(default_factory=list)
    local_mem_bw: float = NO_REDUCTION_COST


@dataclass(frozen=True)
class _Request:
    """The arguments of export_astra for a collective workload."""

    model: ModelFile
    out_dir: str | os.PathLike[str]
    ranks: int
    topology: str
    collective: str
    sizes: Sequence[int]
    backend: str | None
    prefix: str
    intra_beta: float | None
    intra_alpha: float | None
    algorithm: str | None


def export_astra(model: ModelFile, out_dir: str | os.PathLike[str], ranks: int,
                 topology: str | None = None, collective: str | None = None,
                 sizes: Sequence[int] = (), backend: str | None = None,
                 prefix: str = "workload", intra_beta: float | None = None,
                 intra_alpha: float | None = None,
                 algorithm: str | None = None) -> AstraExport:
    """Write network.yml, system.json, remote_memory.json, ccbench-export.json and, with a
    collective, one Chakra workload per rank; refuse (UsageError) what ASTRA-sim's
    analytical backend would time differently from `ccbench simulate`."""
    topology = topology or f"switch:{ranks}"
    export = _Export({"ranks": ranks, "topology": topology})
    if collective:
        _collective_workload(_Request(model, out_dir, ranks, topology, collective, sizes, backend,
                                      prefix, intra_beta, intra_alpha, algorithm), export)
    else:
        _configs_only(model, ranks, topology, backend, intra_alpha, intra_beta, export)
    _write_configs(out_path(out_dir), export)
    return cast(AstraExport, export.manifest)    # built key by key, in the file's order


def _predict(req: _Request) -> Simulation:
    """`simulate --fidelity analytical` of the workload, refused where ASTRA-sim cannot run it
    as one workload: no element per rank, or sizes in several pieces of the fit."""
    from ccbench.model.simulate import LinkOverrides, simulate

    collective, ranks, sizes = req.collective, req.ranks, req.sizes
    if collective not in _ASTRA_KEYS:
        raise UsageError(f"ASTRA-sim has no {collective} implementation "
                         f"(valid: {', '.join(_ASTRA_KEYS)})")
    if not sizes:
        raise UsageError("--collective needs --sizes")
    pred = simulate(req.model, collective, ranks, req.topology, sizes, req.algorithm,
                    "analytical", backend=req.backend,
                    links=LinkOverrides(intra_alpha=req.intra_alpha, intra_beta=req.intra_beta))
    for row in pred["rows"]:
        if row["size_used"] <= 0 or astra_comm_size(collective, row["size_used"], ranks) <= 0:
            raise UsageError(f"cannot export size {row['size_asked']} of {collective} at "
                             f"{ranks} ranks: it holds no float32 element per rank")
    used_pieces = sorted({row["piece"] for row in pred["rows"]})
    if len(used_pieces) > 1:
        pieces = pred["fit"]["pieces"]
        assert pieces and pieces[0]["max_bytes"] is not None   # sizes in two pieces
        raise UsageError(f"cannot export sizes {sizes[0]}-{sizes[-1]} in one run: they fall "
                         f"in {len(used_pieces)} pieces of the piecewise fit (break at "
                         f"{int(pieces[0]['max_bytes'])} B) and ASTRA-sim has one set "
                         f"of link parameters per run; export each piece's sizes separately")
    return pred


def _alpha_share(collective: str, algo: str, ranks: int) -> int:
    """How many of ASTRA-sim's steps share one alpha of the formula: direct1 takes p-1
    steps, each charged a latency; other implementations take the formula's own steps."""
    spec = get(collective)
    impl = spec.export.astra_impls.get(algo) if spec.export is not None else None
    if impl != "direct1":
        return 1
    return max(1, round((ranks - 1) / coefficients(collective, algo, ranks).a))


def _collective_links(req: _Request, algo: str, gamma: float,
                      export: _Export) -> tuple[str, float]:
    """The network dims of the workload's links and its ASTRA-sim implementation:
    (implementation, gamma multiplier for local-mem-bw)."""
    collective, ranks = req.collective, req.ranks
    # direct1 runs p-1 steps, each charged a link latency: a formula that charges fewer
    # alphas (direct all-to-all: one) gives each step its share (see the module doc)
    share = _alpha_share(collective, algo, ranks)
    link_alpha = export.alpha / share
    export.dims = _dims(req.topology, ranks, link_alpha, export.beta,
                        _intra(link_alpha, export.beta, None if req.intra_alpha is None
                               else req.intra_alpha / share, req.intra_beta))
    if share > 1:
        export.notes.append(f"{collective} {algo} as direct1: link latency = alpha / {share} "
                            f"(its p-1 steps charge the formula's "
                            f"{coefficients(collective, algo, ranks).a:g} alpha)")
    if len(export.dims) > 1 and algo != HIER:
        raise UsageError(f"cannot export the {collective} {algo} workload on {req.topology}: "
                         f"ASTRA-sim runs it dimension by dimension ({len(export.dims)} "
                         f"dimensions), which ccbench's flat {algo} formula does not describe "
                         f"(use -a {HIER}, or a one-dimension topology: switch, ring, "
                         f"fully-connected)")
    return astra_implementation(collective, "ring" if algo == HIER else algo, ranks,
                                export.dims[0]["topology"], gamma)


def _collective_workload(req: _Request, export: _Export) -> None:
    collective = req.collective
    pred = _predict(req)
    rows = pred["rows"]
    fit, algo = pred["fit"], pred["algorithm"]
    export.alpha, export.beta = rows[0]["alpha_s"], rows[0]["beta_s_per_byte"]
    gamma = rows[0]["gamma_s_per_byte"]
    piece = _piece_name(fit, sorted({row["piece"] for row in rows})[0])
    impl, mult = _collective_links(req, algo, gamma, export)
    if impl == "doubleBinaryTree" and len(req.sizes) > 1:
        raise UsageError("cannot export several sizes of the tree allreduce in one run: "
                         "ASTRA-sim's doubleBinaryTree releases ranks at different times, "
                         "so its consecutive collectives overlap; export one size per run")
    export.implementations[collective] = impl
    export.local_mem_bw = 3.0 * mult / gamma / 1e9 if gamma > 0 and mult > 0 \
        else NO_REDUCTION_COST
    used = _fit_line(fit, algo, piece)
    export.notes.append(f"fit used: {used}")
    export.notes.append(f"{_ASTRA_KEYS[collective]}: {impl} (formula {algo})")
    export.notes.append(f"local-mem-bw {export.local_mem_bw:.6g} (gamma {gamma:.3e} s/B, 3 x "
                        f"bytes per reducing receive)" if gamma > 0 else
                        "local-mem-bw: no reduction cost (gamma 0)")
    flags = list(pred.get("flags", []))
    for row in rows:
        flags += [f for f in row.get("flags", []) if f not in flags]
    export.notes.extend(f"warning: {f}" for f in flags)
    export.manifest["flags"] = flags
    _write_workload(req, rows, algo, impl, len(export.dims), export.manifest)
    export.manifest["fit_used"] = used
    out = out_path(req.out_dir)
    work = out / _safe(req.prefix)
    export.manifest["run"] = (f"AstraSim_Analytical_Congestion_Unaware "
                              f"--workload-configuration={work} "
                              f"--system-configuration={out / 'system.json'} "
                              f"--network-configuration={out / 'network.yml'} "
                              f"--remote-memory-configuration={out / 'remote_memory.json'}")


def _write_workload(req: _Request, rows: list[SimulateRow], algo: str, impl: str,
                    ndims: int, manifest: dict[str, Any]) -> None:
    """One Chakra file per rank: a COMM_COLL node per size, each after the one before."""
    collective, ranks = req.collective, req.ranks
    nodes = []
    expected: list[AstraNode] = []
    for i, row in enumerate(rows):
        comm = astra_comm_size(collective, row["size_used"], ranks)
        nodes.append(comm_coll_node(i, f"{collective}_{row['size_used']}", collective, comm,
                                    deps=[i - 1] if i else [], involved_dim=[True] * ndims))
        expected.append({"size": row["size_asked"], "size_used": row["size_used"],
                         "comm_size": comm, "ccbench_analytical_us": row["time_us"]})
    for rank in range(ranks):
        write_trace(out_path(req.out_dir) / f"{_safe(req.prefix)}.{rank}.et", nodes,
                    metadata={"source": "ccbench export astra-sim"})
    work = out_path(req.out_dir) / _safe(req.prefix)
    manifest["workload"] = {"prefix": str(work), "collective": collective,
                            "algorithm": algo, "implementation": impl, "nodes": expected,
                            "total_us": sum(e["ccbench_analytical_us"] for e in expected),
                            "comm_size_rule": "all-gather: per-rank shard; "
                                              "others: whole buffer"}


def _configs_only(model: ModelFile, ranks: int, topology: str, backend: str | None,
                  intra_alpha: float | None, intra_beta: float | None, export: _Export) -> None:
    """Configs without a workload: the links from the all-gather fit (no reduction in its
    beta), local-mem-bw from the same library's allreduce gamma."""
    fit, _why = select_fit(model, "allgather", ranks, backend)
    alpha, beta = fit["alpha"], fit["beta"]
    export.alpha, export.beta = alpha, beta
    export.dims = _dims(topology, ranks, alpha, beta,
                        _intra(alpha, beta, intra_alpha, intra_beta))
    reducing = [f for f in model["fits"] if f is not fit and f["collective"] == "allreduce"
                and f["backend"] == fit["backend"] and f["library"] == fit["library"]
                and f["gamma"] > 0]
    gamma = max((f["gamma"] for f in reducing), default=0.0)
    export.local_mem_bw = 3.0 / gamma / 1e9 if gamma > 0 else NO_REDUCTION_COST
    used = _fit_line(fit, fit["model_algorithm"], "first piece" if fit.get("pieces")
                     else "one piece")
    notes = export.notes
    notes.append(f"fit used for the links: {used}")
    notes.append(f"local-mem-bw {export.local_mem_bw:.6g} from the allreduce gamma "
                 f"{gamma:.3e} s/B" if gamma > 0 else
                 "local-mem-bw: no reduction cost (no allreduce gamma)")
    notes.append("implementations: ring, all-to-all direct1 (pass --collective and --sizes "
                 "for a workload checked against ccbench simulate)")
    export.manifest["fit_used"] = used
    if len(export.dims) > 1:
        notes.append(f"{len(export.dims)} dimensions: ASTRA-sim runs collectives dimension by "
                     f"dimension; its times are not comparable with ccbench's flat formulas")


def _write_configs(out: Path, export: _Export) -> None:
    """network.yml, system.json, remote_memory.json and the manifest, ccbench-export.json."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "network.yml").write_text(network_yaml(export.dims), encoding="utf-8")
    sysconf = system_json(export.implementations, len(export.dims), round(export.local_mem_bw, 9))
    (out / "system.json").write_text(json.dumps(sysconf, indent=2) + "\n", encoding="utf-8")
    (out / "remote_memory.json").write_text(
        json.dumps({"memory-type": "NO_MEMORY_EXPANSION"}, indent=2) + "\n", encoding="utf-8")
    export.manifest.update({
        "alpha_s": export.alpha, "beta_s_per_byte": export.beta, "dims": export.dims,
        "system_notes": export.notes,
        "units": "network.yml bandwidth = bytes/s / 2^30 (ASTRA-sim reads GB/s as GiB/s); "
                 "latency ns per hop = (alpha - endpoint-delay) / hops (Switch 2, Ring 1, "
                 "FullyConnected 1); local-mem-bw x 1e9 bytes/s",
    })
    (out / "ccbench-export.json").write_text(json.dumps(export.manifest, indent=1) + "\n",
                                             encoding="utf-8")


def out_path(out_dir: str | os.PathLike[str]) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return out


def chakra_skip_reason(collective: str) -> str | None:
    """Why a measured collective has no Chakra trace (None: it has one)."""
    if collective not in COLLECTIVES:
        return f"not a collective of this ccbench (valid: {', '.join(COLLECTIVES)})"
    if get(collective).export is None:
        return "Chakra has no collective type for it"
    return None


def skipped_line(skipped: Mapping[str, str]) -> str:
    """`skipped sendrecv: Chakra has no collective type for it; skipped ...`"""
    return "; ".join(f"skipped {collective}: {why}" for collective, why in skipped.items())


def export_measured(records: Sequence[Any], out_dir: str | os.PathLike[str],
                    skipped: dict[str, str] | None = None) -> list[str]:
    """One Chakra trace per measured case (run id + case), one COMM_COLL node per timed
    iteration with its duration; each rank's file is the same sequence (the samples are
    the max over ranks). Returns the prefixes written; `skipped` gets each collective left
    out, with why (`chakra_skip_reason`). With nothing to write, UsageError says those
    reasons."""
    out = Path(out_dir)
    left_out: dict[str, str] = {} if skipped is None else skipped
    groups: dict[Any, list[Any]] = {}
    for r in records:
        why = chakra_skip_reason(r.collective)
        if why is not None:
            left_out.setdefault(r.collective, why)
            continue
        groups.setdefault(r.case, []).append(r)     # one run's case: CaseId holds the run id
    if groups:
        out.mkdir(parents=True, exist_ok=True)
    prefixes = []
    for _key, recs in sorted(groups.items(), key=lambda kv: repr(kv[0])):
        recs.sort(key=lambda r: r.size_used)
        first = recs[0]
        op = f"_{first.op}" if first.op else ""       # cases of several ops: one file each
        prefix = _safe(f"{first.run_id}_{first.collective}_{first.backend}_{first.algorithm}_"
                       f"{first.dtype}{op}_{'in' if first.inplace else 'out'}_"
                       f"p{first.world_size}")
        nodes: list[Any] = []
        start = 0.0
        for r in recs:
            samples = r.samples_us or [r.time_us["median"]]
            comm = astra_comm_size(r.collective, r.size_used, r.world_size)
            for i, dur in enumerate(samples):
                nid = len(nodes)
                nodes.append(comm_coll_node(nid, f"{r.collective}:{r.size_used}B:iter{i}",
                                            r.collective, comm, deps=[nid - 1] if nid else [],
                                            start_us=int(round(start)),
                                            duration_us=max(1, int(round(dur)))))
                start += dur
        meta = {"run_id": first.run_id, "backend": first.backend, "library": first.library,
                "library_version": first.library_version, "algorithm": first.algorithm,
                "world_size": first.world_size, "timing": first.timing,
                "source": "ccbench export chakra (measured)",
                "duration_unit": "microseconds, per iteration, max over ranks"}
        for rank in range(first.world_size):
            write_trace(out / f"{prefix}.{rank}.et", nodes, metadata=meta)
        prefixes.append(str(out / prefix))
    if not prefixes:
        raise UsageError("no measured collectives to export"
                         + (f": {skipped_line(left_out)}" if left_out else ""))
    return prefixes


def astra_bin_dir() -> Path:
    """Where the ASTRA-sim analytical binaries are: $CCBENCH_ASTRA_SIM_BIN, else
    ../shared/tools/astra-sim/bin beside the repository."""
    env = os.environ.get("CCBENCH_ASTRA_SIM_BIN")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "tools" / "astra-sim" / "bin"


def run_astra(manifest: AstraExport | AstraTraceExport, binary: str | os.PathLike[str] | None = None,
              aware: bool = False, timeout: float = 600.0) -> float:
    """Run the real ASTRA-sim binary on an export's files; the slowest NPU's time, seconds."""
    import subprocess
    import tempfile

    if "workload" not in manifest:
        raise UsageError("the export has no workload (pass --collective and --sizes)")
    name = "AstraSim_Analytical_Congestion_" + ("Aware" if aware else "Unaware")
    exe = Path(binary) if binary else astra_bin_dir() / name
    if not exe.is_file():
        raise UsageError(f"no ASTRA-sim binary at {exe} (set CCBENCH_ASTRA_SIM_BIN to its folder)")
    args = [str(exe)]
    for arg in manifest["run"].split()[1:]:
        key, _, path = arg.partition("=")
        args.append(f"{key}={Path(path).resolve()}")
    # ASTRA-sim writes log/log.log under its working directory: keep it out of the caller's
    with tempfile.TemporaryDirectory(prefix="ccbench-astra-") as cwd:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                              check=False, cwd=cwd)
    cycles = [int(m) for m in re.findall(r"sys\[\d+\] finished, (\d+) cycles", proc.stdout)]
    if proc.returncode != 0 or len(cycles) != manifest["ranks"]:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
        raise UsageError(f"ASTRA-sim exited {proc.returncode} with {len(cycles)} of "
                         f"{manifest['ranks']} NPUs finished: {tail[0][:200]}")
    return max(cycles) * 1e-9
