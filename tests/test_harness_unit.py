"""The harness's core in one process (tests/seams.py: threads as ranks, a dict as the control
store): the timing loop, validation, the agreement on iterations, the rank-0 combination of
rank times, and the watchdog's account of who is missing — each in milliseconds, no launcher."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from seams import LoopbackBackend, MemoryStore, ThreadWorld, rank_context

from ccbench.bench.harness import Case, Method, _agree_iterations, _summarize, measure_size
from ccbench.collectives import COLLECTIVES, REDUCING, busbw_factor, get, layout
from ccbench.run.watchdog import Watchdog

FAST = Method(iters=3, warmup=1, check=1, timeout=30)


def _measure(world_size: int, case: Case, size: int, method: Method = FAST,
             corrupt_rank: int | None = None) -> list[tuple[object, int]]:
    world = ThreadWorld(world_size)

    def rank_run(rank: int) -> tuple[object, int]:
        backend = LoopbackBackend(rank_context(world, rank), world, corrupt=rank == corrupt_rank)
        watchdog = Watchdog(world.store, rank, world_size, method.timeout)   # not started
        return measure_size(backend, world.store, watchdog, case, size, method, step=1)
    return world.run(rank_run)


@pytest.mark.parametrize(("world_size", "collective", "dtype", "op", "inplace"), [
    (w, c, d, o, i) for w, c, (d, o), i in itertools.product(
        (1, 2, 3), COLLECTIVES, (("float32", "sum"), ("int8", "max"), ("bfloat16", "prod")),
        (False, True))
    if i in get(c).modes((False, True))])
def test_every_collective_measured_and_validated_in_process(world_size: int, collective: str,
                                                            dtype: str, op: str,
                                                            inplace: bool) -> None:
    case = Case(collective, dtype, op if collective in REDUCING else None, inplace,
                root=world_size - 1)
    results = _measure(world_size, case, 3000)
    result, wrong = results[0]
    assert wrong == 0 and all(w == 0 for _, w in results)
    assert all(r is None for r, _ in results[1:])              # only rank 0 combines
    assert result is not None
    assert result.wrong == 0 and result.iterations == FAST.iters
    assert len(result.samples_us) == FAST.iters and len(result.rank_median_us) == world_size
    assert result.time_us["median"] > 0


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_a_wrong_result_is_counted(collective: str) -> None:
    """The loopback corrupts one received element on rank 1: validation must see it (rank 1 is
    the root, where a reduce has its one defined result)."""
    case = Case(collective, "float32", "sum" if collective in REDUCING else None, True, root=1)
    results = _measure(3, case, 3000, corrupt_rank=1)
    assert results[1][1] >= 1                       # rank 1's own count
    assert results[0][0].wrong >= 1                 # and the combined record's


def test_sizes_that_round_to_zero_are_skipped_on_every_rank() -> None:
    assert _measure(3, Case("alltoall", "int8", None, False), 2) == [(None, 0)] * 3


def test_iterations_agreed_on_the_slowest_rank_and_capped() -> None:
    store = MemoryStore()
    method = Method(iters=5, warmup=2, min_time=1.0, max_iters=400, timeout=5)
    warm = {0: [0.001, 0.001], 1: [0.004, 0.004], 2: [0.002]}   # rank 1 is slowest: 4 ms
    world = ThreadWorld(3)
    world.store = store
    counts = world.run(lambda r: _agree_iterations(store, "k", warm[r], method, [0, 1, 2], r))
    assert counts == [250, 250, 250]                 # ceil(1 s / 4 ms), the same everywhere
    capped = Method(iters=5, warmup=2, min_time=10.0, max_iters=400, timeout=5)
    store2 = MemoryStore()
    assert ThreadWorld(3).run(
        lambda r: _agree_iterations(store2, "k", warm[r], capped, [0, 1, 2], r)) == [400] * 3
    assert _agree_iterations(MemoryStore(), "k", [1.0], Method(iters=7), [0], 0) == 7


def test_rank_zero_combines_the_slowest_rank_of_every_iteration() -> None:
    lay = layout("allreduce", 4096, 4, 3)
    per_rank = [{"samples": [1e-6, 5e-6, 2e-6], "wrong": 0, "copy_us": 0.5},
                {"samples": [3e-6, 1e-6, 2e-6], "wrong": 2, "copy_us": 0.7},
                {"samples": [2e-6, 2e-6, 9e-6], "wrong": 0, "copy_us": None}]
    result = _summarize(lay, per_rank, 3, checked=True)
    assert result.samples_us == [3.0, 5.0, 9.0]        # an iteration lasts until its last rank
    assert result.time_us["median"] == 5.0
    assert result.rank_median_us == [2.0, 2.0, 2.0]
    assert result.wrong == 2
    assert result.local_copy_us is None               # one rank did not time its copy
    assert result.algbw_gbps == pytest.approx(lay.size_used / 5e-6 / 1e9)
    assert result.busbw_gbps == pytest.approx(result.algbw_gbps * busbw_factor("allreduce", 3))
    unchecked = _summarize(lay, [{**e, "wrong": None, "copy_us": 1.0} for e in per_rank], 3,
                           checked=False)
    assert unchecked.wrong is None and unchecked.local_copy_us == 1.0


def test_watchdog_names_the_ranks_behind_or_dead() -> None:
    store = MemoryStore()
    dog = Watchdog(store, 0, 4, timeout=5)                     # not started: no thread
    dog.begin_step(3, "allreduce float32 sum in-place at 1 KiB")
    dog.enter()
    store.set("progress/1", [3, 1])                            # with us
    store.set("progress/2", [3, 0])                            # one op behind
    assert dog._missing_ranks(None) == {2: "", 3: ""}           # 3 never posted
    store.set("dead/3", 1)
    assert dog._missing_ranks(None) == {3: "dead"}             # a death explains the stop
    store.set("left/3", 1)                                     # it left on purpose instead
    assert dog._missing_ranks(None) == {2: "", 3: ""}
    assert dog._why_dead() == "a rank gave up waiting"         # no death, no dead host
    store.set("dead/1", 1)                                     # its host stopped answering
    store.set("unreachable/1", 8.0)
    assert dog._missing_ranks(None) == {1: "unreachable: no TCP answer for 8 s"}
    assert dog._why_dead() == "a rank's host stopped answering"
    store.set("dead/2", 1)
    assert dog._why_dead() == "a rank died"


def test_memory_store_barrier_and_timeout() -> None:
    store = MemoryStore()
    world = ThreadWorld(3)
    for _ in range(2):                                         # reusable, like the real one
        world.run(lambda r: store.barrier("b", 3, timeout=10))
    from ccbench.run.control import StoreTimeout

    with pytest.raises(StoreTimeout):
        store.get("never", timeout=0.05)
    assert np.isclose(store.add("n", 2), 2)


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize(("collective", "dtype", "op"), [
    ("allreduce", "float16", "sum"), ("allreduce", "float32", "sum"),
    ("allreduce", "float16", "prod"),
    ("reduce", "float32", "prod")])
def test_in_place_reductions_do_not_grow_over_many_iterations(collective: str, dtype: str,
                                                              op: str) -> None:
    """Each in-place call reduces the last call's result: from the real inputs, sums would
    grow 3x a call (float16 overflows within 11 calls, float32 within 81) and numpy warn; the
    timed calls hold the op's identity instead, and the check still uses the real inputs."""
    case = Case(collective, dtype, op, True, root=0)
    results = _measure(3, case, 3000, Method(iters=200, warmup=1, check=2, timeout=30))
    assert results[0][0].wrong == 0 and all(w == 0 for _, w in results)


def test_watchdog_names_a_stopped_rank_not_the_live_ones_waiting_for_it() -> None:
    """A rank seen stopped (SIGSTOP) is the one named; a live rank merely behind us waits for
    it (a ring's neighbour: this rank finished the call the stopped one had fed) and is not a
    cause. Without a stopped rank, every rank behind is named as before."""
    store = MemoryStore()
    dog = Watchdog(store, 0, 3, timeout=5)
    dog.begin_step(3, "allreduce float32 sum in-place at 2 KiB")
    dog.enter()
    store.set("progress/1", [3, 0])                            # behind us, alive
    store.set("progress/2", [3, 0])                            # behind us, stopped
    states = {0: "alive", 1: "alive", 2: "alive"}
    dog.rank_states = lambda: dict(states)
    missing = dog._missing_ranks(None)
    dog._stopped_peers(missing)
    assert missing == {1: "", 2: ""}
    states[2] = "stopped"
    missing = dog._missing_ranks(None)
    dog._stopped_peers(missing)
    assert missing == {2: "stopped"}
