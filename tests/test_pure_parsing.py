"""Parsing is pure: a command line is validated without changing the process (no library
environment, no MPI thread level); the rank applies what its backends' libraries read from
the process (`Backend.prepare_process`), and the launcher parses the benchmark once."""

from __future__ import annotations

import os
from typing import Any

import pytest

from ccbench.backends import prepare_process
from ccbench.backends.options import BackendOptions
from ccbench.cli import bench_parser, config_from_args


def _unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variables unset for the test, and restored after it (whatever it set)."""
    for name in ("NCCL_ALGO", "NCCL_PROTO", "MPI4PY_RC_THREAD_LEVEL"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def _process_state() -> dict[str, Any]:
    import mpi4py

    return {"environ": dict(os.environ), "thread_level": mpi4py.rc.thread_level}


def test_config_from_args_leaves_the_process_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mpi4py")
    _unset(monkeypatch)
    before = _process_state()
    argv = ["allreduce", "--backend", "nccl,mpi", "--nccl-algo", "Ring", "--nccl-proto",
            "Simple", "--mpi-thread-level", "single", "--device", "cpu", "--sizes", "1K"]
    config = config_from_args(bench_parser().parse_args(argv), argv)
    assert _process_state() == before
    # what the rank will apply travels in the config
    options = BackendOptions.from_mapping(config.options or {})
    assert (options.nccl_algo, options.nccl_proto, options.mpi_thread_level) == \
        ("Ring", "Simple", "single")


def test_the_rank_applies_what_its_backends_read(monkeypatch: pytest.MonkeyPatch) -> None:
    mpi4py = pytest.importorskip("mpi4py")
    _unset(monkeypatch)
    monkeypatch.setattr(mpi4py.rc, "thread_level", mpi4py.rc.thread_level)
    options = BackendOptions(nccl_algo="Ring", mpi_thread_level="serialized")
    prepare_process(["gloo"], "cpu", options)             # gloo reads neither
    assert "NCCL_ALGO" not in os.environ and mpi4py.rc.thread_level != "serialized"
    prepare_process(["nccl", "ring@mpi"], "cpu", options)   # an algorithm: its transport's
    assert os.environ["NCCL_ALGO"] == "Ring" and "NCCL_PROTO" not in os.environ
    assert mpi4py.rc.thread_level == "serialized"


def test_the_launcher_plans_every_command_through_one_interface(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`ccbench launch` asks the command the ranks run for its plan (the measurement's, or
    diagnose's own), parsing the benchmark's arguments once; main names no subcommand."""
    import ast
    import inspect

    import ccbench.cli
    from ccbench.commands import launch
    from ccbench.run.supervisor import LaunchPlan

    parsed = []
    real = ccbench.cli.bench_parser

    def counting(*args: Any, **kwargs: Any) -> Any:
        parsed.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(ccbench.cli, "bench_parser", counting)
    plan = launch._planner("allreduce")(["allreduce", "--backend", "gloo", "--no-output"], 3)
    assert isinstance(plan, LaunchPlan) and len(parsed) == 1
    assert (plan.backends, plan.nprocs, plan.one_launch, plan.saved) == (["gloo"], 3, False, None)
    plan = launch._planner("diagnose")(["diagnose", "--quick"], None)
    assert (plan.argv, plan.backends, plan.nprocs) == (["diagnose", "--quick"], ["gloo"], 2)
    words = {node.value for node in ast.walk(ast.parse(inspect.getsource(launch.main)))
             if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert not words & {"replay", "diagnose"}
