"""Running a sweep's tasks on this machine (also what each Slurm array task runs)."""

from __future__ import annotations

import shlex
import signal
import subprocess
import time
from collections.abc import Callable

from ccbench.errors import UsageError
from ccbench.records import cut_torn_tail
from ccbench.run.control import SECRET_VAR, new_secret
from ccbench.run.lifeline import lifeline_env
from ccbench.run.supervisor import kill_group
from ccbench.sweep.plan import build_case_command, case_environment, case_label, plan_runs
from ccbench.sweep.spec import Sweep
from ccbench.sweep.state import (
    completed,
    current_case_file,
    done_sizes,
    load_sweep_records,
    task_lock,
    write_current_cases,
    write_skipped,
)

__all__ = ["run_task", "run_local"]

class _Interrupted(Exception):
    """A signal asked the sweep to stop (Ctrl-C, SIGTERM, a closed terminal)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_STOP_GRACE_S = 15


def _run_with_timeout(argv: list[str], env: dict[str, str], timeout: float,
                      log: Callable[[str], None]) -> int:
    """Run one case in its own process group; kill the group at the deadline. Interrupted,
    the case is stopped too (the same signal, then SIGKILL), the interruption named, and the
    sweep exits 128 + the signal. Killed outright, the case goes with it (ccbench.run.lifeline)."""
    proc = subprocess.Popen(argv, env=env, start_new_session=True)

    def interrupt(signum: int, _frame: object) -> None:
        raise _Interrupted(signum)

    previous = {sig: signal.signal(sig, interrupt) for sig in _STOPPING}
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        log(f"ccbench sweep: case ran past case_timeout {timeout:g} s; stopping it")
        _stop_case(proc, signal.SIGTERM)
        return 124
    except _Interrupted as stop:
        name = signal.Signals(stop.signum).name
        what = "interrupted" if stop.signum == signal.SIGINT else "terminated"
        log(f"ccbench sweep: {what} ({name}); stopping the running case")
        _stop_case(proc, stop.signum)
        raise SystemExit(128 + stop.signum) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop_case(proc: subprocess.Popen[bytes], signum: int) -> None:
    kill_group(proc.pid, signum)
    try:
        proc.wait(timeout=_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid, signal.SIGKILL)
        proc.wait(timeout=_STOP_GRACE_S)


def run_task(sweep: Sweep, task_id: int, where: str,
             log: Callable[[str], None] = lambda line: print(line, flush=True)) -> int:
    """Run what is missing of one task; 0 when every case of it is complete afterwards."""
    tasks = sweep.tasks()
    if not 0 <= task_id < len(tasks):
        raise UsageError(f"{sweep.source}: task {task_id} does not exist "
                         f"(this sweep has tasks 0-{len(tasks) - 1})")
    task = tasks[task_id]
    output = sweep.task_output(task_id)
    failures: list[str] = []
    with task_lock(sweep, task_id):
        cut_torn_tail(output)
        runs = plan_runs(task.cases, completed(sweep)[0])
        skipped = len(task.cases) - sum(len(run.cases) for run in runs)
        log(f"ccbench sweep {sweep.name}: task {task_id}: {len(task.cases)} cases, "
            f"{skipped} complete, {len(runs)} runs to do")
        env = case_environment(sweep)
        if where == "local":          # the case ends with this sweep (ccbench.run.lifeline)
            env = {**env, **lifeline_env()}
        marker = current_case_file(sweep, task_id)
        for run in runs:
            label = " + ".join(case_label(case) for case in run.cases)
            argv = build_case_command(sweep, run, output, where)
            log(f"ccbench sweep: {label}: {len(run.sizes)} sizes: {shlex.join(argv)}")
            write_current_cases(sweep, task_id, run.cases)
            started = time.monotonic()
            # each case's ranks prove they belong to it (ccbench.run.control); srun hands them
            # nothing but the environment
            status = _run_with_timeout(argv, {**env, SECRET_VAR: new_secret()},
                                       sweep.case_timeout, log)
            cut_torn_tail(output)
            log(f"ccbench sweep: {label}: exit {status} after {time.monotonic() - started:.1f} s")
            if status != 0:
                failures.append(f"{label} (exit {status})")
                continue
            # exit 0 but sizes without a record: the benchmark chose to skip them (it prints
            # why); remember that, so a rerun does not ask again forever
            done = done_sizes(load_sweep_records(sweep))
            for case in run.cases:
                left = [s for s in run.sizes if s not in done.get(case.identity, set())]
                if left:
                    log(f"ccbench sweep: {case_label(case)}: no record for sizes "
                        f"{','.join(map(str, left))}; marked skipped")
                    write_skipped(sweep, task_id, case, left)
        marker.unlink(missing_ok=True)
    for failure in failures:
        log(f"ccbench sweep: failed: {failure}")
    return 1 if failures else 0


def run_local(sweep: Sweep, log: Callable[[str], None] = lambda line: print(line, flush=True)
              ) -> int:
    """Every task of the sweep one after another on this machine."""
    for case in sweep.cases():
        if case.nodes != 1:
            raise UsageError(f"{sweep.source}: nodes: a local sweep runs on one node, "
                             f"got {case.nodes} (use --slurm)")
    status = 0
    for task in sweep.tasks():
        status = max(status, run_task(sweep, task.task_id, "local", log))
    return status


