"""`ccbench testbed up|exec|status|measure|down`: a cluster of emulated hosts on one machine.

    ccbench testbed up --hosts 4 --link 1G --topology two-tier:2:oversub=2 --slurm
    ccbench testbed exec h1 -- hostname
    ccbench testbed status --format json
    ccbench testbed measure            # iperf3: measured vs configured link rates
    ccbench testbed fault h3 rate 30M  # also h3:eth1 down|up, leaf1 rate R, h3 cpu 20, clear
    ccbench testbed down
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from ccbench.errors import UsageError

if TYPE_CHECKING:
    from ccbench.testbed import TestbedStatus
    from ccbench.testbed.topology import Plan

ACTIONS = ("up", "exec", "status", "measure", "fault", "down")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "testbed", help="emulated hosts on this machine (network namespaces, shaped links)",
        description="Emulated hosts on one machine: each a network and UTS namespace with its "
                    "own hostname, veth links into Linux bridges shaped with tbf. Needs root.")
    parser.add_argument("action", choices=ACTIONS, help="what to do with the emulated hosts")
    parser.add_argument("words", nargs="*",
                        help="exec: HOST -- COMMAND ...; fault: TARGET ACTION [VALUE]")
    parser.add_argument("--hosts", type=int, default=2, help="up: number of hosts (default 2)")
    parser.add_argument("--ranks-per-host", type=int, default=None,
                        help="up: ranks each host runs (Slurm CPUs per node; default 1, with "
                             "--rails R: R)")
    parser.add_argument("--link", default="1G",
                        help="up: link rate in bits/s, e.g. 100M, 500M, 1G (default 1G)")
    parser.add_argument("--topology", default="switch",
                        help="up: switch | two-tier:LEAVES[:oversub=R] | dual-plane (default "
                             "switch)")
    parser.add_argument("--planes", type=int, default=1,
                        help="up: 2 builds the dual-ToR network: two NICs per host into two "
                             "plane bridges, the host's address on lo reached by ECMP over both")
    parser.add_argument("--rails", type=int, default=1,
                        help="up: rail-optimized hosts: R NICs per host (one per GPU), NIC r "
                             "with a port per plane (r<r>p<p>) into rail r's bridge of that "
                             "plane, beside the front-end NIC eth0 (default 1: no rails)")
    parser.add_argument("--slurm", action="store_true",
                        help="up: also start slurmctld on h0 and slurmd on every host")
    parser.add_argument("--format", choices=("table", "json"), default="table",
                        help="status and measure: a table or JSON (default table)")
    parser.add_argument("--seconds", type=float, default=3.0, help="measure: seconds per test (default 3)")


def plan_of(args: argparse.Namespace) -> Plan:
    """What `up` builds from its arguments (--ranks-per-host: 1, or R with --rails R)."""
    from ccbench import testbed
    from ccbench.units import parse_rate

    return testbed.build_plan(args.hosts, parse_rate(args.link),
                              testbed.parse_topology(args.topology), args.ranks_per_host,
                              planes=args.planes, rails=args.rails)


def main(args: argparse.Namespace) -> int:
    from ccbench import testbed
    from ccbench.units import format_rate

    if args.action not in ("exec", "fault") and args.words:
        raise UsageError(f"unexpected arguments for testbed {args.action}: {' '.join(args.words)}")
    if args.action == "up":
        plan = plan_of(args)
        outcome = testbed.up(plan, slurm=args.slurm)
        print(f"testbed {outcome}: {len(plan.hosts)} hosts, {plan.topology}"
              + (f", {args.rails} rails x {args.planes} plane(s) (NIC r<r>: ports "
                 f"r<r>p0{'/r<r>p1' if args.planes == 2 else ''}; front end eth0)"
                 if args.rails > 1 else
                 f"{' (dual-ToR: ECMP over 2 planes)' if args.planes == 2 else ''}") + ", "
              f"links {format_rate(plan.link_rate)}"
              + (f", {plan.ranks_per_host} ranks per host" if plan.ranks_per_host > 1 else "")
              + (f"; Slurm: export SLURM_CONF={plan.options['slurm_conf']}"
                 if args.slurm and "slurm_conf" in plan.options else ""))
        return 0
    if args.action == "down":
        removed = testbed.down()
        print(f"testbed down: removed {len(removed)} items" if removed else "testbed down: nothing to remove")
        return 0
    current = testbed.load_plan()
    if current is None:
        raise UsageError("no testbed is up (start one: ccbench testbed up --hosts 2)")
    if args.action == "exec":
        return _exec(current, args.words)
    if args.action == "fault":
        from ccbench.testbed.faults import apply_fault
        from ccbench.testbed.net import require_root

        require_root()
        print(f"testbed fault: {apply_fault(current, args.words)}")
        return 0
    if args.action == "status":
        info = testbed.status(current)
        if args.format == "json":
            print(json.dumps(info, indent=1))
        else:
            _print_status(info)
        return 0
    rows = testbed.measure(current, args.seconds)
    if args.format == "json":
        print(json.dumps(rows, indent=1))
    else:
        print(f"{'path':<40} {'flows':>5} {'configured':>14} {'measured':>14} {'ratio':>6}")
        for row in rows:
            print(f"{row['path']:<40} {row['flows']:>5} "
                  f"{format_rate(row['configured_bps']):>14} "
                  f"{format_rate(round(row['measured_bps'], -5)):>14} "
                  f"{row['measured_bps'] / row['configured_bps']:>6.2f}")
    return 0


def _exec(plan: Plan, words: list[str]) -> int:
    from ccbench.testbed import host_command

    if not words:
        raise UsageError("usage: ccbench testbed exec HOST -- COMMAND ...")
    host_name, command = words[0], words[1:]
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError("usage: ccbench testbed exec HOST -- COMMAND ...")
    host = plan.host(host_name)
    env = dict(os.environ)
    if plan.options.get("slurm_conf"):
        env.setdefault("SLURM_CONF", plan.options["slurm_conf"])
    argv = host_command(host.netns, host.name, command)
    from ccbench.testbed.faults import cgroup_of

    group = cgroup_of(plan, host_name)
    if group is not None:               # a CPU fault: what runs there is limited too
        (group / "cgroup.procs").write_text(str(os.getpid()))
    sys.stdout.flush()
    os.execvpe(argv[0], argv, env)


def _print_status(info: TestbedStatus) -> None:
    print(f"testbed: {len(info['hosts'])} hosts, topology {info['topology']}, links "
          f"{info['link_rate']}, {info['ranks_per_host']} rank(s) per host; this namespace "
          f"{info['root_address']}")
    for host in info["hosts"]:
        links = ", ".join(f"{lk['nic']}->{lk['bridge']} {lk['rate']}" for lk in host["links"])
        print(f"  {host['name']:<4} {host['address']:<14} {'up' if host['up'] else 'MISSING':<8}"
              f" {links}")
    for uplink in info["uplinks"]:
        print(f"  uplink {uplink['from']} -> {uplink['to']} {uplink['rate']}")
    for target, fault in sorted(info.get("faults", {}).items()):
        shown = ", ".join(f"{k} {v}" for k, v in fault.items() if k != "configured_bps")
        print(f"  FAULT {target}: {shown}")
    if "slurm" in info:
        slurm = info["slurm"]
        nodes = ", ".join(f"{n} {s}" for n, s in sorted(slurm["nodes"].items())) or "no answer"
        print(f"  slurm: SLURM_CONF={slurm['SLURM_CONF']} partition {slurm['partition']}: {nodes}")
