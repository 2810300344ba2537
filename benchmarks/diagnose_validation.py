"""`ccbench diagnose` against faults injected into `ccbench testbed` hosts.

    python benchmarks/diagnose_validation.py --hosts 4,8 --victims 3 --healthy 4 --link 50M
    python benchmarks/diagnose_validation.py --hosts 4 --kinds host-link --victims 1 --healthy 0

For each host count: a dual-plane (dual-ToR, ECMP) testbed for the healthy runs and the
faults host-link (one host's link at 1/3), plane-down (one host's plane-1 port down),
plane-slow (that port at 1/4), cpu (one host's CPU at 20 % of a core) and link-down-mid (one
host's links set down mid-plan); a two-tier testbed (2 hosts per leaf, at least 2 leaves)
for uplink (one leaf's uplink at 1/2). One rank per host, started with `testbed exec` and
the local launcher (no Slurm), `--format json`. A fault is found when a finding of its kind
names the victim; every other finding is false. Writes results/diagnose/validation-DATE.json
and .md (load average recorded per run). Needs root; takes the testbed down at the end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
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
sys.path.insert(0, str(ROOT))

from ccbench.run.supervisor import kill_group  # noqa: E402
from ccbench.units import format_rate, parse_rate  # noqa: E402

OUT = ROOT / "results" / "diagnose"
KINDS = ("host-link", "plane-down", "plane-slow", "cpu", "uplink", "link-down-mid")
EXPECTED_KIND = {"host-link": "slow link", "plane-down": "port down", "plane-slow": "slow port",
                 "cpu": "slow compute", "uplink": "slow uplink", "link-down-mid": "stopped"}
RUN_LIMIT_S = 900
MID_PLAN_DELAY_S = 8.0          # after the plan is printed: into the pair rounds


def ccbench(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "ccbench", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)
    if check and proc.returncode != 0:
        raise SystemExit(f"ccbench {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def _start(hosts: int, args: list[str], port: int, launcher: str) -> list[subprocess.Popen[str]]:
    """The ranks, one per host; the first process's output is rank 0's (srun: all of it)."""
    diagnose = [sys.executable, "-m", "ccbench", "diagnose", *args, "--format", "json"]
    # the run's secret: srun passes the environment on; ranks started by hand also need the
    # control store's address, as `ccbench launch` hands them over (docs/security.md)
    env = dict(os.environ, PYTHONPATH=str(ROOT), CCBENCH_CONTROL_SECRET=secrets.token_hex(32))
    if launcher == "srun":
        from ccbench.testbed.slurm import slurm_env

        return [subprocess.Popen(["srun", "-N", str(hosts), "--ntasks-per-node", "1",
                                  *diagnose], env={**env, **slurm_env()}, cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)]
    env.update(WORLD_SIZE=str(hosts), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               CCBENCH_CONTROL=f"h0:{port}")
    return [subprocess.Popen(
        [sys.executable, "-m", "ccbench", "testbed", "exec", f"h{rank}", "--", *diagnose],
        env={**env, "RANK": str(rank)}, cwd=ROOT,
        stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
        stderr=subprocess.PIPE if rank == 0 else subprocess.DEVNULL, text=True,
        start_new_session=True) for rank in range(hosts)]


def run_diagnose(hosts: int, args: list[str], port: int,
                 mid_fault: tuple[float, list[str]] | None = None,
                 launcher: str = "exec") -> dict[str, Any]:
    """One rank per host (`testbed exec hI` and the local launcher, or srun); rank 0's JSON
    verdict, the plan's estimated seconds and the wall time."""
    start = time.monotonic()
    procs = _start(hosts, args, port, launcher)
    lines: list[str] = []
    planned = threading.Event()

    def read_stderr() -> None:             # the plan line: the measurements begin
        assert procs[0].stderr is not None
        for line in procs[0].stderr:
            lines.append(line)
            if line.startswith("ccbench diagnose:"):
                planned.set()

    stdout: list[str] = []
    readers = [threading.Thread(target=read_stderr, daemon=True),
               threading.Thread(target=lambda: stdout.append(procs[0].stdout.read()  # type: ignore[union-attr]
                                                             ), daemon=True)]
    for reader in readers:
        reader.start()
    if mid_fault is not None:
        while not planned.wait(timeout=1.0) and procs[0].poll() is None:
            pass                          # (rank 0 may end before its plan: start-up failed)
        time.sleep(mid_fault[0])
        ccbench("testbed", "fault", *mid_fault[1])
    try:
        procs[0].wait(timeout=RUN_LIMIT_S)
    except subprocess.TimeoutExpired:
        pass
    for reader in readers:
        reader.join(timeout=10)
    out, err = "".join(stdout), "".join(lines)
    elapsed = time.monotonic() - start
    for proc in procs[1:]:
        try:
            proc.wait(timeout=max(1.0, 90 - (time.monotonic() - start - elapsed)))
        except subprocess.TimeoutExpired:
            pass
    left = [p for p in procs if p.poll() is None]
    for proc in left:                   # only the process groups this function started
        _end(proc, launcher)
    try:
        verdict = json.loads(out)
    except ValueError:
        verdict = {"findings": None}
    plan = [line for line in lines if line.startswith("ccbench diagnose:")]
    estimate = re.search(r"estimated (\d+) s", plan[0]) if plan else None
    return {"rc": procs[0].returncode, "seconds": round(elapsed, 1), "verdict": verdict,
            "estimated_s": int(estimate.group(1)) if estimate else None,
            "plan_line": plan[0].strip() if plan else None,
            "stderr_tail": err.strip().splitlines()[-3:], "ranks_killed": len(left)}


