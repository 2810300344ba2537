"""Every wait has a timeout: a thread per rank that ends the process when a collective stops
making progress, after naming the ranks that did not arrive.

The hot loop only bumps two integers and a float (`enter` / `leave`); the watchdog thread
posts them to the control store once a second, so timing is not disturbed.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from ccbench.control import ControlClient, StoreLost
from ccbench.errors import RunFailure

__all__ = ["Watchdog"]

EXIT_HUNG = 3
_POLL_S = 0.2
_POST_S = 1.0
_DEAD_GRACE_S = 2.0     # blocked this long while a peer is known dead: give up early


class Watchdog:
    def __init__(self, store: ControlClient, rank: int, world_size: int, timeout: float) -> None:
        self.store = store.second_connection()
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self.label = "start-up"
        self.position: tuple[int, int] = (0, 0)     # (case-size step, ops entered in it)
        self.blocked_since: float | None = None
        self._posted: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._giving_up = threading.RLock()
        self._thread = threading.Thread(target=self._loop, name="ccbench-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.store.close()

    # -- called by the harness --------------------------------------------------------
    def begin_step(self, step: int, label: str) -> None:
        self.label = label
        self.position = (step, 0)

    def enter(self) -> None:
        step, ops = self.position
        self.position = (step, ops + 1)
        self.blocked_since = time.monotonic()

    def leave(self) -> None:
        self.blocked_since = None

    def waiting(self) -> _Waiting:
        """`with watchdog.waiting():` around a control-store wait on other ranks: bounded by the
        same timeout, without counting as an operation entered."""
        return _Waiting(self)

    def abort(self, why: str) -> None:
        """A library reported an error mid-collective: usually a peer died. Give the store a
        moment to notice the dead connection, then stop like a timeout would (never returns)."""
        deadline = time.monotonic() + _DEAD_GRACE_S
        try:
            while time.monotonic() < deadline and not self.store.prefix("dead/"):
                time.sleep(0.1)
        except StoreLost:
            self._give_up(why, store_lost=True)
        self._give_up(why)

    # -- the thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        last_post = 0.0
        while not self._stop.wait(_POLL_S):
            now = time.monotonic()
            blocked = self.blocked_since
            try:
                if now - last_post >= _POST_S and self.position != self._posted:
                    self.store.set(f"progress/{self.rank}", list(self.position))
                    self._posted = self.position
                    last_post = now
                if blocked is None:
                    continue
                if self.store.peek("aborted") is not None:
                    self._leave_quietly()         # another rank has already said why
                waited = now - blocked
                if waited > self.timeout:
                    self._give_up(f"timed out after {self.timeout:g} s")
                if waited > _DEAD_GRACE_S and self.store.prefix("dead/"):
                    self._give_up("a rank died")
            except StoreLost:
                if not self._stop.is_set():
                    self._give_up("lost the control store", store_lost=True)

    def _leave_quietly(self) -> None:
        with self._giving_up:
            try:                      # leaving on purpose: not to be reported as a dead rank
                self.store.set(f"left/{self.rank}", 1)
            except StoreLost:
                pass
            os._exit(EXIT_HUNG)

    def _give_up(self, why: str, store_lost: bool = False) -> None:
        # the main thread (a library error) and this thread (a timeout) may both get here
        self._giving_up.acquire()
        try:
            if not store_lost and self.store.peek("aborted") is not None:
                self._leave_quietly()         # another rank has already said why
        except StoreLost:
            store_lost = True
        missing = self._missing_ranks(store_lost)
        alive = [r for r in range(self.world_size) if r not in missing]
        speaker = alive[0] if alive else self.rank
        if self.rank == speaker:
            names = ", ".join(f"{r}{' (dead)' if d else ''}" for r, d in sorted(missing.items()))
            print(f"ccbench: error: {self.label}: {why}; ranks that did not arrive: "
                  f"{names or 'unknown'}", file=sys.stderr, flush=True)
            self._linger_as_store_host(store_lost, missing)
            os._exit(EXIT_HUNG)
        self._giving_up.release()
        self._leave_quietly()

    def _linger_as_store_host(self, store_lost: bool, missing: dict[int, bool]) -> None:
        """Rank 0 hosts the store: keep it up until the other live ranks have read 'aborted'
        and left, so none of them reports a lost store instead of the real cause."""
        if store_lost:
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

    def _missing_ranks(self, store_lost: bool) -> dict[int, bool]:
        """rank -> died?  A rank is missing when it is dead or has entered fewer ops than us."""
        if store_lost:
            return {0: True}
        try:
            left = {int(k.split("/")[1]) for k in self.store.prefix("left/")}
            dead = {int(k.split("/")[1]) for k in self.store.prefix("dead/")} - left
            progress = self.store.prefix("progress/")
        except (StoreLost, RunFailure):
            return {0: True}
        self.store.set(f"progress/{self.rank}", list(self.position))
        if dead:                  # a dead rank explains the stop; the others only wait for it
            return {rank: True for rank in dead}
        missing: dict[int, bool] = {}
        for rank in range(self.world_size):
            where = tuple(progress.get(f"progress/{rank}", (-1, -1)))
            if rank != self.rank and where < self.position:
                missing[rank] = False
        return missing


class _Waiting:
    def __init__(self, watchdog: Watchdog) -> None:
        self.watchdog = watchdog

    def __enter__(self) -> None:
        self.watchdog.blocked_since = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        self.watchdog.blocked_since = None
