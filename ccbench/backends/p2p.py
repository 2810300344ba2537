"""What every backend's point-to-point transport (algorithms.transport) shares.

A backend's `p2p.transport(device)` (`Backend.p2p`) builds its transport on its communicator, in
its own module (MPITransport in ccbench.backends.mpi, TorchTransport in
ccbench.backends.torch_dist, OneCCLTransport in ccbench.backends.oneccl, NcclCupyTransport
in ccbench.backends.nccl_cupy); the algorithm backends (ccbench.backends.algorithmic) run
schedules over it. Buffers are numpy arrays on the host or CuPy arrays on a device; every
message travels as raw bytes (bfloat16 has no MPI datatype, and moving bytes needs none).

Here: `raw_bytes`, `poll` (test a request until done, yielding the core, with a timeout),
`StagedTransport` (any host transport carrying device arrays through host copies, for a
library that cannot read device memory) and `Done` / `GroupPrepared` (the requests and the
prepared steps of a transport whose calls complete a group before they return).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ccbench.timeouts import DEFAULT_TIMEOUT_S

__all__ = ["Done", "GroupPrepared", "StagedTransport", "poll", "raw_bytes"]

_MISSES_PER_CLOCK = 256        # read the clock every this many failed tests
_DEFAULT_WAIT_S = DEFAULT_TIMEOUT_S


def raw_bytes(buf: Any) -> Any:
    """The bytes of a contiguous numpy or CuPy slice."""
    return buf.view(np.uint8)


def poll(test: Callable[[], bool], timeout: float | None, what: str) -> None:
    """Test until done, giving the core away after every miss, until `timeout` passed.

    Yielding at once matters when ranks outnumber cores: on a shared 2-core host, 4 ranks of
    an 8-byte recursive-doubling allreduce took 86-206 us when 64 tests spun before each
    yield and ~40 us yielding at once, close to a blocking MPI_Waitall (which has no
    timeout). With a core to itself a rank pays well under a microsecond per miss."""
    if test():
        return
    limit = _DEFAULT_WAIT_S if timeout is None else timeout
    deadline = time.monotonic() + limit
    misses = 0
    while not test():
        os.sched_yield()
        misses += 1
        if misses % _MISSES_PER_CLOCK == 0 and time.monotonic() > deadline:
            from algorithms.transport import TransportTimeout

            raise TransportTimeout(f"{what}: not done after {limit:g} s")


# -- device arrays through host copies ---------------------------------------------------------

class _StagedRecv:
    __slots__ = ("buf", "host", "req")

    def __init__(self, req: Any, host: np.ndarray, buf: Any) -> None:
        self.req, self.host, self.buf = req, host, buf

    def wait(self, timeout: float | None = None) -> None:
        self.req.wait(timeout)
        self.buf.view(np.uint8).set(self.host)


class StagedTransport:
    """Device arrays over a host transport: a send copies its slice to the host first (which
    waits for the device work before it), a receive lands in host memory and is copied up
    when waited for. Host slices are allocated per message: this path measures staging."""

    def __init__(self, host: Any) -> None:
        self.host, self.rank, self.size = host, host.rank, host.size

    def isend(self, buf: Any, peer: int, tag: int) -> Any:
        return self.host.isend(buf.view(np.uint8).get(), peer, tag)

    def irecv(self, buf: Any, peer: int, tag: int) -> _StagedRecv:
        landing = np.empty(int(buf.nbytes), dtype=np.uint8)
        return _StagedRecv(self.host.irecv(landing, peer, tag), landing, buf)


# -- transports whose calls complete a group before returning ---------------------------

class Done:
    """The request of a message that was complete when its call returned."""

    __slots__ = ()

    def wait(self, timeout: float | None = None) -> None:
        return None


class GroupPrepared:
    """A prepared step that is one group, complete (or queued on the stream) when `start`
    returns: nothing to wait for on the host."""

    __slots__ = ("start",)

    def __init__(self, start: Callable[[], None]) -> None:
        self.start = start

    def wait_recv(self, i: int, timeout: float | None) -> None:
        return None

    def wait_all(self, timeout: float | None) -> None:
        return None

    def free(self) -> None:
        return None
