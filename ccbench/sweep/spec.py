"""The sweep file: its keys, their checks, and the cases and tasks it names."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, cast

import yaml

from ccbench.backends import HOST_BACKEND
from ccbench.bench.options import BENCH_OPTIONS, conflict
from ccbench.collectives import COLLECTIVES, OPS, REDUCING, canonical_collective
from ccbench.collectives import get as get_collective
from ccbench.errors import BackendUnavailable, UsageError, choices_error
from ccbench.records import CaseId
from ccbench.safeio import load_yaml, read_input
from ccbench.units import parse_sizes

__all__ = ["SweepCase", "Sweep", "Task", "SlurmBlock", "load_sweep", "sweep_from_dict",
           "check_slurm_options",
           "measurable_sizes", "SWEEP_CASE_FIELDS", "MODES", "TIMINGS", "LAUNCHERS",
           "TASK_GROUP_KEYS", "SLURM_KEYS", "BENCH_KEYS", "TOP_KEYS", "CASE_TIMEOUT_S"]

MODES = ("out-of-place", "in-place")
TIMINGS = ("per-op", "pipelined")
LAUNCHERS = ("auto", "srun", "mpiexec")
TASK_GROUP_KEYS = ("backend", "collective", "dtype", "op", "mode")   # sweep key group_by


class SlurmBlock(TypedDict, total=False):
    """A sweep's checked `slurm:` block (SLURM_KEYS; a key given as null is left out)."""

    partition: str
    account: str
    time: str
    gpus_per_node: int
    max_parallel: int
    cpus_per_task: int
    mem: str
    qos: str
    constraint: str
    extra: list[str]               # sbatch options, each starting with --


SLURM_KEYS = ("partition", "account", "time", "gpus_per_node", "max_parallel", "cpus_per_task",
              "mem", "qos", "constraint", "extra")
BENCH_KEYS = tuple(option.name for option in BENCH_OPTIONS)   # iters, warmup, ..., root, device
TOP_KEYS = ("name", "collectives", "backends", "dtypes", "ops", "sizes", "nodes", "ranks_per_node",
            "modes", "timing", *BENCH_KEYS, "case_timeout", "launcher", "mpiexec", "group_by",
            "results", "env", "slurm", "description")
#: seconds one case of a sweep may run before its processes are killed (sweep key case_timeout)
CASE_TIMEOUT_S = 3600.0
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# The case identity fields a sweep fixes; library, version, algorithm, transport and device
# follow from the backend on the machine that runs it, so a record of any of them counts.
SWEEP_CASE_FIELDS = ("collective", "backend", "dtype", "op", "inplace", "timing", "root",
                     "world_size", "nodes", "ranks_per_node")


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepCase:
    """One configuration a sweep measures; `sizes` are bytes asked, in sweep order."""

    collective: str
    backend: str
    dtype: str
    op: str | None                 # None for collectives that do not reduce
    inplace: bool
    timing: str
    nodes: int
    ranks_per_node: int
    sizes: tuple[int, ...]
    root: int = 0                  # the sweep's `root` (records carry it for every collective)

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def mode(self) -> str:
        return "in-place" if self.inplace else "out-of-place"

    @property
    def identity(self) -> CaseId:
        """The case identity, with only SWEEP_CASE_FIELDS set (records match on .only())."""
        return CaseId(collective=self.collective, backend=self.backend, dtype=self.dtype,
                      op=self.op, inplace=self.inplace, timing=self.timing, root=self.root,
                      world_size=self.world_size, nodes=self.nodes,
                      ranks_per_node=self.ranks_per_node)


