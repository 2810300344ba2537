"""The three ways to start ranks produce the same records; launcher environments map right."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MPIEXEC, PYTHON, have_mpi

from ccbench.errors import RunFailure, UsageError, error_line, is_error_line
from ccbench.records import RecordKey, load_records
from ccbench.run import launcher_env
from ccbench.run.launcher_env import MPI_ENVS, LauncherEnv
from ccbench.run.launchers import detect_launch, expand_nodelist

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
BENCH = ["allreduce,alltoall", "--sizes", "1K,3000", "--iters", "2", "--warmup", "1", "-q"]


def _run(cmd: list[str], out: Path, env: dict[str, str] | None = None) -> Counter[RecordKey]:
    proc = subprocess.run([*cmd, "--output", str(out)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = load_records(out)
    assert records and all(r.wrong == 0 for r in records)
    # the same cases and sizes, measured by different runs
    return Counter(RecordKey(case=r.case.without({"run_id"}), size_asked=r.size_asked)
                   for r in records)


def test_torchrun_and_builtin_give_the_same_cases(tmp_path: Path) -> None:
    builtin = _run([PYTHON, "-m", "ccbench", "launch", "-n", "2", *BENCH, "--backend", "gloo"],
                   tmp_path / "a.jsonl")
    torchrun = _run([TORCHRUN, "--nproc-per-node", "2", "-m", "ccbench", *BENCH],
                    tmp_path / "b.jsonl")          # backend defaults to gloo without CUDA
    assert builtin == torchrun
    assert {r.method["launcher"] for r in load_records(tmp_path / "b.jsonl")} == {"torchrun"}


@pytest.mark.skipif(not have_mpi(), reason="no mpiexec in this environment")
def test_mpiexec_runs_mpi_and_bootstraps_gloo(tmp_path: Path) -> None:
    direct = _run([MPIEXEC, "-n", "2", PYTHON, "-m", "ccbench", *BENCH, "--backend", "mpi,gloo"],
                  tmp_path / "a.jsonl", env={"I_MPI_WAIT_MODE": "1"})
    builtin = _run([PYTHON, "-m", "ccbench", "launch", "-n", "2", *BENCH, "--backend", "mpi,gloo"],
                   tmp_path / "b.jsonl")
    assert direct == builtin
    records = load_records(tmp_path / "a.jsonl")
    assert {r.backend for r in records} == {"mpi", "gloo"}
    mpi = [r for r in records if r.backend == "mpi"]
    assert all("MPI" in r.library_version for r in mpi)


def test_mpi_backend_refused_under_torchrun_style_launch(tmp_path: Path) -> None:
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "CCBENCH_CONTROL": "127.0.0.1:0"}
    proc = subprocess.run([PYTHON, "-m", "ccbench", "allreduce", "--backend", "mpi", "--sizes",
                           "1K"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and "needs ranks started by mpiexec" in proc.stderr


def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHELASTIC", "PMI_",
                            "OMPI_", "PMIX_", "SLURM_", "CCBENCH_CONTROL", "MPI_LOCAL")):
            monkeypatch.delenv(name, raising=False)


def test_env_mappings(monkeypatch: pytest.MonkeyPatch) -> None:
    _clean_env(monkeypatch)
    assert detect_launch().launcher == "single"
    # what Intel MPI leaves in a process that called MPI_Init without a launcher
    monkeypatch.setenv("MPI_LOCALRANKID", "0")
    monkeypatch.setenv("MPI_LOCALNRANKS", "1")
    assert detect_launch().launcher == "single"
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "4(x2)")
    info = detect_launch()
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) \
        == ("srun", 5, 8, 1, 4)
    _clean_env(monkeypatch)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
    info = detect_launch()
    assert (info.launcher, info.rank, info.world_size, info.local_rank) == ("mpiexec", 3, 4, 1)
    _clean_env(monkeypatch)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert detect_launch().launcher == "torchrun"



@pytest.mark.parametrize("mpi", MPI_ENVS, ids=lambda mpi: mpi.name)
def test_every_mpi_in_the_launcher_table_is_read_without_mpi(
        monkeypatch: pytest.MonkeyPatch, mpi: LauncherEnv) -> None:
    _clean_env(monkeypatch)
    for name, value in ((mpi.rank, "3"), (mpi.size, "4"), (mpi.local_rank, "1"),
                        (mpi.local_size, "2")):
        if name:
            monkeypatch.setenv(name, value)
    info = detect_launch()
    expected_local = (1, 2) if mpi.local_rank else (0, 1)
    assert (info.launcher, info.rank, info.world_size) == ("mpiexec", 3, 4)
    assert (info.local_rank, info.local_world_size) == expected_local


def test_a_sweep_case_drops_inherited_rank_variables_but_keeps_its_slurm_job() -> None:
    from ccbench.sweep.plan import LAUNCHER_IDENTITY_VARS

    for launcher in (launcher_env.LOCAL, launcher_env.TORCHRUN, *MPI_ENVS):
        assert {launcher.rank, launcher.size} <= set(LAUNCHER_IDENTITY_VARS)
    assert not set(launcher_env.SRUN.names()) & set(LAUNCHER_IDENTITY_VARS)


def test_one_error_line_format_is_written_and_recognised() -> None:
    line = error_line("start-up: ranks that did not arrive: 1")
    assert line == "ccbench: error: start-up: ranks that did not arrive: 1"
    assert is_error_line(line) and is_error_line(line.encode())
    assert not is_error_line("ccbench: note: x") and not is_error_line(b" ccbench: error: x")

def test_expand_nodelist() -> None:
    assert expand_nodelist("node[01-03,07],gpu5") == ["node01", "node02", "node03", "node07",
                                                      "gpu5"]
    assert expand_nodelist("a1") == ["a1"]
    assert expand_nodelist("n[8-10]") == ["n8", "n9", "n10"]


def test_mixed_backends_each_launched_in_its_own_environment() -> None:
    from ccbench.run.supervisor import launch_groups, with_backends

    groups = launch_groups({"mpi": True, "ring@mpi": True, "gloo": False, "oneccl": False})
    assert groups == [(["mpi", "ring@mpi"], True), (["gloo", "oneccl"], False)]
    # the order given, not plain processes first
    groups = launch_groups({"mpi": True, "gloo": False, "ring@mpi": True})
    assert groups == [(["mpi"], True), (["gloo"], False), (["ring@mpi"], True)]
    assert launch_groups({"gloo": False}) == [(["gloo"], False)]
    bench = ["allreduce", "--backend", "gloo,mpi", "--sizes", "1K"]
    assert with_backends(bench, ["mpi"]) == ["allreduce", "--backend", "mpi", "--sizes", "1K"]
    assert with_backends(["all", "--backend=gloo,mpi"], ["gloo"]) == ["all", "--backend=gloo"]
    assert with_backends(["all", "-B", "gloo,mpi"], ["gloo"]) == ["all", "-B", "gloo"]
    assert with_backends(["all"], ["gloo"]) == ["all", "--backend", "gloo"]


@pytest.mark.slow
def test_mixed_run_starts_gloo_without_mpiexec(tmp_path) -> None:
    """gloo in a gloo,mpi run is not started by mpiexec (which pins each rank to one core)."""
    from conftest import run_ccbench

    out = tmp_path / "r.jsonl"
    proc = run_ccbench("launch", "-n", "2", "allreduce", "--backend", "gloo,mpi", "--sizes", "1K",
                       "--iters", "3", "--warmup", "1", "-q", "--output", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    launchers = {r.backend: r.method["launcher"] for r in load_records(out)}
    assert set(launchers) == {"gloo", "mpi"}
    assert "mpiexec" not in launchers["gloo"] and launchers["gloo"] != launchers["mpi"]


def test_torchrun_variables_without_its_store_end_in_one_line() -> None:
    """Ranks that look torchrun-started but whose MASTER_ADDR:MASTER_PORT has no store: one
    ccbench line naming the address, not torch's C++ retry log or a traceback."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
           "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "TORCHELASTIC_RUN_ID": "t", "GROUP_RANK": "0"}
    proc = subprocess.run([PYTHON, "-m", "ccbench", "allreduce", "--sizes", "1K", "--timeout", "3",
                           "-q"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ccbench: error: rank 1: cannot reach "
                                                   "torchrun's store"), proc.stderr[-2000:]
    assert f"127.0.0.1:{port}" in lines[0]


def test_gloo_sets_its_interface_only_while_creating_groups(monkeypatch) -> None:
    """gloo's interface is chosen by ccbench (loopback on one host) but set in the environment
    only while a group is created: a process that built a gloo backend (a library user, this
    test process) does not pass GLOO_SOCKET_IFNAME=lo on to what it starts (a multi-host run
    it launches would then listen on loopback, its peers refused)."""
    from seams import ThreadWorld, rank_context

    from ccbench.backends import backend_class

    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    backend = backend_class("gloo")(rank_context(ThreadWorld(1), 0))
    try:
        assert "GLOO_SOCKET_IFNAME" not in os.environ
        assert backend._interface == "lo"
        assert backend.groups is not None
        (group,) = backend.groups.split([[0]], timeout=30)
        assert group is not None and "GLOO_SOCKET_IFNAME" not in os.environ
    finally:
        backend.finalize()


# -- the secret under torchrun ---------------------------------------------------------------
@pytest.fixture
def torchrun_store(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """A torchrun-like rendezvous store (torch's TCPStore, no authentication) and the
    variables its ranks see."""
    import datetime

    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                     timeout=datetime.timedelta(seconds=60))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "t")
    monkeypatch.delenv("CCBENCH_CONTROL_SECRET", raising=False)
    monkeypatch.delenv("CCBENCH_CONTROL_SECRET_FILE", raising=False)
    yield store


