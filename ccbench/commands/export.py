"""`ccbench export astra-sim model.json -o DIR` and `ccbench export chakra RESULTS -o DIR`.

astra-sim: ASTRA-sim analytical network YAML, system JSON, remote-memory JSON and, with
--collective/--sizes, Chakra ET workload files <prefix>.<rank>.et (one COMM_COLL node per
size); with --trace, a recorded trace's communication at --ranks NPUs (ccbench.formats.astra_trace)
with its communicator groups. chakra: a measured run as Chakra traces, one COMM_COLL node per
timed iteration.
"""

from __future__ import annotations

import argparse
import os

from ccbench.errors import UsageError
from ccbench.formats.group_options import add_group_options

__all__ = ["register", "main"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("export", help="ASTRA-sim configs and Chakra traces")
    sub = parser.add_subparsers(dest="export_kind", metavar="{astra-sim,chakra}")
    sub.required = True
    astra = sub.add_parser("astra-sim", help="ASTRA-sim network/system configs (+ Chakra workload)")
    astra.add_argument("model", help="model file from `ccbench calibrate`")
    astra.add_argument("-o", "--output", required=True, help="output folder")
    astra.add_argument("--ranks", "-p", type=int, default=8, help="NPUs (default 8)")
    astra.add_argument("--topology", "-t", default=None,
                       help="as for simulate (default switch:RANKS); its dimensions become "
                            "the YAML's")
    astra.add_argument("--collective", default=None, help="write a Chakra workload of this collective")
    astra.add_argument("--trace", nargs="+", default=None, metavar="TRACE",
                       help="write the Chakra workload of this trace's communication (as "
                            "simulate --trace predicts it at --ranks), with comm groups")
    add_group_options(astra, "--trace")
    astra.add_argument("--sizes", "-s", default=None, help="sizes of the workload's nodes")
    astra.add_argument("--backend", default=None,
                        help="use the fits of this backend, library or backend/library "
                             "(mpi, 'Open MPI', 'mpi/Intel MPI')")
    astra.add_argument("--algorithm", "-a", default=None,
                       help="cost formula, as for simulate (default: the fitted one); "
                            "hierarchical-ring for a multi-dimensional topology; with --trace "
                            "COLLECTIVE=FORMULA pairs (allreduce=ring,allgather=ring)")
    astra.add_argument("--prefix", default="workload", help="Chakra file prefix (default workload)")
    astra.add_argument("--inter-bw", type=float, default=None,
                       help="with --trace: network link GB/s for every op (as simulate's)")
    astra.add_argument("--inter-alpha-us", type=float, default=None,
                       help="with --trace: network message alpha, us, for every op")
    astra.add_argument("--intra-bw", type=float, default=None,
                       help="intra-host GB/s for dual-plane's first dimension")
    chakra = sub.add_parser("chakra", help="measured records as Chakra traces")
    chakra.add_argument("results", nargs="+", help="results files or folders")
    chakra.add_argument("-o", "--output", required=True, help="output folder")
    parser.set_defaults(func=main)


def _trace(args: argparse.Namespace) -> int:
    from ccbench.formats import load_trace
    from ccbench.formats.astra_trace import export_astra_trace, trace_export_lines
    from ccbench.formats.group_options import group_settings
    from ccbench.model.modelfile import load_model
    from ccbench.model.simulate import LinkOverrides
    from ccbench.model.tracesim import parse_algorithms

    if args.collective or args.sizes:
        raise UsageError("--collective and --sizes are for a one-collective workload; with "
                         "--trace each op is exported at its own size")
    for name in ("inter_bw", "inter_alpha_us"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got {value}")
    links = LinkOverrides(
        inter_alpha=None if args.inter_alpha_us is None else args.inter_alpha_us * 1e-6,
        inter_beta=None if args.inter_bw is None else 1 / (args.inter_bw * 1e9),
        intra_beta=None if args.intra_bw is None else 1 / (args.intra_bw * 1e9))
    trace = load_trace(args.trace, group_settings=group_settings(args))
    manifest = export_astra_trace(load_model(args.model), trace, args.output,
                                  args.ranks, args.topology, args.backend, args.prefix, links,
                                  parse_algorithms(args.algorithm or ""))
    for line in trace_export_lines(manifest):
        print(line)
    return 0


def main(args: argparse.Namespace) -> int:
    if args.export_kind == "astra-sim":
        from ccbench.collectives import canonical_collective
        from ccbench.formats.astra import export_astra
        from ccbench.model.modelfile import load_model
        from ccbench.units import parse_sizes

        if args.ranks < 2:
            raise UsageError(f"--ranks must be >= 2, got {args.ranks}")
        if args.intra_bw is not None and args.intra_bw <= 0:
            raise UsageError(f"--intra-bw must be > 0, got {args.intra_bw}")
        if args.trace:
            return _trace(args)
        if args.group or args.groups_file:
            raise UsageError("--group and --groups-file settle a trace's process groups: give "
                             "--trace")
        if args.inter_bw is not None or args.inter_alpha_us is not None:
            raise UsageError("--inter-bw and --inter-alpha-us are for --trace exports")
        collective = canonical_collective(args.collective) if args.collective else None
        sizes = parse_sizes(args.sizes) if args.sizes else []
        if sizes and not collective:
            raise UsageError("--sizes needs --collective")
        manifest = export_astra(load_model(args.model), args.output, args.ranks, args.topology,
                                collective, sizes, args.backend, args.prefix,
                                None if args.intra_bw is None else 1 / (args.intra_bw * 1e9),
                                algorithm=args.algorithm)
        print(f"wrote {os.path.join(args.output, 'network.yml')}, system.json, remote_memory.json"
              + (f", {args.ranks} Chakra files {manifest['workload']['prefix']}.<rank>.et"
                 if collective else ""))
        for d in manifest["dims"]:
            print(f"  {d['topology']}({d['npus']}): bandwidth {d['bandwidth']:.4g} (GiB/s as "
                  f"ASTRA-sim reads it = {1e-9 / d['beta_s_per_byte']:.4g} GB/s), "
                  f"latency {d['latency_ns']:.4g} ns/hop")
        for note in manifest["system_notes"]:
            print(f"  {note}")
        if collective:
            print(f"  run: {manifest['run']}")
        return 0
    if args.export_kind == "chakra":
        from ccbench.formats.astra import export_measured
        from ccbench.records import load_records

        records = load_records(*args.results, require=True)
        skipped: dict[str, str] = {}
        prefixes = export_measured(records, args.output, skipped)
        for p in prefixes:
            print(f"wrote {p}.<rank>.et")
        for collective, why in skipped.items():
            print(f"skipped {collective}: {why}")
        return 0
    raise UsageError(f"unknown export {args.export_kind!r} (valid: astra-sim, chakra)")
