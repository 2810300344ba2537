"""ASTRA-sim v2 analytical-backend inputs from a calibrated model, and Chakra workloads.

Units, minded on the way out:

* network `bandwidth` is written in the unit ASTRA-sim reads: it says GB/s but converts
  with 2^30 (GiB/s), so the value is (bytes per second) / 2^30, where ccbench's own
  GB/s are 1e9 bytes per second. 10 GB/s (ccbench) -> 9.313 in the YAML.
* `latency` is ns per hop; ASTRA-sim charges hops x latency + bytes / bandwidth per
  message, hops 1 for Ring neighbours and FullyConnected, 2 for Switch. The fitted
  alpha is one message's end-to-end cost, so latency = alpha / hops of the dimension.
* `local-mem-bw` comes from gamma the same way as the bandwidth (1 / gamma bytes per
  second, / 2^30); endpoint-delay is left 0 because alpha is already in the latency.
* Chakra comm_size: all-gather takes the per-rank shard (S / p), allreduce,
  reduce-scatter and all-to-all the whole buffer S.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ccbench.collectives import layout
from ccbench.errors import UsageError
from ccbench.model.chakra import comm_coll_node, write_trace
from ccbench.model.costs import predict_time
from ccbench.model.modelfile import matches, select_fit
from ccbench.model.topology import LinkClass, build_topology

__all__ = ["GIB", "astra_bandwidth", "astra_comm_size", "export_astra", "network_yaml",
           "system_json", "IMPLEMENTATION"]

GIB = float(1 << 30)
HOPS = {"Ring": 1, "FullyConnected": 1, "Switch": 2}

# fitted formula -> ASTRA-sim collective implementation
IMPLEMENTATION = {"ring": "ring", "double-binary-tree": "doubleBinaryTree",
                  "tree": "doubleBinaryTree", "recursive-doubling": "halvingDoubling",
                  "recursive-halving": "halvingDoubling", "rabenseifner": "halvingDoubling",
                  "bruck": "halvingDoubling", "pairwise": "direct"}
_ASTRA_KEYS = {"allreduce": "all-reduce-implementation",
               "reduce-scatter": "reduce-scatter-implementation",
               "allgather": "all-gather-implementation", "alltoall": "all-to-all-implementation"}


def astra_bandwidth(beta: float) -> float:
    """The YAML bandwidth for a link of beta seconds per byte (ASTRA-sim reads GiB/s)."""
    if beta <= 0:
        raise UsageError("beta is 0: the fit has no bandwidth term to export")
    return (1.0 / beta) / GIB


def astra_comm_size(collective: str, size: int, p: int) -> int:
    """Chakra comm_size for the nccl-tests size S: all-gather wants the per-rank shard."""
    used = layout(collective, size, 1, p).size_used or size
    return used // p if collective == "allgather" else used


def _fmt_list(values: Sequence[Any]) -> str:
    return "[ " + ", ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in values) + " ]"


def network_yaml(dims: Sequence[dict[str, Any]]) -> str:
    lines = ["# ASTRA-sim analytical network, written by ccbench export astra-sim",
             "# bandwidth in GB/s as ASTRA-sim reads it (x 2^30 bytes/s); latency ns per hop",
             f"topology: {_fmt_list([d['topology'] for d in dims])}",
             f"npus_count: {_fmt_list([d['npus'] for d in dims])}",
             f"bandwidth: {_fmt_list([d['bandwidth'] for d in dims])}",
             f"latency: {_fmt_list([d['latency_ns'] for d in dims])}"]
    return "\n".join(lines) + "\n"


def _dims(topology: str, ranks: int, alpha: float, beta: float,
          intra: LinkClass | None) -> list[dict[str, Any]]:
    inter = LinkClass(alpha, beta)
    topo = build_topology(topology, ranks, inter, intra)
    dims = []
    for index, (kind, npus) in enumerate(topo.dims):
        a, b = alpha, beta
        if topo.kind == "dual-plane" and index == 0:
            a, b = (intra or inter).alpha, (intra or inter).beta
        elif topo.kind == "dual-plane":
            b = beta / 2            # two NIC ports, one per plane
        elif topo.kind == "fat-tree" and index == 1:
            b = beta * float(topo.params["oversub"])
        dims.append({"topology": kind, "npus": npus, "bandwidth": astra_bandwidth(b),
                     "latency_ns": a * 1e9 / HOPS[kind], "beta_s_per_byte": b, "alpha_s": a})
    return dims


def system_json(model: dict[str, Any], ranks: int, ndims: int,
                backend: str | None = None) -> tuple[dict[str, Any], list[str]]:
    notes = []
    sysconf: dict[str, Any] = {"scheduling-policy": "LIFO", "endpoint-delay": 0,
                               "active-chunks-per-dimension": 1, "preferred-dataset-splits": 1}
    gamma = 0.0
    for coll, key in _ASTRA_KEYS.items():
        fits = [f for f in model["fits"] if f["collective"] == coll
                and matches(f, backend)]
        if fits:
            fit, _ = select_fit(model, coll, ranks, backend)
            impl = IMPLEMENTATION[fit["model_algorithm"]]
            notes.append(f"{key}: {impl} (fitted {coll} formula {fit['model_algorithm']})")
            if coll in ("allreduce", "reduce-scatter") and fit["gamma"] > 0:
                gamma = max(gamma, fit["gamma"])
        else:
            impl = "direct" if coll == "alltoall" else "ring"
            notes.append(f"{key}: {impl} (no {coll} fit; default)")
        sysconf[key] = [impl] * ndims
    sysconf["collective-optimization"] = "localBWAware"
    if gamma > 0:
        sysconf["local-mem-bw"] = round((1.0 / gamma) / GIB, 6)
        notes.append(f"local-mem-bw from gamma {gamma:.3e} s/B")
    else:
        sysconf["local-mem-bw"] = 1600
        notes.append("local-mem-bw: 1600 (no gamma fitted; ASTRA-sim example value)")
    sysconf["boost-mode"] = 0
    return sysconf, notes


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def export_astra(model: dict[str, Any], out_dir: str | os.PathLike[str], ranks: int,
                 topology: str | None = None, collective: str | None = None,
                 sizes: Sequence[int] = (), backend: str | None = None,
                 prefix: str = "workload", intra_beta: float | None = None,
                 intra_alpha: float | None = None) -> dict[str, Any]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    coll_for_links = collective or "allgather"
    fit, why = select_fit(model, coll_for_links, ranks, backend)
    alpha, beta = fit["alpha"], fit["beta"]
    intra = None
    if intra_beta is not None or intra_alpha is not None:
        intra = LinkClass(intra_alpha if intra_alpha is not None else alpha,
                          intra_beta if intra_beta is not None else beta)
    topology = topology or f"switch:{ranks}"
    dims = _dims(topology, ranks, alpha, beta, intra)
    (out / "network.yml").write_text(network_yaml(dims), encoding="utf-8")
    sysconf, notes = system_json(model, ranks, len(dims), backend)
    (out / "system.json").write_text(json.dumps(sysconf, indent=2) + "\n", encoding="utf-8")
    (out / "remote_memory.json").write_text(
        json.dumps({"memory-type": "NO_MEMORY_EXPANSION"}, indent=2) + "\n", encoding="utf-8")
    manifest: dict[str, Any] = {
        "ranks": ranks, "topology": topology, "link_fit": why,
        "alpha_s": alpha, "beta_s_per_byte": beta, "dims": dims, "system_notes": notes,
        "units": "network.yml bandwidth = bytes/s / 2^30 (ASTRA-sim reads GB/s as GiB/s); "
                 "latency ns per hop = alpha / hops (Switch 2, Ring 1, FullyConnected 1)",
    }
    if collective:
        if collective not in _ASTRA_KEYS:
            raise UsageError(f"ASTRA-sim has no {collective} implementation "
                             f"(valid: {', '.join(_ASTRA_KEYS)})")
        if not sizes:
            raise UsageError("--collective needs --sizes")
        cfit, _ = select_fit(model, collective, ranks, backend)
        nodes = []
        expected = []
        for i, size in enumerate(sizes):
            comm = astra_comm_size(collective, size, ranks)
            nodes.append(comm_coll_node(i, f"{collective}_{size}", collective, comm,
                                        deps=[i - 1] if i else [],
                                        involved_dim=[True] * len(dims)))
            used = layout(collective, size, 1, ranks).size_used or size
            algo = cfit["model_algorithm"] if cfit["collective"] == collective else "ring"
            t = predict_time(collective, algo if collective == cfit["collective"] else
                             {"alltoall": "pairwise"}.get(collective, "ring"), ranks, used,
                             cfit["alpha"], cfit["beta"], cfit["gamma"])
            expected.append({"size": size, "comm_size": comm, "ccbench_analytical_us": t * 1e6})
        for rank in range(ranks):
            write_trace(out / f"{_safe(prefix)}.{rank}.et", nodes,
                        metadata={"source": "ccbench export astra-sim"})
        manifest["workload"] = {"prefix": str(out / _safe(prefix)), "collective": collective,
                                "nodes": expected,
                                "comm_size_rule": "all-gather: per-rank shard; "
                                                  "others: whole buffer"}
        manifest["run"] = (f"AstraSim_Analytical_Congestion_Unaware "
                           f"--workload-configuration={out / _safe(prefix)} "
                           f"--system-configuration={out / 'system.json'} "
                           f"--network-configuration={out / 'network.yml'} "
                           f"--remote-memory-configuration={out / 'remote_memory.json'}")
    (out / "ccbench-export.json").write_text(json.dumps(manifest, indent=1) + "\n",
                                             encoding="utf-8")
    return manifest


def export_measured(records: Sequence[Any], out_dir: str | os.PathLike[str]) -> list[str]:
    """One Chakra trace per measured case (run id + case), one COMM_COLL node per timed
    iteration with its duration; each rank's file is the same sequence (the samples are
    the max over ranks). Returns the prefixes written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    groups: dict[Any, list[Any]] = {}
    for r in records:
        if r.collective not in ("allreduce", "allgather", "reduce-scatter", "broadcast",
                                "alltoall"):
            continue
        groups.setdefault(r.case, []).append(r)     # one run's case: CaseId holds the run id
    prefixes = []
    for _key, recs in sorted(groups.items(), key=lambda kv: repr(kv[0])):
        recs.sort(key=lambda r: r.size_used)
        first = recs[0]
        prefix = _safe(f"{first.run_id}_{first.collective}_{first.backend}_{first.algorithm}_"
                       f"{first.dtype}_{'in' if first.inplace else 'out'}_p{first.world_size}")
        nodes: list[Any] = []
        start = 0.0
        for r in recs:
            samples = r.samples_us or [r.time_us["median"]]
            comm = (r.size_used // r.world_size) if r.collective == "allgather" else r.size_used
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
        raise UsageError("no measured collectives to export")
    return prefixes