def _torchrun_ranks(world: int, local: int) -> list[tuple[object, str, int, str]]:
    """What each rank's start-up under torchrun returns (rank 0's server first), run at once."""
    from concurrent.futures import ThreadPoolExecutor

    from ccbench.run.launchers import LaunchInfo, _via_torchrun_store

    def start(rank: int) -> tuple[object, str, int, str]:
        info = LaunchInfo("torchrun", rank, world, rank % local, local)
        return _via_torchrun_store(info, 60, 60)

    with ThreadPoolExecutor(world) as pool:
        return list(pool.map(start, range(world)))


_KEY = "ccbench/control/t/0"


def test_torchrun_store_never_holds_the_secret_on_one_host(torchrun_store, tmp_path) -> None:
    """Anyone who reaches torchrun's store can read it: it holds the path of a file only this
    user can read, not the secret, and a path someone else put there is refused."""
    from ccbench.run.control import ControlClient

    started = _torchrun_ranks(3, 3)
    server, secret = started[0][0], started[0][3]
    assert {s for _, _, _, s in started} == {secret}
    assert not torchrun_store.check([_KEY + "/secret"])
    path = torchrun_store.get(_KEY + "/secret-file").decode()
    assert secret not in {torchrun_store.get(_KEY).decode(), path}
    clients = [ControlClient(host, port, rank, secret=s)
               for rank, (_, host, port, s) in enumerate(started)]
    _wait_gone(path)                     # removed once every rank has proven the secret
    for client in clients:
        client.close()
    server.close()                                                  # type: ignore[attr-defined]
    foreign = tmp_path / "secret"
    foreign.write_text("a" * 64)
    foreign.chmod(0o644)                 # not private: anyone could have written it
    torchrun_store.set(_KEY + "/secret-file", str(foreign))
    from ccbench.run.launchers import LaunchInfo, _via_torchrun_store

    with pytest.raises(RunFailure, match="is not a private file of this user"):
        _via_torchrun_store(LaunchInfo("torchrun", 1, 3, 1, 3), 60, 60)
    # one line: a second rank refused leaves without one, and the ranks torchrun then stops
    # see that a rank has said why (they said 'lost the control store ... 0 (dead)')
    with pytest.raises(SystemExit):
        _via_torchrun_store(LaunchInfo("torchrun", 2, 3, 2, 3), 60, 60)
    from ccbench.run.launchers import spoken_before_connecting

    spoken = spoken_before_connecting()
    assert spoken is not None and spoken()


