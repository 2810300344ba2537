"""Each host's own interface counters, read before and after the plan: link state changes
(carrier changes: a port that flapped), errors and drops; for RDMA NICs the port counters
under /sys/class/infiniband/ (link downed, link error recovery, symbol and receive errors).

The Ethernet interfaces are read over rtnetlink (RTM_GETLINK), which answers for the network
namespace of the reading process (sysfs shows the namespace of whoever mounted it), with
/sys/class/net as the fallback. A port that changed state during the run is a finding, named
with the count; one that counted errors too. Drops are reported with them, never alone (a
congested queue drops by design).

Before the library starts, every host also probes every other host's interface addresses
(a TCP connect to a closed port: the refusal proves the path both ways), so that a port that
is down is named even when the library then cannot start.
"""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict, cast

from ccbench.diagnose.analyse import Finding

__all__ = ["Counter", "PortCounters", "CounterDelta", "MidRun", "counter_deltas",
           "counter_findings", "down_ports", "interface_addresses",
           "mid_run_down", "mid_run_findings",
           "probe", "probe_all", "probe_failures", "reach_findings", "read_counters"]

_RTM_GETLINK, _RTM_NEWLINK, _NLMSG_DONE, _NLMSG_ERROR = 18, 16, 3, 2
_IFLA_IFNAME, _IFLA_OPERSTATE, _IFLA_STATS64, _IFLA_CARRIER_CHANGES = 3, 16, 23, 35
_OPERSTATES = {0: "unknown", 1: "notpresent", 2: "down", 3: "lowerlayerdown", 4: "testing",
               5: "dormant", 6: "up"}
Counter = Literal["carrier_changes", "rx_errors", "tx_errors", "rx_dropped", "tx_dropped",
                  "link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors"]
_STATS: tuple[Counter, ...] = ("rx_errors", "tx_errors", "rx_dropped",
                               "tx_dropped")                # rtnl_link_stats64 4..7
_IB_COUNTERS: tuple[Counter, ...] = ("link_downed", "link_error_recovery", "symbol_error",
                                     "port_rcv_errors")
NUMERIC: tuple[Counter, ...] = ("carrier_changes", *_STATS, *_IB_COUNTERS)


class _Counts(TypedDict):
    """The counters a port has (Ethernet: carrier changes and the rtnl_link_stats64 errors
    and drops; RDMA: the port counters); each only where the port has it."""

    carrier_changes: NotRequired[int]
    rx_errors: NotRequired[int]
    tx_errors: NotRequired[int]
    rx_dropped: NotRequired[int]
    tx_dropped: NotRequired[int]
    link_downed: NotRequired[int]
    link_error_recovery: NotRequired[int]
    symbol_error: NotRequired[int]
    port_rcv_errors: NotRequired[int]


class PortCounters(_Counts):
    """One interface or RDMA port: its state and the counters it has."""

    state: str


class CounterDelta(_Counts):
    """How one port's counters grew during the run (the ones that did), and its state
    before and after."""

    state_before: str | None
    state: str | None


class MidRun(TypedDict):
    """The run stopped mid-plan with ports down: the step, why, and [[host, interface]];
    where a host saw its port go down itself, the pair steps measured after that moment
    ([kind, round, plane]: the library's traffic as a whole was disturbed then, not only
    the port's), which are no evidence against other components."""

    step: str
    why: str
    down: list[list[Any]]
    set_aside: NotRequired[list[list[Any]]]


def _attributes(data: bytes) -> dict[int, bytes]:
    out = {}
    offset = 0
    while offset + 4 <= len(data):
        length, kind = struct.unpack_from("HH", data, offset)
        if length < 4:
            break
        out[kind & 0x3FFF] = data[offset + 4:offset + length]
        offset += (length + 3) & ~3
    return out


