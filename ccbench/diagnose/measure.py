"""What every rank runs for `ccbench diagnose`: the plan's steps on the backend's world
communicator and on sub-communicators of host pairs, with the benchmark's own harness
(`measure_size`: warm-up, timed iterations, max over the pair's ranks, exact validation).

One rank per host represents it (the lowest rank on that host); with --ranks-per-host K the
others take part in creating the sub-communicators and wait. With --rails K (rail-optimized
hosts) every rank represents its NIC: the measured units are `h5 rail 1` (host x K + rail),
each rank's traffic pinned to its NIC and, in a plane step, to that NIC's port on the plane.
A pair step: every pair of the step at once, each on its own sub-communicator: latency (a
small sendrecv), then a's broadcast to b and b's to a (one direction each, payload rate).
Rank 0 collects the results through the control store, repeats the suspicious pairs and
analyses.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np

from ccbench import __version__
from ccbench.backends import backend_class
from ccbench.backends.base import Backend, BackendInfo, RankContext
from ccbench.backends.options import BackendOptions
from ccbench.bench.harness import Case, Method, SizeResult, measure_size
from ccbench.diagnose.analyse import (
    Expectation,
    Finding,
    PairMeasure,
    StartupEvidence,
    WorldResult,
    suspicious_tries,
)
from ccbench.diagnose.counters import (
    CounterDelta,
    MidRun,
    PortCounters,
    counter_deltas,
    interface_addresses,
    probe,
    probe_failures,
    read_counters,
)
from ccbench.diagnose.plan import Step
from ccbench.errors import BackendUnavailable, RunFailure, UsageError, error_line
from ccbench.records import Record, append_record
from ccbench.run.control import ControlClient, StoreLost
from ccbench.run.launchers import LaunchInfo, detect_launch
from ccbench.run.watchdog import EXIT_HUNG, Watchdog
from ccbench.trace.ops import Group
from ccbench.trace.subcomm import free_groups, split_groups

__all__ = ["DiagnoseConfig", "PlanSettings", "diagnose_rank", "verdict_record", "write_verdict"]

_STEP_STRIDE = 1000          # harness step numbers: plan step x this + pair x 4 + measurement
COMPUTE_REPEATS = 5
REPEAT_PASSES = 3            # suspicious pairs measured again: at most this many passes
COMPUTE_ELEMENTS = 1 << 20   # sine of a vector of this many float64 ...
COMPUTE_PASSES = 15          # ... this many times: about 0.15 s of one core here (numpy's
                             # element-wise code: one thread, unlike BLAS), longer than a CFS
                             # period (0.1 s), so that a CPU quota shows


class PlanSettings(TypedDict):
    """What the rest of the plan runs with after the world step (DiagnoseConfig.replan)."""

    size: int
    iters: int
    quick: bool
    repeat_passes: int
    compute: bool


@dataclass(kw_only=True)
class DiagnoseConfig:
    backend: str
    size: int
    latency_size: int
    method: Method
    quick: bool = False
    repeat: bool = True
    leaves: list[list[str]] | None = None      # host names per leaf
    leaf_count: int | None = None              # --leaves L: host i (natural order) on leaf i mod L
    planes: list[str] | None = None            # interface name per plane
    ranks_per_host: int = 1
    #: rail-optimized hosts: K rails (one rank per NIC, rank i of a host on rail i), the NIC
    #: each rail's rank pins its traffic to (None: the library's choice) and each NIC's plane
    #: ports (`planes` are then the plane numbers, "0", "1", ...)
    rails: int = 1
    rail_nics: list[str] | None = None
    rail_ports: list[list[str]] | None = None
    expect: Expectation = field(default_factory=Expectation)
    nic_speed: bool = True                     # fall back to the NIC speed the OS reports
    output: str | None = None
    argv: list[str] = field(default_factory=list)
    #: rank 0: called with the plan (steps, host names) before anything is measured
    on_plan: Callable[[list[Step], list[str], Expectation], None] | None = None
    repeat_passes: int = REPEAT_PASSES
    compute: bool = True
    #: rank 0, after the world step: (its measurement, hosts, expectation) -> the settings
    #: the rest of the plan runs with (size, iters, quick, repeat_passes, compute), which
    #: every rank applies before building the rest of the plan again
    replan: Callable[[WorldResult | None, int, Expectation], PlanSettings] | None = None


@dataclass
class Collected:
    """Rank 0's view at the end (or when a host stopped)."""

    names: list[str]
    steps: list[Step] = field(default_factory=list)
    measures: list[PairMeasure] = field(default_factory=list)
    compute_s: dict[int, list[float]] = field(default_factory=dict)
    world: WorldResult | None = None
    expect: Expectation = field(default_factory=Expectation)
    stopped: dict[int, str] = field(default_factory=dict)
    #: hosts whose rank's process ended mid-plan while the host answered on every port
    ended: dict[int, str] = field(default_factory=dict)
    #: each pair step's [kind, round, plane] and the wall time rank 0 had all its pairs
    measured_at: list[tuple[str, int, str | None, float]] = field(default_factory=list)
    leaves: list[list[int]] | None = None
    #: per host, per interface: how its counters changed during the run
    counters: dict[int, dict[str, CounterDelta]] = field(default_factory=dict)
    #: before the library: prober host -> target host -> its interfaces that did not answer
    reach: dict[int, dict[int, list[str]]] = field(default_factory=dict)
    run_id: str = ""
    #: the library's start-up that did not finish within --timeout: library, timeout_s,
    #: never_arrived (hosts whose ranks never reached it, or, when all did, those that never
    #: finished it), ranks, world_size
    startup: StartupEvidence | None = None
    #: the ports found down when the run stopped mid-plan: step, why, [[host, interface]]
    midrun: MidRun | None = None
    #: the records' run-wide fields (library, launcher, world size), once the backend is up
    meta: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)


