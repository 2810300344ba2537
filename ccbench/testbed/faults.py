"""Faults injected into a running testbed, and taken back:

    fault h3 rate 33M          host h3's link(s) shaped to 33 Mbit/s (both directions)
    fault h3:eth1 rate 25M     one plane's port of h3
    fault h3:eth1 down | up    that port's link down / up (h3 alone: all its NICs)
    fault h3:r1 rate 20M       rail-optimized hosts (--rails): NIC 1 of h3, all its ports
    fault h3:r1p0 down         ... or one of its ports (plane 0)
    fault leaf1 rate 100M      the uplink between leaf1 and the spine
    fault h3 cpu 20            h3's processes limited to 20 % of one core (cgroup v1 CPU quota;
                               processes started there later, by `testbed exec` or slurmd,
                               too)
    fault h3 clear             every fault of h3 (and its ports) taken back; `all clear`: all

Each fault is kept in the testbed's state (status shows it); `down` removes everything.
"""

from __future__ import annotations

import os
from pathlib import Path

from ccbench.errors import UsageError
from ccbench.testbed.net import _run, _tbf, netns_pids, save_plan
from ccbench.testbed.topology import PREFIX, Fault, Link, Plan
from ccbench.units import format_rate, parse_rate

__all__ = ["CGROUP_CPU", "apply_fault", "cgroup_of", "remove_cgroups"]

CGROUP_CPU = Path(os.environ.get("CCBENCH_TESTBED_CGROUP", "/sys/fs/cgroup/cpu"))
CPU_PERIOD_US = 100_000
USAGE = ("usage: ccbench testbed fault TARGET ACTION: TARGET hI, hI:ethP or leafL; ACTION "
         "rate RATE | down | up | cpu PERCENT | clear (TARGET all: clear)")


def _host_links(plan: Plan, host: str, nic: str | None) -> list[Link]:
    from ccbench.testbed.topology import rail_nics

    rails = rail_nics(plan)
    links = [lk for lk in plan.links if ":" in lk.a and lk.a.split(":")[0] == host
             and (nic is None or lk.a.split(":")[1] == nic
                  or (nic in rails and lk.a.split(":")[1].startswith(f"{nic}p")))]
    if not links:
        raise UsageError(f"host {host} has no NIC {nic!r} (valid: "
                         f"{', '.join(rails + plan.host(host).nics)})")
    return links


def _uplink(plan: Plan, leaf: str) -> Link:
    for lk in plan.links:
        if lk.a_bridge == f"{PREFIX}{leaf}":
            return lk
    leaves = [lk.a_bridge.removeprefix(PREFIX) for lk in plan.links if lk.a_bridge]
    raise UsageError(f"no uplink of {leaf!r} on this testbed (topology {plan.topology}; "
                     f"valid: {', '.join(leaves) or 'none: use --topology two-tier:L'})")


def _shape(plan: Plan, links: list[Link], rate: int) -> None:
    for lk in links:
        if ":" in lk.a:
            host_name, nic = lk.a.split(":")
            _tbf(nic, rate, plan.host(host_name).netns)
        else:
            _tbf(lk.a, rate)
        _tbf(lk.b, rate)


def _set_link(plan: Plan, links: list[Link], state: str) -> None:
    for lk in links:
        host_name, nic = lk.a.split(":")
        _run(["ip", "-n", plan.host(host_name).netns, "link", "set", nic, state])


def cgroup_of(plan: Plan, host: str) -> Path | None:
    """The CPU cgroup a host's processes are confined to, if a CPU fault is set."""
    if "cpu" not in plan.options.get("faults", {}).get(host, {}):
        return None
    return CGROUP_CPU / f"{PREFIX}{host}"


