"""Inputs whose every result is exact in every dtype, and the results they must give.

Values are small integers: every partial sum, max, min or product any reduction
order can form is an integer that float16, bfloat16 and int8 represent exactly,
so results compare bit for bit whatever algorithm the library picks.
"""

from __future__ import annotations

import numpy as np

from ccbench.collectives import Layout

__all__ = ["CHUNK", "chunks", "count_wrong", "count_wrong_slice", "expected_output",
           "initial_output", "make_input"]

SENTINEL = -1  # what output buffers hold before the collective, so untouched elements show


def _sum_values(rank: int | np.ndarray, index: np.ndarray, world_size: int) -> np.ndarray:
    if world_size <= 40:                   # 3 * 40 = 120 < 127 (int8) and < 256 (bfloat16)
        return (rank + 2 * index) % 4
    return ((rank + index) % world_size == 0).astype(np.int64)   # every sum is exactly 1


def _values(op: str | None, rank: int | np.ndarray, index: np.ndarray, world_size: int) -> np.ndarray:
    if op == "sum":
        return _sum_values(rank, index, world_size)
    if op == "prod":                        # one rank holds 2, the rest 1, per element: product 2
        return np.where(index % world_size == rank, 2, 1)
    if op in ("max", "min"):
        return (rank * 3 + index) % 11 - 5
    return (rank * 7 + index * 3) % 13      # data movement: distinct per rank and index


def _reduce_over_ranks(op: str, index: np.ndarray, world_size: int) -> np.ndarray:
    """Reduction of every rank's input at `index`, accumulated rank by rank (no p x n array)."""
    result = _values(op, 0, index, world_size).astype(np.int64)
    for rank in range(1, world_size):
        values = _values(op, rank, index, world_size)
        if op == "sum":
            result += values
        elif op == "prod":
            result *= values
        elif op == "max":
            np.maximum(result, values, out=result)
        else:
            np.minimum(result, values, out=result)
    return result


def _expected_slice(lay: Layout, op: str | None, rank: int, root: int, lo: int, hi: int
                    ) -> np.ndarray:
    """Expected output elements lo..hi of this rank, as int64."""
    out = np.arange(lo, hi, dtype=np.int64)
    n, block = lay.world_size, max(lay.block, 1)
    if lay.collective == "broadcast":
        return _values(None, root, out, n)
    if lay.collective == "allreduce":
        return _reduce_over_ranks(op or "sum", out, n)
    if lay.collective == "reduce-scatter":
        return _reduce_over_ranks(op or "sum", rank * block + out, n)
    if lay.collective == "allgather":
        return _values(None, out // block, out % block, n)
    if lay.collective == "alltoall":
        return _values(None, out // block, rank * block + out % block, n)
    raise ValueError(lay.collective)


CHUNK = 1 << 20      # elements generated or checked at a time: bounded int64 temporaries


def chunks(count: int) -> range:
    """Start offsets of CHUNK-sized pieces of a buffer of `count` elements."""
    return range(0, count, CHUNK)


def make_input(lay: Layout, dtype: np.dtype, op: str | None, rank: int, root: int = 0,
               start: int = 0, stop: int | None = None) -> np.ndarray:
    """Elements start..stop of this rank's send buffer (for broadcast: the buffer, sentinel on
    non-roots), in `dtype`. Generated CHUNK elements at a time, so the only 64-bit
    temporaries are one chunk long whatever the buffer size."""
    stop = lay.send_count if stop is None else stop
    out = np.empty(stop - start, dtype=dtype)
    if lay.collective == "broadcast" and rank != root:
        out.fill(SENTINEL)
        return out
    source = root if lay.collective == "broadcast" else rank
    kind = None if lay.collective == "broadcast" else op
    for lo in range(start, stop, CHUNK):
        hi = min(lo + CHUNK, stop)
        index = np.arange(lo, hi, dtype=np.int64)
        out[lo - start:hi - start] = _values(kind, source, index, lay.world_size)
    return out


def initial_output(lay: Layout, dtype: np.dtype, count: int | None = None) -> np.ndarray:
    """Sentinel elements (count of them; the whole receive buffer by default)."""
    return np.full(lay.recv_count if count is None else count, SENTINEL, dtype=dtype)


def expected_output(lay: Layout, dtype: np.dtype, op: str | None, rank: int, root: int = 0
                    ) -> np.ndarray:
    """What this rank's receive buffer must hold after the collective (for small buffers)."""
    return _expected_slice(lay, op, rank, root, 0, lay.recv_count).astype(dtype)


def count_wrong_slice(actual: np.ndarray, lay: Layout, op: str | None, rank: int, root: int,
                      start: int) -> int:
    """Elements of `actual` (receive-buffer elements start..start+len) that differ bit for bit
    from the expected result."""
    raw = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[actual.dtype.itemsize]
    wrong = 0
    for lo in range(0, actual.size, CHUNK):
        hi = min(lo + CHUNK, actual.size)
        expected = _expected_slice(lay, op, rank, root, start + lo, start + hi
                                   ).astype(actual.dtype)
        wrong += int(np.count_nonzero(actual[lo:hi].view(raw) != expected.view(raw)))
    return wrong


def count_wrong(actual: np.ndarray, lay: Layout, op: str | None, rank: int, root: int = 0) -> int:
    """Elements of a whole receive buffer that differ bit for bit from the expected result."""
    if actual.size != lay.recv_count:
        return int(max(actual.size, lay.recv_count))
    return count_wrong_slice(actual, lay, op, rank, root, 0)
