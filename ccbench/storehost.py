"""The control store in a process of its own, for ranks started by a bare `mpiexec`.

Intel MPI's and MPICH's mpiexec (hydra) kill every rank within milliseconds of one dying
(unless given -disable-auto-cleanup), long before any survivor's watchdog could say which rank
it was. The store then cannot live in rank 0: rank 0 forks it before MPI_Init, in a session of
its own (hydra kills the processes it started, not this one). It sees every rank's connection
close, in order, and knows what each rank was doing (`label/RANK`, set at each step): when
every rank has gone, some without a goodbye, and none of them said why, it prints the one
error line naming the step and the rank that went first. Where the ranks could speak
(`aborted` or `left/` set) it says nothing.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from ccbench.control import ControlServer
from ccbench.rankexits import first_ended

__all__ = ["LABEL_KEY", "start_store_host"]

LABEL_KEY = "label/"
_POLL_S = 0.05


def start_store_host(launcher: str) -> int:
    """Fork the store host; returns its port. Call before MPI_Init and before any thread."""
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child:
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as pipe:
            text = pipe.read().decode()
        if not text:
            raise OSError("the control store process did not start")
        return int(text)
    status = 0
    try:                                    # the store host: no Python cleanup at all
        os.close(read_fd)
        os.setsid()
        server = ControlServer("0.0.0.0", 0)
        os.write(write_fd, str(server.port).encode())
        os.close(write_fd)
        _serve(server, launcher)
    except BaseException:  # noqa: BLE001  nothing of the rank's may run in this process
        status = 1
    finally:
        os._exit(status)


def _serve(server: ControlServer, launcher: str) -> None:
    """Until every rank that connected has gone (or rank 0 went before anyone connected)."""
    parent = os.getppid()
    while True:
        time.sleep(_POLL_S)
        open_ranks, closed, data = server.snapshot()
        if open_ranks == 0 and closed:
            line = unexplained_end(closed, data, launcher)
            if line:
                os.write(sys.stderr.fileno(), (line + "\n").encode())
            return
        if open_ranks == 0 and not closed and os.getppid() != parent:
            return                            # rank 0 died before any rank connected


def unexplained_end(closed: list[tuple[int, bool]], data: dict[str, Any], launcher: str,
                    world_size: int | None = None, arrived: set[int] | None = None,
                    exits: tuple[list[list[int]], set[int]] | None = None) -> str | None:
    """The error line for ranks that all went, some without a goodbye, none saying why.

    Which rank went first: by default the rank whose connection closed first. With
    `world_size` and `arrived` (the ranks that ever connected) and `exits` (the order in which
    the rank processes ended, and the ranks whose process was ever seen: ccbench.rankexits),
    the processes decide, since a rank that dies while its interpreter starts never connects
    (its healthy peers' connections are the ones that close), and connections closed within
    milliseconds of each other may be seen in either order:
    - a rank that never connected and whose process was never seen, while others' were, went
      before any of them (the watcher finds a rank's process within tens of milliseconds; one
      that lived long enough to be ended by mpiexec was found);
    - else the rank whose process ended first; when the watcher saw several end at once (it
      was kept off the CPU), one that never connected (mpiexec ended the others once it had
      died, never the other way round), else the one whose connection closed first;
    - with nothing seen, a rank that never connected while the others' connections closed
      with a goodbye, or the rank whose connection closed first.
    """
    if "aborted" in data or any(key.startswith("left/") for key in data):
        return None
    dead = [rank for rank, bye in closed if not bye]
    said_bye = {rank for rank, bye in closed if bye}
    arrived = arrived or set()
    never = sorted(set(range(world_size)) - arrived) if world_size else []
    culprits: list[int] = []
    if exits is not None and exits[1]:
        order, seen = exits
        culprits = [rank for rank in never if rank not in seen]
        if not culprits:
            first = first_ended(order, said_bye)
            tied = [rank for rank in first if rank in never] or \
                sorted(first, key=lambda rank: dead.index(rank) if rank in dead else len(dead))
            culprits = tied[:1]
    if not culprits:
        if not dead and never and arrived:
            culprits = never
        elif dead:
            culprits = dead[:1]
    if not culprits:
        return None
    names = ", ".join(f"{rank} (dead)" for rank in culprits)
    which = f"rank {culprits[0]}" if len(culprits) == 1 else \
        f"ranks {', '.join(map(str, culprits))}"
    if set(culprits) <= set(never):        # none of them ever connected
        return (f"ccbench: error: start-up: {which} ended before connecting to the control "
                f"store and {launcher} then ended the others; ranks that did not arrive: "
                f"{names}")
    labels = [value for key, value in data.items() if key.startswith(LABEL_KEY)]
    label = max(labels, key=lambda item: int(item[0]))[1] if labels else "start-up"
    return (f"ccbench: error: {label}: {which} ended without a word and {launcher} then "
            f"ended the others; ranks that did not arrive: {names}")