def _limit_cpu(plan: Plan, host: str, percent: float) -> None:
    if not (CGROUP_CPU / "cpu.cfs_quota_us").exists():
        raise UsageError(f"cpu faults need the cgroup v1 CPU controller at {CGROUP_CPU}")
    group = CGROUP_CPU / f"{PREFIX}{host}"
    group.mkdir(exist_ok=True)
    (group / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
    (group / "cpu.cfs_quota_us").write_text(str(int(CPU_PERIOD_US * percent / 100)))
    for pid in netns_pids(plan.host(host).netns):
        try:
            (group / "cgroup.procs").write_text(str(pid))
        except OSError:                      # gone meanwhile, or a kernel thread
            pass


def _release_cpu(host: str) -> None:
    group = CGROUP_CPU / f"{PREFIX}{host}"
    if not group.exists():
        return
    for pid in group.joinpath("cgroup.procs").read_text().split():
        try:
            (CGROUP_CPU / "cgroup.procs").write_text(pid)
        except OSError:
            pass
    try:
        group.rmdir()
    except OSError:
        pass


def remove_cgroups() -> list[str]:
    """Every CPU cgroup a fault made (by name), also without the state file."""
    removed: list[str] = []
    if not CGROUP_CPU.exists():
        return removed
    for group in CGROUP_CPU.glob(f"{PREFIX}*"):
        _release_cpu(group.name.removeprefix(PREFIX))
        if not group.exists():
            removed.append(f"cgroup {group}")
    return removed


def _clear(plan: Plan, target: str) -> None:
    faults: dict[str, Fault] = plan.options.get("faults", {})
    for name in [t for t in faults if target == "all" or t.split(":")[0] == target]:
        host, _, nic = name.partition(":")
        fault = faults.pop(name)
        if name.startswith("leaf"):
            _shape(plan, [_uplink(plan, name)], int(fault["configured_bps"]))
            continue
        links = _host_links(plan, host, nic or None)
        if "rate" in fault:
            _shape(plan, links, plan.link_rate)
        if fault.get("link") == "down":
            _set_link(plan, links, "up")
        if "cpu" in fault:
            _release_cpu(host)


def apply_fault(plan: Plan, words: list[str]) -> str:
    """Inject (or take back) one fault; returns what was done, as a line."""
    if len(words) not in (2, 3):
        raise UsageError(USAGE)
    target, action, value = words[0], words[1], (words[2] if len(words) == 3 else None)
    faults: dict[str, Fault] = plan.options.setdefault("faults", {})
    if action == "clear":
        if target != "all" and not target.startswith("leaf"):
            plan.host(target.split(":")[0])
        _clear(plan, target)
        save_plan(plan)
        return f"cleared faults of {target}"
    if target.startswith("leaf"):
        if action != "rate" or value is None:
            raise UsageError(f"an uplink takes: {target} rate RATE (or clear)")
        link = _uplink(plan, target)
        rate = parse_rate(value)
        _shape(plan, [link], rate)
        faults[target] = {"rate": format_rate(rate), "configured_bps": link.rate}
        save_plan(plan)
        return f"uplink {target}-spine shaped to {format_rate(rate)} (was {format_rate(link.rate)})"
    host, _, nic = target.partition(":")
    plan.host(host)
    links = _host_links(plan, host, nic or None)
    entry = faults.setdefault(target, {})
    if action == "rate" and value is not None:
        rate = parse_rate(value)
        _shape(plan, links, rate)
        entry["rate"] = format_rate(rate)
        done = f"{target}'s link shaped to {format_rate(rate)}"
    elif action in ("down", "up") and value is None:
        _set_link(plan, links, action)
        if action == "down":
            entry["link"] = "down"
        else:
            entry.pop("link", None)
        done = f"{target}'s link set {action}"
    elif action == "cpu" and value is not None and not nic:
        try:
            percent = float(value)
        except ValueError:
            percent = -1.0
        if not 0 < percent <= 100:
            raise UsageError(f"cpu PERCENT must be in (0, 100], got {value!r}")
        _limit_cpu(plan, host, percent)
        entry["cpu"] = f"{percent:g} % of one core"
        done = f"{host}'s processes limited to {percent:g} % of one core"
    else:
        raise UsageError(USAGE)
    if not entry:
        faults.pop(target)
    save_plan(plan)
    return done
