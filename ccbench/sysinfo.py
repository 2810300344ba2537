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
    """Bytes the kernel says can be allocated without swapping (MemAvailable), less where this
    process's cgroup (v2) allows less, or its address-space limit (RLIMIT_AS, `ulimit -v`)
    leaves less room; None where /proc/meminfo does not say."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            fields = dict(line.split(":", 1) for line in handle)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
    rooms = [r for r in (_cgroup_room(), address_space_room()) if r is not None]
    return min([available, *rooms])


def address_space_room() -> int | None:
    """Bytes of address space this process may still map under RLIMIT_AS (its soft limit
    less the size it has now, /proc/self/statm); None without a limit."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/statm", encoding="utf-8") as handle:
            size = int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        size = 0
    return max(0, soft - size)


def _cgroup_room() -> int | None:
    """Limit less usage of this process's memory cgroup (v2, else v1); None without one."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as handle:
            lines = [line.strip().split(":", 2) for line in handle]
    except OSError:
        return None
    for _, controllers, path in (parts for parts in lines if len(parts) == 3):
        if controllers == "":
            room = _room("/sys/fs/cgroup", path, "memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            room = _room("/sys/fs/cgroup/memory", path, "memory.limit_in_bytes",
                         "memory.usage_in_bytes")
        else:
            continue
        if room is not None:
            return room
    return None


def _room(mount: str, path: str, limit_file: str, usage_file: str) -> int | None:
    # inside a container the cgroup's own folder is usually the mount itself
    for folder in (f"{mount}{path.rstrip('/')}", mount):
        try:
            with open(f"{folder}/{limit_file}", encoding="utf-8") as handle:
                limit = handle.read().strip()
            with open(f"{folder}/{usage_file}", encoding="utf-8") as handle:
                usage = int(handle.read().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 1 << 60:      # v1 writes "no limit" as ~2^63
            return None
        return max(0, int(limit) - usage)
    return None
