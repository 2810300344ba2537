"""The control plane: a small key/value store hosted by rank 0 over TCP.

It carries everything that must not go through the library being measured:
argument agreement, per-iteration times, unique ids (oneCCL), ports (gloo), and
liveness. A rank whose connection drops without saying goodbye is marked dead,
so the survivors can name it when a collective stops making progress.

Wire format: one JSON object per line; bytes values travel as hex.

Every connection proves, before anything else, that it knows the run's secret (made by whoever
starts the store, handed to the ranks the way the store's address travels): the client's first
line, sent as soon as it is connected, is a hello with a fresh nonce and HMAC(secret, nonce);
the server answers with HMAC(secret, nonce) of its own side, so a rank also knows it reached
its run's store and not whatever else listens on that port. A nonce counts once (a hello seen
on the wire cannot be replayed). A connection that does not prove it within HELLO_DEADLINE_S,
or sends a line longer than MAX_LINE_BYTES before that, is dropped with one warning line and
changes nothing: it reads no key, sets none, and does not count as a rank (docs/security.md).

Connections that have not proven the secret take no slot a rank needs: only proven ones count
against the store's connection limit. Those still waiting for their hello are at most
MAX_UNPROVEN; one more evicts the one that has waited longest (a rank's hello, sent at once,
is usually read before its connection is even accepted, and a rank that is evicted all the
same connects again), so a local process that opens connections as fast as it can delays the
ranks, and cannot keep them out.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import math
import os
import re
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ccbench.errors import RunFailure
from ccbench.run.arrivals import LATE_GRACE_S
from ccbench.timeouts import CONNECT_TIMEOUT_S, DEFAULT_TIMEOUT_S
from ccbench.units import size_text

__all__ = ["CONNECT_TIMEOUT_S", "MAX_LINE_BYTES", "MAX_RANK_LINE_BYTES", "SECRET_VAR",
           "ControlClient", "ControlServer", "StoreLost", "StoreTimeout", "hold_interrupt",
           "new_secret", "secret_from_env"]

#: the run's secret, for ranks that learn the store's address from their environment
SECRET_VAR = "CCBENCH_CONTROL_SECRET"
#: the longest line a connection may send before it has proven the secret (a hello is a few
#: hundred bytes; oneCCL's 4 KiB unique id, 8 KiB as hex, is the largest value of fixed size)
MAX_LINE_BYTES = 64 * 1024
#: the longest line from a proven rank: a size's per-iteration times are about 24 bytes each,
#: 2.4 MB at the default --max-iters 100000 (ranks are trusted to send what the run needs; this
#: only keeps a broken one from growing the store without end)
MAX_RANK_LINE_BYTES = 1 << 30
#: a connection must have proven the secret this long after it was accepted
HELLO_DEADLINE_S = 5.0
#: at most this many proven connections per rank (main, watchdog, a reconnecting one), plus a few
CONNECTIONS_PER_RANK = 4
_SPARE_CONNECTIONS = 8
#: at most this many connections wait for their hello at once; one more evicts the oldest
MAX_UNPROVEN = 64
_CHALLENGE_BYTES = 32
_NONCE = re.compile(r"[0-9a-f]{64}")
_WARNINGS_SHOWN = 10                 # offenders named one line each; after that, one more line
_ACCEPT_BACKOFF_S = 0.1

# a `get` waits on the server up to its own timeout plus this, so that the watchdog, bounded by
# the same timeout, speaks first and names the ranks that did not arrive
_GET_SLACK_S = 5.0
# a rank's connection whose host sends no TCP acknowledgement (to data or to keepalive probes,
# which the peer's kernel answers even when the rank is stopped or busy) for this long is
# lost: its host crashed or its link went down. Without it such a connection looks open for
# ever (nothing is sent on a dead link, so nothing fails), and the rank is only named after
# --timeout, if at all. Short enough that rank 0 names it before Slurm's own detection ends
# the step (docs/testbed.md: the testbed's keepalive settings), long for a kernel's ACK.
PEER_SILENT_S = 8.0
_KEEPALIVE_IDLE_S = 2
_KEEPALIVE_INTERVAL_S = 1


class StoreLost(RunFailure):
    """The connection to the control store (rank 0) broke: rank 0 died or the network did,
    or rank 0 stopped answering (`unresponsive`: stopped, frozen or cut off)."""

    def __init__(self, message: str, unresponsive: bool = False, holder: str = "rank 0"
                 ) -> None:
        super().__init__(message)
        self.unresponsive = unresponsive
        self.holder = holder            # the process that hosts the store (ControlClient.holder)
        self.rank0_gone = False         # at start-up, rank 0's process was seen gone


class StoreTimeout(RunFailure):
    """A `get` for a key that no rank set in time."""


def new_secret() -> str:
    """A fresh per-run secret (whoever starts the store makes one)."""
    return secrets.token_hex(32)


def secret_from_env() -> str | None:
    """The run's secret as a launcher handed it over (CCBENCH_CONTROL_SECRET), or as you gave
    it in a private file (CCBENCH_CONTROL_SECRET_FILE), if either is set."""
    from ccbench.run.secretfile import secret_from_file_var

    return os.environ.get(SECRET_VAR) or secret_from_file_var()


def _proof(secret: str, side: str, nonce: str) -> str:
    return hmac.new(secret.encode(), f"ccbench-control/{side}/{nonce}".encode(),
                    hashlib.sha256).hexdigest()


# the keys ranks set, by their first component (`lib/`: a library's own rendezvous values, e.g.
# a unique id); `dead/`, `unreachable/` and `byes/` are the server's own (a connection that
# closes without a goodbye, or says one)
_RANK_NAMESPACES = frozenset({"args", "hosts", "run_id", "m", "progress", "label", "left",
                              "aborted", "end", "torch", "lib", "trace", "diag"})
_KEY_PATTERN = re.compile(r"[A-Za-z0-9_.:/-]{1,256}")
_TIMES_KEY = re.compile(r"m/\d+/times/\d+")
_WARM_KEY = re.compile(r"m/\d+/warm/\d+")
_LONGEST_TIME_S = 86400.0
_LONGEST_WAIT_S = 7 * 86400.0


class BadRequest(ValueError):
    """A request the store refuses: its answer says why, nothing is stored."""


def _check_key(key: Any, setting: bool) -> str:
    if not isinstance(key, str) or (key and not _KEY_PATTERN.fullmatch(key)):
        raise BadRequest("bad key")
    if setting and key.split("/", 1)[0] not in _RANK_NAMESPACES:
        raise BadRequest(f"key {key!r} is not in a namespace ranks may set")
    return key


def _is_time(value: Any) -> bool:
    """A measured time in seconds: finite, not negative (a device timer may read 0 for an
    operation below its resolution), below a day."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and 0 <= value < _LONGEST_TIME_S


