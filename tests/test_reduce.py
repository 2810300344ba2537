"""reduce, the collective added through the registry: every op and dtype on a root that is
not rank 0, at 2 and 3 ranks (an odd world), on gloo, MPI and two algorithm backends (tree
and ring schedules), validated bit-exact on the root; and MPI's compiled C loop computes what
MPI_Reduce must."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from conftest import MPIEXEC, PYTHON, have_mpi, missing_prerequisite, run_ccbench

from ccbench.backends import backend_class
from ccbench.collectives import OPS, get
from ccbench.dtypes import DTYPES
from ccbench.records import load_records

SIZES = "8,3000,33K"         # 3000 B: odd element counts (750 float32, 3000 int8)


def test_the_registry_says_what_reduce_is() -> None:
    spec = get("reduce")
    assert spec.reduces and spec.rooted and spec.busbw(3) == 1.0
    lay = spec.layout(3000, 4, 3)
    assert (lay.count, lay.send_count, lay.recv_count, lay.size_used) == (750, 750, 750, 3000)
    assert spec.result_ranks(3, 2) == [2]
    assert spec.export is not None
    assert spec.export.chakra == "REDUCE" and spec.export.astra is None


# CI: 3 ranks (odd, the root is the last rank); 2 in the matrix run
@pytest.mark.parametrize("world", [pytest.param(2, marks=pytest.mark.matrix), 3])
def test_reduce_every_op_and_dtype_on_the_last_rank(world: int, tmp_path: Path) -> None:
    backends = ["gloo", "tree@gloo"] + (["mpi", "ring@mpi"] if have_mpi() else ["ring@gloo"])
    out = tmp_path / "r.jsonl"
    root = world - 1
    proc = run_ccbench("launch", "-n", str(world), "reduce", "--backend", ",".join(backends),
                       "--root", str(root), "--sizes", SIZES, "--dtype", "all", "--op", "all",
                       "--iters", "2", "--warmup", "1", "--check", "1", "-q", "--timeout", "60",
                       "--output", str(out), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = load_records(out)
    assert records and all(r.wrong == 0 for r in records), [r for r in records if r.wrong]
    assert {(r.collective, r.root, r.world_size) for r in records} == {("reduce", root, world)}
    for backend in backends:
        refuses = backend_class(backend).refuses      # MPI's avg and bfloat16, gloo's float8 ...
        seen = {(r.dtype, r.op, r.inplace) for r in records if r.backend == backend}
        want = {(d, o, i) for d, o, i in itertools.product(DTYPES, OPS, (False, True))
                if not refuses(DTYPES[d], o)}
        assert seen == want, backend
        assert len({o for _, o, _ in seen}) >= 4, backend          # sum, max, min, prod at least
    # nccl-tests' table: busbw = algbw for reduce, and the root in its column
    assert all(r.busbw_gbps == pytest.approx(r.algbw_gbps) for r in records)
    assert f"float32    sum {root:>4}" in proc.stdout


@pytest.mark.parametrize("root", [0, 1])
def test_a_wrong_reduce_result_on_the_root_fails_the_run(tmp_path: Path, root: int) -> None:
    """CCBENCH_CORRUPT flips one element the first rank with a defined result received: the
    root, rank 0 or not (a corrupted non-root would prove nothing: it is not compared)."""
    proc = run_ccbench("launch", "-n", "2", "reduce", "--backend", "gloo", "--sizes", "1K",
                       "--root", str(root), "--iters", "1", "--warmup", "0", "-q",
                       env={"CCBENCH_CORRUPT": "1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED" in proc.stdout


_LOOP_CHECK = textwrap.dedent("""
    import numpy as np
    from mpi4py import MPI
    from ccbench.backends.mpi_loop import C_LOOP, batch_call, loaded_libmpi

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    root = size - 1
    for in_place in (False, True):
        for op, mpi_op, fold in (("sum", MPI.SUM, np.add), ("max", MPI.MAX, np.maximum)):
            inputs = [np.arange(5, dtype=np.float64) * (r + 1) - r for r in range(size)]
            send = inputs[rank].copy()
            recv = send if in_place else np.full(5, -1.0)
            batch = batch_call(MPI, loaded_libmpi(), comm, "reduce", send, recv, mpi_op, root)
            assert batch is not None and batch.description == C_LOOP
            batch(1)
            want = inputs[0]
            for other in inputs[1:]:
                want = fold(want, other)
            if rank == root:
                assert np.array_equal(recv, want), (in_place, op, recv, want)
            else:
                assert np.array_equal(send, inputs[rank]), "a non-root's input changed"
                if not in_place:
                    assert np.all(recv == -1.0), "a non-root's recv was written"
    done = comm.gather(rank, root=0)          # one line: ranks' prints can interleave mid-line
    if rank == 0:
        print("loop ok", sorted(done))
""")


def test_the_compiled_mpi_loop_reduces_like_mpi_reduce(tmp_path: Path) -> None:
    if not have_mpi():
        missing_prerequisite("no mpiexec next to this Python")
    if not (shutil.which("cc") or shutil.which("gcc")):
        missing_prerequisite("no C compiler: the mpi backend falls back to itertools over "
                             "mpi4py")
    script = tmp_path / "loop.py"
    script.write_text(_LOOP_CHECK, encoding="utf-8")
    root = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.run([MPIEXEC, "-n", "3", PYTHON, str(script)], capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": root})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "loop ok [0, 1, 2]" in proc.stdout, proc.stdout[-2000:]


def test_reduce_single_process_and_unknown_root() -> None:
    proc = run_ccbench("reduce", "--backend", "gloo", "--sizes", "1K-64K", "--iters", "2",
                       "--warmup", "1", "-q", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "# Out of bounds values : 0 OK" in proc.stdout
    bad = run_ccbench("launch", "-n", "2", "reduce", "--backend", "gloo", "--root", "2",
                      "--sizes", "1K", "-q", timeout=300)
    assert bad.returncode == 2 and bad.stderr.startswith("ccbench: error:")
    assert "--root 2" in bad.stderr and "Traceback" not in bad.stderr
