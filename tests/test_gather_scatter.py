"""gather and scatter, the collectives added through the registry alone (one module each, one
line in the registry, a builder in the backends that have them): every dtype, in and out of
place, on a root that is not rank 0, at 2 and 3 ranks, validated bit-exact; the backends
without them say why; their cost formula, program names and trace rules come from their
Collective."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
from conftest import have_mpi, run_ccbench

from ccbench.backends import backend_class
from ccbench.bench.familiar import PROGRAMS
from ccbench.collectives import get
from ccbench.dtypes import DTYPES
from ccbench.model.costs import coefficients, predict_time
from ccbench.records import load_records
from ccbench.trace.ops import CommOp, Group
from ccbench.trace.scale import resize_op

SIZES = "24,3000,96K"        # 3000 B: blocks of 250 float32 at 3 ranks, 500 at 2 (odd counts)


def test_the_registry_says_what_gather_and_scatter_are() -> None:
    gather, scatter = get("gather"), get("scatter")
    assert gather.rooted and scatter.rooted and not (gather.reduces or scatter.reduces)
    assert gather.busbw(3) == scatter.busbw(3) == pytest.approx(2 / 3)
    lay = gather.layout(3000, 4, 3)
    assert (lay.count, lay.send_count, lay.recv_count, lay.size_used, lay.block) == \
        (750, 250, 750, 3000, 250)
    lay = scatter.layout(3000, 4, 3)
    assert (lay.count, lay.send_count, lay.recv_count, lay.size_used, lay.block) == \
        (750, 750, 250, 3000, 250)
    assert gather.result_ranks(3, 2) == [2]                         # the root's output only
    assert scatter.has_input(2, 2) and not scatter.has_input(0, 2)  # the root's input only
    assert gather.export is not None and scatter.export is not None
    assert (gather.export.chakra, scatter.export.chakra, gather.tools.mpi, scatter.tools.mpi) == \
        ("GATHER", "SCATTER", "MPI_Gather", "MPI_Scatter")
    assert PROGRAMS["gather_perf"] == "gather" and PROGRAMS["osu_scatter"] == "scatter"


@pytest.mark.parametrize("collective", ["gather", "scatter"])
@pytest.mark.parametrize("p", [2, 3, 4, 8, 6])
def test_binomial_tree_cost_is_lg_p_alpha_and_the_others_share_of_n(collective: str, p: int
                                                                      ) -> None:
    k = coefficients(collective, "binomial", p)
    assert (k.a, k.b, k.c) == (math.ceil(math.log2(p)), (p - 1) / p, 0.0)
    assert predict_time(collective, "tree", p, 1e6, 1e-6, 1e-9, 1e-10) == \
        pytest.approx(math.ceil(math.log2(p)) * 1e-6 + (p - 1) / p * 1e6 * 1e-9)
    assert coefficients(collective, "linear", p).a == p - 1


def test_trace_sizes_and_rescaling_follow_the_registry() -> None:
    group = Group("world", (0, 1, 2))
    root = CommOp(rank=0, index=0, node_id=1, name="c10d::gather_", collective="gather",
                  dtype="float32", elsize=4, in_bytes=400, out_bytes=1200, root=0, group=group)
    assert root.size == 1200                                  # S: the gathered output
    assert (resize_op(root, 3, 6).in_bytes, resize_op(root, 3, 6).out_bytes) == (400, 2400)
    leaf = CommOp(rank=1, index=0, node_id=1, name="c10d::scatter_", collective="scatter",
                  dtype="float32", elsize=4, in_bytes=0, out_bytes=400, root=0, group=group)
    assert leaf.size == 1200                                  # S: the root's whole input
    assert (resize_op(leaf, 3, 6).in_bytes, resize_op(leaf, 3, 6).out_bytes) == (0, 400)


# CI: 3 ranks (odd); 2 in the matrix run
@pytest.mark.parametrize("world", [pytest.param(2, marks=pytest.mark.matrix), 3])
def test_every_dtype_on_the_last_rank_is_exact(world: int, tmp_path: Path) -> None:
    backends = ["gloo", "mpi"] if have_mpi() else ["gloo"]
    out = tmp_path / "r.jsonl"
    root = world - 1
    proc = run_ccbench("launch", "-n", str(world), "gather,scatter", "--backend",
                       ",".join(backends), "--root", str(root), "--sizes", SIZES, "--dtype",
                       "all", "--iters", "2", "--warmup", "1", "--check", "1", "-q",
                       "--timeout", "60", "--output", str(out), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = load_records(out)
    assert records and all(r.wrong == 0 for r in records), [r for r in records if r.wrong]
    assert {(r.root, r.world_size) for r in records} == {(root, world)}
    for backend, collective in itertools.product(backends, ("gather", "scatter")):
        refuses = backend_class(backend).refuses
        seen = {(r.dtype, r.inplace, r.size_used) for r in records
                if (r.backend, r.collective) == (backend, collective)}
        want = {(d, i, s) for d, i in itertools.product(DTYPES, (False, True))
                if not refuses(DTYPES[d], None)
                for s in {r.size_used for r in records if r.dtype == d}}
        assert seen == want, (backend, collective)
        assert len(seen) >= 2 * 3 * 8, (backend, collective)   # both modes, 3 sizes, 8+ dtypes


def test_a_wrong_gathered_block_fails_the_run() -> None:
    """CCBENCH_CORRUPT flips one element the first rank with a result received: the root."""
    proc = run_ccbench("launch", "-n", "2", "gather", "--backend", "gloo", "--sizes", "1K",
                       "--iters", "1", "--warmup", "0", "-q", env={"CCBENCH_CORRUPT": "1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED" in proc.stdout


def test_backends_without_them_say_why() -> None:
    proc = run_ccbench("launch", "-n", "2", "scatter", "--backend", "ring@gloo", "--sizes",
                       "1K", "--iters", "1", "--warmup", "0", "-q")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "unsupported by ring: no scatter schedule" in proc.stdout


@pytest.mark.parametrize("module, cls, collective, words", [
    ("oneccl", "OneCCLBackend", "gather", "no onecclGather"),
    ("oneccl", "OneCCLBackend", "scatter", "no header giving its signature"),
    ("nccl_cupy", "NCCLCupyBackend", "gather", "CuPy's NCCL binding has no gather"),
])
def test_libraries_without_them_say_why(module: str, cls: str, collective: str,
                                        words: str) -> None:
    import importlib

    backend_type = getattr(importlib.import_module(f"ccbench.backends.{module}"), cls)
    backend = backend_type.__new__(backend_type)      # the tables only: no communicator
    support = backend.supports(collective)
    assert not support and words in support.reason
    assert support.reason.startswith(f"unsupported by {backend_type.name}: ")
    assert backend.supports("allreduce")
