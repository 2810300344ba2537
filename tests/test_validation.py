"""The inputs make every result exact, and the expected results match a brute-force reference."""

import numpy as np
import pytest

from ccbench.collectives import COLLECTIVES, REDUCING, layout
from ccbench.dtypes import DTYPES
from ccbench.validation import count_wrong, expected_output, make_input


def reference(collective: str, inputs: list[np.ndarray], op: str | None, rank: int,
              block: int, root: int) -> np.ndarray:
    stacked = np.stack([x.astype(np.float64) for x in inputs])
    reduce = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}
    if collective == "broadcast":
        return stacked[root]
    if collective == "allreduce":
        return reduce[op](stacked, axis=0)
    if collective == "reduce-scatter":
        return reduce[op](stacked, axis=0)[rank * block:(rank + 1) * block]
    if collective == "allgather":
        return stacked.reshape(-1)
    return np.concatenate([stacked[s, rank * block:(rank + 1) * block] for s in range(len(inputs))])


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("world", [1, 2, 3, 5, 41, 64])
def test_expected_matches_reference(collective: str, dtype: str, world: int) -> None:
    np_dtype = DTYPES[dtype]
    ops = ["sum", "max", "min", "prod"] if collective in REDUCING else [None]
    for op in ops:
        lay = layout(collective, 96 * world * np_dtype.itemsize, np_dtype.itemsize, world)
        root = world - 1
        inputs = [make_input(lay, np_dtype, op, r, root) for r in range(world)]
        for rank in {0, world - 1}:
            want = reference(collective, inputs, op, rank, lay.block, root)
            got = expected_output(lay, np_dtype, op, rank, root)
            # exactness: the float64 reference survives the cast to the narrow dtype
            assert np.array_equal(want.astype(np_dtype).astype(np.float64), want), (op, rank)
            assert np.array_equal(got.astype(np.float64), want), (op, rank)
            assert count_wrong(got, lay, op, rank, root) == 0
            broken = got.copy()
            broken[-1] = broken[-1] + np_dtype.type(1)
            assert count_wrong(broken, lay, op, rank, root) == 1
