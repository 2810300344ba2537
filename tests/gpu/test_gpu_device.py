"""GPU tests: they need a CUDA (or ROCm) device and skip with the reason otherwise. The full
GPU check (every collective and dtype through the CLI, MPI with CuPy buffers at 2 ranks) is
tests/gpu/check.sh; these are the parts that fit a pytest run."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import device_checks  # noqa: E402

from ccbench.records import load_records  # noqa: E402

_REASON = device_checks.skip_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_REASON is not None,
                                                  reason=f"no usable device: {_REASON}")]
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")


@pytest.fixture(scope="module")
def backend() -> Iterator[Any]:
    made, close = device_checks.make_backend()
    yield made
    close()


def _assert_all(results: list[tuple[bool, str]]) -> None:
    failed = [what for ok, what in results if not ok]
    assert not failed, failed


def test_synchronize_waits_for_the_device(backend: Any) -> None:
    _assert_all(device_checks.check_synchronize_waits(backend))


def test_pipelined_timing_includes_device_work(backend: Any) -> None:
    _assert_all(device_checks.check_pipelined_includes_device_work(backend))


def test_every_collective_exact_in_process(backend: Any) -> None:
    _assert_all(device_checks.check_every_collective_exact(backend))


@pytest.mark.parametrize("timing", ["per-op", "pipelined"])
def test_cli_world_size_one(timing: str, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    from ccbench.backends.nccl import NCCLBackend

    name = "nccl" if NCCLBackend.unavailable_reason() is None else "rccl"
    proc = subprocess.run([sys.executable, "-m", "ccbench", "all", "--backend", name, "--sizes",
                           "8,1K,1M", "--dtype", "all", "--op", "sum,max", "--timing", timing,
                           "--iters", "3", "--warmup", "1", "-q", "--output", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = load_records(out)
    assert records and all(r.wrong == 0 for r in records)
    assert {r.device for r in records} == {"cuda:0"}


@pytest.mark.skipif(not Path(MPIEXEC).exists(), reason=f"no {MPIEXEC}")
def test_mpi_cupy_buffers_two_ranks(tmp_path: Path) -> None:
    pytest.importorskip("cupy")
    out = tmp_path / "r.jsonl"
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(HERE / "ccbench_with.py"),
                           "--cupy-mpi", "--", "all", "--backend", "mpi", "--device", "cuda",
                           "--sizes", "8,1K,1M", "--dtype", "all", "--op", "sum,max",
                           "--iters", "3", "--warmup", "1", "-q", "--output", str(out)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "CCBENCH_MPI_CUDA_AWARE": "0"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = load_records(out)
    assert records and all(r.wrong == 0 for r in records)
    assert {r.environment["buffers"] for r in records} == {"host-staging"}
