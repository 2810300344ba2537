"""A process that a ccbench process started (a rank by `ccbench launch`, a case by `ccbench
sweep`) never outlives it: killed (SIGKILL), or gone with its terminal (SIGHUP), the starter
takes its children with it within seconds, instead of leaving ranks measuring to the end.

The starter names itself in the child's environment (`lifeline_env`); the child, at start-up
(`hold`): where the starter is its parent, asks the kernel for SIGKILL when the parent goes
(prctl PR_SET_PDEATHSIG); where something stands in between (mpiexec and its proxy), a thread
waits on the starter's pidfd (or looks at /proc each second without pidfds). The starter is
named by host, pid and start time, so that a copy of the variable on another host, or a pid
reused since, binds nothing.

A worker of torchrun has no such variable: torchrun starts it (its parent) and, killed itself
(SIGKILL), leaves it measuring to the end with nobody to report to. So a torchrun worker
(`TORCHELASTIC_RUN_ID` set, no `CCBENCH_LIFELINE`) watches its parent's pidfd from start-up
(`hold`), and once it is gone ends at once: local rank 0 says so in one line, the
records already written are whole (each is fsynced when its size finishes), and the others
leave without a line (`launcher_gone` keeps a rank's watchdog from reporting the ranks that
went with it). A bare Intel MPI mpiexec needs none of this: killed, its proxy ends the ranks.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable

from ccbench.run import procfs

__all__ = ["LIFELINE_VAR", "describe", "hold", "launcher_gone", "lifeline_env"]

LIFELINE_VAR = "CCBENCH_LIFELINE"
_PR_SET_PDEATHSIG = 1
_POLL_S = 1.0
#: the parent a torchrun worker watches, as (pid, name), once `hold` has seen it
_WATCHED: list[tuple[int, str]] = []
#: what the rank is doing, for the line (its watchdog's label, once it has one)
_DESCRIBE: list[Callable[[], str]] = []


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
        if "TORCHELASTIC_RUN_ID" in os.environ:
            _hold_launcher("torchrun")
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


def _watch(pid: int, started: str | None, then: Callable[[], None] | None = None) -> None:
    """Wait until process `pid` has ended, then `then` (by default: SIGKILL this process)."""
    opener = getattr(os, "pidfd_open", None)
    try:
        if opener is None:
            raise OSError("no pidfd")
        fd = opener(pid)
    except ProcessLookupError:
        pass
    except OSError:
        while _start_time(pid) == started and not _ended(pid):
            time.sleep(_POLL_S)
    else:
        select.select([fd], [], [])       # readable once the process has ended
    (then or _end)()


def _ended(pid: int) -> bool:
    seen = procfs.stat(pid)
    return seen is None or seen[1] in procfs.ENDED


def _end() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def describe(label: Callable[[], str]) -> None:
    """What the rank is doing, for its line should its launcher go (the watchdog's label)."""
    _DESCRIBE[:] = [label]


def launcher_gone() -> bool:
    """Whether the launcher this rank watches (torchrun) has gone: this rank then leaves, and
    what it sees fail meanwhile (the store of a rank 0 that left) is not worth a line."""
    return bool(_WATCHED) and os.getppid() != _WATCHED[0][0]


def _hold_launcher(name: str) -> None:
    """Watch the parent (the launcher that started this rank) from a thread."""
    parent = os.getppid()
    _WATCHED[:] = [(parent, name)]
    threading.Thread(target=_watch, args=(parent, _start_time(parent), _launcher_ended),
                     name="ccbench-lifeline", daemon=True).start()


def _launcher_ended() -> None:
    """The launcher went while this rank ran: one line from the lowest local rank, and out."""
    pid, name = _WATCHED[0]
    if os.environ.get("LOCAL_RANK", "0") == "0":
        from ccbench.errors import error_line

        label = "start-up"
        try:
            label = _DESCRIBE[0]() if _DESCRIBE else label
        except Exception:  # noqa: BLE001  the line matters more than the step's name
            pass
        rank = os.environ.get("RANK", "?")
        line = error_line(f"{label}: the launcher ({name}, pid {pid}) ended while rank {rank} "
                          f"ran; the run stops here, records of the sizes before are kept")
        try:
            print(line, file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass
    from ccbench.run.secretfile import remove_written

    remove_written()
    os._exit(1)
