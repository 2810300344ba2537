"""ccbench diagnose on rail-optimized hosts (--rails K: one rank per GPU and NIC, NIC i of
every host on rail i, each NIC with a port per plane): the rail-to-rail plan, findings that
name host, rail and plane port, the CPU twin of `--backend nccl` (gloo, one machine), and one
testbed cell (matrix: about 3 minutes) with one NIC of a 2-rail host slow and one port of
another host's other rail down.

    sudo pytest -m 'testbed and matrix' tests/test_diagnose_rails.py

The testbed runs (results/diagnose/) come from this module too:

    sudo python tests/test_diagnose_rails.py --runs 3 --fault   # and without --fault
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ccbench.diagnose.analyse import Expectation, PairMeasure, analyse  # noqa: E402
from ccbench.diagnose.counters import counter_findings, reach_findings  # noqa: E402
from ccbench.diagnose.plan import build_plan  # noqa: E402

LINK = 50e6
ABSOLUTE = Expectation(LINK, None, "--link-rate")
HOSTS, RAILS = 4, 2
NAMES = [f"h{h} rail {r}" for h in range(HOSTS) for r in range(RAILS)]
STATE = Path("/run/ccbench-testbed")


# -- the plan ---------------------------------------------------------------------------------

@pytest.mark.parametrize("hosts, rails, quick", [(4, 2, False), (5, 2, False), (6, 3, False),
                                                 (8, 2, True)])
def test_every_pair_is_rail_to_rail_and_every_host_pair_on_every_rail(hosts, rails, quick):
    steps = build_plan(hosts * rails, quick, planes=["0", "1"], compute=False, rails=rails)
    assert steps[0].kind == "world" and f"{hosts} hosts x {rails} rails" in steps[0].label
    per_kind: dict[tuple[str, str | None], set[tuple[int, int]]] = {}
    for step in steps[1:]:
        used = [n for pair in step.pairs for n in pair]
        assert len(used) == len(set(used)), step          # disjoint: all at once
        for a, b in step.pairs:
            assert a % rails == b % rails, step            # same rail
            assert a // rails != b // rails, step          # two hosts
            per_kind.setdefault((step.kind, step.plane), set()).add((a // rails, b // rails,
                                                                      a % rails))
    assert set(per_kind) == {("pairs", None), ("planes", "0"), ("planes", "1")}
    if not quick:
        every = {(a, b, r) for a in range(hosts) for b in range(a + 1, hosts)
                 for r in range(rails)}
        assert all(pairs == every for pairs in per_kind.values())


def test_plan_of_nccl_is_the_gloo_plan():
    """`--backend nccl` goes through the same plan (one rank per GPU and NIC)."""
    from ccbench.commands.diagnose import plan_of

    gloo, _ = plan_of(["--backend", "gloo", "--rails", "2", "--link-rate", "50M"], 4)
    nccl, _ = plan_of(["--backend", "nccl", "--rails", "2", "--link-rate", "50M"], 4)
    assert [s.to_json() for s in gloo] == [s.to_json() for s in nccl]
    assert all(a % 2 == b % 2 for s in gloo for a, b in s.pairs)


@pytest.mark.parametrize("argv, words", [
    (["--rails", "2", "--planes", "a,b"], "NIC by NIC"),
    (["--rails", "2", "--planes", "a,b/c"], "NIC by NIC"),
    (["--rails", "1"], "at least 2 rails"),
    (["--rails", "2", "--ranks-per-host", "3"], "--ranks-per-host 2"),
    (["--rails", "2", "--leaves", "2"], "does not combine"),
    (["--rails", "r0,r1", "--backend", "nccl"], "the library picks its NIC"),
    (["--planes", "a,b/c,d"], "need --rails"),
])
def test_bad_rails_input_is_one_line_exit_2(argv, words):
    proc = subprocess.run([sys.executable, "-m", "ccbench", "diagnose", *argv],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ccbench: error:") and words in lines[0], \
        proc.stderr


# -- the naming, from synthetic measurements ------------------------------------------------

def _nic(h: int, r: int) -> int:
    return h * RAILS + r


def _rail_tries(rate, planes=("0", "1"), seed=0, down=()):
    """Every step of the rails plan once: rate(a, b, plane) per direction (plane None for
    the unpinned pairs); `down`: (NIC, plane) whose pairs on that plane got no answer."""
    rng = random.Random(seed)
    out = []
    for step in build_plan(HOSTS * RAILS, planes=list(planes), compute=False, rails=RAILS)[1:]:
        for a, b in step.pairs:
            if step.plane is not None and {(a, step.plane), (b, step.plane)} & set(down):
                out.append(PairMeasure(step.kind, step.round, a, b, plane=step.plane,
                                       error=f"no answer on plane {step.plane}"))
                continue
            out.append(PairMeasure(step.kind, step.round, a, b, 300.0,
                                   rate(a, b, step.plane) * rng.uniform(0.93, 1.0),
                                   rate(b, a, step.plane) * rng.uniform(0.93, 1.0),
                                   plane=step.plane))
    return out


def test_slow_nic_and_a_port_of_another_rail_down_are_named_with_host_rail_and_plane():
    """h1's rail-0 NIC at 1/3 (both its ports) and h2's rail-1 plane-1 port down: the NIC
    and the port, nothing else (not h1's rail 1, not h2's rail 0, not the pairs)."""
    slow = _nic(1, 0)

    def rate(a, b, plane):
        return LINK / 3 if slow in (a, b) else 0.95 * LINK
    measures = _rail_tries(rate, down=[(_nic(2, 1), "1")])
    findings = analyse(measures, ABSOLUTE, NAMES)
    got = sorted((f.kind, f.component) for f in findings)
    assert got == [("port down", "host h2 rail 1 plane 1 port"),
                   ("slow link", "host h1 rail 0 NIC (every plane)")], got
    assert all(f.hosts in (["h1 rail 0"], ["h2 rail 1"]) for f in findings)


def test_slow_port_of_one_rail_is_that_rail_and_plane():
    bad = _nic(3, 1)

    def rate(a, b, plane):
        return LINK / 4 if bad in (a, b) and plane == "0" else 0.95 * LINK
    findings = analyse(_rail_tries(rate), ABSOLUTE, NAMES)
    assert [(f.kind, f.component) for f in findings] == [
        ("slow port", "host h3 rail 1 plane 0 port")]


def test_counters_and_reach_name_the_rail_and_plane():
    """Each rank reports its own NIC's interfaces by plane number (`_as_planes`): a carrier
    change on h2 rail 1's plane-1 port, and no answer on h0 rail 1's plane-0 port."""
    found = counter_findings({_nic(2, 1): {"1": {"carrier_changes": 1, "state_before": "up",
                                                "state": "down"}}}, NAMES, ["0", "1"])
    assert [(f.kind, f.component) for f in found] == [("port down",
                                                       "host h2 rail 1 plane 1 port")]
    nic = counter_findings({_nic(2, 1): {"NIC": {"rx_errors": 5, "state_before": "up",
                                                 "state": "up"}}}, NAMES, ["0", "1"])
    assert [(f.kind, f.component) for f in nic] == [("port errors", "host h2 rail 1 NIC")]
    failed = {p: {_nic(0, 1): ["0"]} for p in range(HOSTS * RAILS) if p // RAILS != 0}
    reach = reach_findings(failed, NAMES, ["0", "1"])
    assert [(f.kind, f.component) for f in reach] == [("port down",
                                                       "host h0 rail 1 plane 0 port")]


def test_a_nic_address_without_answer_is_its_port_that_is_down():
    """h2's rail-1 plane-1 port down: a probe of its NIC's own address (ECMP over both
    ports) hashed onto the dead next hop got no answer too (1 of 3 testbed runs): the port,
    one finding."""
    failed = {p: {_nic(2, 1): ["1", "NIC"]} for p in range(HOSTS * RAILS) if p // RAILS != 2}
    measures = _rail_tries(lambda a, b, p: 0.95 * LINK, down=[(_nic(2, 1), "1")])
    findings = analyse(measures, ABSOLUTE, NAMES, reach=failed)
    assert [(f.kind, f.component) for f in findings] == [
        ("port down", "host h2 rail 1 plane 1 port")]


def test_healthy_rails_have_no_finding():
    for seed in range(5):
        assert analyse(_rail_tries(lambda a, b, p: 0.95 * LINK, seed=seed), ABSOLUTE,
                       NAMES) == []


def test_cpu_twin_of_rails_on_one_machine():
    """`ccbench launch -n 4 diagnose --rails lo,lo`: 2 "hosts" of 2 ranks each, every rank
    its own NIC (lo here), pinned per plane port: the pairs are rail to rail, healthy, 0."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "ccbench", "launch", "-n", "4", "diagnose",
                           "--backend", "gloo", "--rails", "lo,lo", "--planes", "lo,lo/lo,lo",
                           "--no-compute", "--iters", "2", "--format", "json"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdict = json.loads(proc.stdout)
    assert verdict["findings"] == []
    assert len(verdict["hosts"]) == 4 and all(" rail " in h for h in verdict["hosts"])
    pairs = {(p["a"], p["b"]) for p in verdict["pairs"]}
    assert pairs and all(a.split(" rail ")[1] == b.split(" rail ")[1] for a, b in pairs)
    planes = {m["plane"] for m in verdict["measurements"] if m.get("plane")}
    assert planes == {"0", "1"}
    assert "2 hosts x 2 rails" in proc.stderr or "2 hosts x 2 rails" in proc.stdout


