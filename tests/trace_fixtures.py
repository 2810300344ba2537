"""Traces recorded by real PyTorch runs (gloo, ExecutionTraceObserver), once per test session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "make-traces.py"
JOB = ROOT / "tests" / "jobs" / "parallel_job.py"


# torch 2.13's gloo can abort a rank after the job's work is done and written, while Python
# tears down (a C++ thread left joinable; pytorch/pytorch#179291 describes the mechanism):
# seen once in the doc job (examples/train_and_trace.py under torchrun) and 3 times in ~15
# trace recordings under load, never in 20 runs of the example and 24 recordings on a quiet
# machine. A command that ends so runs once more; any other failure, or the abort twice, fails.
TORCH_TEARDOWN_ABORT = "terminate called without an active exception"


def record_traces(folder: Path, nprocs: int) -> Path:
    """scripts/make-traces.py all -n NPROCS -o FOLDER: one subfolder per workload."""
    command = [sys.executable, str(SCRIPT), "all", "-n", str(nprocs), "-o", str(folder)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0 and TORCH_TEARDOWN_ABORT in done.stderr:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def raw_comm_nodes(path: Path) -> list[dict[str, Any]]:
    """The trace's own list of communication calls: its c10d:: dispatcher nodes, by id."""
    nodes = json.loads(path.read_text())["nodes"]
    return sorted((n for n in nodes if n["name"].startswith("c10d::")), key=lambda n: n["id"])


@pytest.fixture(scope="session")
def traces4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record_traces(tmp_path_factory.mktemp("traces4"), 4)


@pytest.fixture(scope="session")
def traces3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record_traces(tmp_path_factory.mktemp("traces3"), 3)


def record_job(out: Path) -> Path:
    """tests/jobs/parallel_job.py on 4 gloo ranks under torchrun, with the capture helper:
    its trace, capture files and its own list of calls (calls/rank<r>.json) in `out`."""
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "4", str(JOB), str(out), "--capture"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def record_small_job(script: str, nprocs: int, out: Path) -> Path:
    """tests/jobs/SCRIPT OUT on NPROCS gloo ranks under torchrun: its trace in `out`."""
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", str(nprocs), str(ROOT / "tests" / "jobs" / script),
                           str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def parallel_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record_job(tmp_path_factory.mktemp("job"))
