"""Bad input: one line `ccbench: error: ...`, exit status 2, no traceback."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, run_ccbench

CASES = {
    "unknown collective": (["allsum", "--sizes", "1K"], "unknown collective 'allsum'"),
    "unknown backend": (["allreduce", "--backend", "foo"], "unknown backend 'foo'"),
    "unknown dtype": (["allreduce", "--dtype", "float8"], "unknown dtype 'float8'"),
    "unknown op": (["allreduce", "--op", "avg"], "unknown op 'avg'"),
    "malformed sizes": (["allreduce", "--sizes", "1Q"], "malformed size '1Q'"),
    "empty sizes": (["allreduce", "--sizes", ""], "empty --sizes"),
    "zero size": (["allreduce", "--sizes", "0"], "size must be positive"),
    "negative size": (["allreduce", "--sizes", "-8"], "is negative"),
    "too large": (["allreduce", "--sizes", "4T"], "GiB is free"),
    "bad iters": (["allreduce", "--iters", "0"], "--iters must be > 0"),
    "unknown flag": (["allreduce", "--bogus"], "unrecognized arguments"),
    "bad timing": (["allreduce", "--timing", "fast"], "invalid choice"),
    "launch without ranks": (["launch", "allreduce"], "required"),
    "launch bad collective": (["launch", "-n", "2", "nope"], "unknown collective 'nope'"),
}


def assert_one_line_error(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ccbench: error: "), lines
    assert needle in lines[0], lines
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input(name: str) -> None:
    args, needle = CASES[name]
    assert_one_line_error(run_ccbench(*args, timeout=120), needle)


def test_valid_choices_are_listed() -> None:
    proc = run_ccbench("allreduce", "--dtype", "float8")
    assert "float32" in proc.stderr and "bfloat16" in proc.stderr
    proc = run_ccbench("allreduce", "--backend", "foo")
    assert "gloo" in proc.stderr and "mpi" in proc.stderr


def test_missing_library_is_unavailable(tmp_path: Path) -> None:
    """An mpi4py whose libmpi cannot load: 'unavailable: <why>', exit 2."""
    fake = tmp_path / "fake" / "mpi4py"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise ImportError('libmpi.so.12: cannot open shared object file')\n")
    env = {"PYTHONPATH": str(tmp_path / "fake")}
    proc = run_ccbench("allreduce", "--backend", "mpi", "--sizes", "1K", env=env)
    assert_one_line_error(proc, "backend 'mpi' unavailable")
    proc = run_ccbench("launch", "-n", "2", "allreduce", "--backend", "mpi", env=env)
    assert_one_line_error(proc, "cannot load an MPI library")


def test_ranks_with_different_arguments(tmp_path: Path) -> None:
    """Two ranks started by hand with different --sizes are refused at start."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank, sizes in ((0, "1K"), (1, "2K")):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "CCBENCH_CONTROL": f"127.0.0.1:{port}"}
        procs.append(subprocess.Popen(
            [PYTHON, "-m", "ccbench", "allreduce", "--backend", "gloo", "--sizes", sizes, "-q"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [2, 2]
    rank0_err = results[0][1]
    assert_one_line_error(subprocess.CompletedProcess([], 2, results[0][0], rank0_err),
                          "ranks launched with different arguments")
    assert results[1][1].strip() == ""          # only rank 0 speaks
