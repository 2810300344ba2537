"""Runs that cross a network: two emulated hosts (`ccbench testbed up --slurm`), shaped links.

    sudo pytest -m testbed tests/test_testbed.py

One testbed per module (2 hosts, a multi-node Slurm cluster on them), always taken down, also
when a test fails. One cell of each kind: srun + gloo, Intel MPI with Slurm's bootstrap (mpi
and ring@mpi), torchrun's static rendezvous, a multi-node sweep with its resubmission, and a
rank on the remote host SIGKILLed mid-run. Every timed record is also checked against the
link: it cannot be faster than half the bytes the allreduce must move across the shaped
link, so a run that took a shared-memory shortcut between the "hosts" fails.

Without root, iproute2, Slurm or Intel MPI these tests skip with the reason; with CI=true
they fail instead, so a CI run cannot pass while silently not crossing a network.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MPIEXEC, missing_prerequisite

from ccbench.records import RecordKey, load_records
from ccbench.records.schema import Record

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]

LINK = "300M"
LINK_BPS = 300 * 10**6
HOSTS = ["h0", "h1"]
SIZES = "64K,1M"
STATE = Path("/run/ccbench-testbed")
SLURM_CONF = STATE / "slurm" / "slurm.conf"
OP_TIMEOUT_S = 10
# "no hang" bounds, in minutes: a loaded machine is slow, never stuck
RUN_BOUND_S = 180
NO_HANG_S = OP_TIMEOUT_S + 30 + 120

SWEEP = """\
name: tb
collectives: [allreduce]
backends: [gloo, mpi]
sizes: 64K,256K
nodes: [1, 2]
ranks_per_node: [1]
modes: [in-place]
iters: 3
warmup: 1
case_timeout: 120
"""


def _prerequisite_problem() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, bridges, /etc/hosts)"
    tools = ("ip", "tc", "nsenter", "unshare", "slurmctld", "slurmd", "sinfo", "srun", "salloc",
             "sbatch", "munge")
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install iproute2 util-linux slurm-wlm munge)"
    if not Path(MPIEXEC).exists():
        return f"no Intel MPI mpiexec at {MPIEXEC} (pip install impi-rt)"
    if (STATE / "state.json").exists():
        return "a testbed is already up (`ccbench testbed down` first; this test would replace it)"
    return None


def _ccbench(*args: str, timeout: float = RUN_BOUND_S,
             cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ccbench", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=_env())


def _env(**extra: str) -> dict[str, str]:
    # the testbed's own cluster; the single-node one of .ci/slurm-up.sh stays the default
    return {**os.environ, "SLURM_CONF": str(SLURM_CONF), **extra}


def _leftovers() -> list[str]:
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"netns {line.split()[0]}" for line in netns.splitlines() if line.startswith("ccb-")]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found += [f"link {line.split(':')[1].strip()}" for line in links.splitlines()
              if line.split(":")[1].strip().startswith("ccb-")]
    hosts = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else ""
    found += [f"/etc/hosts: {line}" for line in hosts.splitlines() if "ccbench-testbed" in line]
    if STATE.exists():
        found.append(str(STATE))
    return found


@pytest.fixture(scope="module")
def testbed_up() -> Iterator[None]:
    problem = _prerequisite_problem()
    if problem is not None:
        missing_prerequisite(f"testbed not possible here: {problem}")
    try:
        proc = _ccbench("testbed", "up", "--hosts", str(len(HOSTS)), "--link", LINK, "--slurm")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield
    finally:
        subprocess.run(["scancel", "--name=ccbench-tb"], env=_env(), capture_output=True,
                       timeout=30, check=False)
        down = _ccbench("testbed", "down", timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
        left = _leftovers()
        assert not left, f"testbed down left {left}"


@pytest.fixture
def testbed(testbed_up: None) -> None:
    """The testbed, every node idle: a test that cut a host off leaves its node to come back
    (up to a minute after the link is up) while the next test, if any, waits for it."""
    for host in HOSTS:
        _wait_node_idle(host, 120)


def _wire_floor_us(record: Record) -> float:
    """Half the time the link needs for the bytes every allreduce must bring into a rank:
    (p-1)/p of the buffer (a rank cannot sum an element it never received anything for)."""
    p = record.world_size
    return 0.5 * record.size_used * (p - 1) / p * 8 / LINK_BPS * 1e6


def _check_across_hosts(records: list[Record], launcher: str) -> None:
    assert records
    for r in records:
        assert (r.nodes, r.ranks_per_node, r.world_size) == (2, 1, 2), r
        assert list(r.hosts) == HOSTS and r.wrong == 0, r
        assert r.method["launcher"] == launcher, r.method
    big = [r for r in records if r.size_used >= 1 << 20]
    assert big, "no 1 MiB record"
    for r in big:   # the bytes crossed the shaped link (not shared memory between "hosts")
        median = r.time_us["median"]
        assert median >= _wire_floor_us(r), (r.backend, median, _wire_floor_us(r))


def test_srun_gloo_across_hosts(testbed: None, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    proc = subprocess.run(["srun", "-N2", "--ntasks-per-node", "1", sys.executable, "-m",
                           "ccbench", "allreduce", "--backend", "gloo", "--sizes", SIZES,
                           "--iters", "5", "--warmup", "2", "-q", "-O", str(out)],
                          capture_output=True, text=True, timeout=RUN_BOUND_S, env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = load_records(out)
    assert len(records) == 4                 # 2 sizes x out-of-place, in-place
    _check_across_hosts(records, "srun")


def test_intel_mpi_slurm_bootstrap_across_hosts(testbed: None, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    # hydra's ssh bootstrap has nothing to reach between namespaces; Slurm's starts the proxies
    proc = subprocess.run(["salloc", "-N2", "--ntasks-per-node", "1", sys.executable, "-m",
                           "ccbench", "testbed", "exec", "h0", "--", MPIEXEC, "-bootstrap",
                           "slurm", "-n", "2", "-ppn", "1", sys.executable, "-m", "ccbench",
                           "allreduce", "--backend", "mpi,ring@mpi", "--sizes", SIZES,
                           "--iters", "5", "--warmup", "2", "-q", "-O", str(out)],
                          capture_output=True, text=True, timeout=RUN_BOUND_S, env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = load_records(out)
    assert Counter(r.backend for r in records) == {"mpi": 4, "ring@mpi": 4}
    assert {r.algorithm for r in records if r.backend == "ring@mpi"} == {"ring"}
    _check_across_hosts(records, "mpiexec")


@pytest.mark.parametrize("rendezvous", ["static", "c10d"])
def test_torchrun_rendezvous_across_hosts(testbed: None, tmp_path: Path, rendezvous: str) -> None:
    out = tmp_path / "r.jsonl"
    how = {"static": lambda rank: ["--node-rank", str(rank), "--master-addr", "h0",
                                   "--master-port", "29500"],
           "c10d": lambda rank: ["--rdzv-backend", "c10d", "--rdzv-endpoint", "h0:29400",
                                 "--rdzv-id", f"tb-{os.getpid()}"]}[rendezvous]
    procs = [subprocess.Popen(
        [sys.executable, "-m", "ccbench", "testbed", "exec", host, "--", sys.executable, "-m",
         "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", *how(rank),
         "-m", "ccbench",
         "allreduce", "--backend", "gloo", "--sizes", SIZES, "--iters", "5", "--warmup", "2",
         "-q", "-O", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
        for rank, host in enumerate(HOSTS)]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=RUN_BOUND_S)[0])
    finally:
        for proc in procs:                   # exec'd: the pid is torchrun itself
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outputs)
    _check_across_hosts(load_records(out), "torchrun")


def test_sweep_over_one_and_two_nodes(testbed: None, tmp_path: Path) -> None:
    (tmp_path / "tb.yaml").write_text(SWEEP)
    proc = _ccbench("sweep", "tb.yaml", "--slurm", "--wait", "--wait-timeout", "150",
                    cwd=tmp_path)
    results = tmp_path / "results" / "tb"
    logs = "".join(p.read_text() for p in (results / "logs").glob("*.out")) \
        if (results / "logs").is_dir() else ""
    assert proc.returncode == 0, proc.stdout + proc.stderr + logs
    records = load_records(results)
    counts = Counter(RecordKey.of(r) for r in records)
    assert set(counts.values()) == {1}, "a (case, size) was measured twice"
    landed = sorted((r.backend, r.nodes, r.size_asked) for r in records)
    assert landed == sorted((b, n, s) for b in ("gloo", "mpi") for n in (1, 2)
                            for s in (64 << 10, 256 << 10))
    for r in records:
        assert r.wrong == 0 and r.world_size == r.nodes and r.ranks_per_node == 1, r
        # a one-node case runs on whichever host Slurm picks
        assert len(set(r.hosts)) == r.nodes and set(r.hosts) <= set(HOSTS), r
    assert {r.backend: r.method["launcher"] for r in records} == {"gloo": "srun",
                                                                  "mpi": "mpiexec"}

    again = _ccbench("sweep", "tb.yaml", "--slurm", "--wait", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "every case is complete; nothing to submit" in again.stdout
    assert len(load_records(results)) == len(records)


def _tagged_pids(tag: str) -> dict[int, tuple[str, int]]:
    """pid -> (netns, rank) of the ccbench ranks carrying CCBENCH_TEST_TAG=tag."""
    found = {}
    for netns in ("ccb-h0", "ccb-h1"):
        pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True,
                              text=True).stdout.split()
        for pid in pids:
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            variables = dict(v.split(b"=", 1) for v in env if b"=" in v)
            if variables.get(b"CCBENCH_TEST_TAG") == tag.encode() \
                    and b"SLURM_PROCID" in variables:
                found[int(pid)] = (netns, int(variables[b"SLURM_PROCID"]))
    return found


def _every_pid_with(tag: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"CCBENCH_TEST_TAG={tag}".encode() in (entry / "environ").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _srun_gloo_mid_run(out: Path, tag: str, timeout_s: int) -> subprocess.Popen[str]:
    """A 2-host gloo allreduce under srun, its processes tagged, once its first two records are
    on disk (so a fault comes mid-run)."""
    proc = subprocess.Popen(["srun", "-N2", "--ntasks-per-node", "1", sys.executable, "-m",
                             "ccbench", "allreduce", "--backend", "gloo", "--sizes", "64K-16M",
                             "--min-time", "0.5", "--timeout", str(timeout_s), "-q", "-O",
                             str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(CCBENCH_TEST_TAG=tag))
    deadline = time.monotonic() + RUN_BOUND_S
    while not (out.exists() and len(out.read_text().splitlines()) >= 2):
        if proc.poll() is not None or time.monotonic() >= deadline:
            proc.kill()
            raise AssertionError(f"no records appeared: {proc.communicate()}")
        time.sleep(0.1)
    return proc


def test_remote_rank_sigkilled_mid_run(testbed: None, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    tag = f"testbed-kill-{os.getpid()}"
    proc = _srun_gloo_mid_run(out, tag, OP_TIMEOUT_S)
    try:
        ranks = _tagged_pids(tag)
        victims = [pid for pid, where in ranks.items() if where == ("ccb-h1", 1)]
        assert len(victims) == 1, ranks
        os.kill(victims[0], signal.SIGKILL)
        killed = time.monotonic()
        _, stderr = proc.communicate(timeout=NO_HANG_S)
        stopped_s = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    errors = [line for line in stderr.splitlines() if line.startswith("ccbench: error:")]
    assert len(errors) == 1, stderr
    assert "allreduce" in errors[0] and "ranks that did not arrive: 1" in errors[0], errors
    assert "Traceback" not in stderr
    deadline = time.monotonic() + 60           # Slurm reaps the step's last processes
    while _every_pid_with(tag) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _every_pid_with(tag), f"processes of the run left {stopped_s:.0f} s after the kill"
    lines = out.read_text().splitlines()
    records = load_records(out)
    assert len(records) == len(lines) >= 2 and all(json.loads(line) for line in lines)
    assert all(r.wrong == 0 and r.nodes == 2 for r in records)
    assert len({RecordKey.of(r) for r in records}) == len(records)


def _wait_node_idle(node: str, bound_s: float) -> None:
    deadline = time.monotonic() + bound_s
    while "idle" not in subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], env=_env(),
                                       capture_output=True, text=True).stdout:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], env=_env(),
                       capture_output=True, timeout=30, check=False)
        assert time.monotonic() < deadline, f"{node} did not come back"
        time.sleep(2)


SWEEP_KILLED = SWEEP.replace("name: tb\n", "name: tbk\n").replace("sizes: 64K,256K",
                                                                  "sizes: 64K,256K,1M,4M")


def _squeue_names() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True,
                         timeout=30, env=_env()).stdout
    return out.split()


def test_slurmd_host_killed_mid_sweep_then_resubmitted(testbed: None, tmp_path: Path) -> None:
    """Every process of host h1 (slurmd, its steps, the ranks) killed once records land: the
    sweep says which cases are incomplete and fails; once h1's slurmd is back, the same
    command again runs only what is missing, and every (case, size) lands once."""
    (tmp_path / "tbk.yaml").write_text(SWEEP_KILLED)
    results = tmp_path / "results" / "tbk"
    sweep = subprocess.Popen([sys.executable, "-m", "ccbench", "sweep", "tbk.yaml", "--slurm",
                              "--wait", "--wait-timeout", "240"], cwd=tmp_path, env=_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + RUN_BOUND_S
        while sum(len(p.read_text().splitlines()) for p in results.glob("*.jsonl")) < 2:
            assert sweep.poll() is None, sweep.communicate()
            assert time.monotonic() < deadline, "no records appeared"
            time.sleep(0.2)
        pids = subprocess.run(["ip", "netns", "pids", "ccb-h1"], capture_output=True,
                              text=True).stdout.split()
        for pid in pids:                     # the host's slurmd, its steps and its ranks
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        # an administrator who saw the host go marks its node down (Slurm itself would after
        # SlurmdTimeout, and hold the jobs as completing till then: ~45 s); its jobs cannot
        # run: cancel them as a user would, and the sweep ends saying what is missing
        subprocess.run(["scontrol", "update", "nodename=h1", "state=down",
                        "reason=host killed"], env=_env(), timeout=30, check=True)
        deadline = time.monotonic() + 120
        while "ccbench-tbk" in " ".join(_squeue_names()) and time.monotonic() < deadline:
            subprocess.run(["scancel", "--name=ccbench-tbk"], env=_env(), timeout=30,
                           capture_output=True, check=False)
            time.sleep(2)
        first, _ = sweep.communicate(timeout=NO_HANG_S)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
    assert sweep.returncode != 0, first
    assert "incomplete" in first, first
    before = load_records(results)
    assert len(before) < 16, "nothing was lost: the kill came too late to test anything"

    # h1 back: its slurmd again, in its namespace, as `testbed up --slurm` starts it
    up = _ccbench("testbed", "exec", "h1", "--", "slurmd", "-f", str(SLURM_CONF), "-N", "h1")
    assert up.returncode == 0, up.stdout + up.stderr
    _wait_node_idle("h1", 120)
    again = _ccbench("sweep", "tbk.yaml", "--slurm", "--wait", "--wait-timeout", "200",
                     cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    records = load_records(results)
    counts = Counter(RecordKey.of(r) for r in records)
    assert set(counts.values()) == {1}, "a (case, size) was measured twice"
    assert len(records) == 16                   # 2 backends x 2 node counts x 4 sizes
    assert {RecordKey.of(r) for r in before} <= set(counts)
    assert all(r.wrong == 0 and len(set(r.hosts)) == r.nodes for r in records)


# long, so that the line can only come from rank 0 noticing the silent host, not the op timeout
LINK_CUT_TIMEOUT_S = 60


def test_remote_link_down_mid_run(testbed: None, tmp_path: Path) -> None:
    """h1's link set down under srun: rank 0 names rank 1 as unreachable (its control
    connection gets no TCP answer), srun gives up on h1's slurmstepd by the keepalive of the
    testbed's slurm.conf, and every rank ends, all long before the link comes back."""
    out = tmp_path / "r.jsonl"
    tag = f"testbed-cut-{os.getpid()}"
    proc = _srun_gloo_mid_run(out, tag, LINK_CUT_TIMEOUT_S)
    cut = False
    try:
        subprocess.run(["ip", "-n", "ccb-h1", "link", "set", "eth0", "down"], check=True)
        cut = True
        cut_at = time.monotonic()
        _, stderr = proc.communicate(timeout=LINK_CUT_TIMEOUT_S + 30 + 120)
        stopped_s = time.monotonic() - cut_at
        deadline = time.monotonic() + 60        # the rank on h1 leaves on its own
        while _every_pid_with(tag) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _every_pid_with(tag)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if cut:
            subprocess.run(["ip", "-n", "ccb-h1", "link", "set", "eth0", "up"], check=False)
    print(f"srun ended {stopped_s:.0f} s after the link went down")
    assert proc.returncode != 0
    assert not left, f"processes of the run left with h1's link still down: {left}"
    errors = [line for line in stderr.splitlines() if line.startswith("ccbench: error:")]
    assert len(errors) == 1, stderr
    assert "allreduce" in errors[0] and "ranks that did not arrive: 1 (unreachable" in errors[0], \
        errors
    assert "Traceback" not in stderr
    lines = out.read_text().splitlines()
    records = load_records(out)
    assert len(records) == len(lines) >= 2 and all(json.loads(line) for line in lines)
    assert all(r.wrong == 0 and r.nodes == 2 for r in records)
    assert len({RecordKey.of(r) for r in records}) == len(records)