def _is_time_us(value: Any) -> bool:
    """A measured time in microseconds (the local copy's): as _is_time, in its unit (a copy
    on a host starved of CPU takes 100 ms, 100000 us, and is no less a time)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and _is_time(value / 1e6)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_value(key: str, value: Any, claimed: int) -> None:
    """What the harness's time keys must hold; the records are computed from them. A rank
    sets only its own (the rank its connection proved: with a key per rank, one rank's key
    cannot forge another's times)."""
    if (_TIMES_KEY.fullmatch(key) or _WARM_KEY.fullmatch(key)) \
            and int(key.rsplit("/", 1)[1]) != claimed:
        raise BadRequest(f"{key}: another rank's time (this connection is rank {claimed}'s)")
    if _TIMES_KEY.fullmatch(key):
        if not (isinstance(value, dict) and isinstance(value.get("samples"), list)
                and all(_is_time(v) for v in value["samples"])
                and (value.get("wrong") is None or _is_count(value["wrong"]))
                and (value.get("copy_us") is None or _is_time_us(value["copy_us"]))):
            raise BadRequest(f"{key}: not a list of finite times")
    elif _WARM_KEY.fullmatch(key) and not _is_time(value):
        raise BadRequest(f"{key}: not a finite time")


def _wait_seconds(value: Any) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) \
            or not 0 <= value <= _LONGEST_WAIT_S:
        raise BadRequest("bad timeout")
    return float(value)


class _Dropped(Exception):
    """The peer broke the rules: its connection is closed with one warning line."""


