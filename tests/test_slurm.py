"""Sweeps on a real Slurm cluster (the single-node one .ci/slurm-up.sh starts).

    sudo .ci/slurm-up.sh && pytest -m slurm tests/test_slurm.py

Without a scheduler these tests skip with the reason; with CI=true they fail instead, so a CI
run cannot pass while silently not testing Slurm.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from ccbench.records import RecordKey, load_records

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]

GLOO_MPI = """\
name: e2e
backends: [gloo, mpi]
sizes: 8-64
ranks_per_node: 2
modes: [out-of-place]
iters: 3
warmup: 1
results: "res/$(touch pwned) dir"
env: {I_MPI_WAIT_MODE: "1", CCBENCH_NOTE: "'; touch pwned; '"}
"""

SLOW = """\
name: resume
backends: [gloo]
sizes: 8-8K
ranks_per_node: 2
modes: [out-of-place]
iters: 3
warmup: 1
min_time: 0.8
"""


def _scheduler_problem() -> str | None:
    for tool in ("sinfo", "sbatch", "squeue", "scancel"):
        if shutil.which(tool) is None:
            return f"{tool} not found (start the cluster with .ci/slurm-up.sh)"
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                              timeout=20)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 20 s (is slurmctld running?)"
    states = proc.stdout.split()
    if proc.returncode != 0 or not any(s in ("idle", "mixed", "allocated") for s in states):
        return f"no usable Slurm node (sinfo: {(proc.stdout + proc.stderr).strip()!r})"
    return None


def require_slurm() -> None:
    """Skip where Slurm is not up; under CI (which starts it) that is a failure."""
    problem = _scheduler_problem()
    if problem is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Slurm is not up in CI: {problem}", pytrace=False)
    pytest.skip(f"Slurm is not up: {problem}")


@pytest.fixture(scope="module")
def slurm() -> Iterator[None]:
    require_slurm()
    yield
    # a failed test must not leave its jobs running into the next one
    for name in ("e2e", "h", "resume"):
        subprocess.run(["scancel", f"--name=ccbench-{name}"], timeout=20, check=False)


# What an MPI singleton leaves in its environment (Intel MPI's MPI_Init without mpiexec sets
# these in the process, so its children and the jobs they submit inherit them): a test run
# that initialised MPI in-process earlier passes them on. The sweep must not let them reach
# the ranks of a case, where each srun task would take itself for rank 0 of a one-rank world.
MPI_SINGLETON_ENV = {"MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}


def ccbench(*args: str, cwd: Path, timeout: float = 200,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ccbench", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout,
                          env=None if env is None else {**os.environ, **env})


def squeue_ids(name: str) -> list[str]:
    proc = subprocess.run(["squeue", "-h", "-r", f"--name=ccbench-{name}", "-o", "%i"],
                          capture_output=True, text=True, timeout=20)
    return proc.stdout.split()


def squeue_state(job: str) -> str:
    proc = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                          text=True, timeout=20)
    return proc.stdout.strip()


def wait_until(predicate, timeout: float, what: str,  # type: ignore[no-untyped-def]
               poll: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(poll)
    pytest.fail(f"timed out after {timeout:g} s waiting for {what}", pytrace=False)


def test_sweep_gloo_and_mpi_on_slurm(slurm: None, tmp_path: Path) -> None:
    (tmp_path / "e2e.yaml").write_text(GLOO_MPI)
    proc = ccbench("sweep", "e2e.yaml", "--slurm", "--wait", "--wait-timeout", "150",
                   "--max-parallel", "2", cwd=tmp_path, env=MPI_SINGLETON_ENV)
    results = tmp_path / "res" / "$(touch pwned) dir"
    logs = "".join(p.read_text() for p in (results / "logs").glob("*.out")) \
        if (results / "logs").is_dir() else ""
    assert proc.returncode == 0, proc.stdout + proc.stderr + logs
    assert "2 done, 0 running, 0 pending" in proc.stdout
    assert not (tmp_path / "pwned").exists() and not list(tmp_path.rglob("pwned"))

    files = sorted(results.glob("task-*.jsonl"))
    assert [f.name for f in files] == ["task-0.jsonl", "task-1.jsonl"]
    by_file = {f.name: load_records(f) for f in files}
    assert {r.backend for r in by_file["task-0.jsonl"]} == {"gloo"}
    assert {r.backend for r in by_file["task-1.jsonl"]} == {"mpi"}
    records = [r for rs in by_file.values() for r in rs]
    assert sorted((r.backend, r.size_asked) for r in records) == sorted(
        (b, s) for b in ("gloo", "mpi") for s in (8, 16, 32, 64))
    assert all(r.world_size == 2 and r.wrong == 0 for r in records)
    assert {r.backend: r.method["launcher"] for r in records} == {"gloo": "srun",
                                                                  "mpi": "mpiexec"}

    again = ccbench("sweep", "e2e.yaml", "--slurm", "--wait", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "every case is complete; nothing to submit" in again.stdout
    assert len(load_records(results)) == len(records)


def test_hostile_partition_is_refused_by_sbatch(slurm: None, tmp_path: Path) -> None:
    (tmp_path / "h.yaml").write_text("backends: [gloo]\nsizes: 8\n")
    canary = tmp_path / "pwned"
    proc = ccbench("sweep", "h.yaml", "--slurm", "--partition", f"x; touch {canary}",
                   cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"invalid partition specified: x; touch {canary}" in proc.stderr
    assert proc.stderr.startswith("ccbench: error: sbatch refused")
    time.sleep(1)
    assert not canary.exists()
    assert squeue_ids("h") == []


def test_scancel_then_resubmit_finishes_only_what_is_missing(slurm: None,
                                                             tmp_path: Path) -> None:
    (tmp_path / "resume.yaml").write_text(SLOW)
    results = tmp_path / "results" / "resume"
    task_file = results / "task-0.jsonl"
    sizes = [8 << i for i in range(11)]             # 8 B .. 8 KiB

    proc = ccbench("sweep", "resume.yaml", "--slurm", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.split("submitted job ")[1].split(":")[0]

    def some_done() -> bool:
        return task_file.exists() and len(load_records(task_file)) >= 2
    wait_until(some_done, 120, "the first two sizes", poll=0.1)
    # stop the job where it is (SIGSTOP to all its processes): what is left to resume then
    # follows from its progress, not from how long the checks below take
    subprocess.run(["scontrol", "suspend", job], check=True, timeout=20)
    wait_until(lambda: squeue_state(job) == "SUSPENDED", 30, "the job to be suspended")
    at_suspend = len(load_records(task_file))
    assert 2 <= at_suspend < len(sizes), "the job finished before it could be suspended"

    status = ccbench("sweep", "status", "resume.yaml", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert "1 running" in status.stdout, status.stdout     # its task lock is still held
    assert f"{job} suspended" in status.stdout

    twice = ccbench("sweep", "resume.yaml", "--slurm", cwd=tmp_path)
    assert twice.returncode == 2 and f"still has jobs in squeue ({job})" in twice.stderr

    subprocess.run(["scancel", job], check=True, timeout=20)
    wait_until(lambda: not squeue_ids("resume"), 60, "the cancelled job to leave squeue")
    wait_until(lambda: subprocess.run(["pgrep", "-f", str(task_file)],
                                      capture_output=True).returncode != 0,
               30, "the cancelled ranks to exit")
    partial = load_records(task_file)
    assert at_suspend <= len(partial) <= at_suspend + 1 < len(sizes)  # at most a size in flight
    assert len({r.size_asked for r in partial}) == len(partial)
    status = ccbench("sweep", "status", "resume.yaml", cwd=tmp_path)
    assert "0 done, 0 running, 1 pending" in status.stdout, status.stdout
    assert f"{len(partial):>3}/{len(sizes)}" in status.stdout

    proc = ccbench("sweep", "resume.yaml", "--slurm", "--wait", "--wait-timeout", "150",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 done, 0 running, 0 pending" in proc.stdout
    log = "".join(p.read_text() for p in (results / "logs").glob("*.out"))
    assert f"{len(sizes) - len(partial)} sizes:" in log    # only the missing ones were run

    records = load_records(results)
    counts = Counter(RecordKey.of(r) for r in records)
    assert sorted(key.size_asked for key in counts) == sizes
    assert set(counts.values()) == {1}, "a (case, size) was measured twice"

    merged = tmp_path / "merged.jsonl"
    proc = ccbench("merge", str(results), "-o", str(merged), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "0 duplicates dropped" in proc.stderr
    assert sorted(r.size_asked for r in load_records(merged)) == sizes
