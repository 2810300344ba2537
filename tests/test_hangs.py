"""A rank interrupted or stopped mid-run never holds the rest (docs/design/failures.md): the run
ends with one line naming that rank and leaves no process, under `ccbench launch`, a bare
mpiexec and torchrun. Waits are bounded (minutes); nothing here asserts a time. The measured
seconds are printed (`pytest -s`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import MPIEXEC, have_mpi
from fault_cells import tagged_processes

from ccbench.errors import is_error_line
from ccbench.records import load_records
from ccbench.run import procfs

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
BOUND_S = 240            # a run that should end within seconds of the fault is given this long
# long enough to be mid-run for minutes: the fault comes once the first record is written
BENCH = ["allreduce", "--sizes", "1K-1M", "--iters", "2000", "--warmup", "2", "-q",
         "--timeout", "10"]


def _start(cmd: list[str], tag: str) -> subprocess.Popen[str]:
    return subprocess.Popen(cmd, env={**os.environ, "CCBENCH_FAULT_TAG": tag,
                                      "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _rank_pid(tag: str, rank: int, rank_var: str) -> int:
    """The rank's own process (the first with its rank variable: not its MPI_Init guard)."""
    for pid in sorted(tagged_processes(tag)):
        env = procfs.environ(pid) or {}
        stat = procfs.stat(pid)
        parent_env = (procfs.environ(stat[0]) or {}) if stat else {}
        if env.get(rank_var.encode()) == str(rank).encode() \
                and rank_var.encode() not in parent_env:
            return pid
    raise AssertionError(f"no process of rank {rank}")


