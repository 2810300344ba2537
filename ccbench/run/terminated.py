"""SIGTERM to a torchrun worker before its watchdog runs (while it imports, before the control
store is up): one line, not a silent death.

torchrun's workers have nothing else to say it: the worker dies of the signal's default
action, torchrun sees it go and stops the others (SIGTERM again), and no rank of ccbench has
printed anything. From the start of `python -m ccbench` (ccbench.__main__) until the watchdog
takes SIGTERM over (ccbench.run.watchdog), SIGTERM raises `Terminated`, and the rank that got
it says so in one line and exits 128 + 15. A rank whose peer of the same run (a sibling below
the same torchrun, ccbench.run.stopped) has already ended is being stopped by torchrun because
of that peer: it leaves without a line. Limit: SIGTERM to torchrun itself reaches every worker
at once, and each worker that finds all its peers still running says it was terminated.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from ccbench.run import procfs

__all__ = ["Terminated", "install", "leave", "peer_said_why", "real_stderr",
           "startup_handler", "terminated_line"]

_RUN_VAR = "TORCHELASTIC_RUN_ID"
#: where stderr really goes while fd 2 is pointed at /dev/null (ccbench.run.launchers silences
#: a native library's retries): the line goes there
_REAL_STDERR: list[int] = []


def real_stderr(fd: int | None) -> None:
    """The descriptor stderr was saved to while fd 2 is silenced (None: no longer)."""
    _REAL_STDERR[:] = [] if fd is None else [fd]


class Terminated(BaseException):
    """SIGTERM before the watchdog ran."""


def startup_handler(_signum: int, _frame: Any) -> None:
    raise Terminated


startup_handler.startup_only = True  # type: ignore[attr-defined]  # the watchdog restores SIG_DFL


def install() -> None:
    """Under torchrun, SIGTERM raises Terminated until the watchdog takes it over."""
    if _RUN_VAR in os.environ:
        try:
            signal.signal(signal.SIGTERM, startup_handler)
        except ValueError:                 # not the main thread: leave it as it is
            pass


def _a_peer_ended() -> bool:
    """Whether another worker of this run, below the same torchrun, has ended (torchrun stops
    the others once one has gone: this SIGTERM is its)."""
    run = os.environ.get(_RUN_VAR, "").encode()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    parent, alive = os.getppid(), 0
    for pid in procfs.pids():
        seen = procfs.stat(pid)
        if pid == os.getpid() or seen is None or seen[0] != parent or seen[1] in procfs.ENDED:
            continue
        env = procfs.environ(pid) or {}
        if env.get(_RUN_VAR.encode()) == run and b"RANK" in env:
            alive += 1
    return alive < local - 1


def terminated_line() -> str | None:
    """The line for this rank's SIGTERM during start-up, or None when torchrun is stopping it
    because another rank ended first."""
    if _a_peer_ended():
        return None
    from ccbench.errors import error_line

    rank = os.environ.get("RANK", "?")
    return error_line(f"start-up: rank {rank} was terminated (SIGTERM) before the run began; "
                      f"nothing was measured")


def leave() -> None:
    """Say it (or not) and exit 128 + SIGTERM; the secret file rank 0 may have written goes."""
    line = terminated_line()
    if line is not None:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        try:
            os.write(_REAL_STDERR[0] if _REAL_STDERR else 2, (line + "\n").encode())
        except OSError:
            pass
        from ccbench.run.torchrun_errors import ERROR_FILE_VAR, record_line

        if os.environ.get(ERROR_FILE_VAR):      # torchrun's report names it as the root cause
            record_line(line, os.environ[ERROR_FILE_VAR])
    from ccbench.run.secretfile import remove_written

    remove_written()
    os._exit(128 + signal.SIGTERM)


def peer_said_why() -> bool:
    """Under torchrun, whether another worker of this run on this host has said why it ended:
    its error file (TORCHELASTIC_ERROR_FILE, one per local rank: .../attempt_N/LOCAL_RANK/
    error.json, which ccbench.run.torchrun_errors fills with the line) holds a ccbench error
    line. A worker ended by SIGTERM while it started has said so before it reached the control
    store, where the others would have read it."""
    from pathlib import Path

    from ccbench.errors import ERROR_PREFIX
    from ccbench.run.torchrun_errors import ERROR_FILE_VAR

    own = os.environ.get(ERROR_FILE_VAR)
    if not own or _RUN_VAR not in os.environ:
        return False
    mine = Path(own)
    for peer in mine.parent.parent.iterdir() if mine.parent.parent.is_dir() else ():
        if peer != mine.parent and peer.name.isdigit():
            try:
                if ERROR_PREFIX in (peer / mine.name).read_text(errors="replace")[:65536]:
                    return True
            except OSError:
                continue
    return False