def _link(attrs: dict[int, bytes]) -> tuple[str, PortCounters] | None:
    if _IFLA_IFNAME not in attrs:
        return None
    name = attrs[_IFLA_IFNAME].split(b"\0", 1)[0].decode()
    row: PortCounters = {"state": _OPERSTATES.get(attrs.get(_IFLA_OPERSTATE, b"\0")[0],
                                                  "unknown")}
    if _IFLA_CARRIER_CHANGES in attrs:
        row["carrier_changes"] = struct.unpack("I", attrs[_IFLA_CARRIER_CHANGES][:4])[0]
    if len(attrs.get(_IFLA_STATS64, b"")) >= 64:
        values = struct.unpack_from("8Q", attrs[_IFLA_STATS64])
        for key, value in zip(_STATS, values[4:8], strict=True):
            row[key] = value
    return name, row


def _netlink_links() -> dict[str, PortCounters]:
    """name -> counters of every interface of this network namespace (rtnetlink dump)."""
    out: dict[str, PortCounters] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as sock:   # NETLINK_ROUTE
        sock.settimeout(5.0)
        body = struct.pack("BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0)
        sock.send(struct.pack("IHHII", 16 + len(body), _RTM_GETLINK, 0x301, 1, 0) + body)
        while True:
            data = sock.recv(1 << 16)
            offset = 0
            while offset + 16 <= len(data):
                length, kind = struct.unpack_from("IH", data, offset)
                if kind in (_NLMSG_DONE, _NLMSG_ERROR) or length < 16:
                    return out
                if kind == _RTM_NEWLINK:
                    got = _link(_attributes(data[offset + 32:offset + length]))
                    if got is not None:
                        out[got[0]] = got[1]
                offset += (length + 3) & ~3


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0], 0)
    except (OSError, ValueError, IndexError):
        return None


def _sysfs_links(root: Path) -> dict[str, PortCounters]:
    out: dict[str, PortCounters] = {}
    base = root / "class" / "net"
    for entry in sorted(base.iterdir()) if base.is_dir() else []:
        try:
            state = (entry / "operstate").read_text().strip()
        except OSError:
            continue
        row: PortCounters = {"state": state}
        for key in ("carrier_changes",):
            value = _read_int(entry / key)
            if value is not None:
                row[key] = value
        for key in _STATS:
            value = _read_int(entry / "statistics" / key)
            if value is not None:
                row[key] = value
        out[entry.name] = row
    return out


def _infiniband(root: Path) -> dict[str, PortCounters]:
    """`mlx5_0/1` -> the port's state and error counters."""
    out: dict[str, PortCounters] = {}
    base = root / "class" / "infiniband"
    for device in sorted(base.iterdir()) if base.is_dir() else []:
        ports = device / "ports"
        for port in sorted(ports.iterdir()) if ports.is_dir() else []:
            try:
                state = (port / "state").read_text().strip()     # e.g. "4: ACTIVE"
            except OSError:
                continue
            row: PortCounters = {"state": state.split(":")[-1].strip().lower()}
            for key in _IB_COUNTERS:
                value = _read_int(port / "counters" / key)
                if value is not None:
                    row[key] = value
            out[f"{device.name}/{port.name}"] = row
    return out


def read_counters(sys_root: str | None = None) -> dict[str, PortCounters]:
    """This host's interfaces (loopback left out) and RDMA ports -> state and counters.
    `sys_root` (tests): read everything from that sysfs copy instead."""
    root = Path(sys_root or os.environ.get("CCBENCH_DIAGNOSE_SYSFS", "/sys"))
    links: dict[str, PortCounters] = {}
    if sys_root is None and "CCBENCH_DIAGNOSE_SYSFS" not in os.environ:
        try:
            links = _netlink_links()
        except OSError:
            links = {}
    if not links:
        links = _sysfs_links(root)
    links.pop("lo", None)
    return {**links, **_infiniband(root)}


def counter_deltas(before: dict[str, PortCounters], after: dict[str, PortCounters]
                   ) -> dict[str, CounterDelta]:
    """Per interface present in both readings: how each counter grew, and the state before
    and after; only interfaces where something changed."""
    out: dict[str, CounterDelta] = {}
    for name, now in after.items():
        then = before.get(name)
        if then is None:
            continue
        row: dict[str, Any] = {k: now[k] - then[k] for k in NUMERIC
                               if k in now and k in then and now[k] != then[k]}
        if row or now.get("state") != then.get("state"):
            row.update(state_before=then.get("state"), state=now.get("state"))
            out[name] = cast(CounterDelta, row)    # the grown counters, then the two states
    return out


