"""The control plane keeps everyone outside the run out (docs/security.md): it listens where the
ranks are, every connection proves the run's secret before it reads or changes anything, a
peer cannot make the store hold unbounded memory or connections, and the ranks never outlive
the ccbench process that started them.

The numbers the tests measure (memory around a long line, seconds for the ranks to end after
their launcher was killed) are printed (`pytest -s`); bounds are generous waits, not timings.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MPIEXEC, have_mpi
from fault_cells import tagged_processes

from ccbench.errors import RunFailure
from ccbench.records import load_records
from ccbench.run import procfs
from ccbench.run.control import (
    CONNECT_TIMEOUT_S,
    HELLO_DEADLINE_S,
    MAX_LINE_BYTES,
    SECRET_VAR,
    ControlClient,
    ControlServer,
    StoreLost,
)

ROOT = Path(__file__).resolve().parent.parent
GONE_BOUND_S = 60          # how long a test waits for processes that should end within seconds


# -- helpers --------------------------------------------------------------------------------
def _socket_inodes(pids: list[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    return inodes


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def listening(pids: list[int]) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that one of `pids` holds."""
    inodes = _socket_inodes(pids)
    found = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/net/{table}") as handle:
            for line in handle.read().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:
                    host, port = fields[1].split(":")
                    found.add((_address(host), int(port, 16)))
    return found


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def _wait_gone(tag: str, bound: float = GONE_BOUND_S) -> tuple[float, list[int]]:
    """Seconds until no process of `tag` is left (at most `bound`), and what is left then."""
    started = time.monotonic()
    while time.monotonic() - started < bound:
        left = tagged_processes(tag)
        if not left:
            return time.monotonic() - started, []
        time.sleep(0.1)
    return time.monotonic() - started, tagged_processes(tag)


