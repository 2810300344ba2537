"""What a testbed is, as data: hosts, bridges, links and their rates (pure, no root needed).

A *plan* is built from the command line (`--hosts 4 --link 1G --topology two-tier:2:oversub=2`)
and is what `net.py` creates with iproute2 and what `status` prints. Names:

* host i is `h<i>` (its hostname, the name in /etc/hosts, the Slurm node name), living in the
  network namespace `ccb-h<i>`; its NICs are `eth0` (and `eth1` on the second plane);
* with `--rails R` (rail-optimized hosts, one NIC per GPU): `eth0` is the host's front-end
  NIC (the control plane, Slurm), and NIC r has a port `r<r>p<p>` per plane into bridge
  `ccb-r<r>p<p>` (rail r's ToR of plane p), addresses 10.213.(1 + r x planes + p).0/24; the
  NIC's own address is on a device `r<r>` (one end of a veth pair) (10.213.(16 + r).(i + 1)/32), reached from
  rail r of every other host by ECMP over its ports;
* every bridge and every root-side veth end starts with `ccb-`, so `down` can find what an
  interrupted `up` left behind even without the state file.

Addresses come from 10.213.<plane>.0/24 (plane 0 and, for dual-plane, plane 1); the machine's
own (root) namespace gets .254 on plane 0 so that sbatch/srun there reach the emulated hosts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TypedDict, cast

from ccbench.errors import UsageError

__all__ = ["MODEL_KIND", "Bridge", "Fault", "HostPlan", "Link", "Plan", "PlanJson", "PlanOptions",
           "Topology", "build_plan", "parse_topology"]

PREFIX = "ccb-"
SUBNET = "10.213"              # plane p uses 10.213.p.0/24
ROOT_HOST_ID = 254             # the root namespace's address on plane 0
HOST_SUBNET = 8                # with planes: host i's own address 10.213.8.(i+1)/32 on lo
MAX_HOSTS = 64
RAIL_SUBNET = 16               # with rails: NIC r's own address 10.213.(16+r).(i+1)/32
MAX_RAILS = 8
TOPOLOGY_FORMS = "switch, two-tier:LEAVES[:oversub=R], dual-plane"

# the testbed's kinds in the model's terms (ccbench.model.topology): switch and dual-plane are
# the same networks; two-tier is a fat-tree counted by its leaves instead of its ranks per leaf
MODEL_KIND = {"switch": "switch", "two-tier": "fat-tree", "dual-plane": "dual-plane"}


@dataclass(frozen=True, slots=True)
class Topology:
    kind: str                  # switch | two-tier | dual-plane
    leaves: int = 1
    oversub: float = 1.0

    def spec(self) -> str:
        if self.kind == "two-tier":
            return f"two-tier:{self.leaves}:oversub={self.oversub:g}"
        return self.kind

    def model_spec(self, num_hosts: int, ranks_per_host: int = 1) -> str | None:
        """The same network as `ccbench simulate --topology` names it, one rank per host:
        `two-tier:2:oversub=2` on 8 hosts is `fat-tree:8:leaf=4:oversub=2` (its leaves' hosts
        numbered leaf by leaf, as the model numbers them). None where the model has no
        such network: several ranks share a host's NIC (the model gives each rank its own),
        or the leaves differ in size other than as the model's last leaf does."""
        if ranks_per_host != 1:
            return None
        kind = MODEL_KIND[self.kind]
        if self.kind == "switch":
            return f"{kind}:{num_hosts}"
        if self.kind == "dual-plane":          # one ToR per plane: the plane's bridge
            return f"{kind}:{num_hosts}:gpus=1:tor={num_hosts}"
        if num_hosts % self.leaves:
            return None
        return f"{kind}:{num_hosts}:leaf={num_hosts // self.leaves}:oversub={self.oversub:g}"


def parse_topology(text: str) -> Topology:
    parts = text.strip().split(":")
    kind = parts[0]
    if kind in ("switch", "dual-plane") and len(parts) == 1:
        return Topology(kind)
    if kind == "two-tier" and len(parts) in (2, 3):
        try:
            leaves = int(parts[1])
        except ValueError:
            raise UsageError(f"bad --topology {text!r}: LEAVES must be an integer "
                             f"(valid: {TOPOLOGY_FORMS})") from None
        oversub = 1.0
        if len(parts) == 3:
            key, _, value = parts[2].partition("=")
            try:
                oversub = float(value)
            except ValueError:
                oversub = -1.0
            if key != "oversub" or oversub < 1.0:
                raise UsageError(f"bad --topology {text!r}: expected oversub=R with R >= 1 "
                                 f"(valid: {TOPOLOGY_FORMS})")
        if leaves < 2:
            raise UsageError(f"bad --topology {text!r}: two-tier needs at least 2 leaves")
        return Topology("two-tier", leaves, oversub)
    raise UsageError(f"unknown --topology {text!r} (valid: {TOPOLOGY_FORMS})")


