"""A guard for waits that hold the interpreter: MPI_Init blocks with the GIL held, so no Python
thread (the watchdog) can run while a peer that died during start-up keeps it waiting for ever.

The guard is a forked child process, started before the wait: if the parent has not said
"done" within the limit, the child prints the one error line and kills the parent. If the
parent dies first, the pipe closes and the child just exits.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from types import TracebackType

from ccbench.errors import error_line
from ccbench.run import procfs
from ccbench.run.arrivals import LATE_GRACE_S
from ccbench.run.storehost import note_spoken

__all__ = ["StartGuard", "local_peer_ranks"]

EXIT_HUNG = 3
def local_peer_ranks(parent: int) -> dict[int, tuple[int, str]]:
    """rank -> (pid, process state 'R', 'S', 'T' stopped, ...) of the processes started by the
    same parent (an MPI proxy) on this host, read from /proc."""
    found: dict[int, tuple[int, str]] = {}
    for pid in procfs.pids():
        seen = procfs.stat(pid)
        env = procfs.environ(pid) if seen is not None and seen[0] == parent else None
        rank = procfs.mpi_rank(env, procfs.MPI_RANK_VARS + ("RANK",)) if env else None
        if seen is not None and rank is not None:
            found[rank] = (pid, seen[1])
    return found


class StartGuard:
    """`with StartGuard("MPI start-up (MPI_Init)", limit, rank, world):` around the wait."""

    def __init__(self, phase: str, limit: float, rank: int, world_size: int,
                 all_local: bool = False) -> None:
        self.phase, self.limit, self.rank, self.world_size = phase, limit, rank, world_size
        self.all_local = all_local          # every rank on this host: /proc tells who is there
        self._child = 0
        self._done_fd = -1

    def __enter__(self) -> StartGuard:
        read_fd, write_fd = os.pipe()
        child = os.fork()
        if child == 0:                                   # the guard: no Python cleanup at all
            try:
                os.close(write_fd)
                _watch(read_fd, os.getppid(), self)
            finally:
                os._exit(0)
        os.close(read_fd)
        self._child, self._done_fd = child, write_fd
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 trace: TracebackType | None) -> None:
        os.close(self._done_fd)                          # EOF: the guard exits
        os.waitpid(self._child, 0)


def _watch(read_fd: int, parent: int, guard: StartGuard) -> None:
    phase, limit, rank, world = guard.phase, guard.limit, guard.rank, guard.world_size
    complete = guard.all_local
    started = time.monotonic()
    if complete:
        # every rank on this host: a peer that exits meanwhile (killed while it imports or
        # connects) is seen gone at once, instead of after the limit
        dead = _await_or_dead(read_fd, parent, rank, world, started + limit)
        if dead is None:
            return
    else:
        ready, _, _ = select.select([read_fd], [], [], limit)
        if ready:
            return
        dead = []
    peers, missing = _look(parent, rank, world)
    missing = sorted(set(missing) | set(dead))
    if dead:
        _speak_or_leave(parent, rank, world, peers, missing,
                        f"{phase}: a rank exited before it finished (killed or failed while "
                        f"it started); ranks that did not arrive: "
                        f"{_named(missing, dead, peers)}", limit)
        return
    if complete and not missing:
        # every rank still runs: a loaded machine, not a fault; wait a bounded while longer,
        # unless one of them dies or stops meanwhile
        deadline = time.monotonic() + LATE_GRACE_S
        while not missing and time.monotonic() < deadline:
            ready, _, _ = select.select([read_fd], [], [], 0.5)
            if ready:
                return
            peers, missing = _look(parent, rank, world)
    names = ", ".join(map(str, missing)) if complete and missing else "unknown"
    waited = time.monotonic() - started
    why = (f"{phase}: did not finish within {waited:.0f} s (a rank died or hangs during "
           f"start-up); ranks that did not arrive: {names}")
    if complete:
        _speak_or_leave(parent, rank, world, peers, missing, why, limit)
    else:
        _speak(parent, why)


def _speak_or_leave(parent: int, rank: int, world: int, peers: dict[int, tuple[int, str]],
                    missing: list[int], why: str, limit: float) -> None:
    """The lowest live rank speaks for all; the others stay until it has looked (so that it
    does not count them among the missing), then end their rank without a word."""
    here = set(range(world)) - set(missing)
    speaker = min(here | {rank})
    if speaker != rank and speaker in peers:
        _wait_gone(peers[speaker][0], limit)
        os.kill(parent, signal.SIGKILL)
        return
    _speak(parent, why)


def _speak(parent: int, why: str) -> None:
    note_spoken(_parent_of(parent))        # the store host of a bare mpiexec stays silent
    try:
        os.write(sys.stderr.fileno(), (error_line(why) + "\n").encode())
    finally:
        os.kill(parent, signal.SIGKILL)


def _await_or_dead(read_fd: int, parent: int, rank: int, world: int, deadline: float
                   ) -> list[int] | None:
    """Until the parent says done (None) or the deadline passes ([]): the peers gone (exited,
    or a zombie) on two looks in a row, as soon as there is one. The MPI launcher started
    them all together, long before this rank got here; twice, so that one it starts this
    very moment is not taken for gone."""
    before: set[int] = set()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return []
        ready, _, _ = select.select([read_fd], [], [], min(left, 0.5))
        if ready:
            return None
        peers = local_peer_ranks(_parent_of(parent))
        gone = {r for r in range(world) if r != rank
                and (r not in peers or peers[r][1] in _DEAD)}
        if gone & before:
            return sorted(gone & before)
        before = gone


def _named(missing: list[int], dead: list[int], peers: dict[int, tuple[int, str]]) -> str:
    def why(r: int) -> str:
        if r in dead:
            return f"{r} (dead)"
        if r in peers and peers[r][1] in ("T", "t"):
            return f"{r} (stopped)"
        return str(r)

    return ", ".join(why(r) for r in missing)


_GONE = ("T", "t", "Z", "X")
_DEAD = ("Z", "X")


def _look(parent: int, rank: int, world: int) -> tuple[dict[int, tuple[int, str]], list[int]]:
    """The peers on this host and the ranks (other than this one) that are gone or stopped."""
    peers = local_peer_ranks(_parent_of(parent))
    here = {r for r, (_, state) in peers.items() if state not in _GONE}
    return peers, [r for r in range(world) if r not in here and r != rank]


def _wait_gone(pid: int, limit: float) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        seen = procfs.stat(pid)
        if seen is None or seen[1] in _GONE:
            return
        time.sleep(0.1)


def _parent_of(pid: int) -> int:
    seen = procfs.stat(pid)
    return seen[0] if seen is not None else -1
