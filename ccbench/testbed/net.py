"""Create and remove a testbed's namespaces, bridges, veth links and tbf shaping with iproute2.

Everything created carries the `ccb-` prefix (namespaces, bridges, root-side veth ends) or the
`# ccbench-testbed` marker (/etc/hosts lines), and `teardown` removes by those marks as well as
by the state file, so it also cleans what a killed `up` left behind. Each host runs its
commands through `host_command`: `nsenter --net` into its namespace (not `ip netns exec`, which
remounts /sys and hides the cgroup tree slurmd needs) and `unshare --uts` with its own hostname.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from ccbench.errors import RunFailure, UsageError
from ccbench.testbed.topology import PREFIX, Plan, root_bridge

__all__ = ["STATE_DIR", "create", "host_command", "load_plan", "netns_pids", "require_root",
           "teardown"]

STATE_DIR = Path(os.environ.get("CCBENCH_TESTBED_DIR", "/run/ccbench-testbed"))
STATE_FILE = STATE_DIR / "state.json"
HOSTS_FILE = Path("/etc/hosts")
HOSTS_MARK = "# ccbench-testbed"
NETNS_DIR = Path("/run/netns")


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise RunFailure(f"testbed: `{' '.join(argv)}` failed: "
                         f"{(proc.stderr or proc.stdout).strip()}")
    return proc


def require_root() -> None:
    """One clear line (exit 2) where the testbed cannot work."""
    if os.geteuid() != 0:
        raise UsageError("ccbench testbed needs root (it creates network namespaces, bridges "
                         "and /etc/hosts entries); run it with sudo")
    for tool in ("ip", "tc", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            raise UsageError(f"ccbench testbed needs {tool!r} (apt-get install iproute2 "
                             f"util-linux)")
    if not Path("/proc/self/ns/net").exists():
        raise UsageError("ccbench testbed needs network namespaces, which this kernel lacks")


def host_command(netns: str, hostname: str, argv: Sequence[str]) -> list[str]:
    """argv run on an emulated host: its network namespace and its own hostname."""
    return ["nsenter", f"--net={NETNS_DIR / netns}", "unshare", "--uts", "--",
            "sh", "-c", 'hostname "$0" && exec "$@"', hostname, *argv]


def load_plan() -> Plan | None:
    try:
        data = json.loads(STATE_FILE.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RunFailure(f"testbed state {STATE_FILE} unreadable: {exc} "
                         f"(`ccbench testbed down` removes it)") from None
    return Plan.from_json(data)


def save_plan(plan: Plan) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = STATE_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(plan.to_json(), indent=1))
    tmp.replace(STATE_FILE)


def _tbf(dev: str, rate: int, netns: str | None = None) -> None:
    # burst: 2 ms of traffic (at least 16 kB) so that one timer tick does not throttle below rate
    burst = max(16000, rate // 8 // 500)
    _run(["tc", *(["-n", netns] if netns else []), "qdisc", "replace", "dev", dev, "root",
          "tbf", "rate", f"{rate}bit", "burst", str(burst), "latency", "50ms"])


def create(plan: Plan) -> None:
    """Build the plan; on any failure remove everything and re-raise."""
    _check_subnet_free()
    save_plan(plan)                        # first, so `down` knows what to remove
    try:
        _create(plan)
    except BaseException:
        teardown(plan)
        raise


def _check_subnet_free() -> None:
    routes = _run(["ip", "-4", "route", "show"]).stdout
    for line in routes.splitlines():
        if line.startswith("10.213.") and f"{PREFIX}" not in line:
            raise UsageError(f"testbed subnet 10.213.0.0/16 is already routed here ({line.strip()}); "
                             f"the testbed needs it for itself")


def _create(plan: Plan) -> None:
    for bridge in plan.bridges:
        _run(["ip", "link", "add", bridge.name, "type", "bridge"])
        _run(["ip", "link", "set", bridge.name, "up"])
    for host in plan.hosts:
        _run(["ip", "netns", "add", host.netns])
        _run(["ip", "-n", host.netns, "link", "set", "lo", "up"])
    for link in plan.links:
        if ":" in link.a:                              # host NIC <-> bridge port
            host_name, nic = link.a.split(":")
            host = plan.host(host_name)
            _run(["ip", "link", "add", link.b, "type", "veth", "peer", "name", nic,
                  "netns", host.netns])
            _run(["ip", "-n", host.netns, "addr", "add", host.addresses[nic], "dev", nic])
            _run(["ip", "-n", host.netns, "link", "set", nic, "up"])
            _tbf(nic, link.rate, host.netns)
        else:                                          # bridge <-> bridge (leaf uplink)
            _run(["ip", "link", "add", link.a, "type", "veth", "peer", "name", link.b])
            _run(["ip", "link", "set", link.a, "master", str(link.a_bridge)])
            _run(["ip", "link", "set", link.a, "up"])
            _tbf(link.a, link.rate)
        _run(["ip", "link", "set", link.b, "master", link.bridge])
        _run(["ip", "link", "set", link.b, "up"])
        _tbf(link.b, link.rate)
    _run(["ip", "addr", "add", plan.root_address, "dev", root_bridge(plan)])
    if plan.options.get("rails", 1) > 1:
        _rails(plan)
    elif plan.options.get("planes") == 2:
        _ecmp(plan)
    _write_hosts(plan)
    for host in plan.hosts:                            # every host reaches every other one
        for other in plan.hosts:
            if other is not host:
                _wait_reachable(host.netns, other.address)
                break


# per host namespace, for the dual-ToR emulation: a route whose NIC is down is not used
# (ignore_routes_with_linkdown), flows are hashed over both planes by ports (policy 1), a
# next hop whose neighbour stopped answering is skipped (use_neigh) and neighbours are
# re-checked after 2-4 s instead of 15-45 s, so that senders move to the other plane soon
# after a peer's port went down
_ECMP_SYSCTLS = {"net.ipv4.conf.all.ignore_routes_with_linkdown": "1",
                 "net.ipv4.fib_multipath_hash_policy": "1",
                 "net.ipv4.fib_multipath_use_neigh": "1"}
_NEIGH_SYSCTLS = {"base_reachable_time_ms": "4000", "delay_first_probe_time": "1"}


def _ecmp(plan: Plan) -> None:
    """Each host's own address on lo (/32), reached from every other host by one route with
    a next hop on each plane; the machine's namespace reaches it over plane 0."""
    for host in plan.hosts:
        settings = dict(_ECMP_SYSCTLS)
        for nic in host.nics:        # a namespace has no neigh.default: per NIC
            settings.update({f"net.ipv4.neigh.{nic}.{k}": v for k, v in _NEIGH_SYSCTLS.items()})
        for key, value in settings.items():
            _run(["ip", "netns", "exec", host.netns, "sysctl", "-qw", f"{key}={value}"])
        _run(["ip", "-n", host.netns, "addr", "add", host.addresses["lo"], "dev", "lo"])
        for other in plan.hosts:
            if other is host:
                continue
            hops = []
            for nic in other.nics:
                hops += ["nexthop", "via", other.addresses[nic].split("/")[0], "dev", nic]
            _run(["ip", "-n", host.netns, "route", "add", other.addresses["lo"], "src",
                  host.address, *hops])
        _run(["ip", "route", "add", host.addresses["lo"], "via",
              host.addresses["eth0"].split("/")[0], "dev", root_bridge(plan)])


