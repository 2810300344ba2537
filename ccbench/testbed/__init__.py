"""`ccbench testbed`: N emulated hosts on one machine (network + UTS namespaces, veth links into
Linux bridges shaped with tbf), optionally a multi-node Slurm cluster on them.

    plan = build_plan(4, parse_rate("1G"), parse_topology("switch"))   # parse_rate: ccbench.units
    up(plan, slurm=True)        # idempotent; a failed or interrupted up removes what it made
    down()                      # always safe; also cleans what a killed up left behind
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NotRequired, TypedDict

from ccbench.errors import RunFailure
from ccbench.testbed.net import (
    NETNS_DIR,
    create,
    host_command,
    load_plan,
    require_root,
    save_plan,
    teardown,
)
from ccbench.testbed.topology import Fault, Plan, build_plan, parse_topology
from ccbench.units import format_rate

__all__ = ["MeasuredPath", "Plan", "TestbedStatus", "build_plan", "down", "host_command",
           "load_plan", "measure", "parse_topology", "status", "up"]


_LOCK = Path("/run/ccbench-testbed.lock")


@contextlib.contextmanager
def _exclusive() -> Iterator[None]:
    """One `up` or `down` at a time: a `down` still running must not remove a new `up`'s work."""
    with open(_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _same(a: Plan, b: Plan) -> bool:
    keys = ("link_rate", "topology", "ranks_per_host")
    return (all(getattr(a, k) == getattr(b, k) for k in keys) and len(a.hosts) == len(b.hosts)
            and a.options.get("slurm") == b.options.get("slurm")
            and a.options.get("planes") == b.options.get("planes")
            and a.options.get("rails", 1) == b.options.get("rails", 1)
            and not a.options.get("faults"))


def _healthy(plan: Plan) -> bool:
    if not all((NETNS_DIR / h.netns).exists() for h in plan.hosts):
        return False
    if plan.options.get("slurm"):
        from ccbench.testbed.slurm import node_states

        states = node_states()
        return len(states) == len(plan.hosts) and all(s == "idle" for s in states.values())
    return True


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def up(plan: Plan, slurm: bool = False) -> str:
    """Create the testbed; returns what happened ('created', 'already up', 'recreated')."""
    require_root()
    with _exclusive():
        return _up(plan, slurm)


def _up(plan: Plan, slurm: bool) -> str:
    plan.options["slurm"] = slurm
    current = load_plan()
    if current is not None and _same(current, plan) and _healthy(current):
        return "already up"
    outcome = "created"
    if current is not None or _leftovers():
        teardown(current)
        outcome = "recreated"
    previous = signal.signal(signal.SIGTERM, _interrupt)   # so SIGTERM also cleans up
    try:
        create(plan)
        if slurm:
            from ccbench.testbed.slurm import slurm_env, start_slurm

            try:
                start_slurm(plan)
            except BaseException:
                teardown(plan)
                raise
            plan.options["slurm_conf"] = slurm_env()["SLURM_CONF"]
            save_plan(plan)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return outcome


def _leftovers() -> bool:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return any(line.startswith("ccb-") for line in out.splitlines())


def down() -> list[str]:
    require_root()
    with _exclusive():
        try:
            plan = load_plan()
        except RunFailure:
            plan = None
        return teardown(plan)


class LinkStatus(TypedDict):
    nic: str
    bridge: str
    rate_bps: int
    rate: str


class HostStatus(TypedDict):
    name: str
    address: str
    addresses: dict[str, str]
    netns: str
    up: bool                           # its network namespace exists
    links: list[LinkStatus]


UplinkStatus = TypedDict("UplinkStatus", {"from": str, "to": str, "rate_bps": int, "rate": str})


class SlurmStatus(TypedDict):
    SLURM_CONF: str | None
    partition: str
    nodes: dict[str, str]              # node -> its state as sinfo says


class TestbedStatus(TypedDict):
    """`ccbench testbed status --format json`."""

    topology: str
    link_rate: str
    link_rate_bps: int
    ranks_per_host: int
    root_address: str
    hosts: list[HostStatus]
    bridges: list[str]
    uplinks: list[UplinkStatus]
    planes: int
    rails: int
    faults: dict[str, Fault]
    slurm: NotRequired[SlurmStatus]


class MeasuredPath(TypedDict):
    path: str
    flows: int
    configured_bps: float
    measured_bps: float


def status(plan: Plan) -> TestbedStatus:
    hosts: list[HostStatus] = []
    for host in plan.hosts:
        links: list[LinkStatus] = [{"nic": lk.a.split(":")[1], "bridge": lk.bridge, "rate_bps": lk.rate,
                  "rate": format_rate(lk.rate)}
                 for lk in plan.links if lk.a.split(":")[0] == host.name]
        hosts.append({"name": host.name, "address": host.address, "addresses": host.addresses,
                      "netns": host.netns, "up": (NETNS_DIR / host.netns).exists(),
                      "links": links})
    uplinks: list[UplinkStatus] = [{"from": lk.a_bridge, "to": lk.bridge, "rate_bps": lk.rate,
                "rate": format_rate(lk.rate)} for lk in plan.links if lk.a_bridge]
    out: TestbedStatus = {"topology": plan.topology, "link_rate": format_rate(plan.link_rate),
                          "link_rate_bps": plan.link_rate, "ranks_per_host": plan.ranks_per_host,
                          "root_address": plan.root_address.split("/")[0], "hosts": hosts,
                          "bridges": [b.name for b in plan.bridges], "uplinks": uplinks,
                          "planes": plan.options.get("planes", 1),
                          "rails": plan.options.get("rails", 1),
                          "faults": plan.options.get("faults", {})}
    if plan.options.get("slurm"):
        from ccbench.testbed.slurm import PARTITION, node_states

        out["slurm"] = {"SLURM_CONF": plan.options.get("slurm_conf"), "partition": PARTITION,
                        "nodes": node_states()}
    return out


def _iperf(plan: Plan, pairs: list[tuple[str, str, str]], seconds: float) -> list[float]:
    """Run iperf3 flows at once (server on dst, client on src to dst's `nic` address);
    returns the received bits per second of each."""
    servers, clients = [], []
    for index, (_, dst, _) in enumerate(pairs):
        host = plan.host(dst)
        servers.append(subprocess.Popen(
            host_command(host.netns, host.name, ["iperf3", "-s", "-1", "-p", str(5201 + index)]),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(0.5)
    try:
        for index, (src, dst, nic) in enumerate(pairs):
            host, target = plan.host(src), plan.host(dst).addresses[nic].split("/")[0]
            clients.append(subprocess.Popen(
                host_command(host.netns, host.name, ["iperf3", "-c", target, "-p",
                                                     str(5201 + index), "-t", f"{seconds:g}",
                                                     "-J"]),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        rates = []
        for client in clients:
            out, err = client.communicate(timeout=seconds + 30)
            try:
                rates.append(float(json.loads(out)["end"]["sum_received"]["bits_per_second"]))
            except (ValueError, KeyError):
                raise RunFailure(f"testbed measure: iperf3 failed: {(err or out).strip()[:200]}") \
                    from None
            if rates[-1] <= 0:
                raise RunFailure(f"testbed measure: no traffic arrived on {pairs[len(rates) - 1]}")
        return rates
    finally:
        for proc in servers + clients:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def measure(plan: Plan, seconds: float = 3.0) -> list[MeasuredPath]:
    """iperf3 (TCP) on the configured paths: measured vs configured rate."""
    if len(plan.hosts) < 2:
        raise RunFailure("testbed measure needs at least 2 hosts")
    rows: list[MeasuredPath] = []
    planes = plan.hosts[0].nics
    for nic in planes:
        (rate,) = _iperf(plan, [("h1", "h0", nic)], seconds)
        rows.append({"path": f"h1 -> h0 ({nic})", "flows": 1, "configured_bps": plan.link_rate,
                     "measured_bps": rate})
    uplinks = [lk for lk in plan.links if lk.a_bridge]
    if uplinks:
        # every host of leaf 0 sends to a different host of leaf 1 at once: the uplink limits
        leaf0 = [lk.a.split(":")[0] for lk in plan.links if lk.bridge == uplinks[0].a_bridge
                 and ":" in lk.a]
        leaf1 = [lk.a.split(":")[0] for lk in plan.links if lk.bridge == uplinks[1].a_bridge
                 and ":" in lk.a]
        pairs = [(s, d, "eth0") for s, d in zip(leaf0, leaf1, strict=False)]
        rates = _iperf(plan, pairs, seconds)
        expected = min(uplinks[0].rate, uplinks[1].rate, plan.link_rate * len(pairs))
        rows.append({"path": f"leaf0 -> leaf1 ({', '.join(f'{s}->{d}' for s, d, _ in pairs)})",
                     "flows": len(pairs), "configured_bps": expected, "measured_bps": sum(rates)})
    return rows
