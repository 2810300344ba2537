"""Failures that must end in one line, not a traceback, and with that line last: Ctrl-C while
a rank (or the launcher) still imports, a control port taken between its choice and its bind,
a failed `ccbench launch` that kept records."""

from __future__ import annotations

import builtins
import importlib
import os
import runpy
import socket
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_ccbench

_REAL_IMPORT = builtins.__import__


def _console_script() -> None:
    """What the installed `ccbench` command runs (its console-script entry point)."""
    from importlib.metadata import entry_points

    (script,) = entry_points(group="console_scripts", name="ccbench")
    module, _, function = script.value.partition(":")
    getattr(importlib.import_module(module), function)()


@pytest.mark.parametrize("start", [
    lambda: runpy.run_module("ccbench", run_name="__main__"), _console_script],
    ids=["python -m ccbench", "console script"])
def test_interrupt_while_importing_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str],
                                               start: Any) -> None:
    def interrupted_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "ccbench.cli":
            raise KeyboardInterrupt
        return _REAL_IMPORT(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", interrupted_import)
    with pytest.raises(SystemExit) as end:
        try:
            start()
        except KeyboardInterrupt:
            pytest.fail("KeyboardInterrupt came out of `python -m ccbench` (a traceback)")
    assert end.value.code == 130
    assert capsys.readouterr().err == "ccbench: interrupted\n"


# every rank stops inside `import ccbench.cli`; once all are there, rank 0 sends the launcher
# SIGINT (a Ctrl-C), which the launcher passes on to them (bounded: 120 s, then they go on)
_HOOK = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path

    class _Hook:
        def find_spec(self, name, path=None, target=None):
            if name != "ccbench.cli" or os.environ.get("RANK") is None:
                return None
            sys.meta_path.remove(self)
            here = Path(os.environ["HOOK_DIR"])
            (here / os.environ["RANK"]).touch()
            if os.environ["RANK"] == "0":
                deadline = time.monotonic() + 120
                while (len(list(here.iterdir())) < int(os.environ["WORLD_SIZE"])
                       and time.monotonic() < deadline):
                    time.sleep(0.05)
                os.kill(int(os.environ["CCBENCH_LAUNCHER_PID"]), signal.SIGINT)
            time.sleep(120)
            return None

    sys.meta_path.insert(0, _Hook())
""")


def test_launch_interrupted_while_ranks_import(tmp_path: Path) -> None:
    hooks, arrived = tmp_path / "hooks", tmp_path / "arrived"
    hooks.mkdir()
    arrived.mkdir()
    (hooks / "sitecustomize.py").write_text(_HOOK)
    path = os.pathsep.join(p for p in (str(hooks), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": path, "HOOK_DIR": str(arrived)}
    result = run_ccbench("launch", "-n", "2", "allreduce", "--backend", "gloo", "--sizes",
                         "1K", "-O", str(tmp_path / "r.jsonl"), timeout=240, env=env)
    assert sorted(p.name for p in arrived.iterdir()) == ["0", "1"]
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("ccbench")]
    assert lines == ["ccbench: error: interrupted (SIGINT); the ranks were stopped"], \
        result.stderr
    assert result.returncode == 130


def test_failed_launch_names_its_records_before_the_error_line(tmp_path: Path) -> None:
    """Rank 1 exits at the third size: the records of the first two are kept, said before the
    error line, which stays the last line (docs/design/failures.md)."""
    result = run_ccbench("launch", "-n", "2", "allreduce", "--backend", "gloo", "--sizes",
                         "1K-16K", "--iters", "2", "--warmup", "1", "-q", timeout=240,
                         env={"CCBENCH_RESULTS": str(tmp_path), "CCBENCH_FAULT": "mid-run:1:exit"})
    assert result.returncode != 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("ccbench")]
    assert len(lines) >= 2 and lines[-1].startswith("ccbench: error: "), result.stderr
    kept = sorted(tmp_path.glob("*.jsonl"))
    assert len(kept) == 1 and kept[0].read_text().strip(), result.stderr
    assert lines[-2].startswith(f"ccbench: records so far in {kept[0]}; "), result.stderr
    assert sum("records" in line and " in " in line for line in lines) == 1, result.stderr


def test_a_control_port_taken_before_the_bind_is_replaced(monkeypatch: pytest.MonkeyPatch,
                                                          capfd: pytest.CaptureFixture[str]
                                                          ) -> None:
    """The launcher's first choice of port is taken (by a listener here) before it binds it:
    it binds a fresh one, which rank 0's store listens on, and the run goes through."""
    from ccbench.run import supervisor
    from ccbench.run.addresses import free_port

    with socket.create_server(("127.0.0.1", 0)) as taken:
        choices = [taken.getsockname()[1]]
        monkeypatch.setattr(supervisor, "free_port",
                            lambda host: choices.pop() if choices else free_port(host))
        status = supervisor.run_ranks(2, ["allreduce", "--backend", "gloo", "--sizes", "1K",
                                          "--iters", "2", "--warmup", "1", "-q", "--no-output"],
                                      False, None, 20.0)
    err = capfd.readouterr().err
    assert status == 0 and not choices, err
    assert "Traceback" not in err and "ccbench: error" not in err, err


def test_a_taken_control_port_of_hand_started_ranks_is_one_line(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = run_ccbench("allreduce", "--backend", "gloo", "--sizes", "1K", "--no-output",
                             timeout=120, env={"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                                               "LOCAL_WORLD_SIZE": "1",
                                               "CCBENCH_CONTROL": f"127.0.0.1:{port}",
                                               "CCBENCH_CONTROL_SECRET": "ab" * 32})
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"ccbench: error: start-up: the control port 127.0.0.1:{port} is taken by another "
        f"process (EADDRINUSE): choose a free port for CCBENCH_CONTROL, or let `ccbench launch` "
        f"choose one"], result.stderr
