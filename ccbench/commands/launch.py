"""`ccbench launch [-n N] [--repeat N] [--] COLLECTIVE ...`: the embedded default launcher.

Starts N local ranks (default: one per local GPU for a GPU run, else one per usable core) with
a loopback rendezvous. Backends that need MPI run in ranks started by mpiexec; the others in
plain processes with RANK / WORLD_SIZE / LOCAL_RANK and CCBENCH_CONTROL (the control store
address). A run that mixes the two launches each group in turn (mpiexec pins every rank to one
core, which would slow gloo down), appending to the same output. A trace replay stays one launch
(its comparison of backends needs them in one run; torch backends then bootstrap from MPI).
With --repeat N the whole launch happens N times, each a run of its own
(ccbench.bench.repeats.repeat_launches)."""

from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Callable

from ccbench.errors import UsageError
from ccbench.run.supervisor import (
    LaunchPlan,
    check_mpiexec,
    check_rank_count,
    default_nprocs,
    find_mpiexec,
    launch_groups,
    run_ranks,
    with_backends,
)


class _RankCountOnce(argparse.Action):
    """`-n` before the collective is the rank count, after it nccl-tests' iteration count: a
    second one before the collective is a misplaced iteration count, not a new rank count."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        previous = getattr(namespace, self.dest)
        if previous is not None:
            raise UsageError(f"-n given twice before the benchmark ({previous} and {values}): "
                             f"before the collective -n is the rank count; put the iteration "
                             f"count after it (ccbench launch -n {previous} allreduce -n "
                             f"{values})")
        setattr(namespace, self.dest, values)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "launch", help="start N local ranks (no cluster needed)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Start N local ranks of a measurement (or of a trace replay, a diagnosis) "
                    "on this machine,\nwith a loopback rendezvous; backends that need MPI run "
                    "under the mpiexec beside python.\nWithout -O the records go to a new file "
                    "in ccbench-results/, named at the end.",
        epilog="examples:\n"
               "  ccbench launch -n 2 allreduce --backend gloo --sizes 1K-16M\n"
               "  ccbench launch -n 4 all --backend gloo,mpi -O results.jsonl\n"
               "  ccbench launch -n 2 --repeat 3 allreduce --sizes 1M\n"
               "  ccbench launch -n 2 all_reduce_perf -b 8 -e 128M -f 2\n"
               "  ccbench launch -n 2 replay traces/ --backend gloo\n"
               "the benchmark's own options: ccbench allreduce --help")
    parser.add_argument("-n", "--nprocs", type=int, default=None, action=_RankCountOnce,
                        help="number of ranks (default: the local GPUs for a GPU run, else the "
                             "cores this process may use; more ranks than that oversubscribe). "
                             "Only before the collective: after it, -n is the benchmark's "
                             "iteration count, as in nccl-tests")
    parser.add_argument("--mpiexec", default=None,
                        help="mpiexec to use for MPI backends (default: the one beside python)")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run the measurement in N separate launches (fresh processes, "
                             "each its own run id) and print the spread between them (default "
                             "1); records carry method.repeat")
    parser.add_argument("bench", nargs=argparse.REMAINDER,
                        help="the benchmark arguments: COLLECTIVE [--backend ...]")


def measuring_plan(bench: list[str], nprocs: int | None = None) -> LaunchPlan:
    """What `ccbench launch` starts for a measurement: its arguments (with the records file it
    keeps when none is named), backends (each group of those that need MPI and those that do
    not in a launch of its own), rank count (default: supervisor.default_nprocs)."""
    from ccbench.bench.output.files import new_records_file
    from ccbench.bench.runner import check_measurable
    from ccbench.cli import bench_parser, check_command_word, config_from_args

    check_command_word(bench[0])
    parsed = bench_parser().parse_args(bench)
    config = config_from_args(parsed, bench)
    if parsed.backend and parsed.backend.count(",") >= len(config.backends):
        bench = with_backends(bench, config.backends)     # each once (said above): ranks too
    nprocs = nprocs if nprocs is not None else default_nprocs(config.device)
    if config.root >= nprocs:
        raise UsageError(f"--root {config.root} is not a rank of -n {nprocs} (valid: 0 to "
                         f"{nprocs - 1})")
    check_measurable(config, nprocs)
    # a run that names no records file keeps them in a new one, chosen here (where the ranks'
    # rank 0 would choose it) so that every launch of the run appends to it
    saved = new_records_file() if config.keep_records else None
    bench = [*bench, *(("--output", saved) if saved else ("--no-output",)
                       if config.keep_records else ())]
    return LaunchPlan(argv=bench, backends=config.backends,
                      connect_timeout=config.connect_timeout, nprocs=nprocs,
                      output=saved or config.output, fmt=config.fmt, saved=saved)


def _planner(word: str) -> Callable[[list[str], int | None], LaunchPlan]:
    """The launch_plan of what the ranks run: a subcommand's own (the subcommands that run in
    ranks have one), else the measurement's."""
    from ccbench.cli import SUBCOMMANDS

    if word in SUBCOMMANDS:
        plan = getattr(importlib.import_module(f"ccbench.commands.{word}"), "launch_plan", None)
        if plan is not None:
            return lambda bench, nprocs: plan(bench[1:], nprocs)
    return measuring_plan


def main(args: argparse.Namespace) -> int:
    from ccbench.backends import check_launchable

    if args.nprocs is not None:
        check_rank_count(args.nprocs)
    bench = [a for a in args.bench if a != "--"] if args.bench[:1] == ["--"] else list(args.bench)
    if not bench:
        raise UsageError("launch needs a benchmark: ccbench launch -n 2 allreduce --backend gloo")
    if args.repeat < 1:
        raise UsageError(f"--repeat must be >= 1, got {args.repeat}")
    planner = _planner(bench[0])
    if args.repeat > 1 and planner is not measuring_plan:
        raise UsageError(f"--repeat applies to measurements, not to {bench[0]}")
    plan = planner(bench, args.nprocs)
    bench, backends, nprocs = plan.argv, plan.backends, plan.nprocs
    connect_timeout, output, fmt, saved = plan.connect_timeout, plan.output, plan.fmt, plan.saved
    by_backend = check_launchable(backends)   # fail fast here, once, not in every rank
    mpiexec = find_mpiexec(args.mpiexec) if any(by_backend.values()) or args.mpiexec else None
    if mpiexec is not None:
        check_mpiexec(mpiexec)
    groups = launch_groups(by_backend)
    if plan.one_launch or len(groups) == 1:      # a replay compares its backends in one run
        groups = [(backends, any(by_backend.values()))]

    said: list[str] = []        # the records line, once: before the error line of a failure

    def records_so_far() -> str | None:
        from ccbench.bench.output.files import records_line

        if said or not saved or not os.path.exists(saved):
            return None
        said.append(saved)
        return records_line(saved, so_far=True)

    def launch(extra_env: dict[str, str], bench: list[str]) -> int:
        for names, needs_mpi in groups:             # each group in its own launch, in turn
            status = run_ranks(nprocs, bench if len(groups) == 1 else
                               with_backends(bench, names), needs_mpi, mpiexec,
                               connect_timeout, extra_env, records_so_far)
            if status != 0:
                return status
        return 0

    if args.repeat == 1:
        status = launch({}, bench)
    else:
        from ccbench.bench.repeats import repeat_launches

        status = repeat_launches(args.repeat, launch, bench, output, fmt)
    if saved and os.path.exists(saved) and not said:
        from ccbench.bench.output.files import say_where_records_are

        say_where_records_are(saved)
    return status