def _kill_tagged(tag: str) -> None:
    for pid in tagged_processes(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _ranks(tag: str, rank_var: str = "RANK") -> dict[int, int]:
    """rank -> pid of the rank processes of `tag` (the first of each: not the MPI_Init guard)."""
    found: dict[int, int] = {}
    for pid in sorted(tagged_processes(tag)):
        env = procfs.environ(pid)
        if env is not None and rank_var.encode() in env:
            found.setdefault(int(env[rank_var.encode()]), pid)
    return found


def _wait_for(condition: object, bound: float, what: str) -> None:
    started = time.monotonic()
    while time.monotonic() - started < bound:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {bound:g} s")


@pytest.fixture
def server() -> Iterator[ControlServer]:
    store = ControlServer("127.0.0.1", 0, world_size=2)
    try:
        yield store
    finally:
        store.close()


class Raw:
    """A client that speaks the wire format without the secret."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.stream = self.sock.makefile("rwb")

    def line(self) -> bytes:
        try:
            return bytes(self.stream.readline())
        except OSError:
            return b""

    def send(self, message: dict[str, object]) -> None:
        try:
            self.stream.write((json.dumps(message) + "\n").encode())
            self.stream.flush()
        except OSError:
            pass

    def close(self) -> None:
        try:
            self.stream.close()
        except OSError:
            pass                       # the store has already closed it
        self.sock.close()


# -- authentication --------------------------------------------------------------------------
def test_an_unproven_connection_reads_nothing_changes_nothing_and_is_no_rank(
        server: ControlServer) -> None:
    rank0 = ControlClient("127.0.0.1", server.port, 0, secret=server.secret)
    rank0.set("args/0", {"argv": ["allreduce"]})
    rank0.set("m/1/times/0", {"samples": [1e-5, 2e-5], "wrong": 0, "copy_us": None})
    before = server.snapshot()
    attempts: list[dict[str, object]] = [
        {"cmd": "prefix", "key": ""},
        {"cmd": "set", "key": "m/1/times/1", "value": {"samples": [5.0], "wrong": 7}},
        {"cmd": "set", "key": "aborted", "value": 1},
        {"cmd": "set", "key": "dead/1", "value": 1},
        {"cmd": "hello", "rank": 1, "proof": "0" * 64, "nonce": "ab"},
        {"cmd": "hello", "rank": 1, "proof": "0" * 64, "nonce": "0" * 64},
    ]
    for attempt in attempts:
        raw = Raw(server.port)
        raw.send(attempt)
        answers = [raw.line(), raw.line()]
        raw.close()
        assert answers[0] in (b"", b'{"ok": false, "error": "authentication failed"}\n'), answers
        assert answers[1] == b"", answers                  # and then the connection is closed
    # a foreign hello then a close without a goodbye: no rank arrived, none died
    raw = Raw(server.port)
    raw.send({"cmd": "hello", "rank": 1, "track": True})
    raw.close()
    _wait_for(lambda: server.dropped >= len(attempts) + 1, 30, "the foreign connections dropped")
    assert server.snapshot() == before
    assert server.arrived == {0} and server.open_ranks == 1
    assert rank0.prefix("") == before[2]
    rank0.close()


def test_a_rank_with_another_secret_is_refused(server: ControlServer) -> None:
    with pytest.raises(RunFailure, match="refused rank 1's proof"):
        ControlClient("127.0.0.1", server.port, 1, secret="not the run's secret")
    assert server.arrived == set()


def test_a_rank_does_not_trust_a_store_that_cannot_prove_the_secret() -> None:
    """Whatever else listens on the store's port (a port taken in a race) is not believed."""
    with socket.create_server(("127.0.0.1", 0)) as impostor:
        port = impostor.getsockname()[1]
        import threading

        def answer() -> None:
            conn, _ = impostor.accept()
            with conn, conn.makefile("rwb") as stream:
                stream.write(b'{"challenge": "abc"}\n')
                stream.flush()
                stream.readline()
                stream.write(b'{"ok": true, "proof": "0"}\n')
                stream.flush()
                stream.readline()

        threading.Thread(target=answer, daemon=True).start()
        with pytest.raises(RunFailure, match="not this run's control store"):
            ControlClient("127.0.0.1", port, 1, secret="s", connect_timeout=10)


def test_values_are_checked_before_they_are_stored(server: ControlServer) -> None:
    rank = ControlClient("127.0.0.1", server.port, 0, secret=server.secret)
    before = server.snapshot()[2]
    bad = [("m/2/times/1", {"samples": [float("nan")], "wrong": 0}),
           ("m/2/times/1", {"samples": [float("inf")], "wrong": 0}),
           ("m/2/times/1", {"samples": [-1.0], "wrong": 0}),
           ("m/2/times/1", {"samples": ["5"], "wrong": 0}),
           ("m/2/times/1", {"samples": [1e-5], "wrong": -3}),
           ("m/2/warm/1", 1e308 * 10),
           ("dead/1", 1), ("byes/1", 1), ("unreachable/1", 8), ("elsewhere/1", 1)]
    for key, value in bad:
        with pytest.raises(RunFailure, match="control store"):
            rank.set(key, value)
    with pytest.raises(RunFailure, match="bad amount"):
        rank.add("end/count", 10**9)
    assert server.snapshot()[2] == before
    rank.set("m/2/times/0", {"samples": [0.0, 3e-6], "wrong": 0, "copy_us": 1.5})
    # the local copy's time is in microseconds: 0.2 s of it (a host held to 5 % of a core,
    # diagnose's CPU cell) is a time, not more than a day's worth
    rank.set("m/4/times/0", {"samples": [0.3], "wrong": 0, "copy_us": 200000.0})
    with pytest.raises(RunFailure, match="control store"):
        rank.set("m/4/times/1", {"samples": [0.3], "wrong": 0, "copy_us": 86400.0 * 1e6})
    # a proven rank's largest real value: a size's times at the default --max-iters (2.4 MB)
    many = {"samples": [1.2345678901234567e-05] * 100000, "wrong": 0, "copy_us": None}
    rank.set("m/3/times/0", many)
    assert rank.get("m/3/times/0", 5) == many
    rank.close()


# -- bounds ----------------------------------------------------------------------------------
_STORE_PROCESS = """
import resource, sys
limit = int(sys.argv[1])
if limit:
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
from ccbench.run.control import ControlServer
server = ControlServer("127.0.0.1", 0, world_size=2)
print(server.port, server.secret, flush=True)
sys.stdin.read()
"""


@pytest.fixture
def store_process(request: pytest.FixtureRequest) -> Iterator[tuple[subprocess.Popen[str], int,
                                                                     str]]:
    limit = getattr(request, "param", 0)
    proc = subprocess.Popen([sys.executable, "-c", _STORE_PROCESS, str(limit)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    port, secret = proc.stdout.readline().split()
    try:
        yield proc, int(port), secret
    finally:
        proc.kill()
        proc.communicate()


def _memory_kib(pid: int) -> dict[str, int]:
    fields = {}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0])
    return fields


def test_a_long_line_is_dropped_with_bounded_memory(
        store_process: tuple[subprocess.Popen[str], int, str]) -> None:
    proc, port, secret = store_process
    rank = ControlClient("127.0.0.1", port, 0, secret=secret)
    rank.set("args/0", {"argv": ["x"]})
    before = _memory_kib(proc.pid)
    raw = Raw(port)
    chunk = b"x" * (1 << 20)
    sent = 0
    try:
        for _ in range(10):                       # 10 MiB, no newline
            raw.sock.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass                                      # dropped before the end: as it should be
    assert raw.line() == b""
    raw.close()
    after = _memory_kib(proc.pid)
    print(f"\nstore process: VmRSS {before['VmRSS']} KiB before, {after['VmRSS']} KiB after, "
          f"peak {after['VmHWM']} KiB; {sent >> 20} MiB of the line accepted by the socket")
    assert after["VmHWM"] - before["VmRSS"] < 8 * 1024, (before, after)
    assert rank.get("args/0", 5) == {"argv": ["x"]}         # the store serves on
    rank.close()
    proc.kill()
    err = proc.communicate()[1]
    assert f"a line longer than {MAX_LINE_BYTES // 1024} KiB" in err, err


@pytest.mark.parametrize("store_process", [16], indirect=True)
def test_no_descriptors_left_does_not_stop_the_store(
        store_process: tuple[subprocess.Popen[str], int, str]) -> None:
    """At 16 descriptors, 300 connections: accept() runs out of descriptors (EMFILE) and keeps
    going; a rank connected before is served throughout, and a rank connects once the flood
    has gone."""
    proc, port, secret = store_process
    rank = ControlClient("127.0.0.1", port, 0, secret=secret)
    rank.set("args/0", 1)
    flood = []
    for _ in range(300):
        try:
            flood.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            break
    assert rank.peek("args/0") == 1
    # on a loaded machine the store may not have accepted the flood yet: hold it until the
    # store has used its descriptors (bounded), so that accept() does run out of them
    deadline = time.monotonic() + 60
    while len(os.listdir(f"/proc/{proc.pid}/fd")) < 16 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1)
    for sock in flood:
        sock.close()
    late = ControlClient("127.0.0.1", port, 1, secret=secret, connect_timeout=60)
    late.set("args/1", 2)
    assert rank.prefix("args/") == {"args/0": 1, "args/1": 2}
    late.close()
    rank.close()
    proc.kill()
    err = proc.communicate()[1]
    warnings = [line for line in err.splitlines() if line.startswith("ccbench: warning:")]
    assert any("cannot accept a connection (Too many open files); retrying" in line
               for line in warnings), err
    assert len(warnings) <= 10, err                   # one line each, the first ten
    assert "Traceback" not in err, err


