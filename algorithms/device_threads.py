"""Ranks as threads of one process sharing one device, each rank with its own CUDA stream.

NCCL refuses two ranks of a communicator on one device, so to run the schedules' device code
(copies, CuPy reduction kernels, the order of steps) at 2-8 ranks on a single GPU the
messages are device-to-device copies between the threads' buffers, ordered by CUDA events
instead of host waits:

* ``isend(buf)`` records a *ready* event on the sender's stream (after the work that wrote
  ``buf``) and posts (buf, ready) in the pair's mailbox; nothing is copied yet;
* the matching receive's ``wait`` makes the receiver's stream wait for *ready*, queues the
  copy sender buf -> receive buf on the receiver's stream (cudaMemcpyAsync) and records a
  *consumed* event after it, which it hands back;
* the send's ``wait`` takes *consumed* and makes the sender's stream wait for it, so whatever
  the sender queues next (a kernel overwriting ``buf``) runs after the copy read it.

The host never waits for the device inside a step; it only waits for the peer thread to have
*issued* its side (a rendezvous, like a large MPI message). A receive needs only the peer's
``isend``, and every rank posts all of a step's sends before it waits for anything, so a
schedule that completes under rendezvous semantics (algorithms.verify) cannot deadlock here.
Messages of a pair with equal tags stay in order (one FIFO per (src, dst, tag)).

`cupy` is passed in (the real module, or a stand-in over host memory in tests).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from algorithms.transport import TransportTimeout

__all__ = ["DeviceThreadFabric", "DeviceThreadTransport", "run_device_threads"]


class _Mailbox:
    """FIFOs keyed by (src, dst, tag) under one condition variable."""

    def __init__(self, cond: threading.Condition) -> None:
        self._cond = cond
        self._items: dict[tuple[int, int, int], deque[Any]] = {}

    def put(self, key: tuple[int, int, int], item: Any) -> None:
        with self._cond:
            self._items.setdefault(key, deque()).append(item)
            self._cond.notify_all()

    def take(self, key: tuple[int, int, int], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                box = self._items.get(key)
                if box:
                    return box.popleft()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TransportTimeout(f"{what} after {timeout:g} s")
                self._cond.wait(left)


class DeviceThreadFabric:
    """The mailboxes of `size` thread ranks on one device."""

    def __init__(self, size: int, cupy: Any, timeout: float = 60.0) -> None:
        self.size, self.cupy, self.timeout = size, cupy, timeout
        cond = threading.Condition()
        self.posted, self.consumed = _Mailbox(cond), _Mailbox(cond)
        self.messages = 0
        self.bytes = 0

    def transport(self, rank: int, stream: Any) -> DeviceThreadTransport:
        return DeviceThreadTransport(self, rank, stream)


class _Send:
    __slots__ = ("done", "key", "transport")

    def __init__(self, transport: DeviceThreadTransport, key: tuple[int, int, int]) -> None:
        self.transport, self.key, self.done = transport, key, False

    def wait(self, timeout: float | None = None) -> None:
        if self.done:
            return
        t = self.transport
        limit = t.fabric.timeout if timeout is None else timeout
        consumed = t.fabric.consumed.take(self.key, limit, f"rank {t.rank}: send to "
                                          f"{self.key[1]} (tag {self.key[2]}) not received")
        t.stream.wait_event(consumed)
        self.done = True


class _Recv:
    __slots__ = ("buf", "done", "key", "transport")

    def __init__(self, transport: DeviceThreadTransport, key: tuple[int, int, int],
                 buf: Any) -> None:
        self.transport, self.key, self.buf, self.done = transport, key, buf, False

    def wait(self, timeout: float | None = None) -> None:
        if self.done:
            return
        t, buf = self.transport, self.buf
        fabric, cupy = t.fabric, t.fabric.cupy
        limit = fabric.timeout if timeout is None else timeout
        src, ready = fabric.posted.take(self.key, limit, f"rank {t.rank}: no message from "
                                        f"{self.key[0]} (tag {self.key[2]})")
        if src.nbytes != buf.nbytes:
            raise ValueError(f"rank {t.rank}: message from {self.key[0]} has {src.nbytes} "
                             f"bytes, the receive buffer {buf.nbytes}")
        t.stream.wait_event(ready)
        cupy.cuda.runtime.memcpyAsync(buf.data.ptr, src.data.ptr, buf.nbytes,
                                      cupy.cuda.runtime.memcpyDeviceToDevice, t.stream.ptr)
        consumed = t.event()
        consumed.record(t.stream)
        fabric.consumed.put(self.key, consumed)
        self.done = True


class DeviceThreadTransport:
    """One thread rank's side: its stream orders everything it sends and receives."""

    def __init__(self, fabric: DeviceThreadFabric, rank: int, stream: Any) -> None:
        self.fabric, self.rank, self.size, self.stream = fabric, rank, fabric.size, stream

    def event(self) -> Any:
        return self.fabric.cupy.cuda.Event(disable_timing=True)

    def isend(self, buf: Any, peer: int, tag: int) -> _Send:
        ready = self.event()
        ready.record(self.stream)
        key = (self.rank, peer, tag)
        self.fabric.posted.put(key, (buf, ready))
        self.fabric.messages += 1
        self.fabric.bytes += int(buf.nbytes)
        return _Send(self, key)

    def irecv(self, buf: Any, peer: int, tag: int) -> _Recv:
        return _Recv(self, (peer, self.rank, tag), buf)


def run_device_threads(size: int, cupy: Any, body: Callable[[DeviceThreadTransport], Any],
                       device: int = 0, timeout: float = 60.0) -> list[Any]:
    """Run ``body(transport) -> result`` on `size` threads, each with its own non-blocking
    stream on `device` made current (so CuPy kernels and copies of the rank go to it), and
    its stream synchronised before the result is taken. The first failure is re-raised."""
    fabric = DeviceThreadFabric(size, cupy, timeout)
    results: list[Any] = [None] * size
    errors: list[BaseException | None] = [None] * size

    def main(rank: int) -> None:
        try:
            cupy.cuda.Device(device).use()
            stream = cupy.cuda.Stream(non_blocking=True)
            with stream:
                results[rank] = body(fabric.transport(rank, stream))
                stream.synchronize()
        except BaseException as exc:  # noqa: BLE001  re-raised below, in the caller's thread
            errors[rank] = exc

    threads = [threading.Thread(target=main, args=(r,), name=f"device-rank-{r}", daemon=True)
               for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    for rank, exc in enumerate(errors):
        if exc is not None:
            raise RuntimeError(f"rank {rank} failed: {exc!r}") from exc
    if any(t.is_alive() for t in threads):
        raise TransportTimeout(f"thread ranks still running after {timeout + 5:g} s")
    return results
