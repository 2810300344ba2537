"""Facts about this machine that records and `ccbench doctor` both report."""

from __future__ import annotations

import os
import platform


def cpu_model() -> str:
    """The processor's marketing name from /proc/cpuinfo, else what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, which a cgroup or taskset narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def node_cores() -> int:
    """Cores of the node, whatever this process is pinned to (mpiexec pins each rank to one)."""
    return os.cpu_count() or 1


def oversubscription_note(ranks: int, cores: int, what: str = "cores") -> str | None:
    """One line for a user whose ranks outnumber the node's cores, else None."""
    if ranks <= cores:
        return None
    return (f"ccbench: note: {ranks} ranks on {cores} {what}: ranks take turns on the {what}, "
            f"so times include waiting for a {what[:-1]} and are not the library's "
            f"(recorded as oversubscribed; -n {cores} gives numbers of the library)")


def available_memory() -> int | None:
    """Bytes the kernel says can be allocated without swapping (MemAvailable); None where
    /proc/meminfo does not say."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            fields = dict(line.split(":", 1) for line in handle)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
