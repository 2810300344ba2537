"""The inputs make every result exact, and the expected results match each collective's own
brute-force reference (`Collective.reference`: every rank's inputs at once, in float64)."""

import dataclasses

import numpy as np
import pytest

from ccbench import collectives
from ccbench.bench.validation import count_wrong, expected_output, make_input
from ccbench.collectives import COLLECTIVES, OPS, Layout, get, layout
from ccbench.dtypes import DTYPES, avg_scales

RAW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def defined_ops(collective: str) -> list[str | None]:
    """The ops a collective defines a result for (`Collective.ops`; None: it takes none)."""
    spec = get(collective)
    return [op for op in OPS if spec.undefined_op(op) is None] if spec.reduces else [None]


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("world", [1, 2, 3, 5, 41, 64])
def test_expected_matches_reference(collective: str, dtype: str, world: int) -> None:
    np_dtype = DTYPES[dtype]
    for op in defined_ops(collective):
        lay = layout(collective, 96 * world * np_dtype.itemsize, np_dtype.itemsize, world)
        root = world - 1
        inputs = [make_input(lay, np_dtype, op, r, root) for r in range(world)]
        for rank in {0, world - 1}:
            want = get(collective).reference(inputs, op, rank, root)
            got = expected_output(lay, np_dtype, op, rank, root)
            # exactness: the float64 reference survives the cast to the narrow dtype
            assert np.array_equal(want.astype(np_dtype).astype(np.float64), want), (op, rank)
            assert np.array_equal(got.astype(np.float64), want), (op, rank)
            assert count_wrong(got, lay, op, rank, root) == 0
            broken = got.copy()
            broken.view(RAW[np_dtype.itemsize])[-1] ^= 1      # one bit off: one wrong value
            # a reduce's or gather's non-roots have no defined result: nothing is compared
            defined = get(collective).checked(rank, root, world)
            assert count_wrong(broken, lay, op, rank, root) == int(defined)


def test_a_collective_is_checked_for_the_ops_it_defines_only(monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """A collective that defines fewer ops (a prefix scan has no avg) has no expected result
    for the others: the check above asks for its own ops only."""
    spec = get("allreduce")

    def no_avg(lay: Layout, op: str | None, rank: int, root: int, index: np.ndarray,
               dtype: np.dtype) -> np.ndarray:
        assert op != "avg", "asked for an op the collective does not define"
        return spec.expected(lay, op, rank, root, index, dtype)

    monkeypatch.setitem(collectives._BY_NAME, "allreduce", dataclasses.replace(
        spec, ops=("sum", "max", "min", "prod"), expected=no_avg))
    assert defined_ops("allreduce") == ["sum", "max", "min", "prod"]
    assert defined_ops("broadcast") == [None] and defined_ops("reduce") == list(OPS)
    test_expected_matches_reference("allreduce", "float32", 3)


@pytest.mark.parametrize("dtype", [d for d, t in DTYPES.items() if t.kind not in "iu"])
@pytest.mark.parametrize("world", [2, 3, 5, 7])
def test_avg_inputs_are_exact_however_the_mean_is_taken(dtype: str, world: int) -> None:
    """NCCL averages floats by scaling each input by 1/n rounded to the dtype; gloo sums then
    divides. The avg inputs give the exact mean both ways, at 2 and 3 ranks with every k."""
    np_dtype = DTYPES[dtype]
    lay = layout("allreduce", 60 * world * np_dtype.itemsize, np_dtype.itemsize, world)
    inputs = [make_input(lay, np_dtype, "avg", r) for r in range(world)]
    want = expected_output(lay, np_dtype, "avg", 0).astype(np.float64)
    reciprocal = np.array(1.0 / world).astype(np_dtype).astype(np.float64)
    scaled = [(x.astype(np.float64) * reciprocal).astype(np_dtype).astype(np.float64)
              for x in inputs]
    assert np.array_equal(np.sum(scaled, axis=0), want)
    summed = np.sum([x.astype(np.float64) for x in inputs], axis=0)
    assert np.array_equal((summed / world).astype(np_dtype).astype(np.float64), want)
    assert set(np.unique(want)) == set(avg_scales(np_dtype, world)) - {0}
    if world in (2, 3) and dtype not in ("float8_e4m3fn", "float8_e5m2"):
        assert avg_scales(np_dtype, world) == (1, 2, 3)


def test_unsigned_and_float8_inputs_stay_in_range() -> None:
    """uint8 gets no negative max/min inputs (a cast would wrap them), float8 sums stay at most
    8 (float8_e5m2 has every integer up to 8 only)."""
    lay = layout("allreduce", 64, 1, 3)
    for op in ("max", "min"):
        assert min(make_input(lay, DTYPES["uint8"], op, r).min() for r in range(3)) == 0
    e5m2 = DTYPES["float8_e5m2"]
    total = sum(make_input(lay, e5m2, "sum", r).astype(np.float64) for r in range(3))
    assert total.max() <= 8


def test_reduce_checks_the_root_only() -> None:
    """nccl-tests' reduce: the root's output is compared bit for bit, the others' not at all."""
    lay = layout("reduce", 64 * 4, 4, 3)
    dtype = np.dtype(np.float32)
    garbage = np.full(lay.recv_count, 7.0, dtype=dtype)
    assert count_wrong(garbage, lay, "sum", 1, root=2) == 0
    assert count_wrong(garbage, lay, "sum", 2, root=2) == lay.recv_count
    assert count_wrong(expected_output(lay, dtype, "sum", 2, 2), lay, "sum", 2, root=2) == 0


def test_every_collective_brings_its_own_reference() -> None:
    """The reference is the collective's, not a chain of names in a test: every registered
    collective has one, and none is another's (allgather's and gather's are one function)."""
    from ccbench.collectives import every

    inputs = [np.arange(6, dtype=np.float64) + 10 * r for r in range(3)]
    results = {c.name: c.reference(inputs, "sum" if c.reduces else None, 1, 2).tolist()
               for c in every()}
    assert set(results) == set(COLLECTIVES)
    assert results["alltoall"] == [2, 3, 12, 13, 22, 23]
    assert results["sendrecv"] == list(range(6))
    assert results["scatter"] == [22, 23]
    assert results["reduce-scatter"] == [36, 39]
