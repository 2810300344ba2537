"""`ccbench replay TRACE...`: a training job's communication, measured on any backend.

Started like the benchmark, one process per rank of the trace:

    ccbench launch -n 4 replay traces/groups --backend gloo,mpi
    torchrun --nproc-per-node 4 -m ccbench replay traces/groups
    mpiexec -n 4 python -m ccbench replay traces/groups --backend mpi,ring@mpi
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from ccbench.backends import HOST_BACKEND, backend_names
from ccbench.bench.options import add_options, check_flags, connect_timeout, method_from
from ccbench.errors import UsageError

if TYPE_CHECKING:
    from ccbench.replay.rank import BackendReplay, ReplayMeta
    from ccbench.run.supervisor import LaunchPlan
    from ccbench.trace.summary import TraceSummary
from ccbench.formats.group_options import add_group_options

__all__ = ["register", "main", "launch_plan"]


#: the benchmark's options that replay takes too (bench/options.py declares them) ...
SHARED_OPTIONS = ("iters", "warmup", "check", "timeout")
#: ... and replay's own defaults for them
REPLAY_DEFAULTS = {"iters": 5, "warmup": 1}


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("traces", nargs="+",
                        help="PyTorch execution traces (rank<r>.json, one per rank, or their "
                             "folder) or Chakra traces (<prefix>.<r>.et[.gz])")
    parser.add_argument("--backend", "-B", default=HOST_BACKEND,
                        help=f"comma list: {', '.join(backend_names())}, "
                             f"<algorithm>@<transport> (default {HOST_BACKEND})")
    # the benchmark's options, applied to each call of the trace (fewer iterations by default:
    # a trace has many calls)
    add_options(parser, SHARED_OPTIONS, defaults=REPLAY_DEFAULTS)
    parser.add_argument("--sequence", choices=("back-to-back", "gaps", "none"),
                        default="back-to-back",
                        help="also time the whole op sequence: back to back, with the trace's "
                             "gaps between ops as sleeps, or not (default back-to-back)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="passes over the sequence (default 3)")
    parser.add_argument("--world-size", type=int, default=None,
                        help="replay at this many ranks (data-parallel sizes kept per rank, "
                             "groups re-tiled)")
    add_group_options(parser)
    parser.add_argument("--output", "-O", default=None,
                        help="append one record per measured call to this file (JSON lines)")
    parser.add_argument("--summary", default=None, help="write the per-trace summary (JSON)")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no progress bar or status line (results still print)")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("replay", help="replay a trace's communication")
    _arguments(parser)
    parser.set_defaults(func=main)


def _validate(args: argparse.Namespace) -> tuple[list[str], Any]:
    from ccbench.backends import parse_backends
    check_flags({name: getattr(args, name) for name in SHARED_OPTIONS})
    if args.repeat < 1:
        raise UsageError(f"--repeat must be >= 1, got {args.repeat}")
    if args.world_size is not None and args.world_size < 1:
        raise UsageError(f"--world-size must be >= 1, got {args.world_size}")
    backends = parse_backends(args.backend)
    if not backends:
        raise UsageError("empty --backend")
    method = method_from(vars(args))
    return backends, method


def launch_plan(argv: list[str], nprocs: int | None = None) -> LaunchPlan:
    """What `ccbench launch` starts for `ccbench replay ARGV`: one launch of every backend (a
    replay compares them in one run) on the trace's ranks unless -n says otherwise."""
    from ccbench.cli import OneLineParser
    from ccbench.run.supervisor import LaunchPlan

    parser = OneLineParser(prog="ccbench replay")
    _arguments(parser)
    args = parser.parse_args(argv)
    backends, method = _validate(args)
    from ccbench.formats.load import rank_files

    # bad traces: refused once, before any rank starts; so is one that cannot be held by
    # the launcher and each of the ranks, which all read it
    ranks = args.world_size or len(rank_files(args.traces)[1])
    trace = _load(args, readers=1 + ranks)
    return LaunchPlan(argv=["replay", *argv], backends=backends,
                      connect_timeout=connect_timeout(method.timeout),
                      nprocs=trace.world_size if nprocs is None else nprocs, one_launch=True)


def _load(args: argparse.Namespace, readers: int = 1) -> Any:
    from ccbench.formats import load_trace
    from ccbench.formats.group_options import group_settings
    from ccbench.formats.load import require_communication

    trace = load_trace(args.traces, readers, group_settings(args))
    require_communication(trace)
    if args.world_size is not None and args.world_size != trace.world_size:
        from ccbench.trace.scale import rescale

        trace = rescale(trace, args.world_size)
    if args.sequence == "gaps" and not trace.has_timings:
        raise UsageError(f"--sequence gaps: {trace.paths[0]} has no op timings (PyTorch "
                         f"execution traces carry none; Chakra traces do)")
    return trace


