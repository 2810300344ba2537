"""Inputs whose every result is exact in every dtype, and the results they must give,
generated and compared a chunk at a time. Which values a collective uses is its own rule
(`ccbench.collectives.<name>`: inputs, expected, result_on); the values themselves are
`ccbench.collectives.values`."""

from __future__ import annotations

import numpy as np

from ccbench.collectives import Layout, get
from ccbench.dtypes import sentinel

__all__ = ["CHUNK", "checked", "chunks", "count_wrong", "count_wrong_slice", "expected_output",
           "initial_output", "make_input"]

SENTINEL = -1  # what output buffers hold before the collective, so untouched elements show


def _expected_slice(lay: Layout, op: str | None, rank: int, root: int, lo: int, hi: int,
                    dtype: np.dtype) -> np.ndarray:
    """Expected output elements lo..hi of this rank, as int64."""
    return get(lay.collective).expected(lay, op, rank, root, np.arange(lo, hi, dtype=np.int64),
                                        dtype)


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
    spec = get(lay.collective)
    if not spec.has_input(rank, root):
        out.fill(sentinel(SENTINEL, out.dtype))
        return out
    for lo in range(start, stop, CHUNK):
        hi = min(lo + CHUNK, stop)
        index = np.arange(lo, hi, dtype=np.int64)
        out[lo - start:hi - start] = spec.inputs(lay, op, rank, root, index, out.dtype)
    return out


def initial_output(lay: Layout, dtype: np.dtype, count: int | None = None) -> np.ndarray:
    """Sentinel elements (count of them; the whole receive buffer by default)."""
    return np.full(lay.recv_count if count is None else count, sentinel(SENTINEL, dtype),
                   dtype=dtype)


def expected_output(lay: Layout, dtype: np.dtype, op: str | None, rank: int, root: int = 0
                    ) -> np.ndarray:
    """What this rank's receive buffer must hold after the collective (for small buffers; on a
    rank with no defined result, see `checked`, what the nccl-tests root would hold)."""
    return _expected_slice(lay, op, rank, root, 0, lay.recv_count, dtype).astype(dtype)


def count_wrong_slice(actual: np.ndarray, lay: Layout, op: str | None, rank: int, root: int,
                      start: int) -> int:
    """Elements of `actual` (receive-buffer elements start..start+len) that differ bit for bit
    from the expected result (0 on a rank with no defined result, e.g. a reduce's non-root)."""
    if not checked(lay, rank, root):
        return 0
    raw = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[actual.dtype.itemsize]
    wrong = 0
    for lo in range(0, actual.size, CHUNK):
        hi = min(lo + CHUNK, actual.size)
        expected = _expected_slice(lay, op, rank, root, start + lo, start + hi,
                                   actual.dtype).astype(actual.dtype)
        wrong += int(np.count_nonzero(actual[lo:hi].view(raw) != expected.view(raw)))
    return wrong


def checked(lay: Layout, rank: int, root: int) -> bool:
    """Whether this rank's receive buffer has a defined result (a reduce's non-roots do not)."""
    return get(lay.collective).checked(rank, root, lay.world_size)


def count_wrong(actual: np.ndarray, lay: Layout, op: str | None, rank: int, root: int = 0) -> int:
    """Elements of a whole receive buffer that differ bit for bit from the expected result."""
    if not checked(lay, rank, root):
        return 0
    if actual.size != lay.recv_count:
        return int(max(actual.size, lay.recv_count))
    return count_wrong_slice(actual, lay, op, rank, root, 0)
