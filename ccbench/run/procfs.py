"""The processes of this host as /proc shows them (Linux): the one place that parses it.

Used to tell which rank processes exist and in what state (arrivals), which ranks sit below
an mpiexec and when they end (rankexits), and which peers the MPI_Init guard can see (guard).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ccbench.run.launcher_env import MPI_RANK_VARS

__all__ = ["ENDED", "MPI_RANK_VARS", "environ", "mpi_rank", "pids", "stat"]

# process states of a process that has ended (zombie, dead)
ENDED = ("Z", "X")


def pids() -> Iterator[int]:
    """Every process id /proc lists now."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            yield int(entry.name)


def environ(pid: int | str) -> dict[bytes, bytes] | None:
    """The process's environment as it started (None when it is gone or not readable)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    return dict(v.split(b"=", 1) for v in raw.split(b"\0") if b"=" in v)


def stat(pid: int | str) -> tuple[int, str] | None:
    """(parent pid, state letter) of the process (None when it is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        fields = text[text.rindex(")") + 2:].split()
        return int(fields[1]), fields[0]
    except (OSError, ValueError, IndexError):
        return None


def mpi_rank(env: dict[bytes, bytes], names: tuple[str, ...] = MPI_RANK_VARS) -> int | None:
    """The rank an environment names through the first of `names` it holds."""
    for name in names:
        value = env.get(name.encode())
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None
