"""What a sweep has done, kept in files beside its results: records, skipped sizes, the case
each task runs now, and the lock that makes one writer per task file.

State files (task-<i>.skipped, task-<i>.current) are JSON lines / JSON with a version:

1 -- a case was a list of values in a fixed order (collective, backend, dtype, op, in-place,
     nodes, ranks per node); read still.
2 -- a case is an object keyed by SweepCase field names: {"version": 2, "case": {...}, ...}.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ccbench.errors import UsageError
from ccbench.records import CaseId, Record, iter_result_files, load_records
from ccbench.sweep.spec import SWEEP_CASE_FIELDS, Sweep, SweepCase

__all__ = ["STATE_VERSION", "done_sizes", "load_sweep_records", "skipped_file", "load_skipped",
           "write_skipped", "completed", "task_lock", "task_is_locked", "current_case_file",
           "write_current_cases", "read_current_cases", "result_files"]

STATE_VERSION = 2
_V1_CASE_ORDER = ("collective", "backend", "dtype", "op", "inplace", "nodes", "ranks_per_node")

DoneSizes = dict[CaseId, set[int]]     # sweep case identity -> sizes asked


def done_sizes(records: Iterable[Record]) -> DoneSizes:
    """Sizes measured per sweep case; a record with wrong elements does not count as done."""
    done: DoneSizes = {}
    for record in records:
        if (record.wrong or 0) > 0:
            continue
        done.setdefault(record.case.only(SWEEP_CASE_FIELDS), set()).add(record.size_asked)
    return done


def load_sweep_records(sweep: Sweep) -> list[Record]:
    if not sweep.results_dir.is_dir():
        return []
    return load_records(sweep.results_dir)


def skipped_file(sweep: Sweep, task_id: int) -> Path:
    # not *.jsonl: results readers (load_records, merge) must not take it for records
    return sweep.results_dir / f"task-{task_id}.skipped"


def _case_from_state(sweep: Sweep, value: Any) -> CaseId:
    """A case as a state file stores it: version 2 an object, version 1 a list."""
    if isinstance(value, list):                      # version 1
        fields = dict(zip(_V1_CASE_ORDER, value, strict=True))
        fields.update(timing=sweep.timing, root=0,
                      world_size=int(fields["nodes"]) * int(fields["ranks_per_node"]))
    elif isinstance(value, dict):
        fields = value
    else:
        raise TypeError("a case is an object")
    return CaseId(**fields).only(SWEEP_CASE_FIELDS)


def _case_to_state(case: SweepCase) -> dict[str, Any]:
    return {name: getattr(case.identity, name) for name in SWEEP_CASE_FIELDS}


def write_skipped(sweep: Sweep, task_id: int, case: SweepCase, sizes: Iterable[int]) -> None:
    with open(skipped_file(sweep, task_id), "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"version": STATE_VERSION, "case": _case_to_state(case),
                                 "sizes": list(sizes)}) + "\n")


def load_skipped(sweep: Sweep) -> DoneSizes:
    """Sizes a successful run produced no record for (a backend's `unsupported`, say)."""
    skipped: DoneSizes = {}
    if not sweep.results_dir.is_dir():
        return skipped
    for path in sorted(sweep.results_dir.glob("task-*.skipped")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                if entry.get("version", 1) not in (1, STATE_VERSION):
                    raise UsageError(f"{path}:{number}: unknown state version "
                                     f"{entry.get('version')!r} (this ccbench reads 1, 2)")
                key = _case_from_state(sweep, entry["case"])
                sizes = {int(size) for size in entry["sizes"]}
            except (ValueError, KeyError, TypeError, AttributeError):
                raise UsageError(f"{path}:{number}: not a skipped-sizes entry") from None
            skipped.setdefault(key, set()).update(sizes)
    return skipped


def completed(sweep: Sweep) -> tuple[DoneSizes, DoneSizes]:
    """(done, skipped): per sweep case, the sizes with a record, and those a successful run
    left without one. Both count as complete."""
    done = done_sizes(load_sweep_records(sweep))
    skipped = load_skipped(sweep)
    merged = {key: set(sizes) for key, sizes in done.items()}
    for key, sizes in skipped.items():
        merged.setdefault(key, set()).update(sizes)
    return merged, skipped


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


def write_current_cases(sweep: Sweep, task_id: int, cases: Iterable[SweepCase]) -> None:
    current_case_file(sweep, task_id).write_text(json.dumps(
        {"version": STATE_VERSION, "cases": [_case_to_state(c) for c in cases]}) + "\n")


def read_current_cases(sweep: Sweep, task_id: int) -> set[CaseId]:
    """The cases a task runs now; empty when unknown (no marker, or one unreadable)."""
    try:
        data = json.loads(current_case_file(sweep, task_id).read_text(encoding="utf-8"))
        if isinstance(data, list):                   # version 1: a list of case objects
            return {_case_from_state(sweep, [c[k] for k in _V1_CASE_ORDER]) for c in data}
        return {_case_from_state(sweep, c) for c in data["cases"]}
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def result_files(sweep: Sweep) -> list[Path]:
    if not sweep.results_dir.is_dir():
        return []
    return list(iter_result_files([sweep.results_dir]))
