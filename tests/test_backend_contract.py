"""The contract every registered backend keeps: a Backend subclass under its registry name whose
unavailable_reason() answers None or a reason without raising; and every available CPU backend
runs every collective it has a builder for x dtype x op at world size 1 (mpi under mpiexec -n 1) with no wrong
element."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest
from conftest import MPIEXEC, PYTHON, have_mpi

from ccbench.backends import REGISTRY, backend_class
from ccbench.backends.base import Backend
from ccbench.collectives import COLLECTIVES
from ccbench.records import load_records

#: backends whose buffers live on a device; their world-size-1 run is in tests/gpu/check.sh
DEVICE_BACKENDS = frozenset({"nccl", "rccl", "nccl-cupy"})


def _class(name: str) -> type[Backend]:
    module = REGISTRY[name].partition(":")[0]
    assert importlib.util.find_spec(module) is not None, f"{module} is registered but missing"
    return backend_class(name)


def _algorithm_names() -> list[str]:
    from ccbench.backends.algorithmic import TRANSPORTS, algorithm_names

    return [f"{algorithm}@{transport}" for algorithm in algorithm_names()
            for transport in TRANSPORTS]


@pytest.mark.parametrize("name", list(REGISTRY))
def test_registered_class_keeps_the_contract(name: str) -> None:
    cls = _class(name)
    assert isinstance(cls, type) and issubclass(cls, Backend)
    assert cls.name == name
    reason = cls.unavailable_reason()
    assert reason is None or (isinstance(reason, str) and reason.strip()), repr(reason)


@pytest.mark.parametrize("name", _algorithm_names())
def test_algorithm_class_keeps_the_contract(name: str) -> None:
    factory = backend_class(name)           # an AlgorithmSpec wrapping the transport's class
    assert factory.name == name and callable(factory)
    assert isinstance(factory.needs_mpi_launcher, bool)
    reason = factory.unavailable_reason()
    assert reason is None or (isinstance(reason, str) and reason.strip()), repr(reason)


def test_device_buffer_variant_keeps_the_contract() -> None:
    from ccbench.backends.cuda_mpi import CudaMPIBackend

    assert issubclass(CudaMPIBackend, Backend) and CudaMPIBackend.name == "mpi"
    reason = CudaMPIBackend.unavailable_reason()
    assert reason is None or (isinstance(reason, str) and reason.strip())


@pytest.mark.parametrize("name", [n for n in REGISTRY if n not in DEVICE_BACKENDS])
def test_world_size_one_run_is_exact(name: str, tmp_path: Path) -> None:
    cls = _class(name)
    reason = cls.unavailable_reason()
    if reason:
        # CI installs every CPU backend (.ci/run): there a missing one is a failure
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {name} is unavailable: {reason}")
        pytest.skip(f"{name} unavailable: {reason}")
    out = tmp_path / "r.jsonl"
    command = [PYTHON, "-m", "ccbench", "all", "--backend", name, "--sizes", "8,1K",
               "--dtype", "all", "--op", "sum,max", "-q", "--iters", "3", "--warmup", "1",
               "--timeout", "120", "--output", str(out)]
    if cls.needs_mpi_launcher:
        if not have_mpi():
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI=true but {name} has no {MPIEXEC}")
            pytest.skip(f"{name} needs {MPIEXEC}")
        command = [MPIEXEC, "-n", "1", *command]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "CCBENCH_CONTROL", "MASTER_ADDR")}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = load_records(out)
    assert records, proc.stdout[-2000:]
    assert all(r.wrong == 0 for r in records), [r for r in records if r.wrong]
    assert {r.backend for r in records} == {name}
    assert {r.world_size for r in records} == {1}
    assert {r.collective for r in records} == {c for c in COLLECTIVES if c in cls.builders}
    assert {r.collective for r in records} >= {"allreduce", "broadcast", "sendrecv"}
