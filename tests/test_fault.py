"""A dying or hanging rank never hangs the rest, and finished sizes stay in the results."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import have_mpi, missing_prerequisite
from fault_cells import Cell, run_cell

from ccbench.records import load_records

TIMEOUT_S = 5.0
# "no hang" bounds, in minutes: a loaded CI machine is slow, never stuck (stop times are
# measured by scripts/fault_matrix.py, not asserted here)
NO_HANG_S = TIMEOUT_S + 30 + 120


def _ranks_of(tag: str, world: int, deadline: float) -> dict[int, int]:
    """rank -> pid of the ccbench processes below the launcher (read from /proc)."""
    while time.monotonic() < deadline:
        found: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                env = (entry / "environ").read_bytes().split(b"\0")
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"ccbench" not in cmdline or b"launch" in cmdline or b"mpiexec" in cmdline:
                continue
            variables = dict(v.split(b"=", 1) for v in env if b"=" in v)
            rank = variables.get(b"RANK") or variables.get(b"PMI_RANK")
            if variables.get(b"CCBENCH_TEST_TAG") == tag.encode() and rank is not None:
                found[int(rank)] = int(entry.name)
        if len(found) == world:
            return found
        time.sleep(0.1)
    raise AssertionError("ranks did not start")


def _start(tmp_path: Path, backend: str, tag: str) -> tuple[subprocess.Popen[str], Path]:
    out = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "ccbench", "launch", "-n", "3", "allreduce", "--backend", backend,
           "--sizes", "1K-4M", "--min-time", "0.4", "--timeout", str(TIMEOUT_S), "-q",
           "--output", str(out)]
    env = {**os.environ, "CCBENCH_TEST_TAG": tag}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env), out


def _wait_records(out: Path, count: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if out.exists() and len(out.read_text().splitlines()) >= count:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("no records appeared")


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_gloo_rank_dies_or_hangs(tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tag = f"fault-{how}-{os.getpid()}"
    monkeypatch.setenv("CCBENCH_TEST_TAG", tag)
    proc, out = _start(tmp_path, "gloo", tag)
    ranks = _ranks_of(tag, 3, time.monotonic() + 60)
    _wait_records(out, 3, proc)
    victim = ranks[2]
    os.kill(victim, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    try:
        _, stderr = proc.communicate(timeout=NO_HANG_S)
    finally:
        if how == "stop":
            try:
                os.kill(victim, signal.SIGKILL)      # the launcher should have reaped it
            except ProcessLookupError:
                pass
    assert proc.returncode != 0
    errors = [line for line in stderr.splitlines() if line.startswith("ccbench: error:")]
    assert len(errors) == 1, stderr
    assert "allreduce" in errors[0] and "ranks that did not arrive: 2" in errors[0], errors
    assert "Traceback" not in stderr
    records = load_records(out)
    assert len(records) >= 3 and all(r.wrong == 0 for r in records)


@pytest.mark.skipif(not have_mpi(), reason="no mpiexec in this environment")
def test_mpi_rank_dies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tag = f"fault-mpi-{os.getpid()}"
    monkeypatch.setenv("CCBENCH_TEST_TAG", tag)
    proc, out = _start(tmp_path, "mpi", tag)
    ranks = _ranks_of(tag, 3, time.monotonic() + 60)
    _wait_records(out, 3, proc)
    os.kill(ranks[1], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=NO_HANG_S)
    assert proc.returncode != 0
    errors = [line for line in stderr.splitlines() if line.startswith("ccbench: error:")]
    assert len(errors) == 1 and "ranks that did not arrive: 1 (dead)" in errors[0], stderr
    assert len(load_records(out)) >= 3


# One cell of every kind of the fault matrix (scripts/fault_matrix.py runs all of them): each
# fault, each phase, each victim position (first, middle, last) and each backend family (torch
# gloo, MPI, oneCCL, an algorithm over MPI) at least once; few enough to take a few minutes on
# a loaded machine.
CELLS = [
    Cell("mpi", 2, 1, "kill", "before-connect"),
    Cell("gloo", 2, 0, "stop", "mid-run"),
    Cell("gloo", 3, 1, "unreachable", "start-up"),
    Cell("mpi", 3, 2, "kill", "start-up"),
    Cell("oneccl", 2, 1, "exit", "shutdown"),
    Cell("ring@mpi", 2, 0, "kill", "init"),
]


def _available(backend: str) -> str | None:
    from ccbench.backends import backend_class

    if "mpi" in backend and not have_mpi():
        return "no mpiexec"
    return backend_class(backend).unavailable_reason()


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.name)
def test_fault_cell(cell: Cell, tmp_path: Path) -> None:
    reason = _available(cell.backend)
    if reason:
        missing_prerequisite(reason)
    outcome = run_cell(cell, tmp_path, timeout=TIMEOUT_S, bound=NO_HANG_S)
    assert outcome.ok, (outcome.problems, outcome.error_lines)


# The same cells under MPICH and Open MPI, whose mpiexec ends every rank at once when one dies
# (the launcher's store names the rank). Each lives in a venv of its own (their libmpi.so.12
# clashes with Intel MPI's): CCBENCH_OTHER_MPI_PYTHONS lists those venvs' interpreters,
# comma-separated (.ci/run makes them).
# CI runs two cells per MPI (a rank killed mid-run, and the bare mpiexec's store host); the
# others run with scripts/test-matrix.sh.
OTHER_MPI_CELLS = [
    pytest.param(Cell("mpi", 2, 1, "kill", "before-connect"),  # rank 0 connected, then ended
                 marks=pytest.mark.matrix),
    Cell("mpi", 2, 1, "kill", "mid-run"),
    pytest.param(Cell("mpi", 3, 0, "kill", "start-up"), marks=pytest.mark.matrix),
    pytest.param(Cell("mpi", 3, 2, "exit", "init"), marks=pytest.mark.matrix),
    # a bare mpiexec: the ranks learn the store's address only after MPI_Init, so the store
    # host (forked by rank 0 before it) names the rank from the processes it watches
    Cell("mpi", 2, 1, "kill", "before-connect", launcher="mpiexec"),
]
OTHER_MPI_PYTHONS = [p for p in os.environ.get("CCBENCH_OTHER_MPI_PYTHONS", "").split(",") if p]


@pytest.mark.parametrize("python", OTHER_MPI_PYTHONS or ["(none)"],
                         ids=lambda p: Path(p).parent.parent.name)
@pytest.mark.parametrize("cell", OTHER_MPI_CELLS, ids=lambda c: c.name)
def test_fault_cell_other_mpi(cell: Cell, python: str, tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    if not Path(python).exists():
        missing_prerequisite("CCBENCH_OTHER_MPI_PYTHONS names no MPICH or Open MPI venv's "
                             "python (.ci/run makes them)")
    # that venv has no ccbench installed: this checkout; Open MPI refuses root without these
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parent.parent))
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    outcome = run_cell(replace(cell, python=python), tmp_path, timeout=TIMEOUT_S,
                       bound=NO_HANG_S)
    assert outcome.ok, (outcome.problems, outcome.error_lines)


# The same promise when the ranks are started by a bare launcher instead of `ccbench launch`:
# a rank killed mid-run gives one line naming the step and that rank, and nothing is left.
# A bare Intel MPI mpiexec kills every rank at once (ccbench.run.storehost speaks for them).
LAUNCHER_CELLS = [
    Cell("mpi", 2, 1, "kill", "mid-run", launcher="mpiexec"),
    Cell("gloo", 2, 1, "kill", "mid-run", launcher="srun"),
    Cell("gloo", 2, 1, "kill", "mid-run", launcher="torchrun"),
]


def _launcher_missing(launcher: str) -> str | None:
    import shutil

    if launcher == "srun":
        if shutil.which("srun") is None or shutil.which("sinfo") is None:
            return "no Slurm here"
        up = subprocess.run(["sinfo", "-h", "-o", "%a"], capture_output=True, text=True,
                            timeout=60, check=False)
        return None if "up" in up.stdout else "no Slurm partition up"
    if launcher == "torchrun" and not (Path(sys.executable).parent / "torchrun").exists():
        return "no torchrun beside python"
    return None


@pytest.mark.parametrize("cell", LAUNCHER_CELLS, ids=lambda c: c.name)
def test_fault_cell_bare_launcher(cell: Cell, tmp_path: Path) -> None:
    reason = _available(cell.backend) or _launcher_missing(cell.launcher)
    if reason:
        missing_prerequisite(reason)
    outcome = run_cell(cell, tmp_path, timeout=TIMEOUT_S, bound=NO_HANG_S)
    assert outcome.ok, (outcome.problems, outcome.error_lines)
    assert "2K" in outcome.error_lines[0] or "1K" in outcome.error_lines[0], outcome.error_lines


def test_torn_last_line_is_moved_aside(tmp_path: Path) -> None:
    """A run killed mid-write left half a line: the next run cuts it off (keeping it in
    .torn) before appending, and says so; every line of the file is whole afterwards."""
    out = tmp_path / "r.jsonl"
    quick = ["allreduce", "--backend", "gloo", "--sizes", "1K", "--iters", "2", "--warmup", "0",
             "-q", "--output", str(out)]
    first = subprocess.run([sys.executable, "-m", "ccbench", *quick], capture_output=True,
                           text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    whole = out.read_bytes()
    out.write_bytes(whole + b'{"schema":"ccbench.record","collec')
    second = subprocess.run([sys.executable, "-m", "ccbench", *quick], capture_output=True,
                            text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert "ccbench: warning:" in second.stderr and ".torn" in second.stderr
    assert (tmp_path / "r.jsonl.torn").read_bytes() == b'{"schema":"ccbench.record","collec\n'
    assert out.read_bytes().startswith(whole)
    assert len(load_records(out)) == 2 * len(load_records_text(whole))


def load_records_text(data: bytes) -> list[str]:
    return [line for line in data.decode().splitlines() if line.strip()]


def test_disk_full_is_one_line_and_keeps_whole_records(tmp_path: Path) -> None:
    """--output on a full file system: one line from the rank that hit it, exit non-zero, no
    'dead' rank blamed, and the file holds only whole records."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24k", "tmpfs", str(mount)],
                          capture_output=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.decode().strip()}")
    try:
        out = mount / "r.jsonl"
        proc = subprocess.run([sys.executable, "-m", "ccbench", "launch", "-n", "2", "allreduce",
                               "--backend", "gloo", "--sizes", "1K-1M", "--iters", "2",
                               "--warmup", "0", "-q", "--output", str(out)],
                              capture_output=True, text=True, timeout=NO_HANG_S)
        assert proc.returncode != 0
        errors = [line for line in proc.stderr.splitlines() if line.startswith("ccbench: error:")]
        assert len(errors) == 1 and "No space left on device" in errors[0], proc.stderr
        assert "dead" not in proc.stderr and "Traceback" not in proc.stderr
        assert out.read_bytes().endswith(b"\n")
        assert len(load_records(out)) >= 1
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_stopped_rank_0_is_named_and_does_not_blame_others_once_continued(tmp_path: Path
                                                                          ) -> None:
    """Ranks started by hand (no launcher to filter lines): rank 0, which hosts the control
    store, is stopped mid-run; rank 1 says so within minutes; continued, rank 0 leaves without
    blaming rank 1 for having gone."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "r.jsonl"
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "CCBENCH_CONTROL": f"127.0.0.1:{port}", "CCBENCH_CONTROL_SECRET": "by-hand"}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "ccbench", "allreduce", "--backend", "gloo", "--sizes",
             "1K-4M", "--min-time", "0.4", "--timeout", str(TIMEOUT_S), "-q", "--output",
             str(out)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    try:
        _wait_records(out, 2, procs[0])
        os.kill(procs[0].pid, signal.SIGSTOP)
        _, survivor = procs[1].communicate(timeout=NO_HANG_S)
        os.kill(procs[0].pid, signal.SIGCONT)
        _, stopped = procs[0].communicate(timeout=NO_HANG_S)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert procs[1].returncode != 0 and procs[0].returncode != 0
    errors = [line for line in survivor.splitlines() if line.startswith("ccbench: error:")]
    assert len(errors) == 1 and "ranks that did not arrive: 0 (not answering)" in errors[0], \
        survivor
    assert "ccbench: error:" not in stopped and "Traceback" not in stopped, stopped
    assert len(load_records(out)) >= 2


def test_a_late_rank_is_waited_for_not_blamed(tmp_path: Path) -> None:
    """A rank that starts after the connect timeout (a loaded machine can take that long to
    start an interpreter) is waited for: the run completes."""
    out = tmp_path / "r.jsonl"
    env = {**os.environ, "CCBENCH_FAULT": "start-up:2:late", "CCBENCH_FAULT_LATE_S": "12"}
    proc = subprocess.run([sys.executable, "-m", "ccbench", "launch", "-n", "3", "allreduce",
                           "--backend", "gloo", "--sizes", "1K-4K", "--iters", "2", "--warmup",
                           "0", "--timeout", str(TIMEOUT_S), "-q", "--output", str(out)],
                          env=env, capture_output=True, text=True, timeout=NO_HANG_S)
    assert proc.returncode == 0, proc.stderr
    assert "ccbench: error:" not in proc.stderr
    assert len(load_records(out)) == 6


def test_await_ranks_names_the_dead_at_once_and_waits_for_the_late(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ccbench.run import arrivals

    monkeypatch.setattr(arrivals, "LATE_GRACE_S", 1.0)
    monkeypatch.setattr(arrivals, "_POLL_S", 0.01)
    started = time.monotonic()
    # rank 2 gone, rank 1 alive: only the gone one is named, without waiting for the limit
    missing = arrivals.await_ranks(lambda: {0}, 3, 30.0,
                                   lambda: {0: "alive", 1: "alive", 2: "gone"})
    assert missing == {2: "dead"} and time.monotonic() - started < 20
    # a late rank arrives after the connect timeout: nobody is named
    moments = iter([set(), set(), {0}, {0, 1}])
    assert arrivals.await_ranks(lambda: next(moments), 2, 0.0,
                                lambda: {0: "alive", 1: "alive"}) == {}
    # a stopped rank is named once the connect timeout (+5 s) has passed, not before
    started = time.monotonic()
    assert arrivals.await_ranks(lambda: {0}, 2, 0.0, lambda: {0: "alive", 1: "stopped"}) \
        == {1: "stopped"}
    assert 5 <= time.monotonic() - started < 20       # upper bound: a loaded machine
    # ranks that cannot be seen: named after connect timeout + 5 s + the grace
    started = time.monotonic()
    assert arrivals.await_ranks(lambda: {0}, 2, 0.0, lambda: None) == {1: ""}
    assert 6 <= time.monotonic() - started < 20


def test_store_host_names_the_rank_that_went_first_and_only_when_nobody_spoke() -> None:
    from ccbench.run.storehost import unexplained_end

    labels = {"label/0": [3, "allreduce float32 sum out-of-place at 2K"],
              "label/1": [2, "allreduce float32 sum in-place at 1K"]}
    line = unexplained_end([(1, False), (0, False)], labels, "mpiexec")
    assert line is not None and line.startswith("ccbench: error: allreduce float32 sum "
                                                "out-of-place at 2K: rank 1 ")
    assert line.endswith("ranks that did not arrive: 1 (dead)")
    assert unexplained_end([(1, True), (0, True)], labels, "mpiexec") is None     # a clean end
    assert unexplained_end([(1, False), (0, False)], {**labels, "aborted": 0}, "mpiexec") is None
    assert unexplained_end([(0, False), (1, False)], {**labels, "left/1": 1}, "mpiexec") is None
    # the launcher's store under mpiexec: a rank that never connected, when none closed without
    # a goodbye, is the one that did not arrive
    line = unexplained_end([], {}, "mpiexec", 3, {0, 2})
    assert line == ("ccbench: error: start-up: rank 1 ended before connecting to the control "
                    "store and mpiexec then ended the others; ranks that did not arrive: 1 (dead)")
    assert unexplained_end([(0, False)], {}, "mpiexec", 3, {0, 2}) is not None
    assert "rank 0 ended without a word" in (unexplained_end([(0, False)], {}, "mpiexec", 3,
                                                             {0, 2}) or "")


def test_store_verdict_goes_by_the_order_the_kernel_saw_connections_close() -> None:
    """A bare mpiexec, rank 2 SIGKILLed: rank 1's process ended and its connection's thread
    noticed first (a killed rank closes its store connection before the MPI's descriptor that
    tells mpiexec, but its exit can complete after the others'), and rank 1 was named. The
    store's one epoll over the ranks' connections sees them close in the kernel's order."""
    from ccbench.run.control import ControlClient, ControlServer
    from ccbench.run.storehost import unexplained_end

    server = ControlServer("127.0.0.1", 0, "k" * 32, 3)
    server.watch_hangups()
    clients = [ControlClient("127.0.0.1", server.port, rank, secret="k" * 32)
               for rank in range(3)]
    for rank in (2, 0, 1):              # each closes without a goodbye, as a killed rank's
        clients[rank]._stream.close()
        clients[rank]._sock.close()
    deadline = time.monotonic() + 60
    while len(server.hangups) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.hangups == [2, 0, 1]
    server.close()
    line = unexplained_end([(1, False), (2, False), (0, False)], {}, "mpiexec", 3, {0, 1, 2},
                           ([[1], [2], [0]], {0, 1, 2}), [2, 1, 0])
    assert line is not None and line.endswith("ranks that did not arrive: 2 (dead)"), line
    # a rank that said goodbye before the killed one's connection closed is not the cause
    line = unexplained_end([(0, True), (2, False), (1, False)], {}, "mpiexec", 3, {0, 1, 2},
                           None, [0, 2, 1])
    assert line is not None and line.endswith("ranks that did not arrive: 2 (dead)"), line


def test_store_verdict_goes_by_which_rank_process_ended_first() -> None:
    """With the order in which the rank processes ended (ccbench.run.rankexits), the rank that
    ended first is named, not the rank whose connection closed first."""
    from ccbench.run.storehost import unexplained_end

    def named(closed: list[tuple[int, bool]], arrived: set[int], order: list[list[int]],
              seen: set[int]) -> str:
        line = unexplained_end(closed, {}, "mpiexec", 3, arrived, (order, seen))
        assert line is not None
        return line.rpartition("did not arrive: ")[2]

    # rank 1 died while starting (never connected); mpiexec then ended 0 and 2
    assert named([(0, False), (2, False)], {0, 2}, [[1], [0], [2]], {0, 1, 2}) == "1 (dead)"
    # the same, the watcher kept off the CPU until all three had ended: a tie, and the rank
    # that never connected is the one mpiexec reacted to
    assert named([(0, False), (2, False)], {0, 2}, [[0, 1, 2]], {0, 1, 2}) == "1 (dead)"
    # rank 1 ended before its process could even be seen
    assert named([(2, False), (0, False)], {0, 2}, [[0], [2]], {0, 2}) == "1 (dead)"
    # every rank connected; rank 2 died, the others' connections happened to close first
    assert named([(0, False), (1, False), (2, False)], {0, 1, 2}, [[2], [0, 1]],
                 {0, 1, 2}) == "2 (dead)"
    # a tie among connected ranks: the connection that closed first
    assert named([(1, False), (0, False), (2, False)], {0, 1, 2}, [[0, 1, 2]],
                 {0, 1, 2}) == "1 (dead)"
    # a rank that said goodbye and left is not the one that failed
    assert named([(0, True), (1, False), (2, False)], {0, 1, 2}, [[0], [2], [1]],
                 {0, 1, 2}) == "2 (dead)"
    # nothing seen (a /proc that shows nothing): the connections, as before
    assert named([(2, False), (0, False)], {0, 1, 2}, [], set()) == "2 (dead)"
    # nobody connected yet: the process that ended first
    line = unexplained_end([], {}, "mpiexec", 3, set(), ([[2], [0, 1]], {0, 1, 2}))
    assert line is not None and line.startswith("ccbench: error: start-up: rank 2 ended "
                                                "before connecting")
    # rank 0 connected and died before MPI_Init; mpiexec then ended 1, still starting, and 2
    # (the fault-matrix cell start-up-kill-rank0 under MPICH): the order names rank 0
    assert named([(0, False), (2, False)], {0, 2}, [[0], [1], [2]], {0, 1, 2}) == "0 (dead)"
    assert named([(0, False)], {0}, [[0], [2], [1]], {0, 1, 2}) == "0 (dead)"


# The watcher's process, kept off the CPU (stopped) while three rank processes end one after
# the other, then let run: it must still report them one by one, in the order they ended.
# Before it did, such a watcher reported [[0, 1], [2]] for the cell above on a loaded machine,
# and that tie named rank 1, which never connected.
_WATCHER = """
import json, sys, time
from ccbench.run.rankexits import RankExits
exits = RankExits(int(sys.argv[1]), 3).start()
deadline = time.monotonic() + 60
while len(exits.snapshot()[1]) < 3 and time.monotonic() < deadline:
    time.sleep(0.01)
print("watching", flush=True)
sys.stdin.readline()
exits.settle()
exits.stop()
print(json.dumps(exits.snapshot()[0]), flush=True)
"""


def test_rank_exits_keeps_the_order_when_its_watcher_was_kept_off_the_cpu() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PMI_RANK", "OMPI_COMM_WORLD_RANK",
                                                            "PMIX_RANK")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    ranks = [subprocess.Popen(["sleep", "600"], env={**env, "PMI_RANK": str(rank)})
             for rank in range(3)]
    watcher = subprocess.Popen([sys.executable, "-c", _WATCHER, str(os.getpid())], env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert watcher.stdout is not None and watcher.stdin is not None
        assert watcher.stdout.readline() == "watching\n"
        os.kill(watcher.pid, signal.SIGSTOP)
        for rank in (1, 2, 0):              # each gone before the next is ended
            ranks[rank].kill()
            ranks[rank].wait(timeout=60)
        os.kill(watcher.pid, signal.SIGCONT)
        out, _ = watcher.communicate("\n", timeout=60)
    finally:
        for proc in (*ranks, watcher):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert out.strip() == "[[1], [2], [0]]", out


# An mpiexec that ends every rank at once when one dies, before any can speak, as MPICH's does
# on a signal (even with -disable-auto-cleanup) and Open MPI's on any failure.
_ENDS_ALL = '''
import os, signal, subprocess, sys, time
rank = """
import os, signal, sys, time
from ccbench.run.control import ControlClient
client = ControlClient(*os.environ["CCBENCH_MPI_CONTROL"].split(":"), int(sys.argv[1]))
client.set("label/" + sys.argv[1], [1, "allreduce float32 sum out-of-place at 2K"])
time.sleep(1)
if sys.argv[1] == "1":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(120)
"""
ranks = [subprocess.Popen([sys.executable, "-c", rank, str(r)]) for r in range(2)]
ranks[1].wait()
time.sleep(0.2)   # the hops from a proxy to mpiexec and back (a loaded machine may reorder less)
ranks[0].kill()
ranks[0].wait()
sys.exit(9)
'''


def _supervise_fake_mpiexec(script: str, timeout: float, capfd: pytest.CaptureFixture[str]
                            ) -> tuple[int, list[str], set[int]]:
    """Run `script` as the mpiexec of a 2-rank `ccbench launch`, the control store hosted by
    the launcher as under a real mpiexec: (exit status, the error lines, the ranks that
    connected to the store)."""
    from ccbench.run.control import SECRET_VAR, ControlServer
    from ccbench.run.launchers import MPI_CONTROL_VAR
    from ccbench.run.supervisor import Supervisor

    store = ControlServer("127.0.0.1", 0)
    env = {MPI_CONTROL_VAR: f"127.0.0.1:{store.port}", SECRET_VAR: store.secret,
           "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        status = Supervisor([[sys.executable, "-c", script]], [env], timeout, store=store,
                            world_size=2).run()
        arrived = set(store.arrived)
    finally:
        store.close()
    errors = [line for line in capfd.readouterr().err.splitlines()
              if line.startswith("ccbench: error:")]
    return status, errors, arrived


def test_launch_names_the_rank_when_mpiexec_ended_them_all(capfd: pytest.CaptureFixture[str]
                                                           ) -> None:
    status, errors, _ = _supervise_fake_mpiexec(_ENDS_ALL, 10.0, capfd)
    assert status != 0
    assert errors == ["ccbench: error: allreduce float32 sum out-of-place at 2K: rank 1 ended "
                      "without a word and mpiexec then ended the others; ranks that did not "
                      "arrive: 1 (dead)"], errors


# The same mpiexec, where rank 1 dies while it starts, before it connects to the store, and
# rank 0, which connected, is then ended: each fake rank carries hydra's rank variable, as the
# launcher finds the rank processes below mpiexec by it.
_ENDS_ALL_BEFORE_CONNECT = '''
import os, signal, subprocess, sys, time
rank = """
import os, signal, sys, time
if sys.argv[1] == "1":
    time.sleep(1.5)
    os.kill(os.getpid(), signal.SIGKILL)
from ccbench.run.control import ControlClient
client = ControlClient(*os.environ["CCBENCH_MPI_CONTROL"].split(":"), int(sys.argv[1]))
client.set("label/" + sys.argv[1], [1, "start-up"])
time.sleep(120)
"""
ranks = [subprocess.Popen([sys.executable, "-c", rank, str(r)],
                          env={**os.environ, "PMI_RANK": str(r)}) for r in range(2)]
ranks[1].wait()
ranks[0].kill()        # at once: a close that comes before the launcher looked must not matter
ranks[0].wait()
sys.exit(9)
'''


def test_launch_names_a_rank_that_died_before_connecting(capfd: pytest.CaptureFixture[str]
                                                         ) -> None:
    status, errors, arrived = _supervise_fake_mpiexec(_ENDS_ALL_BEFORE_CONNECT, 10.0, capfd)
    assert status != 0
    assert arrived == {0}, "rank 0 did not connect before rank 1 died: nothing was tested"
    assert errors == ["ccbench: error: start-up: rank 1 ended before connecting to the control "
                      "store and mpiexec then ended the others; ranks that did not arrive: "
                      "1 (dead)"], errors


# An mpiexec that waits for every rank, where rank 1 gave up and left quietly (for rank 0 to
# say why) while rank 0 stays connected and silent, as a stopped rank 0 would.
_WAITS_FOR_ALL = '''
import os, subprocess, sys, time
rank = """
import os, sys, time
from ccbench.run.control import ControlClient
client = ControlClient(*os.environ["CCBENCH_MPI_CONTROL"].split(":"), int(sys.argv[1]))
client.set("label/" + sys.argv[1], [1, "allreduce float32 sum out-of-place at 2K"])
time.sleep(1)
if sys.argv[1] == "1":
    client.set("left/1", 1)
    os._exit(3)
time.sleep(300)
"""
ranks = [subprocess.Popen([sys.executable, "-c", rank, str(r)]) for r in range(2)]
for proc in ranks:
    proc.wait()
'''


def test_launch_ends_an_mpiexec_waiting_for_a_rank_the_others_gave_up_on(
        capfd: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    status, errors, _ = _supervise_fake_mpiexec(_WAITS_FOR_ALL, 1.0, capfd)
    assert status != 0
    assert len(errors) == 1 and errors[0].startswith(
        "ccbench: error: allreduce float32 sum out-of-place at 2K: the other ranks gave up"), errors
    assert errors[0].endswith("ranks that did not arrive: 0"), errors
    assert time.monotonic() - started < 240          # not the fake rank 0's 300 s