def _rails(plan: Plan) -> None:
    """Rail-optimized hosts: NIC r's own address on a device `r<r>` (/32), reached
    from NIC r of every other host by one route with a next hop on each of its ports (ECMP
    over the planes, as `_ecmp` does for a host)."""
    from ccbench.testbed.topology import rail_nics

    for host in plan.hosts:
        settings = dict(_ECMP_SYSCTLS)
        for nic in host.nics:
            settings.update({f"net.ipv4.neigh.{nic}.{k}": v for k, v in _NEIGH_SYSCTLS.items()})
        for key, value in settings.items():
            _run(["ip", "netns", "exec", host.netns, "sysctl", "-qw", f"{key}={value}"])
        for rail in rail_nics(plan):
            # a veth pair inside the host stands for the NIC (no dummy module everywhere)
            _run(["ip", "-n", host.netns, "link", "add", rail, "type", "veth", "peer", "name",
                  f"{rail}x"])
            _run(["ip", "-n", host.netns, "addr", "add", host.addresses[rail], "dev", rail])
            for end in (rail, f"{rail}x"):
                _run(["ip", "-n", host.netns, "link", "set", end, "up"])
    for host in plan.hosts:
        for rail in rail_nics(plan):
            ports = [nic for nic in host.nics if nic.startswith(f"{rail}p")]
            mine = host.addresses[rail].split("/")[0]
            for other in plan.hosts:
                if other is host:
                    continue
                hops = []
                for port in ports:
                    hops += ["nexthop", "via", other.addresses[port].split("/")[0], "dev", port]
                _run(["ip", "-n", host.netns, "route", "add", other.addresses[rail], "src",
                      mine, *hops])


