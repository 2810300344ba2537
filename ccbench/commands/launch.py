"""`ccbench launch [-n N] [--] COLLECTIVE ...`: the embedded default launcher.

Starts N local ranks (default: one per local GPU for a GPU run, else one per usable core) with
a loopback rendezvous. If any requested backend needs MPI, all ranks are started by mpiexec
(the torch backends then bootstrap from MPI); otherwise they are plain processes with RANK /
WORLD_SIZE / LOCAL_RANK and CCBENCH_CONTROL (the control store address).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ccbench.errors import BackendUnavailable, UsageError
from ccbench.sysinfo import usable_cores

_GRACE_S = 5.0   # after one rank fails, the rest get the op timeout plus this to report


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("launch", help="start N local ranks (no cluster needed)")
    parser.add_argument("-n", "--nprocs", type=int, default=None,
                        help="number of ranks (default: the local GPUs for a GPU run, else the "
                             "cores this process may use; more ranks than that oversubscribe)")
    parser.add_argument("--mpiexec", default=None,
                        help="mpiexec to use for MPI backends (default: the one beside python)")
    parser.add_argument("bench", nargs=argparse.REMAINDER,
                        help="the benchmark arguments: COLLECTIVE [--backend ...]")


def find_mpiexec(explicit: str | None = None) -> str | None:
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    return shutil.which("mpiexec")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _check_backends(names: list[str]) -> bool:
    """Fail fast here, once, rather than in every rank. Returns whether MPI is needed."""
    from ccbench.backends import backend_class

    try:
        import mpi4py

        mpi4py.rc.initialize = False      # probe libmpi without becoming an MPI process
    except ImportError:
        pass
    needs_mpi = False
    for name in names:
        cls = backend_class(name)
        reason = cls.unavailable_reason()
        if reason:
            raise BackendUnavailable(f"backend {name!r} unavailable: {reason}")
        needs_mpi |= cls.needs_mpi_launcher
    return needs_mpi


def build_commands(nprocs: int, bench: list[str], needs_mpi: bool, mpiexec: str | None
                   ) -> tuple[list[list[str]], list[dict[str, str]]]:
    """The command line and extra environment of each process to start (pure, for tests)."""
    python = [sys.executable, "-m", "ccbench", *bench]
    if needs_mpi:
        if mpiexec is None:
            raise BackendUnavailable("an MPI backend was asked for but no mpiexec was found "
                                     "(pip install 'ccbench[mpi]' or pass --mpiexec)")
        return [[mpiexec, "-n", str(nprocs), *python]], [{}]
    control = f"127.0.0.1:{_free_port()}"
    envs = [{"RANK": str(r), "WORLD_SIZE": str(nprocs), "LOCAL_RANK": str(r),
             "LOCAL_WORLD_SIZE": str(nprocs), "CCBENCH_CONTROL": control}
            for r in range(nprocs)]
    return [python for _ in range(nprocs)], envs


def main(args: argparse.Namespace) -> int:
    from ccbench.cli import bench_parser, config_from_args

    if args.nprocs is not None and args.nprocs < 1:
        raise UsageError(f"-n must be >= 1, got {args.nprocs}")
    bench = [a for a in args.bench if a != "--"] if args.bench[:1] == ["--"] else list(args.bench)
    if not bench:
        raise UsageError("launch needs a benchmark: ccbench launch -n 2 allreduce --backend gloo")
    config = config_from_args(bench_parser().parse_args(bench), bench)
    needs_mpi = _check_backends(config.backends)
    nprocs = args.nprocs if args.nprocs is not None else default_nprocs(config.device)
    commands, envs = build_commands(nprocs, bench, needs_mpi, find_mpiexec(args.mpiexec))
    if needs_mpi and nprocs > usable_cores():
        # oversubscribed: yield the core while waiting, so ranks do not starve each other (with a
        # core each, Intel MPI busy-polls, as IMB-MPI1 and the OSU benchmarks measure it)
        envs = [{"I_MPI_WAIT_MODE": os.environ.get("I_MPI_WAIT_MODE", "1"), **e} for e in envs]
    return _supervise(commands, envs, config.method.timeout)


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


def _supervise(commands: list[list[str]], envs: list[dict[str, str]], timeout: float) -> int:
    procs = [subprocess.Popen(cmd, env={**os.environ, **env})
             for cmd, env in zip(commands, envs, strict=True)]

    def forward(signum: int, _frame: object) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    previous = signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    failed_at: float | None = None
    try:
        while any(p.poll() is None for p in procs):
            if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > timeout + _GRACE_S:
                for proc in procs:
                    if proc.poll() is None:
                        proc.kill()
            time.sleep(0.05)
    finally:
        signal.signal(signal.SIGINT, previous)
    codes = [p.returncode for p in procs]
    return _combined_status(codes)


def _combined_status(codes: list[int]) -> int:
    if all(code == 0 for code in codes):
        return 0
    if any(code == 2 for code in codes):
        return 2
    return next(code if code > 0 else 128 - code for code in codes if code != 0)