class ControlServer:
    """Threaded server; one handler thread per connection, at most `max_connections` proven
    ones and MAX_UNPROVEN that have not proven the secret yet.

    `secret`: the run's secret (made here when not given: read `.secret`). `world_size`, where
    known, sizes the connection limit. `keys`: a key for each rank instead of one secret (each
    rank proves its own; ccbench.run.keyexchange). `bound`: a socket already bound to the
    port (by the launcher that chose it, so that nothing else takes it meanwhile), to listen on
    instead of binding host:port."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, secret: str | None = None,
                 world_size: int = 0, keys: dict[int, str] | None = None,
                 bound: socket.socket | None = None) -> None:
        self.secret = secret or (keys or {}).get(0) or new_secret()
        self._keys = keys
        self.max_connections = CONNECTIONS_PER_RANK * max(world_size, 4) + _SPARE_CONNECTIONS
        self._data: dict[str, Any] = {}
        self._cond = threading.Condition()
        # ranks' main connections: how many are open, and each one that closed, in the order
        # seen, with whether it said bye (for ccbench.run.storehost, which outlives rank 0)
        self.open_ranks = 0
        self.closed: list[tuple[int, bool]] = []
        self.arrived: set[int] = set()          # every rank whose main connection said hello
        # with watch_hangups(): the ranks whose main connection the peer closed, in the order
        # the kernel saw them close (not the order their serving threads noticed)
        self.hangups: list[int] = []
        self._hangup_poll: select.epoll | None = None
        self._hangup_ranks: dict[int, int] = {}     # fd -> rank
        self.dropped = 0                        # connections dropped for breaking the rules
        self._proven = 0                        # open connections that proved the secret
        # connections waiting for their hello, oldest first: socket -> its handler's state
        self._unproven: dict[socket.socket, dict[str, Any]] = {}
        self._nonces: set[str] = set()          # every nonce a proven hello used
        self._warned = 0
        self._closing = False
        if bound is None:
            self._sock = socket.create_server((host, port), reuse_port=False, backlog=1024)
        else:
            self._sock = bound
            self._sock.listen(1024)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.port: int = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, name="ccbench-store", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        starved = False
        while not self._closing:
            try:
                conn, peer = self._sock.accept()
            except OSError as exc:
                if self._closing or exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS,
                                                      errno.ENOMEM):
                    return
                # out of descriptors: the connection waits in the backlog; keep serving (one
                # line for each time it runs out)
                if not starved:
                    self._warn(f"cannot accept a connection ({exc.strerror}); retrying")
                starved = True
                time.sleep(_ACCEPT_BACKOFF_S)
                continue
            starved = False
            state: dict[str, Any] = {"rank": None, "bye": False, "silent": False,
                                     "proven": False, "late": False, "evicted": False,
                                     "ready": _has_line(conn)}
            with self._cond:
                waiting = [c for c, s in self._unproven.items()
                           if not (s["ready"] or s["evicted"])]
                oldest = waiting[0] if len(waiting) >= MAX_UNPROVEN else None
                self._unproven[conn] = state
                if oldest is not None:
                    self._unproven[oldest]["evicted"] = True
            if oldest is not None:
                _evict(oldest)
            threading.Thread(target=self._serve, args=(conn, peer, state), daemon=True).start()

    def _warn(self, why: str) -> None:
        """One line on stderr per offender, for the first few; the rest are counted."""
        with self._cond:
            self._warned += 1
            shown = self._warned
        if shown <= _WARNINGS_SHOWN:
            more = " (further ones are not reported)" if shown == _WARNINGS_SHOWN else ""
            line = f"ccbench: warning: control store: {why}{more}\n"
            try:
                os.write(2, line.encode())
            except OSError:
                pass

    def _drop(self, conn: socket.socket, peer: Any, why: str) -> None:
        with self._cond:
            self.dropped += 1
        self._warn(f"dropped a connection from {_peer_name(peer)}: {why}")
        try:
            conn.close()
        except OSError:
            pass

    def _serve(self, conn: socket.socket, peer: Any, state: dict[str, Any]) -> None:
        # the whole hello within the deadline, however slowly its bytes come
        deadline = threading.Timer(HELLO_DEADLINE_S, _end_unproven, args=(conn, state))
        deadline.daemon = True
        deadline.start()
        try:
            with conn, conn.makefile("rwb") as stream:
                try:
                    self._serve_lines(conn, stream, state)
                except _Dropped as why:
                    self._drop(conn, peer, _why_dropped(state, why))
                except TimeoutError:
                    state["silent"] = True   # the kernel gave up: no ACK for PEER_SILENT_S
                except (OSError, ValueError, KeyError, TypeError):
                    pass      # a broken or foreign connection loses only its own answers
        except OSError:
            pass   # closing flushes a last answer to a peer already gone (it was stopped)
        finally:
            deadline.cancel()
            with self._cond:
                if self._unproven.pop(conn, None) is None and state["proven"]:
                    self._proven -= 1
        if state["rank"] is None:
            return
        with self._cond:
            self.open_ranks -= 1
            self.closed.append((state["rank"], state["bye"]))
            if not state["bye"]:
                self._data[f"dead/{state['rank']}"] = time.time()
                if state["silent"]:
                    self._data[f"unreachable/{state['rank']}"] = PEER_SILENT_S
            self._cond.notify_all()

    def watch_hangups(self) -> None:
        """Record in `hangups` the order in which the ranks' main connections close, as the
        kernel saw it: one epoll, whose ready list is in the order the hang-ups arrived, read
        by one thread. A rank killed closes its connection before its launcher can notice the
        death and end the others; each connection's own thread notices its close later, in
        whatever order the scheduler runs them (ccbench.run.storehost). A get of a rank seen
        closed stops waiting then: its thread reads nothing while it waits. Before any rank
        connects."""
        self._hangup_poll = select.epoll()
        threading.Thread(target=self._hangup_loop, name="ccbench-store-hangups",
                         daemon=True).start()

    def _hangup_loop(self) -> None:
        poller = self._hangup_poll
        assert poller is not None
        with poller:
            while not self._closing:
                for fd, _ in poller.poll(0.2, 64):
                    with self._cond:
                        rank = self._hangup_ranks.pop(fd, None)
                        if rank is None:
                            continue
                        poller.unregister(fd)
                        os.close(fd)
                        self.hangups.append(rank)
                        # a get of that rank waiting for a key ends now: its thread reads
                        # nothing while it waits, and would see the close only at its timeout
                        self._cond.notify_all()
            with self._cond:
                for fd in self._hangup_ranks:
                    os.close(fd)
                self._hangup_ranks.clear()

    # data open-shaped: the store's contents, key -> whatever JSON a rank set under it
    def snapshot(self) -> tuple[int, list[tuple[int, bool]], dict[str, Any]]:
        """(open rank connections, closed ones in order, a copy of the data)."""
        with self._cond:
            return self.open_ranks, list(self.closed), dict(self._data)

    def _serve_lines(self, conn: socket.socket, stream: Any, state: dict[str, Any]) -> None:
        self._hello(conn, stream, _read_request(stream), state)
        _watch_peer(conn)
        while True:
            request = _read_request(stream, MAX_RANK_LINE_BYTES)
            if request is None:
                return
            command = request.get("cmd")
            if command == "bye":
                state["bye"] = True
                reply: dict[str, Any] = {"ok": True}
                with self._cond:      # rank 0 leaves only after every peer said bye
                    key = f"byes/{state['claimed']}"
                    self._data[key] = int(self._data.get(key, 0)) + 1
            else:
                try:
                    reply = self._handle(command, request, state["claimed"])
                except BadRequest as bad:
                    reply = {"ok": False, "error": str(bad)}
            _write_line(stream, reply)

    def _hello(self, conn: socket.socket, stream: Any, request: dict[str, Any] | None,
               state: dict[str, Any]) -> None:
        """The first line must prove the secret; only then is the connection a rank's (and
        takes one of the store's slots)."""
        state["ready"] = True
        if request is None:
            raise _Dropped("closed before its hello")
        rank, proof, nonce = request.get("rank"), request.get("proof"), request.get("nonce")
        key = self._key_of(rank)
        if request.get("cmd") != "hello" or not isinstance(proof, str) or key is None \
                or not isinstance(nonce, str) or not _NONCE.fullmatch(nonce) \
                or not hmac.compare_digest(proof, _proof(key, "client", nonce)):
            _write_line(stream, {"ok": False, "error": "authentication failed"})
            raise _Dropped("it did not prove the run's secret")
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < 1 << 24:
            _write_line(stream, {"ok": False, "error": "bad hello"})
            raise _Dropped("a malformed hello")
        with self._cond:
            replayed, full = nonce in self._nonces, self._proven >= self.max_connections
            if not (replayed or full or state["evicted"]):
                self._nonces.add(nonce)
                self._unproven.pop(conn, None)
                self._proven += 1
                state["proven"] = True
        if not state["proven"]:
            if replayed:
                _write_line(stream, {"ok": False, "error": "replayed"})
                raise _Dropped("a hello seen before (replayed)")
            _write_line(stream, {"ok": False, "error": "evicted" if state["evicted"] else "full"})
            raise _Dropped("evicted" if state["evicted"] else
                           f"more than {self.max_connections} proven connections open")
        state["claimed"] = rank
        # only a rank's main connection counts for liveness (not its watchdog's)
        if request.get("track", True):
            state["rank"] = rank
            with self._cond:
                self.open_ranks += 1
                self.arrived.add(rank)
                if self._hangup_poll is not None:
                    # a descriptor of its own: the connection's thread closing its own must not
                    # take the hang-up out of the ready list before this one is read
                    watched = os.dup(conn.fileno())
                    self._hangup_ranks[watched] = rank
                    self._hangup_poll.register(watched, select.EPOLLRDHUP | select.EPOLLHUP)
        _write_line(stream, {"ok": True, "proof": _proof(key, "server", nonce)})

    def _key_of(self, rank: Any) -> str | None:
        """What a hello for `rank` must prove: the run's secret, or that rank's own key."""
        if self._keys is None:
            return self.secret
        return self._keys.get(rank) if isinstance(rank, int) else None

    def _handle(self, command: Any, request: dict[str, Any], claimed: int) -> dict[str, Any]:
        key = _check_key(request.get("key", ""), setting=command in ("set", "add"))
        with self._cond:
            if command == "set":
                _check_value(key, request.get("value"), claimed)
                self._data[key] = request.get("value")
                self._cond.notify_all()
                return {"ok": True}
            if command == "add":
                amount = request.get("value")
                if not isinstance(amount, int) or isinstance(amount, bool) or abs(amount) > 1 << 20:
                    raise BadRequest("bad amount")
                self._data[key] = int(self._data.get(key, 0)) + amount
                self._cond.notify_all()
                return {"ok": True, "value": self._data[key]}
            if command == "get":
                deadline = time.monotonic() + _wait_seconds(request.get("timeout"))
                while key not in self._data:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return {"ok": False, "error": "timeout"}
                    if claimed in self.hangups:    # the rank's process is gone (watch_hangups)
                        return {"ok": False, "error": "gone"}
                    self._cond.wait(left)
                return {"ok": True, "value": self._data[key]}
            if command == "peek":
                return {"ok": True, "value": self._data.get(key)}
            if command == "prefix":
                return {"ok": True,
                        "value": {k: v for k, v in self._data.items() if k.startswith(key)}}
        return {"ok": False, "error": f"unknown command {str(command)[:32]!r}"}

    def close(self) -> None:
        self._closing = True
        self._sock.close()


