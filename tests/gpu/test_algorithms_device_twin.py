"""ccbench's own algorithms on device buffers, on their CPU twins: every algorithm x collective
x dtype x op over the nccl backend's point-to-point code (torch.distributed batch send/recv,
here over gloo) with the CuPy kernels run by TwinReducer on a fake CuPy, next to the native
nccl twin on the same inputs; and over MPI with CuPy buffers, CUDA-aware and host-staged.
Every result is compared bit for bit (the harness's validation: wrong must be 0)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_cpu_twins import DRIVER, MPIEXEC, PYTHON, _run_local

from ccbench.backends.algorithmic import algorithm_names
from ccbench.records import load_records

ALL_OPS = "sum,max,min,prod"


def test_every_algorithm_over_the_nccl_twin_is_exact(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    names = [f"{a}@nccl" for a in algorithm_names()]
    procs = _run_local(3, ["--nccl-twin", "--fake-cupy"],
                       ["all", "--backend", ",".join([*names, "nccl"]), "--device", "cuda",
                        "--sizes", "1K", "--dtype", "all", "--op", ALL_OPS, "--iters", "1",
                        "--warmup", "0", "--timeout", "60", "-q", "--output", str(out)], {})
    for proc in procs:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = load_records(out)
    assert records and all(r.wrong == 0 for r in records), [r for r in records if r.wrong]
    assert {r.backend for r in records} == {*names, "nccl"}
    mine = [r for r in records if r.backend != "nccl"]
    # the reductions ran in the CuPy kernels' code (on the fake: TwinReducer's arithmetic)
    assert {r.environment["reductions"] for r in mine} == {"CupyReducer"}
    assert {(r.transport, r.library) for r in mine} == {("nccl", "nccl")}
    assert {(r.transport, r.library) for r in records if r.backend == "nccl"} == {("torch",
                                                                                  "nccl")}
    # every collective with a schedule, every dtype and op; the native twin beside each
    seen = {(r.backend, r.collective, r.dtype, r.op) for r in records}
    for r in mine:
        assert ("nccl", r.collective, r.dtype, r.op) in seen
    # float8 moved only (no reduction kernel): present through the data-moving collectives
    assert {r.dtype for r in mine} == {"float32", "float64", "float16", "bfloat16", "int32",
                                       "int8", "int64", "uint8", "float8_e4m3fn",
                                       "float8_e5m2"}
    assert not {r.op for r in mine if r.dtype.startswith("float8")} - {None}
    assert {r.op for r in mine if r.collective == "allreduce"} == set(ALL_OPS.split(","))
    assert {r.collective for r in mine} == {"broadcast", "allreduce", "allgather",
                                            "reduce-scatter", "alltoall", "reduce"}


@pytest.mark.skipif(not Path(MPIEXEC).exists(), reason="needs mpiexec")
@pytest.mark.parametrize("aware,label", [("0", "host-staging"), ("1", "cuda-aware")])
def test_algorithms_over_mpi_with_cupy_buffers(aware: str, label: str, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "CCBENCH_CONTROL", "MASTER_ADDR")}
    env["CCBENCH_MPI_CUDA_AWARE"] = aware
    proc = subprocess.run([MPIEXEC, "-n", "3", PYTHON, DRIVER, "--fake-cupy", "--",
                           "all", "--backend", "ring@mpi,hypercube@mpi,tree@mpi",
                           "--device", "cuda", "--sizes", "1K", "--dtype",
                           "float32,bfloat16,float16", "--op", "sum,prod", "--iters", "1",
                           "--warmup", "0", "--timeout", "60", "-q", "--output", str(out)],
                          capture_output=True, text=True, timeout=400, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = load_records(out)
    assert records and all(r.wrong == 0 for r in records)
    assert {r.method["buffers"] for r in records} == {label}
    assert {r.environment["reductions"] for r in records} == {"CupyReducer"}
    # bfloat16 reductions, which MPI itself cannot do, ran in ccbench's kernels
    assert any(r.dtype == "bfloat16" and r.collective == "allreduce" for r in records)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
