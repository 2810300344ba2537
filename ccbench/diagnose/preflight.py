"""Before an MPI library starts: MPI_Init waits for every rank and, with one host's port
down, hangs (seen with Intel MPI over TCP on the dual-plane testbed: h6's eth1 down, every
rank in MPI_Init until the start-up guard's limit, no verdict). In ccbench the control store
of an MPI-launched run is set up through MPI itself, so the diagnosis's own reachability
check (ccbench.diagnose.measure) would come too late.

So, first, every rank meets the others at a small store of its own on the job's first node
(Slurm's node list names it; the MPI launchers place rank 0 there), every host probes every
other host's interface addresses, and when a port gives no answer the library is kept to the
interfaces every host answered on (FI_TCP_IFACE, FI_SOCKETS_IFACE, UCX_NET_DEVICES,
OMPI_MCA_btl_tcp_if_include, unless set already) and rank 0 says so. The diagnosis's own
check, once the library is up, names the port in the verdict. Without a Slurm node list
(an mpiexec with its own host list) nothing is done here.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from typing import Any

from ccbench.diagnose.counters import down_ports, interface_addresses, probe_failures

__all__ = ["IFACE_VARIABLES", "before_mpi"]

#: the variables that keep the MPI libraries' TCP transports to some interfaces (libfabric's
#: tcp and sockets providers take one interface, UCX and Open MPI a list)
IFACE_VARIABLES = (("FI_TCP_IFACE", False), ("FI_SOCKETS_IFACE", False),
                   ("UCX_NET_DEVICES", True), ("OMPI_MCA_btl_tcp_if_include", True))
_RANK_VARIABLES = (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                   ("SLURM_PROCID", "SLURM_NTASKS"))


def _rank_and_size() -> tuple[int, int] | None:
    for rank, size in _RANK_VARIABLES:
        if os.environ.get(rank, "").isdigit() and os.environ.get(size, "").isdigit():
            return int(os.environ[rank]), int(os.environ[size])
    return None


def _natural(name: str) -> list[Any]:
    import re

    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def before_mpi(backend: str, timeout: float) -> list[str]:
    """Run the check if this rank is about to start an MPI library across Slurm nodes;
    returns the lines rank 0 printed (tests)."""
    from ccbench.backends import backend_class
    from ccbench.run.launchers import expand_nodelist

    if not getattr(backend_class(backend), "needs_mpi_launcher", False):
        return []
    placed = _rank_and_size()
    nodes = expand_nodelist(os.environ.get("SLURM_STEP_NODELIST")
                            or os.environ.get("SLURM_JOB_NODELIST", ""))
    job = os.environ.get("SLURM_JOB_ID", "")
    if placed is None or placed[1] < 2 or len(set(nodes)) < 2 or not job.isdigit():
        return []
    rank, size = placed
    port = 20000 + (int(job) * 7 + 3001) % 30000
    secret = (os.environ.get("CCBENCH_CONTROL_SECRET")
              or f"unauthenticated/{job}/diagnose-before-mpi")
    down, interfaces, names = _meet(rank, size, nodes[0], port, secret, min(timeout, 60.0))
    if not down:
        return []
    good = sorted(interfaces - {name for _t, name, _p in down})
    kept = []
    for variable, many in IFACE_VARIABLES:
        if good and variable not in os.environ:
            os.environ[variable] = ",".join(good) if many else good[0]
            kept.append(f"{variable}={os.environ[variable]}")
    lines = [f"ccbench diagnose: before MPI_Init: host {names[t]}'s {name} gave no answer to "
             f"{len(p)} of {len(names) - 1} hosts; the library is kept to "
             f"{', '.join(good) or 'no interface'}" + (f" ({' '.join(kept)})" if kept else "")
             for t, name, p in down]
    if rank == 0:
        for line in lines:
            print(line, file=sys.stderr, flush=True)
    return lines


def _meet(rank: int, size: int, first: str, port: int, secret: str, timeout: float
          ) -> tuple[list[tuple[int, str, list[int]]], set[str], list[str]]:
    """Every rank: the hosts' names, the ports that are down, every interface name."""
    from ccbench.run.addresses import listen_address
    from ccbench.run.control import ControlClient, ControlServer

    server = ControlServer(listen_address(first), port, secret, size) if rank == 0 else None
    client = ControlClient(first, port, rank, connect_timeout=timeout, reply_timeout=timeout,
                           secret=secret)
    try:
        hostnames = client.gather("diag/pre/hosts", socket.gethostname(), size, timeout)
        names = sorted(set(hostnames), key=_natural)
        host_of = [names.index(h) for h in hostnames]
        me = rank == hostnames.index(hostnames[rank])
        everyone = client.gather("diag/pre/addrs", interface_addresses() if me else None, size,
                                 timeout)
        failed = probe_failures(host_of[rank], everyone, host_of) if me else None
        got = client.gather("diag/pre/reach", failed, size, timeout)
        client.barrier("diag/pre/done", size, timeout)
        if rank == 0:                  # every rank has its answer before the store goes
            for other in range(1, size):
                client.get(f"diag/pre/left/{other}", timeout)
        else:
            client.set(f"diag/pre/left/{rank}", 1)
    finally:
        with contextlib.suppress(Exception):
            client.close()
        if server is not None:
            with contextlib.suppress(Exception):
                server.close()
    reach = {host_of[r]: {t: n for t, n in rows} for r, rows in enumerate(got) if rows}
    interfaces = {name for addrs in everyone if addrs for name in addrs}
    return down_ports(reach, len(names)), interfaces, names
