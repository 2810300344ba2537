"""Every wait has a timeout: a thread per rank that ends the process when a collective stops
making progress, after naming the ranks that did not arrive.

The hot loop only bumps two integers and a float (`enter` / `leave`); the watchdog thread
posts them to the control store once a second, so timing is not disturbed.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ccbench.errors import RunFailure, error_line
from ccbench.run.arrivals import LATE_GRACE_S, RankStates
from ccbench.run.control import ControlClient, StoreLost
from ccbench.run.lifeline import launcher_gone
from ccbench.run.secretfile import remove_written
from ccbench.run.stopped import end as end_stopped
from ccbench.run.stopped import stopped_peers
from ccbench.run.storehost import LABEL_KEY
from ccbench.run.terminated import peer_said_why

__all__ = ["Watchdog"]

EXIT_HUNG = 3
_POLL_S = 0.2
_POST_S = 1.0
_DEAD_GRACE_S = 2.0     # blocked this long while a peer is known dead: give up early
_SPEAKER_WAIT_S = 10.0  # a rank leaving without a line waits this long at most for the speaker


class Watchdog:
    def __init__(self, store: ControlClient, rank: int, world_size: int, timeout: float) -> None:
        self.store = store.second_connection()
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self._label = "start-up"
        # with the store outside rank 0 (ccbench.run.storehost, or the `ccbench launch` that
        # started the ranks under mpiexec), each step's label goes there too, so that it can
        # name the step when every rank was killed at once; the count orders them across ranks
        self.post_labels = False
        self._labels_posted = 0
        # during a backend's initialisation (it imports and starts a library, seconds on a
        # loaded machine): past the timeout, wait up to LATE_GRACE_S more while `rank_states`
        # sees every rank's process running
        self.lenient = False
        self.rank_states: Callable[[], RankStates | None] | None = None
        self.launcher: str | None = None              # where peers can be seen (stopped ones)
        # whether a rank said why it ends before it reached the control store (torchrun)
        self.spoken_elsewhere: Callable[[], bool] | None = None
        self.position: tuple[int, int] = (0, 0)     # (case-size step, ops entered in it)
        self.blocked_since: float | None = None
        self.wait_limit: float | None = None          # instead of `timeout`, for one wait
        self._posted: tuple[int, int] | None = None
        # set once this process has been stopped (SIGSTOP, ^Z) and continued: by then its peers
        # may have given up on it, and it must not blame them for leaving
        self.was_stopped = False
        self._wakeup: tuple[int, int] | None = None
        self._previous_term: Any = signal.SIG_DFL
        self.terminated = False
        self._stop = threading.Event()
        self._giving_up = threading.RLock()
        self._thread = threading.Thread(target=self._loop, name="ccbench-watchdog", daemon=True)

    def start(self) -> None:
        """From the main thread. SIGCONT is noticed through the signal wakeup fd, which the
        interpreter writes at once, even while the main thread is blocked in a library."""
        if threading.current_thread() is threading.main_thread():
            read_fd, write_fd = os.pipe()
            os.set_blocking(read_fd, False)
            os.set_blocking(write_fd, False)
            try:
                signal.signal(signal.SIGCONT, _ignore)
                # a launcher (torchrun, srun) sends SIGTERM to the others when a rank died: this
                # thread says which one first, instead of the process vanishing without a word
                self._previous_term = signal.signal(signal.SIGTERM, _ignore)
                signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
                self._wakeup = (read_fd, write_fd)
            except ValueError:
                os.close(read_fd)
                os.close(write_fd)
        self._thread.start()

    def _check_continued(self) -> None:
        if self._wakeup is None:
            return
        try:
            received = os.read(self._wakeup[0], 512)
        except BlockingIOError:
            return
        if signal.SIGCONT in received:
            self.was_stopped = True
        if signal.SIGTERM in received:
            self.terminated = True

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self._wakeup is not None and threading.current_thread() is threading.main_thread():
            signal.set_wakeup_fd(-1)
            # the start-up handler (ccbench.run.terminated) is for start-up only: after the
            # run, SIGTERM ends the process as it always did
            previous = signal.SIG_DFL if getattr(self._previous_term, "startup_only", False) \
                else self._previous_term
            signal.signal(signal.SIGTERM, previous)
            if self.terminated:                 # asked to end while this thread was stopping
                os.kill(os.getpid(), signal.SIGTERM)
        self.store.close()

    # -- called by the harness --------------------------------------------------------
    @property
    def label(self) -> str:
        """What this rank is doing (a case and size, a backend's initialisation, ...)."""
        return self._label

    @label.setter
    def label(self, label: str) -> None:
        self._label = label
        if self.post_labels and self._thread.is_alive():
            self._labels_posted += 1
            try:
                self.store.set(f"{LABEL_KEY}{self.rank}", [self._labels_posted, label])
            except StoreLost as lost:
                self._give_up("lost the control store", store_lost=lost)

    def begin_step(self, step: int, label: str) -> None:
        self.position = (step, 0)
        self.label = label

    def enter(self) -> None:
        step, ops = self.position
        self.position = (step, ops + 1)
        self.blocked_since = time.monotonic()

    def reached(self) -> None:
        """A point every rank must pass (a barrier's entry) counts as an op entered and left."""
        step, ops = self.position
        self.position = (step, ops + 1)

    def leave(self) -> None:
        self.blocked_since = None

    def waiting(self, limit: float | None = None) -> _Waiting:
        """`with watchdog.waiting():` around a control-store wait on other ranks: bounded by the
        same timeout (or `limit`), without counting as an operation entered."""
        return _Waiting(self, limit)

    def fail(self, why: str, status: int = 1) -> None:
        """This rank hit an error of its own (a full disk): it alone says why, the others
        leave quietly instead of reporting it as dead (never returns)."""
        with self._giving_up:
            print(error_line(f"{self.label}: {why}"), file=sys.stderr, flush=True)
            self._linger_as_store_host(None, {})
            _exit(status)

    def store_failed(self, failure: RunFailure) -> None:
        """The main thread's own store call failed (rank 0 gone or silent, a key never set):
        stop the way this thread would, so only one line is printed (never returns)."""
        if isinstance(failure, StoreLost):
            self._give_up("lost the control store", store_lost=failure)
        self._give_up(str(failure))

    def ranks_missing(self, why: str, missing: dict[int, str]) -> None:
        """The main thread knows which ranks are missing (start-up: rank 0 saw which never
        arrived): stop naming exactly those (never returns)."""
        self._give_up(why, missing=missing)

    def abort(self, why: str) -> None:
        """A library reported an error mid-collective: usually a peer died. Give the store a
        moment to notice the dead connection, then stop like a timeout would (never returns).
        Where no peer died, is seen stopped or is behind (each live rank posts where it is
        within the grace), the first rank whose library failed is the cause: it says so, naming itself
        and its own error, and the others (whose errors follow from it) leave once it has."""
        deadline = time.monotonic() + _DEAD_GRACE_S
        try:
            order = self.store.add("aborted/library-errors", 1)  # whose error came first
            while time.monotonic() < deadline and not self.store.prefix("dead/"):
                time.sleep(0.1)
        except StoreLost as lost:
            self._give_up(why, store_lost=lost)
        if order == 1 and not self._missing_ranks(None) and not self._peer_stopped():
            self._give_up_own(why)
        self._give_up(why)

    def _peer_stopped(self) -> bool:
        """A peer's process is seen stopped or gone (where peers can be seen): a library
        error then waited on it, and is not this rank's own."""
        seen = self.rank_states() if self.rank_states is not None else None
        return seen is not None and any(state != "alive" for rank, state in seen.items()
                                        if rank != self.rank)

    def _give_up_own(self, why: str) -> None:
        """This rank's own error stopped the run: one line naming it (never returns)."""
        self._giving_up.acquire()
        try:
            if self.store.peek("aborted") is not None:
                self._leave_quietly()         # another rank has already said why
        except StoreLost:
            pass
        print(error_line(f"{self.label}: rank {self.rank}: {why}"), file=sys.stderr, flush=True)
        self._linger_as_store_host(None, {})
        _exit(EXIT_HUNG)

    # -- the thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        last_post = 0.0
        while not self._stop.wait(_POLL_S):
            now = time.monotonic()
            self._check_continued()
            blocked = self.blocked_since
            try:
                if self.terminated:
                    self._on_terminate()
                if now - last_post >= _POST_S and self.position != self._posted:
                    self.store.set(f"progress/{self.rank}", list(self.position))
                    self._posted = self.position
                    last_post = now
                if blocked is None:
                    continue
                if self.store.peek("aborted") not in (None, self.rank):
                    # another rank has already said why (this rank's own: its main thread
                    # says it, e.g. rank 0 interrupted while it waited, lingering as the host)
                    self._leave_quietly()
                waited = now - blocked
                limit = self.wait_limit or self.timeout
                if waited > limit and not (self.lenient and waited <= limit + LATE_GRACE_S
                                           and self._all_running()):
                    self._give_up(f"timed out after {waited:.0f} s")
                if waited > _DEAD_GRACE_S and self.store.prefix("dead/"):
                    self._give_up(self._why_dead())
            except StoreLost as lost:
                if not self._stop.is_set():
                    self._give_up("lost the control store", store_lost=lost)

    def _why_dead(self) -> str:
        left = {k.split("/")[1] for k in self.store.prefix("left/")}
        dead = {k.split("/")[1] for k in self.store.prefix("dead/")} - left
        silent = {k.split("/")[1] for k in self.store.prefix("unreachable/")}
        if not dead:        # every closed rank said goodbye: one gave up on a stuck peer
            return "a rank gave up waiting"
        return "a rank's host stopped answering" if dead <= silent else "a rank died"

    def _all_running(self) -> bool:
        seen = self.rank_states() if self.rank_states is not None else None
        return seen is not None and all(state == "alive" for state in seen.values())

    def _on_terminate(self) -> None:
        """SIGTERM: when a peer is known dead, the launcher is stopping the rest because of it,
        so say so (once, from the lowest live rank). Where a rank has already said why (it was
        interrupted, refused the secret file before it could reach the store, terminated while it
        started: ccbench.run.terminated), leave without
        a line. Otherwise the launcher itself was told to stop (SIGTERM to torchrun): the
        first rank to get here says so, every rank leaves on purpose (not to be named dead by
        the others), rank 0 last."""
        left = set(self.store.prefix("left/"))
        if {key.split("/")[1] for key in self.store.prefix("dead/")} - \
                {key.split("/")[1] for key in left}:
            self._give_up("a rank died (the launcher then sent SIGTERM)")
        with self._giving_up:
            if self.store.peek("aborted") is None and (
                    (self.spoken_elsewhere is not None and self.spoken_elsewhere())
                    or peer_said_why()):
                self.store.set("aborted", self.rank)       # said: the others leave quietly
            if self.store.peek("aborted") is None and \
                    self.store.add("aborted/terminated", 1) == 1:
                print(error_line(f"{self.label}: the launcher stopped the run (SIGTERM to every "
                                 f"rank); records of the sizes before are kept"),
                      file=sys.stderr, flush=True)
                self.store.set("aborted", self.rank)
            self._leave_quietly(status=128 + signal.SIGTERM)

    def _leave_quietly(self, tell_store: bool = True, status: int = EXIT_HUNG) -> None:
        with self._giving_up:
            try:                      # leaving on purpose: not to be reported as a dead rank
                if tell_store:
                    self.store.set(f"left/{self.rank}", 1)
                    self._outlast_peers()
            except StoreLost:
                pass
            _exit(status)

    def _outlast_peers(self) -> None:
        """Rank 0 may host the store: leaving, it waits (at most 3 s) until every other rank
        has left or gone, so that none of them reports a lost store instead of the cause
        another rank has already given (torchrun ends every rank at once)."""
        if self.rank != 0:
            return
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            gone = {key.split("/")[1] for key in self.store.prefix("left/")} | \
                {key.split("/")[1] for key in self.store.prefix("dead/")}
            if all(str(rank) in gone for rank in range(1, self.world_size)):
                return
            time.sleep(0.05)

    def _give_up(self, why: str, store_lost: StoreLost | None = None,
                 missing: dict[int, str] | None = None) -> None:
        # the main thread (a library error) and this thread (a timeout) may both get here
        self._giving_up.acquire()
        if launcher_gone():           # every rank is leaving: the lifeline says why, once
            _exit(EXIT_HUNG)
        try:
            if store_lost is None and self.store.peek("aborted") is not None:
                self._leave_quietly()         # another rank has already said why
        except StoreLost as lost:
            store_lost = lost
        if peer_said_why():                   # a peer said why before it reached the store
            self._leave_quietly(store_lost is None)
        if missing is None or store_lost is not None:
            missing = self._missing_ranks(store_lost)
        self._check_continued()
        if self.was_stopped and (store_lost is not None or any(missing.values())):
            # this process was stopped long enough for its peers to give up on it: they have
            # said why, and the ranks it would name only left because of it
            self._leave_quietly(store_lost is None)
        stopped = self._stopped_peers(missing)
        alive = [r for r in range(self.world_size) if r not in missing]
        speaker = alive[0] if alive else self.rank
        if self.rank == speaker:
            if store_lost is not None and store_lost.unresponsive:
                why = f"{why}: {store_lost}"
            names = ", ".join(f"{r}{f' ({d})' if d else ''}" for r, d in sorted(missing.items()))
            if store_lost is not None and store_lost.holder != "rank 0":
                # not a rank: the process that hosts the store stopped answering or went
                names = f"none known ({store_lost.holder}, which hosts the control store, " \
                    f"{'is not answering' if store_lost.unresponsive else 'is gone'})"
            print(error_line(f"{self.label}: {why}; ranks that did not arrive: "
                             f"{names or 'unknown'}"), file=sys.stderr, flush=True)
            self._linger_as_store_host(store_lost, missing)
            end_stopped(stopped)      # else a bare mpiexec or torchrun waits for them
            _exit(EXIT_HUNG)
        self._giving_up.release()
        if store_lost is None:
            self._await_speaker()
        self._leave_quietly(store_lost is None)

    def _await_speaker(self) -> None:
        """A rank that leaves without a line waits (at most _SPEAKER_WAIT_S) until the rank
        that says why has said it (it sets 'aborted' once its line is out): a bare mpiexec
        (hydra) or torchrun ends every rank as soon as one exits, and the speaker, still
        looking at its peers, was among those ended before its line was out (3 ranks under a
        bare mpiexec, rank 0 killed: no line at all, 2 runs of 5)."""
        deadline = time.monotonic() + _SPEAKER_WAIT_S
        try:
            while self.store.peek("aborted") is None and time.monotonic() < deadline:
                time.sleep(0.05)
        except StoreLost:
            pass

    def _stopped_peers(self, missing: dict[int, str]) -> dict[int, int]:
        """The peers on this host whose process is stopped (ccbench.run.stopped, and the
        rank states where every rank is seen: `ccbench launch`): named as such, in place of
        the live ranks merely behind, unless a rank died (that explains the stop); those of
        mpiexec, torchrun and srun are ended once the line is out (returned)."""
        peers = {} if self.launcher is None else \
            stopped_peers(self.launcher, self.rank, self.world_size)
        if any(why == "dead" or why.startswith("unreachable") for why in missing.values()):
            return peers
        seen = self.rank_states() if self.rank_states is not None else None
        missing.update({rank: "stopped" for rank in peers})
        missing.update({rank: "stopped" for rank, state in (seen or {}).items()
                        if state == "stopped" and rank != self.rank})
        if "stopped" in missing.values():
            # a live rank merely behind us waits for the stopped one (a ring's neighbour
            # finished the call the stopped rank had already fed): it is not a cause
            for rank in [r for r, why in missing.items() if not why]:
                del missing[rank]
        return peers

    def _linger_as_store_host(self, store_lost: StoreLost | None, missing: dict[int, str]
                              ) -> None:
        """Rank 0 hosts the store: keep it up until the other live ranks have read 'aborted'
        and left, so none of them reports a lost store instead of the real cause."""
        if store_lost is not None:
            return
        try:
            self.store.set("aborted", self.rank)
            if self.rank != 0:
                return
            waiting_for = self.world_size - 1 - len(missing)
            deadline = time.monotonic() + 3.0
            while len(self.store.prefix("left/")) < waiting_for and time.monotonic() < deadline:
                time.sleep(0.05)
        except StoreLost:
            pass

    def _missing_ranks(self, store_lost: StoreLost | None) -> dict[int, str]:
        """rank -> '' (behind us), 'dead' or 'not answering'. A rank is missing when it is
        dead or has entered fewer ops than us; rank 0 when its store is gone."""
        if store_lost is not None:
            return _store_host_missing(store_lost)
        try:
            left = {int(k.split("/")[1]) for k in self.store.prefix("left/")}
            dead = {int(k.split("/")[1]) for k in self.store.prefix("dead/")} - left
            silent = {int(k.split("/")[1]): float(v)
                      for k, v in self.store.prefix("unreachable/").items()}
            progress = self.store.prefix("progress/")
            self.store.set(f"progress/{self.rank}", list(self.position))
        except StoreLost as lost:
            return _store_host_missing(lost)
        except RunFailure:
            return {0: "dead"}
        if dead:                  # a dead rank explains the stop; the others only wait for it
            return {rank: f"unreachable: no TCP answer for {silent[rank]:g} s" if rank in silent
                    else "dead" for rank in dead}
        missing: dict[int, str] = {}
        for rank in range(self.world_size):
            where = tuple(progress.get(f"progress/{rank}", (-1, -1)))
            if rank != self.rank and where < self.position:
                missing[rank] = ""
        return missing


def _store_host_missing(lost: StoreLost) -> dict[int, str]:
    """Rank 0 when it hosts the store; no rank when another process does (the launcher)."""
    if lost.holder != "rank 0":
        return {}
    return {0: "not answering" if lost.unresponsive else "dead"}


def _exit(status: int) -> None:
    """os._exit, once the secret file this rank may have written is removed (atexit will not
    run)."""
    remove_written()
    os._exit(status)


def _ignore(_signum: int, _frame: object) -> None:
    """SIGCONT needs a handler for the wakeup fd to see it; continuing needs nothing more."""


class _Waiting:
    def __init__(self, watchdog: Watchdog, limit: float | None) -> None:
        self.watchdog, self.limit = watchdog, limit

    def __enter__(self) -> None:
        self.watchdog.wait_limit = self.limit
        self.watchdog.blocked_since = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        self.watchdog.blocked_since = None
        self.watchdog.wait_limit = None