# -- the testbed -----------------------------------------------------------------------------

def _ccbench(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "ccbench", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ccbench {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def rails_args(link: str = "50M", rails: int = RAILS) -> list[str]:
    return ["--link-rate", link, "--rails", ",".join(f"r{r}" for r in range(rails)),
            "--planes", "/".join(f"r{r}p0,r{r}p1" for r in range(rails)), "--no-compute"]


def _log(rank: int) -> Any:
    """Where a rank other than 0 writes its stderr: $CCBENCH_RAILS_LOGS/rank-R.err if set."""
    folder = os.environ.get("CCBENCH_RAILS_LOGS")
    if not folder:
        return subprocess.DEVNULL
    return open(Path(folder) / f"rank-{rank}.err", "w")  # noqa: SIM115  closed at exit


def run_rails(hosts: int, rails: int, args: list[str], port: int,
              limit_s: float = 900.0) -> dict[str, Any]:
    """K ranks on every testbed host (`testbed exec`, the local launcher): rank h x K + i is
    host h's rail i. Rank 0's JSON verdict, its exit status, the wall time and the load."""
    from ccbench.run.supervisor import kill_group

    env = dict(os.environ, PYTHONPATH=str(ROOT), CCBENCH_CONTROL_SECRET=secrets.token_hex(32),
               WORLD_SIZE=str(hosts * rails), LOCAL_WORLD_SIZE=str(rails),
               CCBENCH_CONTROL=f"h0:{port}")
    argv = [sys.executable, "-m", "ccbench", "diagnose", *args, "--format", "json"]
    load = float(Path("/proc/loadavg").read_text().split()[0])
    start = time.monotonic()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "ccbench", "testbed", "exec", f"h{rank // rails}", "--", *argv],
        env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank % rails)}, cwd=ROOT,
        stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
        stderr=subprocess.PIPE if rank == 0 else _log(rank), text=True,
        start_new_session=True) for rank in range(hosts * rails)]
    try:
        out, err = procs[0].communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        kill_group(procs[0].pid)
        out, err = procs[0].communicate()
    seconds = time.monotonic() - start
    left = 0
    for proc in procs[1:]:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            left += 1
            kill_group(proc.pid, signal.SIGKILL)
            proc.wait()
    try:
        verdict = json.loads(out)
    except ValueError:
        verdict = {"findings": None}
    plan = [line for line in err.splitlines() if line.startswith("ccbench diagnose:")]
    return {"rc": procs[0].returncode, "seconds": round(seconds, 1), "load_before": load,
            "load_after": float(Path("/proc/loadavg").read_text().split()[0]),
            "findings": verdict.get("findings"), "plan": plan[-1] if plan else None,
            "stderr_tail": err.strip().splitlines()[-3:],
            "stdout_tail": [] if verdict.get("findings") is not None
            else out.strip().splitlines()[-3:], "ranks_killed": left}


