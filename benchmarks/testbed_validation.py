"""The cost model against a network with known link rates: `ccbench testbed` hosts.

    python benchmarks/testbed_validation.py measure --hosts 2,3,4,6,8 --link 100M
    python benchmarks/testbed_validation.py twotier --hosts 4,8 --leaves 2 --oversub 2 --link 100M
    python benchmarks/testbed_validation.py limit --hosts 8 --rates 100M,200M,400M,1G
    python benchmarks/testbed_validation.py checks --hosts 2,3,4,6,8
    python benchmarks/testbed_validation.py analyze --train 2,4

measure: for each host count, `ccbench testbed up --hosts N --link RATE --slurm` (one
switch), one rank per emulated host, out of place, each series of SERIES:
- `gloo`: torch's gloo under `srun` (Slurm on the emulated hosts);
- `mpi-asserted`: Intel MPI over OFI's tcp provider with I_MPI_ADJUST_* fixing ring allreduce
  and allgather and Isend/Irecv + waitall all-to-all (mpiexec on h0, hydra's rsh bootstrap
  entering each host's namespace); `mpi`, Intel MPI's own choice, on request;
- `mpich-asserted`: MPICH over UCX's tcp transport with CVARs fixing ring, ring, pairwise
  exchange and scattered (every message at once) all-to-all.
Out of place because in place, Intel MPI's and MPICH's all-to-all exchange pairwise with both
directions at once: 0.33-0.45 of the link at 3-4 hosts, against 0.8-0.9 out of place.
The records go into results/testbed/data/ (gzipped), what each run printed into
results/testbed/logs/, an iperf3 check of the links (one flow, and every host sending to the
next at once) into data/*-testbed.json, then `ccbench testbed down`.
twotier: the same on `two-tier:LEAVES:oversub=R`, allreduce and all-to-all. Ranks are placed
leaf by leaf (ranks 0..N/L-1 on leaf 0, ...), as ccbench's fat-tree numbers them.
limit: every host sending to the next at once (iperf3) at several link rates: the rate from
which the 2 cores, not the links, limit the traffic.
checks: every host sending to every other at once (iperf3; the direct all-to-all's flows) on
one switch per host count: what a port carries when p-1 TCP flows share it.
analyze: calibrate on the `--train` world sizes of the single switch, predict the
others and the two-tier runs (`simulate --fidelity replay` on the matching fat tree),
write results/testbed/{errors.md,errors.csv,*.png}.

Needs root (network namespaces). Only the testbed this script brings up is used, and it
is always taken down; it refuses to start while another testbed is up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUT = ROOT / "results" / "testbed"
DATA = OUT / "data"
LOGS = OUT / "logs"
COLLECTIVES = "allreduce,allgather,reduce-scatter,alltoall"
SIZES = "64K-8M"
SLURM_CONF = "/run/ccbench-testbed/slurm/slurm.conf"
RUN_LIMIT_S = 1800
SERIES = "gloo,mpi-asserted,mpich-asserted"


def ccbench(*args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "ccbench", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)
    if check and proc.returncode != 0:
        raise SystemExit(f"ccbench {' '.join(args)} failed ({proc.returncode}): "
                         f"{(proc.stderr or proc.stdout).strip()[-500:]}")
    return proc


def testbed_free() -> None:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    if any(line.startswith("ccb-") for line in out.splitlines()):
        raise SystemExit("a testbed is already up (someone else's?): not touching it")


def rsh_wrapper() -> Path:
    """hydra's rsh bootstrap runs `EXEC HOST COMMAND`: enter HOST's namespaces instead (there
    is no ssh between namespaces; Slurm's bootstrap would work too but orders ranks by node
    name, and the two-tier runs need ranks leaf by leaf)."""
    path = Path("/tmp/ccbench-testbed-rsh")
    path.write_text("#!/bin/sh\nhost=\"$1\"; shift\n"
                    "exec nsenter --net=/run/netns/ccb-$host unshare --uts -- "
                    "sh -c 'hostname \"$0\"; exec sh -c \"$1\"' \"$host\" \"$*\"\n")
    path.chmod(0o755)
    return path


def ordered_hosts(plan: Any) -> list[Any]:
    """Hosts in rank order: on two-tier, a leaf's hosts get consecutive ranks (the testbed
    deals hosts to leaves round robin; ccbench's fat tree fills a leaf with ranks r // L),
    so the measured placement is the simulated one."""
    if not plan.topology.startswith("two-tier"):
        return list(plan.hosts)
    leaves = int(plan.topology.split(":")[1])
    return [h for _, h in sorted(enumerate(plan.hosts), key=lambda ih: (ih[0] % leaves, ih[0]))]


def _bench_args(collectives: str, sizes: str, iters: int, out: Path, backend: str) -> list[str]:
    return [sys.executable, "-m", "ccbench", collectives, "--backend", backend, "--sizes", sizes,
            "--outofplace", "--iters", str(iters), "--warmup", "1", "--timeout", "300",
            "--output", str(out), "--quiet"]


def run_gloo(plan: Any, out: Path, collectives: str, sizes: str, iters: int) -> str:
    hosts = ordered_hosts(plan)
    hostfile = Path("/tmp/ccbench-testbed-hostfile")
    hostfile.write_text("".join(f"{h.name}\n" for h in hosts))
    env = dict(os.environ, SLURM_CONF=SLURM_CONF, SLURM_HOSTFILE=str(hostfile),
               PYTHONPATH=str(ROOT), GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
    argv = ["srun", "-N", str(len(hosts)), "-n", str(len(hosts)), "--distribution=arbitrary",
            *_bench_args(collectives, sizes, iters, out, "gloo")]
    return _run("gloo", argv, env)


def _run(what: str, argv: list[str], env: dict[str, str], host: Any = None) -> str:
    """argv (on emulated `host`, else here); what it printed; a failure ends the script."""
    if host is not None:
        from ccbench.testbed import host_command

        argv = host_command(host.netns, host.name, argv)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=RUN_LIMIT_S,
                          cwd=ROOT)
    if proc.returncode:
        raise SystemExit(f"{what} run failed ({proc.returncode}): "
                         f"{(proc.stdout + proc.stderr)[-800:]}")
    return proc.stdout + proc.stderr


# Intel MPI with its algorithm fixed (I_MPI_ADJUST_*, presets of Intel MPI 2021) instead of
# chosen per size and world size: the series "mpi-asserted". The records keep these variables
# (environment.variables) and `calibrate` prices each with its formula
# (ccbench.model.library_algorithms). All-to-all is Isend/Irecv + waitall, every message at
# once like gloo's: with pairwise exchange (3) Intel MPI reached 0.9 of the link at 2 hosts
# and 0.18 at 8 (load 13-24), a loss the model has no term for.
ASSERTED = {"I_MPI_ADJUST_ALLREDUCE": "8",        # ring
            "I_MPI_ADJUST_ALLGATHER": "3",        # ring
            # MPI_Reduce_scatter's variable, not MPI_Reduce_scatter_block's (which ccbench
            # calls): no effect, so Intel MPI's reduce-scatter stays its own choice here; the
            # block variable fixes nothing below 1 MiB (ids 0-4 measured alike, 3 hosts)
            "I_MPI_ADJUST_REDUCE_SCATTER": "2",
            "I_MPI_ADJUST_ALLTOALL": "2"}         # Isend/Irecv + waitall (direct)


def run_mpi(plan: Any, out: Path, collectives: str, sizes: str, iters: int,
            asserted: bool = False) -> str:
    venv = Path(sys.executable).parent
    hosts = ordered_hosts(plan)
    env = dict(os.environ, PYTHONPATH=str(ROOT), I_MPI_HYDRA_BOOTSTRAP="rsh",
               I_MPI_HYDRA_BOOTSTRAP_EXEC=str(rsh_wrapper()), OMP_NUM_THREADS="1")
    argv = [str(venv / "mpiexec"), "-n", str(len(hosts)), "-ppn", "1",
            "-hosts", ",".join(h.name for h in hosts),
            "-genv", "PYTHONPATH", str(ROOT), "-genv", "FI_PROVIDER", "tcp",
            "-genv", "I_MPI_FABRICS", "ofi", "-genv", "FI_TCP_IFACE", "eth0",
            # ranks share 2 cores: wait in the kernel instead of polling
            "-genv", "I_MPI_WAIT_MODE", "1",
            *[arg for name, value in (ASSERTED.items() if asserted else ())
              for arg in ("-genv", name, value)],
            *_bench_args(collectives, sizes, iters, out, "mpi")]
    return _run("mpi", argv, env, hosts[0])


# MPICH (its own venv, MPICH_PYTHON) with its algorithms fixed by CVARs: the series
# "mpich-asserted". MPICH's algorithms are in its open source (src/mpi/coll/), and it honours
# the CVARs at every size, where Intel MPI's reduce_scatter_block ran one slow path below
# 1 MiB under every I_MPI_ADJUST_REDUCE_SCATTER_BLOCK id (0-4, 3 hosts). DEVICE_COLLECTIVES=none
# keeps ch4 from choosing its own composition; all-to-all `scattered` posts min(p,
# ALLTOALL_THROTTLE=32) Isend/Irecv at once: every message at once here, the direct schedule.
MPICH_ASSERTED = {"MPIR_CVAR_DEVICE_COLLECTIVES": "none",
                  "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "ring",
                  "MPIR_CVAR_ALLGATHER_INTRA_ALGORITHM": "ring",
                  "MPIR_CVAR_REDUCE_SCATTER_BLOCK_INTRA_ALGORITHM": "pairwise",
                  "MPIR_CVAR_ALLTOALL_INTRA_ALGORITHM": "scattered"}
# .ci/run makes this venv beside the repository's own
MPICH_PYTHON = os.environ.get("MPICH_PYTHON", str(ROOT / ".venv-mpich" / "bin" / "python"))


def run_mpich(plan: Any, out: Path, collectives: str, sizes: str, iters: int) -> str:
    """MPICH from the pip wheel over UCX's tcp transport on each host's eth0 (its shared-memory
    transports would cross between the emulated hosts: docs/testbed.md)."""
    python = Path(MPICH_PYTHON)
    if not python.exists():
        raise SystemExit(f"no MPICH venv python at {python} (set MPICH_PYTHON)")
    hosts = ordered_hosts(plan)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    settings = {"PYTHONPATH": str(ROOT), "MPIR_CVAR_NOLOCAL": "1", "UCX_TLS": "tcp,self",
                "UCX_NET_DEVICES": "eth0", **MPICH_ASSERTED}
    argv = [str(python.parent / "mpiexec"), "-launcher", "rsh",
            "-launcher-exec", str(rsh_wrapper()), "-n", str(len(hosts)), "-ppn", "1",
            "-hosts", ",".join(h.name for h in hosts),
            *[arg for name, value in settings.items() for arg in ("-genv", name, value)],
            *_bench_args(collectives, sizes, iters, out, "mpi")]
    argv[argv.index(sys.executable)] = str(python)
    return _run("mpich", argv, env, hosts[0])


def link_checks(plan: Any) -> dict[str, Any]:
    """iperf3: one flow on the configured path(s), then every host sending to the next at
    once (the ring's pattern): can the 2 cores keep every link busy together?"""
    from ccbench.testbed import _iperf, measure

    names = [h.name for h in ordered_hosts(plan)]
    n = len(names)
    ring = [(names[i], names[(i + 1) % n], "eth0") for i in range(n)]
    rates = _iperf(plan, ring, 3.0)
    return {"iperf3": measure(plan, 2.0),
            "iperf3_all_links": {"flows": len(ring), "pairs": [f"{a}->{b}" for a, b, _ in ring],
                                 "configured_bps": plan.link_rate, "measured_bps": rates}}


def all_pairs_check(plan: Any, seconds: float = 3.0) -> dict[str, Any]:
    """iperf3 with every host sending to every other at once (the direct all-to-all's
    pattern: p-1 TCP flows out of and into each port): what each host's port receives in all,
    against the link rate. The model shares a link among its flows without loss."""
    from ccbench.testbed import _iperf

    names = [h.name for h in ordered_hosts(plan)]
    flows = [(a, b, "eth0") for a in names for b in names if a != b]
    rates = _iperf(plan, flows, seconds)
    received = {b: sum(r for (_, dst, _), r in zip(flows, rates, strict=True) if dst == b)
                for b in names}
    return {"flows": len(flows), "configured_bps": plan.link_rate, "per_flow_bps": rates,
            "received_bps": received}


def checks(hosts: list[int], link: str) -> None:
    """The all-pairs iperf3 check on one switch for each host count, added to
    data/switch-nN-testbed.json (`iperf3_all_pairs`)."""
    from ccbench import testbed

    testbed_free()
    for n in hosts:
        ccbench("testbed", "up", "--hosts", str(n), "--link", link, timeout=300)
        try:
            plan = testbed.load_plan()
            load = os.getloadavg()
            found = all_pairs_check(plan)
            found["load_before"] = [round(x, 2) for x in load]
            path = DATA / f"switch-n{n}-testbed.json"
            info = json.loads(path.read_text()) if path.exists() else {}
            info["iperf3_all_pairs"] = found
            path.write_text(json.dumps(info, indent=1) + "\n")
            got = [r / plan.link_rate for r in found["received_bps"].values()]
            print(f"{n} hosts, all pairs at once: each port receives {min(got):.3f}-"
                  f"{max(got):.3f} of the link (load {load[0]:.1f})", flush=True)
        finally:
            ccbench("testbed", "down", check=False, timeout=300)


def measure(hosts: list[int], link: str, backends: list[str], topology: str, tag: str,
            collectives: str, sizes: str, iters: int) -> None:
    from ccbench import testbed

    DATA.mkdir(parents=True, exist_ok=True)
    LOGS.mkdir(parents=True, exist_ok=True)
    testbed_free()
    for n in hosts:
        ccbench("testbed", "up", "--hosts", str(n), "--link", link, "--topology", topology,
                "--slurm", timeout=300)
        try:
            plan = testbed.load_plan()
            info: dict[str, Any] = json.loads(ccbench("testbed", "status", "--format",
                                                      "json").stdout)
            info["rank_order"] = [h.name for h in ordered_hosts(plan)]
            info["runs"] = []
            for backend in backends:
                out = DATA / f"{tag}-{backend}-n{n}.jsonl"
                for old in (out, out.with_suffix(".jsonl.gz")):
                    old.unlink(missing_ok=True)
                load, started = os.getloadavg(), time.time()
                if backend == "gloo":
                    text = run_gloo(plan, out, collectives, sizes, iters)
                elif backend == "mpich-asserted":
                    text = run_mpich(plan, out, collectives, sizes, iters)
                else:
                    text = run_mpi(plan, out, collectives, sizes, iters,
                                   asserted=backend == "mpi-asserted")
                (LOGS / f"{tag}-{backend}-n{n}.txt").write_text(text)
                subprocess.run(["gzip", "-f", str(out)], check=True)   # ccbench reads .jsonl.gz
                run = {"backend": backend, "seconds": round(time.time() - started, 1),
                       "load_before": [round(x, 2) for x in load],
                       "load_after": [round(x, 2) for x in os.getloadavg()]}
                info["runs"].append(run)
                print(f"{tag} {backend} n={n}: {run}", flush=True)
            info.update(link_checks(plan))
            path = DATA / f"{tag}-n{n}-testbed.json"
            if path.exists():        # another invocation measured other backends here
                earlier = json.loads(path.read_text()).get("runs", [])
                info["runs"] = [r for r in earlier if r["backend"] not in backends] + info["runs"]
                info["earlier_iperf3"] = json.loads(path.read_text()).get("iperf3_all_links")
            path.write_text(json.dumps(info, indent=1) + "\n")
        finally:
            ccbench("testbed", "down", check=False, timeout=300)


def limit(hosts: int, rates: list[str]) -> None:
    """Where do the 2 cores stop keeping every link busy? `hosts` hosts on one switch, every
    host sending to the next at once (iperf3, TCP) at each link rate."""
    from ccbench import testbed

    DATA.mkdir(parents=True, exist_ok=True)
    testbed_free()
    rows = []
    for rate in rates:
        ccbench("testbed", "up", "--hosts", str(hosts), "--link", rate, timeout=300)
        try:
            plan = testbed.load_plan()
            load = os.getloadavg()
            checks = link_checks(plan)["iperf3_all_links"]
            rows.append({"link": rate, "load_before": [round(x, 2) for x in load], **checks})
            got = checks["measured_bps"]
            print(f"{hosts} hosts at {rate}: per flow {min(got) / plan.link_rate:.3f}-"
                  f"{max(got) / plan.link_rate:.3f} of the link, total {sum(got) / 1e9:.2f} "
                  f"Gbit/s, load {load[0]:.1f}", flush=True)
        finally:
            ccbench("testbed", "down", check=False, timeout=300)
    (DATA / f"limit-n{hosts}.json").write_text(json.dumps(rows, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--hosts", default="2,3,4,6,8")
    m.add_argument("--link", default="100M")
    m.add_argument("--backends", default=SERIES)
    m.add_argument("--sizes", default=SIZES)
    m.add_argument("--iters", type=int, default=10)
    m.add_argument("--tag", default="switch",
                   help="file name prefix (another than `switch` keeps the analysis' data)")
    t = sub.add_parser("twotier")
    t.add_argument("--hosts", default="4,8")
    t.add_argument("--leaves", type=int, default=2)
    t.add_argument("--oversub", type=float, default=2)
    t.add_argument("--link", default="100M")
    t.add_argument("--backends", default=SERIES)
    t.add_argument("--sizes", default="1M-8M")
    t.add_argument("--iters", type=int, default=10)
    lim = sub.add_parser("limit")
    lim.add_argument("--hosts", type=int, default=8)
    lim.add_argument("--rates", default="100M,200M,400M,1G")
    c = sub.add_parser("checks")
    c.add_argument("--hosts", default="2,3,4,6,8")
    c.add_argument("--link", default="100M")
    a = sub.add_parser("analyze")
    a.add_argument("--train", default="2,4")
    a.add_argument("--link", default="100M")
    args = ap.parse_args()
    if args.what == "measure":
        measure([int(x) for x in args.hosts.split(",")], args.link, args.backends.split(","),
                "switch", args.tag, COLLECTIVES, args.sizes, args.iters)
    elif args.what == "twotier":
        measure([int(x) for x in args.hosts.split(",")], args.link, args.backends.split(","),
                f"two-tier:{args.leaves}:oversub={args.oversub:g}",
                f"twotier{args.leaves}x{args.oversub:g}", "allreduce,alltoall", args.sizes,
                args.iters)
    elif args.what == "checks":
        checks([int(x) for x in args.hosts.split(",")], args.link)
    elif args.what == "limit":
        limit(args.hosts, args.rates.split(","))
    else:
        from benchmarks.testbed_analysis import analyze

        analyze([int(x) for x in args.train.split(",")], args.link)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
