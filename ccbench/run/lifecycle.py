"""One rank's life around the work it does (the benchmark's cases, a trace's replay, a
diagnosis): connect to the control store, start the watchdog, wait for late ranks and agree on
the arguments, run the work, meet at the end, close, arm the exit alarm. The benchmark
(ccbench.bench.runner), the trace replay (ccbench.replay.rank) and diagnose
(ccbench.diagnose.measure) all run inside `rank_lifecycle`."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from ccbench.errors import RunFailure, UsageError
from ccbench.records import Record, append_record
from ccbench.records.table import journal_path
from ccbench.records.writer import torn_warning
from ccbench.run.arrivals import RankStates, await_ranks, rank_states, start_limit
from ccbench.run.control import (
    ControlClient,
    ControlServer,
    StoreLost,
    StoreTimeout,
    hold_interrupt,
)
from ccbench.run.faults import inject
from ccbench.run.late_interrupt import hold as hold_late
from ccbench.run.launchers import (
    LaunchInfo,
    connect_control,
    hosted_apart,
    spoken_before_connecting,
)
from ccbench.run.lifeline import describe
from ccbench.run.watchdog import Watchdog

__all__ = ["agree_on_arguments", "append_output", "close_control", "rank_lifecycle"]


def rank_lifecycle(info: LaunchInfo, timeout: float, connect_timeout: float, argv: list[str],
                   body: Callable[[ControlClient, Watchdog], int], *,
                   watchdog_class: type[Watchdog] = Watchdog,
                   raised_by_every_rank: tuple[type[BaseException], ...] = ()) -> int:
    """One rank's life around `body` (the benchmark's runs, a trace's replay, a diagnosis):
    connect to the control store, start the watchdog, wait for late ranks and agree on the
    arguments, run the body, meet at the end (a step of its own, with its fault point), close,
    and arm the exit alarm. Returns the body's exit status.

    `watchdog_class`: a Watchdog that does more when it gives up (diagnose's hands rank 0's
    partial measurements to its verdict first). `raised_by_every_rank`: errors every rank
    raises together (bad input found in values gathered from every rank): each rank then
    closes the control plane in order, rank 0 after the others' byes, before raising it, so
    that no rank still reading loses the store (exit 3) instead of exiting 2 quietly."""
    store, server = connect_control(info, timeout, connect_timeout)
    watchdog = watchdog_class(store, info.rank, info.world_size, timeout)
    apart = info.launcher == "mpiexec" and hosted_apart()
    watchdog.post_labels = apart
    watchdog.launcher = info.launcher
    watchdog.spoken_elsewhere = spoken_before_connecting()
    watchdog.rank_states = functools.partial(rank_states, info.launcher, info.world_size,
                                             info.local_world_size)
    watchdog.start()
    describe(lambda: watchdog.label)    # for the line should the launcher go (run.lifeline)
    shared: BaseException | None = None
    at_interrupt = _note_interrupt(watchdog)
    try:
        # the others connect within the connect timeout or say why not; rank 0 waits for late
        # ranks (ccbench.run.arrivals) and decides, the others wait for its verdict a little longer
        limit = start_limit(connect_timeout) + 5
        with watchdog.waiting(limit=limit + (5 if info.rank else 0)):
            agree_on_arguments(store, info, argv, limit, watchdog, connect_timeout)
        status = body(store, watchdog)
        # a step of its own, and reaching the closing barrier counts as its one op: a rank that
        # never gets there is behind the others' posted progress and named (with the store
        # outside rank 0 nothing else would tell a stopped rank 0 from a slow one)
        watchdog.begin_step(watchdog.position[0] + 1, "the end of the run")
        inject("shutdown", info.rank)
        watchdog.reached()
        with watchdog.waiting():
            store.barrier("end", info.world_size, timeout)
    except (StoreLost, StoreTimeout) as failure:
        watchdog.store_failed(failure)
        raise
    except raised_by_every_rank as error:
        shared = error
    except KeyboardInterrupt:
        # SIGINT to this rank (or to every rank, from an mpiexec that passes it on): one line,
        # from the first rank that got it, naming it; the others leave without one
        raise _interrupted(store, info, at_interrupt.get("label", watchdog.label), watchdog) \
            from None
    except BaseException:
        if apart:               # this rank says why (the CLI prints it): the store host must not
            with contextlib.suppress(RunFailure):
                store.set("aborted", info.rank)
        raise
    finally:
        # until the process exits, a SIGINT is noted and said at exit (ccbench.run.late_interrupt)
        if not hold_late(lambda: watchdog.label, info.rank) and "previous" in at_interrupt:
            signal.signal(signal.SIGINT, at_interrupt["previous"])
        watchdog.stop()
    close_control(store, server, info)
    inject("done", info.rank)
    if shared is not None:
        raise shared
    # what runs after us (MPI_Finalize at interpreter exit, library destructors) is collective
    # too and runs when no Python thread can act any more: if a peer never gets there, the
    # alarm's default action ends this process instead of letting it hang. Not sooner than
    # 25 s beyond the timeout: tearing torch down took over 10 s on a loaded machine (load 20
    # on 2 cores), and a healthy run must not end killed by this alarm
    signal.alarm(int(timeout) + 25)
    return status


def _note_interrupt(watchdog: Any) -> dict[str, Any]:
    """SIGINT raises KeyboardInterrupt as usual, noting what the rank was doing then (the
    label changes on the way out, e.g. to the backend's finalisation). Inside a control-store
    exchange it is raised once the reply is read (ccbench.run.control.hold_interrupt): raised
    in between, it left that reply to be read as the answer to the rank's next request, the
    one that tells the others it was interrupted. A second SIGINT, while the rank is already
    on its way out, changes nothing."""
    noted: dict[str, Any] = {}

    def interrupted(_signum: int, _frame: object) -> None:
        if "label" in noted:
            return
        noted["label"] = watchdog.label
        if hold_interrupt():
            return
        raise KeyboardInterrupt

    with contextlib.suppress(ValueError):          # not the main thread: leave it as it is
        noted["previous"] = signal.signal(signal.SIGINT, interrupted)
    return noted


class Interrupted(SystemExit):
    """A rank interrupted after another had said so: it leaves without a line (status 130)."""


def _interrupted(store: ControlClient, info: LaunchInfo, label: str, watchdog: Watchdog
                 ) -> BaseException:
    watchdog.leave()            # interrupted inside an op: this rank waits for no one now
    first = True
    with contextlib.suppress(RunFailure):
        first = store.add("aborted/interrupted", 1) == 1
    if not first:
        return Interrupted(128 + signal.SIGINT)
    # said here: the others (and the store host of a bare mpiexec) leave without a line of
    # their own, and rank 0, which may host the store, stays until they have read that
    watchdog._linger_as_store_host(None, {})
    return RunFailure(f"{label}: rank {info.rank} was interrupted (SIGINT); the run stops "
                      f"here, records of the sizes before are kept")


def close_control(store: ControlClient, server: ControlServer | None, info: LaunchInfo) -> None:
    """Rank 0 hosts the store and leaves last: once its interpreter shuts down (MPI_Finalize
    runs after Python's threads are frozen) the store can no longer answer, so it waits for
    a bye on both connections of every other rank (main and watchdog) first."""
    if server is None:
        store.close()
        return
    expected = 2 * (info.world_size - 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        byes = store.prefix("byes/")
        if sum(int(v) for k, v in byes.items() if k != "byes/0") >= expected:
            break
        time.sleep(0.01)
    store.close()
    server.close()


def agree_on_arguments(store: ControlClient, info: LaunchInfo, argv: list[str], timeout: float,
                        watchdog: Watchdog | None = None, connect_timeout: float | None = None
                        ) -> None:
    """Every rank checks in with its arguments; rank 0 compares them. With a watchdog and a
    connect timeout, rank 0 first waits for every rank the way ccbench.run.arrivals says (a late
    rank is waited for, a dead one named at once)."""
    digest = hashlib.sha256(json.dumps(argv).encode()).hexdigest()
    store.set(f"args/{info.rank}", {"digest": digest, "argv": argv})
    if info.rank == 0:
        if watchdog is not None and connect_timeout is not None:
            _await_ranks(store, info, watchdog, connect_timeout)
        verdict = None
        for rank in range(1, info.world_size):
            other = store.get(f"args/{rank}", timeout)
            if other["digest"] != digest:
                verdict = (f"ranks launched with different arguments: rank 0 has "
                           f"{' '.join(argv)!r}, rank {rank} has {' '.join(other['argv'])!r}")
                break
        store.set("args/verdict", verdict)
    verdict = store.get("args/verdict", timeout)
    if verdict:
        if info.rank == 0:      # it hosts the store: the others read the verdict before it goes
            for rank in range(1, info.world_size):
                store.get(f"args/read/{rank}", timeout)
        else:
            store.set(f"args/read/{info.rank}", 1)
        raise UsageError(verdict)


def _await_ranks(store: ControlClient, info: LaunchInfo, watchdog: Watchdog,
                 connect_timeout: float) -> None:
    def arrived() -> set[int]:
        return {int(key.split("/")[1]) for key in store.prefix("args/")
                if key.split("/")[1].isdigit()}

    def states() -> RankStates | None:
        return rank_states(info.launcher, info.world_size, info.local_world_size)

    started = time.monotonic()
    missing = await_ranks(arrived, info.world_size, connect_timeout, states)
    if missing:
        if all(why == "dead" for why in missing.values()):
            why = "a rank exited before it reached the control store"
        else:
            why = f"not every rank arrived within {time.monotonic() - started:.0f} s"
        watchdog.ranks_missing(why, missing)


def append_output(output: str, record: Record, watchdog: Watchdog) -> None:
    """Append one record to --output, for the benchmark and the replay alike: whole lines
    only (ccbench.records.writer: a torn last line moved to .torn first, with a warning) and
    a failed write ends the run in one line naming the file."""
    journal = journal_path(output)     # itself, unless it is .parquet
    try:
        torn = append_record(journal, record)
    except OSError as exc:
        watchdog.fail(f"cannot append to --output {output!r}: "
                      f"{exc.strerror or exc} (records before are kept)")
    if torn:
        print(torn_warning(journal, torn), file=sys.stderr, flush=True)
