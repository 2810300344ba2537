"""ccbench diagnose, a run stopped mid-plan: rank 0 gives the verdict and every rank ends with
its status. Under a bare mpiexec (hydra) the first rank to exit ends every other at once, so
no rank may leave before rank 0 has printed the verdict: not a rank that read rank 0's
"verdict coming", nor the rank on the host whose port went down (its control connection
stopped answering: it connects again over a path that works and waits too)."""

from __future__ import annotations

import threading

import pytest
from seams import MemoryStore

from ccbench.diagnose import measure
from ccbench.diagnose.measure import (
    STOP_REQUEST_KEY,
    STOPPED_VERDICT_KEY,
    VERDICT_COMING_KEY,
    _DiagnoseWatchdog,
)
from ccbench.run import watchdog as watchdog_module
from ccbench.run.control import StoreLost


class _Exited(BaseException):       # not swallowed as an error would be
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


@pytest.fixture()
def no_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    """os._exit raises instead (the watchdog ends its process with it)."""
    def fake_exit(status: int) -> None:
        raise _Exited(status)
    monkeypatch.setattr(measure.os, "_exit", fake_exit)
    monkeypatch.setattr(watchdog_module, "_exit", fake_exit)
    monkeypatch.setattr(watchdog_module, "launcher_gone", lambda: False)
    monkeypatch.setattr(watchdog_module, "peer_said_why", lambda: False)


class _PollCounting(MemoryStore):
    """Counts the peeks at the verdict key: a waiting rank has looked at least N times."""

    def __init__(self) -> None:
        super().__init__()
        self.looked = threading.Semaphore(0)

    def peek(self, key: str) -> object:
        if key == STOPPED_VERDICT_KEY:
            self.looked.release()
        return super().peek(key)


def test_rank_0_says_the_verdict_is_done_only_after_printing_it(no_exit: None) -> None:
    store = MemoryStore()
    dog = _DiagnoseWatchdog(store, 0, 1, timeout=5)
    seen: list[tuple[object, object]] = []
    dog.on_stop = lambda why, lost: seen.append((store.peek(VERDICT_COMING_KEY),
                                                 store.peek(STOPPED_VERDICT_KEY)))
    with pytest.raises(_Exited) as ended:
        dog._give_up("a rank's host stopped answering", missing={1: "dead"})
    assert ended.value.status == 1              # the run's status: rank 0's, ended last
    assert seen == [(1, None)]                 # while it printed: coming, not yet done
    assert store.peek(STOPPED_VERDICT_KEY) == 0  # the others end with 0, before rank 0


def test_a_rank_outwaits_a_verdict_that_is_coming(no_exit: None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measure, "VERDICT_WAIT_S", 0.0)       # nothing coming: no wait
    monkeypatch.setattr(measure, "VERDICT_DONE_S", 600.0)
    store = _PollCounting()
    dog = _DiagnoseWatchdog(store, 2, 4, timeout=5)
    assert dog._await_verdict() is None
    store.set(VERDICT_COMING_KEY, 1)
    store.set("aborted", 0)                    # rank 0 said why: still, the verdict comes
    result: list[int | None] = []
    waiter = threading.Thread(target=lambda: result.append(dog._await_verdict()))
    waiter.start()
    for _ in range(5):                         # it has looked, and is still waiting
        assert store.looked.acquire(timeout=120)
    assert waiter.is_alive() and not result
    store.set(STOPPED_VERDICT_KEY, 0)
    waiter.join(timeout=120)
    assert result == [0]


class _Unanswered(MemoryStore):
    """The rank's first store connection, cut off; connecting again fails `fails` times
    (the path is not yet known dead) before a connection that works."""

    def __init__(self, world: MemoryStore, fails: int) -> None:
        super().__init__()
        self.world, self.fails = world, fails

    def second_connection(self, connect_timeout: float | None = None,
                          rank0_state: object = None) -> MemoryStore:
        if self.fails:
            self.fails -= 1
            raise StoreLost("connect: no route", unresponsive=True)
        return self.world


