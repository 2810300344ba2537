"""One cell of the fault matrix (tests/test_fault.py, tests/test_fault_replay.py and
scripts/fault_matrix.py): launch a small run with a fault planned at one of the fault points
ranks call (ccbench/run/faults.py), then check what a user would see: a non-zero exit, exactly
one `ccbench: error:` line naming the phase and the rank that did not arrive, no process of
the run left, every record on disk whole."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ccbench.errors import UsageError, is_error_line
from ccbench.run.launchers import mpiexec_beside
from ccbench.run.supervisor import kill_group

__all__ = ["LAUNCHERS", "Cell", "Outcome", "run_cell", "tagged_processes"]

# what the error line must name for each phase (the label of the step that stopped)
PHASE_WORDS = {"before-connect": ("start-up",), "start-up": ("start-up",),
               "init": ("initialisation", "start-up"),
               "mid-run": ("allreduce",), "shutdown": ("end of the run",)}


# how the ranks are started: `ccbench launch`, or a bare launcher a user would type
LAUNCHERS = ("launch", "mpiexec", "srun", "torchrun")


@dataclass(frozen=True, slots=True)
class Cell:
    backend: str
    world_size: int
    victim: int
    action: str
    phase: str
    launcher: str = "launch"
    # the interpreter that runs ccbench (and whose venv holds the mpiexec): another MPI's venv
    python: str = sys.executable

    @property
    def name(self) -> str:
        via = "" if self.launcher == "launch" else f"{self.launcher}-"
        return (f"{via}{self.backend}-n{self.world_size}-{self.phase}-{self.action}-"
                f"rank{self.victim}")

    def command(self, bench: list[str]) -> list[str]:
        """The command line that starts the ranks."""
        n = str(self.world_size)
        python = [self.python, "-m", "ccbench", *bench]
        beside = Path(self.python).parent
        if self.launcher == "launch":
            return [self.python, "-m", "ccbench", "launch", "-n", n, *bench]
        if self.launcher == "mpiexec":
            return [mpiexec_beside(self.python) or "mpiexec", "-n", n, *python]
        if self.launcher == "srun":
            return ["srun", "-n", n, *python]
        if self.launcher == "torchrun":
            return [str(beside / "torchrun"), "--standalone", "--nproc-per-node", n, "-m",
                    "ccbench", *bench]
        raise UsageError(f"unknown launcher {self.launcher!r} (valid: {', '.join(LAUNCHERS)})")


@dataclass(slots=True)
class Outcome:
    cell: Cell
    status: int | None
    stop_s: float | None            # from the fault to the launcher's exit
    error_lines: list[str]
    leftovers: list[int]
    records_ok: bool
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def run_cell(cell: Cell, workdir: Path, timeout: float = 5.0, bound: float = 240.0
             ) -> Outcome:
    """Launch a small run with the fault planned, wait (at most `bound` seconds), then check:
    non-zero exit, exactly one error line naming the phase and the victim, no process of the
    run left, every record on disk whole."""
    tag = f"ccbench-fault-{uuid.uuid4().hex[:10]}"
    out, log = workdir / f"{cell.name}.jsonl", workdir / f"{cell.name}.time"
    for old in (out, log):
        old.unlink(missing_ok=True)
    cmd = cell.command(["allreduce", "--backend", cell.backend, "--sizes", "1K-32K", "--iters",
                        "3", "--warmup", "1", "--timeout", f"{timeout:g}", "-q", "--output",
                        str(out)])
    env = {**os.environ, "CCBENCH_FAULT": f"{cell.phase}:{cell.victim}:{cell.action}",
           "CCBENCH_FAULT_LOG": str(log), "CCBENCH_FAULT_TAG": tag}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=bound)
        ended = time.time()
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        _, stderr = proc.communicate()
        ended = None
    time.sleep(0.5)
    leftovers = tagged_processes(tag)
    for pid in leftovers:                # clean up after a failed cell, then report it
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    fault_at = float(log.read_text().split()[0]) if log.exists() else None
    stop = ended - fault_at if ended is not None and fault_at is not None else None
    errors = [line for line in stderr.splitlines() if is_error_line(line)]
    outcome = Outcome(cell, proc.returncode if ended is not None else None, stop, errors,
                      leftovers, _records_whole(out))
    outcome.problems = _judge(outcome, stderr, fault_at)
    return outcome


def _judge(outcome: Outcome, stderr: str, fault_at: float | None) -> list[str]:
    cell, problems = outcome.cell, []
    if outcome.status is None:
        problems.append("hung: still running at the bound")
    elif outcome.status == 0:
        problems.append("exit status 0")
    if fault_at is None:
        problems.append("the fault never happened")
    if outcome.leftovers:
        problems.append(f"processes left: {outcome.leftovers}")
    if len(outcome.error_lines) != 1:
        problems.append(f"{len(outcome.error_lines)} error lines")
    if own_traceback(stderr):
        problems.append("a traceback")
    if not outcome.records_ok:
        problems.append("a torn or invalid record")
    if outcome.error_lines:
        line = outcome.error_lines[0]
        if not any(word in line for word in PHASE_WORDS[cell.phase]):
            problems.append(f"phase not named: {line}")
        named = re.search(r"did not arrive: (.*)$", line)
        ranks = {int(r) for r in re.findall(r"(?<![\w.:])(\d+)(?![\w.:])", named.group(1))} \
            if named else set()
        if ranks != {cell.victim}:
            problems.append(f"named ranks {sorted(ranks)}, not [{cell.victim}]: {line}")
    return problems


# a frame in ccbench's own package: its folder exactly, since a checkout named `ccbench`
# holds the venv whose torchrun frames must not count
_OWN_FRAME = re.compile(r'File "' + re.escape(str(Path(__file__).resolve().parent.parent
                                                   / "ccbench")) + r'[/\\]')


def own_traceback(stderr: str) -> bool:
    """A Python traceback through ccbench's code (torchrun prints one of its own, from the
    launcher's process, whenever a worker fails: not ours to judge)."""
    return "Traceback" in stderr and _OWN_FRAME.search(stderr) is not None


def _records_whole(path: Path) -> bool:
    if not path.exists():
        return True
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        return False
    try:
        return all(isinstance(json.loads(line), dict) for line in data.splitlines() if line)
    except ValueError:
        return False


def tagged_processes(tag: str) -> list[int]:
    """Processes whose environment carries `tag` (everything a cell started)."""
    needle = f"CCBENCH_FAULT_TAG={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found
