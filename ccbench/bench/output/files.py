"""What rank 0 prints: an nccl-tests style table (out-of-place and in-place side by side),
JSON lines, or CSV; the progress bar on stderr; and the checks on the results file it appends
to (before any rank starts, and the repair of a torn last line before the first append)."""

from __future__ import annotations

import csv
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO, cast

from ccbench.collectives import ROOTED
from ccbench.errors import UsageError
from ccbench.records import SCHEMA, Record
from ccbench.records.table import (
    PARQUET_SUFFIX,
    TIME_STATS,
    flat_row,
    journal_path,
    read_parquet,
)
from ccbench.safeio import check_not_symlink

__all__ = ["Progress", "TableWriter", "check_holds_records", "check_output_file", "check_output_folder",
           "check_writable_file", "default_output", "make_writer", "new_records_file",
           "records_line", "say_where_records_are", "wants_default_output"]

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


# every scalar field of a record, every time statistic; the same names as ccbench.load's columns
_CSV_FIELDS = (
    "collective", "backend", "library", "library_version", "algorithm", "transport", "device",
    "dtype", "op", "inplace", "timing", "world_size", "nodes", "ranks_per_node", "hosts", "root",
    "size_asked", "size_used", "count", "iterations", "warmup",
    *(f"time_{stat}_us" for stat in TIME_STATS), "algbw_gbps", "busbw_gbps", "wrong",
    "run_id", "timestamp", "ccbench_version")


class TableWriter:
    """Rows appear as soon as both modes of a size are done. `full` (OSU's -f) adds, per mode,
    the smallest and the largest of the ranks' own median times: how far apart ranks were."""

    def __init__(self, stream: TextIO | None = None, full: bool = False) -> None:
        self.stream = stream or sys.stdout     # looked up now: a rank may have replaced it
        self.full = full
        self.busbw_sum = 0.0
        self.busbw_count = 0
        self._pending: dict[tuple[object, ...], dict[bool, Record]] = {}

    def header(self, title: str) -> None:
        self.busbw_sum, self.busbw_count = 0.0, 0       # the footer averages this table only
        spread = f" {'rank min':>10} {'rank max':>10}" if self.full else ""
        units = f" {'(us)':>10} {'(us)':>10}" if self.full else ""
        half = f"{'time':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>6}{spread}"
        width = len(half)
        print(f"#\n# {title}\n#", file=self.stream)
        if self.full:
            print("# rank min, rank max: the fastest and the slowest rank's own median time; "
                  "time: the median of each call's\n# combined time (the slowest rank per call "
                  "unless --combine), so time >= rank max with the default", file=self.stream)
        print(f"# {'':>10} {'':>11} {'':>8} {'':>6} {'':>4}   {'out-of-place':^{width}}   "
              f"{'in-place':^{width}}", file=self.stream)
        print(f"# {'size':>10} {'count':>11} {'type':>8} {'redop':>6} {'root':>4}   {half}   "
              f"{half}", file=self.stream)
        print(f"# {'(B)':>10} {'(elements)':>11} {'':>8} {'':>6} {'':>4}   "
              f"{'(us)':>10} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}{units}   "
              f"{'(us)':>10} {'(GB/s)':>7} {'(GB/s)':>7}{' ' * 7 if self.full else ''}{units}",
              file=self.stream, flush=True)

    def note(self, text: str) -> None:
        print(f"# {text}", file=self.stream, flush=True)

    def add(self, record: Record, modes: tuple[bool, ...]) -> None:
        self.busbw_sum += record.busbw_gbps
        self.busbw_count += 1
        key = (record.collective, record.dtype, record.op, record.size_asked)
        done = self._pending.setdefault(key, {})
        done[record.inplace] = record
        if all(mode in done for mode in modes):
            del self._pending[key]
            self._row(done)

    def _row(self, by_mode: dict[bool, Record]) -> None:
        first = next(iter(by_mode.values()))
        cells = []
        for inplace in (False, True):
            rec = by_mode.get(inplace)
            if rec is None:
                empty = f" {'-':>10} {'-':>10}" if self.full else ""
                cells.append(f"{'-':>10} {'-':>7} {'-':>7} {'-':>6}{empty}")
                continue
            wrong = "N/A" if rec.wrong is None else str(rec.wrong)
            spread = ""
            if self.full:
                ranks = rec.rank_median_us or [rec.time_us["median"]]
                spread = f" {min(ranks):>10.2f} {max(ranks):>10.2f}"
            cells.append(f"{rec.time_us['median']:>10.2f} {rec.algbw_gbps:>7.3f} "
                         f"{rec.busbw_gbps:>7.3f} {wrong:>6}{spread}")
        root = str(first.root) if first.collective in ROOTED else "-1"   # as nccl-tests
        print(f"  {first.size_used:>10} {first.count:>11} {first.dtype:>8} {first.op or 'none':>6} "
              f"{root:>4}   {cells[0]}   {cells[1]}", file=self.stream, flush=True)

    def footer(self, num_wrong: int | None) -> None:
        """`num_wrong` None: nothing was validated (--check 0), so nothing is called OK."""
        average = self.busbw_sum / self.busbw_count if self.busbw_count else 0.0
        if num_wrong is None:
            verdict = "not checked (--check 0)"
        else:
            verdict = f"{num_wrong} {'OK' if num_wrong == 0 else 'FAILED'}"
        print(f"# Out of bounds values : {verdict}", file=self.stream)
        print(f"# Avg bus bandwidth    : {average:.5g}\n#", file=self.stream, flush=True)


