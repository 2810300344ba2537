"""The order in which the rank processes under an mpiexec end, as the launcher sees it.

An mpiexec that ends every rank when one dies (MPICH's on a signal, Open MPI's on any failure)
leaves no rank to say which one it was. The control store's connections do not tell it
reliably: a rank that dies while its interpreter starts never connected, so the first
connection to close is a healthy rank's, ended by mpiexec; and the store serves each
connection in a thread of its own, so connections that close within milliseconds of each
other can be seen in either order on a loaded machine.

The processes themselves do tell: mpiexec reacts to the first death through at least two
other processes (its proxy, then mpiexec itself, then the proxy again, or Open MPI's event
loop), and a pidfd (Linux 5.3) becomes readable at the very moment its process exits. So one
thread finds the ranks below mpiexec in /proc (their parent chain leads to mpiexec, and the
MPI's rank variable is in their environment) and waits in epoll on their pidfds. That thread
may be kept off the CPU for longer than mpiexec takes to end the others (MPICH's has done it
within a millisecond), so the order of its wake-ups says little; epoll's does not depend on
it: epoll hands out ready descriptors in the order they became ready (its ready list is
appended to as each one wakes), so each exit is one entry, in the kernel's order, however
late the thread looked. Only without pidfds (an old kernel, /proc looked at
every round) are ranks that end between two looks reported together, as a tie. Watching
every rank's process costs one wake-up per exit; finding them, a scan of /proc every 20 ms
until every rank has been found.
"""

from __future__ import annotations

import os
import select
import threading
import time

from ccbench.run import procfs

__all__ = ["RankExits", "first_ended"]

_SCAN_S = 0.02


class RankExits:
    """`RankExits(mpiexec_pid, world_size).start()`, later `snapshot()`: the ranks in the order
    their processes ended (each entry one rank; without pidfds, the ranks found ended at the
    same look), and every rank whose process was found alive. `stop()` before ending the
    ranks oneself, so that only what happened to them on its own is recorded."""

    def __init__(self, root: int, world_size: int) -> None:
        self.root, self.world_size = root, world_size
        self.order: list[list[int]] = []
        self.seen: set[int] = set()
        self._pids: dict[int, int] = {}              # pid -> rank, still running
        self._fds: dict[int, int] = {}               # pidfd -> rank
        self._polled: dict[int, int] = {}            # pid -> rank, without a pidfd
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ccbench-rank-exits",
                                        daemon=True)

    def start(self) -> RankExits:
        self._thread.start()
        return self

    def settle(self, limit: float = 1.0) -> None:
        """Wait (at most `limit` seconds) until every rank process found has been seen to end:
        a rank's connections close before its exit is reported."""
        deadline = time.monotonic() + limit
        while self._thread.is_alive() and time.monotonic() < deadline:
            with self._lock:
                if not self._pids:
                    return
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def snapshot(self) -> tuple[list[list[int]], set[int]]:
        with self._lock:
            return [list(event) for event in self.order], set(self.seen)

    def _run(self) -> None:
        # epoll, not poll: poll lists the ready descriptors in registration order, epoll in
        # the order they became ready, which is the order the ranks ended
        with select.epoll() as poller:
            try:
                self._follow(poller)
            finally:
                for fd in self._fds:
                    os.close(fd)
                self._fds.clear()

    def _follow(self, poller: select.epoll) -> None:
        while not self._stop.is_set():
            searching = len(self.seen) < self.world_size
            if searching:
                for pid, rank in _ranks_below(self.root).items():
                    if rank not in self.seen and pid not in self._pids:
                        self._watch(poller, pid, rank)
            wait_s = _SCAN_S if searching or self._polled else 0.2
            self._harvest(poller, wait_s)
            polled = [rank for pid, rank in self._polled.items() if _gone(pid)]
            if polled:                        # no order among these: a tie
                self._ended(polled)
        self._harvest(poller, 0)              # what ended before stop() was called

    def _harvest(self, poller: select.epoll, wait_s: float) -> None:
        """Each rank process that ended, one entry each, in the order they ended."""
        for fd, _ in poller.poll(wait_s, max(1, len(self._fds))):
            rank = self._fds.pop(fd, None)
            if rank is not None:
                poller.unregister(fd)
                os.close(fd)
                self._ended([rank])

    def _watch(self, poller: select.epoll, pid: int, rank: int) -> None:
        opener = getattr(os, "pidfd_open", None)
        try:
            if opener is None:
                raise OSError("no pidfd")
            fd = opener(pid)
        except ProcessLookupError:            # gone between the scan and here
            self._found(pid, rank)
            self._ended([rank])
            return
        except OSError:                       # an old kernel: look at /proc each round
            self._polled[pid] = rank
            self._found(pid, rank)
            return
        self._fds[fd] = rank
        poller.register(fd, select.EPOLLIN)
        self._found(pid, rank)                # seen once it is watched (the tests wait for it)

    def _found(self, pid: int, rank: int) -> None:
        with self._lock:
            self.seen.add(rank)
            self._pids[pid] = rank

    def _ended(self, ranks: list[int]) -> None:
        with self._lock:
            self.order.append(sorted(set(ranks)))
            for pid in [pid for pid, rank in self._pids.items() if rank in ranks]:
                del self._pids[pid]
                self._polled.pop(pid, None)


def _ranks_below(root: int) -> dict[int, int]:
    """pid -> rank of the rank processes descending from `root`: the first process on each
    branch with a rank variable (not its children: the MPI_Init guard inherits the rank's
    environment)."""
    children: dict[int, list[int]] = {}
    for pid in procfs.pids():
        seen = procfs.stat(pid)
        if seen is not None and seen[1] not in procfs.ENDED:
            children.setdefault(seen[0], []).append(pid)
    found: dict[int, int] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        env = procfs.environ(pid)
        rank = procfs.mpi_rank(env) if env is not None else None
        if rank is None:
            todo.extend(children.get(pid, []))
        else:
            found[pid] = rank
    return found


def _gone(pid: int) -> bool:
    seen = procfs.stat(pid)
    return seen is None or seen[1] in procfs.ENDED


def first_ended(order: list[list[int]], said_bye: set[int]) -> list[int]:
    """The ranks of the first exit that was not a rank leaving after its goodbye."""
    for event in order:
        ranks = [rank for rank in event if rank not in said_bye]
        if ranks:
            return ranks
    return []
