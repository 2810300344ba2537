"""Real multi-process runs at 1, 2, 3 and 4 ranks: every collective x dtype x op x mode,
validated bit-exact by the harness, on gloo and MPI in one launch."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from conftest import have_mpi, run_ccbench

from ccbench.backends import backend_class
from ccbench.collectives import COLLECTIVES, OPS, REDUCING, get
from ccbench.dtypes import DTYPES
from ccbench.records import load_records

# 3000 B gives odd element counts (750 float32, 3000 int8) and non-divisible splits at 3 ranks
SIZES = "8,1K,3000,33K"


def expected_cases(backend: str, world: int) -> set[tuple[object, ...]]:
    refuses = backend_class(backend).refuses
    cases = set()
    for collective, dtype in itertools.product(COLLECTIVES, DTYPES):
        ops = OPS if collective in REDUCING else (None,)
        modes = get(collective).modes((False, True))   # broadcast in place, sendrecv not
        for op, inplace in itertools.product(ops, modes):
            if refuses(DTYPES[dtype], op):
                continue      # MPI's avg and bfloat16 sums, gloo's float8 ...: a note, no record
            cases.add((backend, collective, dtype, op, inplace))
    return cases


def test_refusals_are_what_the_libraries_lack() -> None:
    """What the cases above leave out, spelled out: a refusal that grew by mistake would
    shrink the run without failing it."""
    def refused(backend: str) -> set[tuple[str, str | None]]:
        refuses = backend_class(backend).refuses
        return {(d, op) for d in DTYPES for op in (*OPS, None) if refuses(DTYPES[d], op)}

    float8 = ("float8_e4m3fn", "float8_e5m2")
    assert refused("gloo") == ({(d, op) for d in float8 for op in OPS}
                               | {(d, "avg") for d in ("int32", "int8", "int64", "uint8")})
    assert refused("mpi") == ({(d, "avg") for d in DTYPES}
                              | {(d, op) for d in ("bfloat16", *float8) for op in OPS})


MATRIX = pytest.mark.matrix


# CI: 3 ranks (odd); 1, 2 and 4 in the matrix run
@pytest.mark.parametrize("world", [pytest.param(1, marks=MATRIX), pytest.param(2, marks=MATRIX), 3,
                                   pytest.param(4, marks=MATRIX)])
def test_every_case_exact(world: int, tmp_path: Path) -> None:
    backends = "gloo,mpi" if have_mpi() else "gloo"
    out = tmp_path / "r.jsonl"
    proc = run_ccbench("launch", "-n", str(world), "all", "--backend", backends, "--sizes", SIZES,
                       "--dtype", "all", "--op", "all",
                       "--iters", "2", "--warmup", "1", "--check", "1", "-q", "--timeout", "60",
                       "--output", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = load_records(out)
    assert records
    assert all(r.wrong == 0 for r in records), [r for r in records if r.wrong]
    assert all(r.world_size == world for r in records)
    for backend in backends.split(","):
        seen = {(r.backend, r.collective, r.dtype, r.op, r.inplace) for r in records
                if r.backend == backend}
        assert seen == expected_cases(backend, world)
    # the table footer reports no wrong values
    assert "Out of bounds values : 0 OK" in proc.stdout
    if have_mpi():
        assert "unsupported by mpi" in proc.stdout


def test_wrong_results_fail_the_run(tmp_path: Path) -> None:
    """A corrupted result must make the exit status non-zero: CCBENCH_CORRUPT flips one element."""
    proc = run_ccbench("launch", "-n", "2", "allreduce", "--backend", "gloo", "--sizes", "1K",
                       "--iters", "1", "--warmup", "0", "-q", "-O", str(tmp_path / "r.jsonl"),
                       env={"CCBENCH_CORRUPT": "1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED" in proc.stdout
    # rank 0 says why, and that is the launcher's error line (not its "no rank said why")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ccbench: error:")]
    assert errors == [
        "ccbench: error: validation failed: 2 wrong values in 2 measurements (gloo allreduce "
        "float32 sum out-of-place at 1K: 1; gloo allreduce float32 sum in-place at 1K: 1); "
        f"every record is kept in {tmp_path / 'r.jsonl'}, with its count in `wrong`"], proc.stderr


@pytest.mark.parametrize("world", [2, 3])
def test_avg_on_the_algorithm_backends_is_exact(world: int, tmp_path: Path) -> None:
    """ccbench's own schedules average as the sum's schedule and one division by p: exact
    for every dtype their kernels have, at 2 and 3 ranks."""
    backends = "ring,hypercube" if have_mpi() else "ring@gloo"
    out = tmp_path / "r.jsonl"
    proc = run_ccbench("launch", "-n", str(world), "allreduce,reduce-scatter", "--backend",
                       backends, "--op", "avg", "--dtype", "float32,bfloat16,int8,uint8",
                       "--sizes", "8,3000", "--iters", "2", "--warmup", "1", "-q",
                       "--timeout", "60", "--output", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = load_records(out)
    assert {r.op for r in records} == {"avg"}
    assert {r.dtype for r in records} == {"float32", "bfloat16", "int8", "uint8"}
    assert all(r.wrong == 0 for r in records), [r for r in records if r.wrong]
