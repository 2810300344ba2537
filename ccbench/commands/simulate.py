"""`ccbench simulate model.json --ranks P --topology T COLLECTIVE --sizes ...`: predicted
time, algbw and busbw per size, analytically or by replaying the schedule on the topology.

`ccbench simulate model.json --trace TRACE --ranks P --topology T`: a recorded trace's
communication (every op in order, its process groups re-tiled onto P ranks) predicted the
same way (ccbench.model.tracesim)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from ccbench.errors import UsageError
from ccbench.formats.group_options import add_group_options
from ccbench.units import size_label

if TYPE_CHECKING:
    from ccbench.model.simulate import LinkOverrides, Simulation
    from ccbench.model.tracesim import TraceSimulation

__all__ = ["register", "main"]


def register(subparsers: argparse._SubParsersAction) -> None:
    from ccbench.collectives import COLLECTIVES

    parser = subparsers.add_parser("simulate", help="predict collective time on a topology")
    parser.add_argument("model", help="model file from `ccbench calibrate`")
    parser.add_argument("collective", nargs="?", default=None,
                        help=f"{', '.join(COLLECTIVES)}, or all (each in turn); not with "
                             f"--trace")
    parser.add_argument("--trace", nargs="+", default=None, metavar="TRACE",
                        help="predict this trace's communication instead: PyTorch execution "
                             "traces (rank<r>.json or their folder) or Chakra <prefix>.<r>.et")
    add_group_options(parser, "--trace")
    parser.add_argument("--ranks", "-p", type=int, default=None,
                        help="rank count (default: the one in --topology)")
    parser.add_argument("--topology", "-t", default="switch",
                        help="ring, fully-connected, switch, fat-tree[:leaf=L][:oversub=O][:uplink=R], "
                             "torus:XxY[xZ], hypercube, dual-plane[:gpus=8][:tor=16]; "
                             "e.g. fat-tree:1024:oversub=2 (default switch)")
    parser.add_argument("--sizes", "-s", default="1K-1G", help="bytes, as for measuring (default 1K-1G)")
    parser.add_argument("--algorithm", "-a", default=None,
                        help="cost formula / schedule (default: the fitted one); with --trace, "
                             "COLLECTIVE=FORMULA pairs, e.g. allreduce=ring,allgather=ring")
    parser.add_argument("--backend", default=None,
                        help="use the fits of this backend, library or backend/library "
                             "(mpi, 'Open MPI', 'mpi/Intel MPI')")
    parser.add_argument("--fidelity", choices=("analytical", "replay", "both"), default="analytical",
                        help="closed-form cost, a replay of the schedule on the topology's links, "
                             "or both side by side (default analytical)")
    parser.add_argument("--sharing", choices=("max-min", "equal"), default="max-min",
                        help="how concurrent transfers share a link in replay (default max-min)")
    parser.add_argument("--segments", type=int, default=1,
                        help="pipeline segments of the replayed schedule (default 1)")
    parser.add_argument("--inter-bw", type=float, default=None, help="network link GB/s (1e9 B/s)")
    parser.add_argument("--inter-alpha-us", type=float, default=None, help="network message alpha, us")
    parser.add_argument("--intra-bw", type=float, default=None, help="intra-host link GB/s")
    parser.add_argument("--intra-alpha-us", type=float, default=None, help="intra-host alpha, us")
    parser.add_argument("--hop-latency-us", type=float, default=0.0, help="per-hop latency, us")
    parser.add_argument("--format", choices=("table", "json"), default="table",
                        help="print a table or JSON (default table)")
    parser.add_argument("--output", "-o", default=None,
                        help="also append the predictions as result records (JSON lines)")
    parser.set_defaults(func=main)


def _positive(value: float | None, what: str) -> float | None:
    if value is not None and value <= 0:
        raise UsageError(f"{what} must be > 0, got {value}")
    return value


def _ranks_from_topology(spec: str) -> int:
    from ccbench.model.topology import parse_topology

    _, positional, _ = parse_topology(spec)
    if not positional:
        raise UsageError(f"--ranks is needed with --topology {spec!r}")
    ranks = 1
    for part in positional[0].lower().split("x"):
        try:
            dim = int(part)
        except ValueError:
            raise UsageError(f"malformed rank count {positional[0]!r} in --topology {spec!r} "
                             f"(examples: ring:8, torus:4x4, torus:4x4x4)") from None
        if dim < 1:
            raise UsageError(f"--topology {spec!r}: every dimension must be >= 1, got {dim} "
                             f"(examples: ring:8, torus:4x4, torus:4x4x4)")
        ranks *= dim
    if ranks < 2:
        raise UsageError(f"--topology {spec!r} has {ranks} rank; need 2 or more")
    return ranks


def _collectives(name: str) -> list[str]:
    from ccbench.collectives import COLLECTIVES, canonical_collective
    from ccbench.errors import choices_error

    if name.lower() == "all":
        return list(COLLECTIVES)
    try:
        return [canonical_collective(name)]
    except UsageError:
        raise choices_error("collective", name, (*COLLECTIVES, "all")) from None


def _print_table(out: Simulation, ranks: int, topology: str, fidelity: str) -> None:
    print(f"# {out['collective']} {out['algorithm']} on {topology}, {ranks} ranks, "
          f"{fidelity}; {out['fit_choice']}; {out['fit_scope']}")
    for flag in out["flags"]:
        print(f"# warning: {flag}")
    legend: list[str] = []
    both = fidelity == "both"
    head = ["size", "time_us", "algbw_GBps", "busbw_GBps"]
    if both:
        head += ["replay_us", "replay_busbw", "replay/analytical", "max_flows/link"]
    head.append("flags")
    rows = [head]
    for r in out["rows"]:
        line = [size_label(r["size_used"]), f"{r['time_us']:.2f}", f"{r['algbw_gbps']:.3f}",
                f"{r['busbw_gbps']:.3f}"]
        if both:
            line += [f"{r['replay_time_us']:.2f}", f"{r['replay_busbw_gbps']:.3f}",
                     f"{r['replay_vs_analytical']:.3f}", str(r["max_flows_per_link"])]
        marks = []
        for flag in r["flags"]:
            if flag not in legend:
                legend.append(flag)
            marks.append(str(legend.index(flag) + 1))
        line.append(",".join(marks) or "-")
        rows.append(line)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for row in rows:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    for i, flag in enumerate(legend, 1):
        print(f"# flag {i}: {flag}")


def _links(args: argparse.Namespace) -> LinkOverrides:
    from ccbench.model.simulate import LinkOverrides

    inter_bw = _positive(args.inter_bw, "--inter-bw")
    intra_bw = _positive(args.intra_bw, "--intra-bw")
    return LinkOverrides(
        inter_alpha=None if args.inter_alpha_us is None else args.inter_alpha_us * 1e-6,
        inter_beta=None if inter_bw is None else 1.0 / (inter_bw * 1e9),
        intra_alpha=None if args.intra_alpha_us is None else args.intra_alpha_us * 1e-6,
        intra_beta=None if intra_bw is None else 1.0 / (intra_bw * 1e9),
        hop_latency=args.hop_latency_us * 1e-6)


def _print_trace(out: TraceSimulation) -> None:
    print(f"# trace {out['trace']} ({out['kind']}, recorded at {out['recorded_world_size']} "
          f"ranks) on {out['topology']}, {out['world_size']} ranks, {out['fidelity']}")
    for coll, fit in out["fits"].items():
        print(f"# {coll}: {fit['algorithm']}; {fit['fit_choice']}; {fit['fit_scope']}")
    legend: list[str] = []
    head = ["#", "node", "collective", "dtype", "size", "group", "algorithm", "time_us",
            "busbw_GBps", "flags"]
    rows = [head]
    for r in out["ops"]:
        if r["group_shape"] == "world":
            group = f"world({r['group_size']})"
        elif r["group_shape"] == "tile":
            group = f"{r['group_copies']}x{r['group_size']} consecutive"
        else:
            group = f"{r['group_copies']}x{r['group_size']} stride {r['group_stride']}"
        marks = []
        for flag in r["flags"]:
            if flag not in legend:
                legend.append(flag)
            marks.append(str(legend.index(flag) + 1))
        bw = r["busbw_gbps"]
        rows.append([str(r["index"]), str(r["node_id"]), r["collective"], r["dtype"],
                     size_label(r["size"]), group, r["algorithm"], f"{r['time_us']:.2f}",
                     f"{bw:.3f}" if bw == bw else "-", ",".join(marks) or "-"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for row in rows:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    for i, flag in enumerate(legend, 1):
        print(f"# flag {i}: {flag}")
    world, recorded = out["world_size"], out["recorded_world_size"]
    per_rank = ", ".join(f"{r}: {t:.1f}" for r, t in out["per_rank_us"].items())
    print(f"# communication per rank (us; rank q runs recorded rank q mod {recorded}): "
          f"{per_rank}")
    print(f"# total {out['total_us']:.1f} us (slowest: recorded rank {out['slowest_rank']}, "
          f"ops back to back) at {world} ranks on {out['topology']}")
    for coll, entry in sorted(out["by_collective"].items(), key=lambda kv: -kv[1]["time_us"]):
        share = entry["time_us"] / out["total_us"] if out["total_us"] else 0.0
        print(f"#   {coll}: {entry['ops']} ops, {size_label(entry['bytes'])}, "
              f"{entry['time_us']:.1f} us ({share:.0%})")
    for skip in out["not_modelled"]:
        print(f"# not modelled ({skip['recorded_ops']} recorded ops): {skip['reason']}")
    other = out.get("other_reading")
    if other is not None:
        low, high = sorted((out["total_us"], other["total_us"]))
        rest = out["uncertain_calls"] - out["uncertain_priced_calls"]
        print(f"# uncertain: {out['uncertain_calls']} calls' process groups are ambiguous "
              f"({out['uncertain_priced_calls']} priced, on the {out['uncertain_rows']} rows "
              f"flagged 'group uncertain'{f'; {rest} not modelled' if rest else ''}); "
              f"read as above (a call every rank makes alike on the world): total "
              f"{out['total_us']:.1f} us; with them on the smallest groups that fit: "
              f"{other['total_us']:.1f} us ({other['ops']} ops). The prediction lies in "
              f"{low:.1f}-{high:.1f} us; settle them with --group or a capture file")
    for note in out["notes"]:
        print(f"# note: {note}")
    for warning in out["warnings"]:
        print(f"ccbench: warning: {warning}", file=sys.stderr)


def _main_trace(args: argparse.Namespace) -> int:
    from ccbench.formats import load_trace
    from ccbench.formats.group_options import group_settings
    from ccbench.model.modelfile import load_model
    from ccbench.model.progress import StderrProgress
    from ccbench.model.tracesim import parse_algorithms, simulate_trace

    if args.collective is not None:
        raise UsageError(f"give a collective or --trace, not both (got {args.collective!r})")
    if args.fidelity == "both":
        raise UsageError("--fidelity both is for one collective; with --trace use analytical "
                         "or replay")
    if args.segments != 1 or args.sizes != "1K-1G" or args.output:
        raise UsageError("--segments, --sizes and --output are for one collective; with "
                         "--trace each op is priced at its own size")
    model = load_model(args.model)
    trace = load_trace(args.trace, group_settings=group_settings(args))
    ranks = args.ranks if args.ranks is not None else _ranks_from_topology(args.topology)
    progress = StderrProgress()
    try:
        out = simulate_trace(model, trace, ranks, args.topology, args.fidelity, args.sharing,
                             args.backend, _links(args), progress=progress,
                             algorithms=parse_algorithms(args.algorithm or ""))
    finally:
        progress.close()
    if args.format == "json":
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        _print_trace(out)
    return 0


def main(args: argparse.Namespace) -> int:
    from ccbench.model.modelfile import load_model
    from ccbench.model.simulate import simulate
    from ccbench.units import parse_sizes

    if args.trace:
        return _main_trace(args)
    if args.group or args.groups_file:
        raise UsageError("--group and --groups-file settle a trace's process groups: give "
                         "--trace")
    if args.collective is None:
        raise UsageError("give a collective (or all), or --trace TRACE")
    collectives = _collectives(args.collective)
    sizes = parse_sizes(args.sizes)
    if args.output:
        from ccbench.bench.output.files import check_output_file

        check_output_file(args.output)            # as launch's -O: records files only
    model = load_model(args.model)
    ranks = args.ranks if args.ranks is not None else _ranks_from_topology(args.topology)
    links = _links(args)
    if args.algorithm and len(collectives) > 1:
        raise UsageError("--algorithm names one collective's formula; give one collective "
                         "instead of all")
    from ccbench.model.progress import StderrProgress

    outs = []
    progress = StderrProgress()
    try:
        for collective in collectives:
            outs.append(simulate(model, collective, ranks, args.topology, sizes, args.algorithm,
                                 args.fidelity, args.sharing, args.backend, links, args.segments,
                                 progress=progress))
    finally:
        progress.close()
    if args.output:
        from ccbench.model.simulate import prediction_records
        from ccbench.records import append_record
        from ccbench.records.table import finish_parquet, journal_path
        from ccbench.safeio import output_error

        for out in outs:
            for rec in prediction_records(out):
                try:
                    append_record(journal_path(args.output), rec)
                except OSError as exc:
                    raise output_error(exc, args.output, "append to") from None
        finish_parquet(args.output)                     # a .parquet output: folded in now
    if args.format == "json":
        json.dump(outs[0] if len(outs) == 1 else {"predictions": outs}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    for i, out in enumerate(outs):
        if i:
            print()
        _print_table(out, ranks, args.topology, args.fidelity)
    return 0