def _component(host: str, name: str, planes: list[str]) -> str:
    from ccbench.diagnose.analyse import port_component

    if name in planes or (name == "NIC" and " rail " in host):
        return port_component(host, name)
    if "/" in name:
        device, port = name.split("/", 1)
        return f"host {host}'s {device} port {port}"
    return f"host {host}'s {name} port"


def _one(host: str, name: str, row: CounterDelta, planes: list[str]) -> Finding | None:
    changes = row.get("carrier_changes", 0) + row.get("link_downed", 0)
    errors = {k: row[k] for k in ("rx_errors", "tx_errors", "symbol_error",
                                  "port_rcv_errors", "link_error_recovery") if row.get(k)}
    drops = {k: row[k] for k in ("rx_dropped", "tx_dropped") if row.get(k)}
    state = f"{row.get('state_before')} before, {row.get('state')} after"
    extra = "".join(f"; {v} {k.replace('_', ' ')}" for k, v in {**errors, **drops}.items())
    component = _component(host, name, planes)
    if changes > 0 or row.get("state") != row.get("state_before"):
        what = "link downed" if row.get("link_downed") else "carrier changes"
        down = row.get("state") not in ("up", "active", "unknown")
        return Finding(component, "port down" if down and changes <= 1 else "intermittent",
                       f"{changes} {what} during the run", "0 (a stable link)",
                       f"{name}'s own counters: {state}{extra}", "high", [host])
    if errors:
        return Finding(component, "port errors",
                       ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in errors.items()),
                       "0", f"{name}'s own counters during the run: {state}{extra}",
                       "medium", [host])
    return None


def counter_findings(deltas: dict[int, dict[str, CounterDelta]], names: list[str],
                     planes: list[str]) -> list[Finding]:
    """Per host (index) and interface, what changed during the run -> findings."""
    out = []
    for host, rows in sorted(deltas.items()):
        for name, row in sorted(rows.items()):
            found = _one(names[host], name, row, planes)
            if found is not None:
                out.append(found)
    return out


def interface_addresses() -> dict[str, str]:
    """This host's interfaces with an IPv4 address (loopback and its own /32 on lo left out)
    -> the address: what the other hosts probe before the library starts."""
    import fcntl

    out = {}
    for _index, name in socket.if_nameindex():
        if name == "lo":
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                packed = fcntl.ioctl(sock.fileno(), 0x8915,
                                     struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
        out[name] = socket.inet_ntoa(packed[20:24])
    return out


def probe(address: str, timeout: float = 2.0) -> bool:
    """A TCP connect to a closed port: a refusal (RST) proves the path works both ways."""
    with socket.socket() as sock:
        sock.settimeout(timeout)
        try:
            sock.connect((address, 9))
        except ConnectionRefusedError:
            return True
        except OSError:
            return False
        return True


def probe_all(targets: list[tuple[int, str, str]], timeout: float = 2.0
              ) -> list[tuple[int, str, bool]]:
    """(host, interface, address) -> (host, interface, answered), probed at once."""
    from concurrent.futures import ThreadPoolExecutor

    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(targets))) as pool:
        answers = list(pool.map(lambda t: probe(t[2], timeout), targets))
    return [(h, name, ok) for (h, name, _address), ok in zip(targets, answers, strict=True)]


def probe_failures(mine: int, everyone: list[dict[str, str] | None], host_of: list[int]
                   ) -> list[list[Any]]:
    """This host (`mine`) probes every other host's addresses (`everyone`: per rank, its
    host's interfaces -> address, None for ranks that are not their host's first) ->
    [[target host, [interfaces that gave no answer, and `*` when none answered]], ...]."""
    targets = [(host_of[r], name, address) for r, addrs in enumerate(everyone)
               if addrs and host_of[r] != mine for name, address in addrs.items()]
    answers = probe_all(targets)
    failed: list[list[Any]] = []
    for target in sorted({t for t, _n, _a in targets}):
        names = [n for t, n, ok in answers if t == target and not ok]
        if names and len(names) == sum(1 for t, _n, _a in targets if t == target):
            names.append("*")                  # no answer at all: not a port's
        if names:
            failed.append([target, names])
    return failed