def test_the_rank_cut_off_connects_again_and_ends_with_the_verdict(
        no_exit: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measure.time, "sleep", lambda s: None)
    world = MemoryStore()
    dog = _DiagnoseWatchdog(world, 3, 4, timeout=5)
    dog.store = _Unanswered(world, fails=2)
    requested = threading.Event()

    def rank_0() -> None:                      # answers the request with the verdict
        while world.peek(STOP_REQUEST_KEY) is None:
            requested.wait(0.01)
        requested.set()
        world.set(VERDICT_COMING_KEY, 1)
        world.set(STOPPED_VERDICT_KEY, 0)
    helper = threading.Thread(target=rank_0)
    helper.start()
    lost = StoreLost("the control store did not answer within 8 s", unresponsive=True)
    with pytest.raises(_Exited) as ended:
        dog._give_up("lost the control store", store_lost=lost)
    helper.join(timeout=120)
    assert ended.value.status == 0 and requested.is_set()
    # it names its own host: its connection is the one that stopped answering
    assert world.peek(STOP_REQUEST_KEY)["missing"] == {
        "3": "unreachable: its control connection stopped answering"}


def test_the_rank_cut_off_names_the_port_it_saw_go_down(
        no_exit: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its note of the moment went with the old connection: it is set again on the new one,
    and the request names the port."""
    from ccbench.diagnose.measure import PORT_DOWN_KEY

    monkeypatch.setattr(measure, "VERDICT_WAIT_S", 0.0)
    monkeypatch.setattr(watchdog_module, "_SPEAKER_WAIT_S", 0.0)
    world = MemoryStore()
    dog = _DiagnoseWatchdog(world, 3, 4, timeout=5)
    dog.store = _Unanswered(world, fails=0)
    dog._down_at["eth1"] = 1234.5
    with pytest.raises(_Exited):
        dog._give_up("lost the control store",
                     store_lost=StoreLost("no answer", unresponsive=True))
    assert world.peek(STOP_REQUEST_KEY)["missing"] == {"3": "port down: eth1"}
    assert world.prefix(PORT_DOWN_KEY) == {f"{PORT_DOWN_KEY}3/eth1": 1234.5}
    assert world.peek("left/3") == 1


def test_a_store_that_is_gone_is_not_waited_for(no_exit: None) -> None:
    """Nothing listens where it was (rank 0, or the store host, ended): no verdict is
    coming, and the rank does not wait for one."""
    world = MemoryStore()
    dog = _DiagnoseWatchdog(world, 3, 4, timeout=5)

    class _Refused(MemoryStore):
        def second_connection(self, connect_timeout: float | None = None,
                              rank0_state: object = None) -> MemoryStore:
            assert callable(rank0_state) and rank0_state() == "gone"
            refused = StoreLost("start-up: cannot reach the control store: rank 0 exited")
            refused.rank0_gone = True
            raise refused
    dog.store = _Refused()
    assert dog._rejoin() is False


def _blocked_on_a_host_with(states: dict[str, str], before: dict[str, str]
                            ) -> _DiagnoseWatchdog:
    store = MemoryStore()
    dog = _DiagnoseWatchdog(store, 2, 4, timeout=300)
    dog.ports_before = before
    dog.port_states = lambda: dict(states)
    dog.begin_step(4, "pairs round 2/3")
    dog.enter()                                  # blocked in the library from now on
    return dog


def test_a_rank_blocked_while_its_own_port_is_down_asks_for_the_verdict_naming_it(
        no_exit: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Intel MPI waits on a port that went down until --timeout (5 minutes by default), and
    the control connection may not cross that port: the rank on the host reads its own port
    states and gives up naming the port; rank 0 adds it to what its probes found."""
    monkeypatch.setattr(measure, "PORT_DOWN_S", 0.0)
    monkeypatch.setattr(measure, "VERDICT_WAIT_S", 0.0)
    monkeypatch.setattr(watchdog_module, "_SPEAKER_WAIT_S", 0.0)
    dog = _blocked_on_a_host_with({"eth0": "up", "eth1": "down"},
                                  {"eth0": "up", "eth1": "up"})
    with pytest.raises(_Exited):
        dog._check_continued()
    request = dog.store.peek(STOP_REQUEST_KEY)
    assert request["missing"] == {"2": "port down: eth1"}
    assert "port eth1 went down" in request["why"]


@pytest.mark.parametrize("states, before", [
    ({"eth0": "up", "eth1": "up"}, {"eth0": "up", "eth1": "up"}),      # healthy
    ({"eth0": "up", "eth1": "down"}, {"eth0": "up", "eth1": "down"}),  # down from the start:
    # the probes before the library name it; the library was kept off it
])
def test_no_early_stop_without_a_port_that_went_down(no_exit: None, states, before) -> None:
    dog = _blocked_on_a_host_with(states, before)
    dog._check_continued()
    assert dog.store.peek(STOP_REQUEST_KEY) is None


def test_a_port_down_for_less_than_the_bound_does_not_stop_the_run(no_exit: None) -> None:
    """A flap (3 s down, 3 s up), which the library outlasts, is the counters' to name."""
    states = {"eth0": "up", "eth1": "down"}
    dog = _blocked_on_a_host_with(states, {"eth0": "up", "eth1": "up"})
    dog._check_continued()                       # seen down now: counted from here
    assert dog.store.peek(STOP_REQUEST_KEY) is None and "eth1" in dog._down_since
    states["eth1"] = "up"
    dog._next_port_look = 0.0
    dog._check_continued()
    assert dog._down_since == {}


def test_rank_0_names_the_ports_the_hosts_reported_down(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """The port had come back (or answers from rank 0's host) when rank 0 probed again: the
    host's own report still names it, once, beside what the probes found."""
    from types import SimpleNamespace

    from ccbench.diagnose.measure import _Rank
    rank = _Rank.__new__(_Rank)
    rank.info = SimpleNamespace(rank=0)
    rank.host_of, rank.rail, rank.names = [0, 1, 2, 3], [], ["h0", "h1", "h2", "h3"]
    rank.addresses = [{"eth0": f"10.0.0.{h}", "eth1": f"10.1.0.{h}"} for h in range(4)]
    monkeypatch.setattr(measure, "probe_failures", lambda me, addresses, host_of: [[2, ["eth0"]]])
    assert rank.ports_down_now([[3, "eth1"], [2, "eth0"]]) == [[2, "eth0"], [3, "eth1"]]
    assert rank.ports_down_now() == [[2, "eth0"]]


def test_rank_0_ends_after_the_others_have(no_exit: None, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """A launcher that ends every rank when one ends with a status other than 0 (hydra) must
    hear rank 0's 1 last: it waits until every other rank's connection has closed."""
    store = _PollCounting()
    dog = _DiagnoseWatchdog(store, 0, 3, timeout=5)
    dog.on_stop = lambda why, lost: None
    monkeypatch.setattr(measure, "VERDICT_WAIT_S", 600.0)
    monkeypatch.setattr(watchdog_module.Watchdog, "_linger_as_store_host",
                        lambda self, lost, missing: None)
    ended: list[int] = []

    def give() -> None:
        try:
            dog._give_up("a rank's host stopped answering", missing={2: "dead"})
        except _Exited as exited:
            ended.append(exited.status)
    rank_0 = threading.Thread(target=give)
    rank_0.start()
    store.set("dead/2", 1)
    while store.peek(STOPPED_VERDICT_KEY) is None:
        assert rank_0.is_alive()
        rank_0.join(0.01)
    rank_0.join(0.5)
    assert rank_0.is_alive() and not ended     # rank 1 has not gone yet
    store.set("dead/1", 1)
    rank_0.join(timeout=120)
    assert ended == [1]


def test_rank_0_waits_for_a_cut_off_rank_to_leave(no_exit: None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The store marked rank 2 dead when its connection went silent (its port went down);
    it connected again to hear the verdict: rank 0 waits until it says it leaves."""
    store = MemoryStore()
    dog = _DiagnoseWatchdog(store, 0, 3, timeout=5)
    monkeypatch.setattr(measure, "VERDICT_WAIT_S", 600.0)
    monkeypatch.setattr(measure, "_LEFT_TO_ENDED_S", 0.0)
    store.set("dead/2", 1)
    store.set("unreachable/2", 8.0)
    store.set("dead/1", 1)
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (dog._outlast_the_others(), done.set()))
    waiter.start()
    assert not done.wait(0.5)                  # rank 2 is still there
    store.set("left/2", 1)
    assert done.wait(120)


def _rank_0_of(hosts: int, down: list[list[object]], silent: set[int]) -> object:
    from types import SimpleNamespace

    from ccbench.diagnose.measure import _Rank
    rank = _Rank.__new__(_Rank)
    rank.info = SimpleNamespace(rank=0)
    rank.host_of = list(range(hosts))
    rank.silent_hosts = set(silent)
    rank.ports_down_now = lambda reported=None: sorted(down + (reported or []))
    return rank


def test_a_rank_that_ended_on_a_host_with_a_port_down_is_the_port_not_the_process() -> None:
    """h6's eth1 down mid-plan, and h6's rank's connection closed (its library gave up on the
    port): `port down`, not `rank ended` beside it (1 of 6 runs under MPI)."""
    rank = _rank_0_of(8, [[6, "eth1"]], set())
    midrun, ended, stopped = rank.lost_mid_run("pairs round 3/7", "a rank died", {6: "dead"})
    assert midrun is not None and midrun["down"] == [[6, "eth1"]]
    assert ended == {} and stopped == {}
    # a rank killed on a host that answers on every port: the process
    rank = _rank_0_of(8, [], set())
    midrun, ended, stopped = rank.lost_mid_run("pairs round 3/7", "a rank died", {2: "dead"})
    assert midrun is None and ended == {2: "pairs round 3/7: a rank died"} and stopped == {}
    # a host that answers on nothing stopped; a port its own rank reported down is named
    rank = _rank_0_of(8, [], {4})
    midrun, ended, stopped = rank.lost_mid_run(
        "pairs round 3/7", "a rank's host stopped answering",
        {4: "unreachable: no TCP answer for 8 s", 1: "port down: eth0"})
    assert midrun["down"] == [[1, "eth0"]] and ended == {}
    assert stopped == {4: "a rank's host stopped answering"}


def test_the_moment_a_port_went_down_sets_aside_the_pair_steps_measured_after_it(
        no_exit: None) -> None:
    """h6's rank notes when it first saw its port down (running or blocked); rank 0 sets
    aside the pair steps it had measured after that moment."""
    from ccbench.diagnose.measure import PORT_DOWN_KEY, Collected

    states = {"eth0": "up", "eth1": "up"}
    dog = _blocked_on_a_host_with(states, dict(states))
    dog.leave()                                   # running, not blocked
    dog._check_continued()
    assert dog.store.prefix(PORT_DOWN_KEY) == {}
    states["eth1"] = "down"
    dog._next_port_look = 0.0
    dog._check_continued()
    noted = dog.store.prefix(PORT_DOWN_KEY)
    assert list(noted) == [f"{PORT_DOWN_KEY}2/eth1"]
    at = noted[f"{PORT_DOWN_KEY}2/eth1"]
    rank = _rank_0_of(8, [], set())
    rank.collected = Collected([f"h{i}" for i in range(8)])
    # the note may come late (a busy host): a step that ended just before it goes too
    rank.collected.measured_at = [("pairs", 0, None, at - 5), ("pairs", 1, None, at - 1),
                                  ("planes", 0, "eth0", at + 2)]
    midrun, _, _ = rank.lost_mid_run("pairs round 3/7", "timed out", {}, dog.store)
    assert midrun == {"step": "pairs round 3/7", "why": "timed out", "down": [[2, "eth1"]],
                      "set_aside": [["pairs", 1, None], ["planes", 0, "eth0"]]}


def test_a_lost_store_while_noting_a_port_gives_up_instead_of_ending_the_watchdog(
        no_exit: None) -> None:
    """The note is set from the watchdog's poll, outside its handling of a lost store: the
    StoreLost killed the watchdog thread and the run hung for 300 s (MPI, port down)."""
    class _Cut(MemoryStore):
        def set(self, key: str, value: object) -> None:
            raise StoreLost("the control store stopped answering", unresponsive=True)
    states = {"eth0": "up", "eth1": "up"}
    dog = _blocked_on_a_host_with(states, dict(states))
    dog.store = _Cut()
    given: list[object] = []
    dog._give_up = lambda why, store_lost=None, missing=None: given.append(store_lost)
    states["eth1"] = "down"
    dog._check_continued()
    assert len(given) == 1 and isinstance(given[0], StoreLost)