def _wait_reachable(netns: str, address: str, timeout: float = 10.0) -> None:
    """A TCP connect to a closed port answers RST once the path works (no ping needed)."""
    code = ("import socket,sys\n"
            "s=socket.socket(); s.settimeout(1)\n"
            "try: s.connect((sys.argv[1], 9))\n"
            "except ConnectionRefusedError: sys.exit(0)\n"
            "except OSError: sys.exit(1)\n")
    deadline = time.monotonic() + timeout
    while True:
        proc = _run(["nsenter", f"--net={NETNS_DIR / netns}", "python3", "-c", code, address],
                    check=False)
        if proc.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise RunFailure(f"testbed: {address} not reachable from {netns} after {timeout:g}s")
        time.sleep(0.2)


def _write_hosts(plan: Plan) -> None:
    """The hosts' names first: the resolver takes the first line naming a host, and a stale
    line for h1 left by anything else must not win (gloo then falls back to loopback)."""
    lines = [f"{h.address} {h.name} {HOSTS_MARK}" for h in plan.hosts]
    HOSTS_FILE.write_text("\n".join(lines + _hosts_without_marks()) + "\n")


def _hosts_without_marks() -> list[str]:
    try:
        text = HOSTS_FILE.read_text()
    except FileNotFoundError:
        return []
    return [line for line in text.splitlines() if HOSTS_MARK not in line]


def netns_pids(netns: str) -> list[int]:
    proc = _run(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def _kill_namespace_processes(namespaces: list[str]) -> None:
    """Every process in our namespaces: TERM, then KILL after 3 s."""
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 2.0)):
        pids = [pid for ns in namespaces for pid in netns_pids(ns)]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(netns_pids(ns) for ns in namespaces):
            time.sleep(0.1)


def _our_namespaces() -> list[str]:
    proc = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in proc.stdout.splitlines()
            if line.startswith(PREFIX)]


def _our_links(kind: str | None = None) -> list[str]:
    proc = _run(["ip", "-o", "link", "show", *(["type", kind] if kind else [])], check=False)
    names = []
    for line in proc.stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(PREFIX):
            names.append(name)
    return names


def teardown(plan: Plan | None = None) -> list[str]:
    """Remove everything of the testbed; safe to run any number of times. Returns what went."""
    removed: list[str] = []
    namespaces = sorted(set(_our_namespaces()) | {h.netns for h in (plan.hosts if plan else [])})
    _kill_namespace_processes([ns for ns in namespaces if (NETNS_DIR / ns).exists()])
    for ns in namespaces:
        if _run(["ip", "netns", "del", ns], check=False).returncode == 0:
            removed.append(f"netns {ns}")
    for _ in range(20):                   # veth peers of deleted namespaces vanish asynchronously
        bridges = set(_our_links("bridge"))
        veths = [name for name in _our_links() if name not in bridges]
        for name in veths:
            if _run(["ip", "link", "del", name], check=False).returncode == 0:
                removed.append(f"link {name}")
        if not veths:
            break
        time.sleep(0.1)
    for name in _our_links():
        if _run(["ip", "link", "del", name], check=False).returncode == 0:
            removed.append(f"bridge {name}")
    before = HOSTS_FILE.read_text() if HOSTS_FILE.exists() else ""
    if HOSTS_MARK in before:
        HOSTS_FILE.write_text("\n".join(_hosts_without_marks()) + "\n")
        removed.append("/etc/hosts entries")
    from ccbench.testbed.faults import remove_cgroups

    removed += remove_cgroups()
    if STATE_DIR.exists():
        shutil.rmtree(STATE_DIR, ignore_errors=True)
        removed.append(str(STATE_DIR))
    return removed
