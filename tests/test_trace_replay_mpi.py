"""Trace replay on MPI and the algorithm backends over it: an uneven all-to-all of bfloat16
(no MPI datatype: its bit patterns travel), the whole sequence of more bound calls than the
executor's binding cache holds (ring@mpi failed with 'Invalid MPI_Request'), and a rank
whose own library call fails named with its own error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import have_mpi, run_ccbench
from tests.et_synth import write_et


def _trace(folder: Path) -> Path:
    """2 ranks: six all-reduces of different sizes, then a bfloat16 uneven all-to-all."""
    calls = []
    for rank in range(2):
        rank_calls = [{"op": "allreduce", "count": n} for n in (3, 5, 7, 9, 11, 13)]
        rank_calls.append({"op": "alltoallv", "dtype": "bfloat16", "count": 4,
                           "in_splits": [1, 2] if rank == 0 else [3, 1],
                           "out_splits": [1, 3] if rank == 0 else [2, 1]})
        calls.append(rank_calls)
    return write_et(folder, calls)


@pytest.mark.skipif(not have_mpi(), reason="mpiexec is not installed")
def test_mpi_bfloat16_alltoallv_and_ring_whole_sequence(tmp_path: Path) -> None:
    summary = tmp_path / "s.json"
    done = run_ccbench("launch", "-n", "2", "replay", str(_trace(tmp_path / "t")), "--backend",
                       "mpi,ring@mpi", "--iters", "2", "--repeat", "2", "--summary",
                       str(summary), "--timeout", "120", timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    by_backend = {b["backend"]: b for b in json.loads(summary.read_text())["backends"]}
    mpi = {op["collective"]: op for op in by_backend["mpi"]["ops"]}
    assert mpi["alltoallv"]["time_us"] > 0 and mpi["alltoallv"]["wrong"] == 0
    ring = by_backend["ring@mpi"]
    assert "no uneven all-to-all" in next(op["reason"] for op in ring["ops"]
                                          if op["collective"] == "alltoallv")
    assert sum(op["time_us"] is not None for op in ring["ops"]) == 6
    assert done.stdout.count("whole sequence (back-to-back), measured") == 2


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_failing_rank_is_named_with_its_own_error(tmp_path: Path, backend: str) -> None:
    if backend == "mpi" and not have_mpi():
        pytest.skip("mpiexec is not installed")
    done = run_ccbench("launch", "-n", "2", "replay", str(_trace(tmp_path / "t")), "--backend",
                       backend, "--iters", "2", "--repeat", "1", "--timeout", "60",
                       env={"CCBENCH_FAULT": "mid-run:1:raise"}, timeout=300)
    errors = [line for line in done.stderr.splitlines() if line.startswith("ccbench: error:")]
    assert done.returncode == 3 and len(errors) == 1, done.stderr[-3000:]
    assert f"rank 1: {backend} failed: injected library error on rank 1" in errors[0]
