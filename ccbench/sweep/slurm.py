"""Slurm side of sweeps: render the sbatch job arrays (pure), submit them, read squeue.

A job array shares one resource request, so a sweep becomes one array per allocation shape
(nodes x ranks per node); the array's task ids are the sweep's task ids, so task i writes
<results>/task-<i>.jsonl whichever array it is in.

Quoting: #SBATCH lines are parsed by sbatch, not by a shell: it splits on blanks, honours
double quotes and backslash escapes, and ends the line at an unescaped '#'. Values there are
quoted for that parser (`sbatch_quote`); everything in the script body is quoted with shlex.
Values with control characters (a newline would start a new script line) are refused earlier.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import string
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ccbench.errors import RunFailure, UsageError
from ccbench.sweep.plan import case_label, missing_sizes
from ccbench.sweep.spec import SlurmBlock, Sweep, Task
from ccbench.sweep.state import completed, read_current_cases, task_is_locked

__all__ = [
    "ArrayJob", "SlurmOptions", "array_jobs", "job_name", "render_sbatch", "sbatch_quote",
    "squeue_tasks", "submit", "sweep_status", "wait_for_jobs",
]

# shipped inside the package (package data), so an installed ccbench renders it too
TEMPLATE = Path(__file__).resolve().parent / "templates" / "array.sbatch"
_SQUEUE_TIMEOUT_S = 30.0


@dataclass(kw_only=True, slots=True)
class SlurmOptions:
    """sbatch resources; the sweep's `slurm:` block, overridden by the command line."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    max_parallel: int | None = None
    mem: str | None = None
    qos: str | None = None
    constraint: str | None = None
    extra: list[str] = field(default_factory=list)

    @classmethod
    def merged(cls, block: SlurmBlock, overrides: SlurmBlock) -> SlurmOptions:
        values: SlurmBlock = {**block, **overrides}    # both checked: no key is null
        return cls(**values)


@dataclass(frozen=True, slots=True)
class ArrayJob:
    """One job array: a shape and the sweep task ids it runs."""

    nodes: int
    ranks_per_node: int
    task_ids: tuple[int, ...]

    @property
    def shape(self) -> str:
        return f"{self.nodes}x{self.ranks_per_node}"


def sbatch_quote(value: str) -> str:
    """Quote one value for an #SBATCH line (sbatch's own parser, see the module doc)."""
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise UsageError(f"control characters are not allowed in sbatch values: {value!r}")
    escaped = "".join("\\" + ch if ch in '\\"#' else ch for ch in value)
    return f'"{escaped}"'


def job_name(sweep: Sweep) -> str:
    return f"ccbench-{sweep.name}"


def array_spec(task_ids: Sequence[int]) -> str:
    """0,1,2,5,7,8 -> 0-2,5,7-8."""
    parts: list[str] = []
    ids = sorted(task_ids)
    start = prev = ids[0]
    for task_id in ids[1:] + [None]:    # type: ignore[list-item]
        if task_id is not None and task_id == prev + 1:
            prev = task_id
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if task_id is not None:
            start = prev = task_id
    return ",".join(parts)


def array_jobs(tasks: Sequence[Task]) -> list[ArrayJob]:
    shapes: dict[tuple[int, int], list[int]] = {}
    for task in tasks:
        shapes.setdefault((task.nodes, task.ranks_per_node), []).append(task.task_id)
    return [ArrayJob(nodes=n, ranks_per_node=r, task_ids=tuple(ids))
            for (n, r), ids in shapes.items()]