def _end(proc: subprocess.Popen[str], launcher: str) -> None:
    """srun: two interrupts within a second end the step's tasks too; then (or with the
    local launcher at once) SIGKILL to the process group."""
    if launcher == "srun":
        for _ in range(2):
            kill_group(proc.pid, signal.SIGINT)
            time.sleep(0.3)
        try:
            proc.wait(timeout=20)
            return
        except subprocess.TimeoutExpired:
            pass
    kill_group(proc.pid)
    proc.wait()


def score(kind: str | None, victim: str | None, findings: list[dict[str, Any]] | None
          ) -> dict[str, Any]:
    if findings is None:
        return {"found": False, "false": None, "note": "no verdict"}
    hit = [f for f in findings if kind is not None and f["kind"] == EXPECTED_KIND[kind]
           and victim is not None and _names(victim, f["component"])]
    return {"found": bool(hit) if kind else None,
            "false": [f"{f['kind']}: {f['component']}" for f in findings if f not in hit]}


def _names(victim: str, component: str) -> bool:
    words = component.replace("'", " ").replace("-", " ").split()
    return victim in words


def testbed_up(hosts: int, link: str, two_tier: bool, slurm: bool = False) -> None:
    ccbench("testbed", "down")
    topology = ["--topology", f"two-tier:{hosts // 2}"] if two_tier else ["--planes", "2"]
    ccbench("testbed", "up", "--hosts", str(hosts), "--link", link, *topology,
            *(["--slurm"] if slurm else []))