def _mid_run(out: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and out.read_bytes().count(b"\n") >= 1:
            return
        time.sleep(0.2)
    raise AssertionError(f"no record within {BOUND_S} s (exit {proc.poll()})")


def _end(proc: subprocess.Popen[str], tag: str, since: float) -> tuple[str, list[int]]:
    """stderr once the run ended (bounded), and the processes it left (none expected)."""
    try:
        _, err = proc.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        err += f"\n(still running {BOUND_S} s after the fault)"
    deadline = time.monotonic() + 30
    left = tagged_processes(tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = tagged_processes(tag)
    print(f"\nended {time.monotonic() - since:.1f} s after the fault, exit {proc.returncode}")
    for pid in tagged_processes(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return err, left


def _fault(cmd: list[str], rank_var: str, action: signal.Signals, out: Path,
           target: str = "rank") -> tuple[subprocess.Popen[str], str, list[int]]:
    tag = f"ccbench-hang-{uuid.uuid4().hex[:8]}"
    proc = _start([*cmd, "--output", str(out)], tag)
    try:
        _mid_run(out, proc)
        victim = proc.pid if target == "launcher" else _rank_pid(tag, 1, rank_var)
        os.kill(victim, action)
        since = time.monotonic()
    finally:
        if proc.poll() is None and "since" not in locals():
            proc.kill()
    err, left = _end(proc, tag, since)
    return proc, err, left


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if is_error_line(line)]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


@pytest.mark.skipif(not have_mpi(), reason="no mpiexec in this environment")
def test_sigint_to_one_mpi_rank_under_launch(tmp_path: Path) -> None:
    """Before: the rank sat in MPI_Finalize for ever, and the launcher, mpiexec and its proxy
    with it."""
    out = tmp_path / "r.jsonl"
    proc, err, left = _fault([sys.executable, "-m", "ccbench", "launch", "-n", "2", *BENCH,
                              "--backend", "mpi"], "PMI_RANK", signal.SIGINT, out)
    assert left == [], err[-3000:]
    assert "rank 1 was interrupted (SIGINT)" in _one_line(err)
    assert proc.returncode != 0
    assert load_records(out)                         # the sizes before are kept, whole


@pytest.mark.skipif(not have_mpi(), reason="no mpiexec in this environment")
def test_a_stopped_rank_under_bare_mpiexec(tmp_path: Path) -> None:
    """Before: mpiexec, its proxy and the store host waited for the stopped rank for ever."""
    out = tmp_path / "r.jsonl"
    proc, err, left = _fault([MPIEXEC, "-n", "2", sys.executable, "-m", "ccbench", *BENCH,
                              "--backend", "mpi"], "PMI_RANK", signal.SIGSTOP, out)
    assert left == [], err[-3000:]
    assert "ranks that did not arrive: 1 (stopped)" in _one_line(err)
    assert proc.returncode != 0


@pytest.mark.matrix
@pytest.mark.skipif(not have_mpi(), reason="no mpiexec in this environment")
def test_sigint_to_a_bare_mpiexec(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    proc, err, left = _fault([MPIEXEC, "-n", "2", sys.executable, "-m", "ccbench", *BENCH,
                              "--backend", "mpi"], "PMI_RANK", signal.SIGINT, out,
                             target="launcher")
    assert left == [], err[-3000:]
    assert "was interrupted (SIGINT)" in _one_line(err)


@pytest.mark.matrix
@pytest.mark.skipif(not have_mpi(), reason="no mpiexec in this environment")
def test_sigint_to_one_ring_rank_under_launch(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    proc, err, left = _fault([sys.executable, "-m", "ccbench", "launch", "-n", "2", *BENCH,
                              "--backend", "ring@mpi"], "PMI_RANK", signal.SIGINT, out)
    assert left == [], err[-3000:]
    assert "rank 1 was interrupted (SIGINT)" in _one_line(err)


@pytest.mark.matrix
def test_a_stopped_rank_under_torchrun(tmp_path: Path) -> None:
    """Before: torchrun's SIGTERM waited on the stopped rank and its SIGKILL came 30 s later."""
    out = tmp_path / "r.jsonl"
    proc, err, left = _fault([TORCHRUN, "--nproc-per-node", "2", "-m", "ccbench", *BENCH,
                              "--backend", "gloo"], "RANK", signal.SIGSTOP, out)
    assert left == [], err[-3000:]
    assert "ranks that did not arrive: 1 (stopped)" in _one_line(err)


@pytest.mark.matrix
def test_sigterm_to_torchrun_says_the_launcher_stopped_the_run(tmp_path: Path) -> None:
    """torchrun passes SIGTERM to every rank: no rank died, so none is named dead (it said
    'a rank died ... 2 (dead)' once the first rank to leave had gone)."""
    out = tmp_path / "r.jsonl"
    _, err, left = _fault([TORCHRUN, "--nproc-per-node", "3", "-m", "ccbench", *BENCH,
                           "--backend", "gloo"], "RANK", signal.SIGTERM, out, target="launcher")
    assert left == [], err[-3000:]
    line = _one_line(err)
    assert "the launcher stopped the run (SIGTERM" in line and "dead" not in line, line


@pytest.mark.matrix
@pytest.mark.parametrize(("world", "victim"), [("2", "0"), ("2", "1"), ("3", "2")])
def test_sigint_to_one_rank_under_torchrun(tmp_path: Path, world: str, victim: str) -> None:
    """torchrun passes every rank's lines on: the interrupted rank's is the only one (rank 0,
    which hosts the store, stays until the others have read that it was said; with 3 ranks,
    rank 1 said 'lost the control store' once rank 0 had left)."""
    tag = f"ccbench-hang-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "r.jsonl"
    proc = _start([TORCHRUN, "--nproc-per-node", world, "-m", "ccbench", *BENCH, "--backend",
                   "gloo", "--output", str(out)], tag)
    _mid_run(out, proc)
    os.kill(_rank_pid(tag, int(victim), "RANK"), signal.SIGINT)
    err, left = _end(proc, tag, time.monotonic())
    assert left == [], err[-3000:]
    assert f"rank {victim} was interrupted (SIGINT)" in _one_line(err)


_SIBLING = """
import time
print("ready", flush=True)
time.sleep(600)
"""
_SPEAKER = """
import json, os, subprocess, sys, time
from ccbench.run.stopped import end, stopped_peers
print(json.dumps(stopped_peers(sys.argv[1], 0, 3)), flush=True)
end(stopped_peers(sys.argv[1], 0, 3))
"""
_AGENT = """
import os, signal, subprocess, sys, time
env = {**os.environ, "TORCHELASTIC_RUN_ID": "run-a"}
def sibling(**more):
    proc = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env={**env, **more},
                            stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()                  # started, with its own environment
    return proc
peers = [sibling(RANK=str(r)) for r in (1, 2)]
other = sibling(RANK="1", TORCHELASTIC_RUN_ID="run-b")
for proc in (peers[1], other):
    os.kill(proc.pid, signal.SIGSTOP)
subprocess.run([sys.executable, "-c", sys.argv[2], "torchrun"], env={**env, "RANK": "0"})
for proc in (*peers, other):
    if proc.poll() is None:
        print("alive", proc.pid, flush=True)
        os.kill(proc.pid, signal.SIGKILL)
    else:
        print("ended", proc.pid, proc.wait(), flush=True)
    proc.wait()
print("pids", peers[1].pid, other.pid, flush=True)
"""


def test_the_speaker_ends_only_its_own_runs_stopped_peers() -> None:
    """The rank that gives up names and ends the peers of its run that are stopped (their
    parent would wait for them), and nothing else: not a running peer, not a stopped process
    of another run that shares the parent."""
    proc = subprocess.run([sys.executable, "-c", _AGENT, _SIBLING, _SPEAKER],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=BOUND_S)
    lines = proc.stdout.splitlines()
    stopped, other = (int(pid) for pid in lines[-1].split()[1:])
    import json

    assert json.loads(lines[0]) == {"2": stopped}, proc.stdout
    assert f"ended {stopped} -9" in lines, proc.stdout      # the speaker ended it
    assert f"alive {other}" in lines, proc.stdout             # another run's: left alone
    assert len([line for line in lines if line.startswith("alive")]) == 2, proc.stdout


_HELD = """
import os, signal, sys, types
from ccbench.run.control import ControlClient, ControlServer
from ccbench.run.lifecycle import _note_interrupt

server = ControlServer("127.0.0.1", 0, world_size=1)
store = ControlClient("127.0.0.1", server.port, 0, secret=server.secret)
store.set("args/0", {"digest": "d", "argv": ["allreduce"]})


class Stream:
    \"\"\"The connection's stream, with SIGINT at the worst moment: the request sent, its
    reply not read yet.\"\"\"

    def __init__(self, inner):
        self.inner, self.armed = inner, True

    def readline(self, *args):
        if self.armed:
            self.armed = False
            os.kill(os.getpid(), signal.SIGINT)
        return self.inner.readline(*args)

    def __getattr__(self, name):
        return getattr(self.inner, name)


store._stream = Stream(store._stream)
_note_interrupt(types.SimpleNamespace(label="allreduce at 1K"))
try:
    store.get("args/0", 5)
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted")
print("first to say so:", store.add("aborted/interrupted", 1) == 1, flush=True)
os.kill(os.getpid(), signal.SIGINT)         # a second one, on the way out
print("a second SIGINT changed nothing", flush=True)
"""


def test_an_interrupt_during_a_store_request_leaves_the_connection_in_step() -> None:
    """SIGINT between a request to the control store and its reply (a rank waiting for the
    others' times) is raised once the reply is read. Before, the interrupted rank's next request
    (the one that tells the others it was interrupted) read the earlier reply: a traceback
    (int() of a list of times), and under a bare mpiexec the store host's 'rank 0 ended
    without a word' while rank 0 waited in MPI_Finalize for ever (-m matrix
    test_sigint_to_a_bare_mpiexec, twice on a loaded machine)."""
    proc = subprocess.run([sys.executable, "-c", _HELD], env={**os.environ,
                                                             "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=BOUND_S)
    assert proc.stdout.splitlines() == ["interrupted", "first to say so: True",
                                        "a second SIGINT changed nothing"], \
        proc.stdout + proc.stderr[-3000:]


_QUIET = """
import sys
from ccbench.run.control import ControlClient
from ccbench.run.watchdog import Watchdog

store = ControlClient("127.0.0.1", int(sys.argv[1]), 2, secret=sys.argv[2])
watchdog = Watchdog(store, 2, 3, 10.0)
print("giving up", flush=True)
watchdog._give_up("a rank died")       # rank 0 is dead, rank 1 says so: this one leaves quietly
"""


def test_a_rank_that_leaves_quietly_waits_for_the_one_that_speaks() -> None:
    """3 ranks, rank 0 killed: rank 1 says why, rank 2 leaves without a line. Before, rank 2
    left at once, and a bare mpiexec (hydra), which ends every rank once one exits, ended rank
    1 before its line was out: no line at all (2 runs of 5). Rank 2 now leaves once the line is
    out ('aborted' set), or after a bound."""
    from ccbench.run.control import ControlClient, ControlServer

    server = ControlServer("127.0.0.1", 0, world_size=3)
    try:
        dead = ControlClient("127.0.0.1", server.port, 0, secret=server.secret)
        dead._stream.close()                             # rank 0: gone without a goodbye
        dead._sock.close()
        speaker = ControlClient("127.0.0.1", server.port, 1, secret=server.secret)
        deadline = time.monotonic() + BOUND_S
        while not speaker.prefix("dead/") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert speaker.prefix("dead/"), "rank 0 never seen dead"
        proc = subprocess.Popen([sys.executable, "-c", _QUIET, str(server.port), server.secret],
                                env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "giving up\n"
            time.sleep(2.0)         # rank 2 is giving up meanwhile; rank 1 has not spoken yet
            assert proc.poll() is None, f"rank 2 left before rank 1 spoke: {proc.returncode}"
            speaker.set("aborted", 1)                    # rank 1's line is out
            assert proc.wait(timeout=BOUND_S) == 3
            assert proc.stderr is not None and proc.stderr.read() == ""
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        speaker.close()
    finally:
        server.close()


@pytest.mark.matrix
@pytest.mark.skipif(not have_mpi(), reason="no mpiexec in this environment")
def test_sigkill_to_rank_0_of_3_under_a_bare_mpiexec(tmp_path: Path) -> None:
    """One line naming rank 0 dead, from rank 1 (before: none in 2 runs of 5)."""
    tag = f"ccbench-hang-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "r.jsonl"
    proc = _start([MPIEXEC, "-n", "3", sys.executable, "-m", "ccbench", *BENCH, "--backend",
                   "mpi", "--output", str(out)], tag)
    _mid_run(out, proc)
    os.kill(_rank_pid(tag, 0, "PMI_RANK"), signal.SIGKILL)
    err, left = _end(proc, tag, time.monotonic())
    assert left == [], err[-3000:]
    assert _one_line(err).endswith("ranks that did not arrive: 0 (dead)"), err[-3000:]
    assert load_records(out)


def _catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (/proc/PID/status SigCgt)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught, 16) >> (signum - 1) & 1)


def _sizes(out: Path) -> int:
    return len(load_records(out)) if out.exists() else 0


@pytest.mark.matrix
def test_sigterm_to_rank_0_under_torchrun_while_it_starts(tmp_path: Path) -> None:
    """SIGTERM to rank 0 while it imports: one line naming it (before: none, only torchrun's
    'Signal 15 (SIGTERM) received by PID ...'), also torchrun's root cause; rank 1, which
    torchrun then stops, adds none."""
    tag = f"ccbench-hang-{uuid.uuid4().hex[:8]}"
    proc = _start([TORCHRUN, "--nproc-per-node", "2", "-m", "ccbench", *BENCH, "--backend",
                   "gloo", "--output", str(tmp_path / "r.jsonl")], tag)
    deadline = time.monotonic() + BOUND_S
    victim = None
    while victim is None or not _catches(victim, signal.SIGTERM):
        # from the first moment rank 0 handles SIGTERM: it has just begun importing ccbench
        # (in the tenth of a second before, the interpreter starts and SIGTERM's default
        # action ends it without a word: a limit, docs/design/failures.md)
        assert time.monotonic() < deadline and proc.poll() is None, "rank 0 never started"
        with contextlib.suppress(AssertionError):
            victim = _rank_pid(tag, 0, "RANK")
        time.sleep(0.005)
    os.kill(victim, signal.SIGTERM)
    err, left = _end(proc, tag, time.monotonic())
    assert left == [], err[-3000:]
    line = _one_line(err)
    assert "start-up: rank 0 was terminated (SIGTERM)" in line, line
    assert f"traceback : {line}" in err, err[-3000:]          # torchrun's root cause


@pytest.mark.matrix
def test_sigkill_to_torchrun_ends_its_workers(tmp_path: Path) -> None:
    """torchrun killed mid-run: its workers notice (they watch it from start-up) and stop,
    with one line, keeping the records written. Before, they measured every remaining size
    with nobody to report to (53-118 s on this machine)."""
    out = tmp_path / "r.jsonl"
    cmd = [TORCHRUN, "--nproc-per-node", "2", "-m", "ccbench", *BENCH, "--backend", "gloo"]
    proc, err, left = _fault(cmd, "RANK", signal.SIGKILL, out, target="launcher")
    assert left == [], err[-3000:]
    line = _one_line(err)
    assert "the launcher (torchrun, pid " in line and "ended while rank 0 ran" in line, line
    # not every size measured: they stopped (11 sizes 1K-1M, in place and out of place)
    assert 0 < _sizes(out) < 22, _sizes(out)


@pytest.mark.matrix
def test_sigterm_to_a_late_rank_under_torchrun_is_its_line_alone(tmp_path: Path) -> None:
    """Rank 1 still starting (late by 60 s), rank 0 waiting for it with its watchdog running:
    SIGTERM to rank 1 is rank 1's line alone. Before, rank 0, stopped by torchrun then, added
    'the launcher stopped the run (SIGTERM to every rank)'."""
    tag = f"ccbench-hang-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([TORCHRUN, "--nproc-per-node", "2", "-m", "ccbench", *BENCH,
                             "--backend", "gloo", "--output", str(tmp_path / "r.jsonl")],
                            env={**os.environ, "CCBENCH_FAULT_TAG": tag, "PYTHONPATH": str(ROOT),
                                 "CCBENCH_FAULT": "start-up:1:late",
                                 "CCBENCH_FAULT_LATE_S": "60"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + BOUND_S
    late = first = None
    # rank 1 handles SIGTERM (it is starting); rank 0's watchdog runs (it handles SIGCONT)
    while late is None or first is None or not _catches(late, signal.SIGTERM) \
            or not _catches(first, signal.SIGCONT):
        assert time.monotonic() < deadline and proc.poll() is None, "the ranks never started"
        with contextlib.suppress(AssertionError):
            late, first = _rank_pid(tag, 1, "RANK"), _rank_pid(tag, 0, "RANK")
        time.sleep(0.02)
    os.kill(late, signal.SIGTERM)
    err, left = _end(proc, tag, time.monotonic())
    assert left == [], err[-3000:]
    assert "start-up: rank 1 was terminated (SIGTERM)" in _one_line(err), err[-3000:]


@pytest.mark.skipif(not have_mpi(), reason="no mpiexec in this environment")
def test_a_rank_dead_before_mpi_init_is_named_at_once_under_launch(tmp_path: Path) -> None:
    """Rank 1 killed after it connected to the launcher's store, before MPI_Init: the ranks
    waiting in MPI_Init name it dead as soon as it is gone, in one line. Before, their guard
    waited out its limit and named it without '(dead)'."""
    tag = f"ccbench-hang-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([sys.executable, "-m", "ccbench", "launch", "-n", "3", *BENCH,
                             "--backend", "mpi", "--output", str(tmp_path / "r.jsonl")],
                            env={**os.environ, "CCBENCH_FAULT_TAG": tag, "PYTHONPATH": str(ROOT),
                                 "CCBENCH_FAULT": "start-up:1:kill"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err, left = _end(proc, tag, time.monotonic())
    assert left == [], err[-3000:]
    line = _one_line(err)
    assert "MPI start-up (MPI_Init): a rank exited" in line, err[-3000:]
    assert line.endswith("ranks that did not arrive: 1 (dead)"), err[-3000:]
    assert proc.returncode != 0


@pytest.mark.slurm
def test_rank_0_dead_at_start_up_under_srun_is_one_line(tmp_path: Path) -> None:
    """srun passes every rank's lines on: rank 0 gone before it opened the control store is
    said by rank 1 alone (rank 2 waits for it to go and leaves without a line). Before, ranks 1
    and 2 each said 'cannot reach the control store ... rank 0 exited'."""
    from test_slurm import require_slurm

    require_slurm()
    tag = f"ccbench-hang-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(["srun", "-n", "3", sys.executable, "-m", "ccbench", *BENCH,
                             "--backend", "gloo", "--output", str(tmp_path / "r.jsonl")],
                            env={**os.environ, "CCBENCH_FAULT_TAG": tag, "PYTHONPATH": str(ROOT),
                                 "CCBENCH_FAULT": "start-up:0:kill",
                                 "CCBENCH_CONTROL_SECRET": uuid.uuid4().hex * 2},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err, left = _end(proc, tag, time.monotonic())
    assert left == [], err[-3000:]
    assert "rank 0 exited; ranks that did not arrive: 0 (dead)" in _one_line(err), err[-3000:]
    assert proc.returncode != 0