def _has_line(conn: socket.socket) -> bool:
    """Whether a whole first line is already there (a rank sends its hello at once)."""
    try:
        return b"\n" in conn.recv(MAX_LINE_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:
        return False


def _evict(conn: socket.socket) -> None:
    """End a connection that waited longest for its hello, to make room (its handler then
    drops it with a warning line)."""
    try:
        conn.send(b'{"ok": false, "error": "evicted"}\n', socket.MSG_DONTWAIT)
    except OSError:
        pass
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _why_dropped(state: dict[str, Any], why: Exception) -> str:
    if state["evicted"] and not state["proven"]:
        return (f"evicted: more than {MAX_UNPROVEN} connections were waiting to prove the "
                f"run's secret")
    if state["late"] and not state["proven"]:
        return f"no hello within {HELLO_DEADLINE_S:g} s"
    return str(why)


def _end_unproven(conn: socket.socket, state: dict[str, Any]) -> None:
    """The hello deadline passed: a connection that has not proven the secret is ended (its
    handler then reads the end of the stream and drops it)."""
    if not state["proven"]:
        state["late"] = True
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _peer_name(peer: Any) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer) or "unknown"


def _write_line(stream: Any, message: dict[str, Any]) -> None:
    stream.write((json.dumps(message) + "\n").encode())
    stream.flush()


