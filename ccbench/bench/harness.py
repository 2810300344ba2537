"""What every rank runs: the timing loop of one case over its sizes.

Method (docs/design/method.md says the same):
- warm-up iterations, untimed; then timed iterations, their number raised to fill --min-time;
- per-op timing: barrier, then one op timed up to device completion; pipelined timing:
  --pipeline ops back to back, one synchronize, divided by their number;
- one iteration's time is the max over ranks (or, by --combine / nccl-tests' -a, the mean, the
  min or rank 0's time); median/mean/min/p5/p95/max/stdev over iterations;
- validation: --check extra untimed iterations on fresh inputs, compared bit for bit.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ccbench.backends.base import Backend
from ccbench.bench.options import Method  # the method options; re-exported
from ccbench.bench.stats import summarize
from ccbench.bench.validation import (
    CHUNK,
    checked,
    chunks,
    count_wrong_slice,
    initial_output,
    make_input,
)
from ccbench.collectives import Layout, busbw_factor, get, layout
from ccbench.dtypes import numpy_dtype
from ccbench.run.control import ControlClient
from ccbench.run.watchdog import Watchdog
from ccbench.units import format_size

# fault injection for the test suite: flip one received element before validation, on the
# first rank with a defined result (Collective.result_ranks: a reduce's root, whichever it is)
_INJECT_CORRUPTION = os.environ.get("CCBENCH_CORRUPT") == "1"

#: called after each timed sample (outside the clock) with (samples done, samples in all)
OnSample = Callable[[int, int], None] | None

__all__ = ["Case", "Method", "SizeResult", "combine_ranks", "host_bytes_per_rank",
           "measure_size"]


@dataclass(frozen=True, slots=True)
class Case:
    collective: str
    dtype: str
    op: str | None          # None for collectives that move data without reducing
    inplace: bool
    root: int = 0

    def label(self, size: int) -> str:
        mode = "in-place" if self.inplace else "out-of-place"
        op = f" {self.op}" if self.op else ""
        return f"{self.collective} {self.dtype}{op} {mode} at {format_size(size)}"


@dataclass(slots=True)
class SizeResult:
    """Rank 0's view of one finished size (other ranks get wrong=own count, no stats)."""

    layout: Layout
    iterations: int
    samples_us: list[float]
    rank_median_us: list[float]
    time_us: dict[str, float]
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None
    local_copy_us: float | None = None     # max over ranks of each rank's median copy time
    batch_loop: str | None = None          # pipelined: what ran the N calls of a sample
    warmup: int = 0                        # untimed warm-up calls done before the timed ones


_STEADY = {"sum": 0, "prod": 1}     # x op x ... op x == x: in-place calls keep these values


class _Buffers:
    """send/recv for one (case, size), with the in-place aliasing each collective needs."""

    def __init__(self, backend: Backend, case: Case, lay: Layout, rank: int) -> None:
        dtype = numpy_dtype(case.dtype)
        self.backend, self.case, self.lay, self.rank, self.dtype = backend, case, lay, rank, dtype
        # no host copy of the inputs or the sentinel output: they are written into the native
        # buffers a chunk at a time, so host memory is the send and receive buffers and little
        # more (host_bytes_per_rank)
        self.sentinel = initial_output(lay, dtype, min(CHUNK, lay.recv_count))
        self.spec = spec = get(case.collective)
        aliased = case.inplace and spec.inplace != "never" or spec.inplace == "one-buffer"
        self.aliasing = aliasing = spec.inplace if aliased else None
        if aliasing is None:
            self.send = backend.alloc(lay.send_count, dtype)
            self.recv = backend.alloc(lay.recv_count, dtype)
        elif aliasing == "send-in-recv":          # my shard lives inside the output
            self.recv = backend.alloc(lay.recv_count, dtype)
            self.send = backend.view(self.recv, rank * lay.block, (rank + 1) * lay.block)
        elif aliasing == "recv-in-send":          # my result lands inside the input
            self.send = backend.alloc(lay.send_count, dtype)
            self.recv = backend.view(self.send, rank * lay.block, (rank + 1) * lay.block)
        else:                                     # one buffer: send is recv
            self.send = backend.alloc(lay.send_count, dtype)
            self.recv = self.send
        self.reset()

    def _write_input(self) -> None:
        lay, case, backend = self.lay, self.case, self.backend
        for lo in chunks(lay.send_count):
            hi = min(lo + CHUNK, lay.send_count)
            backend.copy_from_numpy(backend.view(self.send, lo, hi),
                                    make_input(lay, self.dtype, case.op, self.rank, case.root,
                                               lo, hi))

    def _write_sentinel(self) -> None:
        backend, count = self.backend, self.lay.recv_count
        for lo in chunks(count):
            hi = min(lo + CHUNK, count)
            backend.copy_from_numpy(backend.view(self.recv, lo, hi), self.sentinel[:hi - lo])

    def hold_steady(self) -> None:
        """In-place sums and products feed each result back as the next call's input, so the
        values would grow by the world size (or double) every call: float16 overflows within
        ~16 calls, float32 within ~130 (numpy's reductions then warn). Timed calls start from
        the op's identity instead, which they keep; the check (reset()) uses the real inputs."""
        identity = _STEADY.get(self.case.op or "")
        if self.aliasing is None or identity is None:
            return
        backend, count = self.backend, self.lay.send_count
        fill = np.full(min(CHUNK, count), identity, dtype=self.dtype)
        for lo in chunks(count):
            hi = min(lo + CHUNK, count)
            backend.copy_from_numpy(backend.view(self.send, lo, hi), fill[:hi - lo])

    def reset(self) -> None:
        """Fresh inputs (in-place runs overwrite them) and sentinel outputs."""
        if self.aliasing not in (None, "send-in-recv"):
            self._write_input()                    # the input covers the whole output buffer
            return
        self._write_sentinel()                     # in-place allgather: then my shard over it
        self._write_input()

    def wrong(self) -> int:
        """Wrong elements of the receive buffer, read back a chunk at a time."""
        lay, backend, case = self.lay, self.backend, self.case
        wrong = 0
        if not checked(lay, self.rank, case.root):   # no defined result here (reduce non-root)
            return 0
        corrupt = _INJECT_CORRUPTION and \
            self.rank == self.spec.result_ranks(lay.world_size, case.root)[0]
        for lo in chunks(lay.recv_count):
            hi = min(lo + CHUNK, lay.recv_count)
            part = backend.to_numpy(backend.view(self.recv, lo, hi))
            if part.dtype != self.dtype:        # a buffer holding the dtype's bits (float8)
                part = part.view(self.dtype)
            if corrupt and lo == 0:                     # proves, in tests, that wrong
                part[0] = part[0] + part.dtype.type(1)  # values fail
            wrong += count_wrong_slice(part, lay, case.op, self.rank, case.root, lo)
        return wrong


