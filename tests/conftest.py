"""Shared helpers: run ccbench as a real subprocess, the way users do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PYTHON = sys.executable
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")


def run_ccbench(*args: str, timeout: float = 300, env: dict[str, str] | None = None,
                cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "ccbench", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=cwd)


def have_mpi() -> bool:
    return Path(MPIEXEC).exists()


@pytest.fixture
def tmp_results(tmp_path: Path) -> Path:
    return tmp_path / "results.jsonl"

# real PyTorch execution traces, recorded once per session (tests/trace_fixtures.py)
from tests.trace_fixtures import parallel_job, traces3, traces4  # noqa: E402, F401


def missing_prerequisite(reason: str) -> None:
    """A test that cannot run here: skipped with the reason, but failed under CI=true, so a CI
    run cannot pass while silently not running it."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)
