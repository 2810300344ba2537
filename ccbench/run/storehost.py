"""The control store in a process of its own, for ranks started by a bare `mpiexec`.

Intel MPI's and MPICH's mpiexec (hydra) kill every rank within milliseconds of one dying
(unless given -disable-auto-cleanup), long before any survivor's watchdog could say which rank
it was. The store then cannot live in rank 0: rank 0 forks it before MPI_Init, in a session of
its own (hydra kills the processes it started, not this one). It sees every rank's connection
close, in order, and knows what each rank was doing (`label/RANK`, set at each step): when
every rank has gone, some without a goodbye, and none of them said why, it prints the one
error line naming the step and the rank that went first. Where the ranks could speak
(`aborted` or `left/` set) it says nothing.

A rank killed during start-up, before MPI_Init, never connects (the ranks learn the store's
address from rank 0 through MPI), and hydra then ends the others: where every rank runs on
this host, the store host also watches the rank processes (ccbench.run.rankexits, below rank 0's
parent, the MPI's proxy) and names the one that ended first, provided rank 0 had forked it by
then. A rank that speaks before connecting (the MPI_Init guard, an error line) says so with a
datagram to the store host (`note_spoken`), which then stays silent. An abstract socket has no
permissions: anyone on the host can send to it. So the store host counts a datagram only from
a process below the ranks' proxy (a rank, or a rank's guard), by the pid the kernel attaches
to it (SCM_CREDENTIALS, which a sender cannot forge), and looks that process up while it is
still there: the sender waits for the store host's answer before it goes on.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import sys
import time
from typing import Any

from ccbench.errors import error_line
from ccbench.run import procfs
from ccbench.run.control import ControlServer
from ccbench.run.rankexits import RankExits, first_ended

__all__ = ["LABEL_KEY", "note_spoken", "start_store_host", "unexplained_end"]

LABEL_KEY = "label/"
_POLL_S = 0.05
#: how long a rank that said why waits for the store host to have looked at it
_SPOKEN_ACK_S = 2.0
#: how far up from a sender its parents are followed to find the ranks' proxy (a rank is its
#: child; the MPI_Init guard, a rank's)
_SPOKEN_DEPTH = 3


def _spoken_address(proxy: int) -> bytes:
    """Linux's abstract socket namespace: nothing on disk, gone with the store host."""
    return f"\0ccbench-spoken-{os.getuid()}-{proxy}".encode()


