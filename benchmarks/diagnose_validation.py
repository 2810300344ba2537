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


def run_diagnose(hosts: int, args: list[str], port: int,
                 mid_fault: tuple[float, list[str]] | None = None) -> dict[str, Any]:
    """One rank per host (`testbed exec hI`, the local launcher); rank 0's JSON verdict."""
    # ranks started by hand: the control store's address and the run's secret, as
    # `ccbench launch` hands them over (docs/security.md)
    env = dict(os.environ, PYTHONPATH=str(ROOT), WORLD_SIZE=str(hosts), LOCAL_RANK="0",
               LOCAL_WORLD_SIZE="1", CCBENCH_CONTROL=f"h0:{port}",
               CCBENCH_CONTROL_SECRET=secrets.token_hex(32))
    procs = []
    start = time.monotonic()
    for rank in range(hosts):
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "ccbench", "testbed", "exec", f"h{rank}", "--", sys.executable,
             "-m", "ccbench", "diagnose", *args, "--format", "json"],
            env={**env, "RANK": str(rank)}, cwd=ROOT,
            stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
            stderr=subprocess.PIPE if rank == 0 else subprocess.DEVNULL, text=True,
            start_new_session=True))
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
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    try:
        verdict = json.loads(out)
    except ValueError:
        verdict = {"findings": None}
    return {"rc": procs[0].returncode, "seconds": round(elapsed, 1), "verdict": verdict,
            "stderr_tail": err.strip().splitlines()[-3:], "ranks_killed": len(left)}


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


def testbed_up(hosts: int, link: str, two_tier: bool) -> None:
    ccbench("testbed", "down")
    topology = ["--topology", f"two-tier:{hosts // 2}"] if two_tier else ["--planes", "2"]
    ccbench("testbed", "up", "--hosts", str(hosts), "--link", link, *topology)


def victims_for(kind: str, hosts: int, count: int) -> list[str]:
    if kind == "uplink":
        return [f"leaf{i}" for i in range(min(count, hosts // 2))]
    # h0 hosts rank 0, which speaks for the run: a stopped h0 has nobody left to say so
    pool = list(range(1, hosts)) if kind == "link-down-mid" else list(range(hosts))
    step = max(1, len(pool) // count)
    return [f"h{pool[(1 + i * step) % len(pool)]}" for i in range(count)]


def cell(hosts: int, kind: str | None, victim: str | None, link: str, port: int,
         quick: bool = False, cpu_percent: float = 20.0, records: Path | None = None
         ) -> dict[str, Any]:
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
    if kind in faults:
        ccbench("testbed", "fault", *faults[kind])
    elif kind == "link-down-mid":
        mid = (MID_PLAN_DELAY_S, [str(victim), "down"])
    load = load_average()
    try:
        run = run_diagnose(hosts, args, port, mid)
    finally:
        if kind is not None:
            ccbench("testbed", "fault", str(victim), "clear")
    findings = run["verdict"].get("findings")
    result = {"hosts": hosts, "kind": kind or "healthy", "victim": victim, "quick": quick,
              **({"cpu_percent": cpu_percent} if kind == "cpu" else {}),
              "link": link, "load_before": load, "load_after": load_average(),
              "rc": run["rc"], "seconds": run["seconds"], "ranks_killed": run["ranks_killed"],
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
             "| hosts | fault | victim | quick | found | false findings | exit | seconds | "
             "load before/after |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        false = "; ".join(r["false"]) if r["false"] else ("none" if r["false"] == [] else "?")
        found = {True: "found", False: "MISSED", None: "-"}[r["found"]]
        kind = r["kind"] + (f" {r['cpu_percent']:g} %" if "cpu_percent" in r else "")
        lines.append(f"| {r['hosts']} | {kind} | {r['victim'] or '-'} | "
                     f"{'yes' if r['quick'] else 'no'} | {found} | {false} | {r['rc']} | "
                     f"{r['seconds']} | {r['load_before']:.1f}/{r['load_after']:.1f} |")
    (OUT / f"validation-{stamp}.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="4")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--victims", type=int, default=3)
    parser.add_argument("--healthy", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="also each cell with --quick")
    parser.add_argument("--link", default="50M")
    parser.add_argument("--cpu-percent", type=float, default=20.0,
                        help="the cpu fault's quota, percent of one core (default 20)")
    parser.add_argument("--stamp", default=datetime.date.today().isoformat())
    args = parser.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    results: list[dict[str, Any]] = []
    port = 29700
    try:
        for hosts in [int(h) for h in args.hosts.split(",")]:
            for two_tier in (False, True):
                todo = [k for k in kinds if (k == "uplink") == two_tier]
                if not todo and not (args.healthy and not two_tier):
                    continue
                testbed_up(hosts, args.link, two_tier)
                runs: list[tuple[str | None, str | None]] = []
                if not two_tier:
                    runs += [(None, None)] * args.healthy
                runs += [(k, v) for k in todo for v in victims_for(k, hosts, args.victims)]
                for kind, victim in runs:
                    for quick in ((False, True) if args.quick else (False,)):
                        port += 1
                        results.append(cell(hosts, kind, victim, args.link, port, quick,
                                            args.cpu_percent,
                                            OUT / f"records-{args.stamp}"))
                        write(results, args.stamp)
    finally:
        ccbench("testbed", "down", check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
