"""The control plane: a small key/value store hosted by rank 0 over TCP.

It carries everything that must not go through the library being measured:
argument agreement, per-iteration times, unique ids (oneCCL), ports (gloo), and
liveness. A rank whose connection drops without saying goodbye is marked dead,
so the survivors can name it when a collective stops making progress.

Wire format: one JSON object per line; bytes values travel as hex.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ccbench.arrivals import LATE_GRACE_S
from ccbench.bench_options import DEFAULT_TIMEOUT_S
from ccbench.errors import RunFailure

__all__ = ["CONNECT_TIMEOUT_S", "ControlClient", "ControlServer", "StoreLost", "StoreTimeout"]

CONNECT_TIMEOUT_S = 30.0
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

    def __init__(self, message: str, unresponsive: bool = False) -> None:
        super().__init__(message)
        self.unresponsive = unresponsive


class StoreTimeout(RunFailure):
    """A `get` for a key that no rank set in time."""


class ControlServer:
    """Threaded server; one handler thread per rank connection."""

    def __init__(self, host: str = "0.0.0.0", port: int = 0) -> None:
        self._data: dict[str, Any] = {}
        self._cond = threading.Condition()
        # ranks' main connections: how many are open, and each one that closed, in the order
        # seen, with whether it said bye (for ccbench.storehost, which outlives rank 0)
        self.open_ranks = 0
        self.closed: list[tuple[int, bool]] = []
        self.arrived: set[int] = set()          # every rank whose main connection said hello
        self._sock = socket.create_server((host, port), reuse_port=False, backlog=1024)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.port: int = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, name="ccbench-store", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        state: dict[str, Any] = {"rank": None, "bye": False, "silent": False}
        _watch_peer(conn)
        with conn, conn.makefile("rwb") as stream:
            try:
                self._serve_lines(stream, state)
            except TimeoutError:
                state["silent"] = True   # the kernel gave up: no ACK for PEER_SILENT_S
            except (OSError, ValueError, KeyError, TypeError):
                pass          # a broken or foreign connection loses only its own answers
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

    def snapshot(self) -> tuple[int, list[tuple[int, bool]], dict[str, Any]]:
        """(open rank connections, closed ones in order, a copy of the data)."""
        with self._cond:
            return self.open_ranks, list(self.closed), dict(self._data)

    def _serve_lines(self, stream: Any, state: dict[str, Any]) -> None:
        for line in stream:
            request = json.loads(line)
            command = request["cmd"]
            if command == "hello":
                # only a rank's main connection counts for liveness (not its watchdog's)
                state["rank"] = int(request["rank"]) if request.get("track", True) else None
                if state["rank"] is not None:
                    with self._cond:
                        self.open_ranks += 1
                        self.arrived.add(state["rank"])
                reply: dict[str, Any] = {"ok": True}
            elif command == "bye":
                state["bye"] = True
                reply = {"ok": True}
                with self._cond:      # rank 0 leaves only after every peer said bye
                    key = f"byes/{request.get('rank', -1)}"
                    self._data[key] = int(self._data.get(key, 0)) + 1
            else:
                reply = self._handle(command, request)
            stream.write((json.dumps(reply) + "\n").encode())
            stream.flush()

    def _handle(self, command: str, request: dict[str, Any]) -> dict[str, Any]:
        key = request.get("key", "")
        with self._cond:
            if command == "set":
                self._data[key] = request["value"]
                self._cond.notify_all()
                return {"ok": True}
            if command == "add":
                self._data[key] = int(self._data.get(key, 0)) + int(request["value"])
                self._cond.notify_all()
                return {"ok": True, "value": self._data[key]}
            if command == "get":
                deadline = time.monotonic() + float(request["timeout"])
                while key not in self._data:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return {"ok": False, "error": "timeout"}
                    self._cond.wait(left)
                return {"ok": True, "value": self._data[key]}
            if command == "peek":
                return {"ok": True, "value": self._data.get(key)}
            if command == "prefix":
                return {"ok": True,
                        "value": {k: v for k, v in self._data.items() if k.startswith(key)}}
        return {"ok": False, "error": f"unknown command {command!r}"}

    def close(self) -> None:
        self._sock.close()


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


class ControlClient:
    """One connection per rank. Thread-safe: the watchdog shares it with the main loop.

    Every wait is bounded: connecting by `connect_timeout` (the error names the address), each
    reply by `reply_timeout` (plus the wait a `get` asked for), so a rank 0 that is stopped or
    cut off is noticed instead of blocking a `recv` for ever."""

    def __init__(self, host: str, port: int, rank: int,
                 connect_timeout: float = CONNECT_TIMEOUT_S,
                 reply_timeout: float = DEFAULT_TIMEOUT_S, track: bool = True,
                 rank0_state: Callable[[], str | None] | None = None) -> None:
        self.rank = rank
        self.address = (host, port)
        self.connect_timeout, self.reply_timeout = connect_timeout, reply_timeout
        self._lock = threading.Lock()
        self._sock = _connect(host, port, connect_timeout, rank, rank0_state)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._stream = self._sock.makefile("rwb")
        self._call({"cmd": "hello", "rank": rank, "track": track})

    @property
    def where(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    def second_connection(self) -> ControlClient:
        """Another connection for the same rank (its watchdog), so a long blocking `get` on the
        main connection never delays liveness posts; it does not count for liveness."""
        return ControlClient(*self.address, self.rank, connect_timeout=self.connect_timeout,
                             reply_timeout=self.reply_timeout, track=False)

    def _call(self, request: dict[str, Any], wait: float = 0.0) -> Any:
        limit = self.reply_timeout + wait
        with self._lock:
            try:
                self._sock.settimeout(limit)
                self._stream.write((json.dumps(request) + "\n").encode())
                self._stream.flush()
                line = self._stream.readline()
            except TimeoutError:
                raise StoreLost(f"the control store at {self.where} (rank 0) did not answer "
                                f"within {limit:g} s", unresponsive=True) from None
            except OSError as exc:
                raise StoreLost(f"lost the control store at {self.where} (rank 0): {exc}") \
                    from None
        if not line:
            raise StoreLost(f"lost the control store at {self.where} (rank 0 exited)")
        reply = json.loads(line)
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


def _connect(host: str, port: int, timeout: float, rank: int,
             rank0_state: Callable[[], str | None] | None = None) -> socket.socket:
    """Retry until rank 0's store listens, for at most `timeout` seconds. Where rank 0's
    process can be seen (`rank0_state`: 'alive', 'stopped', 'gone' or None), a rank 0 that is
    gone is reported at once, and one that still runs (a late start) gets LATE_GRACE_S more."""
    deadline = time.monotonic() + timeout
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
            time.sleep(min(0.1 if state is None else 0.5, max(0.0, deadline - time.monotonic())))


def _unreachable(host: str, port: int, timeout: float, rank: int, exc: OSError,
                 gone: bool = False) -> StoreLost:
    reason = exc.strerror or str(exc) or type(exc).__name__
    where = f"the control store at {host}:{port}"
    if gone:                                           # seen in /proc: rank 0's process ended
        return StoreLost(f"start-up: cannot reach {where} ({reason}): rank 0 exited; ranks "
                         f"that did not arrive: 0 (dead)")
    if isinstance(exc, ConnectionRefusedError):       # the host answers, nobody listens
        who = "0 (nothing listens there: rank 0 is not running)"
    else:                                              # this rank cannot get there at all
        who = f"{rank} (this rank: can it reach the host that runs the store?)"
    return StoreLost(f"start-up: cannot reach {where} within {timeout:g} s ({reason}); ranks "
                     f"that did not arrive: {who}", unresponsive=True)