@dataclass(frozen=True, slots=True)
class Bridge:
    name: str
    role: str                  # switch | leaf | spine | plane


@dataclass(frozen=True, slots=True)
class Link:
    """A veth pair shaped to `rate` in both directions (tbf on each end's egress)."""

    a: str                     # "h0:eth0" (inside a host) or a root-namespace veth name
    b: str                     # the root-namespace end: attached to `bridge`
    bridge: str
    rate: int                  # bits per second
    a_bridge: str | None = None   # for bridge-to-bridge links: the bridge end a attaches to


@dataclass(frozen=True, slots=True)
class HostPlan:
    name: str
    netns: str
    addresses: dict[str, str]  # NIC -> address/prefix, e.g. {"eth0": "10.213.0.1/24"}

    @property
    def address(self) -> str:
        """The host's own address: on `lo` with planes (reached over either plane), else
        eth0's."""
        return self.addresses.get("lo", self.addresses["eth0"]).split("/")[0]

    @property
    def nics(self) -> list[str]:
        """Its physical NICs (ports): not lo, not a rail NIC's own address (`r0`)."""
        return sorted(n for n in self.addresses
                      if n != "lo" and not (n[0] == "r" and n[1:].isdigit()))


class Fault(TypedDict, total=False):
    """The faults set on one link or host (`ccbench testbed fault`), as the state file keeps
    them."""

    rate: str                  # the link's shaped rate, as text
    configured_bps: int        # the rate it had before
    link: str                  # "down"
    cpu: str                   # the host's CPU quota, as text


class PlanOptions(TypedDict, total=False):
    planes: int                # 2: the dual-plane network
    rails: int                 # R >= 2: rail-optimized hosts
    slurm: bool                # the testbed runs a Slurm of its own
    slurm_conf: str
    faults: dict[str, Fault]   # link or host -> its faults


class BridgeJson(TypedDict):
    name: str
    role: str


class LinkJson(TypedDict):
    a: str
    b: str
    bridge: str
    rate: int
    a_bridge: str | None


class HostPlanJson(TypedDict):
    name: str
    netns: str
    addresses: dict[str, str]


class PlanJson(TypedDict):
    """A Plan as the testbed's state file holds it."""

    hosts: list[HostPlanJson]
    bridges: list[BridgeJson]
    links: list[LinkJson]
    link_rate: int
    topology: str
    ranks_per_host: int
    root_address: str
    options: PlanOptions


@dataclass(frozen=True, slots=True)
class Plan:
    hosts: list[HostPlan]
    bridges: list[Bridge]
    links: list[Link]
    link_rate: int
    topology: str
    ranks_per_host: int
    root_address: str
    options: PlanOptions = field(default_factory=PlanOptions)

    def host(self, name: str) -> HostPlan:
        for host in self.hosts:
            if host.name == name:
                return host
        raise UsageError(f"unknown testbed host {name!r} "
                         f"(valid: {', '.join(h.name for h in self.hosts)})")

    def to_json(self) -> PlanJson:
        return cast(PlanJson, asdict(self))     # the dataclasses' fields, as PlanJson lists

    def model_spec(self) -> str | None:
        """This testbed as the model's topology spec (`Topology.model_spec`); None with
        rails (the model has no rail-optimized network)."""
        if self.options.get("rails", 1) > 1:
            return None
        return parse_topology(self.topology).model_spec(len(self.hosts), self.ranks_per_host)

    @classmethod
    def from_json(cls, data: PlanJson) -> Plan:
        return cls(hosts=[HostPlan(**h) for h in data["hosts"]],
                   bridges=[Bridge(**b) for b in data["bridges"]],
                   links=[Link(**lk) for lk in data["links"]], link_rate=data["link_rate"],
                   topology=data["topology"], ranks_per_host=data["ranks_per_host"],
                   root_address=data["root_address"], options=data.get("options", {}))


def _address(plane: int, host_id: int) -> str:
    return f"{SUBNET}.{plane}.{host_id}/24"


def build_plan(num_hosts: int, link_rate: int, topology: Topology,
               ranks_per_host: int | None = None, planes: int = 1, rails: int = 1) -> Plan:
    """`planes=2`: the dual-ToR network (HPN): two NICs per host into two plane bridges, and
    the host's own address on lo, reached by an ECMP route over both planes (net.py).
    `rails=R` (R >= 2): rail-optimized hosts, R NICs each with `planes` ports (see above).
    ranks_per_host (Slurm's CPUs per node): by default 1, and R with rails (one rank per
    rail's NIC, what `diagnose --rails` runs; with fewer CPUs per node, `srun
    --ntasks-per-node R` waits for ever: "Requested partition configuration not available
    now")."""
    if ranks_per_host is None:
        ranks_per_host = rails if rails > 1 else 1
    if planes not in (1, 2):
        raise UsageError(f"--planes must be 1 or 2, got {planes}")
    if not 1 <= rails <= MAX_RAILS:
        raise UsageError(f"--rails must be 1..{MAX_RAILS}, got {rails}")
    if rails > 1:
        if topology.kind != "switch":
            raise UsageError(f"--rails builds its own rail networks; it does not combine "
                             f"with --topology {topology.spec()}")
        return _rail_plan(num_hosts, link_rate, ranks_per_host, planes, rails)
    if planes == 2:
        if topology.kind not in ("switch", "dual-plane"):
            raise UsageError(f"--planes 2 builds its own two planes; it does not combine "
                             f"with --topology {topology.spec()}")
        plan = _build_plan(num_hosts, link_rate, Topology("dual-plane"), ranks_per_host)
        for i, host in enumerate(plan.hosts):
            host.addresses["lo"] = f"{SUBNET}.{HOST_SUBNET}.{i + 1}/32"
        plan.options["planes"] = 2
        return plan
    return _build_plan(num_hosts, link_rate, topology, ranks_per_host)