def render_sbatch(sweep: Sweep, job: ArrayJob, options: SlurmOptions, *, plan: str,
                  workdir: str, python: str, template: str | None = None) -> str:
    """The sbatch script text of one array job (pure: no files, no clock, no environment)."""
    text = template if template is not None else TEMPLATE.read_text(encoding="utf-8")
    array = array_spec(job.task_ids)
    if options.max_parallel:
        array += f"%{options.max_parallel}"
    directives: list[str] = []
    for flag, value in (("partition", options.partition), ("account", options.account),
                        ("time", options.time), ("qos", options.qos),
                        ("constraint", options.constraint), ("mem", options.mem)):
        if value:
            directives.append(f"#SBATCH --{flag}={sbatch_quote(value)}")
    if options.gpus_per_node:
        directives.append(f"#SBATCH --gpus-per-node={int(options.gpus_per_node)}")
    if options.cpus_per_task:
        directives.append(f"#SBATCH --cpus-per-task={int(options.cpus_per_task)}")
    for extra in options.extra:
        flag, sep, value = extra.partition("=")
        directives.append(f"#SBATCH {flag}" + (f"={sbatch_quote(value)}" if sep else ""))
    exports = "".join(f"export {name}={shlex.quote(value)}\n"
                      for name, value in sorted(sweep.env.items()))
    command = shlex.join([python, "-m", "ccbench", "sweep", "run-task", plan])
    # '%' is Slurm's file name pattern character; '%%' is a literal one
    log = str(Path(sweep.results.replace("%", "%%")) / "logs" / f"{job.shape}-%A_%a.out")
    return string.Template(text).substitute(
        name=sweep.name, nodes=job.nodes, ranks_per_node=job.ranks_per_node,
        results=sweep.results, job_name=sbatch_quote(job_name(sweep)), array=array,
        directives="".join(line + "\n" for line in directives), log=sbatch_quote(log),
        workdir=sbatch_quote(workdir), exports=exports, command=command)


def plan_path(sweep: Sweep) -> Path:
    """Where the frozen, resolved sweep goes at submission (array tasks read this copy, so
    editing the sweep file later cannot renumber the tasks of a queued job)."""
    return sweep.results_dir / f"plan-{sweep.digest()}.json"


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise UsageError(f"{argv[0]} not found: is this a Slurm login node? "
                         "(.ci/slurm-up.sh starts a single-node cluster)") from None
    except subprocess.TimeoutExpired:
        raise RunFailure(f"{shlex.join(argv)} did not answer within {timeout:g} s") from None


def squeue_tasks(sweep: Sweep) -> dict[int, tuple[str, str]] | None:
    """task id -> (state, job id) for this sweep's array tasks in squeue; None: no squeue."""
    if shutil.which("squeue") is None:
        return None
    user = os.environ.get("USER") or _whoami()
    argv = ["squeue", "--noheader", "--array", f"--name={job_name(sweep)}",
            "--format=%F|%K|%T|%i"]
    if user:
        argv.append(f"--user={user}")
    proc = _run(argv, _SQUEUE_TIMEOUT_S)
    if proc.returncode != 0:
        raise RunFailure(f"squeue failed: {proc.stderr.strip()}")
    return parse_squeue(proc.stdout)