def _read_line(stream: Any, limit: int) -> bytes:
    """One line of at most `limit` bytes (b"" at the end of the stream); longer: _Dropped,
    having read no more than `limit` bytes of it."""
    line = stream.readline(limit + 1)
    if len(line) > limit:
        raise _Dropped(f"a line longer than {size_text(limit)}")
    if line and not line.endswith(b"\n"):
        raise _Dropped("a last line without its newline")
    return bytes(line)


def _read_request(stream: Any, limit: int = MAX_LINE_BYTES) -> dict[str, Any] | None:
    line = _read_line(stream, limit)
    if not line:
        return None
    try:
        request = json.loads(line)
    except (ValueError, RecursionError):
        raise _Dropped("a line that is not JSON (or nested too deep)") from None
    if not isinstance(request, dict):
        raise _Dropped("a line that is not a JSON object")
    return request


def _watch_peer(conn: socket.socket) -> None:
    """Keepalive probes and a user timeout on a rank's connection (Linux; elsewhere a dead
    host is still found by --timeout)."""
    options = [(socket.SOL_SOCKET, "SO_KEEPALIVE", 1),
               (socket.IPPROTO_TCP, "TCP_KEEPIDLE", _KEEPALIVE_IDLE_S),
               (socket.IPPROTO_TCP, "TCP_KEEPINTVL", _KEEPALIVE_INTERVAL_S),
               # with a user timeout, the kernel drops the connection once nothing was
               # acknowledged for that long, probes or data alike (tcp(7))
               (socket.IPPROTO_TCP, "TCP_USER_TIMEOUT", int(PEER_SILENT_S * 1000))]
    for level, name, value in options:
        option = getattr(socket, name, None)
        if option is not None:
            try:
                conn.setsockopt(level, option, value)
            except OSError:
                return