@dataclass(frozen=True, slots=True)
class Task:
    """The cases one array task runs, all on one allocation shape."""

    task_id: int
    nodes: int
    ranks_per_node: int
    cases: tuple[SweepCase, ...]


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
    bench: dict[str, int | float | str] = field(default_factory=dict)   # BENCH_OPTIONS given
    case_timeout: float = CASE_TIMEOUT_S
    launcher: str = "auto"
    mpiexec: str | None = None
    group_by: list[str] = field(default_factory=lambda: ["backend"])
    results: str = ""
    env: dict[str, str] = field(default_factory=dict)
    slurm: SlurmBlock = field(default_factory=SlurmBlock)
    description: str = ""
    source: str = ""               # the file it came from, for messages

    # -- the cross product --------------------------------------------------------------------
    def cases(self) -> list[SweepCase]:
        seen: set[CaseId] = set()
        out: list[SweepCase] = []
        for nodes, rpn, backend, collective, dtype, op, mode in itertools.product(
                self.nodes, self.ranks_per_node, self.backends, self.collectives, self.dtypes,
                self.ops, self.modes):
            # the benchmark measures a one-buffer collective (broadcast) in place only, and
            # skips sizes whose per-rank count rounds down to zero: a case asks only for what
            # can produce a record
            inplace = get_collective(collective).modes((mode == "in-place",))[0]
            sizes = measurable_sizes(collective, dtype, nodes * rpn, self.sizes)
            case = SweepCase(collective=collective, backend=backend, dtype=dtype,
                             op=op if collective in REDUCING else None, inplace=inplace,
                             timing=self.timing, nodes=nodes, ranks_per_node=rpn, sizes=sizes,
                             root=int(self.bench.get("root", 0)))
            if sizes and case.identity not in seen:   # non-reducing collectives collapse over ops
                seen.add(case.identity)
                out.append(case)
        return out

    def tasks(self) -> list[Task]:
        """Cases grouped by allocation shape, then by `group_by`; ids are stable for a file."""
        groups: dict[tuple[Any, ...], list[SweepCase]] = {}
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

    # open-shaped: the sweep file's keys, the bench options' registry (BENCH_KEYS) among them
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

_SWEEP_CAP = 16 << 20       # a sweep file is a page of YAML


def load_sweep(path: str | os.PathLike[str]) -> Sweep:
    """Read and validate a sweep file; any problem is `<file>: <key>: ...` (UsageError)."""
    where = str(path)
    try:
        text = read_input(path, cap=_SWEEP_CAP, fixed="a sweep file is a page of YAML"
                          ).decode("utf-8")
    except FileNotFoundError:
        raise UsageError(f"{where}: no such sweep file") from None
    except OSError as exc:
        raise UsageError(f"{where}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{where}: not a sweep file (not UTF-8 text)") from None
    try:
        data = load_yaml(where, text)
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
        except BackendUnavailable as exc:     # a skipped plugin (or transport): its reason
            raise check.fail("backends", str(exc)) from None
        except UsageError:
            raise check.fail("backends", str(choices_error(
                "backend", name, [*backend_names(), "<algorithm>@<transport>"]))) from None
    return list(dict.fromkeys(names))


# data open-shaped: a sweep file's YAML before it is checked
def sweep_from_dict(data: Mapping[str, Any], where: str = "sweep",
                    default_name: str = "sweep") -> Sweep:
    check = _Checker(where)
    unknown = [key for key in data if key not in TOP_KEYS]
    if unknown:
        raise check.fail(str(unknown[0]), f"unknown key (valid: {', '.join(TOP_KEYS)})")
    name = _check_name(check, data.get("name", default_name))
    mpiexec = data.get("mpiexec")
    sweep = Sweep(
        name=name,
        collectives=_check_collectives(check, data.get("collectives", "allreduce")),
        backends=_check_backends(check, data.get("backends", HOST_BACKEND)),
        dtypes=_check_dtypes(check, data.get("dtypes", "float32")),
        ops=check.choices("ops", data.get("ops", "sum"), OPS),
        sizes=_check_sizes(check, data.get("sizes", "1K-16M")),
        nodes=check.positive_ints("nodes", data.get("nodes", 1)),
        ranks_per_node=check.positive_ints("ranks_per_node", data.get("ranks_per_node", 2)),
        modes=check.choices("modes", data.get("modes", list(MODES)), MODES),
        timing=_check_choice(check, "timing", data.get("timing", "per-op"), TIMINGS),
        bench=_check_bench_options(check, data),
        case_timeout=float(check.number("case_timeout",
                                        data.get("case_timeout", CASE_TIMEOUT_S), 1)),
        launcher=_check_choice(check, "launcher", data.get("launcher", "auto"), LAUNCHERS),
        mpiexec=check.text("mpiexec", mpiexec) if mpiexec is not None else None,
        group_by=check.choices("group_by", data.get("group_by", ["backend"]), TASK_GROUP_KEYS),
        results=check.text("results", data.get("results", f"results/{name}")),
        env=_check_env(check, data.get("env", {}) or {}),
        slurm=check_slurm_options(check, data.get("slurm", {}) or {}),
        description=check.text("description", data.get("description", "")),
        source=where,
    )
    _check_root(check, sweep)
    return sweep