def down_ports(failed: dict[int, dict[int, list[str]]], hosts: int
               ) -> list[tuple[int, str, list[int]]]:
    """(target host, interface, the hosts that got no answer on it): at least half of the
    other hosts (and 2) got none while they did get one on another of its interfaces (a
    probe that a firewall drops everywhere is not a finding)."""
    need = max(2, hosts // 2) if hosts > 2 else 1
    out = []
    for target in range(hosts):
        counts: dict[str, list[int]] = {}
        for prober, per_target in failed.items():
            names_failed = per_target.get(target, [])
            if "*" in names_failed:
                continue
            for name in names_failed:
                counts.setdefault(name, []).append(prober)
        out += [(target, name, sorted(probers)) for name, probers in sorted(counts.items())
                if len(probers) >= need]
    return out


def reach_findings(failed: dict[int, dict[int, list[str]]], names: list[str],
                   planes: list[str]) -> list[Finding]:
    """failed: prober host -> target host -> the target's interfaces it got no answer from
    (and `*`, the target answered on none) -> a `port down` finding per `down_ports`."""
    return [Finding(_component(names[target], name, planes), "port down", "no answer",
                    "answers", f"before the library started: {len(probers)} of "
                    f"{len(names) - 1} hosts got no answer on {names[target]}'s "
                    f"{'plane ' + name if name.isdigit() else name} address ("
                    + ", ".join(names[p] for p in probers)
                    + "), an answer on another", "high", [names[target]])
            for target, name, probers in down_ports(failed, len(names))]


def mid_run_down(me: int, failed: list[list[Any]], labels: dict[int, list[str]],
                 groups: dict[int, int], local: set[int] | None = None
                 ) -> tuple[list[tuple[int, str]], list[int]]:
    """One host's probes when the run stopped (`failed`: probe_failures) -> the ports that
    went down ([(host, interface)]: no answer there while the host answered on another) and
    the hosts that answered on none. An interface that no other host of a group (a rail)
    answers on, 2 or more hosts, is this host's own port of that group (`local`: the units
    on this machine, with --rails its other NICs, which answer here whatever)."""
    local = (local or set()) | {me}
    by_target = {int(t): list(names) for t, names in failed}
    silent = sorted(t for t, names in by_target.items() if "*" in names)
    down: list[tuple[int, str]] = []
    for group in sorted(set(groups.values())):
        targets = [t for t in labels if t not in local and groups.get(t) == group
                   and t not in silent]
        for name in sorted({n for t in targets for n in labels[t]}):
            dark = [t for t in targets if name in by_target.get(t, [])]
            if len(targets) >= 2 and len(dark) == len(targets):
                mine = [h for h in local if groups.get(h) == group]
                down.append((min(mine) if mine else me, name))
            else:
                down += [(t, name) for t in dark]
    return sorted(set(down)), silent


def mid_run_findings(midrun: MidRun, names: list[str], planes: list[str]
                     ) -> list[Finding]:
    """The ports found down when the run stopped mid-plan: `port down` each (the ranks that
    waited on them are not stopped hosts)."""
    later = len(midrun.get("set_aside", []))
    aside = (f"; the {later} pair step{'s' if later > 1 else ''} measured after it went "
             f"down set aside" if later else "")
    return [Finding(_component(names[host], name, planes), "port down",
                    "no answer mid-run", "answers",
                    f"went down during the plan: {midrun.get('step', '?')} {midrun.get('why', '')}"
                    f"; probed again then, no answer on {names[host]}'s "
                    f"{'plane ' + name if name.isdigit() else name} address, an answer on "
                    f"another" + aside, "high", [names[host]])
            for host, name in midrun.get("down", []) if 0 <= host < len(names)]
