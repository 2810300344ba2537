"""`ccbench diagnose` against faults that come and go, one-way faults and a port down under
MPI, on the 8-host dual-plane testbed under its Slurm, the faults injected by
scripts/diagnose-faults.sh (tc and ip in the hosts' namespaces, unknown to diagnose).

    python benchmarks/diagnose_intermittent.py --cells ecmp=5,flap=3,mpi-down=3,healthy=10
    python benchmarks/diagnose_intermittent.py --cells mpi-down-mid=5 --stamp DATE-mpi-midrun

(`mpi-down-mid`: h6's eth1 set down at a random moment 4-14 s into the run, under mpiexec;
`mpi-slow-mid`: h3's eth1 sending at 12 Mbit/s from 5-9 s into the run.)

Needs `ccbench testbed up --hosts 8 --planes 2 --link 50M --slurm` (left as it is). Per run:
the fault, the launcher, exit status, wall time, the plan's estimates, the load average
before and after, every finding, and whether the fault was named (and nothing else). Appends
one JSON line per run to results/diagnose/DATE-intermittent.jsonl and writes the table
DATE-intermittent.md from all the lines of that file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "diagnose"
FAULTS = ROOT / "scripts" / "diagnose-faults.sh"
SLURM_CONF = "/run/ccbench-testbed/slurm/slurm.conf"
LINK = "50M"
GLOO = ["--link-rate", LINK, "--planes", "eth0,eth1"]
MPI = ["--backend", "mpi", "--link-rate", LINK]
RUN_LIMIT_S = 300


def _faults(*args: str) -> None:
    subprocess.run([str(FAULTS), *args], check=True, capture_output=True)


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def _command(launcher: str, args: list[str]) -> list[str]:
    python = sys.executable
    diagnose = [python, "-m", "ccbench", "diagnose", *args, "--format", "json"]
    if launcher == "srun":
        return ["srun", "-N8", "--ntasks-per-node", "1", *diagnose]
    mpiexec = str(Path(python).parent / "mpiexec")
    return ["salloc", "-N8", python, "-m", "ccbench", "testbed", "exec", "h0", "--", mpiexec,
            "-bootstrap", "slurm", "-n", "8", "-ppn", "1", *diagnose]


# cell -> (launcher, args, set the fault, take it back, is a finding the fault's?)
def _ecmp(f: dict[str, Any]) -> bool:
    return f["pairs"] == [["h1", "h4"]] and "eth1" in f["component"] \
        and f["kind"] in ("slow path", "intermittent")


def _flap(f: dict[str, Any], port: str = "eth0") -> bool:
    return f["hosts"] == ["h3"] and port in f["component"] and f["kind"] == "intermittent" \
        and "carrier changes" in f["measured"]


def _flap_eth1(f: dict[str, Any]) -> bool:
    return _flap(f, "eth1")


def _mpi_down(f: dict[str, Any]) -> bool:
    return f["hosts"] == ["h6"] and "eth1" in f["component"] and f["kind"] == "port down"


def _slow_port(f: dict[str, Any]) -> bool:
    """h3's eth1 slow: its host, its port, or the paths of its pairs hashed onto it (without
    --planes, MPI's connections to h3 cross either plane)."""
    return f["hosts"] == ["h3"] or bool(f["pairs"]) and all("h3" in p for p in f["pairs"])


def _oneway(f: dict[str, Any]) -> bool:
    return f["hosts"] == ["h5"] and f["kind"] == "slow link" \
        and f["evidence"].startswith("one way (h5 -> others)")


CELLS: dict[str, tuple[str, list[str], list[list[str]], list[list[str]], Any]] = {
    "healthy": ("srun", GLOO, [], [], None),
    "healthy-mpi": ("mpiexec", MPI, [], [], None),
    "ecmp": ("srun", GLOO, [["ecmp", "h1", "h4", "16mbit"]],
             [["clear", "h1", "50mbit"], ["clear", "h4", "50mbit"]], _ecmp),
    # h3's eth0 is also the testbed's Slurm path to h3 (the machine's namespace reaches the
    # hosts over plane 0 only): srun may wait for ever for h3's task exit when its message is
    # lost in a down window; flap-eth1 keeps Slurm's path up
    "flap": ("srun", GLOO, [], [["up", "h3", "eth0"]], _flap),
    "flap-eth1": ("srun", GLOO, [], [["up", "h3", "eth1"]], _flap_eth1),
    "mpi-down": ("mpiexec", MPI, [["down", "h6", "eth1"]], [["up", "h6", "eth1"]], _mpi_down),
    # the same port set down during the plan (DELAYED: a random moment after the start)
    "mpi-down-mid": ("mpiexec", MPI, [["down", "h6", "eth1"]], [["up", "h6", "eth1"]],
                     _mpi_down),
    "mpi-slow-mid": ("mpiexec", MPI, [["slowport", "h3", "eth1", "12mbit"]],
                     [["clear", "h3", "50mbit"]], _slow_port),
    "oneway": ("srun", GLOO, [["oneway", "h5", "15mbit"]], [["clear", "h5", "50mbit"]],
               _oneway),
}