class JsonWriter(TableWriter):
    def header(self, title: str) -> None:
        pass

    def note(self, text: str) -> None:
        print(f"# {text}", file=sys.stderr, flush=True)

    def add(self, record: Record, modes: tuple[bool, ...]) -> None:
        print(record.to_json(), file=self.stream, flush=True)

    def footer(self, num_wrong: int | None) -> None:
        pass


class CsvWriter(JsonWriter):
    """One CSV row per record; the header comes with the first row (rank 0 is the one that
    writes rows, so no other rank prints a header)."""

    def add(self, record: Record, modes: tuple[bool, ...]) -> None:
        out = csv.writer(self.stream)          # self.stream may be swapped for a bar-safe one
        if not getattr(self, "_header_done", False):
            out.writerow(_CSV_FIELDS)
            self._header_done = True
        row = flat_row(record, lists=False)
        out.writerow([row[name] for name in _CSV_FIELDS])
        self.stream.flush()


class OsuWriter(TableWriter):
    """OSU's columns, for a run named by an OSU program (osu_allreduce ...): `# Size  Avg
    Latency(us)`, with -f also Min, Max and Iterations. One statistic throughout, as OSU's:
    each rank's own time per call (its median), averaged over the ranks, and the smallest and
    largest of them, so min <= avg <= max. OSU measures out of place: in-place rows only for a
    collective that has no other mode."""

    def header(self, title: str) -> None:
        print(f"# {title}\n# latency: each rank's median time per call; Avg over the ranks"
              f"{', Min and Max of them' if self.full else ''}", file=self.stream)
        extra = (f"{'Min Latency(us)':>18}{'Max Latency(us)':>18}{'Iterations':>12}"
                 if self.full else "")
        print(f"# {'Size':<10}{'Avg Latency(us)':>18}{extra}", file=self.stream, flush=True)

    def add(self, record: Record, modes: tuple[bool, ...]) -> None:
        if record.inplace and False in modes:
            return
        ranks = record.rank_median_us or [record.time_us["median"]]
        extra = (f"{min(ranks):>18.2f}{max(ranks):>18.2f}{record.iterations:>12}"
                 if self.full else "")
        print(f"{record.size_used:<12}{sum(ranks) / len(ranks):>18.2f}{extra}",
              file=self.stream, flush=True)

    def footer(self, num_wrong: int | None) -> None:
        if num_wrong:
            print(f"# {num_wrong} wrong values: FAILED", file=self.stream, flush=True)


