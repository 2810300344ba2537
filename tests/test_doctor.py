"""`ccbench doctor`: every backend with available/unavailable and why, library versions, devices
and the launch environment; as a table and as JSON; it never becomes an MPI process."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from conftest import PYTHON, have_mpi, run_ccbench

from ccbench.backends import REGISTRY
from ccbench.backends.base import Backend


def _doctor_json(env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = run_ccbench("doctor", "--format", "json", timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def test_table_names_every_backend_with_a_verdict() -> None:
    proc = run_ccbench("doctor", timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stdout.splitlines()
    for name in REGISTRY:
        row = [line for line in lines if line.split()[:1] == [name]]
        assert row, f"{name} missing from:\n{proc.stdout}"
        assert " available" in row[0] or " unavailable  " in row[0], row[0]
    for section in ("backends", "libraries", "devices", "launch"):
        assert section in lines
    assert "cpu " in proc.stdout and "cores" in proc.stdout


def test_json_report() -> None:
    report = _doctor_json()
    rows = {row["name"]: row for row in report["backends"]}
    assert set(REGISTRY) <= set(rows)
    for row in rows.values():
        assert isinstance(row["available"], bool)
        if not row["available"]:
            assert isinstance(row["reason"], str) and row["reason"].strip(), row
    assert "mpi --device cuda" in rows
    libraries = report["libraries"]
    assert set(libraries) >= {"torch", "mpi", "oneccl", "cupy", "numpy"}
    cpu = report["devices"]["cpu"]
    assert cpu["cores"] >= 1 and cpu["model"]
    assert report["launch"]["launcher"] == "single"
    assert report["launch"]["rank"] == 0 and report["launch"]["world_size"] == 1


def test_json_versions_match_this_machine() -> None:
    report = _doctor_json()
    rows = {row["name"]: row for row in report["backends"]}
    torch = pytest.importorskip("torch")
    assert report["libraries"]["torch"]["version"] == torch.__version__
    if not torch.version.cuda:
        assert rows["nccl"]["available"] is False
        assert "CPU-only" in rows["nccl"]["reason"]
        assert report["devices"]["gpu"]["count"] == 0
    if not getattr(torch.version, "hip", None):
        assert rows["rccl"]["available"] is False
    if rows["gloo"]["available"]:
        assert rows["gloo"]["version"] == f"torch {torch.__version__}"
    if rows["mpi"]["available"]:
        assert "MPI" in rows["mpi"]["version"]
        assert report["libraries"]["mpi"]["library"] == rows["mpi"]["version"]
        assert report["libraries"]["mpi"]["initialized"] is False


def test_algorithm_backends_listed_when_present() -> None:
    algorithmic = pytest.importorskip("ccbench.backends.algorithmic")
    report = _doctor_json()
    names = {row["name"] for row in report["backends"] if row["kind"] == "algorithm"}
    for algorithm in algorithmic.algorithm_names():
        for transport in algorithmic.TRANSPORTS:
            assert f"{algorithm}@{transport}" in names


@pytest.mark.skipif(not have_mpi(), reason="no mpiexec beside python")
def test_doctor_never_initialises_mpi() -> None:
    code = ("from ccbench.commands.doctor import collect\n"
            "collect()\n"
            "from mpi4py import MPI\n"
            "print('initialized', MPI.Is_initialized())\n")
    proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "initialized False" in proc.stdout


def test_mpi_launch_without_rank_variables_is_not_asked() -> None:
    """Only MPI itself could say the rank here, and that needs MPI_Init: doctor says so."""
    report = _doctor_json(env={"PMI_SIZE": "4", "MPI_LOCALRANKID": "1"})
    launch = report["launch"]
    assert launch["launcher"] == "mpiexec" and launch["rank"] is None
    assert "MPI_Init" in launch["note"]


def test_launch_variables_are_read() -> None:
    report = _doctor_json(env={"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                               "CCBENCH_CONTROL": "127.0.0.1:1"})
    launch = report["launch"]
    assert (launch["launcher"], launch["rank"], launch["world_size"]) == ("local", 1, 2)
    assert launch["variables"]["CCBENCH_CONTROL"] == "127.0.0.1:1"


class RaisingBackend(Backend):
    """A backend whose probe breaks the contract (it raises)."""

    name = "raising"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        raise RuntimeError("probe exploded")


def test_broken_backends_are_reported_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    from ccbench.commands import doctor

    monkeypatch.setitem(REGISTRY, "missing", "ccbench.backends.no_such_module:Nothing")
    monkeypatch.setitem(REGISTRY, "raising", f"{__name__}:RaisingBackend")
    monkeypatch.setitem(sys.modules, __name__, sys.modules[__name__])
    missing = doctor._backend("missing", "library")
    assert missing["available"] is False and "no_such_module" in missing["reason"]
    raising = doctor._backend("raising", "library")
    assert raising["available"] is False
    assert "probe raised RuntimeError: probe exploded" in raising["reason"]


def test_unknown_format_is_a_usage_error() -> None:
    proc = run_ccbench("doctor", "--format", "xml", timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("ccbench: error:") and "Traceback" not in proc.stderr
