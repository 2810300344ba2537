"""`ccbench sweep FILE [--slurm ...]`, `ccbench sweep status FILE`.

    ccbench sweep slurm/sweeps/calibration.yaml                 # run here, `ccbench launch` per case
    ccbench sweep FILE --slurm --partition gpu --max-parallel 4 # one job array per world shape
    ccbench sweep FILE --slurm --dry-run                        # print the sbatch scripts only
    ccbench sweep FILE --slurm --wait                           # submit, wait, report
    ccbench sweep status FILE                                   # done / running / pending cases

Rerunning any of them measures only the (case, size) pairs that no results file holds yet.
`ccbench sweep run-task PLAN --task I` is what each array task runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ccbench.errors import RunFailure, UsageError

if TYPE_CHECKING:
    from ccbench.sweep import Sweep

ACTIONS = ("status", "run-task")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sweep", help="run a sweep file locally or as a Slurm job array",
        description="Run a sweep file (YAML) locally, or render and submit a Slurm job array. "
                    "`ccbench sweep status FILE` shows done / running / pending cases.")
    parser.add_argument("words", nargs="+", metavar="FILE",
                        help="the sweep file; or `status FILE`")
    parser.add_argument("--slurm", action="store_true", help="submit a Slurm job array")
    parser.add_argument("--partition", "-p", default=None, help="Slurm partition (sbatch -p)")
    parser.add_argument("--account", "-A", default=None, help="Slurm account (sbatch -A)")
    parser.add_argument("--time", "-t", default=None, help="Slurm time limit per array task")
    parser.add_argument("--gpus-per-node", type=int, default=None,
                        help="GPUs each node of a task asks Slurm for")
    parser.add_argument("--cpus-per-task", type=int, default=None,
                        help="CPUs each rank asks Slurm for")
    parser.add_argument("--max-parallel", type=int, default=None,
                        help="array tasks running at once per array (sbatch --array ...%%K)")
    parser.add_argument("--dry-run", action="store_true", help="print the sbatch scripts only")
    parser.add_argument("--wait", action="store_true", help="wait for the jobs, then report")
    parser.add_argument("--wait-timeout", type=float, default=86400.0,
                        help="seconds --wait waits (default 86400)")
    parser.add_argument("--task", type=int, default=None, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    words = list(args.words)
    if words[0] in ACTIONS:
        if len(words) != 2:
            raise UsageError(f"usage: ccbench sweep {words[0]} FILE")
        action, path = words
    else:
        if len(words) != 1:
            raise UsageError(f"one sweep file expected, got {' '.join(words)} "
                             f"(actions: {', '.join(ACTIONS)})")
        action, path = "run", words[0]
    from ccbench.sweep import load_sweep

    sweep = load_sweep(path)
    if action == "status":
        _status(sweep)
        return 0
    if action == "run-task":
        from ccbench.sweep import run_task

        if args.task is None:
            raise UsageError("sweep run-task needs --task ID")
        return run_task(sweep, args.task, "slurm")
    if not args.slurm:
        for flag in ("partition", "account", "time", "gpus_per_node", "cpus_per_task",
                     "max_parallel"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag.replace('_', '-')} needs --slurm")
        if args.dry_run or args.wait:
            raise UsageError("--dry-run and --wait need --slurm")
        from ccbench.sweep import run_local

        status = run_local(sweep)
        _status(sweep)
        return status
    return _slurm(sweep, args)


def _slurm(sweep: Sweep, args: argparse.Namespace) -> int:
    from ccbench.sweep.slurm import SlurmOptions, submit, wait_for_jobs
    from ccbench.sweep.spec import _Checker, check_slurm_options

    overrides = check_slurm_options(_Checker("command line"), {
        "partition": args.partition, "account": args.account, "time": args.time,
        "gpus_per_node": args.gpus_per_node, "cpus_per_task": args.cpus_per_task,
        "max_parallel": args.max_parallel})
    options = SlurmOptions.merged(sweep.slurm, overrides)
    jobs = submit(sweep, options, dry_run=args.dry_run)
    if args.dry_run or not args.wait:
        return 0
    if args.wait_timeout <= 0:
        raise UsageError(f"--wait-timeout must be > 0, got {args.wait_timeout:g}")
    if jobs:
        wait_for_jobs(sweep, args.wait_timeout)
    pending = _status(sweep)
    if pending:
        print(f"ccbench sweep {sweep.name}: {pending} cases incomplete; logs in "
              f"{sweep.results_dir / 'logs'}", file=sys.stderr)
        return 1
    return 0


def _status(sweep: Sweep) -> int:
    """Print the table; returns the number of incomplete cases."""
    from ccbench.sweep import result_files
    from ccbench.sweep.slurm import squeue_tasks, sweep_status

    try:
        queued = squeue_tasks(sweep)
    except (UsageError, RunFailure) as exc:   # squeue trouble must not hide the file status
        print(f"ccbench sweep: squeue: {exc}", file=sys.stderr)
        queued = None
    rows = sweep_status(sweep, queued)
    counts = {state: sum(r.state == state for r in rows) for state in ("done", "running",
                                                                        "pending")}
    files = result_files(sweep)
    width = max([len(r.label) for r in rows] + [4])
    print(f"sweep {sweep.name}: {len(rows)} cases: {counts['done']} done, "
          f"{counts['running']} running, {counts['pending']} pending  "
          f"({sweep.results_dir}, {len(files)} results files"
          + ("" if queued is not None else ", squeue not available") + ")")
    print(f"{'task':>4}  {'state':<8} {'case':<{width}}  {'sizes':>7}  job")
    for r in rows:
        note = f"  ({r.skipped} skipped)" if r.skipped else ""
        print(f"{r.task_id:>4}  {r.state:<8} {r.label:<{width}}  {r.done:>3}/{r.total:<3}  "
              f"{r.job}{note}")
    return counts["running"] + counts["pending"]