def _whoami() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def parse_squeue(text: str) -> dict[int, tuple[str, str]]:
    """Lines `arrayjob|taskid|STATE|jobid`; a pending remainder shows `0-7%2` as the task id."""
    tasks: dict[int, tuple[str, str]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3:
            continue
        job, ids, state = parts[0], parts[1].split("%")[0], parts[2]
        for item in ids.split(","):
            low, _, high = item.partition("-")
            if not low.isdigit():
                continue
            for task_id in range(int(low), int(high or low) + 1):
                tasks[task_id] = (state, job)
    return tasks


def submit(sweep: Sweep, options: SlurmOptions, *, dry_run: bool,
           log: Callable[[str], None] = print) -> list[str]:
    """Render (and unless dry_run, submit) the arrays of the tasks with something missing.
    Returns the submitted job ids."""
    done, _skipped = completed(sweep)
    todo = [task for task in sweep.tasks()
            if any(missing_sizes(case, done) for case in task.cases)]
    if not todo:
        log(f"ccbench sweep {sweep.name}: every case is complete; nothing to submit")
        return []
    if not dry_run:
        queued = squeue_tasks(sweep)
        if queued:
            busy = sorted({job for _state, job in queued.values()})
            raise UsageError(f"sweep {sweep.name!r} still has jobs in squeue ({', '.join(busy)}):"
                             f" wait for them or scancel them, then submit again")
    workdir = str(Path.cwd())
    plan = plan_path(sweep)
    jobs: list[str] = []
    for job in array_jobs(todo):
        text = render_sbatch(sweep, job, options, plan=str(plan), workdir=workdir,
                             python=sys.executable)
        script = sweep.results_dir / "jobs" / f"array-{job.shape}.sbatch"
        if dry_run:
            log(text)
            log(f"# would run: {shlex.join(['sbatch', '--parsable', str(script)])}\n")
            continue
        (sweep.results_dir / "logs").mkdir(parents=True, exist_ok=True)
        script.parent.mkdir(parents=True, exist_ok=True)
        if not plan.exists():
            plan.write_text(json.dumps(sweep.to_dict(), indent=1, sort_keys=True) + "\n",
                            encoding="utf-8")
        script.write_text(text, encoding="utf-8")
        proc = _run(["sbatch", "--parsable", str(script)], 120.0)
        if proc.returncode != 0:
            raise RunFailure(f"sbatch refused {script}: {proc.stderr.strip()}")
        job_id = proc.stdout.strip().split(";")[0]
        jobs.append(job_id)
        with open(sweep.results_dir / "jobs.txt", "a", encoding="utf-8") as handle:
            handle.write(f"{job_id} {job.shape} tasks {array_spec(job.task_ids)}\n")
        log(f"ccbench sweep {sweep.name}: submitted job {job_id}: array "
            f"{array_spec(job.task_ids)} on {job.shape} ({script})")
    return jobs


def wait_for_jobs(sweep: Sweep, timeout: float, poll: float = 2.0,
                  log: Callable[[str], None] = print) -> None:
    """Until no task of the sweep is in squeue, or timeout seconds have passed."""
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        queued = squeue_tasks(sweep)
        if not queued:
            return
        counts: dict[str, int] = {}
        for state, _job in queued.values():
            counts[state] = counts.get(state, 0) + 1
        line = ", ".join(f"{n} {state.lower()}" for state, n in sorted(counts.items()))
        if line != last:
            log(f"ccbench sweep {sweep.name}: {line}")
            last = line
        if time.monotonic() > deadline:
            raise RunFailure(f"sweep {sweep.name!r}: jobs still in squeue after --wait-timeout "
                             f"{timeout:g} s ({line})")
        time.sleep(poll)


@dataclass(frozen=True, slots=True)
class CaseStatus:
    task_id: int
    label: str
    state: str             # done | running | pending
    done: int
    total: int
    skipped: int           # of done: sizes a successful run produced no record for
    job: str               # Slurm job and state, "" when not in squeue


def sweep_status(sweep: Sweep, queued: Mapping[int, tuple[str, str]] | None
                 ) -> list[CaseStatus]:
    done, skipped = completed(sweep)
    rows: list[CaseStatus] = []
    for task in sweep.tasks():
        state, job = (queued or {}).get(task.task_id, ("", ""))
        active = state in ("RUNNING", "COMPLETING") or task_is_locked(sweep, task.task_id)
        current = read_current_cases(sweep, task.task_id) if active else set()
        for case in task.cases:
            missing = missing_sizes(case, done)
            if not missing:
                case_state = "done"
            elif active and (case.identity in current or not current):
                case_state = "running"
            else:
                case_state = "pending"
            num_skipped = len(skipped.get(case.identity, set()) & set(case.sizes))
            rows.append(CaseStatus(task_id=task.task_id, label=case_label(case), state=case_state,
                                   done=len(case.sizes) - len(missing), total=len(case.sizes),
                                   skipped=num_skipped,
                                   job=f"{job} {state.lower()}" if job else ""))
    return rows