def make_writer(fmt: str, full: bool = False) -> TableWriter:
    """`full` changes the tables only: JSON and CSV rows hold every statistic anyway. "osu" is
    the table of a run named by an OSU program."""
    writers: dict[str, type[TableWriter]] = {"table": TableWriter, "osu": OsuWriter,
                                             "json": JsonWriter, "csv": CsvWriter}
    return writers[fmt](full=full)


def _is_terminal(stream: TextIO, variable: str) -> bool:
    """Under `ccbench launch` (and its mpiexec) a rank's streams may be pipes to the launcher,
    which says in `variable` whether its own stream is a terminal."""
    try:
        return stream.isatty() or os.environ.get(variable) == "1"
    except ValueError:                    # a closed stream
        return False


class _BarSafeStream:
    """Table rows on the terminal the bar is drawn on: each whole line is written with the bar
    cleared and redrawn after it, so a row and the bar never share a line."""

    def __init__(self, stream: TextIO, bar: Any) -> None:
        self._stream, self._bar, self._partial = stream, bar, ""

    def write(self, text: str) -> int:
        self._partial += text
        if "\n" in self._partial:
            whole, _, self._partial = self._partial.rpartition("\n")
            self._bar.clear()
            self._stream.write(whole + "\n")
            self._stream.flush()
            self._bar.refresh()
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return True


class Progress:
    """How far the run is, on rank 0 unless --quiet.

    On a terminal: a tqdm bar of sizes drawn on the terminal the table goes to (rows pass
    through `rows()`, which clears the bar for each row), with the iteration inside the current
    size shown when a size takes a while. Without a terminal: one short status line on stderr
    every CCBENCH_STATUS_INTERVAL seconds (default 30) while the run lasts."""

    def __init__(self, total: int, enabled: bool) -> None:
        self._bar: Any = None
        self._total, self._done, self._label = total, 0, ""
        self._inner: tuple[int, int] | None = None
        self._start = self._shown = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if not enabled:
            return
        stdout_tty = _is_terminal(sys.stdout, "CCBENCH_STDOUT_TTY")
        if stdout_tty or _is_terminal(sys.stderr, "CCBENCH_STDERR_TTY"):
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=total, unit="size", file=sys.stdout if stdout_tty
                             else sys.stderr, leave=False, dynamic_ncols=True)
            self._bar_on_stdout = stdout_tty
            return
        interval = float(os.environ.get("CCBENCH_STATUS_INTERVAL", "30"))
        self._thread = threading.Thread(target=self._report, args=(interval,), daemon=True,
                                        name="ccbench-status")
        self._thread.start()

    def rows(self, stream: TextIO) -> TextIO:
        """The stream the table should print to: bar-safe when the bar shares it."""
        if self._bar is not None and self._bar_on_stdout and stream is sys.stdout:
            return cast(TextIO, _BarSafeStream(stream, self._bar))
        return stream

    def step(self, label: str) -> None:
        """One size finished; `label` names it."""
        self._done += 1
        self._inner = None
        self._label = label
        if self._bar is not None:
            self._bar.set_description(label, refresh=False)
            self._bar.set_postfix_str("", refresh=False)
            self._bar.update(1)

    def sample(self, label: str, done: int, total: int) -> None:
        """Inside a size: `done` of `total` iterations (shown at most twice a second)."""
        self._label, self._inner = label, (done, total)
        now = time.monotonic()
        if self._bar is not None and now - self._shown > 0.5:
            self._shown = now
            self._bar.set_description(label, refresh=False)
            self._bar.set_postfix_str(f"iteration {done}/{total}")

    def status_line(self) -> str:
        elapsed = time.monotonic() - self._start
        inner = f", iteration {self._inner[0]}/{self._inner[1]}" if self._inner else ""
        now = f"; now {self._label}{inner}" if self._label else ""
        return (f"ccbench: {self._done}/{self._total} sizes done{now} "
                f"({int(elapsed // 60)}m{int(elapsed % 60):02d}s)")

    def _report(self, interval: float) -> None:
        while not self._stop.wait(interval):
            print(self.status_line(), file=sys.stderr, flush=True)

    def close(self) -> None:
        self._stop.set()
        if self._bar is not None:
            self._bar.close()
