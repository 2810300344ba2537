"""A rank killed (or stopped) mid-replay (the trace's whole-sequence phase, CCBENCH_FAULT
mid-run) under `ccbench launch` or torchrun: the run ends, with one error line naming the
rank, no traceback and no process left (the benchmark's guarantees, ccbench.run.faults)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import have_mpi
from fault_cells import Cell, own_traceback, tagged_processes

from ccbench.errors import ERROR_PREFIX
from ccbench.run.supervisor import kill_group

NO_HANG_S = 5 + 30 + 180      # a loaded machine is slow, never stuck


@pytest.mark.parametrize("backends,action,launcher", [
    ("gloo", "kill", "launch"), ("gloo,mpi", "kill", "launch"), ("gloo", "stop", "launch"),
    ("gloo", "kill", "torchrun"), ("mpi", "kill", "mpiexec")])
def test_rank_killed_mid_replay_is_named_in_one_line(parallel_job: Path, tmp_path: Path,
                                                     backends: str, action: str,
                                                     launcher: str) -> None:
    if "mpi" in backends and not have_mpi():
        pytest.skip("mpiexec is not installed")
    tag = f"ccbench-fault-{uuid.uuid4().hex[:10]}"
    log = tmp_path / "fault.time"
    env = {**os.environ, "CCBENCH_FAULT": f"mid-run:1:{action}",
           "CCBENCH_FAULT_LOG": str(log), "CCBENCH_FAULT_TAG": tag}
    cell = Cell(backends, 4, 1, action, "mid-run", launcher, sys.executable)
    cmd = cell.command(["replay", str(parallel_job), "--backend", backends, "--iters", "1",
                        "--repeat", "2", "--timeout", "5", "-q", "-O",
                        str(tmp_path / "r.jsonl")])
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=NO_HANG_S)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        proc.communicate()
        pytest.fail("the replay was still running at the bound")
    left = tagged_processes(tag)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert log.exists(), "the fault never happened"
    assert proc.returncode not in (0, None)
    assert not left, f"processes left: {left}"
    # no traceback through ccbench's code (torchrun prints its own when a worker dies)
    assert not own_traceback(stderr), stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith(ERROR_PREFIX)]
    assert len(errors) == 1, stderr[-3000:]
    named = re.search(r"did not arrive: (.*)$", errors[0])      # as ccbench.run.faults judges
    assert named and re.findall(r"(?<![\w.:])(\d+)(?![\w.:])", named.group(1)) == ["1"], \
        errors[0]
    assert "whole sequence" in errors[0]                         # the step it stopped in


def test_disk_full_mid_replay_is_one_line_and_keeps_whole_records(parallel_job: Path,
                                                                  tmp_path: Path) -> None:
    """-O on a full file system: one line naming the file, no rank blamed as dead, only
    whole records left (as the benchmark, ccbench.bench.runner.append_output)."""
    from ccbench.records import load_records

    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(mount)],
                          capture_output=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.decode().strip()}")
    try:
        out = mount / "r.jsonl"
        proc = subprocess.run([sys.executable, "-m", "ccbench", "launch", "-n", "4", "replay",
                               str(parallel_job), "--backend", "gloo", "--iters", "1",
                               "--repeat", "1", "-q", "-O", str(out)],
                              capture_output=True, text=True, timeout=NO_HANG_S)
        assert proc.returncode not in (0, None)
        errors = [line for line in proc.stderr.splitlines() if line.startswith(ERROR_PREFIX)]
        assert len(errors) == 1 and "No space left on device" in errors[0], proc.stderr
        assert "dead" not in proc.stderr and "Traceback" not in proc.stderr
        assert out.read_bytes().endswith(b"\n")
        assert len(load_records(out)) >= 1
    finally:
        subprocess.run(["umount", str(mount)], check=False)