def test_proven_connections_beyond_the_limit_are_refused(server: ControlServer) -> None:
    ranks = [ControlClient("127.0.0.1", server.port, 0, secret=server.secret)
             for _ in range(server.max_connections)]
    with pytest.raises(StoreLost, match=r"full of proven connections \(more than the ranks "
                                        r"need\); no rank is missing"):
        ControlClient("127.0.0.1", server.port, 1, secret=server.secret, connect_timeout=1)
    assert ranks[0].prefix("") == {}
    for rank in ranks:
        rank.close()


def test_silent_connections_take_no_slot_a_rank_needs(server: ControlServer,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """However many connections sit there without a hello (here they would for ten minutes),
    a rank that comes later gets in: waiting connections beyond MAX_UNPROVEN evict the
    oldest, and only proven ones count against the connection limit."""
    from ccbench.run import control

    monkeypatch.setattr(control, "HELLO_DEADLINE_S", 600.0)
    silent = [Raw(server.port) for _ in range(2 * (server.max_connections + control.MAX_UNPROVEN))]
    _wait_for(lambda: server.dropped >= len(silent) - control.MAX_UNPROVEN, 60, "all accepted")
    rank = ControlClient("127.0.0.1", server.port, 1, secret=server.secret, connect_timeout=10)
    rank.set("args/1", 1)
    assert server.arrived == {1}
    rank.close()
    for raw in silent:
        raw.close()


# a local process without the secret that opens connections to the store as fast as it can
# and holds each one without a word (it closes its own oldest only to stay within its
# descriptors)
_FLOOD = """
import collections, socket, sys
held = collections.deque()
print("flooding", flush=True)
while True:
    try:
        held.append(socket.create_connection(("127.0.0.1", int(sys.argv[1]))))
    except OSError:
        pass
    if len(held) > 400:
        held.popleft().close()
"""


def test_connections_that_prove_nothing_do_not_keep_the_ranks_out(server: ControlServer
                                                                  ) -> None:
    """Connections that have not proven the secret take no slot a rank needs: a process that
    floods the store with them while the ranks start delays the ranks, never keeps them out
    (before, it held every slot and the run ended blaming a healthy rank)."""
    floods = [subprocess.Popen([sys.executable, "-c", _FLOOD, str(server.port)],
                               stdout=subprocess.PIPE, text=True)]
    try:
        for flood in floods:
            assert flood.stdout is not None and flood.stdout.readline()
        _wait_for(lambda: server.dropped > 2 * server.max_connections, 60, "the flood")
        # within the default connect timeout
        ranks = [ControlClient("127.0.0.1", server.port, rank, secret=server.secret,
                               connect_timeout=CONNECT_TIMEOUT_S) for rank in (0, 1)]
        watchdog = ranks[1].second_connection()
        ranks[0].set("args/0", 1)
        assert ranks[1].get("args/0", 30) == 1
        assert server.arrived == {0, 1}
        watchdog.close()
        for rank in ranks:
            rank.close()
    finally:
        for flood in floods:
            flood.kill()
            flood.wait()


def test_a_connection_that_does_not_say_hello_is_closed(server: ControlServer) -> None:
    silent = Raw(server.port)
    slow = Raw(server.port)
    started = time.monotonic()
    closed = False
    while time.monotonic() - started < 6 * HELLO_DEADLINE_S:   # a byte every half second
        try:
            slow.sock.sendall(b"{")
        except OSError:
            closed = True
            break
        time.sleep(0.5)
    assert closed, "a hello sent a byte at a time kept its connection"
    assert silent.line() == b""
    _wait_for(lambda: server.dropped >= 2, 30, "both dropped")
    assert server.snapshot() == (0, [], {})



def test_a_rank_gone_while_its_get_waits_is_seen_closed_before_the_get_times_out(
        server: ControlServer) -> None:
    """The store host of a bare mpiexec (watch_hangups): a rank that ended while the store
    waited on a key for it (diagnose, a rank leaving once the verdict was out) is closed at
    once, not when its get times out. Until every connection has closed the store host stays,
    and with it the output pipes the MPI proxy waits on: the run ended 45 s after its last
    rank (the testbed, a port down under --backend mpi)."""
    server.watch_hangups()
    rank = ControlClient("127.0.0.1", server.port, 1, secret=server.secret)
    _wait_for(lambda: server.snapshot()[0] == 1, GONE_BOUND_S, "the rank's connection")
    raw = rank._sock
    raw.sendall(b'{"cmd": "get", "key": "never", "timeout": 3600}\n')
    raw.shutdown(socket.SHUT_RDWR)         # as the kernel closes it for a process that ended
    _wait_for(lambda: server.snapshot()[0] == 0, 2 * GONE_BOUND_S,
              "a rank gone while its get waited still counted as open")
    open_ranks, closed, data = server.snapshot()
    assert closed == [(1, False)] and server.hangups == [1]
    assert "dead/1" in data and "unreachable/1" not in data
    raw.close()

# -- whole runs ------------------------------------------------------------------------------
def _launch(tag: str, bench: list[str], **popen: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ccbench", "launch", "-n", "2", *bench],
                            env={**os.environ, "CCBENCH_FAULT_TAG": tag,
                                 "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            **popen)  # type: ignore[call-overload]


LONG = ["allreduce", "--sizes", "16M", "--iters", "100000", "--warmup", "1", "-q"]  # minutes on any backend


@pytest.mark.slow
def test_a_local_run_listens_on_loopback_only(tmp_path: Path) -> None:
    tag = f"ccbench-listen-{uuid.uuid4().hex[:8]}"
    proc = _launch(tag, ["allreduce", "--backend", "gloo", "--sizes", "1K-1M", "--iters", "30",
                         "--warmup", "2", "-q", "--output", str(tmp_path / "r.jsonl")])
    seen: set[tuple[str, int]] = set()
    try:
        while proc.poll() is None:
            seen |= listening(tagged_processes(tag))
            time.sleep(0.2)
        _, err = proc.communicate(timeout=60)
    finally:
        _kill_tagged(tag)
    assert proc.returncode == 0, err
    print(f"\nlistening during the run: {sorted(seen)}")
    # the control store, torch's rendezvous store and gloo's listener
    assert len({port for _, port in seen}) >= 3, seen
    assert all(_is_loopback(address) for address, _ in seen), seen


@pytest.mark.slow
@pytest.mark.parametrize("backend,how", [("gloo", signal.SIGKILL), ("gloo", signal.SIGHUP),
                                         ("mpi", signal.SIGKILL)])
def test_ranks_end_when_their_launcher_is_killed(backend: str, how: signal.Signals) -> None:
    if backend == "mpi" and not have_mpi():
        pytest.skip("needs mpiexec beside python")
    tag = f"ccbench-orphan-{uuid.uuid4().hex[:8]}"
    rank_var = "PMI_RANK" if backend == "mpi" else "RANK"
    launcher = _launch(tag, [*LONG, "--backend", backend])
    try:
        _wait_for(lambda: len(_ranks(tag, rank_var)) == 2, 120, "both ranks started")
        time.sleep(5)                      # connected and measuring
        assert launcher.poll() is None, launcher.communicate()[1]
        killed = time.monotonic()
        os.kill(launcher.pid, how)
        launcher.wait(timeout=60)
        _, left = _wait_gone(tag)
        took = time.monotonic() - killed
    finally:
        _kill_tagged(tag)
    print(f"\n{backend}: the ranks ended {took:.1f} s after {how.name} of the launcher")
    assert not left, f"still running {GONE_BOUND_S} s after the launcher's {how.name}: {left}"


@pytest.mark.slow
def test_ctrl_c_of_a_launch_is_named_as_an_interruption() -> None:
    tag = f"ccbench-sigint-{uuid.uuid4().hex[:8]}"
    launcher = _launch(tag, [*LONG, "--backend", "gloo"])
    try:
        _wait_for(lambda: len(_ranks(tag)) == 2, 120, "both ranks started")
        time.sleep(5)
        os.kill(launcher.pid, signal.SIGINT)
        _, err = launcher.communicate(timeout=120)
        _, left = _wait_gone(tag)
    finally:
        _kill_tagged(tag)
    errors = [line for line in err.splitlines() if line.startswith("ccbench: error:")]
    assert errors == ["ccbench: error: interrupted (SIGINT); the ranks were stopped"], err
    assert launcher.returncode == 130 and not left


_SWEEP = """\
name: held
backends: [gloo]
sizes: 1K
ranks_per_node: [2]
modes: [out-of-place]
iters: 100000
warmup: 1
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_the_running_case_ends_with_its_sweep(tmp_path: Path, how: signal.Signals) -> None:
    (tmp_path / "held.yaml").write_text(_SWEEP)
    tag = f"ccbench-sweep-{uuid.uuid4().hex[:8]}"
    sweep = subprocess.Popen([sys.executable, "-m", "ccbench", "sweep", "held.yaml"],
                             cwd=tmp_path, env={**os.environ, "CCBENCH_FAULT_TAG": tag,
                                                "PYTHONPATH": str(ROOT)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: len(_ranks(tag)) == 2, 120, "both ranks of the case started")
        time.sleep(5)
        killed = time.monotonic()
        os.kill(sweep.pid, how)
        out, err = sweep.communicate(timeout=120)
        _, left = _wait_gone(tag)
        took = time.monotonic() - killed
    finally:
        _kill_tagged(tag)
    print(f"\nsweep {how.name}: its case ended {took:.1f} s after the sweep did")
    assert not left, f"the case still runs {GONE_BOUND_S} s after the sweep's {how.name}"
    if how == signal.SIGTERM:
        assert sweep.returncode == 128 + signal.SIGTERM, out + err
        assert "ccbench sweep: terminated (SIGTERM); stopping the running case" in out, out
        assert "(dead)" not in err, err


@pytest.mark.slow
def test_a_foreign_hello_does_not_hold_a_bare_mpiexec_run(tmp_path: Path) -> None:
    """Under a bare mpiexec the store lives in a process of its own, which ends when the
    ranks' connections have: a foreign connection that says hello (without the secret) and
    closes must neither count as a rank nor keep that process, and so mpiexec, alive; forged
    times and a forged death change no record."""
    if not have_mpi():
        pytest.skip("needs mpiexec beside python")
    tag = f"ccbench-foreign-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "r.jsonl"
    started = time.monotonic()
    proc = subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, "-m", "ccbench", "allreduce",
                             "--backend", "mpi", "--sizes", "1K-64K", "--iters", "200",
                             "--warmup", "2", "-q", "--output", str(out)],
                            env={**os.environ, "CCBENCH_FAULT_TAG": tag,
                                 "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        port = _wait_store_host(tag)
        forgeries: list[dict[str, object]] = [
            {"cmd": "set", "key": f"m/{step}/times/1", "value": {"samples": [5.0] * 200,
                                                                 "wrong": 7}}
            for step in range(1, 15)]
        for attempt in [*forgeries, {"cmd": "set", "key": "dead/1", "value": 1},
                        {"cmd": "hello", "rank": 1, "track": True}]:
            raw = Raw(port)
            raw.send(attempt)                 # at once, as to a store that asks for nothing
            raw.close()
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
        _kill_tagged(tag)
    took = time.monotonic() - started
    print(f"\nbare mpiexec with a foreign hello: exit {proc.returncode} after {took:.1f} s")
    assert proc.returncode == 0, err
    records = load_records(out)
    assert len(records) == 14                         # 7 sizes, out-of-place and in-place
    assert all(r.wrong == 0 and r.time_us["max"] < 1e6 for r in records), records
    assert [line for line in err.splitlines() if line.startswith("ccbench: error")] == [], err


def _wait_store_host(tag: str) -> int:
    """The port of the store host (the process rank 0 forked into a session of its own)."""
    found: list[int] = []

    def look() -> bool:
        for pid in tagged_processes(tag):
            try:
                with open(f"/proc/{pid}/stat") as handle:
                    fields = handle.read().rpartition(")")[2].split()
            except OSError:
                continue
            env = procfs.environ(pid) or {}
            # a session leader carrying rank 0's environment (hydra's proxy leads a session
            # of its own too, but carries no rank)
            if int(fields[3]) == pid and env.get(b"PMI_RANK") == b"0":
                ports = [port for _, port in listening([pid])]
                if ports:
                    found.append(ports[0])
                    return True
        return False

    _wait_for(look, 120, "the store host listening")
    return found[0]


def test_the_secret_is_not_written_to_records_or_logs(tmp_path: Path) -> None:
    """The secret travels in the ranks' environment; nothing copies it out."""
    from ccbench.bench.runner import _environment

    os.environ[SECRET_VAR] = "do-not-copy-me"
    try:
        assert "do-not-copy-me" not in json.dumps(_environment())
    finally:
        del os.environ[SECRET_VAR]


# a rank under a bare mpiexec, in miniature: its parent stands for the MPI's proxy; it forks the
# store host, connects as rank 0, optionally says it has spoken, and ends without a goodbye
_STORE_HOST_RANK = """
import os, sys
from ccbench.run.control import ControlClient, new_secret
from ccbench.run.storehost import note_spoken, start_store_host
secret = new_secret()
port = start_store_host("mpiexec", "127.0.0.1", secret, 1)
client = ControlClient("127.0.0.1", port, 0, secret=secret)
print(os.getppid(), flush=True)
command = sys.stdin.readline().strip()
if command == "spoke":
    note_spoken(os.getppid())
os._exit(1)
"""
_PROXY = "import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', sys.argv[1]]))"


def _store_host_line(outsider_speaks: bool, rank_speaks: bool) -> str:
    """What the store host of a miniature bare-mpiexec run says when its only rank ends."""
    from ccbench.run.storehost import note_spoken

    proc = subprocess.Popen([sys.executable, "-c", _PROXY, _STORE_HOST_RANK],
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        proxy = int(proc.stdout.readline())
        assert proxy == proc.pid
        if outsider_speaks:
            note_spoken(proxy)           # from this process: not below the ranks' proxy
        proc.stdin.write("spoke\n" if rank_speaks else "die\n")
        proc.stdin.flush()
        _, err = proc.communicate(timeout=120)   # EOF once the store host has gone too
    finally:
        if proc.poll() is None:
            proc.kill()
    return err


def test_only_the_ranks_can_silence_the_store_host() -> None:
    """The store host of a bare mpiexec stays silent when a rank says it has spoken, over an
    abstract socket anyone on the host can send to: a datagram from a process that is not
    one of the ranks (here this test, of the same user) does not silence its line."""
    err = _store_host_line(outsider_speaks=True, rank_speaks=False)
    assert "ccbench: error: start-up: rank 0 ended without a word" in err, err
    assert _store_host_line(outsider_speaks=False, rank_speaks=True) == ""


def test_another_users_datagram_does_not_silence_the_store_host() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root, to send as another user")
    import select

    from ccbench.run.storehost import _spoken_address, _spoken_by_us

    proxy = os.getpid()                  # the senders below are this process's children
    address = _spoken_address(proxy)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as spoken:
        spoken.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        spoken.bind(address)
        spoken.setblocking(False)
        for uid, counts in ((65534, False), (os.getuid(), True)):
            child = os.fork()
            if child == 0:
                try:
                    os.setuid(uid)
                    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                        sock.bind(b"")
                        sock.settimeout(30)
                        sock.sendto(b"spoken", address)
                        sock.recv(16)     # still there when the store host looks at it
                finally:
                    os._exit(0)
            assert select.select([spoken], [], [], 60)[0], "no datagram"
            assert _spoken_by_us(spoken, proxy) is counts
            os.waitpid(child, 0)


def test_a_server_binds_where_its_peers_reach_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from ccbench.run import addresses

    monkeypatch.setattr(addresses, "published_address", lambda peer=None: "192.0.2.9")
    assert addresses.listen_address("10.1.2.3", all_local=True) == "127.0.0.1"
    assert addresses.listen_address("127.0.0.1") == "127.0.0.1"
    assert addresses.listen_address("localhost") == "127.0.0.1"
    monkeypatch.setattr(addresses.socket, "gethostbyname",
                        lambda name: {"node7": "10.1.2.3", "debian": "127.0.1.1"}[name])
    assert addresses.listen_address("node7") == "10.1.2.3"
    # a host name that resolves to loopback only here, in a run across hosts
    assert addresses.listen_address("debian") == "192.0.2.9"


_LAUNCHER_STOPPED = """
from ccbench.run.control import ControlClient, ControlServer, StoreLost
from ccbench.run.watchdog import Watchdog

server = ControlServer("127.0.0.1", 0, "s" * 32, 3)
client = ControlClient("127.0.0.1", server.port, 0, secret="s" * 32)
client.holder = "ccbench launch"
watchdog = Watchdog(client, 0, 3, 5.0)
assert watchdog.store.holder == client.holder        # the watchdog's own connection too
watchdog._give_up("lost the control store", store_lost=StoreLost(
    "the control store did not answer within 5 s", unresponsive=True, holder=client.holder))
"""


def test_a_stopped_launcher_that_hosts_the_store_is_named_not_rank_0() -> None:
    """Under `ccbench launch` with mpiexec the launcher hosts the store: when it stops
    answering (SIGSTOP), the ranks named rank 0 '(not answering)', a rank that was running."""
    done = subprocess.run([sys.executable, "-c", _LAUNCHER_STOPPED], capture_output=True,
                          text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.startswith("ccbench: error:")]
    assert len(lines) == 1, done.stderr[-3000:]
    assert "0 (not answering)" not in lines[0], lines[0]
    assert "none known (ccbench launch, which hosts the control store, is not answering)" \
        in lines[0], lines[0]
