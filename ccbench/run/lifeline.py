"""A process that a ccbench process started (a rank by `ccbench launch`, a case by `ccbench
sweep`) never outlives it: killed (SIGKILL), or gone with its terminal (SIGHUP), the starter
takes its children with it within seconds, instead of leaving ranks measuring to the end.

The starter names itself in the child's environment (`lifeline_env`); the child, at start-up
(`hold`): where the starter is its parent, asks the kernel for SIGKILL when the parent goes
(prctl PR_SET_PDEATHSIG); where something stands in between (mpiexec and its proxy), a thread
waits on the starter's pidfd (or looks at /proc each second without pidfds). The starter is
named by host, pid and start time, so that a copy of the variable on another host, or a pid
reused since, binds nothing.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import socket
import threading
import time

from ccbench.run import procfs

__all__ = ["LIFELINE_VAR", "hold", "lifeline_env"]

LIFELINE_VAR = "CCBENCH_LIFELINE"
_PR_SET_PDEATHSIG = 1
_POLL_S = 1.0


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read().decode(errors="replace")
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


def lifeline_env() -> dict[str, str]:
    """The variable that binds a child's life to this process."""
    started = _start_time(os.getpid()) or "?"
    return {LIFELINE_VAR: f"{socket.gethostname()}:{os.getpid()}:{started}"}


def hold() -> None:
    """Bind this process's life to the starter named in its environment, if any."""
    text = os.environ.get(LIFELINE_VAR)
    if not text:
        return
    parts = text.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return                        # started on another host: that process is not ours
    pid, started = int(parts[1]), parts[2]
    if _start_time(pid) != started or _ended(pid):
        _end()                        # the starter went before this process got here
    if pid == os.getppid():
        _die_with_parent()
        if os.getppid() != pid:       # it went between the two looks
            _end()
        return
    threading.Thread(target=_watch, args=(pid, started), name="ccbench-lifeline",
                     daemon=True).start()


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        threading.Thread(target=_watch, args=(os.getppid(), _start_time(os.getppid())),
                         name="ccbench-lifeline", daemon=True).start()


def _watch(pid: int, started: str | None) -> None:
    opener = getattr(os, "pidfd_open", None)
    try:
        if opener is None:
            raise OSError("no pidfd")
        fd = opener(pid)
    except ProcessLookupError:
        _end()
        return
    except OSError:
        while _start_time(pid) == started and not _ended(pid):
            time.sleep(_POLL_S)
        _end()
        return
    select.select([fd], [], [])       # readable once the process has ended
    _end()


def _ended(pid: int) -> bool:
    seen = procfs.stat(pid)
    return seen is None or seen[1] in procfs.ENDED


def _end() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
