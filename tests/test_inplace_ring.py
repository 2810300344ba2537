"""ring@mpi in place over many iterations (issue 29): a healthy run prints no numpy overflow
warning, and its check still finds every element right."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from conftest import run_ccbench

MPIEXEC = Path(sys.executable).parent / "mpiexec"


@pytest.mark.skipif(not MPIEXEC.exists() or importlib.util.find_spec("mpi4py") is None,
                    reason="needs mpi4py and mpiexec beside the interpreter")
def test_ring_in_place_with_many_iterations_warns_nothing(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    done = run_ccbench("launch", "-n", "2", "allreduce", "--backend", "ring@mpi", "--inplace",
                       "--iters", "200", "--sizes", "1K", "--dtype", "float32,float16",
                       "--output", str(out), "--quiet", timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "RuntimeWarning" not in done.stderr and "overflow" not in done.stderr, done.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2 and all(r["wrong"] == 0 and r["iterations"] == 200
                                     for r in records)
