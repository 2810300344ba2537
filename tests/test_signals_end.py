"""SIGINT to one rank once its run is done (every record written, the control store closed;
the backend, MPI and the exit handlers still to run): exactly one line naming the rank, exit
status 130, every record kept, nothing left running. Before, the interrupt handler was gone
there: a bare `ccbench: interrupted` and the launcher's 'no rank said why', MPI peers left in
MPI_Finalize until their exit alarm, an `Exception ignored in atexit callback` traceback with
exit status 0 under torchrun. The signal comes from the fault hook (done:RANK:interrupt), so
that it lands in that window every time."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import MPIEXEC, have_mpi
from fault_cells import tagged_processes

from ccbench.errors import is_error_line
from ccbench.records import load_records

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
BOUND_S = 300            # a run of a few small sizes ends well within this on a loaded machine
SIZES = ["allreduce", "--sizes", "1K-8K", "--iters", "3", "--warmup", "1", "-q",
         "--timeout", "20"]


def _run(cmd: list[str], victim: int, out: Path) -> tuple[int, str, list[int]]:
    tag = f"ccbench-end-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([*cmd, "--output", str(out)],
                            env={**os.environ, "CCBENCH_FAULT_TAG": tag, "PYTHONPATH": str(ROOT),
                                 "CCBENCH_FAULT": f"done:{victim}:interrupt"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        err += f"\n(still running after {BOUND_S} s)"
    left = tagged_processes(tag)
    return proc.returncode, err, left


def _check(status: int, err: str, left: list[int], victim: int, out: Path, sizes: int) -> None:
    lines = [line for line in err.splitlines() if is_error_line(line)]
    assert len(lines) == 1, err[-3000:]
    assert f"rank {victim} was interrupted (SIGINT)" in lines[0], err[-3000:]
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
    assert status == 130, (status, err[-3000:])
    assert not left, left
    assert len({r.size_used for r in load_records(str(out))}) == sizes


def test_sigint_to_rank_0_after_its_run_under_launch(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    status, err, left = _run([sys.executable, "-m", "ccbench", "launch", "-n", "3", *SIZES,
                              "--backend", "gloo"], 0, out)
    _check(status, err, left, 0, out, 4)


@pytest.mark.matrix
@pytest.mark.skipif(not have_mpi(), reason="no mpiexec in this environment")
def test_sigint_to_an_mpi_rank_after_its_run_under_launch(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    status, err, left = _run([sys.executable, "-m", "ccbench", "launch", "-n", "3", *SIZES,
                              "--backend", "mpi"], 1, out)
    _check(status, err, left, 1, out, 4)


@pytest.mark.matrix
@pytest.mark.skipif(not have_mpi(), reason="no mpiexec in this environment")
def test_sigint_to_rank_0_after_its_run_under_a_bare_mpiexec(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    status, err, left = _run([MPIEXEC, "-n", "3", sys.executable, "-m", "ccbench", *SIZES,
                              "--backend", "mpi"], 0, out)
    _check(status, err, left, 0, out, 4)


@pytest.mark.matrix
@pytest.mark.parametrize("victim", [0, 1])
def test_sigint_to_a_rank_after_its_run_under_torchrun(tmp_path: Path, victim: int) -> None:
    out = tmp_path / "r.jsonl"
    status, err, left = _run([TORCHRUN, "--nproc-per-node", "3", "-m", "ccbench", *SIZES,
                              "--backend", "gloo"], victim, out)
    lines = [line for line in err.splitlines() if is_error_line(line)]
    assert len(lines) == 1, err[-3000:]
    assert f"rank {victim} was interrupted (SIGINT)" in lines[0], err[-3000:]
    assert "Exception ignored" not in err, err[-3000:]
    assert status != 0 and not left, (status, left)
    assert len({r.size_used for r in load_records(str(out))}) == 4


def test_the_reader_of_the_rows_leaving_is_not_a_fault(tmp_path: Path) -> None:
    """`ccbench launch ... | head`: the reader leaves after a few rows. The run goes on without
    printing, every record is kept, and no rank is blamed. Before, rank 0 left at the broken
    pipe and the others said 'lost the control store; ranks that did not arrive: 0 (dead)'."""
    out = tmp_path / "r.jsonl"
    tag = f"ccbench-pipe-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([sys.executable, "-m", "ccbench", "launch", "-n", "3", "allreduce",
                             "--sizes", "1K-64K", "--iters", "3", "--warmup", "1",
                             "--timeout", "20", "--backend", "gloo", "--output", str(out)],
                            env={**os.environ, "CCBENCH_FAULT_TAG": tag, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for _ in range(8):          # the header and the first row, then the reader leaves
        proc.stdout.readline()
    proc.stdout.close()
    try:
        _, err = proc.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        err += f"\n(still running after {BOUND_S} s)"
    assert not [line for line in err.splitlines() if is_error_line(line)], err[-3000:]
    assert proc.returncode == 0, (proc.returncode, err[-3000:])
    assert not tagged_processes(tag)
    assert len({r.size_used for r in load_records(str(out))}) == 7


_OWN_LINE = """
import sys, time
from ccbench.run.control import ControlClient
from ccbench.run.watchdog import Watchdog

store = ControlClient("127.0.0.1", int(sys.argv[1]), 0, secret=sys.argv[2])
watchdog = Watchdog(store, 0, 2, 600.0)
watchdog.start()
watchdog.enter()                 # interrupted inside an op: blocked as far as its watchdog knows
store.set("aborted", 0)          # its main thread says why and lingers as the store host
for _ in range(2):               # the watchdog looks at 'aborted' right after it posts progress
    watchdog.reached()
    while store.peek("progress/0") != list(watchdog.position):
        time.sleep(0.05)
print("still here", flush=True)
"""


def test_a_ranks_own_line_does_not_make_its_watchdog_leave() -> None:
    """Rank 0 interrupted inside an op (torchrun, SIGINT as the last size finished) sets
    'aborted' as it says why and lingers for the others: its own watchdog took that for
    another rank's line and left quietly (exit 3, no line from any rank)."""
    from ccbench.run.control import ControlServer

    server = ControlServer("127.0.0.1", 0, world_size=2)
    try:
        proc = subprocess.run([sys.executable, "-c", _OWN_LINE, str(server.port), server.secret],
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                              text=True, timeout=BOUND_S)
    finally:
        server.close()
    assert proc.stdout == "still here\n", (proc.returncode, proc.stderr[-3000:])


def test_a_library_message_is_cut_between_words_or_after_a_sentence() -> None:
    """A gloo rank dying mid-run: the line quoted gloo's message cut mid-word at 160
    characters ('... typically caused by a rem; ranks that did not arrive: 1 (dead)')."""
    from ccbench.bench.runner import library_message

    gloo = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] "
                        "Read error [127.0.0.1]:22765: Connection reset by peer. This is "
                        "typically caused by a remote worker dying, please check the logs of the "
                        "remote worker to find out why it stopped and look there\nmore")
    assert library_message(gloo) == "Read error [127.0.0.1]:22765: Connection reset by peer."
    words = library_message(RuntimeError("word " * 60))
    assert words.endswith("word ...") and len(words) <= 164
    assert library_message(RuntimeError("short error\nsecond line")) == "short error"
