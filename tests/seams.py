"""Seams for fast tests: the harness's core run in one process, with threads as ranks.

`MemoryStore` is the control store's client interface over a dict (no sockets, no server);
`LoopbackBackend` does every collective by exchanging numpy arrays between the threads of a
`ThreadWorld`, reducing in rank order, so the harness, its validation and its combination of
rank times run for real at any world size in milliseconds."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ccbench.backends.base import Backend, RankContext
from ccbench.run.control import StoreTimeout

_REDUCE = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


class MemoryStore:
    """ControlClient's interface on a shared dict; one instance serves every thread."""

    def __init__(self) -> None:
        self._data: dict[str, Any] = {}
        self._changed = threading.Condition()

    def second_connection(self) -> MemoryStore:
        return self

    def where(self) -> str:
        return "memory"

    def set(self, key: str, value: Any) -> None:
        with self._changed:
            self._data[key] = value
            self._changed.notify_all()

    def get(self, key: str, timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        with self._changed:
            while key not in self._data:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StoreTimeout(f"no value for {key!r} after {timeout:g} s")
                self._changed.wait(left)
            return self._data[key]

    def peek(self, key: str) -> Any:
        with self._changed:
            return self._data.get(key)

    def add(self, key: str, amount: int = 1) -> int:
        with self._changed:
            self._data[key] = int(self._data.get(key, 0)) + amount
            self._changed.notify_all()
            return int(self._data[key])

    def prefix(self, key: str) -> dict[str, Any]:
        with self._changed:
            return {k: v for k, v in self._data.items() if k.startswith(key)}

    def barrier(self, key: str, world_size: int, timeout: float) -> None:
        arrived = self.add(f"{key}/arrived")
        generation = (arrived - 1) // world_size
        if arrived % world_size == 0:          # the last one in opens this generation's gate
            self.set(f"{key}/done/{generation}", True)
        else:
            self.get(f"{key}/done/{generation}", timeout)

    def close(self) -> None:
        pass


class ThreadWorld:
    """What the ranks (threads) of one in-process run share."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.store = MemoryStore()
        self.slots: list[Any] = [None] * world_size
        self._barrier = threading.Barrier(world_size)

    def barrier(self) -> None:
        self._barrier.wait(timeout=60)

    def exchange(self, rank: int, value: np.ndarray) -> list[np.ndarray]:
        """Every rank's `value` (copied), in rank order."""
        self.slots[rank] = np.array(value, copy=True)
        self.barrier()
        values = list(self.slots)
        self.barrier()                 # nobody overwrites a slot another rank still reads
        return values

    def run(self, target: Callable[[int], Any]) -> list[Any]:
        """target(rank) on every rank at once; its results in rank order (exceptions re-raised)."""
        results: list[Any] = [None] * self.world_size
        errors: list[BaseException] = []

        def one(rank: int) -> None:
            try:
                results[rank] = target(rank)
            except BaseException as exc:  # noqa: BLE001  re-raised in the caller's thread
                errors.append(exc)
                self._barrier.abort()

        threads = [threading.Thread(target=one, args=(r,)) for r in range(self.world_size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        if errors:
            raise errors[0]
        return results


def _bound(run: Callable[..., None]) -> Callable[..., Callable[[], None]]:
    """A builder (`Backend.builders`) that binds the arguments of one of the methods below."""
    def build(backend: Any, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        return functools.partial(run, backend, send, recv, op, root)
    return build


class LoopbackBackend(Backend):
    """Collectives over a ThreadWorld. `corrupt` adds 1 to the first element this rank
    receives (a wrong result the validation must catch)."""

    name = "loopback"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    def __init__(self, ctx: RankContext, world: ThreadWorld, corrupt: bool = False) -> None:
        super().__init__(ctx)
        self.world, self.corrupt = world, corrupt

    def info(self) -> dict[str, Any]:
        return {"library": "loopback", "library_version": "0", "device": "cpu", "env": {}}

    def _exchange(self, values: np.ndarray) -> list[np.ndarray]:
        return self.world.exchange(self.ctx.rank, values)

    def _deliver(self, recv: np.ndarray, values: np.ndarray) -> None:
        recv[...] = values
        if self.corrupt and recv.size:
            recv.reshape(-1)[0] += 1

    def _reduce(self, arrays: list[np.ndarray], op: str) -> np.ndarray:
        out = arrays[0].copy()
        for other in arrays[1:]:
            _REDUCE[op](out, other, out=out)
        return out

    def _broadcast(self, send: Any, recv: Any, op: str, root: int) -> None:
        self._deliver(recv, self._exchange(recv)[root])

    def _allreduce(self, send: Any, recv: Any, op: str, root: int) -> None:
        self._deliver(recv, self._reduce(self._exchange(send), op))

    def _allgather(self, send: Any, recv: Any, op: str, root: int) -> None:
        self._deliver(recv, np.concatenate(self._exchange(send)))

    def _reduce_scatter(self, send: Any, recv: Any, op: str, root: int) -> None:
        total = self._reduce(self._exchange(send), op)
        part = recv.size
        self._deliver(recv, total[self.ctx.rank * part:(self.ctx.rank + 1) * part])

    def _alltoall(self, send: Any, recv: Any, op: str, root: int) -> None:
        arrays = self._exchange(send)
        part = recv.size // self.ctx.world_size
        rank = self.ctx.rank
        self._deliver(recv, np.concatenate([a[rank * part:(rank + 1) * part] for a in arrays]))

    def _reduce_to_root(self, send: Any, recv: Any, op: str, root: int) -> None:
        total = self._reduce(self._exchange(send), op)
        if self.ctx.rank == root:
            self._deliver(recv, total)

    def _sendrecv(self, send: Any, recv: Any, op: str, root: int) -> None:
        arrays = self._exchange(send)
        self._deliver(recv, arrays[(self.ctx.rank - 1) % self.ctx.world_size])

    def _gather(self, send: Any, recv: Any, op: str, root: int) -> None:
        arrays = self._exchange(send)
        if self.ctx.rank == root:
            self._deliver(recv, np.concatenate(arrays))

    def _scatter(self, send: Any, recv: Any, op: str, root: int) -> None:
        part, rank = recv.size, self.ctx.rank
        self._deliver(recv, self._exchange(send)[root][rank * part:(rank + 1) * part])

    builders = {name: _bound(method) for name, method in (
        ("broadcast", _broadcast), ("allreduce", _allreduce), ("allgather", _allgather),
        ("reduce-scatter", _reduce_scatter), ("alltoall", _alltoall),
        ("reduce", _reduce_to_root), ("sendrecv", _sendrecv), ("gather", _gather),
        ("scatter", _scatter))}

    def barrier(self) -> None:
        self.world.barrier()


def rank_context(world: ThreadWorld, rank: int) -> RankContext:
    return RankContext(rank=rank, world_size=world.world_size, local_rank=rank,
                       local_world_size=world.world_size, launcher="single",
                       store=world.store, hostname="test")  # type: ignore[arg-type]