def test_a_secret_file_is_removed_by_a_rank_that_ends_at_once() -> None:
    """os._exit (a rank stopped by torchrun, a failed MPI rank) skips atexit: the secret file
    rank 0 wrote was left in the temporary folder."""
    from ccbench.run.secretfile import remove_written, write_secret_file

    path = write_secret_file("s" * 64)
    assert os.path.exists(path)
    remove_written()
    assert not os.path.exists(path)


def _wait_gone(path: str) -> None:
    deadline = time.monotonic() + 60
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(path)


def test_torchrun_across_hosts_agrees_on_keys_nobody_reading_the_store_learns(
        torchrun_store, capfd) -> None:
    """Across hosts (one rank per node here), each rank agrees a key of its own with rank 0:
    the store holds only public values, a rank's key does not let it speak as another, and
    rank 0 says in one line what only a shared secret closes."""
    from ccbench.run.control import ControlClient

    started = _torchrun_ranks(3, 1)
    server, host, port = started[0][:3]
    keys = [s for _, _, _, s in started]
    assert len(set(keys)) == 3
    published = {torchrun_store.get(f"{_KEY}/pub/{rank}").decode() for rank in range(3)}
    assert not set(keys) & published and torchrun_store.get(_KEY).decode() == f"{host}:{port}"
    clients = [ControlClient(host, port, rank, secret=key) for rank, key in enumerate(keys)]
    with pytest.raises(RunFailure, match="refused rank 2's proof"):
        ControlClient(host, port, 2, secret=keys[1])
    with pytest.raises(RunFailure, match="another rank's time"):      # only its own times
        clients[1].set("m/1/times/2", {"samples": [3000.0], "wrong": 0, "copy_us": None})
    clients[2].set("m/1/times/2", {"samples": [1e-5], "wrong": 0, "copy_us": None})
    for client in clients:
        client.close()
    server.close()                                                  # type: ignore[attr-defined]
    assert capfd.readouterr().err.count("torchrun across hosts without CCBENCH_CONTROL_SECRET") == 1