def host_bytes_per_rank(lay: Layout) -> int:
    """Host memory one rank needs for a (case, size) beyond its interpreter and libraries:
    the native send and receive buffers (device buffers on GPUs; counted anyway as an upper
    bound) plus the chunked input, sentinel and read-back temporaries."""
    return (lay.send_count + lay.recv_count) * lay.elsize + 4 * CHUNK * 8


def _timed_samples(backend: Backend, case: Case, bufs: _Buffers, method: Method,
                   watchdog: Watchdog, count: int, on_sample: OnSample = None
                   ) -> tuple[list[float], str | None]:
    """`count` samples in seconds, on this rank. Per-op: barrier, clock, one bound library
    call, synchronize (device backends), clock. Pipelined: barrier, clock, a batch of
    --pipeline calls run by the backend's loop (no Python between the calls), one synchronize,
    clock; divided by the batch. A loop with its own clock (Batch.timed) reads it itself, right
    around the calls."""
    barrier, synchronize = backend.barrier, device_synchronize(backend)
    clock = time.perf_counter
    samples = []
    if method.timing == "pipelined":
        batch = backend.bind_batch(case.collective, bufs.send, bufs.recv, case.op, case.root)
        depth = method.pipeline
        timed = batch.timed if synchronize is None else None
        for _ in range(count):
            watchdog.enter()
            barrier()
            if timed is not None:
                samples.append(timed(depth) / depth)
            else:
                start = clock()
                batch(depth)
                if synchronize is not None:
                    synchronize()
                samples.append((clock() - start) / depth)
            watchdog.leave()
            if on_sample is not None:
                on_sample(len(samples), count)
        return samples, batch.description
    call = backend.bind(case.collective, bufs.send, bufs.recv, case.op, case.root)
    for _ in range(count):
        watchdog.enter()
        barrier()
        start = clock()
        call()
        if synchronize is not None:
            synchronize()
        samples.append(clock() - start)
        watchdog.leave()
        if on_sample is not None:
            on_sample(len(samples), count)
    return samples, None


def device_synchronize(backend: Backend) -> Callable[[], None] | None:
    """The backend's synchronize, or None where it is Backend's no-op (host libraries): the
    timed region then holds no call but the library's."""
    if type(backend).synchronize is Backend.synchronize:
        return None
    return backend.synchronize


def _local_copy_us(backend: Backend, case: Case, bufs: _Buffers, count: int) -> float | None:
    """Median time of the local copy the bound call makes besides the collective, timed alone
    (torch's out-of-place allreduce copies send into recv first); None: it makes none."""
    copy = backend.local_copy(case.collective, bufs.send, bufs.recv)
    if copy is None:
        return None
    clock, synchronize, times = time.perf_counter, backend.synchronize, []
    for _ in range(max(1, min(count, 1000))):
        start = clock()
        copy()
        synchronize()
        times.append(clock() - start)
    return float(np.median(times)) * 1e6