def _check_name(check: _Checker, value: Any) -> str:
    name = check.text("name", value)
    if not _NAME_RE.match(name):
        raise check.fail("name", f"{name!r}: use letters, digits, '.', '_' and '-' "
                                 "(it names files and jobs)")
    return name


def _check_collectives(check: _Checker, value: Any) -> list[str]:
    if value == "all":
        return list(COLLECTIVES)
    return check.choices("collectives", value, COLLECTIVES,
                         normalize=lambda s: _safe_collective(s))


def _check_dtypes(check: _Checker, value: Any) -> list[str]:
    from ccbench.dtypes import DTYPES

    if value == "all":
        return list(DTYPES)
    return check.choices("dtypes", value, list(DTYPES), normalize=_canonical_dtype)


def _check_sizes(check: _Checker, value: Any) -> list[int]:
    if isinstance(value, list):
        value = ",".join(str(s) for s in value)
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise check.fail("sizes", f"expected a size spec like 1K-16M, got {value!r}")
    try:
        return list(dict.fromkeys(parse_sizes(value)))
    except UsageError as exc:
        raise check.fail("sizes", str(exc)) from None


def _check_bench_options(check: _Checker, data: Mapping[str, Any]) -> dict[str, int | float | str]:
    """The table's options the file sets, checked as the command line's flags are (the same
    limits and cross-option rules, in the file's words)."""
    bench: dict[str, int | float | str] = {}
    for option in BENCH_OPTIONS:
        if data.get(option.name) is not None:
            try:
                bench[option.name] = option.check(data[option.name])
            except ValueError as exc:
                raise check.fail(option.name, str(exc)) from None
    found = conflict(bench)
    if found is not None:
        raise check.fail(found.option, found.message(str))
    return bench


def _check_choice(check: _Checker, key: str, value: Any, valid: Sequence[str]) -> str:
    text = check.text(key, value)
    if text not in valid:
        raise check.fail(key, str(choices_error(key, text, valid)))
    return text


def _check_env(check: _Checker, value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise check.fail("env", f"expected a mapping NAME: value, got {value!r}")
    env: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not _ENV_RE.match(key):
            raise check.fail("env", f"{key!r} is not a variable name")
        env[key] = check.text(f"env: {key}", item)
    return env


def _check_root(check: _Checker, sweep: Sweep) -> None:
    """The root is a rank of every world size the sweep runs."""
    smallest = min(sweep.nodes) * min(sweep.ranks_per_node)
    root = int(sweep.bench.get("root", 0))
    if root >= smallest:
        raise check.fail("root", f"{root} is not a rank of the smallest world size "
                                 f"{smallest} (valid: 0 to {smallest - 1})")


def _safe_collective(name: str) -> str:
    try:
        return canonical_collective(name)
    except UsageError:
        return name


_TIME_RE = re.compile(r"^(\d+|\d+:\d{1,2}(:\d{1,2})?|\d+-\d{1,2}(:\d{1,2}(:\d{1,2})?)?)$")


def check_slurm_options(check: _Checker, value: Any) -> SlurmBlock:
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
    return cast(SlurmBlock, out)       # its keys are SLURM_KEYS, checked above


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