def _build_plan(num_hosts: int, link_rate: int, topology: Topology, ranks_per_host: int
                ) -> Plan:
    if not 1 <= num_hosts <= MAX_HOSTS:
        raise UsageError(f"--hosts must be 1..{MAX_HOSTS}, got {num_hosts}")
    if ranks_per_host < 1:
        raise UsageError(f"--ranks-per-host must be >= 1, got {ranks_per_host}")
    planes = 2 if topology.kind == "dual-plane" else 1
    hosts = [HostPlan(f"h{i}", f"{PREFIX}h{i}",
                      {f"eth{p}": _address(p, i + 1) for p in range(planes)})
             for i in range(num_hosts)]
    bridges: list[Bridge] = []
    links: list[Link] = []
    if topology.kind == "two-tier":
        if topology.leaves > num_hosts:
            raise UsageError(f"two-tier with {topology.leaves} leaves needs at least as many "
                             f"hosts, got --hosts {num_hosts}")
        spine = Bridge(f"{PREFIX}spine", "spine")
        bridges.append(spine)
        per_leaf = [list(range(num_hosts))[leaf::topology.leaves]
                    for leaf in range(topology.leaves)]
        for leaf, members in enumerate(per_leaf):
            bridge = Bridge(f"{PREFIX}leaf{leaf}", "leaf")
            bridges.append(bridge)
            for i in members:
                links.append(Link(f"h{i}:eth0", f"{PREFIX}h{i}-0", bridge.name, link_rate))
            # the uplink carries what the leaf's hosts can send, divided by the oversubscription
            uplink = int(len(members) * link_rate / topology.oversub)
            links.append(Link(f"{PREFIX}l{leaf}-up", f"{PREFIX}l{leaf}-dn", spine.name, uplink,
                              a_bridge=bridge.name))
    else:
        for plane in range(planes):
            role = "plane" if planes > 1 else "switch"
            bridge = Bridge(f"{PREFIX}{'plane' + str(plane) if planes > 1 else 'sw'}", role)
            bridges.append(bridge)
            for i in range(num_hosts):
                links.append(Link(f"h{i}:eth{plane}", f"{PREFIX}h{i}-{plane}", bridge.name,
                                  link_rate))
    return Plan(hosts=hosts, bridges=bridges, links=links, link_rate=link_rate,
                topology=topology.spec(), ranks_per_host=ranks_per_host,
                root_address=_address(0, ROOT_HOST_ID))


def rail_port(rail: int, plane: int) -> str:
    """The interface of NIC `rail`'s port on `plane` (also its bridge's name after ccb-)."""
    return f"r{rail}p{plane}"


def _rail_plan(num_hosts: int, link_rate: int, ranks_per_host: int, planes: int, rails: int
               ) -> Plan:
    plan = _build_plan(num_hosts, link_rate, Topology("switch"), ranks_per_host)
    for rail in range(rails):
        for plane in range(planes):
            port = rail_port(rail, plane)
            bridge = Bridge(f"{PREFIX}{port}", "rail")
            plan.bridges.append(bridge)
            for i, host in enumerate(plan.hosts):
                host.addresses[port] = _address(1 + rail * planes + plane, i + 1)
                plan.links.append(Link(f"h{i}:{port}", f"{PREFIX}h{i}-{port}", bridge.name,
                                       link_rate))
    for i, host in enumerate(plan.hosts):
        for rail in range(rails):
            host.addresses[f"r{rail}"] = f"{SUBNET}.{RAIL_SUBNET + rail}.{i + 1}/32"
    plan.options.update({"rails": rails, "planes": planes})
    return plan


def rail_nics(plan: Plan) -> list[str]:
    """The rails' NIC names (`r0`, `r1`, ...), none without rails."""
    return [f"r{rail}" for rail in range(plan.options.get("rails", 1))] \
        if plan.options.get("rails", 1) > 1 else []


def root_bridge(plan: Plan) -> str:
    """The bridge the root namespace's address sits on (spine, switch or plane 0)."""
    for role in ("spine", "switch", "plane"):
        for bridge in plan.bridges:
            if bridge.role == role:
                return bridge.name
    raise AssertionError("a plan always has a bridge")