FAULTS = [("h1:r0", "rate", "16M"), ("h2:r1p1", "down")]
EXPECTED = {("slow link", "host h1 rail 0 NIC (every plane)"),
            ("port down", "host h2 rail 1 plane 1 port")}


def rails_run(port: int, fault: bool, hosts: int = HOSTS) -> dict[str, Any]:
    """One run on the testbed that is up (hosts x 2 rails x 2 planes): with `fault`, h1's
    rail-0 NIC at 16 Mbit/s and h2's rail-1 plane-1 port down, set before the ranks start
    and taken back after."""
    if fault:
        for words in FAULTS:
            _ccbench("testbed", "fault", *words)
    try:
        run = run_rails(hosts, RAILS, rails_args(), port)
    finally:
        if fault:
            _ccbench("testbed", "fault", "all", "clear", check=False)
    got = {(f["kind"], f["component"]) for f in run["findings"] or []}
    want = EXPECTED if fault else set()
    run.update(fault=fault, named=sorted(want & got), missed=sorted(want - got),
               false=sorted(got - want))
    return run


def _problem() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, bridges)"
    missing = [t for t in ("ip", "tc", "nsenter", "unshare") if shutil.which(t) is None]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install iproute2 util-linux)"
    if (STATE / "state.json").exists():
        return "a testbed is already up (`ccbench testbed down` first; this test replaces it)"
    return None


def _up(hosts: int = HOSTS) -> None:
    _ccbench("testbed", "down")
    _ccbench("testbed", "up", "--hosts", str(hosts), "--rails", str(RAILS), "--planes", "2",
             "--link", "50M")


@pytest.mark.testbed
@pytest.mark.matrix
@pytest.mark.timeout(900)
def test_slow_nic_and_port_down_of_another_rail_on_the_testbed():
    from conftest import missing_prerequisite

    problem = _problem()
    if problem is not None:
        missing_prerequisite(f"testbed not possible here: {problem}")
    try:
        _up()
        run = rails_run(29850, fault=True)
    finally:
        _ccbench("testbed", "down", check=False)
    assert run["rc"] == 1 and run["ranks_killed"] == 0, run
    assert run["missed"] == [] and run["false"] == [], run


def main() -> int:
    parser = argparse.ArgumentParser(description="rails runs on the testbed (root)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--fault", action="store_true")
    parser.add_argument("--hosts", type=int, default=HOSTS)
    parser.add_argument("--keep", action="store_true", help="use the testbed that is up")
    parser.add_argument("--port", type=int, default=29860)
    args = parser.parse_args()
    if not args.keep:
        _up(args.hosts)
    for number in range(args.runs):
        run = rails_run(args.port + number, args.fault, args.hosts)
        print(json.dumps(run), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