def _validate(backend: Backend, case: Case, bufs: _Buffers, method: Method,
              watchdog: Watchdog) -> int:
    wrong = 0
    for _ in range(method.check):
        bufs.reset()
        watchdog.enter()
        backend.barrier()
        backend.run(case.collective, bufs.send, bufs.recv, case.op, case.root)
        backend.synchronize()
        watchdog.leave()
        wrong += bufs.wrong()
    return wrong


def measure_size(backend: Backend, store: ControlClient, watchdog: Watchdog, case: Case,
                 size: int, method: Method, step: int, on_sample: OnSample = None
                 ) -> tuple[SizeResult | None, int]:
    """Measure one (case, size) on every rank. Returns (rank 0: the result, else None) and this
    rank's own wrong-element count. Sizes whose per-rank count rounds to 0 return (None, 0)."""
    ctx = backend.ctx
    rank, world = ctx.rank, ctx.world_size
    lay = layout(case.collective, size, numpy_dtype(case.dtype).itemsize, world)
    if lay.send_count == 0 or lay.recv_count == 0:
        return None, 0
    key = f"m/{step}"
    watchdog.begin_step(step, case.label(size))
    bufs = _Buffers(backend, case, lay, rank)
    bufs.hold_steady()
    warm, _ = _timed_samples(backend, case, bufs, method, watchdog, method.warmup)
    # keyed by global rank: the store accepts a rank's times only from that rank's connection
    members = [ctx.global_rank(r) for r in range(world)]
    with watchdog.waiting():
        iterations = _agree_iterations(store, f"{key}/warm", warm, method, members, rank)
    samples, loop = _timed_samples(backend, case, bufs, method, watchdog, iterations, on_sample)
    copy_us = _local_copy_us(backend, case, bufs, iterations)
    wrong = _validate(backend, case, bufs, method, watchdog) if method.check else None
    del bufs
    store.set(f"{key}/times/{members[rank]}",
              {"samples": samples, "wrong": wrong, "copy_us": copy_us})
    if rank != 0:
        return None, wrong or 0
    with watchdog.waiting():
        per_rank = [store.get(f"{key}/times/{g}", method.timeout) for g in members]
    result = _summarize(lay, per_rank, iterations, wrong is not None, method.combine)
    result.batch_loop = loop
    result.warmup = len(warm)
    return result, wrong or 0


def _agree_iterations(store: ControlClient, key: str, warm: list[float], method: Method,
                      members: list[int], rank: int) -> int:
    """Timed-iteration count, the same on every rank of `members` (global ranks; raised to
    fill --min-time)."""
    if method.min_time <= 0:
        return method.iters
    estimate = float(np.median(warm)) if warm else 0.0
    store.set(f"{key}/{members[rank]}", estimate)
    slowest = max(float(store.get(f"{key}/{g}", method.timeout)) for g in members)
    if slowest <= 0:
        return method.max_iters
    wanted = math.ceil(method.min_time / slowest)
    return max(method.iters, min(wanted, method.max_iters))


def combine_ranks(matrix: np.ndarray, combine: str) -> np.ndarray:
    """One time per iteration from a (ranks x iterations) matrix. max: an operation lasts until
    its last rank is done (the default); mean, min and rank 0 are nccl-tests' other -a modes."""
    if combine == "max":
        return matrix.max(axis=0)
    if combine == "mean":
        return matrix.mean(axis=0)
    if combine == "min":
        return matrix.min(axis=0)
    if combine == "rank0":
        return matrix[0]
    raise ValueError(f"unknown rank combination {combine!r}")


def _summarize(lay: Layout, per_rank: list[dict[str, Any]], iterations: int, checked: bool,
               combine: str = "max") -> SizeResult:
    matrix = np.asarray([entry["samples"] for entry in per_rank], dtype=np.float64) * 1e6
    samples = combine_ranks(matrix, combine)
    stats = summarize(samples.tolist())
    seconds = stats["median"] * 1e-6
    algbw = lay.size_used / seconds / 1e9 if seconds > 0 else float("inf")
    wrong = sum(int(entry["wrong"]) for entry in per_rank) if checked else None
    copies = [float(c) for entry in per_rank if (c := entry.get("copy_us")) is not None]
    copy_us = max(copies) if len(copies) == len(per_rank) else None
    return SizeResult(
        layout=lay, iterations=iterations, samples_us=[round(v, 4) for v in samples.tolist()],
        rank_median_us=[round(float(v), 4) for v in np.median(matrix, axis=1)],
        time_us=stats, algbw_gbps=algbw, busbw_gbps=algbw * busbw_factor(lay.collective, lay.world_size),
        wrong=wrong, local_copy_us=None if copy_us is None else round(copy_us, 4))
