"""How ranks were started: map each launcher's environment to rank, world size, local rank,
node count, and the address of the control store (hosted by rank 0).

| launcher | rank / size / local rank                          | control store address            |
|----------|---------------------------------------------------|----------------------------------|
| local    | RANK, WORLD_SIZE, LOCAL_RANK + CCBENCH_CONTROL    | CCBENCH_CONTROL (set by launch)  |
| torchrun | RANK, WORLD_SIZE, LOCAL_RANK (TORCHELASTIC_RUN_ID)| rank 0 publishes it in torchrun's store |
| mpiexec  | PMI_RANK / OMPI_COMM_WORLD_RANK / PMIX_RANK / MPI | rank 0 broadcasts it with MPI    |
| srun     | SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID         | first host of SLURM_NODELIST;    |
|          |                                                   | port from job and step ids       |
| single   | nothing set: one rank                             | in-process                        |
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ccbench.errors import RunFailure, UsageError
from ccbench.run.addresses import listen_address, published_address
from ccbench.run.arrivals import LATE_GRACE_S, LAUNCHER_PID_VAR, rank_states
from ccbench.run.control import (
    CONNECT_TIMEOUT_S,
    SECRET_VAR,
    ControlClient,
    ControlServer,
    StoreLost,
    new_secret,
    secret_from_env,
)
from ccbench.run.faults import UNREACHABLE_HOST, inject, planned
from ccbench.run.guard import StartGuard
from ccbench.run.launcher_env import (
    CONTROL_VAR,
    LOCAL,
    MPI_ENVS,
    MPI_RANK_VARS,
    SRUN,
    TORCHRUN,
    LauncherEnv,
)
from ccbench.run.secretfile import (
    read_secret_file,
    remove_when,
    write_secret_file,
)
from ccbench.run.storehost import start_store_host
from ccbench.run.terminated import real_stderr
from ccbench.timeouts import DEFAULT_TIMEOUT_S

__all__ = ["CONTROL_FD_VAR", "MPI_CONTROL_VAR", "MPI_LAUNCHERS", "LaunchInfo", "connect_control",
           "detect_launch", "expand_nodelist", "mpiexec_beside", "published_address",
           "require_mpi_launcher"]

# the launchers whose ranks are MPI processes (single: MPI_Init with no mpiexec, one rank)
MPI_LAUNCHERS = ("mpiexec", "srun", "single")

# set by `ccbench launch` for ranks it starts under mpiexec: the address of the control store it
# hosts itself (it outlives every rank, whatever the mpiexec does to them when one dies)
MPI_CONTROL_VAR = "CCBENCH_MPI_CONTROL"
# the descriptor of the control port that `ccbench launch` bound for rank 0 (its store listens on
# it: the port cannot be taken between the launcher's choice and the store's start)
CONTROL_FD_VAR = "CCBENCH_CONTROL_FD"


@dataclass(frozen=True, slots=True)
class LaunchInfo:
    launcher: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def _env_int(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise UsageError(f"launcher variable {name} is not set")
        return default
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"launcher variable {name}={value!r} is not an integer") from None


def under_mpi_launcher() -> bool:
    return any(name in os.environ for name in (*MPI_RANK_VARS, "PMI_SIZE"))


def detect_launch() -> LaunchInfo:
    env = os.environ
    if CONTROL_VAR in env and LOCAL.rank in env:
        return _plain_launch_info(LOCAL)
    if "TORCHELASTIC_RUN_ID" in env or (TORCHRUN.rank in env and "MASTER_ADDR" in env):
        return _plain_launch_info(TORCHRUN)
    if under_mpi_launcher():
        return _mpi_launch_info()
    if SRUN.rank in env and "SLURM_STEP_ID" in env:
        return LaunchInfo("srun", _env_int(SRUN.rank), _env_int(SRUN.size),
                          _env_int(SRUN.local_rank, 0),
                          _tasks_on_this_node(env.get(SRUN.local_size, "1")))
    return LaunchInfo("single", 0, 1, 0, 1)


def _plain_launch_info(launcher: LauncherEnv) -> LaunchInfo:
    return LaunchInfo(launcher.name, _env_int(launcher.rank), _env_int(launcher.size),
                      _env_int(launcher.local_rank, 0), _env_int(launcher.local_size, 1))


def _first_set(names: list[str], default: str) -> str:
    return next((os.environ[name] for name in names if os.environ.get(name)), default)


def _mpi_launch_info() -> LaunchInfo:
    env = os.environ
    for mpi in MPI_ENVS:
        if mpi.rank in env and mpi.size in env:
            local = _first_set([m.local_rank for m in MPI_ENVS if m.local_rank], "0")
            local_size = _first_set([m.local_size for m in MPI_ENVS if m.local_size], "1")
            return LaunchInfo("mpiexec", _env_int(mpi.rank), _env_int(mpi.size),
                              int(local), int(local_size))
    with StartGuard("MPI start-up (MPI_Init)", _MPI_INIT_LIMIT_S, -1, 0):
        from mpi4py import MPI  # the variables differ between MPIs: ask MPI itself

    world = MPI.COMM_WORLD
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    info = LaunchInfo("mpiexec", world.Get_rank(), world.Get_size(), node.Get_rank(),
                      node.Get_size())
    node.Free()
    return info


_MPI_INIT_LIMIT_S = DEFAULT_TIMEOUT_S


def _tasks_on_this_node(spec: str) -> int:
    # SLURM_TASKS_PER_NODE looks like "4(x2),3"; this node's count is good enough from the first
    match = re.match(r"(\d+)", spec)
    return int(match.group(1)) if match else 1


def expand_nodelist(nodelist: str) -> list[str]:
    """`node[01-03,07],gpu5` -> ['node01', 'node02', 'node03', 'node07', 'gpu5']."""
    hosts: list[str] = []
    for match in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist):
        prefix, ranges = match.group(1), match.group(2)
        if not ranges:
            hosts.append(prefix)
            continue
        for item in ranges.split(","):
            low, _, high = item.partition("-")
            for number in range(int(low), int(high or low) + 1):
                hosts.append(f"{prefix}{number:0{len(low)}d}")
    return hosts


def mpiexec_beside(python: str = sys.executable) -> str | None:
    """The mpiexec in the same bin/ as `python` (its venv's MPI, from impi-rt or mpich), if any:
    the MPI that python's mpi4py was built against."""
    beside = Path(python).parent / "mpiexec"
    return str(beside) if beside.exists() else None


def require_mpi_launcher(info: LaunchInfo, backend: str) -> None:
    """Refuse, before any rendezvous, a backend that needs MPI in ranks some other launcher
    started (the caller asks the backend whether it needs one)."""
    if info.launcher not in MPI_LAUNCHERS:
        raise UsageError(f"backend {backend!r} needs ranks started by mpiexec (or srun), not "
                         f"{info.launcher}; `ccbench launch` starts it under mpiexec")


def _handed_socket() -> socket.socket | None:
    """The control port's socket that `ccbench launch` bound and handed to rank 0 (by its
    descriptor in CONTROL_FD_VAR), or None."""
    fd = os.environ.pop(CONTROL_FD_VAR, None)
    if fd is None:
        return None
    try:
        return socket.socket(fileno=int(fd))
    except (OSError, ValueError):
        return None                        # not (or no longer) a socket: bind the port


def _own_store(host: str, port: int, secret: str, world_size: int,
               bound: socket.socket | None = None, hint: str = "") -> ControlServer:
    """Rank 0's control store on a port chosen before it started: one taken meanwhile by
    another process is one line, not a traceback."""
    try:
        return ControlServer(host, port, secret, world_size, bound=bound)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        raise UsageError(f"start-up: the control port {host}:{port} is taken by another "
                         f"process (EADDRINUSE): {hint}") from None


def connect_control(info: LaunchInfo, timeout: float, connect_timeout: float = CONNECT_TIMEOUT_S
                    ) -> tuple[ControlClient, ControlServer | None]:
    """Rank 0 starts the store; every rank (rank 0 too) connects to it, giving up after
    `connect_timeout`; every reply is bounded by the op `timeout`. A fault planned for
    start-up (ccbench.run.faults) happens here: before connecting, or, where the store is up
    before any rank starts (the launcher's, under mpiexec), between connecting and MPI_Init."""
    server: ControlServer | None = None
    host, port = "127.0.0.1", 0
    secret = secret_from_env()
    env = os.environ
    inject("before-connect", info.rank)
    if not (info.launcher == "mpiexec" and MPI_CONTROL_VAR in env):
        inject("start-up", info.rank)
    if info.launcher == "local":
        host, _, port_text = env[CONTROL_VAR].rpartition(":")
        port = int(port_text)
        if secret is None:
            raise UsageError(f"CCBENCH_CONTROL is set but {SECRET_VAR} is not: ranks started "
                             f"by hand need the same secret in each rank's environment, e.g. "
                             f"{SECRET_VAR}=$(python -c 'import secrets; "
                             f"print(secrets.token_hex(32))') (`ccbench launch` sets both)")
        if info.rank == 0:
            server = _own_store(listen_address(host), port, secret, info.world_size,
                                _handed_socket(), f"choose a free port for {CONTROL_VAR}, or "
                                f"let `ccbench launch` choose one")
    elif info.launcher == "single":
        server = ControlServer("127.0.0.1", 0, world_size=1)
        port, secret = server.port, server.secret
    elif info.launcher == "srun":
        nodes = expand_nodelist(env.get("SLURM_STEP_NODELIST", env.get("SLURM_NODELIST", "")))
        # one node: every rank is here, the store on loopback
        host = "127.0.0.1" if len(set(nodes)) == 1 else nodes[0]
        port = 20000 + (_env_int("SLURM_JOB_ID", 0) * 7 + _env_int("SLURM_STEP_ID", 0)) % 30000
        secret = secret or _srun_without_secret(info)
        if info.rank == 0:
            server = _own_store(listen_address(host), port, secret, info.world_size,
                                hint="the port comes from SLURM_JOB_ID and SLURM_STEP_ID: "
                                     "run the step again")
    elif info.launcher == "torchrun":
        server, host, port, secret = _via_torchrun_store(info, timeout, connect_timeout)
    elif info.launcher == "mpiexec" and MPI_CONTROL_VAR in env:
        # the launcher's store: connect before MPI_Init, so that the store knows which ranks got
        # that far even when the mpiexec kills them all at once, during MPI_Init too
        host, _, port_text = env[MPI_CONTROL_VAR].rpartition(":")
        host = _fault_host(info, host)
        if host == UNREACHABLE_HOST:     # that fault is the address: it happens at connecting
            inject("start-up", info.rank)
        client = ControlClient(host, int(port_text), info.rank,
                               connect_timeout=connect_timeout, reply_timeout=timeout,
                               secret=secret)
        client.holder = "ccbench launch"
        inject("start-up", info.rank)
        _mpi_init(info, timeout)
        return client, None
    elif info.launcher == "mpiexec":
        server, host, port, secret = _via_mpi(info, timeout)
    try:
        return ControlClient(_fault_host(info, host), port, info.rank,
                             connect_timeout=connect_timeout, reply_timeout=timeout,
                             rank0_state=_rank0_state(info), secret=secret), server
    except StoreLost as lost:
        if lost.rank0_gone and info.launcher == "srun" and not _says_rank0_gone(info,
                                                                                 connect_timeout):
            raise SystemExit(1) from None
        raise


def _says_rank0_gone(info: LaunchInfo, limit: float) -> bool:
    """Rank 0 seen gone at start-up under srun, which passes on every rank's lines: the lowest
    rank still running says so, the others wait until it has gone (bounded) and leave without
    a line. A lower rank stopped meanwhile says nothing: then this one does."""
    deadline = time.monotonic() + limit
    while True:
        states = rank_states(info.launcher, info.world_size, info.local_world_size)
        if states is None:
            return True
        lower = [r for r in range(1, info.rank) if states.get(r) not in ("gone", "stopped")]
        if not lower:
            # the lower ranks are gone (each said it, or it was killed: the launcher names
            # that one) or stopped: speak only if none of them is gone
            return not any(states.get(r) == "gone" for r in range(1, info.rank))
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


_SRUN_FALLBACK_NOTE = ("ccbench: warning: srun: CCBENCH_CONTROL_SECRET is not set, so the "
                       "control store cannot tell this run's ranks from anyone else who reaches "
                       "its port; export one before srun (docs/security.md)")


def _srun_without_secret(info: LaunchInfo) -> str:
    """srun hands over nothing but the environment: without a secret in it, every rank can
    only derive the same public one from the job (said once, by rank 0)."""
    if info.rank == 0:
        print(_SRUN_FALLBACK_NOTE, file=sys.stderr, flush=True)
    return f"unauthenticated/{os.environ.get('SLURM_JOB_ID', '')}/" \
        f"{os.environ.get('SLURM_STEP_ID', '')}"


def _fault_host(info: LaunchInfo, host: str) -> str:
    return UNREACHABLE_HOST if planned(info.rank) == ("start-up", "unreachable") else host


def _rank0_state(info: LaunchInfo) -> Callable[[], str | None] | None:
    """Whether rank 0's process still runs, where this host can see it: a rank 0 that is late
    to open the store is waited for, one that died is named at once."""
    if info.rank == 0 or info.launcher not in ("local", "srun"):
        return None

    def state() -> str | None:
        seen = rank_states(info.launcher, info.world_size, info.local_world_size)
        return seen.get(0) if seen is not None else None

    return state


def _via_mpi(info: LaunchInfo, timeout: float) -> tuple[ControlServer | None, str, int, str]:
    """MPI_Init and the broadcast of the address hold the interpreter (no watchdog thread can
    run) and wait for every rank: a guard process ends this rank if they do not finish.
    Under a bare mpiexec (not `ccbench launch`, which keeps the ranks alive to speak), the
    store runs in a process of its own (ccbench.run.storehost), which outlives the ranks. Rank 0
    makes the run's secret and sends it to the others with the address, over MPI."""
    server: ControlServer | None = None
    port = 0
    all_local = info.local_world_size == info.world_size
    bound = "127.0.0.1" if all_local else published_address()
    secret = new_secret() if info.rank == 0 else ""
    if info.rank == 0:
        if hosted_apart():
            # every rank on this host: the store host can watch them all (ccbench.run.rankexits)
            port = start_store_host("mpiexec", bound, secret, info.world_size,
                                    watch=all_local)
        else:
            server = ControlServer(bound, 0, secret, info.world_size)
            port = server.port
    with StartGuard("MPI start-up (MPI_Init)", timeout, info.rank, info.world_size,
                    all_local=all_local):
        from mpi4py import MPI

        address = (bound, port, secret) if info.rank == 0 else None
        host, port, secret = MPI.COMM_WORLD.bcast(address, root=0)
    return server, host, port, secret


def _mpi_init(info: LaunchInfo, timeout: float) -> None:
    """MPI_Init, which holds the interpreter while it waits for every rank, under its guard."""
    with StartGuard("MPI start-up (MPI_Init)", timeout, info.rank, info.world_size,
                    all_local=info.local_world_size == info.world_size):
        from mpi4py import MPI

        MPI.COMM_WORLD.Barrier()


def hosted_apart() -> bool:
    """Whether the control store of an MPI-launched run lives outside rank 0: in the
    `ccbench launch` that started the ranks, or, when none supervises them, in a process of
    its own (ccbench.run.storehost)."""
    return LAUNCHER_PID_VAR not in os.environ or MPI_CONTROL_VAR in os.environ


def _via_torchrun_store(info: LaunchInfo, timeout: float, connect_timeout: float
                        ) -> tuple[ControlServer | None, str, int, str]:
    """Rank 0 publishes the store's address in torchrun's rendezvous store, which anyone who
    reaches it can read and write (torch's store has no authentication), so never the secret
    itself (docs/security.md): the ranks take it from CCBENCH_CONTROL_SECRET or the file
    CCBENCH_CONTROL_SECRET_FILE names where you set one; on one host, rank 0 publishes the
    path of a file only this user can read (ccbench.run.secretfile); across hosts without
    either, the ranks agree on per-rank keys with rank 0 (ccbench.run.keyexchange)."""
    store = _torchrun_store(info, timeout)
    key = "ccbench/control/" + os.environ.get("TORCHELASTIC_RUN_ID", "run") \
        + "/" + os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    given = secret_from_env()
    all_local = info.local_world_size == info.world_size
    _note_spoken_check(store, key)
    if info.rank == 0:
        bound = "127.0.0.1" if all_local else published_address(master_of_torchrun()[0])
        if given is None and not all_local:
            from ccbench.run.keyexchange import rank0_keys

            keys = rank0_keys(store, key, info.world_size, timeout)
            server = ControlServer(bound, 0, world_size=info.world_size, keys=keys)
            secret = keys[0]
        else:
            server = ControlServer(bound, 0, given, world_size=info.world_size)
            secret = server.secret
            if given is None:
                path = write_secret_file(secret)
                store.set(key + "/secret-file", path)
                remove_when(path, lambda: len(server.arrived) >= info.world_size,
                            connect_timeout + LATE_GRACE_S + 10)
        store.set(key, f"{bound}:{server.port}")
        return server, bound, server.port, secret
    if given is None and not all_local:
        from ccbench.run.keyexchange import rank_key

        secret = rank_key(store, key, info.rank, timeout)
    host, _, port = store.get(key).decode().rpartition(":")
    if given is None and all_local:
        try:
            given = read_secret_file(store.get(key + "/secret-file").decode(),
                                     f"rank {info.rank}: the secret file torchrun's store names")
        except RunFailure:
            # the first rank refused says why (it cannot reach the control store): the others,
            # refused too or stopped by torchrun then, must not add a line of their own
            first = True
            with contextlib.suppress(RuntimeError, OSError):
                first = store.add(key + SPOKEN_SUFFIX, 1) == 1
            if not first:
                raise SystemExit(1) from None
            raise
    return None, host, int(port), secret if given is None else given


#: under torchrun: a key of its store that a rank refused before reaching the control store
#: sets, once it has said why (anyone who reaches torchrun's store can set it: it only keeps
#: the others from adding a line when torchrun stops them)
SPOKEN_SUFFIX = "/spoken"
_SPOKEN_CHECK: list[Callable[[], bool]] = []


def spoken_before_connecting() -> Callable[[], bool] | None:
    """Under torchrun, whether a rank said why it ends before it reached the control store."""
    return _SPOKEN_CHECK[0] if _SPOKEN_CHECK else None


def _note_spoken_check(store: Any, key: str) -> None:
    def spoken() -> bool:
        try:
            return bool(store.check([key + SPOKEN_SUFFIX]))
        except (RuntimeError, OSError):
            return False

    _SPOKEN_CHECK[:] = [spoken]


def master_of_torchrun() -> tuple[str, int]:
    return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])


def _torchrun_store(info: LaunchInfo, timeout: float) -> Any:
    import datetime

    from torch.distributed import TCPStore

    master, master_port = master_of_torchrun()
    try:
        with _native_stderr_silenced():   # c10d logs every retry with a C++ stack
            return TCPStore(master, master_port, info.world_size, is_master=False,
                            timeout=datetime.timedelta(seconds=timeout), use_libuv=True)
    except (RuntimeError, OSError) as exc:     # torch's DistStoreError is a RuntimeError
        why = str(exc).splitlines()[0].rstrip(".") if str(exc) else type(exc).__name__
        raise RunFailure(f"rank {info.rank}: cannot reach torchrun's store at "
                         f"{master}:{master_port} (MASTER_ADDR:MASTER_PORT) within {timeout:g} s "
                         f"({why}); start ranks with torchrun, or unset the torchrun variables"
                         ) from None


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """File descriptor 2 to /dev/null for a while (native libraries write there directly)."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    real_stderr(saved)                    # a SIGTERM meanwhile is still said (run.terminated)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        real_stderr(None)
        os.close(saved)
        os.close(null)
