"""Each backend makes its own sub-communicators (`Backend.groups`): a recorded job with two
process-group layouts replays on MPI, an algorithm over MPI and oneCCL, every call of every
group measured and bit-exact; an algorithm over gloo says why it has none."""

from __future__ import annotations

import json
from pathlib import Path

from ccbench.backends import backend_class
from ccbench.records import load_records
from tests.conftest import have_mpi, missing_prerequisite, run_ccbench


def test_every_backend_replays_the_groups_on_its_own_sub_communicators(traces4: Path,
                                                                       tmp_path: Path) -> None:
    if not have_mpi():
        missing_prerequisite("mpiexec is not installed")
    backends = ["mpi", "ring@mpi", "ring@gloo"]
    if backend_class("oneccl").unavailable_reason() is None:
        backends.append("oneccl")
    out, summary = tmp_path / "rec.jsonl", tmp_path / "summary.json"
    done = run_ccbench("launch", "-n", "4", "replay", str(traces4 / "groups"), "--backend",
                       ",".join(backends), "-O", str(out), "--summary", str(summary),
                       "--iters", "2", "--repeat", "1", timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    records = load_records(out)
    for name in ("mpi", "ring@mpi", "oneccl"):
        if name not in backends:
            continue
        mine = [r for r in records if r.backend == name]
        assert len(mine) == 13 and all(r.wrong == 0 for r in mine), name
        assert sorted(r.world_size for r in mine).count(2) == 12, name
    rows = {b["backend"]: b for b in json.loads(summary.read_text())["backends"]}
    grouped = [op for op in rows["ring@gloo"]["ops"] if len(op["group"]) == 2]
    assert len(grouped) == 12
    assert all(op["time_us"] is None and "gloo has no point-to-point messages on a "
               "sub-communicator" in op["reason"] for op in grouped)
