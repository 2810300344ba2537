"""algorithms/ schedules over real transports, compared bit for bit with the transport's
native collectives: MPI (mpiexec, 1..5 ranks) and gloo (torch.distributed, 2 and 3 ranks).
Each rank runs tests/test_algorithms_worker.py."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ccbench.run.addresses import free_port

ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = Path(sys.executable).parent / "mpiexec"
WORKER = "tests.test_algorithms_worker"


def _summary(out: str, p: int) -> None:
    """Every rank reported, checked something, and found nothing wrong (ranks' lines may
    interleave, so parse by pattern)."""
    found = re.findall(r"rank (\d+)/(\d+): (\d+) checked, (\d+) wrong", out)
    assert sorted(int(r) for r, *_ in found) == list(range(p)), out
    for _, world, checked, wrong in found:
        assert int(world) == p and int(checked) > 0 and int(wrong) == 0, out


@pytest.mark.slow
@pytest.mark.skipif(not MPIEXEC.exists() or importlib.util.find_spec("mpi4py") is None,
                    reason="needs mpi4py and mpiexec beside the interpreter")
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5])
def test_schedules_over_mpi_match_native(p: int) -> None:
    # every dtype and three sizes at 2 ranks; three dtypes and two sizes elsewhere (the
    # thread-transport tests cover every dtype x op at p = 1..8)
    env = {**os.environ, **({} if p == 2 else {"CCBENCH_WORKER_QUICK": "1"})}
    proc = subprocess.run([str(MPIEXEC), "-n", str(p), sys.executable, "-m", WORKER, "mpi"],
                          cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _summary(proc.stdout, p)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
@pytest.mark.parametrize("p", [2, 3])
def test_schedules_over_gloo_match_native(p: int) -> None:
    port = free_port("127.0.0.1")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "WORLD_SIZE": str(p), "CCBENCH_WORKER_QUICK": "1", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", WORKER, "gloo"], cwd=ROOT,
                              env={**env, "RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(p)]
    outs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=240)
            outs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert all(proc.returncode == 0 for proc in procs), "\n".join(outs)
    _summary("\n".join(outs), p)