#: set by rank 0 once it has printed the verdict of a run a host stopped answering in: the
#: status the other ranks then end with (0: the run's status is rank 0's 1, which it ends
#: with once they have gone). Not before, and not 1 from them: a bare mpiexec (hydra) kills
#: every rank as soon as one ends with a status other than 0, rank 0 among them, and then
#: itself ends with 255
STOPPED_VERDICT_KEY = "diag/stopped-verdict"
#: set by rank 0 when it starts on that verdict (it re-probes every host first): the others
#: wait for STOPPED_VERDICT_KEY up to VERDICT_DONE_S then, instead of VERDICT_WAIT_S
VERDICT_COMING_KEY = "diag/verdict-coming"
#: a rank other than 0 that gave up first asks rank 0 for the verdict here (why, missing)
STOP_REQUEST_KEY = "diag/stop-request"
#: the ranks that reached the library's start-up (start/R) and finished it (up/R)
STARTUP_KEY = "diag/library/"
#: how long a rank that gave up first waits for rank 0's verdict before it leaves
VERDICT_WAIT_S = 10.0
#: ... and once rank 0 has started on it (the re-probe of every host is bounded by 10 s)
VERDICT_DONE_S = 30.0
#: a rank blocked this long, on a host whose port has been down this long (up when the run
#: started), gives up naming it (a 3 s flap, which the library outlasts, does not)
PORT_DOWN_S = 5.0
#: how a rank's own down port is named in its request for the verdict: PORT_DOWN_NOTE + label
PORT_DOWN_NOTE = "port down: "
#: where a rank notes the wall time it first saw a port of its host down: KEY + rank/label
PORT_DOWN_KEY = "diag/port-down/"
_UP_STATES = ("up", "active")        # operstate, and an RDMA port's state
#: how late a host may note its port down: it looks once a second, from a thread that a
#: busy-polling library on a loaded host leaves little time (steps that ended this long
#: before the note are set aside too)
_NOTE_SLACK_S = 3.0
#: from a rank's saying it leaves to its process having ended (it only removes a file first)
_LEFT_TO_ENDED_S = 1.0
#: how long a rank that lost the control store (no answer: a port of its host went down)
#: keeps trying to reach it again over another path, to hear the verdict
REJOIN_S = 30.0


