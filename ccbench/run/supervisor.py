"""The supervisor of `ccbench launch`: the command lines of N local ranks (plain processes
with a loopback control store, or one mpiexec with the store hosted here), starting them in a
process group of their own, watching them, killing the group, and the one error line."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ccbench.errors import ERROR_PREFIX, BackendUnavailable, UsageError, error_line, is_error_line
from ccbench.run.addresses import free_port
from ccbench.run.arrivals import LAUNCHER_PID_VAR
from ccbench.run.control import SECRET_VAR, ControlServer, new_secret
from ccbench.run.launcher_env import CONTROL_VAR, LOCAL
from ccbench.run.launchers import CONTROL_FD_VAR, MPI_CONTROL_VAR, mpiexec_beside
from ccbench.run.lifeline import lifeline_env
from ccbench.run.rankexits import RankExits
from ccbench.run.storehost import LABEL_KEY, unexplained_end
from ccbench.sysinfo import available_memory, usable_cores
from ccbench.units import size_text

__all__ = ["LaunchPlan", "Supervisor", "build_commands", "check_mpiexec", "check_rank_count",
           "default_nprocs", "find_mpiexec", "kill_group", "launch_groups", "rank_python",
           "run_ranks", "with_backends"]


@dataclass(kw_only=True)
class LaunchPlan:
    """What `ccbench launch` starts in every rank, as the command the ranks run plans it: the
    benchmark, `ccbench replay` and `ccbench diagnose` each have a `launch_plan(argv, nprocs)`
    that parses and validates their arguments once, before any rank starts."""

    argv: list[str]                   # each rank's command line
    backends: list[str]
    connect_timeout: float
    nprocs: int                       # ranks to start: -n, else the command's own default
    one_launch: bool = False          # every backend in one launch (a replay compares them)
    output: str | None = None         # its records file, and how it prints (for --repeat)
    fmt: str = "table"
    saved: str | None = None          # a records file chosen for it: named at the end


def kill_group(group: int, signum: int = signal.SIGKILL) -> None:
    """Signal a process group this process started; one already gone is no error."""
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):
        pass


def rank_python() -> list[str]:
    """How to start a Python that runs ccbench's ranks: in safe-path mode (3.11+), so that a
    `ccbench/` folder in the working directory (a checkout's parent) is not imported instead
    of the installed package; PYTHONPATH is still honoured."""
    return [sys.executable, "-P"] if sys.version_info >= (3, 11) else [sys.executable]


def find_mpiexec(explicit: str | None = None) -> str | None:
    """--mpiexec, else the mpiexec beside this python (its venv's MPI), else one on PATH."""
    return explicit or mpiexec_beside() or shutil.which("mpiexec")


def _is_hydra(mpiexec: str) -> bool:
    """MPICH and Intel MPI's mpiexec (hydra) know -disable-auto-cleanup; Open MPI's does not."""
    path = Path(shutil.which(mpiexec) or mpiexec).resolve()
    return "hydra" in path.name or (path.parent / "mpiexec.hydra").exists()


def _is_open_mpi(mpiexec: str) -> bool:
    """Open MPI's mpiexec (prterun) sits beside its ompi_info."""
    path = Path(shutil.which(mpiexec) or mpiexec).resolve()
    return (path.parent / "ompi_info").exists() or path.name in ("prterun", "orterun")


def launch_groups(needs_mpi: dict[str, bool]) -> list[tuple[list[str], bool]]:
    """The backends of a run in the process environment each fits: the ones that need MPI under
    mpiexec (which pins every rank to a core), the others as plain processes, so a mixed run
    gives gloo or oneCCL the numbers they get alone. The backends run in the order given: each
    run of neighbours that fit the same environment is one launch (gloo,mpi,oneccl: three)."""
    groups: list[tuple[list[str], bool]] = []
    for name, mpi in needs_mpi.items():
        if groups and groups[-1][1] == mpi:
            groups[-1][0].append(name)
        else:
            groups.append(([name], mpi))
    return groups


def with_backends(bench: list[str], names: list[str]) -> list[str]:
    """`bench` with its backend list replaced by `names` (added when it had none)."""
    value = ",".join(names)
    out: list[str] = []
    replaced, skip = False, False
    for i, arg in enumerate(bench):
        if skip:
            skip = False
        elif arg in ("--backend", "-B") and i + 1 < len(bench):
            out += [arg, value]
            replaced = skip = True
        elif arg.startswith("--backend="):
            out.append(f"--backend={value}")
            replaced = True
        else:
            out.append(arg)
    return out if replaced else [*out, "--backend", value]


def build_commands(nprocs: int, bench: list[str], needs_mpi: bool, mpiexec: str | None,
                   control_port: int | None = None
                   ) -> tuple[list[list[str]], list[dict[str, str]]]:
    """The command line and extra environment of each process to start (pure, for tests);
    `control_port`: rank 0's control store port (default: one free now)."""
    python = [*rank_python(), "-m", "ccbench", *bench]
    if needs_mpi:
        if mpiexec is None:
            raise BackendUnavailable("an MPI backend was asked for but no mpiexec was found "
                                     "(pip install 'ccbench[mpi]' or pass --mpiexec)")
        # the ranks' own watchdogs say which rank failed: mpiexec must not kill them first
        flags = ["-disable-auto-cleanup"] if _is_hydra(mpiexec) else []
        if _is_open_mpi(mpiexec) and nprocs > usable_cores():
            flags.append("--oversubscribe")  # Open MPI refuses more ranks than cores without it
        return [[mpiexec, *flags, "-n", str(nprocs), *python]], \
            [{LAUNCHER_PID_VAR: str(os.getpid()), **lifeline_env()}]
    control = f"127.0.0.1:{control_port or free_port('127.0.0.1')}"
    # the launcher's pid tells each rank that all were started together (ccbench.run.arrivals);
    # the secret, that a connection to rank 0's store is one of them (ccbench.run.control)
    secret = new_secret()
    envs = [{LOCAL.rank: str(r), LOCAL.size: str(nprocs), LOCAL.local_rank: str(r),
             LOCAL.local_size: str(nprocs), CONTROL_VAR: control, SECRET_VAR: secret,
             LAUNCHER_PID_VAR: str(os.getpid()), **lifeline_env()}
            for r in range(nprocs)]
    return [python for _ in range(nprocs)], envs


def run_ranks(nprocs: int, bench: list[str], needs_mpi: bool, mpiexec: str | None,
              connect_timeout: float, extra_env: dict[str, str] | None = None,
              before_error: Callable[[], str | None] | None = None) -> int:
    """Start the ranks and watch them (Supervisor). `before_error`: the line to print just
    before the run's one error line, if any (where the records so far are), so that the error
    line is the last one on screen."""
    # rank 0's control port, bound here until rank 0 listens on it: nothing takes it meanwhile
    reserved = None if needs_mpi else reserve_port("127.0.0.1")
    commands, envs = build_commands(nprocs, bench, needs_mpi, mpiexec,
                                    reserved.getsockname()[1] if reserved else None)
    envs = [{**(extra_env or {}), **e} for e in envs]
    if reserved is not None:
        envs[0] = {**envs[0], CONTROL_FD_VAR: str(reserved.fileno())}
    if needs_mpi and nprocs > usable_cores():
        # oversubscribed: yield the core while waiting, so ranks do not starve each other (with a
        # core each, Intel MPI busy-polls, as IMB-MPI1 and the OSU benchmarks measure it)
        envs = [{"I_MPI_WAIT_MODE": os.environ.get("I_MPI_WAIT_MODE", "1"), **e} for e in envs]
    if sys.stderr.isatty():
        envs = [{"CCBENCH_STDERR_TTY": "1", **e} for e in envs]
    if sys.stdout.isatty():               # rank 0 draws its bar on the terminal of the table
        envs = [{"CCBENCH_STDOUT_TTY": "1", **e} for e in envs]
    if reserved is not None:
        with reserved:
            return Supervisor(commands, envs, connect_timeout, before_error=before_error,
                              handed=reserved).run()
    # under mpiexec the control store lives here, not in rank 0: an mpiexec that ends every rank
    # when one dies (MPICH's on a signal even with -disable-auto-cleanup, Open MPI's on any
    # failure) leaves no rank to say which one it was, but this process saw their connections
    store = ControlServer("127.0.0.1", 0, world_size=nprocs)
    envs = [{**e, MPI_CONTROL_VAR: f"127.0.0.1:{store.port}", SECRET_VAR: store.secret}
            for e in envs]
    try:
        return Supervisor(commands, envs, connect_timeout, store=store, world_size=nprocs,
                          before_error=before_error).run()
    finally:
        store.close()


def reserve_port(host: str, tries: int = 8) -> socket.socket:
    """A socket bound (not listening, without SO_REUSEADDR: no other process can bind the
    port) to a port free_port chose; one taken between that choice and the bind is replaced
    by a fresh choice."""
    for _ in range(tries):
        port = free_port(host)
        sock = socket.socket()
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE:
                raise UsageError(f"cannot bind a control port on {host}: "
                                 f"{exc.strerror or exc}") from None
            continue
        return sock
    raise UsageError(f"no control port on {host}: {tries} free ports in turn were taken by "
                     f"other processes before they could be bound (EADDRINUSE)")


def default_nprocs(device: str) -> int:
    """One rank per local GPU for a GPU run, else one per core this process may use: more
    ranks than that measure the CPU scheduler along with the library."""
    if device == "cuda":
        try:
            import torch

            if torch.cuda.device_count() > 0:
                return int(torch.cuda.device_count())
        except ImportError:
            pass
    return usable_cores()


_RANK_MEMORY = 200 * 2**20      # one rank's interpreter with numpy and torch loaded, roughly


def check_rank_count(nprocs: int) -> None:
    """Refuse a rank count this machine cannot start, before starting any."""
    if nprocs < 1:
        raise UsageError(f"-n must be >= 1, got {nprocs}")
    available = available_memory()
    if available is None:
        return
    limit = max(1, available // _RANK_MEMORY)
    if nprocs > limit:
        raise UsageError(f"-n {nprocs} is more ranks than this machine can run: at most {limit} "
                         f"(each rank needs about {size_text(_RANK_MEMORY)} and "
                         f"{size_text(available)} is available); use a cluster launcher "
                         f"(srun, mpiexec -hosts) for more")


def check_mpiexec(mpiexec: str) -> None:
    """A missing or broken --mpiexec is bad input, found before any rank starts."""
    path = shutil.which(mpiexec)
    if path is None:
        raise UsageError(f"--mpiexec {mpiexec!r}: no such executable (valid: a path to an "
                         f"mpiexec, e.g. {find_mpiexec() or '/usr/bin/mpiexec'})")
    try:
        probe = subprocess.run([path, "--version"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--mpiexec {mpiexec!r} cannot be run: {exc}") from None
    text = (probe.stdout + probe.stderr).decode(errors="replace")
    if probe.returncode != 0 or not any(word in text for word in ("MPI", "HYDRA", "mpiexec")):
        raise UsageError(f"--mpiexec {mpiexec!r} is not a working mpiexec (`{mpiexec} --version` "
                         f"exited with status {probe.returncode} and did not name an MPI)")
    if ("Open MPI" in text and os.geteuid() == 0
            and not (os.environ.get("OMPI_ALLOW_RUN_AS_ROOT")
                     and os.environ.get("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"))):
        raise UsageError(f"{mpiexec} is Open MPI's, which refuses to start ranks as root: run "
                         f"as another user, or set OMPI_ALLOW_RUN_AS_ROOT=1 and "
                         f"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (Open MPI's own switches)")


_KILL_GRACE_S = 5.0   # after the error line, the other ranks get this long to leave


class Supervisor:
    """Starts the ranks (or mpiexec) in a process group of their own and watches them all at
    once: the first failure starts a short grace for the others to report and leave, then the
    whole group (mpiexec, its proxies, every rank, a stopped one too) is killed. Their stderr
    passes through here, so that exactly one `ccbench: error:` line comes out: the first one a
    rank printed, or the launcher's own when no rank could."""

    def __init__(self, commands: list[list[str]], envs: list[dict[str, str]],
                 connect_timeout: float, store: ControlServer | None = None,
                 world_size: int = 0, before_error: Callable[[], str | None] | None = None,
                 handed: socket.socket | None = None) -> None:
        self.commands, self.envs = commands, envs
        self.handed = handed                # a socket the first process inherits (its fd kept)
        self.before_error = before_error    # asked once, for a line to go before the error
        # the control store of ranks under mpiexec (one command): when they all went without a
        # word, it tells which rank went first and what they were doing
        self.store, self.world_size = store, world_size
        # and the order in which the rank processes below that mpiexec ended
        self.exits: RankExits | None = None
        self.stalled: list[int] = []        # ranks the others gave up on, silently
        self.stalled_label = ""
        self.ended_here = False             # the group was killed here, not ended by itself
        # no rank has said why yet: the others notice a dead peer within seconds, a missing
        # control store within the connect timeout
        self.silent_grace = connect_timeout + 10
        self.procs: list[subprocess.Popen[bytes]] = []
        self.first_failed: int | None = None
        self.group = 0
        self.interrupted: int | None = None  # the signal that asked this launch to stop
        self._interrupted_at: float | None = None
        self._error_before_interruption = False
        self.error_seen = threading.Event()
        self._print_lock = threading.Lock()
        self._readers: list[threading.Thread] = []

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._forward) for sig in _FORWARDED}
        try:
            self._start()
            if self.handed is not None:     # rank 0 has it: a rank 0 gone closes it for good
                self.handed.close()
            codes = self._watch()
        finally:
            self._kill_group()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        for reader in self._readers:
            reader.join(timeout=5)
        if self.interrupted is not None:
            if not self._error_before_interruption:
                self._say(error_line(_interruption(self.interrupted)))
            return 128 + self.interrupted
        if self.ended_here and self.error_seen.is_set():
            # a rank said why, and the ranks still there were ended here after the grace (on a
            # loaded machine a rank's teardown can outlast it): the run's status is that of the
            # failure the rank said (1), not this launcher's SIGKILL (137)
            codes = [1 if code < 0 else code for code in codes]
        status = _combined_status(codes)
        if status != 0 and not self.error_seen.is_set():
            self._say(error_line(self._why(codes)))
        return status

    def _before_error(self) -> bytes:
        """The line that goes before the error line (once), as bytes, or nothing."""
        ask, self.before_error = self.before_error, None
        line = ask() if ask is not None else None
        return f"{line}\n".encode() if line else b""

    def _say(self, line: str) -> None:
        """The launcher's own error line."""
        with self._print_lock:
            sys.stderr.buffer.write(self._before_error() + f"{line}\n".encode())
            sys.stderr.buffer.flush()

    def _start(self) -> None:
        for cmd, env in zip(self.commands, self.envs, strict=True):
            fds = (self.handed.fileno(),) if self.handed is not None and not self.procs else ()
            try:
                proc = subprocess.Popen(cmd, env={**os.environ, **env}, stderr=subprocess.PIPE,
                                        process_group=self.group, pass_fds=fds)
            except OSError as exc:
                raise UsageError(f"cannot start {cmd[0]!r}: {exc.strerror or exc}") from None
            if not self.group:
                self.group = proc.pid
            if self.store is not None and self.exits is None:
                self.exits = RankExits(proc.pid, self.world_size).start()
            self.procs.append(proc)
            assert proc.stderr is not None
            reader = threading.Thread(target=self._pass_stderr, args=(proc.stderr,), daemon=True)
            reader.start()
            self._readers.append(reader)

    def _watch(self) -> list[int]:
        failed_at: float | None = None
        said_at: float | None = None
        while True:
            codes = [p.poll() for p in self.procs]
            if all(code is not None for code in codes):
                return [int(code) for code in codes if code is not None]
            now = time.monotonic()
            if failed_at is None and any(code not in (None, 0) for code in codes):
                failed_at = now
                self.first_failed = next(r for r, c in enumerate(codes) if c not in (None, 0))
            if failed_at is None and self.store is not None and self._gave_up_silently():
                failed_at = now        # mpiexec waits for a rank the others gave up on
            if said_at is None and self.error_seen.is_set():
                said_at = now
            if ((said_at is not None and now - said_at > _KILL_GRACE_S)
                    or (failed_at is not None and now - failed_at > self.silent_grace)
                    or (self._interrupted_at is not None
                        and now - self._interrupted_at > _KILL_GRACE_S)):
                self.ended_here = True
                self._kill_group()
            time.sleep(0.05)

    def _kill_group(self) -> None:
        if self.exits is not None:          # what this does to the ranks is not their doing
            if all(proc.poll() is not None for proc in self.procs):
                self.exits.settle()         # they all ended on their own: see each one go
            self.exits.stop()
        if self.group:
            kill_group(self.group)

    def _forward(self, signum: int, _frame: object) -> None:
        """Ctrl-C, SIGTERM, a closed terminal: the ranks get the same signal, and this
        launcher names the interruption (the ranks' own lines about it are not passed on)."""
        if self.interrupted is None:
            self.interrupted, self._interrupted_at = signum, time.monotonic()
            self._error_before_interruption = self.error_seen.is_set()
        if self.group:
            kill_group(self.group, signum)

    def _pass_stderr(self, stream: IO[bytes]) -> None:
        """Line by line (a carriage return ends a line too, for progress bars)."""
        pending = b""
        while True:
            chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
            if not chunk:
                break
            pending += chunk
            while True:
                cut = max(pending.rfind(b"\n"), pending.rfind(b"\r"))
                if cut < 0:
                    break
                complete, pending = pending[:cut + 1], pending[cut + 1:]
                self._emit(complete)
        if pending:
            self._emit(pending)

    def _emit(self, text: bytes) -> None:
        out = []
        for line in text.splitlines(keepends=True):
            if self.interrupted is not None and line.startswith(b"ccbench:"):
                continue                      # the launcher names the interruption itself
            if is_error_line(line):
                if self.error_seen.is_set():
                    continue                  # a consequence of the first; that one said why
                self.error_seen.set()
                out.append(self._before_error())
            out.append(line)
        with self._print_lock:
            sys.stderr.buffer.write(b"".join(out))
            sys.stderr.buffer.flush()

    def _why(self, codes: list[int]) -> str:
        """The launcher's own line, when no rank said what went wrong."""
        if self.stalled and self.ended_here:
            names = ", ".join(map(str, self.stalled))
            return (f"{self.stalled_label}: the other ranks gave up waiting and left, and "
                    f"{self.commands[0][0]} kept waiting for the ones still connected; ranks "
                    f"that did not arrive: {names}")
        if self.store is not None:
            line = self._store_verdict()
            if line is not None:
                return line
            if not self.store.arrived:
                return (f"start-up: {self.commands[0][0]} {_ended(codes[0])} before any rank "
                        f"connected to the control store (see its messages above)")
            return f"{self.commands[0][0]} {_ended(codes[0])} before any rank said why"
        first = self.first_failed if self.first_failed is not None else \
            next(r for r, c in enumerate(codes) if c != 0)
        return (f"rank {first} {_ended(codes[first])} and no rank said why; "
                f"ranks that did not arrive: {first}")

    def _gave_up_silently(self) -> bool:
        """Ranks under mpiexec left quietly (another was to say why) and nobody spoke: the
        ranks still connected are the ones they gave up on (a stopped rank that was to speak
        for them), and mpiexec would wait for those for ever."""
        assert self.store is not None
        if self.error_seen.is_set():
            return False
        _, closed, data = self.store.snapshot()
        if not any(key.startswith("left/") for key in data):
            return False
        gone = {rank for rank, _ in closed}
        self.stalled = sorted(set(self.store.arrived) - gone)
        labels = [value for key, value in data.items() if key.startswith(LABEL_KEY)]
        self.stalled_label = max(labels, key=lambda item: int(item[0]))[1] if labels else \
            "start-up"
        return bool(self.stalled)

    def _store_verdict(self) -> str | None:
        """Which rank went first and during what, from the ranks' connections to the store
        (the kernel closed them as each process ended; the handlers may lag a moment)."""
        assert self.store is not None
        deadline = time.monotonic() + 5.0
        while self.store.snapshot()[0] > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        _, closed, data = self.store.snapshot()
        # no rank's line came through: what a rank posted as said (`aborted`) or as leaving
        # quietly after it was lost with the mpiexec's output (Open MPI's, once it ends them)
        data = {k: v for k, v in data.items() if k != "aborted" and not k.startswith("left/")}
        exits = self.exits.snapshot() if self.exits is not None else None
        line = unexplained_end(closed, data, "mpiexec", self.world_size, set(self.store.arrived),
                               exits)
        return line.removeprefix(ERROR_PREFIX).strip() if line else None


_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _interruption(signum: int) -> str:
    name = signal.Signals(signum).name
    if signum == signal.SIGINT:
        return f"interrupted ({name}); the ranks were stopped"
    if signum == signal.SIGHUP:
        return f"the terminal went away ({name}); the ranks were stopped"
    return f"terminated ({name}); the ranks were stopped"


def _ended(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"ended with exit status {code}"


def _combined_status(codes: list[int]) -> int:
    if all(code == 0 for code in codes):
        return 0
    if any(code == 2 for code in codes):
        return 2
    return next(code if code > 0 else 128 - code for code in codes if code != 0)