#: cells whose faults are set after a random delay (s) from the start, within these bounds:
#: during the world step, the pair rounds or the compute probe of the 8-host plan (16-25 s)
DELAYED = {"mpi-down-mid": (4.0, 14.0), "mpi-slow-mid": (5.0, 9.0)}


def run(cell: str) -> dict[str, Any]:
    launcher, args, setup, cleanup, mine = CELLS[cell]
    env = {**os.environ, "SLURM_CONF": SLURM_CONF, "PYTHONPATH": str(ROOT),
           "CCBENCH_CONTROL_SECRET": secrets.token_hex(32)}
    delay = random.uniform(*DELAYED[cell]) if cell in DELAYED else None
    timer = threading.Timer(delay, lambda: [_faults(*f) for f in setup]) if delay else None
    for fault in setup if timer is None else []:
        _faults(*fault)
    flapper = (subprocess.Popen([str(FAULTS), "flap", "h3", cell[5:] or "eth0", "3", "3"],
                                start_new_session=True) if cell.startswith("flap") else None)
    load = _load()
    start = time.monotonic()
    if timer is not None:
        timer.start()
    proc = subprocess.Popen(_command(launcher, args), env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=RUN_LIMIT_S)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:       # the whole run goes: salloc, mpiexec, the ranks
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = None
    seconds = time.monotonic() - start
    if timer is not None:
        timer.cancel()
        timer.join()
    if flapper is not None:
        os.killpg(flapper.pid, signal.SIGTERM)
        flapper.wait()
    for fault in cleanup:
        _faults(*fault)
    try:
        findings = json.loads(out)["findings"]
    except (ValueError, KeyError):
        findings = None
    plan = re.search(r"estimated (\d+) s", err)
    after = re.search(r"after the world step: .*estimated (\d+) s", err)
    named = [f for f in findings or [] if mine is not None and mine(f)]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                            capture_output=True).stdout.strip()
    result = {"cell": cell, "launcher": launcher, "commit": commit, "rc": rc,
              "seconds": round(seconds, 1),
              "fault_at_s": round(delay, 1) if delay else None,
              "estimated_s": int(plan.group(1)) if plan else None,
              "estimated_after_world_s": int(after.group(1)) if after else None,
              "load_before": load, "load_after": _load(),
              "named": bool(named) if mine is not None else None,
              "false": [f"{f['kind']}: {f['component']}" for f in findings or []
                        if f not in named] if findings is not None else None,
              "findings": findings,
              "stderr_lines": [line for line in err.splitlines()
                               if line.startswith(("ccbench", "srun: error"))][-6:],
              "stderr_tail": err.splitlines()[-25:]}
    print(json.dumps({k: v for k, v in result.items() if k != "findings"}), flush=True)
    return result


def table(lines: list[dict[str, Any]], stamp: str) -> str:
    rows = [f"# ccbench diagnose: intermittent, one-way and MPI faults, {stamp}", "",
            "8 hosts, dual plane, 50 Mbit/s, the testbed's Slurm; faults by "
            "scripts/diagnose-faults.sh; machine: 2 cores shared with other work.", "",
            "| cell | launcher | commit | named | false findings | exit | wall (s) | "
            "fault at (s) | plan est. (s) | est. after world (s) | load before/after |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in lines:
        named = {True: "yes", False: "NO", None: "-"}[r["named"]]
        false = "; ".join(r["false"]) if r["false"] else ("none" if r["false"] == []
                                                          else "no verdict")
        rows.append(f"| {r['cell']} | {r['launcher']} | {r.get('commit', '-')} | {named} | "
                    f"{false} | {r['rc']} | "
                    f"{r['seconds']} | {r.get('fault_at_s') or '-'} | {r['estimated_s']} | "
                    f"{r['estimated_after_world_s']} | "
                    f"{r['load_before']:.1f}/{r['load_after']:.1f} |")
    summary = {}
    for r in lines:
        cell = summary.setdefault(r["cell"], [0, 0, 0])
        cell[0] += 1
        cell[1] += bool(r["named"]) if r["named"] is not None else not r["false"]
        cell[2] += bool(r["false"])
    rows += ["", "| cell | runs | named (healthy: no finding) | runs with a false finding |",
             "|---|---|---|---|"]
    rows += [f"| {c} | {n} | {ok} | {bad} |" for c, (n, ok, bad) in summary.items()]
    return "\n".join(rows) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default="ecmp=5,flap=3,mpi-down=3,healthy=10")
    parser.add_argument("--stamp", default=datetime.date.today().isoformat())
    options = parser.parse_args()
    jsonl = OUT / f"{options.stamp}-intermittent.jsonl"
    OUT.mkdir(parents=True, exist_ok=True)
    plan = [(c.split("=")[0], int(c.split("=")[1])) for c in options.cells.split(",") if c]
    unknown = [c for c, _ in plan if c not in CELLS]
    if unknown:
        parser.error(f"unknown cells {unknown} (valid: {', '.join(CELLS)})")
    for cell, count in plan:
        for _ in range(count):
            result = run(cell)
            with jsonl.open("a") as handle:
                handle.write(json.dumps(result) + "\n")
            lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
            (OUT / f"{options.stamp}-intermittent.md").write_text(table(lines, options.stamp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
