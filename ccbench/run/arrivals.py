"""Start-up: the ranks of a run are started together but do not all get going at the same
moment (a loaded machine can take many seconds to start one interpreter), so a rank that is
still starting must not be blamed, while one that died before it could connect should be, at
once.

When every rank runs on this host and the launcher marks its ranks' environment with the run
(`ccbench launch`, torchrun, srun), /proc tells which of them still exist: a rank that is
missing from the control store but whose process runs is late and gets up to LATE_GRACE_S more
than the connect timeout; one whose process is gone is named at once; a stopped one is named
at the connect timeout. Where the ranks cannot be seen (other hosts, ranks started by hand), a
missing rank gets the grace too, so the wait stays bounded either way.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from ccbench.run import procfs
from ccbench.run.launcher_env import LOCAL, SRUN, TORCHRUN

__all__ = ["LATE_GRACE_S", "LAUNCHER_PID_VAR", "RankStates", "await_ranks", "rank_states", "start_limit"]

# beyond the connect timeout (and the 5 s a rank needs after connecting), how long a rank whose
# process runs but has not arrived is waited for
LATE_GRACE_S = 20.0
_AFTER_CONNECT_S = 5.0
# the first look again comes soon (ranks started together arrive within ~100 ms of each
# other), then less and less often: each look asks the store and reads /proc
_FIRST_POLL_S = 0.02
_POLL_S = 0.5
LAUNCHER_PID_VAR = "CCBENCH_LAUNCHER_PID"

# what identifies one run's ranks in their environment, per launcher, and the rank variable
_RUN_KEYS = {env.name: (tuple(key.encode() for key in env.run_keys), env.rank.encode())
             for env in (LOCAL, SRUN, TORCHRUN)}
_STOPPED = ("T", "t")

RankStates = dict[int, str]        # rank -> 'alive', 'stopped' or 'gone'


def start_limit(connect_timeout: float) -> float:
    """The longest rank 0 waits for every rank to arrive."""
    return connect_timeout + _AFTER_CONNECT_S + LATE_GRACE_S


def rank_states(launcher: str, world_size: int, local_world_size: int) -> RankStates | None:
    """The state of every rank's process of this run on this host, or None when they cannot
    all be seen from here."""
    if launcher not in _RUN_KEYS or local_world_size != world_size:
        return None
    keys, rank_var = _RUN_KEYS[launcher]
    own = procfs.environ(os.getpid())
    if own is None or any(key not in own for key in keys) or rank_var not in own:
        return None
    run = tuple(own[key] for key in keys)
    found: dict[int, list[tuple[int, int, str]]] = {}   # rank -> [(pid, parent, state)]
    for pid in procfs.pids():
        env = procfs.environ(pid)
        if env is None or tuple(env.get(key) for key in keys) != run or rank_var not in env:
            continue
        stat = procfs.stat(pid)
        if stat is None:
            continue
        try:
            found.setdefault(int(env[rank_var]), []).append((pid, *stat))
        except ValueError:
            continue
    # a rank with no process: gone, where the launcher started every rank before any could look;
    # ranks started one by one (by hand, a script) may simply not have been started yet
    absent = "gone" if _started_together(launcher) else "alive"
    states: RankStates = {}
    for rank in range(world_size):
        procs = found.get(rank, [])
        pids = {pid for pid, _, _ in procs}
        # the rank itself, not a child that inherited its environment (the MPI_Init guard)
        top = [state for _, parent, state in procs if parent not in pids]
        if not top:
            states[rank] = absent
            continue
        state = top[0]
        states[rank] = "gone" if state in procfs.ENDED else "stopped" if state in _STOPPED else "alive"
    return states


def _started_together(launcher: str) -> bool:
    """srun and torchrun start a step's ranks at once; `ccbench launch` too, and it names
    itself in CCBENCH_LAUNCHER_PID (checked against our parent: the variable may be copied)."""
    if launcher != "local":
        return True
    return os.environ.get(LAUNCHER_PID_VAR) == str(os.getppid())


def await_ranks(arrived: Callable[[], set[int]], world_size: int, connect_timeout: float,
                states: Callable[[], RankStates | None]) -> RankStates:
    """Wait until every rank has arrived. Returns {} when they all did, else the ranks to
    blame: 'dead' (its process is gone), 'stopped', or '' (never arrived within the limit)."""
    started = time.monotonic()
    base = connect_timeout + _AFTER_CONNECT_S
    poll = _FIRST_POLL_S
    while True:
        missing = set(range(world_size)) - arrived()
        if not missing:
            return {}
        waited = time.monotonic() - started
        seen = states()
        if seen is not None:
            dead = {r: "dead" for r in missing if seen.get(r) == "gone"}
            if dead:
                return dead
            stopped = {r: "stopped" for r in missing if seen.get(r) == "stopped"}
            if stopped and waited > base:
                return stopped
        if waited > base + LATE_GRACE_S:
            return {r: "" for r in sorted(missing)}
        time.sleep(poll)
        poll = min(_POLL_S, poll * 1.5)
