"""What the executor needs from a transport, and an in-process one (ranks as threads).

A transport moves contiguous 1-D array slices between ranks:

* ``isend(buf, peer, tag) -> Request`` and ``irecv(buf, peer, tag) -> Request``: start a
  transfer; ``buf`` must not be touched until the request's ``wait`` returned;
* ``Request.wait(timeout)``: block until done, raise ``TransportTimeout`` after
  ``timeout`` seconds (None: the transport's own limit);
* optionally ``prepare(sends, recvs) -> Prepared`` with sends / recvs lists of
  ``(buf, peer, tag)``: set one step's transfers up once for buffers that stay the same
  across calls (MPI persistent requests). ``Prepared`` has ``start()``,
  ``wait_recv(i, timeout)`` (the i-th recv), ``wait_all(timeout)`` and ``free()``.

Tags are the message's sequence number on its (src, dst) pair modulo ``TAG_LIMIT``, so a
transport may reorder messages of different tags; messages of equal tag must stay in order.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Protocol, runtime_checkable

__all__ = ["TAG_LIMIT", "Request", "ThreadFabric", "ThreadTransport", "Transport",
           "TransportTimeout", "run_threads"]

TAG_LIMIT = 32767          # MPI guarantees tags up to at least this


class TransportTimeout(TimeoutError):
    pass


@runtime_checkable
class Request(Protocol):
    def wait(self, timeout: float | None = None) -> None: ...


@runtime_checkable
class Transport(Protocol):
    rank: int
    size: int

    def isend(self, buf: Any, peer: int, tag: int) -> Request: ...

    def irecv(self, buf: Any, peer: int, tag: int) -> Request: ...


class _Done:
    def wait(self, timeout: float | None = None) -> None:
        return None


_DONE = _Done()


class ThreadFabric:
    """Mailboxes for `size` ranks living as threads of one process. Sends are eager (the data
    is copied at isend), recvs match the first message of their tag on the (src, dst) pair."""

    def __init__(self, size: int, timeout: float = 30.0) -> None:
        self.size, self.timeout = size, timeout
        self._boxes: dict[tuple[int, int], deque[tuple[int, Any]]] = {
            (s, d): deque() for s in range(size) for d in range(size)}
        self._cond = threading.Condition()
        self.messages = 0
        self.bytes = 0

    def transport(self, rank: int) -> ThreadTransport:
        return ThreadTransport(self, rank)

    def put(self, src: int, dst: int, tag: int, data: Any) -> None:
        with self._cond:
            self._boxes[(src, dst)].append((tag, data))
            self.messages += 1
            self.bytes += int(data.nbytes)
            self._cond.notify_all()

    def take(self, src: int, dst: int, tag: int, timeout: float | None) -> Any:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        with self._cond:
            while True:
                box = self._boxes[(src, dst)]
                for i, (t, data) in enumerate(box):
                    if t == tag:
                        del box[i]
                        return data
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TransportTimeout(f"rank {dst}: no message from rank {src} "
                                           f"with tag {tag} after {self.timeout:g} s")
                self._cond.wait(left)


class _ThreadRecv:
    def __init__(self, fabric: ThreadFabric, src: int, dst: int, tag: int, buf: Any) -> None:
        self.fabric, self.src, self.dst, self.tag, self.buf = fabric, src, dst, tag, buf
        self.done = False

    def wait(self, timeout: float | None = None) -> None:
        if self.done:
            return
        data = self.fabric.take(self.src, self.dst, self.tag, timeout)
        if data.shape != self.buf.shape or data.dtype != self.buf.dtype:
            raise ValueError(f"rank {self.dst}: message from {self.src} has {data.shape} "
                             f"{data.dtype}, the receive buffer {self.buf.shape} {self.buf.dtype}")
        self.buf[...] = data
        self.done = True


class ThreadTransport:
    def __init__(self, fabric: ThreadFabric, rank: int) -> None:
        self.fabric, self.rank, self.size = fabric, rank, fabric.size

    def isend(self, buf: Any, peer: int, tag: int) -> Request:
        self.fabric.put(self.rank, peer, tag, buf.copy())
        return _DONE

    def irecv(self, buf: Any, peer: int, tag: int) -> Request:
        return _ThreadRecv(self.fabric, peer, self.rank, tag, buf)


def run_threads(size: int, body: Any, timeout: float = 30.0) -> list[Any]:
    """Run ``body(transport) -> result`` on `size` threads; re-raise the first failure."""
    fabric = ThreadFabric(size, timeout)
    results: list[Any] = [None] * size
    errors: list[BaseException | None] = [None] * size

    def main(rank: int) -> None:
        try:
            results[rank] = body(fabric.transport(rank))
        except BaseException as exc:  # noqa: BLE001  re-raised below, in the caller's thread
            errors[rank] = exc

    threads = [threading.Thread(target=main, args=(r,), name=f"rank-{r}", daemon=True)
               for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    for rank, exc in enumerate(errors):
        if exc is not None:
            raise RuntimeError(f"rank {rank} failed: {exc!r}") from exc
    if any(t.is_alive() for t in threads):
        raise TransportTimeout(f"ranks still running after {timeout + 5:g} s")
    return results
