"""The output-file policy: which files a run may append records to or (over)write, checked
before any rank starts (--output, -O, simulate -o, merge -o, calibrate -o, report -o), and
where a run that names none keeps its records (a new file of ccbench-results/ or
CCBENCH_RESULTS) and says so."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from ccbench.errors import UsageError
from ccbench.records import SCHEMA
from ccbench.records.table import PARQUET_SUFFIX, journal_path, read_parquet
from ccbench.safeio import check_not_symlink

__all__ = ["MAIN_JOB_FOLDER", "OUTPUT_SUFFIXES", "RESULTS_VAR", "check_holds_records",
           "check_output_file", "check_output_folder", "check_writable_file", "default_output",
           "new_records_file", "records_folder", "records_line", "say_where_records_are",
           "wants_default_output"]

_PEEK_BYTES = 1 << 16


#: what --output writes: JSON lines (`.json` as nccl-tests' -J names it) or Parquet
OUTPUT_SUFFIXES = (".jsonl", ".json", PARQUET_SUFFIX)


def check_output_file(path: str) -> None:
    """Refuse an --output that cannot take records, before anything runs: a name whose suffix
    names another format, a missing folder, a folder, a file we may not write, or a file that
    already holds something else."""
    target = Path(path)
    where = f"--output {path!r}"
    check_not_symlink(path, "--output")
    if not path.endswith(OUTPUT_SUFFIXES) and not target.is_dir():
        suffix = repr("".join(target.suffixes[-2:])) if target.suffix else "a name without one"
        raise UsageError(f"{where}: records are written as JSON lines or Parquet, not "
                         f"{suffix} (valid suffixes: {', '.join(OUTPUT_SUFFIXES)}; for CSV "
                         f"use --format csv > FILE.csv)")
    if path.endswith(PARQUET_SUFFIX) and not target.is_dir():
        check_holds_records(path, "--output")   # a file that is not ccbench Parquet: refused now
        check_output_file(journal_path(path))   # where the run appends until it ends
        return
    if target.is_dir():
        raise UsageError(f"{where} is a directory (valid: a file such as {path.rstrip('/')}/"
                         f"results.jsonl)")
    parent = target.parent
    if not parent.is_dir():
        raise UsageError(f"{where}: folder {str(parent)!r} does not exist (create it first)")
    if not target.exists():
        if not os.access(parent, os.W_OK | os.X_OK):
            raise UsageError(f"{where}: cannot create a file in {str(parent)!r} (permission "
                             f"denied)")
        return
    if not target.is_file():
        raise UsageError(f"{where} is not a regular file (valid: a .jsonl results file)")
    if not os.access(target, os.W_OK):
        raise UsageError(f"{where} is not writable (permission denied)")
    check_holds_records(path, "--output")


def check_holds_records(path: str, flag: str) -> None:
    """Refuse an output that already holds something other than ccbench records (a regular
    file that is not empty, not a records file, not ccbench Parquet): the one check of every
    command that appends to or replaces a records file (-O, simulate -o, merge -o)."""
    target = Path(path)
    if not target.is_file():
        return
    if path.endswith(PARQUET_SUFFIX):
        read_parquet(target)
        return
    first = _first_line(target)
    if first is not None and not _is_record_line(first):
        raise UsageError(f"{flag} {path!r} already holds something that is not ccbench records "
                         f"(first line {first[:40]!r}); records are only written to an empty "
                         f"file or a ccbench results file")


#: where a measuring run keeps its records when no --output is given: this folder of the
#: working directory, or the folder named by CCBENCH_RESULTS
MAIN_JOB_FOLDER = "ccbench-results"
RESULTS_VAR = "CCBENCH_RESULTS"


def records_folder() -> str:
    return os.environ.get(RESULTS_VAR) or MAIN_JOB_FOLDER


def wants_default_output(args: Any) -> bool:
    """No records file named (--output, -O, nccl-tests' -J) and none refused (--no-output):
    the run keeps its records in a new file of records_folder()."""
    return not (args.output or getattr(args, "json_output", None)
                or getattr(args, "no_output", False))


def new_records_file() -> str | None:
    """A new records file, records_folder()/ccbench-<UTC time>-<id>.jsonl, its folder made
    now; None, after a one-line note, where that folder cannot be made (the run still prints
    its table). The one place every measuring run (`ccbench launch`, torchrun, mpiexec, srun
    or one bare rank) gets its default --output."""
    import datetime
    import uuid

    folder = records_folder()
    try:
        os.makedirs(folder, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(13, "permission denied")
    except OSError as exc:
        print(f"ccbench: warning: cannot keep records in {folder!r} ({exc.strerror or exc}); "
              f"this run only prints them (name a file with -O FILE.jsonl, or a folder with "
              f"{RESULTS_VAR}=DIR)", file=sys.stderr, flush=True)
        return None
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return os.path.join(folder, f"ccbench-{stamp}-{uuid.uuid4().hex[:6]}.jsonl")


def default_output(args: Any) -> str | None:
    """The records file of a run whose command line names none (wants_default_output)."""
    return new_records_file() if wants_default_output(args) else None


def records_line(path: str, so_far: bool = False) -> str:
    """Where a run's records are and the report command; `so_far` for a run that failed (the
    line then comes before its error line, which stays the last one)."""
    report = os.path.join(os.path.dirname(path), "report")
    return (f"ccbench: records {'so far ' if so_far else ''}in {path}; figures and tables: "
            f"ccbench report {path} -o {report}")


def say_where_records_are(path: str) -> None:
    """The line that ends a run that chose its records file: where they are, and the report
    command."""
    print(records_line(path), file=sys.stderr, flush=True)


def check_writable_file(path: str, flag: str = "-o") -> None:
    """A file about to be (over)written, e.g. a model: its folder exists, it is no folder and
    no symbolic link (safeio.write_atomic then replaces it whole)."""
    target = Path(path)
    check_not_symlink(path, flag)
    if target.is_dir():
        raise UsageError(f"{flag} {path!r} is a directory (valid: a file path such as "
                         f"{path.rstrip('/')}/model.json)")
    if not target.parent.is_dir():
        raise UsageError(f"{flag} {path!r}: folder {str(target.parent)!r} does not exist "
                         f"(create it first)")
    if not os.access(target if target.exists() else target.parent, os.W_OK):
        raise UsageError(f"{flag} {path!r} is not writable (permission denied)")


def check_output_folder(path: str, flag: str = "-o") -> None:
    """A folder that will be created or written into: not an existing file, and its parent
    exists."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise UsageError(f"{flag} {path!r} is an existing file, not a folder (valid: a new or "
                         f"existing folder for the figures)")
    if not target.exists() and not target.parent.is_dir():
        raise UsageError(f"{flag} {path!r}: folder {str(target.parent)!r} does not exist "
                         f"(create it first)")


def _first_line(path: Path) -> str | None:
    with open(path, "rb") as handle:
        head = handle.read(_PEEK_BYTES)
    for raw in head.split(b"\n"):
        if raw.strip():
            return raw.decode("utf-8", errors="replace")
    return None


def _is_record_line(line: str) -> bool:
    if len(line) >= _PEEK_BYTES - 1:       # longer than we peeked: judge by its start
        return line.lstrip().startswith("{") and f'"schema":"{SCHEMA}"' in line.replace(" ", "")
    try:
        data = json.loads(line)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("schema") == SCHEMA
