"""`ccbench sweep FILE` on this machine (the built-in launcher), with resume from a file that
already holds one size and ends in a torn line, then a rerun that measures nothing."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import have_mpi
from test_sweep import make_record

from ccbench.records import RecordKey, append_record, load_records

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SWEEP = """\
name: local
backends: [mpi]
sizes: 8-32
ranks_per_node: [2]
modes: [out-of-place]
iters: 3
warmup: 1
"""


def test_local_sweep_resumes_and_is_idempotent(tmp_path: Path) -> None:
    if not have_mpi():
        pytest.skip("mpiexec not installed beside python")
    (tmp_path / "local.yaml").write_text(SWEEP)
    results = tmp_path / "results" / "local"
    results.mkdir(parents=True)
    earlier = make_record(backend="mpi", library="Intel MPI", transport="mpi", size_asked=8)
    append_record(results / "task-0.jsonl", earlier)
    with open(results / "task-0.jsonl", "a") as handle:
        handle.write('{"schema":"ccbench.record","sch')       # a killed writer's last line

    def sweep() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ccbench", "sweep", "local.yaml"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=240)

    proc = sweep()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "launch -n 2 allreduce --backend mpi --sizes 16,32 " in proc.stdout
    assert "1 cases: 1 done, 0 running, 0 pending" in proc.stdout
    records = load_records(results)
    assert Counter(r.size_asked for r in records) == {8: 1, 16: 1, 32: 1}
    assert len({RecordKey.of(r) for r in records}) == 3

    again = sweep()
    assert again.returncode == 0, again.stderr
    assert "1 complete, 0 runs to do" in again.stdout
    assert len(load_records(results)) == 3
