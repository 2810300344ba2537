"""A multi-node Slurm cluster on the testbed: slurmctld on h0, one slurmd per emulated host.

Node name = the host's hostname, node address = its address. It lives beside the single-node
cluster of .ci/slurm-up.sh without touching it: its own configuration directory (clients use
it through SLURM_CONF), its own state, spool, pid and log files, and its daemons listen on the
usual ports 6817/6818 inside the hosts' network namespaces, where the root namespace's
daemons do not exist. munge is shared (one munged, one key, reached through /run/munge).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from ccbench.errors import RunFailure
from ccbench.testbed.net import STATE_DIR, host_command
from ccbench.testbed.topology import Plan

__all__ = ["KEEPALIVE", "PARTITION", "render_conf", "slurm_env", "start_slurm"]

PARTITION = "testbed"
CLUSTER = "ccbtestbed"
_IDLE_TIMEOUT_S = 90.0
KEEPALIVE = "keepalivetime=5,keepaliveinterval=5,keepaliveprobes=4"


def conf_dir() -> Path:
    return STATE_DIR / "slurm"


def slurm_env() -> dict[str, str]:
    return {"SLURM_CONF": str(conf_dir() / "slurm.conf")}


def render_conf(plan: Plan, directory: Path) -> str:
    head = plan.hosts[0]
    cpus = max(plan.ranks_per_host, 1)
    nodes = "\n".join(f"NodeName={h.name} NodeAddr={h.address} CPUs={cpus} RealMemory=1000 "
                      f"State=UNKNOWN" for h in plan.hosts)
    names = ",".join(h.name for h in plan.hosts)
    return f"""# written by ccbench testbed: {len(plan.hosts)} emulated hosts
ClusterName={CLUSTER}
SlurmctldHost={head.name}({head.address})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldPidFile={directory}/slurmctld.pid
SlurmdPidFile={directory}/slurmd-%n.pid
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation={directory}/ctld
SlurmdSpoolDir={directory}/spool-%n
SlurmctldLogFile={directory}/slurmctld.log
SlurmdLogFile={directory}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MaxArraySize=10001
KillWait=5
InactiveLimit=0
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
Waittime=0
# srun <-> slurmstepd connections: probe after 5 s idle, give up after 4 unanswered probes 5 s
# apart. Without it, srun waits for ever on a host whose link went down (nothing is sent on
# the idle connection, so nothing fails). At least 20 s, so that rank 0 (which finds the
# silent host in ccbench.run.control.PEER_SILENT_S) names the rank before srun kills the step.
CommunicationParameters={KEEPALIVE}
{nodes}
PartitionName={PARTITION} Nodes={names} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


def _cgroup_conf() -> str:
    # as .ci/slurm-up.sh: "disabled" exists only from Slurm 23.02 on
    version = subprocess.run(["slurmd", "-V"], capture_output=True, text=True).stdout.split()
    release = tuple(int(x) for x in (version[1] if len(version) > 1 else "0").split(".")[:2])
    plugin = "disabled" if release >= (23, 2) else "autodetect"
    return f"# written by ccbench testbed\nCgroupPlugin={plugin}\n"


def ensure_munge() -> None:
    """munged running and a credential round trip working (started as .ci/slurm-up.sh does)."""
    def works() -> bool:
        proc = subprocess.run("munge -n </dev/null | unmunge", shell=True, capture_output=True)
        return proc.returncode == 0

    if works():
        return
    key = Path("/etc/munge/munge.key")
    for directory, mode in (("/etc/munge", 0o700), ("/var/lib/munge", 0o700),
                            ("/run/munge", 0o711), ("/var/log/munge", 0o700)):
        Path(directory).mkdir(parents=True, exist_ok=True)
        os.chmod(directory, mode)
        subprocess.run(["chown", "munge:munge", directory], check=False)
    if not key.exists() or key.stat().st_size == 0:
        key.write_bytes(os.urandom(1024))
    subprocess.run(["chown", "munge:munge", str(key)], check=False)
    key.chmod(0o400)
    subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged", "--force"], check=False)
    deadline = time.monotonic() + 5
    while not works():
        if time.monotonic() > deadline:
            raise RunFailure("testbed --slurm: munged does not answer (munge -n | unmunge fails)")
        time.sleep(0.1)


def start_slurm(plan: Plan) -> None:
    for tool in ("slurmctld", "slurmd", "sinfo"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode:
            raise RunFailure(f"testbed --slurm needs {tool} (apt-get install slurm-wlm munge)")
    ensure_munge()
    directory = conf_dir()
    (directory / "ctld").mkdir(parents=True, exist_ok=True)
    conf = directory / "slurm.conf"
    conf.write_text(render_conf(plan, directory))
    (directory / "cgroup.conf").write_text(_cgroup_conf())
    head = plan.hosts[0]
    _daemon(host_command(head.netns, head.name, ["slurmctld", "-c", "-f", str(conf)]), "slurmctld")
    for host in plan.hosts:
        (directory / f"spool-{host.name}").mkdir(exist_ok=True)
        _daemon(host_command(host.netns, host.name, ["slurmd", "-f", str(conf), "-N", host.name]),
                f"slurmd on {host.name}")
    wait_idle(len(plan.hosts))


def _daemon(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **slurm_env()})
    if proc.returncode != 0:
        raise RunFailure(f"testbed --slurm: {what} did not start: "
                         f"{(proc.stderr or proc.stdout).strip()}")


def node_states() -> dict[str, str]:
    proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True,
                          timeout=30, env={**os.environ, **slurm_env()})
    states = {}
    for line in proc.stdout.splitlines():
        name, _, state = line.partition(" ")
        states[name] = state.strip()
    return states


def wait_idle(num_nodes: int) -> None:
    deadline = time.monotonic() + _IDLE_TIMEOUT_S
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = node_states()
        if len(states) == num_nodes and all(s == "idle" for s in states.values()):
            return
        time.sleep(1)
    log = conf_dir() / "slurmctld.log"
    tail = log.read_text().splitlines()[-5:] if log.exists() else []
    raise RunFailure(f"testbed --slurm: nodes not idle after {_IDLE_TIMEOUT_S:g}s: {states or 'no answer'}"
                     + (" | " + " | ".join(tail) if tail else ""))