class _DiagnoseWatchdog(Watchdog):
    """The benchmark's watchdog; when it gives up on a rank, rank 0 first hands what it has
    to `on_stop` (the verdict, naming the stopped host or the port that went down) and ends
    with status 1, after the other live ranks have ended with 0 (they would end with
    EXIT_HUNG): srun, mpiexec and torchrun then end with the verdict's 1, and a bare
    mpiexec, which kills every rank once one ends with another status than 0, kills none."""

    on_stop: Callable[[str, dict[int, str]], None] | None = None

    def _leave_quietly(self, tell_store: bool = True, status: int = EXIT_HUNG) -> None:
        if status == EXIT_HUNG and tell_store and self.rank != 0:
            status = self._verdict_status(status)
        super()._leave_quietly(tell_store, status)

    def _verdict_status(self, status: int) -> int:
        """1 once rank 0 has given the verdict of a stopped host, else `status`. Read before
        this rank says it left: rank 0 keeps the store up until then."""
        verdict = self._await_verdict()
        return status if verdict is None else verdict

    def _await_verdict(self) -> int | None:
        """Rank 0's verdict status, once it has printed the verdict: waited for at most
        VERDICT_WAIT_S while it has not started on one and no rank has said why the run
        ended, and VERDICT_DONE_S once it has started (this rank must outlive rank 0's
        printing it: under a bare mpiexec its exit would end rank 0)."""
        start = time.monotonic()
        with contextlib.suppress(Exception):
            while True:
                verdict = self.store.peek(STOPPED_VERDICT_KEY)
                if verdict is not None:
                    return int(verdict)
                coming = self.store.peek(VERDICT_COMING_KEY) is not None
                waited = time.monotonic() - start
                if waited >= (VERDICT_DONE_S if coming else VERDICT_WAIT_S) or (
                        not coming and self.store.peek("aborted") is not None):
                    return None
                time.sleep(0.1)
        return None

    def _rejoin(self) -> bool:
        """A rank other than 0 that lost its store connection (a port of its host went down
        and the connection's packets took it: no answer for 8 s, or the kernel's reset
        after that): connect again (a new connection takes a path that works, where there
        is one) for at most REJOIN_S, so that it waits for rank 0's verdict instead of ending
        at once, which under a bare mpiexec ends rank 0 before the verdict is out. False
        where the store is gone (refused: nothing listens there) or stays out of reach."""
        if self.rank == 0:
            return False
        deadline = time.monotonic() + REJOIN_S
        while time.monotonic() < deadline:
            try:
                self.store = self.store.second_connection(
                    connect_timeout=max(1.0, min(5.0, deadline - time.monotonic())),
                    rank0_state=lambda: "gone")      # refused: the store has ended
                return True
            except Exception as failed:  # noqa: BLE001 - not yet: the next path, or give up
                if getattr(failed, "rank0_gone", False):
                    return False
                time.sleep(0.5)
        return False

    def _startup_missing(self) -> dict[int, str]:
        """The library's start-up: the ranks that never reached it (or, all having reached
        it, never finished it)."""
        with contextlib.suppress(Exception):
            started = {int(k.rsplit("/", 1)[1])
                       for k in self.store.prefix(f"{STARTUP_KEY}start/")}
            up = {int(k.rsplit("/", 1)[1]) for k in self.store.prefix(f"{STARTUP_KEY}up/")}
            absent = {r: "never arrived" for r in range(self.world_size) if r not in started}
            return absent or {r: "never finished" for r in range(self.world_size)
                              if r not in up}
        return {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # the states of this host's ports the plan measures (by their label in the plan) when
        # the run started, and how to read them now: set on the rank that reads the counters
        self.ports_before: dict[str, str] = {}
        self.port_states: Callable[[], dict[str, str]] | None = None
        self._down_since: dict[str, float] = {}
        self._down_at: dict[str, float] = {}      # wall time first seen down, kept
        self._next_port_look = 0.0
        self._stopping = False

    def _check_continued(self) -> None:
        """Also, every poll: the host's own ports (`_look_at_own_ports`); on rank 0, another
        rank that gave up first asked for the verdict (STOP_REQUEST_KEY); rank 0 gives it, as
        when it gives up itself."""
        super()._check_continued()
        if not self._stopping:
            self._look_at_own_ports()
        if (self.rank != 0 or self.on_stop is None or self._handing_over
                or self.blocked_since is None):
            return
        with contextlib.suppress(Exception):
            request = self.store.peek(STOP_REQUEST_KEY)
            if request is not None and self.store.peek("aborted") is None:
                self._handing_over = True
                self._give_up(str(request["why"]),
                              missing={int(r): w for r, w in request["missing"].items()})

    _handing_over = False

    def _look_at_own_ports(self) -> None:
        """Blocked in the library for PORT_DOWN_S while a port of this host that was up when
        the run started has been down as long: that is why (a library over TCP waits on it
        for minutes, Intel MPI until --timeout), so give up naming it and rank 0 gives the
        verdict while the launcher still runs (Slurm aborted a step whose own traffic
        crossed that port 21 s after it went down, on the testbed). Once a second."""
        now, blocked = time.monotonic(), self.blocked_since
        if self.port_states is None or now < self._next_port_look:
            return
        self._next_port_look = now + 1.0
        try:
            states = self.port_states()
        except OSError:
            return
        for label, before in self.ports_before.items():
            if before not in _UP_STATES or states.get(label) in _UP_STATES:
                self._down_since.pop(label, None)
                continue
            if label not in self._down_since:   # when, for rank 0 (measures after it)
                self._down_at.setdefault(label, time.time())
                self._note(f"{PORT_DOWN_KEY}{self.rank}/{label}", self._down_at[label])
            since = self._down_since.setdefault(label, now)
            if blocked is not None and min(now - since, now - blocked) >= PORT_DOWN_S:
                self._give_up(f"its host's port {label} went down and this rank's step has "
                              f"waited {now - blocked:.0f} s since",
                              missing={self.rank: f"{PORT_DOWN_NOTE}{label}"})

    def _note(self, key: str, value: float) -> None:
        """Set a key from `_check_continued`, which the watchdog's loop calls outside its
        handling of a lost store: the connection may cross the port that went down."""
        try:
            self.store.set(key, value)
        except StoreLost as lost:
            self._give_up("lost the control store", store_lost=lost)
        except RunFailure:
            pass

    def _give_up(self, why: str, store_lost: Any = None,
                 missing: dict[int, str] | None = None) -> None:
        # one at a time (the main thread and this one can both lose the store): the first
        # to get here decides, the other waits for the process to end (reentrant)
        self._giving_up.acquire()
        self._stopping = True
        if (self.rank != 0 and store_lost is None and self.on_stop is None
                and not self._handing_over):
            self._handing_over = True
            with contextlib.suppress(Exception):    # rank 0 gives the verdict, if it can
                if self.store.peek("aborted") is None and \
                        self.store.peek(STOPPED_VERDICT_KEY) is None:
                    lost = missing if missing is not None else self._missing_ranks(None)
                    self.store.set(STOP_REQUEST_KEY, {"why": f"rank {self.rank}: {why}",
                                                      "missing": {str(r): w for r, w
                                                                  in lost.items()}})
                    verdict = self._await_verdict()
                    if verdict is not None:
                        self._leave_quietly(status=verdict)
        if self.rank == 0 and store_lost is None and self.on_stop is not None:
            self._give_verdict(why, missing)
        if store_lost is not None and not self._handing_over and self._rejoin():
            # this rank's host is the one cut off (on one path at least), not the others;
            # a port it saw go down is why (its note was lost with the old connection)
            for label, at in self._down_at.items():
                with contextlib.suppress(Exception):
                    self.store.set(f"{PORT_DOWN_KEY}{self.rank}/{label}", at)
            self._give_up(f"its control connection stopped answering ({store_lost})", None,
                          {self.rank: f"{PORT_DOWN_NOTE}{min(self._down_at)}" if self._down_at
                           else "unreachable: its control connection stopped answering"})
        super()._give_up(why, store_lost, missing)

    def _give_verdict(self, why: str, missing: dict[int, str] | None) -> None:
        """Rank 0: the verdict of the run as far as it went; the other ranks end (with 0)
        once it is out, and rank 0 after them, with 1."""
        with contextlib.suppress(Exception):
            if self.store.peek("aborted") is None:
                self.store.set(VERDICT_COMING_KEY, 1)
                lost = missing if missing is not None else self._missing_ranks(None)
                if self.label.endswith(": initialisation"):
                    lost = self._startup_missing() or lost
                print(error_line(f"{self.label}: {why}; ranks that did not arrive: "
                                 f"{', '.join(str(r) for r in sorted(lost)) or 'unknown'}"),
                      file=sys.stderr, flush=True)
                assert self.on_stop is not None
                self.on_stop(why, lost)
                self.store.set(STOPPED_VERDICT_KEY, 0)
                self._linger_as_store_host(None, lost)
                self._outlast_the_others()
                os._exit(1)

    def _outlast_the_others(self) -> None:
        """Rank 0, the verdict out: end after every other rank's process has (at most
        VERDICT_WAIT_S), so that the launcher hears rank 0's 1 last and kills nobody. A rank
        has ended when its control connection closed, except one whose connection the store
        found silent (its host's port went down): that one may have connected again to hear
        the verdict, and has ended once it says it leaves (and a moment after)."""
        deadline = time.monotonic() + VERDICT_WAIT_S
        with contextlib.suppress(Exception):
            while time.monotonic() < deadline:
                left, dead, silent = ({int(k.split("/")[1]) for k in self.store.prefix(p)}
                                      for p in ("left/", "dead/", "unreachable/"))
                if all(r in (left if r in silent else dead) for r in range(1, self.world_size)):
                    if silent:
                        time.sleep(_LEFT_TO_ENDED_S)
                    return
                time.sleep(0.05)


def _nic_speed_bps() -> float | None:
    """The slowest speed the OS reports for this host's physical NICs (virtual ones, such as
    veth, bridges and loopback, report none or a made-up one and are skipped)."""
    speeds = []
    for name in os.listdir("/sys/class/net"):
        base = f"/sys/class/net/{name}"
        if not os.path.exists(f"{base}/device"):
            continue
        try:
            with open(f"{base}/operstate") as handle:
                if handle.read().strip() != "up":
                    continue
            with open(f"{base}/speed") as handle:
                mbps = int(handle.read().strip())
        except (OSError, ValueError):
            continue
        if mbps > 0:
            speeds.append(mbps * 1e6)
    return min(speeds) if speeds else None


def _interface_address(name: str) -> str | None:
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


class _Rank:
    def __init__(self, config: DiagnoseConfig, info: LaunchInfo, store: ControlClient,
                 watchdog: Watchdog) -> None:
        self.config, self.info, self.store, self.watchdog = config, info, store, watchdog
        self.timeout = config.method.timeout
        self.names: list[str] = []
        self.host_of: list[int] = []            # rank -> host index
        self.rep: list[int] = []                # host index -> its representative rank
        self.run_id = ""
        self.meta: BackendInfo | None = None      # the backend's, once it is set up
        self.collected: Collected | None = None
        self.counters_before: dict[str, PortCounters] = {}
        self.rail: list[int] = []               # rank -> its rail (--rails)
        self.addresses: list[dict[str, str] | None] = []   # per rank: its interfaces
        self.silent_hosts: set[int] = set()

    def ports_down_now(self, reported: list[list[Any]] | None = None) -> list[list[Any]]:
        """Rank 0, when the run stopped: every other host's addresses probed again from here
        (`mid_run_down`): [[host, interface], ...] that stopped answering, with those a host
        `reported` down itself (seen in its own port states); the hosts that answer on none
        go to `silent_hosts`."""
        from ccbench.diagnose.counters import mid_run_down

        if not self.addresses:
            return list(reported or [])
        me = self.host_of[self.info.rank]
        failed = probe_failures(me, self.addresses, self.host_of)
        labels = {self.host_of[r]: sorted(a) for r, a in enumerate(self.addresses) if a}
        groups = {self.host_of[r]: self.rail[r] if self.rail else 0
                  for r in range(len(self.host_of))}
        machine = self.names[me].split(" rail ")[0]
        local = {h for h, n in enumerate(self.names) if n.split(" rail ")[0] == machine}
        down, silent = mid_run_down(me, failed, labels, groups, local)
        self.silent_hosts = set(silent)
        return [list(d) for d in sorted(set(down) | {(h, n) for h, n in reported or []})]

    def lost_mid_run(self, step: str, why: str, lost: dict[int, str],
                     store: ControlClient | None = None
                     ) -> tuple[MidRun | None, dict[int, str], dict[int, str]]:
        """Rank 0, the run stopped at `step` with these ranks lost (rank -> why, as the
        watchdog names them): the ports found down then (MidRun), the hosts whose rank
        ended while the host still answered on every port (the process, not the network:
        host -> why), and the hosts that stopped answering (host -> why). `store`: the
        watchdog's connection (the main one may be in a blocking wait)."""
        seen = _ports_seen_down(store) if store is not None else {}
        down = self.ports_down_now([[self.host_of[r], w[len(PORT_DOWN_NOTE):]]
                                    for r, w in lost.items() if w.startswith(PORT_DOWN_NOTE)]
                                   + [[self.host_of[r], label] for r, label in seen])
        midrun: MidRun | None = {"step": step, "why": why, "down": down} if down else None
        if midrun is not None and seen and self.collected is not None:
            since = min(seen.values()) - _NOTE_SLACK_S
            midrun["set_aside"] = [[kind, number, plane] for kind, number, plane, at
                                   in self.collected.measured_at if at >= since]
        hosts = {self.host_of[r]: why for r in lost}
        if down:            # a port went down mid-run: the ranks waiting on it did not stop
            hosts = {h: w for h, w in hosts.items() if h in self.silent_hosts}
        # not a host with a port found down either: its rank may have ended over it
        gone = self.silent_hosts | {host for host, _port in down}
        ended = {self.host_of[r]: f"{step}: {why}" for r, w in lost.items()
                 if w == "dead" and self.host_of[r] not in gone}
        return midrun, ended, {h: w for h, w in hosts.items() if h not in ended}

    def port_states(self, counters: dict[str, PortCounters] | None = None) -> dict[str, str]:
        """This host's ports that the plan measures (this rank's addresses) -> their state,
        by their label in the plan; from `counters`, else read now."""
        mine = self.addresses[self.info.rank] if self.addresses else None
        read = counters if counters is not None else read_counters()
        return {label: state for label, state in self._as_planes(
            {name: row.get("state", "") for name, row in read.items()}).items()
            if mine and label in mine}

    def my_rail(self) -> int | None:
        return self.rail[self.info.rank] if self.config.rails > 1 and self.rail else None

    def interface_of(self, plane: str | None) -> str | None:
        """The interface this rank pins a step's traffic to: the plane's (with --rails, its
        NIC's port on that plane), else with --rails NICs its NIC, else none."""
        rail = self.my_rail()
        if rail is None:
            return plane
        if plane is not None and self.config.rail_ports:
            return self.config.rail_ports[rail][int(plane)]
        return self.config.rail_nics[rail] if self.config.rail_nics else None

    def _as_planes(self, by_interface: dict[str, Any]) -> dict[str, Any]:
        """With --rails: this rank's NIC's interfaces only, by plane number (its NIC itself
        as `NIC`); the other rails' are their ranks' to report."""
        rail = self.my_rail()
        if rail is None:
            return by_interface
        names = {port: str(p) for p, port in enumerate((self.config.rail_ports or [[]] * (
            rail + 1))[rail])}
        if self.config.rail_nics:
            names[self.config.rail_nics[rail]] = "NIC"
        return {names[k]: v for k, v in by_interface.items() if k in names}

    # -- set-up ---------------------------------------------------------------------------
    def learn_hosts(self) -> None:
        """Hosts by hostname, in natural order (h2 before h10). All ranks on one machine with
        one rank per host asked (`ccbench launch -n 4 diagnose`): each rank stands for a host,
        which tests the tool over loopback, not a network."""
        hostnames = self.store.gather("diag/hosts", socket.gethostname(), self.info.world_size,
                                      self.timeout)
        rails = self.config.rails
        if (len(set(hostnames)) == 1 and self.info.world_size > 1
                and self.config.ranks_per_host == 1):
            hostnames = [f"{hostnames[0]}:r{r}" for r in range(self.info.world_size)]
        elif (rails > 1 and len(set(hostnames)) == 1 and self.info.world_size > rails
              and self.info.world_size % rails == 0):     # one machine: K ranks per "host"
            hostnames = [f"{hostnames[0]}:r{r // rails}" for r in range(self.info.world_size)]
        self.names = sorted(set(hostnames), key=_natural)
        self.host_of = [self.names.index(h) for h in hostnames]
        self.rep = [hostnames.index(name) for name in self.names]
        counts = {name: hostnames.count(name) for name in self.names}
        if len(self.names) < 2:
            raise UsageError(f"diagnose needs at least 2 hosts, got 1 ({self.names[0]}: "
                             f"{len(hostnames)} rank(s)); start one rank per host on 2 or "
                             f"more hosts")
        wrong = {n: c for n, c in counts.items() if c != self.config.ranks_per_host}
        if wrong:
            raise UsageError(f"--ranks-per-host {self.config.ranks_per_host}, but "
                             + ", ".join(f"{n} has {c}" for n, c in sorted(wrong.items()))
                             + " (start the same number of ranks on every host)")
        if rails > 1:           # the NICs are the units: rank i of a host (by rank) on rail i
            machines = self.names
            self.rail = [sum(1 for q in range(r) if hostnames[q] == hostnames[r])
                         for r in range(len(hostnames))]
            self.names = [f"{h} rail {i}" for h in machines for i in range(rails)]
            self.host_of = [machines.index(h) * rails + self.rail[r]
                            for r, h in enumerate(hostnames)]
            self.rep = [self.host_of.index(e) for e in range(len(self.names))]
        self._check_planes()
        if self.info.rank == 0:
            import uuid

            self.store.set("diag/run_id", uuid.uuid4().hex[:12])
        self.run_id = self.store.get("diag/run_id", self.timeout)

    def _check_planes(self) -> None:
        """--planes names interfaces every host must have (with an address)."""
        planes = self.config.planes or []
        if self.my_rail() is not None:
            planes = [i for i in ([self.interface_of(None)] + [self.interface_of(p) for p in
                                                                planes]) if i]
        mine = [p for p in planes if _interface_address(p) is None]
        missing = self.store.gather("diag/planes", mine, self.info.world_size, self.timeout)
        bad = {self.names[self.host_of[r]]: m for r, m in enumerate(missing) if m}
        if bad:
            where = "; ".join(f"{h} lacks {', '.join(m)}" for h, m in sorted(bad.items()))
            raise UsageError(f"--planes {','.join(planes)}: {where} (this network has no such "
                             f"planes; valid: interfaces with an IPv4 address on every host)")

    def _leaf_indices(self) -> list[list[int]] | None:
        if self.config.leaf_count:
            hosts = list(range(len(self.names)))
            return [hosts[leaf::self.config.leaf_count]
                    for leaf in range(self.config.leaf_count)]
        if not self.config.leaves:
            return None
        out = []
        for members in self.config.leaves:
            unknown = [m for m in members if m not in self.names]
            if unknown:
                raise UsageError(f"--leaves names {', '.join(unknown)}, not hosts of this run "
                                 f"(valid: {', '.join(self.names)})")
            out.append([self.names.index(m) for m in members])
        return out

    def expectation(self) -> Expectation:
        expect = self.config.expect
        speeds = self.store.gather("diag/nic", _nic_speed_bps() if self.config.nic_speed
                                   else None, self.info.world_size, self.timeout)
        if expect.link_bps is None and all(s is not None for s in speeds):
            return Expectation(min(speeds), expect.latency_us, "NIC speed the OS reports")
        return expect

    # -- one step -------------------------------------------------------------------------
    def _my_pair(self, step: Step) -> tuple[int, tuple[int, int]] | None:
        if self.info.rank not in self.rep:
            return None
        me = self.host_of[self.info.rank]
        for index, pair in enumerate(step.pairs):
            if me in pair:
                return index, pair
        return None

    def _measure(self, sub: Backend, case: Case, size: int, step: int) -> SizeResult | None:
        try:
            result, _wrong = measure_size(sub, self.store, self.watchdog, case, size,
                                          self.config.method, step)
        except (UsageError, RunFailure):
            raise
        except Exception as exc:  # noqa: BLE001  a library error: usually a peer died
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            self.watchdog.abort(f"{sub.name} failed: {text[:160]}")
        if result is not None and result.wrong:
            self.watchdog.fail(f"{case.label(size)}: {result.wrong} wrong elements")
        return result

    def _pair_results(self, sub: Backend, number: int, index: int) -> dict[str, Any]:
        base = number * _STEP_STRIDE + index * 4
        size, small = self.config.size, self.config.latency_size
        out: dict[str, Any] = {}
        lat = self._measure(sub, Case("sendrecv", "float32", None, False), small, base)
        if lat is not None:
            out["lat"] = _compact(lat)
        for root, key in ((0, "ab"), (1, "ba")):
            result = self._measure(sub, Case("broadcast", "uint8", None, True, root), size,
                                   base + 1 + root)
            if result is not None:
                out[key] = _compact(result)
        return out

    def _plane_pairs(self, step: Step, number: int) -> dict[int, str]:
        """Planes: each pair first checks that its peer answers on that plane's address (a
        port that is down would otherwise hang the sub-communicator's set-up); returns the
        pairs that cannot be measured and why."""
        assert step.plane is not None
        mine = self._my_pair(step)
        if mine is not None:
            address = _interface_address(str(self.interface_of(step.plane)))
            self.store.set(f"diag/{number}/addr/{self.host_of[self.info.rank]}", address)
            index, (a, b) = mine
            other = b if self.host_of[self.info.rank] == a else a
            with self.watchdog.waiting():
                peer = self.store.get(f"diag/{number}/addr/{other}", self.timeout)
            if address is None:
                self.store.set(f"diag/{number}/down/{index}", f"no address on {step.plane}")
            elif peer is not None and not probe(peer):
                self.store.set(f"diag/{number}/down/{index}", f"no answer on {step.plane}")
        with self.watchdog.waiting():
            self.store.barrier(f"diag/{number}/probed", self.info.world_size, self.timeout)
        return {int(k.rsplit("/", 1)[1]): v
                for k, v in self.store.prefix(f"diag/{number}/down/").items()}

    def run_step(self, backend: Backend, step: Step, number: int) -> None:
        down = self._plane_pairs(step, number) if step.kind == "planes" else {}
        groups = [Group(f"diag-{number}-{i}", tuple(sorted((self.rep[a], self.rep[b]))))
                  for i, (a, b) in enumerate(step.pairs) if i not in down]
        self.watchdog.label = step.label
        variable = backend.interface_variable
        previous = os.environ.get(variable) if variable else None
        interface = self.interface_of(step.plane)
        if interface is not None and variable:  # the new groups bind to this interface
            os.environ[variable] = interface
        try:
            with self.watchdog.waiting():
                subs = split_groups(backend, groups, self.info.world_size, self.timeout)
        finally:
            if interface is not None and variable:
                if previous is None:
                    os.environ.pop(variable, None)
                else:
                    os.environ[variable] = previous
        try:
            mine = self._my_pair(step)
            if mine is not None and mine[0] not in down:
                index, _ = mine
                group = groups[[g.name for g in groups].index(f"diag-{number}-{index}")]
                sub = subs[group]
                if isinstance(sub, str):
                    raise UsageError(sub)
                results = self._pair_results(sub, number, index)
                if sub.ctx.rank == 0:
                    self.store.set(f"diag/{number}/pair/{index}", results)
            with self.watchdog.waiting():
                self.store.barrier(f"diag/{number}/done", self.info.world_size, self.timeout)
        finally:
            with self.watchdog.waiting():
                free_groups(subs, backend)
        if self.info.rank == 0:
            self._collect(step, number, down)

    def _collect(self, step: Step, number: int, down: dict[int, str]) -> None:
        assert self.collected is not None
        self.collected.steps.append(step)
        two = step.extra.get("leaves")
        leaves = (two[0], two[1]) if two is not None else None
        for index, (a, b) in enumerate(step.pairs):
            if index in down:
                self.collected.measures.append(PairMeasure(step.kind, step.round, a, b,
                                                           plane=step.plane, leaves=leaves,
                                                           error=down[index]))
                continue
            with self.watchdog.waiting():      # a stopped host must not hang rank 0 here
                got = self.store.get(f"diag/{number}/pair/{index}", self.timeout)
            measure = PairMeasure(step.kind, step.round, a, b, plane=step.plane, leaves=leaves)
            if "lat" in got:
                measure.lat_us = got["lat"]["time_us"]["median"]
            for key, attr in (("ab", "bw_ab"), ("ba", "bw_ba")):
                if key in got:
                    setattr(measure, attr, got[key]["size_used"] * 8 /
                            (got[key]["time_us"]["median"] * 1e-6))
            self.collected.measures.append(measure)
            self._records(step, a, b, got)
        self.collected.measured_at.append((step.kind, step.round, step.plane, time.time()))

    # -- world and compute ----------------------------------------------------------------
    def run_world(self, backend: Backend, number: int) -> None:
        self.watchdog.label = "world allreduce"
        result = self._measure(backend, Case("allreduce", "float32", "sum", False),
                               self.config.size, number * _STEP_STRIDE)
        if self.info.rank == 0 and result is not None and self.collected is not None:
            got = _compact(result)
            self.collected.world = {"label": f"allreduce {self.config.size} B",
                                    "time_us": got["time_us"]["median"],
                                    "busbw_bps": result.busbw_gbps * 8e9,
                                    # the fastest iteration's: the run's own spread
                                    "best_busbw_bps": result.busbw_gbps * 8e9
                                    * got["time_us"]["median"]
                                    / max(got["time_us"]["min"], 1e-9)}
            self._records(Step("world", "world allreduce"), None, None, {"world": got})

    def run_compute(self) -> None:
        """Each host in turn (its representative) runs the same element-wise work, then every
        rank meets at a barrier: the time to arrive is that host's compute time. In turn, so
        that hosts sharing cores (an emulated cluster) do not slow each other, and in
        interleaved rounds (h0 h1 ... h0 h1 ...), so that a burst of other work on the
        machine hits different hosts' repetitions rather than all of one host's."""
        self.watchdog.label = "compute probe"
        a = np.random.default_rng(0).random(COMPUTE_ELEMENTS)
        _work(a)                                            # first touch of memory, untimed
        times: list[float] = []
        for repetition in range(COMPUTE_REPEATS):
            for host in range(len(self.names)):
                if self.info.rank == self.rep[host]:
                    start = time.perf_counter()
                    _work(a)
                    times.append(time.perf_counter() - start)
                with self.watchdog.waiting():
                    self.store.barrier(f"diag/compute/{repetition}/{host}",
                                       self.info.world_size, self.timeout)
        if self.info.rank in self.rep:
            self.store.set(f"diag/compute/{self.host_of[self.info.rank]}", times)
        if self.info.rank == 0 and self.collected is not None:
            with self.watchdog.waiting():
                self.collected.compute_s = {h: self.store.get(f"diag/compute/{h}",
                                                              self.timeout)
                                            for h in range(len(self.names))}

    def repeat_rounds(self, number: int, passes: int) -> list[Step]:
        """Rank 0 picks the pairs to measure again (`suspicious_tries`: slow in their only
        try, or slow in some tries and fine in others until that is decided), unpinned and per
        plane; every rank gets the same rounds of disjoint pairs (a plane's pinned to it)."""
        if self.info.rank == 0 and self.collected is not None:
            suspects = suspicious_tries(self.collected.measures, self.collected.expect)
            by_plane: dict[str, list[list[list[int]]]] = {}
            for plane in sorted({p or "" for p, _a, _b in suspects}):
                pairs = [(a, b) for p, a, b in suspects if (p or "") == plane]
                by_plane[plane] = [[list(p) for p in r] for r in _disjoint(pairs)]
            self.store.set(f"diag/repeat/{number}", by_plane)
        with self.watchdog.waiting():
            by_plane = self.store.get(f"diag/repeat/{number}", self.timeout)
        steps = []
        for plane, rounds in sorted(by_plane.items()):
            for i, r in enumerate(rounds):
                where = f" on plane {plane}" if plane else ""
                steps.append(Step("planes" if plane else "repeat",
                                  f"repeat {passes}.{i + 1}/{len(rounds)}{where}: suspicious "
                                  f"pairs again", tuple((p[0], p[1]) for p in r), i,
                                  plane=plane or None))
        return steps

    def replan(self, build: Callable[[int, list[list[int]] | None], list[Step]]
               ) -> list[Step]:
        """After the world step: rank 0 sizes the rest of the plan from what it measured and
        fits it in the budget; every rank applies the same settings and builds the plan
        again (its world step is dropped by the caller)."""
        assert self.config.replan is not None
        if self.info.rank == 0 and self.collected is not None:
            self.store.set("diag/replan", self.config.replan(
                self.collected.world, len(self.names), self.collected.expect))
        with self.watchdog.waiting():
            settings = self.store.get("diag/replan", self.timeout)
        config = self.config
        config.size = int(settings["size"])
        config.method = dataclasses.replace(config.method, iters=int(settings["iters"]))
        config.quick = bool(settings["quick"])
        config.repeat_passes = int(settings["repeat_passes"])
        config.compute = bool(settings["compute"])
        return build(len(self.names), self._leaf_indices())

    def check_reach(self) -> None:
        """Before the library starts: every host probes every other host's interface
        addresses (a library that then hangs on a port that is down must not cost the
        verdict); rank 0 keeps who got no answer from whom."""
        me = self.info.rank in self.rep
        everyone = self.store.gather("diag/ifaddrs",
                                     self._as_planes(interface_addresses()) if me else None,
                                     self.info.world_size, self.timeout)
        self.addresses = everyone
        failed = (probe_failures(self.host_of[self.info.rank], everyone, self.host_of)
                  if me else None)
        got = self.store.gather("diag/reach", failed if me else None, self.info.world_size,
                                self.timeout)
        if self.info.rank == 0 and self.collected is not None:
            self.collected.reach = {self.host_of[r]: {t: n for t, n in rows}
                                    for r, rows in enumerate(got) if rows}

    def gather_counters(self) -> None:
        """Each host's representative: how its interface counters changed since before the
        library started; rank 0 keeps them all."""
        if self.info.rank in self.rep:
            self.store.set(f"diag/counters/{self.host_of[self.info.rank]}",
                           self._as_planes(counter_deltas(self.counters_before,
                                                          read_counters())))
        if self.info.rank == 0 and self.collected is not None:
            with self.watchdog.waiting():
                self.collected.counters = {
                    h: self.store.get(f"diag/counters/{h}", self.timeout)
                    for h in range(len(self.names))}

    # -- records --------------------------------------------------------------------------
    def _expected(self) -> dict[str, Any]:
        expect = self.collected.expect if self.collected is not None else self.config.expect
        return {"link_bps": expect.link_bps, "latency_us": expect.latency_us,
                "source": expect.source}

    def _percent(self, key: str, got: dict[str, Any]) -> float | None:
        """A measurement as % of what was expected (None without an absolute expectation):
        a one-way payload rate or the world's bus bandwidth against the link rate, a latency
        as expected / measured."""
        expect = self.collected.expect if self.collected is not None else self.config.expect
        if key == "lat":
            return expect.latency_percent(got["time_us"]["median"])
        if key == "world":
            return expect.rate_percent(got["busbw_gbps"] * 8e9)
        return expect.rate_percent(got["size_used"] * 8 / (got["time_us"]["median"] * 1e-6))

    def _leaf_hosts(self, step: Step) -> dict[str, Any]:
        """A leaf step's records name every leaf's hosts, so that `report` can tell which
        pairs cross an uplink."""
        leaves = self.collected.leaves if self.collected is not None else None
        if step.kind != "leaves" or not leaves:
            return {}
        return {"leaf_hosts": [[self.names[h] for h in members] for members in leaves]}

    def _records(self, step: Step, a: int | None, b: int | None, got: dict[str, Any]) -> None:
        if not self.config.output:
            return
        for key, value in got.items():
            collective = {"lat": "sendrecv", "world": "allreduce"}.get(key, "broadcast")
            world = self.info.world_size if key == "world" else 2
            pair = None if a is None or b is None else [self.names[a], self.names[b]]
            record = Record(
                run_id=self.run_id,
                timestamp=datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds"),
                ccbench_version=__version__, collective=collective, backend=self.config.backend,
                library=self.meta["library"] if self.meta else "",
                library_version=self.meta["library_version"] if self.meta else "",
                algorithm="native",
                transport=self.config.backend,
                device=str(self.meta.get("device", "cpu")) if self.meta else "cpu",
                dtype="float32" if collective != "broadcast" else "uint8",
                op="sum" if collective == "allreduce" else None,
                inplace=collective == "broadcast", timing="per-op", world_size=world,
                nodes=len(self.names) if key == "world" else 2,
                ranks_per_node=self.config.ranks_per_host if key == "world" else 1,
                hosts=self.names if pair is None else pair,
                root=1 if key == "ba" else 0, size_asked=value["size_asked"],
                size_used=value["size_used"], count=value["count"],
                iterations=value["iterations"], warmup=self.config.method.warmup,
                time_us=value["time_us"], samples_us=value["samples_us"],
                rank_median_us=value["rank_median_us"], algbw_gbps=value["algbw_gbps"],
                busbw_gbps=value["busbw_gbps"], wrong=value["wrong"],
                method={"timing": "per-op", "check": self.config.method.check,
                        "combine": "max over ranks", "launcher": self.info.launcher,
                        "timeout_s": self.timeout,
                        "pct_of_expected": self._percent(key, value),
                        "diagnose": {"step": step.kind, "label": step.label,
                                     "round": step.round, "pair": pair, "plane": step.plane,
                                     "direction": {"ab": "a->b", "ba": "b->a"}.get(key),
                                     "expected": self._expected(),
                                     **self._leaf_hosts(step)}},
                environment={"hostname": socket.gethostname()})
            append_record(self.config.output, record)


def verdict_record(config: DiagnoseConfig, collected: Collected,
                   findings: list[Finding]) -> Record:
    """The run's verdict as one record after its measurements: method.diagnose.findings
    (every finding as the run printed it) and leaf_hosts (every form of --leaves), which
    `report` draws; step "verdict" and collective "diagnose" (no measurement: calibrate and
    the report's other sections leave it out); time_us: the run's wall time."""
    names = collected.names
    wall_us = max(1.0, (time.monotonic() - collected.started) * 1e6)
    leaves = ({"leaf_hosts": [[names[h] for h in members] for members in collected.leaves]}
              if collected.leaves else {})
    meta = collected.meta
    return Record(
        run_id=collected.run_id,
        timestamp=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        ccbench_version=__version__, collective="diagnose", backend=config.backend,
        library=meta.get("library", ""), library_version=meta.get("library_version", ""),
        algorithm="native", transport=config.backend, device="cpu", dtype="uint8", op=None,
        inplace=False, timing="per-op", world_size=int(meta.get("world_size", len(names))),
        nodes=len(names), ranks_per_node=config.ranks_per_host, hosts=list(names), root=0,
        size_asked=0, size_used=0, count=0, iterations=0, warmup=0,
        time_us={k: wall_us for k in ("median", "mean", "min", "p5", "p95", "max")}
        | {"stdev": 0.0},
        samples_us=[], rank_median_us=[], algbw_gbps=0.0, busbw_gbps=0.0, wrong=None,
        method={"timing": "per-op", "check": config.method.check, "combine": "max over ranks",
                "launcher": meta.get("launcher", ""), "timeout_s": config.method.timeout,
                "diagnose": {"step": "verdict", "label": "verdict", "round": 0, "pair": None,
                             "plane": None, "direction": None,
                             "expected": {"link_bps": collected.expect.link_bps,
                                          "latency_us": collected.expect.latency_us,
                                          "source": collected.expect.source},
                             "stopped": {names[h]: why for h, why in collected.stopped.items()
                                         if 0 <= h < len(names)},
                             "ended": {names[h]: why for h, why in collected.ended.items()
                                       if 0 <= h < len(names)},
                             "findings": [f.to_json() for f in findings], **leaves}},
        environment={"hostname": socket.gethostname()})


def write_verdict(config: DiagnoseConfig, collected: Collected,
                  findings: list[Finding]) -> None:
    """Rank 0: append the verdict record to --output (nothing without it)."""
    if config.output:
        append_record(config.output, verdict_record(config, collected, findings))


def _work(a: np.ndarray) -> None:
    b = a
    for _ in range(COMPUTE_PASSES):
        b = np.sin(b) + a


def _natural(name: str) -> list[Any]:
    import re

    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _compact(result: SizeResult) -> dict[str, Any]:
    lay = result.layout
    return {"size_asked": lay.size_used, "size_used": lay.size_used, "count": lay.count,
            "iterations": result.iterations, "time_us": result.time_us,
            "samples_us": result.samples_us, "rank_median_us": result.rank_median_us,
            "algbw_gbps": result.algbw_gbps, "busbw_gbps": result.busbw_gbps,
            "wrong": result.wrong}


def _disjoint(pairs: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Greedy rounds of disjoint pairs (the suspicious ones share hosts: a slow host is in
    all of its pairs)."""
    rounds: list[list[tuple[int, int]]] = []
    for pair in pairs:
        for r in rounds:
            if not any(set(pair) & set(p) for p in r):
                r.append(pair)
                break
        else:
            rounds.append([pair])
    return rounds


def _startup_evidence(watchdog: Watchdog, rank: _Rank, config: DiagnoseConfig
                      ) -> StartupEvidence:
    """Rank 0, when the library's start-up timed out: the hosts whose ranks never arrived at
    it (from the store, through the watchdog's own connection), or, when every rank arrived,
    those that never finished it."""
    world = rank.info.world_size
    try:
        started = {int(k.rsplit("/", 1)[1]) for k in watchdog.store.prefix(f"{STARTUP_KEY}start/")}
        up = {int(k.rsplit("/", 1)[1]) for k in watchdog.store.prefix(f"{STARTUP_KEY}up/")}
    except Exception:  # noqa: BLE001  the store is gone: say what is known
        started, up = set(), set()
    absent = [r for r in range(world) if r not in started]
    stuck = [r for r in range(world) if r in started and r not in up]
    ranks = absent or stuck
    hosts = sorted({rank.host_of[r] for r in ranks if r < len(rank.host_of)})
    return {"library": config.backend, "timeout_s": config.method.timeout,
            "arrived": not absent, "never_arrived": hosts, "ranks": ranks,
            "world_size": world}


def _make_backend(config: DiagnoseConfig, info: LaunchInfo, store: ControlClient,
                  watchdog: Watchdog, hosts: int) -> Backend:
    cls = backend_class(config.backend)
    reason = cls.unavailable_reason()
    if reason:
        raise BackendUnavailable(f"backend {config.backend!r} unavailable: {reason}")
    ctx = RankContext(rank=info.rank, world_size=info.world_size, local_rank=info.local_rank,
                      local_world_size=info.local_world_size, launcher=info.launcher,
                      store=store, hostname=socket.gethostname(),
                      device=str(getattr(cls, "default_device", "cpu")),
                      options=BackendOptions.from_mapping({"timeout": config.method.timeout,
                                                           "multi_host": hosts > 1}))
    watchdog.label = f"{config.backend}: initialisation"
    from ccbench.run.faults import inject

    with watchdog.waiting():
        inject("init", info.rank)
        store.set(f"{STARTUP_KEY}start/{info.rank}", 1)   # arrived at the library's start-up
        backend = cls(ctx)
        store.set(f"{STARTUP_KEY}up/{info.rank}", 1)
        return backend


def _ports_seen_down(store: ControlClient) -> dict[tuple[int, str], float]:
    """(rank, port label) -> the wall time that rank first saw the port down (PORT_DOWN_KEY);
    empty where the store cannot say."""
    try:
        noted = store.prefix(PORT_DOWN_KEY)
    except Exception:           # noqa: BLE001 - the verdict goes on without it
        return {}
    seen = {}
    for key, at in noted.items():
        rank, label = key[len(PORT_DOWN_KEY):].split("/", 1)
        seen[(int(rank), label)] = float(at)
    return seen


def diagnose_rank(config: DiagnoseConfig, build: Callable[[int, list[list[int]] | None],
                                                          list[Step]],
                  on_stop: Callable[[Collected, str, dict[int, str]], None],
                  status_of: Callable[[Collected], int] | None = None
                  ) -> tuple[Collected | None, int]:
    """One rank's diagnosis, in the benchmark's rank lifecycle (ccbench.run.lifecycle). Returns
    rank 0's collected measurements (others: None) and the run's exit status, the same on
    every rank (rank 0's `status_of` the collected measurements: 1 when anything is flagged),
    so that every launcher (srun, mpiexec, torchrun) ends with it. Bad input found in the
    gathered values (--planes, --leaves) is found by every rank alike: raised once the
    control plane is closed in order."""
    from ccbench.bench.options import connect_timeout
    from ccbench.run.lifecycle import rank_lifecycle

    info = detect_launch()
    collected: Collected | None = None

    def body(store: ControlClient, watchdog: Watchdog) -> int:
        nonlocal collected
        assert isinstance(watchdog, _DiagnoseWatchdog)
        rank = _Rank(config, info, store, watchdog)
        _diagnose(rank, watchdog, build, on_stop)
        collected = rank.collected
        if info.rank == 0:
            status = status_of(collected) if status_of and collected is not None else 0
            store.set("diag/status", status)
        with watchdog.waiting():
            return int(store.get("diag/status", config.method.timeout))

    timeout = config.method.timeout
    status = rank_lifecycle(info, timeout, connect_timeout(timeout), config.argv, body,
                            watchdog_class=_DiagnoseWatchdog, raised_by_every_rank=(UsageError,))
    return collected, status


def _diagnose(rank: _Rank, watchdog: _DiagnoseWatchdog,
              build: Callable[[int, list[list[int]] | None], list[Step]],
              on_stop: Callable[[Collected, str, dict[int, str]], None]) -> None:
    """Learn the hosts, build the plan, and run it on the backend."""
    config = rank.config
    with watchdog.waiting():
        rank.learn_hosts()
        expect = rank.expectation()
    leaves = rank._leaf_indices()
    steps = build(len(rank.names), leaves)
    if rank.info.rank == 0:
        rank.collected = Collected(rank.names, expect=expect, leaves=leaves,
                                   run_id=rank.run_id,
                                   meta={"launcher": rank.info.launcher,
                                         "world_size": rank.info.world_size})
        collected = rank.collected

        def stopped(why: str, lost: dict[int, str]) -> None:
            if watchdog.label.endswith(": initialisation"):     # the library's start-up
                collected.startup = _startup_evidence(watchdog, rank, config)
                on_stop(collected, why, {})
                return
            collected.midrun, collected.ended, hosts = rank.lost_mid_run(
                watchdog.label, why, lost, watchdog.store)
            on_stop(collected, why, hosts)
        watchdog.on_stop = stopped
        if config.on_plan is not None:
            config.on_plan(steps, rank.names, expect)
    if rank.info.rank in rank.rep:
        rank.counters_before = read_counters()
    with watchdog.waiting():
        rank.check_reach()
    if rank.info.rank in rank.rep:
        watchdog.port_states = rank.port_states
        watchdog.ports_before = rank.port_states(rank.counters_before)
    backend = _make_backend(config, rank.info, rank.store, watchdog, len(rank.names))
    try:
        rank.meta = backend.info()
        if rank.collected is not None:
            rank.collected.meta.update(library=rank.meta["library"],
                                       library_version=rank.meta["library_version"])
        _run_steps(rank, backend, steps, build)
        rank.gather_counters()
    finally:
        watchdog.label = f"{config.backend}: finalisation"
        with watchdog.waiting():
            backend.finalize()


def _run_steps(rank: _Rank, backend: Backend, steps: list[Step],
               build: Callable[[int, list[list[int]] | None], list[Step]] | None = None
               ) -> None:
    number = 0
    position = 0
    while position < len(steps):
        step = steps[position]
        number += 1
        if step.kind == "world":
            rank.run_world(backend, number)
            if rank.info.rank == 0 and rank.collected is not None:
                rank.collected.steps.append(step)
            if build is not None and rank.config.replan is not None:
                steps = steps[:position + 1] + rank.replan(build)[1:]
        elif step.kind == "compute":
            rank.run_compute()
            if rank.info.rank == 0 and rank.collected is not None:
                rank.collected.steps.append(step)
        else:
            rank.run_step(backend, step, number)
        last_pairs = max((i for i, s in enumerate(steps) if s.kind in ("pairs", "planes")),
                         default=-1)
        passes = rank.config.repeat_passes if rank.config.repeat else 0
        for again in range(passes if position == last_pairs else 0):
            rounds = rank.repeat_rounds(number, again + 1)
            if not rounds:
                break
            for step_again in rounds:
                number += 1
                rank.run_step(backend, step_again, number)
        position += 1
