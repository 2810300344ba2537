"""Sweeps: a YAML file that names a cross product of cases, run locally or as a Slurm job array.

A sweep file (all keys but one of collectives/backends optional; see slurm/sweeps/*.yaml)::

    name: calibration                 # default: the file name without .yaml
    collectives: [allreduce, allgather]   # or "all", or "allreduce,allgather"
    backends: [mpi, ring@mpi]
    dtypes: [float32]
    ops: [sum]                        # only reducing collectives take an op
    sizes: 8-16M                      # ccbench size syntax
    nodes: [1]                        # world = nodes x ranks_per_node, cross product
    ranks_per_node: [2, 3, 4]
    modes: [out-of-place, in-place]
    timing: per-op
    iters: 20                         # iters, warmup, min_time, check, timeout: benchmark flags
    case_timeout: 3600                # seconds one case may run before it is killed
    launcher: auto                    # under Slurm: auto (mpiexec for MPI backends, else srun)
    group_by: [backend]               # cases of one world are split into array tasks by these
    results: results/calibration      # default results/<name>, relative to the working dir
    env: {I_MPI_WAIT_MODE: "1"}       # exported to every case
    slurm: {partition: debug, time: "00:30:00", max_parallel: 4}

A *case* is one (collective, backend, dtype, op, mode, nodes, ranks per node) with a list of
sizes; it is complete when a record of every size is in some results file of the sweep. Cases
are grouped into *tasks* (one Slurm array task each); task i appends to
<results>/task-<i>.jsonl and nothing else writes that file (a lock file guards it), so a rerun
only measures the sizes no file holds yet.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ccbench.collectives import COLLECTIVES, OPS, REDUCING, canonical_collective
from ccbench.errors import UsageError, choices_error
from ccbench.records import Record, cut_torn_tail, iter_result_files, load_records
from ccbench.sizes import parse_sizes

__all__ = [
    "Case", "CaseRun", "Sweep", "Task", "build_case_command", "case_environment", "case_label",
    "load_sweep",
    "missing_sizes", "plan_runs", "run_local", "run_task", "sweep_from_dict",
    "done_sizes",
]

MODES = ("out-of-place", "in-place")
TIMINGS = ("per-op", "pipelined")
LAUNCHERS = ("auto", "srun", "mpiexec")
GROUP_FIELDS = ("backend", "collective", "dtype", "op", "mode")
SLURM_KEYS = ("partition", "account", "time", "gpus_per_node", "max_parallel", "cpus_per_task",
              "mem", "qos", "constraint", "extra")
BENCH_KEYS = ("iters", "warmup", "min_time", "check", "timeout")
TOP_KEYS = ("name", "collectives", "backends", "dtypes", "ops", "sizes", "nodes", "ranks_per_node",
            "modes", "timing", *BENCH_KEYS, "case_timeout", "launcher", "mpiexec", "group_by",
            "results", "env", "slurm", "description")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, slots=True)
class Case:
    """One measured configuration; `sizes` are bytes asked, in sweep order."""

    collective: str
    backend: str
    dtype: str
    op: str | None                 # None for collectives that do not reduce
    inplace: bool
    nodes: int
    ranks_per_node: int
    sizes: tuple[int, ...]

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def mode(self) -> str:
        return "in-place" if self.inplace else "out-of-place"

    def key(self) -> tuple[Any, ...]:
        return (self.collective, self.backend, self.dtype, self.op, self.inplace, self.nodes,
                self.ranks_per_node)


@dataclass(frozen=True, slots=True)
class Task:
    """The cases one array task runs, all on one allocation shape."""

    task_id: int
    nodes: int
    ranks_per_node: int
    cases: tuple[Case, ...]


@dataclass(kw_only=True, slots=True)
class Sweep:
    """A validated sweep file."""

    name: str
    collectives: list[str]
    backends: list[str]
    dtypes: list[str]
    ops: list[str]
    sizes: list[int]
    nodes: list[int]
    ranks_per_node: list[int]
    modes: list[str]
    timing: str = "per-op"
    bench: dict[str, float] = field(default_factory=dict)   # iters, warmup, ... when given
    case_timeout: float = 3600.0
    launcher: str = "auto"
    mpiexec: str | None = None
    group_by: list[str] = field(default_factory=lambda: ["backend"])
    results: str = ""
    env: dict[str, str] = field(default_factory=dict)
    slurm: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    source: str = ""               # the file it came from, for messages

    # -- the cross product --------------------------------------------------------------------
    def cases(self) -> list[Case]:
        seen: set[tuple[Any, ...]] = set()
        out: list[Case] = []
        for nodes, rpn, backend, collective, dtype, op, mode in itertools.product(
                self.nodes, self.ranks_per_node, self.backends, self.collectives, self.dtypes,
                self.ops, self.modes):
            # the benchmark measures broadcast in place only, and skips sizes whose per-rank
            # count rounds down to zero: a case asks only for what can produce a record
            inplace = True if collective == "broadcast" else mode == "in-place"
            sizes = measurable_sizes(collective, dtype, nodes * rpn, self.sizes)
            case = Case(collective=collective, backend=backend, dtype=dtype,
                        op=op if collective in REDUCING else None, inplace=inplace,
                        nodes=nodes, ranks_per_node=rpn, sizes=sizes)
            if sizes and case.key() not in seen:   # non-reducing collectives collapse over ops
                seen.add(case.key())
                out.append(case)
        return out

    def tasks(self) -> list[Task]:
        """Cases grouped by allocation shape, then by `group_by`; ids are stable for a file."""
        groups: dict[tuple[Any, ...], list[Case]] = {}
        for case in self.cases():
            values = {"backend": case.backend, "collective": case.collective,
                      "dtype": case.dtype, "op": case.op, "mode": case.mode}
            key = (case.nodes, case.ranks_per_node, *(values[g] for g in self.group_by))
            groups.setdefault(key, []).append(case)
        return [Task(task_id=i, nodes=key[0], ranks_per_node=key[1], cases=tuple(cases))
                for i, (key, cases) in enumerate(groups.items())]

    @property
    def results_dir(self) -> Path:
        return Path(self.results)

    def task_output(self, task_id: int) -> Path:
        return self.results_dir / f"task-{task_id}.jsonl"

    def to_dict(self) -> dict[str, Any]:
        """The resolved sweep as a sweep file (sizes as a byte list), for the frozen plan."""
        data: dict[str, Any] = {
            "name": self.name, "collectives": self.collectives, "backends": self.backends,
            "dtypes": self.dtypes, "ops": self.ops, "sizes": ",".join(map(str, self.sizes)),
            "nodes": self.nodes, "ranks_per_node": self.ranks_per_node, "modes": self.modes,
            "timing": self.timing, **self.bench, "case_timeout": self.case_timeout,
            "launcher": self.launcher, "group_by": self.group_by, "results": self.results,
            "env": self.env, "slurm": self.slurm,
        }
        if self.mpiexec:
            data["mpiexec"] = self.mpiexec
        if self.description:
            data["description"] = self.description
        return data

    def digest(self) -> str:
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


# -- loading and validation -------------------------------------------------------------------

def load_sweep(path: str | os.PathLike[str]) -> Sweep:
    """Read and validate a sweep file; any problem is `<file>: <key>: ...` (UsageError)."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{where}: no such sweep file") from None
    except OSError as exc:
        raise UsageError(f"{where}: cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark is not None else ""
        raise UsageError(f"{where}: not valid YAML{line}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{where}: a sweep file is a mapping of keys (valid: "
                         f"{', '.join(TOP_KEYS)})")
    return sweep_from_dict(data, where, default_name=Path(path).stem)


class _Checker:
    """Builds `<file>: <key>: ...` errors."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, key: str, message: str) -> UsageError:
        return UsageError(f"{self.where}: {key}: {message}")

    def strings(self, key: str, value: Any) -> list[str]:
        if isinstance(value, str):
            items: list[Any] = [part.strip() for part in value.split(",") if part.strip()]
        elif isinstance(value, list):
            items = value
        else:
            raise self.fail(key, f"expected a list or a comma-separated string, "
                                 f"got {type(value).__name__} {value!r}")
        if not items:
            raise self.fail(key, "empty list")
        for item in items:
            if not isinstance(item, str) or not item.strip():
                raise self.fail(key, f"expected names, got {item!r}")
        return [item.strip() for item in items]

    def choices(self, key: str, value: Any, valid: Sequence[str],
                normalize: Callable[[str], str] = str.lower) -> list[str]:
        out: list[str] = []
        for item in self.strings(key, value):
            name = normalize(item)
            if name not in valid:
                raise self.fail(key, str(choices_error(key.rstrip("s"), item, valid)))
            if name not in out:
                out.append(name)
        return out

    def positive_ints(self, key: str, value: Any) -> list[int]:
        items = value if isinstance(value, list) else [value]
        if not items:
            raise self.fail(key, "empty list")
        out: list[int] = []
        for item in items:
            if isinstance(item, bool) or not isinstance(item, int) or item < 1:
                raise self.fail(key, f"expected positive integers, got {item!r}")
            if item not in out:
                out.append(item)
        return out

    def number(self, key: str, value: Any, minimum: float, integer: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or (integer and not isinstance(value, int)):
            raise self.fail(key, f"expected {'an integer' if integer else 'a number'}, "
                                 f"got {value!r}")
        if value < minimum:
            raise self.fail(key, f"must be >= {minimum:g}, got {value!r}")
        return value

    def text(self, key: str, value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.fail(key, f"expected a string, got {value!r}")
        text = str(value)
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
            raise self.fail(key, f"control characters are not allowed: {text!r}")
        return text


def _canonical_dtype(name: str) -> str:
    from ccbench.dtypes import _ALIASES as DTYPE_ALIASES

    return DTYPE_ALIASES.get(name.lower(), name.lower())


def _check_backends(check: _Checker, value: Any) -> list[str]:
    from ccbench.backends import backend_class, backend_names

    names = check.strings("backends", value)
    for name in names:
        try:
            backend_class(name)
        except UsageError:
            raise check.fail("backends", str(choices_error(
                "backend", name, [*backend_names(), "<algorithm>@<transport>"]))) from None
    return list(dict.fromkeys(names))


def sweep_from_dict(data: Mapping[str, Any], where: str = "sweep",
                    default_name: str = "sweep") -> Sweep:
    from ccbench.dtypes import DTYPES

    check = _Checker(where)
    unknown = [key for key in data if key not in TOP_KEYS]
    if unknown:
        raise check.fail(str(unknown[0]), f"unknown key (valid: {', '.join(TOP_KEYS)})")
    name = check.text("name", data.get("name", default_name))
    if not _NAME_RE.match(name):
        raise check.fail("name", f"{name!r}: use letters, digits, '.', '_' and '-' "
                                 "(it names files and jobs)")
    collectives_value = data.get("collectives", "allreduce")
    if collectives_value == "all":
        collectives = list(COLLECTIVES)
    else:
        collectives = check.choices("collectives", collectives_value, COLLECTIVES,
                                    normalize=lambda s: _safe_collective(s))
    dtypes_value = data.get("dtypes", "float32")
    dtypes = list(DTYPES) if dtypes_value == "all" else check.choices(
        "dtypes", dtypes_value, list(DTYPES), normalize=_canonical_dtype)
    sizes_value = data.get("sizes", "1K-16M")
    if isinstance(sizes_value, list):
        sizes_value = ",".join(str(s) for s in sizes_value)
    if isinstance(sizes_value, int) and not isinstance(sizes_value, bool):
        sizes_value = str(sizes_value)
    if not isinstance(sizes_value, str):
        raise check.fail("sizes", f"expected a size spec like 1K-16M, got {sizes_value!r}")
    try:
        sizes = list(dict.fromkeys(parse_sizes(sizes_value)))
    except UsageError as exc:
        raise check.fail("sizes", str(exc)) from None
    bench: dict[str, float] = {}
    for key in BENCH_KEYS:
        if key in data:
            integer = key in ("iters", "warmup", "check")
            minimum = 1 if key == "iters" else 0
            value = check.number(key, data[key], minimum, integer=integer)
            if key == "timeout" and value <= 0:
                raise check.fail(key, f"must be > 0, got {value!r}")
            bench[key] = value
    timing = check.text("timing", data.get("timing", "per-op"))
    if timing not in TIMINGS:
        raise check.fail("timing", str(choices_error("timing", timing, TIMINGS)))
    launcher = check.text("launcher", data.get("launcher", "auto"))
    if launcher not in LAUNCHERS:
        raise check.fail("launcher", str(choices_error("launcher", launcher, LAUNCHERS)))
    case_timeout = check.number("case_timeout", data.get("case_timeout", 3600), 1)
    group_by = check.choices("group_by", data.get("group_by", ["backend"]), GROUP_FIELDS)
    env_value = data.get("env", {}) or {}
    if not isinstance(env_value, dict):
        raise check.fail("env", f"expected a mapping NAME: value, got {env_value!r}")
    env: dict[str, str] = {}
    for key, value in env_value.items():
        if not isinstance(key, str) or not _ENV_RE.match(key):
            raise check.fail("env", f"{key!r} is not a variable name")
        env[key] = check.text(f"env: {key}", value)
    mpiexec = data.get("mpiexec")
    sweep = Sweep(
        name=name,
        collectives=collectives,
        backends=_check_backends(check, data.get("backends", "gloo")),
        dtypes=dtypes,
        ops=check.choices("ops", data.get("ops", "sum"), OPS),
        sizes=sizes,
        nodes=check.positive_ints("nodes", data.get("nodes", 1)),
        ranks_per_node=check.positive_ints("ranks_per_node", data.get("ranks_per_node", 2)),
        modes=check.choices("modes", data.get("modes", list(MODES)), MODES),
        timing=timing, bench=bench, case_timeout=float(case_timeout), launcher=launcher,
        mpiexec=check.text("mpiexec", mpiexec) if mpiexec is not None else None,
        group_by=group_by,
        results=check.text("results", data.get("results", f"results/{name}")),
        env=env, slurm=check_slurm_options(check, data.get("slurm", {}) or {}),
        description=check.text("description", data.get("description", "")),
        source=where,
    )
    return sweep


def _safe_collective(name: str) -> str:
    try:
        return canonical_collective(name)
    except UsageError:
        return name


_TIME_RE = re.compile(r"^(\d+|\d+:\d{1,2}(:\d{1,2})?|\d+-\d{1,2}(:\d{1,2}(:\d{1,2})?)?)$")


def check_slurm_options(check: _Checker, value: Any) -> dict[str, Any]:
    """The `slurm:` block (and the same checks for --partition ... on the command line)."""
    if not isinstance(value, dict):
        raise check.fail("slurm", f"expected a mapping (valid keys: {', '.join(SLURM_KEYS)})")
    out: dict[str, Any] = {}
    for key, item in value.items():
        label = f"slurm: {key}"
        if key not in SLURM_KEYS:
            raise check.fail(label, f"unknown key (valid: {', '.join(SLURM_KEYS)})")
        if item is None:
            continue
        if key in ("gpus_per_node", "cpus_per_task", "max_parallel"):
            out[key] = int(check.number(label, item, 0 if key == "gpus_per_node" else 1,
                                        integer=True))
        elif key == "extra":
            items = item if isinstance(item, list) else [item]
            extra = [check.text(label, one) for one in items]
            for one in extra:
                if not one.startswith("--"):
                    raise check.fail(label, f"expected sbatch options like --exclusive, "
                                            f"got {one!r}")
            out[key] = extra
        else:
            text = check.text(label, item)
            if key == "time" and not _TIME_RE.match(text):
                raise check.fail(label, f"{text!r} is not a Slurm time (valid forms: minutes, "
                                        "MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS)")
            if not text:
                raise check.fail(label, "empty value")
            out[key] = text
    return out


# -- what is done -----------------------------------------------------------------------------

def record_case_key(record: Record) -> tuple[Any, ...]:
    """The part of a record that a sweep case fixes (algorithm, transport and device follow
    from the backend, so they are not compared)."""
    return (record.collective, record.backend, record.dtype, record.op, record.inplace,
            record.nodes, record.ranks_per_node)


def done_sizes(records: Iterable[Record], timing: str) -> dict[tuple[Any, ...], set[int]]:
    """Sizes measured per case key; a record with wrong elements does not count as done."""
    done: dict[tuple[Any, ...], set[int]] = {}
    for record in records:
        if record.timing != timing or (record.wrong or 0) > 0:
            continue
        done.setdefault(record_case_key(record), set()).add(record.size_asked)
    return done


def load_sweep_records(sweep: Sweep) -> list[Record]:
    if not sweep.results_dir.is_dir():
        return []
    return load_records(sweep.results_dir)


def measurable_sizes(collective: str, dtype: str, world_size: int,
                     sizes: Iterable[int]) -> tuple[int, ...]:
    from ccbench.collectives import layout
    from ccbench.dtypes import numpy_dtype

    elsize = numpy_dtype(dtype).itemsize
    out = []
    for size in sizes:
        lay = layout(collective, size, elsize, world_size)
        if lay.send_count > 0 and lay.recv_count > 0:
            out.append(size)
    return tuple(out)


def skipped_file(sweep: Sweep, task_id: int) -> Path:
    # not *.jsonl: results readers (load_records, merge) must not take it for records
    return sweep.results_dir / f"task-{task_id}.skipped"


def load_skipped(sweep: Sweep) -> dict[tuple[Any, ...], set[int]]:
    """Sizes a successful run produced no record for (a backend's `unsupported`, say)."""
    skipped: dict[tuple[Any, ...], set[int]] = {}
    if not sweep.results_dir.is_dir():
        return skipped
    for path in sorted(sweep.results_dir.glob("task-*.skipped")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                key = tuple(entry["case"])
                sizes = {int(size) for size in entry["sizes"]}
            except (ValueError, KeyError, TypeError):
                raise UsageError(f"{path}:{number}: not a skipped-sizes entry") from None
            skipped.setdefault(key, set()).update(sizes)
    return skipped


def completed(sweep: Sweep) -> tuple[dict[tuple[Any, ...], set[int]],
                                     dict[tuple[Any, ...], set[int]]]:
    """(done, skipped): per case key, the sizes with a record, and those a successful run
    left without one. Both count as complete."""
    done = done_sizes(load_sweep_records(sweep), sweep.timing)
    skipped = load_skipped(sweep)
    merged = {key: set(sizes) for key, sizes in done.items()}
    for key, sizes in skipped.items():
        merged.setdefault(key, set()).update(sizes)
    return merged, skipped


def missing_sizes(case: Case, done: Mapping[tuple[Any, ...], set[int]]) -> list[int]:
    have = done.get(case.key(), set())
    return [size for size in case.sizes if size not in have]


@dataclass(frozen=True, slots=True)
class CaseRun:
    """One benchmark invocation: cases that differ only in mode and miss the same sizes run
    together (the benchmark measures both modes in one pass)."""

    cases: tuple[Case, ...]
    sizes: tuple[int, ...]

    @property
    def first(self) -> Case:
        return self.cases[0]

    @property
    def modes(self) -> tuple[str, ...]:
        return tuple(case.mode for case in self.cases)


def plan_runs(cases: Iterable[Case], done: Mapping[tuple[Any, ...], set[int]]) -> list[CaseRun]:
    runs: list[CaseRun] = []
    pending: dict[tuple[Any, ...], list[tuple[Case, tuple[int, ...]]]] = {}
    for case in cases:
        sizes = tuple(missing_sizes(case, done))
        if sizes:
            base = case.key()[:4] + case.key()[5:]     # everything but the mode
            pending.setdefault(base, []).append((case, sizes))
    for entries in pending.values():
        if len(entries) == 2 and entries[0][1] == entries[1][1]:
            runs.append(CaseRun(cases=(entries[0][0], entries[1][0]), sizes=entries[0][1]))
        else:
            runs.extend(CaseRun(cases=(case,), sizes=sizes) for case, sizes in entries)
    return runs


def case_label(case: Case) -> str:
    op = f" {case.op}" if case.op else ""
    return (f"{case.collective} {case.backend} {case.dtype}{op} {case.mode} "
            f"{case.nodes}x{case.ranks_per_node}")


# -- running ----------------------------------------------------------------------------------

def _needs_mpi(backend: str) -> bool:
    from ccbench.backends import backend_class

    return bool(backend_class(backend).needs_mpi_launcher)


def bench_arguments(sweep: Sweep, run: CaseRun, output: str | os.PathLike[str]) -> list[str]:
    case = run.first
    args = [case.collective, "--backend", case.backend, "--sizes", ",".join(map(str, run.sizes)),
            "--dtype", case.dtype, "--op", case.op or sweep.ops[0], "--timing", sweep.timing]
    if len(run.cases) == 1:
        args.append("--inplace" if case.inplace else "--outofplace")
    for key in BENCH_KEYS:
        if key in sweep.bench:
            value = sweep.bench[key]
            args += [f"--{key.replace('_', '-')}", f"{value:g}" if isinstance(value, float)
                     else str(value)]
    return [*args, "--output", str(output), "--quiet"]


def build_case_command(sweep: Sweep, run: CaseRun, output: str | os.PathLike[str],
                       where: str, python: str | None = None) -> list[str]:
    """argv of one case: `ccbench launch` locally; srun or mpiexec inside a Slurm allocation."""
    python = python or sys.executable
    case = run.first
    bench = bench_arguments(sweep, run, output)
    if where == "local":
        if case.nodes != 1:
            raise UsageError(f"{sweep.source}: nodes: a local sweep runs on one node, "
                             f"got {case.nodes} (use --slurm)")
        return [python, "-m", "ccbench", "launch", "-n", str(case.world_size), *bench]
    launcher = sweep.launcher
    if launcher == "auto":
        launcher = "mpiexec" if _needs_mpi(case.backend) else "srun"
    if launcher == "mpiexec":
        # Intel MPI / MPICH Hydra: starts its proxies on the allocation's nodes through srun
        mpiexec = sweep.mpiexec or _default_mpiexec(python)
        return [mpiexec, "-n", str(case.world_size), "-ppn", str(case.ranks_per_node),
                python, "-m", "ccbench", *bench]
    return ["srun", f"--nodes={case.nodes}", f"--ntasks={case.world_size}",
            f"--ntasks-per-node={case.ranks_per_node}", "--kill-on-bad-exit=1",
            python, "-m", "ccbench", *bench]


def _default_mpiexec(python: str) -> str:
    beside = Path(python).parent / "mpiexec"
    return str(beside) if beside.exists() else "mpiexec"


@contextmanager
def task_lock(sweep: Sweep, task_id: int) -> Iterator[None]:
    """One writer per task file, whether it runs under Slurm or locally."""
    sweep.results_dir.mkdir(parents=True, exist_ok=True)
    path = sweep.results_dir / f"task-{task_id}.lock"
    with open(path, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise UsageError(f"task {task_id} of sweep {sweep.name!r} is already running "
                             f"({holder}); wait for it or stop it") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {os.uname().nodename}"
                     + (f", job {os.environ['SLURM_JOB_ID']}" if "SLURM_JOB_ID" in os.environ
                        else "") + "\n")
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()


def task_is_locked(sweep: Sweep, task_id: int) -> bool:
    path = sweep.results_dir / f"task-{task_id}.lock"
    if not path.exists():
        return False
    with open(path, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def current_case_file(sweep: Sweep, task_id: int) -> Path:
    return sweep.results_dir / f"task-{task_id}.current"


def _run_with_timeout(argv: list[str], env: dict[str, str], timeout: float,
                      log: Callable[[str], None]) -> int:
    """Run one case in its own process group; kill the group at the deadline."""
    proc = subprocess.Popen(argv, env=env, start_new_session=True)

    def forward(signum: int, _frame: object) -> None:
        _kill_group(proc, signum)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        log(f"ccbench sweep: case ran past case_timeout {timeout:g} s; stopping it")
        _kill_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            _kill_group(proc, signal.SIGKILL)
            proc.wait(timeout=15)
        return 124
    finally:
        signal.signal(signal.SIGTERM, previous)


def _kill_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        pass


# Variables by which a process learns its rank from a launcher (ccbench.launchers reads them,
# MPI and torchrun first, srun last). The process that runs a sweep is not a rank of the
# cases it starts, but it can carry such variables from where it was started: an MPI
# singleton (Intel MPI's MPI_Init with no mpiexec) sets MPI_LOCALRANKID and MPI_LOCALNRANKS
# in its own environment, every child inherits them, and sbatch exports them into the job.
# Left in, every srun task of a case finds them, takes itself for rank 0 of a one-rank MPI
# world, and writes its own record of every size. The launcher of the case sets the ones
# that apply to it; the sweep's `env:` can still set any of them on purpose.
LAUNCHER_IDENTITY_VARS = (
    "CCBENCH_CONTROL", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT",
    "PMI_RANK", "PMI_SIZE", "PMI_FD", "PMI_PORT", "PMI_ID", "PMIX_RANK", "PMIX_SIZE",
    "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
)
_LAUNCHER_IDENTITY_PREFIXES = ("OMPI_COMM_WORLD_",)


def case_environment(sweep: Sweep, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a case starts with: this process's, less launcher identity variables
    it inherited (see LAUNCHER_IDENTITY_VARS), plus the sweep's `env:`."""
    base = os.environ if environ is None else environ
    env = {name: value for name, value in base.items()
           if name not in LAUNCHER_IDENTITY_VARS
           and not name.startswith(_LAUNCHER_IDENTITY_PREFIXES)}
    return {**env, **sweep.env}


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
        marker = current_case_file(sweep, task_id)
        for run in runs:
            label = " + ".join(case_label(case) for case in run.cases)
            argv = build_case_command(sweep, run, output, where)
            log(f"ccbench sweep: {label}: {len(run.sizes)} sizes: {shlex.join(argv)}")
            marker.write_text(json.dumps([asdict(case) for case in run.cases]) + "\n")
            started = time.monotonic()
            status = _run_with_timeout(argv, env, sweep.case_timeout, log)
            cut_torn_tail(output)
            log(f"ccbench sweep: {label}: exit {status} after {time.monotonic() - started:.1f} s")
            if status != 0:
                failures.append(f"{label} (exit {status})")
                continue
            # exit 0 but sizes without a record: the benchmark chose to skip them (it prints
            # why); remember that, so a rerun does not ask again forever
            done = done_sizes(load_sweep_records(sweep), sweep.timing)
            with open(skipped_file(sweep, task_id), "a", encoding="utf-8") as handle:
                for case in run.cases:
                    left = [s for s in run.sizes if s not in done.get(case.key(), set())]
                    if left:
                        log(f"ccbench sweep: {case_label(case)}: no record for sizes "
                            f"{','.join(map(str, left))}; marked skipped")
                        handle.write(json.dumps({"case": list(case.key()), "sizes": left}) + "\n")
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


def result_files(sweep: Sweep) -> list[Path]:
    if not sweep.results_dir.is_dir():
        return []
    return list(iter_result_files([sweep.results_dir]))
