"""The device code paths on the CPU: the nccl backend's code over gloo (tests/gpu/cpu_twins.py)
and the mpi backend's CuPy buffers over host memory (tests/gpu/fake_cupy.py), both in real
multi-process runs through the harness, validated bit-exact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from ccbench.records import load_records
from ccbench.run.addresses import free_port

HERE = Path(__file__).resolve().parent
DRIVER = str(HERE / "ccbench_with.py")
PYTHON = sys.executable
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
SIZES = "8,1K,3000"
BENCH = ["all", "--sizes", SIZES, "--dtype", "all", "--op", "sum,max", "--iters", "2",
         "--warmup", "1", "-q", "--timeout", "60"]


def _run_local(world: int, flags: list[str], bench: list[str], env: dict[str, str],
               timeout: float = 300) -> list[subprocess.CompletedProcess[str]]:
    """`world` ranks started the way `ccbench launch` starts them (the local launcher)."""
    control = f"127.0.0.1:{free_port('127.0.0.1')}"
    procs = []
    for rank in range(world):
        rank_env = {**os.environ, **env}
        if world > 1:
            rank_env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                            LOCAL_WORLD_SIZE=str(world), CCBENCH_CONTROL=control,
                            CCBENCH_CONTROL_SECRET="cpu-twin")
        procs.append(subprocess.Popen([PYTHON, DRIVER, *flags, "--", *bench], env=rank_env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


@pytest.mark.parametrize("world", [pytest.param(1, marks=pytest.mark.matrix), 2])
@pytest.mark.parametrize("timing", ["per-op", "pipelined"])
def test_nccl_code_on_cpu_twin(world: int, timing: str, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    counts = tmp_path / "counts"
    procs = _run_local(world, ["--nccl-twin"],
                       [*BENCH, "--backend", "nccl", "--timing", timing, "--pipeline", "3",
                        "--nccl-algo", "Ring", "--output", str(out)],
                       {"CCBENCH_TWIN_COUNTS": str(counts)})
    for proc in procs:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = load_records(out)
    assert records and all(r.wrong == 0 for r in records)
    assert {r.backend for r in records} == {"nccl"}
    assert {r.device for r in records} == {"cuda:0"}          # rank 0 drives device 0
    assert {r.environment["nccl_algo"] for r in records} == {"Ring"}
    assert {r.environment["backend"]["NCCL_ALGO"] for r in records} == {"Ring"}
    assert {r.dtype for r in records} >= {"bfloat16", "float16", "int8"}
    for rank in range(world):
        seen = json.loads(Path(f"{counts}.{rank}.json").read_text())
        assert seen["set_device"] == 1
        # every sample and every validation is one barrier and one device synchronize; the
        # local copy an out-of-place allreduce makes is timed alone, a synchronize per copy
        collective_syncs = seen["synchronize"] - seen["local_copy"]
        assert seen["local_copy"] > 0
        assert collective_syncs == seen["barrier"] > 0
        if timing == "per-op":        # the harness waits for the device after every op
            assert collective_syncs == seen["run"]
        else:                         # ... and once per batch of --pipeline (3) ops; each
            # (case, size) has 1 warm-up + 2 timed samples of 3 ops and 1 validation op
            assert seen["run"] == collective_syncs // 4 * (3 * 3 + 1)


def _mpi_fake(world: int, aware: str, tmp_path: Path, extra: list[str] | None = None
              ) -> subprocess.CompletedProcess[str]:
    out = tmp_path / "r.jsonl"
    return subprocess.run(
        [MPIEXEC, "-n", str(world), PYTHON, DRIVER, "--fake-cupy", "--cupy-mpi", "--", *BENCH,
         "--backend", "mpi", "--device", "cuda", "--output", str(out), *(extra or [])],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "CCBENCH_MPI_CUDA_AWARE": aware})


needs_mpi = pytest.mark.skipif(not Path(MPIEXEC).exists(), reason=f"no {MPIEXEC}")


@needs_mpi
@pytest.mark.parametrize("world", [pytest.param(1, marks=pytest.mark.matrix), 2,
                                   pytest.param(3, marks=pytest.mark.matrix)])
@pytest.mark.parametrize("aware, label", [("0", "host-staging"), ("1", "cuda-aware")])
def test_mpi_cupy_buffers_on_fake_cupy(world: int, aware: str, label: str, tmp_path: Path
                                       ) -> None:
    proc = _mpi_fake(world, aware, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = load_records(tmp_path / "r.jsonl")
    assert records and all(r.wrong == 0 for r in records)
    assert {r.environment["buffers"] for r in records} == {label}
    assert {r.environment["buffers_detected_by"] for r in records} == {
        f"CCBENCH_MPI_CUDA_AWARE={aware}"}
    assert {r.device for r in records} == {"cuda:0"}
    assert {r.world_size for r in records} == {world}
    # data movement runs for every dtype, bfloat16 included (stored as its bit patterns)
    assert {(r.collective, r.dtype) for r in records} >= {("allgather", "bfloat16"),
                                                          ("alltoall", "bfloat16")}


@needs_mpi
def test_mpi_cupy_pipelined_staging(tmp_path: Path) -> None:
    proc = _mpi_fake(2, "0", tmp_path, ["--timing", "pipelined", "--pipeline", "4"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = load_records(tmp_path / "r.jsonl")
    assert records and all(r.wrong == 0 and r.timing == "pipelined" for r in records)


def test_bad_override_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from ccbench.backends.cuda_mpi import cuda_support
    from ccbench.errors import UsageError

    monkeypatch.setenv("CCBENCH_MPI_CUDA_AWARE", "yes")
    with pytest.raises(UsageError, match="valid: 0, 1"):
        cuda_support(SimpleNamespace())


def test_mpi4py_query_is_preferred(monkeypatch: pytest.MonkeyPatch) -> None:
    from ccbench.backends.cuda_mpi import cuda_support

    monkeypatch.delenv("CCBENCH_MPI_CUDA_AWARE", raising=False)
    assert cuda_support(SimpleNamespace(Query_cuda_support=lambda: True)) == (
        True, "MPI.Query_cuda_support()")
    assert cuda_support(SimpleNamespace(Query_cuda_support=lambda: False))[0] is False


@needs_mpi
def test_loaded_libmpi_is_asked_after_init() -> None:
    """Without mpi4py's query the loaded libmpi's MPIX_Query_cuda_support decides (Intel MPI
    here exports it and answers 0 without a CUDA build)."""
    code = ("from mpi4py import MPI\n"
            "from ccbench.backends.cuda_mpi import cuda_support\n"
            "print(cuda_support(MPI))\n")
    env = {k: v for k, v in os.environ.items() if k != "CCBENCH_MPI_CUDA_AWARE"}
    proc = subprocess.run([MPIEXEC, "-n", "1", PYTHON, "-c", code], capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "MPIX_Query_cuda_support()" in proc.stdout or "has no MPIX" in proc.stdout


@needs_mpi
def test_uninitialised_mpi_is_not_asked() -> None:
    """Before MPI_Init the query would abort an MPICH-based library: it must not be called."""
    code = ("import mpi4py; mpi4py.rc.initialize = False\n"
            "from mpi4py import MPI\n"
            "from ccbench.backends.cuda_mpi import cuda_query_symbol, cuda_support\n"
            "print(cuda_support(MPI)); print(cuda_query_symbol())\n")
    env = {k: v for k, v in os.environ.items() if k != "CCBENCH_MPI_CUDA_AWARE"}
    proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    assert "not initialised" in proc.stdout


def test_cupy_missing_is_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from ccbench.backends import cuda_mpi

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "cupy" else real(name, *a))
    assert cuda_mpi.cupy_missing_reason() == "cupy is not installed (pip install 'ccbench[cuda]')"
    reason = cuda_mpi.CudaMPIBackend.unavailable_reason()
    assert reason is not None and ("cupy" in reason or "mpi4py" in reason)


CHECK = HERE / "check.sh"


def _device_present() -> bool:
    sys.path.insert(0, str(HERE))
    import device_checks

    return device_checks.skip_reason() is None


@pytest.mark.skipif(_device_present(), reason="a device is here: check.sh runs for real")
def test_check_script_without_a_device_checks_nothing_and_says_so(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(CHECK)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OUT": str(tmp_path), "PYTHON": PYTHON})
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    log = (tmp_path / "gpu-check.log").read_text()
    assert "no usable device:" in log and "nothing checked" in log


#: what check.sh leaves under $OUT: a device run brings back at most 8 files, none deeper
#: than 2 folders, so the records travel packed in one archive
CHECK_FILES = {"gpu-check.log", "environment.txt", "doctor.json", "steps.tsv", "records.tar.gz"}


def _check_outputs(out: Path) -> tuple[str, dict[str, int]]:
    """(the log, {records file in the archive: bytes}); asserts the $OUT layout."""
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {p.name for p in files} <= CHECK_FILES and len(files) <= 8, files
    assert all(p.parent == out for p in files), files
    with tarfile.open(out / "records.tar.gz") as tar:
        packed = {Path(m.name).name: m.size for m in tar.getmembers() if m.isfile()}
    return (out / "gpu-check.log").read_text(), packed


@pytest.mark.slow
@pytest.mark.matrix                  # the whole script; CI runs its time guard and no-device runs
@pytest.mark.timeout(2400)          # the whole check script: minutes, more on a loaded machine
@needs_mpi
def test_check_script_steps_on_cpu_twin(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(CHECK), "--cpu-twin"], capture_output=True, text=True,
                          timeout=2400, env={**os.environ, "OUT": str(tmp_path), "PYTHON": PYTHON})
    log, packed = _check_outputs(tmp_path)
    assert proc.returncode == 0, log[-4000:]
    assert "failed 0" in log and "FAIL" not in log and "time guard" not in log
    for name in ("nccl-w1-per-op.jsonl", "nccl-w1-pipelined.jsonl", "mpi-cupy-host-staging-per-op.jsonl",
                 "mpi-cupy-cuda-aware-pipelined.jsonl", "nccl-cupy-w1-per-op.jsonl",
                 "nccl-cupy-w1-pipelined.jsonl", "nccl-cupy-w1-graph.jsonl",
                 "nccl-paths-allreduce.jsonl", "algorithms-nccl-w1.jsonl", "bandwidth-w1.jsonl",
                 "algorithms-nccl-cupy-w1.jsonl", "algorithms-mpi-cupy-host-staging.jsonl"):
        assert packed.get(name, 0) > 0, name
    assert (tmp_path / "doctor.json").stat().st_size > 0
    assert "PASS  every algorithm at 2 and 4 thread ranks on one device, exact" in log
    assert "PASS  every algorithm at 8 thread ranks on one device, exact" in log
    assert "PASS  nccl-cupy per-op beside pipelined" in log
    environment = (tmp_path / "environment.txt").read_text()
    for key in ("torch: ", "torch nccl: ", "cupy: ", "numpy: ", "ccbench imported from: "):
        assert key in environment, key
    steps = (tmp_path / "steps.tsv").read_text().splitlines()
    assert steps[0].split("\t") == ["step", "result", "seconds", "timeout_s"]
    assert {line.split("\t")[1] for line in steps[1:]} <= {"pass", "skip"}


def test_check_script_time_guard_skips_every_step_and_says_so(tmp_path: Path) -> None:
    """Past TIME_GUARD no step starts: each says so, and what ran is still under $OUT."""
    proc = subprocess.run(["bash", str(CHECK), "--cpu-twin"], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "OUT": str(tmp_path), "PYTHON": PYTHON,
                                            "TIME_GUARD": "0"})
    log = (tmp_path / "gpu-check.log").read_text()
    assert proc.returncode == 0, log[-4000:]
    assert "SKIP  doctor: time guard" in log and "PASS" not in log
    assert "SKIP  nccl world 1 per-op, all collectives x dtypes x ops: time guard" in log
    files = {p.name for p in tmp_path.rglob("*") if p.is_file()}
    assert files <= CHECK_FILES and "environment.txt" in files and "steps.tsv" in files


def test_device_checks_read_float8_as_the_harness_does() -> None:
    """device_checks' in-process exactness check over the nccl backend's code (gloo on the CPU):
    float8 buffers are held as their bytes, so the check must view them as the dtype, as the
    harness does (on an H200 it counted 2769 of 3000 float8 elements wrong without the view)."""
    sys.path.insert(0, str(HERE))
    import device_checks
    from cpu_twins import NCCLCpuTwin

    backend, close = device_checks.make_backend(NCCLCpuTwin)
    try:
        results = device_checks.check_every_collective_exact(backend)
    finally:
        close()
    assert any("float8" in what for _, what in results)
    assert [what for ok, what in results if not ok] == []


def test_mpi_without_a_float16_datatype_moves_its_bits() -> None:
    """Open MPI 4.1 (Debian's, on an H200 machine) has no float16 datatype: a float16 broadcast
    failed with MPI_ERR_TYPE. The backend's probe finds that and moves float16 as its bits."""
    from types import SimpleNamespace

    import numpy as np

    from ccbench.backends import mpi

    class NoFloat16Comm:
        def Bcast(self, buf: np.ndarray, root: int) -> None:  # noqa: N802 (mpi4py's name)
            if buf.dtype == np.float16:
                raise RuntimeError("MPI_ERR_TYPE: invalid datatype")

    fake = SimpleNamespace(_probed={}, comm=NoFloat16Comm(), MPI=SimpleNamespace(Exception=RuntimeError))
    try:
        mpi.MPIBackend._probe_datatype(fake, np.dtype(np.float16))   # type: ignore[arg-type]
        mpi.MPIBackend._probe_datatype(fake, np.dtype(np.float32))   # type: ignore[arg-type]
        half = np.arange(5, dtype=np.float16)
        assert mpi._raw(half).dtype == np.uint16
        assert mpi._raw(half).view(np.float16).tolist() == half.tolist()
        assert mpi._raw(np.ones(2, np.float32)).dtype == np.float32
    finally:
        mpi._NO_DATATYPE.clear()
