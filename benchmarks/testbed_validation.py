"""The cost model against a network with known link rates: `ccbench testbed` hosts.

    python benchmarks/testbed_validation.py measure --hosts 2,3,4,6,8 --link 100M
    python benchmarks/testbed_validation.py twotier --hosts 8 --leaves 2 --oversub 2 --link 100M
    python benchmarks/testbed_validation.py analyze --train 2,4

measure: for each host count, `ccbench testbed up --hosts N --link RATE` (one switch),
one rank per emulated host, gloo (torchrun-style environment) and Intel MPI over TCP
(mpiexec in h0, hydra's rsh bootstrap entering the other hosts' namespaces), the
records into results/testbed/data/, then `ccbench testbed down`.
twotier: the same on `two-tier:LEAVES:oversub=R`, allreduce and all-to-all.
analyze: calibrate on the `--train` world sizes of the single switch, predict the
others and the two-tier runs (`simulate --fidelity replay` on the matching fat tree),
write results/testbed/{errors.md,errors.csv,*.png}.

Needs root (network namespaces). Only the testbed this script brings up is used, and it
is always taken down; it refuses to start while another testbed is up.

Status: no results yet (results/testbed/ does not exist); the testbed was held by other
work whenever this was to run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUT = ROOT / "results" / "testbed"
DATA = OUT / "data"
COLLECTIVES = "allreduce,allgather,reduce-scatter,alltoall"
SIZES = "64K-4M"


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


def wrapper_script() -> Path:
    """hydra's rsh bootstrap runs `<exec> HOST COMMAND`: enter HOST's namespaces instead."""
    path = Path("/tmp/ccbench-testbed-rsh")
    path.write_text("#!/bin/sh\nhost=\"$1\"; shift\n"
                    "exec nsenter --net=/run/netns/ccb-$host unshare --uts -- "
                    "sh -c 'hostname \"$0\"; exec sh -c \"$1\"' \"$host\" \"$*\"\n")
    path.chmod(0o755)
    return path


def ordered_hosts(plan) -> list:
    """Hosts in rank order: on two-tier, a leaf's hosts get consecutive ranks (the testbed
    deals hosts to leaves round robin; ccbench's fat tree fills a leaf with ranks r // L),
    so the measured placement is the simulated one."""
    if not plan.topology.startswith("two-tier"):
        return list(plan.hosts)
    leaves = int(plan.topology.split(":")[1])
    return [h for _, h in sorted(enumerate(plan.hosts), key=lambda ih: (ih[0] % leaves, ih[0]))]


def run_gloo(plan, out: Path, collectives: str, sizes: str, iters: int) -> None:
    from ccbench.testbed import host_command

    hosts = ordered_hosts(plan)
    port = 29500 + int(time.time()) % 1000
    procs = []
    for rank, host in enumerate(hosts):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(len(hosts)),
                   MASTER_ADDR=hosts[0].address, MASTER_PORT=str(port), LOCAL_RANK="0",
                   LOCAL_WORLD_SIZE="1", GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1",
                   PYTHONPATH=str(ROOT))
        argv = [sys.executable, "-m", "ccbench", collectives, "--backend", "gloo",
                "--sizes", sizes, "--iters", str(iters), "--warmup", "1", "--timeout", "120",
                "--output", str(out), "--quiet"]
        procs.append(subprocess.Popen(host_command(host.netns, host.name, argv), env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, cwd=ROOT))
    outputs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"gloo run failed: {outputs[0][-800:]}")


def run_mpi(plan, out: Path, collectives: str, sizes: str, iters: int) -> None:
    from ccbench.testbed import host_command

    venv = Path(sys.executable).parent
    hosts = ",".join(h.name for h in ordered_hosts(plan))
    env = dict(os.environ, PYTHONPATH=str(ROOT), I_MPI_FABRICS="ofi", FI_PROVIDER="tcp",
               I_MPI_HYDRA_BOOTSTRAP="rsh", I_MPI_HYDRA_BOOTSTRAP_EXEC=str(wrapper_script()),
               OMP_NUM_THREADS="1")
    argv = [str(venv / "mpiexec"), "-n", str(len(plan.hosts)), "-ppn", "1", "-hosts", hosts,
            "-genv", "PYTHONPATH", str(ROOT), "-genv", "FI_PROVIDER", "tcp",
            "-genv", "I_MPI_FABRICS", "ofi", "-genv", "FI_TCP_IFACE", "eth0",
            # several ranks share 2 cores: wait in the kernel instead of polling
            "-genv", "I_MPI_WAIT_MODE", "1",
            sys.executable, "-m", "ccbench", collectives, "--backend", "mpi", "--sizes", sizes,
            "--iters", str(iters), "--warmup", "1", "--timeout", "120", "--output", str(out),
            "--quiet"]
    h0 = ordered_hosts(plan)[0]
    proc = subprocess.run(host_command(h0.netns, h0.name, argv), env=env, capture_output=True,
                          text=True, timeout=1800, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(f"mpi run failed ({proc.returncode}): "
                         f"{(proc.stdout + proc.stderr)[-800:]}")


def measure(hosts: list[int], link: str, backends: list[str], topology: str, tag: str,
            collectives: str, sizes: str, iters: int) -> None:
    from ccbench import testbed

    DATA.mkdir(parents=True, exist_ok=True)
    testbed_free()
    for n in hosts:
        ccbench("testbed", "up", "--hosts", str(n), "--link", link, "--topology", topology)
        try:
            plan = testbed.load_plan()
            load = os.getloadavg()
            for backend in backends:
                out = DATA / f"{tag}-{backend}-n{n}.jsonl"
                if out.exists():
                    out.unlink()
                started = time.time()
                (run_gloo if backend == "gloo" else run_mpi)(plan, out, collectives, sizes, iters)
                print(f"{tag} {backend} n={n}: {time.time() - started:.0f} s, load before "
                      f"{load[0]:.1f}, after {os.getloadavg()[0]:.1f}", flush=True)
            status = json.loads(ccbench("testbed", "status", "--format", "json").stdout)
            # can the cores keep every link busy at once? iperf3 on the testbed's paths
            status["iperf3"] = json.loads(ccbench("testbed", "measure", "--seconds", "2",
                                                  "--format", "json").stdout)
            # every host sending to the next at once (the ring's pattern): does the machine
            # keep all links busy together?
            from ccbench.testbed import _iperf

            names = [h.name for h in plan.hosts]
            ring = [(names[i], names[(i + 1) % n], "eth0") for i in range(n)] if n > 2 else \
                [(names[0], names[1], "eth0"), (names[1], names[0], "eth0")]
            rates = _iperf(plan, ring, 3.0)
            status["iperf3_all_links"] = {"flows": len(ring), "configured_bps": plan.link_rate,
                                          "measured_bps": rates}
            status["load_before"] = load
            (DATA / f"{tag}-n{n}-testbed.json").write_text(json.dumps(status, indent=1) + "\n")
        finally:
            ccbench("testbed", "down", check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--hosts", default="2,3,4,6,8")
    m.add_argument("--link", default="100M")
    m.add_argument("--backends", default="gloo,mpi")
    m.add_argument("--sizes", default=SIZES)
    m.add_argument("--iters", type=int, default=5)
    t = sub.add_parser("twotier")
    t.add_argument("--hosts", default="8")
    t.add_argument("--leaves", type=int, default=2)
    t.add_argument("--oversub", type=float, default=2)
    t.add_argument("--link", default="100M")
    t.add_argument("--backends", default="gloo,mpi")
    t.add_argument("--sizes", default="1M-4M")
    t.add_argument("--iters", type=int, default=5)
    a = sub.add_parser("analyze")
    a.add_argument("--train", default="2,4")
    a.add_argument("--link", default="100M")
    args = ap.parse_args()
    if args.what == "measure":
        measure([int(x) for x in args.hosts.split(",")], args.link, args.backends.split(","),
                "switch", "switch", COLLECTIVES, args.sizes, args.iters)
    elif args.what == "twotier":
        measure([int(x) for x in args.hosts.split(",")], args.link, args.backends.split(","),
                f"two-tier:{args.leaves}:oversub={args.oversub:g}",
                f"twotier{args.leaves}x{args.oversub:g}", "allreduce,alltoall", args.sizes,
                args.iters)
    else:
        from benchmarks.testbed_analysis import analyze

        analyze([int(x) for x in args.train.split(",")], args.link)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
