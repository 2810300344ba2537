"""Shared helpers: run ccbench as a real subprocess, the way users do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

PYTHON = sys.executable

# a measuring run that names no --output keeps its records in a new file of ccbench-results/
# in its working directory, or of the folder CCBENCH_RESULTS names: for the tests, a folder of
# their own (tests of that default unset it), never the checkout
if "CCBENCH_RESULTS" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["CCBENCH_RESULTS"] = tempfile.mkdtemp(prefix="ccbench-test-results-")
    atexit.register(shutil.rmtree, os.environ["CCBENCH_RESULTS"], ignore_errors=True)
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")


def run_ccbench(*args: str, timeout: float = 300, env: dict[str, str] | None = None,
                cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "ccbench", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=cwd)


class _ForkServer:
    """tests/cli_server.py, started at first use and kept for the session."""

    proc: subprocess.Popen[bytes] | None = None
    pending = b""

    @classmethod
    def _line(cls, timeout: float | None = None) -> dict | None:
        """The server's next answer, or None when none came within `timeout` seconds."""
        import json
        import select
        import time

        assert cls.proc and cls.proc.stdout
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in cls.pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([cls.proc.stdout], [], [], left)[0]:
                return None
            chunk = os.read(cls.proc.stdout.fileno(), 4096)
            assert chunk, "tests/cli_server.py ended"
            cls.pending += chunk
        line, _, cls.pending = cls.pending.partition(b"\n")
        return json.loads(line)

    @classmethod
    def run(cls, argv: list[str], env: dict[str, str], cwd: str,
            timeout: float) -> subprocess.CompletedProcess[str]:
        import json
        import signal
        import tempfile

        if cls.proc is None or cls.proc.poll() is not None:
            cls.proc = subprocess.Popen([PYTHON, str(Path(__file__).with_name("cli_server.py"))],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
            cls.pending = b""
        assert cls.proc.stdin
        with tempfile.TemporaryDirectory() as folder:
            out, err = Path(folder, "stdout"), Path(folder, "stderr")
            request = {"argv": argv, "env": env, "cwd": cwd, "stdout": str(out),
                       "stderr": str(err)}
            cls.proc.stdin.write(json.dumps(request).encode() + b"\n")
            pid = cls._line()["pid"]
            answer = cls._line(timeout)
            if answer is None:
                os.kill(pid, signal.SIGKILL)
                cls._line()
                raise subprocess.TimeoutExpired(["ccbench", *argv], timeout)
            return subprocess.CompletedProcess([PYTHON, "-m", "ccbench", *argv],
                                               answer["status"], out.read_text(),
                                               err.read_text())


def run_ccbench_forked(*args: str, timeout: float = 300, env: dict[str, str] | None = None,
                       cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """run_ccbench in a fork of one Python that has imported ccbench and torch already: the
    same argv, environment, folder, output and exit status, without a Python start per call.
    For command-line checks; a run whose interpreter start matters (PYTHON* variables, the
    package it imports) goes through run_ccbench."""
    if any(name.startswith("PYTHON") for name in env or {}):
        return run_ccbench(*args, timeout=timeout, env=env, cwd=cwd)
    return _ForkServer.run(list(args), {**os.environ, **(env or {})}, cwd or os.getcwd(),
                           timeout)


def have_mpi() -> bool:
    return Path(MPIEXEC).exists()


@pytest.fixture
def tmp_results(tmp_path: Path) -> Path:
    return tmp_path / "results.jsonl"

# real PyTorch execution traces, recorded once per session (tests/trace_fixtures.py)
from tests.trace_fixtures import parallel_job, traces3, traces4  # noqa: E402, F401


def missing_prerequisite(reason: str) -> None:
    """A test that cannot run here: skipped with the reason, but failed under CI=true, so a CI
    run cannot pass while silently not running it (.ci/run installs everything these need)."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


# what a clone cannot install for itself, and how many tests it kept from running
_NOT_RUN: dict[str, int] = {}


def missing_outside_tool(reason: str) -> None:
    """A test that needs a tool built outside this repository (the ASTRA-sim binaries, which
    .ci/run cannot install): skipped even under CI=true, because a fresh clone must pass its
    tests, and counted in one line at the end of the run so the gap is never silent."""
    _NOT_RUN[reason] = _NOT_RUN.get(reason, 0) + 1
    pytest.skip(reason)


def need_astra_sim(*names: str) -> None:
    """Skip (see missing_outside_tool) unless the named ASTRA-sim binaries are found."""
    from ccbench.formats.astra import astra_bin_dir

    folder = astra_bin_dir()
    if not all((folder / name).is_file() for name in names):
        missing_outside_tool(f"the ASTRA-sim binaries are not in {folder}: set "
                             "CCBENCH_ASTRA_SIM_BIN to their folder (scripts/build-astra-sim.sh "
                             "builds them)")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for reason, count in _NOT_RUN.items():
        terminalreporter.write_line(f"not run: {count} tests, because {reason}")
