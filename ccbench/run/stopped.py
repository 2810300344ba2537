"""Peers that are stopped (SIGSTOP, ^Z, a debugger) when the run gives up on them.

A stopped rank never exits by itself: a bare mpiexec, its proxy and the store host, or
torchrun (which sends SIGTERM, pending on a stopped process, and escalates to SIGKILL only 30 s
later), would wait for it long after the others said why and left. So the rank that says why
looks at its siblings (the processes its own parent started: mpiexec's proxy, torchrun's agent,
srun's step daemon), names those that are stopped and ends them (SIGKILL, which a stopped
process obeys at once). Only a sibling of the same run counts: a process of the same parent
that carries a rank variable and the launcher's identity of the run in its environment; ranks
started by hand from one shell are never taken for each other.
"""

from __future__ import annotations

import contextlib
import os
import signal

from ccbench.run import procfs
from ccbench.run.launcher_env import MPI_RANK_VARS

__all__ = ["end", "stopped_peers"]

_STOPPED = ("T", "t")
# the launchers whose ranks are the children of one process of their own (mpiexec's proxy,
# torchrun's agent, srun's step daemon), and what the run's ranks share in their environment
# besides; ranks started by hand (siblings in a shell) are left alone, and `ccbench launch`
# ends its whole process group itself
_RUN_KEYS = {"mpiexec": (), "torchrun": ("TORCHELASTIC_RUN_ID",),
             "srun": ("SLURM_JOB_ID", "SLURM_STEP_ID")}
_RANK_VARS = (*MPI_RANK_VARS, "RANK", "SLURM_PROCID")


def _run_of(env: dict[bytes, bytes], launcher: str) -> tuple[bytes | None, ...]:
    return tuple(env.get(key.encode()) for key in _RUN_KEYS.get(launcher, ()))


def stopped_peers(launcher: str, rank: int, world_size: int) -> dict[int, int]:
    """rank -> pid of every other rank of this run, on this host, whose process is stopped."""
    own = procfs.environ(os.getpid())
    if own is None or launcher not in _RUN_KEYS:
        return {}
    run = _run_of(own, launcher)
    parent = os.getppid()
    found: dict[int, int] = {}
    for pid in procfs.pids():
        seen = procfs.stat(pid)
        if pid == os.getpid() or seen is None or seen[0] != parent or seen[1] not in _STOPPED:
            continue
        env = procfs.environ(pid)
        peer = procfs.mpi_rank(env, _RANK_VARS) if env is not None else None
        if env is not None and peer is not None and peer != rank and 0 <= peer < world_size \
                and _run_of(env, launcher) == run:
            found[peer] = pid
    return found


def end(peers: dict[int, int]) -> None:
    """SIGKILL the stopped peers (each still stopped and still a child of our parent)."""
    parent = os.getppid()
    for pid in peers.values():
        seen = procfs.stat(pid)
        if seen is not None and seen[0] == parent and seen[1] in _STOPPED:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