#: the main thread's store exchanges under way, and whether an interrupt came during one
_MAIN_EXCHANGE = {"busy": 0, "held": False}


def hold_interrupt() -> bool:
    """For a SIGINT handler (it runs in the main thread): whether the main thread is inside a
    control-store exchange. If it is, the interrupt is held and raised (KeyboardInterrupt) as
    soon as the reply has been read, so the connection never answers a request with the reply
    to an earlier one; the handler then returns without raising."""
    if _MAIN_EXCHANGE["busy"]:
        _MAIN_EXCHANGE["held"] = True
        return True
    return False


class ControlClient:
    """One connection per rank. Thread-safe: the watchdog shares it with the main loop.

    Every wait is bounded: connecting by `connect_timeout` (the error names the address), each
    reply by `reply_timeout` (plus the wait a `get` asked for), so a rank 0 that is stopped or
    cut off is noticed instead of blocking a `recv` for ever."""

    def __init__(self, host: str, port: int, rank: int,
                 connect_timeout: float = CONNECT_TIMEOUT_S,
                 reply_timeout: float = DEFAULT_TIMEOUT_S, track: bool = True,
                 rank0_state: Callable[[], str | None] | None = None,
                 secret: str | None = None) -> None:
        self.rank = rank
        self.address = (host, port)
        # the process that hosts the store, as errors name it: rank 0, unless the launcher
        # (`ccbench launch` under mpiexec) hosts it
        self.holder = "rank 0"
        self.connect_timeout, self.reply_timeout = connect_timeout, reply_timeout
        self._lock = threading.Lock()
        known = secret or secret_from_env()
        if not known:
            raise RunFailure(f"start-up: rank {rank} has no secret for the control store at "
                             f"{host}:{port} ({SECRET_VAR} is not set; the launcher that "
                             f"started the ranks hands it over)")
        self._secret = known
        deadline = time.monotonic() + connect_timeout
        turned_away = 0
        while True:
            self._sock = _connect(host, port, connect_timeout, rank, rank0_state,
                                  deadline=deadline)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # both ends watch the connection: a rank whose host is cut off (link down) loses
            # it after PEER_SILENT_S and its watchdog ends it, instead of a reply timeout
            _watch_peer(self._sock)
            self._stream = self._sock.makefile("rwb")
            try:
                self._hello(track)
                return
            except _TurnedAway as why:
                self._stream.close()
                self._sock.close()
                turned_away += 1
                if time.monotonic() + 0.05 > deadline:
                    raise self._kept_out(str(why), turned_away) from None
                time.sleep(0.05)

    def _hello(self, track: bool) -> None:
        """Prove the secret on a fresh nonce (the first line, sent at once), then check the
        store's proof on the same nonce."""
        nonce = secrets.token_hex(_CHALLENGE_BYTES)
        hello = {"cmd": "hello", "rank": self.rank, "track": track,
                 "proof": _proof(self._secret, "client", nonce), "nonce": nonce}
        self._sock.settimeout(max(HELLO_DEADLINE_S, 1.0))
        try:
            self._stream.write((json.dumps(hello) + "\n").encode())
            self._stream.flush()
            first = self._stream.readline(1024)
        except OSError:
            raise _TurnedAway("closed") from None
        if not first:
            raise _TurnedAway("closed")
        try:
            reply = json.loads(first)
            if not isinstance(reply, dict):
                raise TypeError(reply)
        except (ValueError, TypeError):
            raise self._not_ours() from None
        if reply.get("error") in ("evicted", "full"):
            raise _TurnedAway(reply["error"])
        if reply.get("error") == "authentication failed":
            raise RunFailure(f"start-up: the control store at {self.where} refused rank "
                             f"{self.rank}'s proof of the run's secret ({SECRET_VAR} differs "
                             f"from the one the store was started with)")
        proof = reply.get("proof")
        if not isinstance(proof, str) or not hmac.compare_digest(
                proof, _proof(self._secret, "server", nonce)):
            raise self._not_ours()

    def _kept_out(self, why: str, tries: int) -> StoreLost:
        """Every connection turned away until the connect timeout: name what did it, not a
        rank (the rank is here and trying)."""
        if why == "evicted":
            cause = ("it was flooded with connections that do not prove the run's secret: a "
                     "process that is not one of the ranks keeps connecting to it (the store's "
                     "warnings name where from)")
        elif why == "full":
            cause = "it was full of proven connections (more than the ranks need)"
        else:
            cause = "it closed them before answering"
        return StoreLost(f"start-up: the control store at {self.where} turned away all {tries} "
                         f"connections of rank {self.rank} within {self.connect_timeout:g} s: "
                         f"{cause}; no rank is missing", unresponsive=True)

    def _not_ours(self) -> RunFailure:
        return RunFailure(f"start-up: what listens at {self.where} is not this run's control "
                          f"store (it did not prove the run's secret)")

    @property
    def where(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    def second_connection(self, connect_timeout: float | None = None,
                          rank0_state: Callable[[], str | None] | None = None
                          ) -> ControlClient:
        """Another connection for the same rank (its watchdog), so a long blocking `get` on the
        main connection never delays liveness posts; it does not count for liveness."""
        other = ControlClient(*self.address, self.rank,
                              connect_timeout=connect_timeout or self.connect_timeout,
                              rank0_state=rank0_state,
                              reply_timeout=self.reply_timeout, track=False,
                              secret=self._secret)
        other.holder = self.holder
        return other

    def _exchange(self, request: dict[str, Any], wait: float = 0.0) -> dict[str, Any]:
        """One request and its reply, whole: an interrupt (SIGINT) that comes in between is
        held until the reply is read (`hold_interrupt`), else the next request on this
        connection would read this one's reply."""
        main = threading.current_thread() is threading.main_thread()
        if main:
            _MAIN_EXCHANGE["busy"] += 1
        try:
            line = self._exchange_line(request, wait)
        finally:
            if main:
                _MAIN_EXCHANGE["busy"] -= 1
                if not _MAIN_EXCHANGE["busy"] and _MAIN_EXCHANGE["held"]:
                    _MAIN_EXCHANGE["held"] = False
                    raise KeyboardInterrupt
        if not line:
            raise StoreLost(f"lost the control store at {self.where} ({self.holder} exited)",
                            holder=self.holder)
        reply = json.loads(line)
        return reply if isinstance(reply, dict) else {"ok": False, "error": "not an object"}

    def _exchange_line(self, request: dict[str, Any], wait: float) -> bytes:
        limit = self.reply_timeout + wait
        with self._lock:
            try:
                self._sock.settimeout(limit)
                self._stream.write((json.dumps(request) + "\n").encode())
                self._stream.flush()
                return bytes(self._stream.readline())
            except TimeoutError as exc:
                # the kernel's user timeout (ETIMEDOUT) or this reply's wait (no errno)
                silent = f"stopped answering (nothing acknowledged for {PEER_SILENT_S:g} s)" \
                    if exc.errno == errno.ETIMEDOUT else f"did not answer within {limit:g} s"
                raise StoreLost(f"the control store at {self.where} ({self.holder}) {silent}",
                                unresponsive=True, holder=self.holder) from None
            except OSError as exc:
                raise StoreLost(f"lost the control store at {self.where} ({self.holder}): "
                                f"{exc}", holder=self.holder) from None

    def _call(self, request: dict[str, Any], wait: float = 0.0) -> Any:
        reply = self._exchange(request, wait)
        if not reply["ok"]:
            if reply.get("error") == "timeout":
                raise StoreTimeout(f"timed out after {float(request.get('timeout', 0)):g} s "
                                   f"waiting for {request.get('key')!r} from the other ranks")
            raise RunFailure(f"control store: {reply.get('error')}")
        return reply.get("value")

    def set(self, key: str, value: Any) -> None:
        if isinstance(value, (bytes, bytearray)):
            value = {"__bytes__": bytes(value).hex()}
        self._call({"cmd": "set", "key": key, "value": value})

    def get(self, key: str, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
        value = self._call({"cmd": "get", "key": key, "timeout": timeout + _GET_SLACK_S},
                           wait=timeout + _GET_SLACK_S)
        if isinstance(value, dict) and "__bytes__" in value:
            return bytes.fromhex(value["__bytes__"])
        return value

    def peek(self, key: str) -> Any:
        return self._call({"cmd": "peek", "key": key})

    def add(self, key: str, amount: int = 1) -> int:
        return int(self._call({"cmd": "add", "key": key, "value": amount}))

    # open-shaped: the store's keys under `key` -> whatever JSON a rank set under each
    def prefix(self, key: str) -> dict[str, Any]:
        return dict(self._call({"cmd": "prefix", "key": key}))

    def gather(self, key: str, value: Any, world_size: int, timeout: float) -> list[Any]:
        """Every rank's value for `key`, in rank order (each rank calls it)."""
        self.set(f"{key}/{self.rank}", value)
        return [self.get(f"{key}/{r}", timeout) for r in range(world_size)]

    def barrier(self, key: str, world_size: int, timeout: float) -> None:
        arrived = self.add(f"{key}/count")
        if arrived == world_size:
            self.set(f"{key}/done", 1)
        self.get(f"{key}/done", timeout)

    def close(self) -> None:
        try:
            self._call({"cmd": "bye", "rank": self.rank})
        except RunFailure:
            pass
        self._sock.close()


class _TurnedAway(Exception):
    """The store closed the connection before answering its hello, or said why (`evicted`:
    too many connections waiting to prove the secret; `full`: too many proven ones)."""


def _connect(host: str, port: int, timeout: float, rank: int,
             rank0_state: Callable[[], str | None] | None = None,
             deadline: float | None = None) -> socket.socket:
    """Retry until rank 0's store listens, for at most `timeout` seconds (until `deadline`,
    where given). Where rank 0's process can be seen (`rank0_state`: 'alive', 'stopped', 'gone'
    or None), a rank 0 that is gone is reported at once, and one that still runs (a late
    start) gets LATE_GRACE_S more."""
    deadline = time.monotonic() + timeout if deadline is None else deadline
    extended = False
    while True:
        left = deadline - time.monotonic()
        try:
            return socket.create_connection((host, port), timeout=max(0.1, min(5.0, left)))
        except OSError as exc:
            refused = isinstance(exc, ConnectionRefusedError)
            state = rank0_state() if refused and rank0_state is not None else None
            if state == "gone":
                raise _unreachable(host, port, timeout, rank, exc, gone=True) from None
            if time.monotonic() + 0.1 > deadline:
                if state == "alive" and not extended:
                    deadline += LATE_GRACE_S
                    extended = True
                    continue
                waited = timeout + (LATE_GRACE_S if extended else 0)
                raise _unreachable(host, port, waited, rank, exc) from None
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


def _unreachable(host: str, port: int, timeout: float, rank: int, exc: OSError,
                 gone: bool = False) -> StoreLost:
    reason = exc.strerror or str(exc) or type(exc).__name__
    where = f"the control store at {host}:{port}"
    if gone:                                           # seen in /proc: rank 0's process ended
        lost = StoreLost(f"start-up: cannot reach {where} ({reason}): rank 0 exited; ranks "
                         f"that did not arrive: 0 (dead)")
        lost.rank0_gone = True
        return lost
    if isinstance(exc, ConnectionRefusedError):       # the host answers, nobody listens
        who = "0 (nothing listens there: rank 0 is not running)"
    else:                                              # this rank cannot get there at all
        who = f"{rank} (this rank: can it reach the host that runs the store?)"
    return StoreLost(f"start-up: cannot reach {where} within {timeout:g} s ({reason}); ranks "
                     f"that did not arrive: {who}", unresponsive=True)