def test_torchrun_takes_the_secret_you_give(torchrun_store, tmp_path, monkeypatch) -> None:
    """CCBENCH_CONTROL_SECRET_FILE (a private file, e.g. on a shared home) or
    CCBENCH_CONTROL_SECRET: every rank uses it, on one host or several; nothing is published."""
    given = tmp_path / "secret"
    given.write_text("my-own-secret-of-this-cluster\n")
    given.chmod(0o600)
    monkeypatch.setenv("CCBENCH_CONTROL_SECRET_FILE", str(given))
    started = _torchrun_ranks(3, 1)
    assert {s for _, _, _, s in started} == {"my-own-secret-of-this-cluster"}
    assert not torchrun_store.check([_KEY + "/secret-file", _KEY + "/pub/1"])
    started[0][0].close()                                           # type: ignore[attr-defined]
    given.chmod(0o640)
    from ccbench.run.control import secret_from_env

    with pytest.raises(UsageError, match="CCBENCH_CONTROL_SECRET_FILE: .* is not a private file"):
        secret_from_env()


# -- torchrun's report ------------------------------------------------------------------------
def _torchrun_report(error_file: Path, exitcode: int) -> str:
    """The report torchrun prints for one failed worker with this error file."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    failure = ProcessFailure(local_rank=0, pid=1, exitcode=exitcode, error_file=str(error_file))
    return str(ChildFailedError("ccbench", {0: failure}))


def test_torchrun_reports_the_error_line_as_the_root_cause(tmp_path: Path) -> None:
    """A rank under torchrun writes its error line to torchrun's error file, so the report's
    root cause is that line, not "To enable traceback see ..."."""
    error_file = tmp_path / "error.json"
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(error_file),
           "TORCHELASTIC_RUN_ID": "t"}
    proc = subprocess.run([PYTHON, "-m", "ccbench", "allreduce", "--iters", "-1"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2
    line = proc.stderr.strip().splitlines()[-1]
    assert is_error_line(line), proc.stderr
    report = _torchrun_report(error_file, proc.returncode)
    root = report.split("Root Cause")[1]
    assert f"traceback : {line}" in root, report


@pytest.mark.matrix
def test_torchrun_report_names_the_dead_rank(tmp_path: Path) -> None:
    """The whole way: a rank that exits mid-run under torchrun; torchrun's report ends with
    the surviving rank's line naming it."""
    proc = subprocess.run([TORCHRUN, "--nproc-per-node", "2", "-m", "ccbench", "allreduce",
                           "--sizes", "1K-64K", "--iters", "2", "--warmup", "1", "-q",
                           "--timeout", "10", "--output", str(tmp_path / "r.jsonl")],
                          env={**os.environ, "CCBENCH_FAULT": "mid-run:1:exit"},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if is_error_line(line)]
    assert len(lines) == 1 and "ranks that did not arrive: 1 (dead)" in lines[0], proc.stderr
    root = proc.stderr.split("Root Cause")[1]
    assert f"traceback : {lines[0]}" in root, proc.stderr
