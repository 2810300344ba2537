"""sendrecv, nccl-tests' sendrecv_perf added through the registry: every rank sends to rank+1
and receives from rank-1, out of place, every dtype, at 1, 2 and 3 ranks on gloo and MPI,
validated bit-exact on every rank; what cannot run it says so in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import have_mpi, run_ccbench

from ccbench.backends import backend_class
from ccbench.bench.validation import count_wrong, expected_output, make_input
from ccbench.collectives import get, layout
from ccbench.dtypes import DTYPES
from ccbench.formats.astra import export_measured
from ccbench.model.costs import coefficients
from ccbench.records import load_records


def test_the_registry_says_what_sendrecv_is() -> None:
    spec = get("sendrecv")
    assert not spec.reduces and not spec.rooted and spec.busbw(3) == 1.0
    assert spec.modes((False, True)) == (False,) and spec.modes((True,)) == (False,)
    lay = spec.layout(3000, 4, 3)
    assert (lay.count, lay.send_count, lay.recv_count, lay.size_used) == (750, 750, 750, 3000)
    assert spec.export is None
    k = coefficients("sendrecv", "direct", 8)
    assert (k.a, k.b, k.c) == (1.0, 1.0, 0.0)


def test_each_rank_expects_what_rank_minus_one_sent() -> None:
    dtype = np.dtype(np.int8)
    lay = layout("sendrecv", 100, 1, 3)
    inputs = [make_input(lay, dtype, None, r) for r in range(3)]
    for rank in range(3):
        got = expected_output(lay, dtype, None, rank)
        assert np.array_equal(got, inputs[(rank - 1) % 3])
        assert count_wrong(got, lay, None, rank) == 0
        assert count_wrong(inputs[(rank + 1) % 3], lay, None, rank) > 0   # the other neighbour


# CI: 1 (a rank sends to itself) and 3 ranks (a ring); 2 in the matrix run
@pytest.mark.parametrize("world", [1, pytest.param(2, marks=pytest.mark.matrix), 3])
def test_sendrecv_every_dtype(world: int, tmp_path: Path) -> None:
    backends = ["gloo"] + (["mpi"] if have_mpi() else [])
    out = tmp_path / "r.jsonl"
    proc = run_ccbench("launch", "-n", str(world), "sendrecv", "--backend",
                       ",".join([*backends, "ring@gloo"]), "--sizes", "8,3000,33K",
                       "--dtype", "all", "--iters", "2", "--warmup", "1",
                       "--check", "1", "-q", "--timeout", "60", "--output", str(out),
                       timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = load_records(out)
    assert records and all(r.wrong == 0 for r in records), [r for r in records if r.wrong]
    for backend in backends:
        refuses = backend_class(backend).refuses                   # gloo has no float8
        seen = {(r.dtype, r.inplace) for r in records if r.backend == backend}
        want = {(d, False) for d in DTYPES if not refuses(DTYPES[d], None)}
        assert seen == want and len(want) >= 8, backend              # out of place only
    assert all(r.busbw_gbps == pytest.approx(r.algbw_gbps) for r in records)
    # an algorithm backend has no sendrecv schedule: one line, nothing measured
    assert not [r for r in records if r.backend == "ring@gloo"]
    assert "unsupported by ring: no sendrecv schedule" in proc.stdout


def test_export_chakra_says_it_skips_sendrecv(tmp_path: Path) -> None:
    from ccbench.model.synthetic import synthetic_records

    recs = synthetic_records("sendrecv", "direct", [2], [4096], 1e-5, 1e-10, 0.0, iterations=2)
    recs += synthetic_records("allgather", "ring", [2], [4096], 1e-5, 1e-10, 0.0, iterations=2)
    skipped: dict[str, str] = {}
    prefixes = export_measured(recs, tmp_path, skipped)
    assert len(prefixes) == 1 and "allgather" in prefixes[0]
    assert skipped == {"sendrecv": "Chakra has no collective type for it"}


def test_export_chakra_of_only_inexpressible_collectives_says_why(tmp_path: Path) -> None:
    from ccbench.errors import UsageError
    from ccbench.model.synthetic import synthetic_records

    recs = synthetic_records("sendrecv", "direct", [2], [4096], 1e-5, 1e-10, 0.0, iterations=2)
    with pytest.raises(UsageError) as caught:
        export_measured(recs, tmp_path / "none")
    assert str(caught.value) == ("no measured collectives to export: skipped sendrecv: Chakra "
                                 "has no collective type for it")
    assert not (tmp_path / "none").exists()
