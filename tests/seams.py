"""Seams for fast tests: the harness's core run in one process, with threads as ranks.

`MemoryStore` is the control store's client interface over a dict (no sockets, no server);
`LoopbackBackend` does every collective by exchanging numpy arrays between the threads of a
`ThreadWorld` and delivering the collective's own brute-force reference, so the harness, its
validation and its combination of rank times run for real at any world size in
milliseconds."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ccbench.backends.base import Backend, BackendInfo, RankContext
from ccbench.collectives import every
from ccbench.collectives import get as get_collective
from ccbench.run.control import StoreTimeout


class MemoryStore:
    """ControlClient's interface on a shared dict; one instance serves every thread."""

    def __init__(self) -> None:
        self._data: dict[str, Any] = {}
        self._changed = threading.Condition()

    def second_connection(self, connect_timeout: float | None = None,
                          rank0_state: object = None) -> MemoryStore:
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


def _by_reference(name: str) -> Callable[..., Callable[[], None]]:
    """A builder (`Backend.builders`) that binds LoopbackBackend's call of collective `name`."""
    def build(backend: Any, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        return functools.partial(backend._collective, name, send, recv, op, root)
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

    def info(self) -> BackendInfo:
        return {"library": "loopback", "library_version": "0", "device": "cpu", "env": {}}

    def _exchange(self, values: np.ndarray) -> list[np.ndarray]:
        return self.world.exchange(self.ctx.rank, values)

    def _deliver(self, recv: np.ndarray, values: np.ndarray) -> None:
        recv[...] = values
        if self.corrupt and recv.size:
            recv.reshape(-1)[0] += 1

    def _collective(self, name: str, send: Any, recv: Any, op: str | None, root: int) -> None:
        """Any collective by its own brute-force reference (`Collective.reference`): every
        rank's send buffer exchanged, and this rank's part of the result where it has one."""
        spec = get_collective(name)
        inputs = self._exchange(send)
        if spec.checked(self.ctx.rank, root, self.ctx.world_size):
            self._deliver(recv, spec.reference(inputs, op, self.ctx.rank, root))

    builders = {spec.name: _by_reference(spec.name) for spec in every()}

    def barrier(self) -> None:
        self.world.barrier()


def rank_context(world: ThreadWorld, rank: int) -> RankContext:
    return RankContext(rank=rank, world_size=world.world_size, local_rank=rank,
                       local_world_size=world.world_size, launcher="single",
                       store=world.store, hostname="test")  # type: ignore[arg-type]