def victims_for(kind: str, hosts: int, count: int) -> list[str]:
    if kind == "uplink":
        return [f"leaf{i}" for i in range(min(count, hosts // 2))]
    # h0 hosts rank 0, which speaks for the run: a stopped h0 has nobody left to say so
    pool = list(range(1, hosts)) if kind == "link-down-mid" else list(range(hosts))
    step = max(1, len(pool) // count)
    return [f"h{pool[(1 + i * step) % len(pool)]}" for i in range(count)]


def cell(hosts: int, kind: str | None, victim: str | None, link: str, port: int,
         quick: bool = False, cpu_percent: float = 20.0, records: Path | None = None,
         launcher: str = "exec", after_plan: bool = False) -> dict[str, Any]:
    """One diagnose run with one fault, scored. The fault is set before the ranks start, or,
    `after_plan`, once rank 0 has printed its plan (the ranks are up: a host that turns slow
    while the job runs; a CPU quota then does not also slow the rank's start-up)."""
    rate = parse_rate(link)
    args = ["--link-rate", link] + (["--quick"] if quick else [])
    if records is not None:          # every measurement's record, for `ccbench report`
        records.mkdir(parents=True, exist_ok=True)
        args += ["-O", str(records / f"{hosts}-{kind or 'healthy'}-{victim or 'none'}-{port}"
                                     f".jsonl")]
    if kind == "uplink":
        args += ["--leaves", str(hosts // 2)]
    else:
        args += ["--planes", "eth0,eth1"]
    faults = {"host-link": [victim, "rate", format_rate(rate // 3).replace("bit/s", "")],
              "plane-down": [f"{victim}:eth1", "down"],
              "plane-slow": [f"{victim}:eth1", "rate", format_rate(rate // 4).replace("bit/s",
                                                                                  "")],
              "cpu": [victim, "cpu", f"{cpu_percent:g}"],
              "uplink": [victim, "rate", format_rate(rate).replace("bit/s", "")]}
    mid = None
    if kind in faults and after_plan:
        mid = (0.0, [str(part) for part in faults[kind]])
    elif kind in faults:
        ccbench("testbed", "fault", *faults[kind])
    elif kind == "link-down-mid":
        mid = (MID_PLAN_DELAY_S, [str(victim), "down"])
    load = load_average()
    try:
        run = run_diagnose(hosts, args, port, mid, launcher)
    finally:
        if kind is not None:
            ccbench("testbed", "fault", str(victim), "clear")
    findings = run["verdict"].get("findings")
    result = {"hosts": hosts, "kind": kind or "healthy", "victim": victim, "quick": quick,
              **({"set": "after the plan"} if after_plan else {}),
              **({"cpu_percent": cpu_percent} if kind == "cpu" else {}),
              "link": link, "load_before": load, "load_after": load_average(),
              "launcher": launcher, "rc": run["rc"], "seconds": run["seconds"],
              "estimated_s": run["estimated_s"], "plan_line": run["plan_line"],
              "ranks_killed": run["ranks_killed"],
              **score(kind, victim, findings), "findings": findings,
              "pair_rates_bps": [p["bw_ab_bps"] for p in run["verdict"].get("pairs", [])],
              "compute_s": run["verdict"].get("compute_s"),
              "stderr_tail": run["stderr_tail"]}
    print(json.dumps({k: v for k, v in result.items() if k not in ("findings", "compute_s",
                                                                 "pair_rates_bps")}),
          flush=True)
    return result


def write(results: list[dict[str, Any]], stamp: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"validation-{stamp}.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = [f"# ccbench diagnose on the testbed, {stamp}", "",
             "| hosts | launcher | fault | victim | quick | found | false findings | exit | "
             "seconds | plan's estimate (s) | load before/after |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        false = "; ".join(r["false"]) if r["false"] else ("none" if r["false"] == [] else "?")
        found = {True: "found", False: "MISSED", None: "-"}[r["found"]]
        kind = r["kind"] + (f" {r['cpu_percent']:g} %" if "cpu_percent" in r else "")
        lines.append(f"| {r['hosts']} | {r.get('launcher', 'exec')} | {kind} | "
                     f"{r['victim'] or '-'} | {'yes' if r['quick'] else 'no'} | {found} | "
                     f"{false} | {r['rc']} | {r['seconds']} | {r.get('estimated_s') or '-'} | "
                     f"{r['load_before']:.1f}/{r['load_after']:.1f} |")
    (OUT / f"validation-{stamp}.md").write_text("\n".join(lines) + "\n")


def _runs(args: argparse.Namespace, hosts: int, two_tier: bool
          ) -> list[tuple[str | None, str | None, bool]]:
    """(kind, victim, quick) of one testbed: healthy first, each kind's victims; with
    --quick, the same again with --quick after all of them."""
    kinds = [k for k in args.kinds.split(",") if k and (k == "uplink") == two_tier]
    chosen = dict(item.split("=", 1) for item in args.victim.split(",") if "=" in item)
    runs: list[tuple[str | None, str | None]] = [] if two_tier else [(None, None)] * args.healthy
    for kind in kinds:
        victims = ([chosen[kind]] if kind in chosen
                   else victims_for(kind, hosts, args.victims))
        runs += [(kind, victim) for victim in victims]
    return [(k, v, quick) for quick in ((False, True) if args.quick else (False,))
            for k, v in runs]


def plan_growth(host_counts: list[int], link: str) -> list[str]:
    """The plan `diagnose --link-rate LINK --planes eth0,eth1` prints, full and --quick, per
    host count: steps, pair rounds and the estimated seconds (nothing is run)."""
    from ccbench.commands.diagnose import plan_of

    lines = ["| hosts | plan | steps | pair rounds | estimated (s) |", "|---|---|---|---|---|"]
    for hosts in host_counts:
        for quick in (False, True):
            steps, seconds = plan_of(["--link-rate", link, "--planes", "eth0,eth1",
                                      *(["--quick"] if quick else [])], hosts)
            rounds = sum(step.kind == "pairs" for step in steps)
            lines.append(f"| {hosts} | {'--quick' if quick else 'full'} | {len(steps)} | "
                         f"{rounds} | {seconds:.0f} |")
    return lines


def main() -> int:
    global RUN_LIMIT_S
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="4")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--victims", type=int, default=3)
    parser.add_argument("--victim", default="",
                        help="KIND=HOST,...: that kind's one victim (instead of --victims)")
    parser.add_argument("--healthy", type=int, default=4)
    parser.add_argument("--quick", action="store_true",
                        help="also each cell with --quick (after all of them)")
    parser.add_argument("--launcher", choices=("exec", "srun"), default="exec",
                        help="exec: `testbed exec` per host and the local launcher; srun: the "
                             "testbed's Slurm (`up --slurm`), `srun -N H --ntasks-per-node 1`")
    parser.add_argument("--link", default="50M")
    parser.add_argument("--cpu-percent", type=float, default=20.0,
                        help="the cpu fault's quota, percent of one core (default 20)")
    parser.add_argument("--stamp", default=datetime.date.today().isoformat())
    parser.add_argument("--run-limit", type=float, default=RUN_LIMIT_S,
                        help=f"seconds one run may take before it is ended (default "
                             f"{RUN_LIMIT_S})")
    parser.add_argument("--plan-only", action="store_true",
                        help="print the plans' estimated times per host count; run nothing")
    args = parser.parse_args()
    if args.plan_only:
        print("\n".join(plan_growth([int(h) for h in args.hosts.split(",")], args.link)))
        return 0
    RUN_LIMIT_S = args.run_limit
    results: list[dict[str, Any]] = []
    port = 29700
    try:
        for hosts in [int(h) for h in args.hosts.split(",")]:
            for two_tier in (False, True):
                runs = _runs(args, hosts, two_tier)
                if not runs:
                    continue
                testbed_up(hosts, args.link, two_tier, slurm=args.launcher == "srun")
                for kind, victim, quick in runs:
                    port += 1
                    results.append(cell(hosts, kind, victim, args.link, port, quick,
                                        args.cpu_percent, OUT / f"records-{args.stamp}",
                                        args.launcher))
                    write(results, args.stamp)
    finally:
        ccbench("testbed", "down", check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