def note_spoken(proxy: int) -> None:
    """Tell the store host of the ranks started by `proxy` that a rank has said why it ends,
    and wait (briefly) until it has looked at who sent it: it checks the sender's process."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(b"")                 # an address of its own (autobind), for the answer
            sock.settimeout(_SPOKEN_ACK_S)
            sock.sendto(b"spoken", _spoken_address(proxy))
            sock.recv(16)
    except OSError:
        pass                     # no store host (not a bare mpiexec run, or it never started)


def start_store_host(launcher: str, host: str, secret: str, world_size: int,
                     watch: bool = False) -> int:
    """Fork the store host, listening on `host` for the run of `secret`; returns its port.
    Call before MPI_Init and before any thread. With `watch` (every rank on this host), it
    also watches the rank processes."""
    proxy = os.getppid()
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
        spoken = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        # the kernel attaches each sender's uid: another user's datagram must not silence it
        spoken.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        spoken.bind(_spoken_address(proxy))
        spoken.setblocking(False)
        server = ControlServer(host, 0, secret, world_size)
        server.watch_hangups()
        exits = RankExits(proxy, world_size).start() if watch else None
        os.write(write_fd, str(server.port).encode())
        os.close(write_fd)
        _serve(server, launcher, world_size if watch else 0, exits, spoken, proxy)
    except BaseException:  # noqa: BLE001  nothing of the rank's may run in this process
        status = 1
    finally:
        os._exit(status)


def _serve(server: ControlServer, launcher: str, world_size: int, exits: RankExits | None,
           spoken: socket.socket, proxy: int) -> None:
    """Until every rank that connected has gone (or rank 0 went before anyone connected)."""
    parent = os.getppid()
    said = False
    while True:
        ready, _, _ = select.select([spoken], [], [], _POLL_S)
        if ready:
            said = _spoken_by_us(spoken, proxy) or said
        open_ranks, closed, data = server.snapshot()
        if open_ranks or not (closed or os.getppid() != parent):
            continue
        # every rank that connected has gone, or rank 0 went before any rank connected
        if exits is not None:
            exits.settle()
            exits.stop()
        if _spoken_by_us(spoken, proxy) or said:
            return                            # a rank said why before it could connect
        line = unexplained_end(closed, data, launcher, world_size or None, set(server.arrived),
                               exits.snapshot() if exits is not None else None,
                               _hangups(server, len(closed)))
        if line:
            os.write(sys.stderr.fileno(), (line + "\n").encode())
        return


def _hangups(server: ControlServer, closed: int) -> list[int]:
    """The ranks' connections in the order the kernel saw them close (its thread may still be
    reading the last ones: waited for, at most a second)."""
    deadline = time.monotonic() + 1.0
    while len(server.hangups) < closed and time.monotonic() < deadline:
        time.sleep(0.01)
    return list(server.hangups)


def _spoken_by_us(spoken: socket.socket, proxy: int) -> bool:
    """Whether one of the ranks (a process below `proxy`, of this user) said it has spoken;
    every sender gets an answer, so that it goes on."""
    found = False
    while True:
        try:
            _, ancillary, _, sender = spoken.recvmsg(64, socket.CMSG_SPACE(12))
        except OSError:
            return found
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid, uid, _ = struct.unpack("3i", data[:12])
                found = found or (uid == os.getuid() and _below(pid, proxy))
        if sender:
            try:
                spoken.sendto(b"seen", sender)
            except OSError:
                pass


def _below(pid: int, proxy: int) -> bool:
    """Whether process `pid` is a descendant of `proxy` (a rank or a rank's guard)."""
    for _ in range(_SPOKEN_DEPTH):
        seen = procfs.stat(pid)
        if seen is None or seen[0] <= 1:
            return False
        if seen[0] == proxy:
            return True
        pid = seen[0]
    return False


# data open-shaped: the store's contents (ControlServer.snapshot), key -> a rank's JSON
def unexplained_end(closed: list[tuple[int, bool]], data: dict[str, Any], launcher: str,
                    world_size: int | None = None, arrived: set[int] | None = None,
                    exits: tuple[list[list[int]], set[int]] | None = None,
                    hangups: list[int] | None = None) -> str | None:
    """The error line for ranks that all went, some without a goodbye, none saying why.

    Which rank went first: by default the rank whose connection closed first. With
    `world_size` and `arrived` (the ranks that ever connected) and `exits` (the order in which
    the rank processes ended, and the ranks whose process was ever seen: ccbench.run.rankexits),
    the processes decide, since a rank that dies while its interpreter starts never connects
    (its healthy peers' connections are the ones that close), and connections closed within
    milliseconds of each other may be seen in either order:
    - a rank that never connected and whose process was never seen, while others' were, went
      before any of them (the watcher finds a rank's process within tens of milliseconds; one
      that lived long enough to be ended by mpiexec was found);
    - else the rank whose process ended first (in the kernel's order, however late the
      watcher looked); where it could not tell (no pidfds: several found ended at one look of
      /proc), one that never connected (mpiexec ended the others once it had died, never the
      other way round), else the one whose connection closed first;
    - with nothing seen, a rank that never connected while the others' connections closed
      with a goodbye, or the rank whose connection closed first.
    Where every rank connected, `hangups` (the order in which the kernel saw the connections
    close: ControlServer.watch_hangups) decides before the processes' ends: a killed rank
    closes its connection before it closes the MPI's descriptor that tells mpiexec, so before
    mpiexec ends the others, while its own exit can complete after theirs (it was seen so on a
    loaded machine: rank 2 killed, rank 1's process and its connection's thread first).
    """
    if "aborted" in data or any(key.startswith("left/") for key in data):
        return None
    dead = [rank for rank, bye in closed if not bye]
    said_bye = {rank for rank, bye in closed if bye}
    arrived = arrived or set()
    never = sorted(set(range(world_size)) - arrived) if world_size else []
    culprits: list[int] = []
    hung = [rank for rank in hangups or [] if rank not in said_bye]
    if hung and not never:
        culprits = hung[:1]
    elif exits is not None and exits[1]:
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
        return error_line(f"start-up: {which} ended before connecting to the control store "
                          f"and {launcher} then ended the others; ranks that did not arrive: "
                          f"{names}")
    labels = [value for key, value in data.items() if key.startswith(LABEL_KEY)]
    label = max(labels, key=lambda item: int(item[0]))[1] if labels else "start-up"
    return error_line(f"{label}: {which} ended without a word and {launcher} then ended the "
                      f"others; ranks that did not arrive: {names}")