def _uncertain(summary: TraceSummary, results: list[Any]) -> None:
    """The calls whose process group the trace leaves open (ccbench.trace.groups.
    ambiguous_calls: the count the trace's note gives) and how much of the measured sum
    they are (what a wrong reading of them can move), said in a line and in the summary."""
    calls = [r for r in results if r.group_source == "ambiguous"]
    times = [r.time_us for r in calls if r.time_us is not None]
    summary["uncertain_calls"], summary["uncertain_time_us"] = len(calls), sum(times)
    total = summary.get("total_time_us") or 0.0
    if calls:
        share = f" ({sum(times) / total:.0%})" if total else ""
        print(f"#   uncertain: {len(calls)} calls' process groups are ambiguous (read as "
              f"world calls where every rank makes them alike): {len(times)} of them "
              f"measured, {sum(times):.1f} of the {total:.1f} us{share}; settle them with "
              f"--group or a capture file")


def _as_issued(summary: TraceSummary, results: list[Any]) -> None:
    """Each call issued once, as the job issued it (ccbench.replay.rank.as_issued), against
    the job's own time read the same way: a line and summary["fidelity_as_issued"]."""
    import dataclasses

    from ccbench.trace.summary import fidelity

    issued = [dataclasses.replace(r, time_us=r.extra["as_issued_us"]) for r in results
              if r.time_us is not None and r.extra.get("as_issued_us") is not None]
    fit = fidelity(issued)
    summary["as_issued_time_us"] = sum(r.time_us for r in issued) if issued else None
    summary["fidelity_as_issued"] = fit
    if fit:
        print(f"#   issued once as the job did / the job's own time, {fit['calls']} calls: "
              f"median per call {fit['median_ratio']:.2f} (10-90 %: {fit['p10_ratio']:.2f}-"
              f"{fit['p90_ratio']:.2f}), whole window {fit['window_ratio']:.2f}")


def _report(config: Any, collected: list[BackendReplay]) -> None:
    from ccbench.trace.summary import (
        format_summary,
        sequence_median,
        speedups,
        summarize_results,
    )

    trace = config.trace
    out: dict[str, Any] = {"trace": trace.paths, "kind": trace.kind, "schema": trace.schema,
                           "world_size": trace.world_size, "notes": trace.notes, "backends": []}
    print(f"# trace {trace.paths[0]}{' ...' if len(trace.paths) > 1 else ''}: {trace.kind} "
          f"{trace.schema}, {trace.world_size} ranks, "
          f"{1 + max((op.call for op in trace.all_ops()), default=-1)} calls")
    for note in trace.notes:
        print(f"# note: {note}")
    for warning in trace.warnings:
        print(f"ccbench: warning: {warning}", file=sys.stderr)
    out["warnings"] = list(trace.warnings)
    per_call: dict[str, dict[int, float]] = {}
    for item in collected:
        meta: ReplayMeta | dict[str, str] = item["meta"] or {}
        summary = summarize_results(item["results"])
        summary["sequence_us"] = item["sequence_us"]
        summary["sequence_median_us"] = sequence_median(item["sequence_us"])
        name = f"{meta.get('backend')} ({meta.get('library')} {meta.get('library_version')})"
        for line in format_summary(name, summary):
            print(line)
        _as_issued(summary, item["results"])
        if summary["sequence_median_us"] is not None:
            print(f"#   whole sequence ({config.sequence}), measured: median of "
                  f"{len(item['sequence_us'] or [])} passes, each the slowest rank's: "
                  f"{summary['sequence_median_us']:.1f} us")
        _uncertain(summary, item["results"])
        per_call[str(meta.get("backend"))] = {r.call: r.time_us for r in item["results"]
                                               if r.time_us is not None}
        out["backends"].append({**meta, "summary": summary,
                                "ops": [r.to_dict() for r in item["results"]]})
    ratios = speedups(per_call)
    out["speedups"] = [entry.to_dict() for entry in ratios]
    for entry in ratios:
        print(f"# {entry.line()}")
    if len(per_call) > 1 and not ratios:
        print("# no speed-up: no call was measured by every backend")
    if config.summary:
        with open(config.summary, "w", encoding="utf-8") as handle:
            json.dump(out, handle, indent=1)


def main(args: argparse.Namespace) -> int:
    from ccbench.replay.rank import ReplayConfig, replay_rank

    backends, method = _validate(args)
    trace = _load(args)
    config = ReplayConfig(trace=trace, backends=backends, method=method, sequence=args.sequence,
                          repeat=args.repeat, output=args.output, summary=args.summary,
                          quiet=args.quiet, argv=["replay", *sys.argv[1:]])
    status, collected = replay_rank(config)
    if collected is not None:
        _report(config, collected)
    return status
