"""Run one rank's part of a schedule over a transport, on numpy or cupy buffers.

``Executor(schedule, rank, transport).run(send, recv, op)`` does one collective call.
Block ranges are turned into element slices once per buffer size; the bound views,
``tmp`` and the reduction scratch are allocated once per (buffers, op) and reused, so
the per-call loop allocates nothing (on numpy: ufuncs with ``out=``).

Per step: the copies, then every recv and send posted (or the transport's prepared
requests started), then the waits and the reductions (``out = base (op) incoming``) in
the listed order; with several reductions in a step each is applied as soon as its recv
is in, unless a send of the step still reads a reduction target (then all wait). Calls with
aliased buffers (in-place) run as they are when the schedule is verified for it
(``Schedule.inplace_safe``) and the alias is the one the harness makes; otherwise the
input is copied to a snapshot first.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from algorithms.kernels import NumpyReducer
from algorithms.schedule import Schedule, Span
from algorithms.transport import TAG_LIMIT, Transport

__all__ = ["Executor", "block_offsets", "unit_elements"]

#: bindings kept for calls made with ``run``; those a ``bound_call`` still holds are never
#: released under it (a trace's whole sequence binds every call before running any)
_CACHE_SIZE = 4


def unit_elements(schedule: Schedule, send_size: int | None, recv_size: int) -> int:
    """Elements of one unit (see algorithms.schedule) from the caller's buffer sizes: the
    schedule's own buffers (``units``) say how many units each holds."""
    c, p = schedule.collective, schedule.num_ranks
    nsend, nrecv = schedule.units.get("send", 0), schedule.units["recv"]
    if not nsend:                        # one buffer: a send buffer passed is not read
        return recv_size
    if send_size is None:
        if nsend == nrecv == 1:
            return recv_size
        raise ValueError(f"{c} needs a send buffer")
    unit = recv_size // nrecv
    if (send_size, recv_size) != (unit * nsend, unit * nrecv):
        raise ValueError(f"{c} on {p} ranks: send {send_size} / recv {recv_size} elements "
                         f"(expected {unit * nsend} / {unit * nrecv})")
    return unit


def block_offsets(unit: int, blocks_per_unit: int, num_blocks: int) -> list[int]:
    """Element offset of every block boundary (num_blocks + 1 entries)."""
    B = blocks_per_unit
    return [(b // B) * unit + ((b % B) * unit) // B for b in range(num_blocks + 1)]


def _address(a: Any) -> tuple[int, int]:
    """(first byte, one past the last byte) of a contiguous array, numpy or cupy."""
    iface = getattr(a, "__array_interface__", None) or a.__cuda_array_interface__
    start = int(iface["data"][0])
    return start, start + int(a.nbytes)


@dataclass(slots=True)
class _Plan:
    """Element-level program of one rank for one unit size."""

    steps: list[tuple[list[tuple[str, int, int, str, int, int]],          # copies
                      list[tuple[int, int, str, int, int]],                # sends
                      list[tuple[int, int, str, int, int, bool, str | None, int, int, int]],
                      bool]]                                               # defer reductions
    scratch: int
    tmp: int


class Executor:
    """One rank of one schedule. `xp` is the array module of the buffers (numpy or cupy);
    `reducer(op, dtype_name)` returns the reduction kernel."""

    def __init__(self, schedule: Schedule, rank: int, transport: Transport,
                 reducer: Any = None, xp: Any = np, timeout: float | None = None) -> None:
        if not 0 <= rank < schedule.num_ranks:
            raise ValueError(f"rank {rank} outside 0..{schedule.num_ranks - 1}")
        if transport.size != schedule.num_ranks:
            raise ValueError(f"schedule for {schedule.num_ranks} ranks on a transport of "
                             f"{transport.size}")
        self.schedule, self.rank, self.transport = schedule, rank, transport
        self.reducer = reducer or NumpyReducer()
        self.xp, self.timeout = xp, timeout
        self._plans: dict[int, _Plan] = {}
        self._bound: OrderedDict[tuple[Any, ...], tuple[Any, ...]] = OrderedDict()
        # bindings a live bound call holds (id -> (binding, holders)): evicted from the
        # cache, they are released when their last holder goes, or at close()
        self._held: dict[int, list[Any]] = {}
        #: transports that can set a step's transfers up once (MPI persistent requests)
        self._prepare = getattr(transport, "prepare", None)

    # -- compile ------------------------------------------------------------------------
    def plan(self, unit: int) -> _Plan:
        cached = self._plans.get(unit)
        if cached is not None:
            return cached
        s, r = self.schedule, self.rank
        offsets = {b: block_offsets(unit, s.blocks_per_unit, s.num_blocks(b)) for b in s.units}

        def el(span: Span) -> tuple[str, int, int]:
            o = offsets[span.buf]
            return span.buf, o[span.lo], o[span.hi]

        seq_out: dict[int, int] = defaultdict(int)
        seq_in: dict[int, int] = defaultdict(int)
        steps = []
        scratch_max = 0
        for step in s.steps[r]:
            copies = []
            for c in step.copies:
                a, b = el(c.src), el(c.dst)
                if a[2] > a[1]:
                    copies.append((*a, *b))
            sends = []
            for snd in step.sends:
                tag = seq_out[snd.peer] % TAG_LIMIT
                seq_out[snd.peer] += 1
                e = el(snd.span)
                if e[2] > e[1]:
                    sends.append((snd.peer, tag, *e))
            recvs = []
            scratch = 0
            for rcv in step.recvs:
                tag = seq_in[rcv.peer] % TAG_LIMIT
                seq_in[rcv.peer] += 1
                e = el(rcv.span)
                n = e[2] - e[1]
                if n == 0:
                    continue
                base = el(rcv.base) if rcv.base is not None else (None, 0, 0)
                recvs.append((rcv.peer, tag, *e, rcv.reduce, *base, scratch))
                if rcv.reduce:
                    scratch += n
            scratch_max = max(scratch_max, scratch)
            defer = any(rv[5] and rv[2] == sd[2] and rv[3] < sd[4] and sd[3] < rv[4]
                        for rv in recvs for sd in sends)
            steps.append((copies, sends, recvs, defer))
        plan = _Plan(steps, scratch_max, s.units.get("tmp", 0) * unit)
        self._plans[unit] = plan
        return plan

    def _aliased_as_verified(self, send: Any, recv: Any, unit: int) -> bool:
        pattern = self.schedule.computes
        if not pattern.aliases:
            return False
        (s0, s1), (r0, r1) = _address(send), _address(recv)
        item = recv.itemsize
        if pattern.inplace == "same":
            return (s0, s1) == (r0, r1)
        if pattern.inplace == "send-in-recv":
            return s0 == r0 + self.rank * unit * item and s1 == s0 + unit * item
        if pattern.inplace == "recv-in-send":
            return r0 == s0 + self.rank * unit * item and r1 == r0 + unit * item
        return False

    def bind(self, send: Any, recv: Any, op: str | None, dtype_name: str) -> tuple[Any, ...]:
        """Views for every step of this rank on these buffers, cached by memory address (a new
        array object over the same memory, e.g. a fresh numpy view of a torch tensor, hits;
        the cached views keep that memory alive)."""
        key = (None if send is None else (_address(send), send.dtype), _address(recv),
               recv.dtype, op, dtype_name)
        hit = self._bound.get(key)
        if hit is not None:
            self._bound.move_to_end(key)
            return hit
        xp = self.xp
        unit = unit_elements(self.schedule, None if send is None else send.size, recv.size)
        plan = self.plan(unit)
        snapshot = None
        source = send
        if send is not None and "send" in self.schedule.units:
            a, b = _address(send), _address(recv)
            overlap = a[0] < b[1] and b[0] < a[1] and send.nbytes and recv.nbytes
            if overlap and not (self.schedule.inplace_safe
                                and self._aliased_as_verified(send, recv, unit)):
                snapshot = xp.empty_like(send)
                source = snapshot
        bufs = {"send": source, "recv": recv,
                "tmp": xp.empty(plan.tmp, dtype=recv.dtype) if plan.tmp else None}
        scratch = xp.empty(plan.scratch, dtype=recv.dtype) if plan.scratch else None
        reduce = self.reducer(op, dtype_name) if op is not None else None
        steps = []
        for copies, sends, recvs, defer in plan.steps:
            cp = []
            for sb, a0, a1, db, b0, b1 in copies:
                src, dst = bufs[sb][a0:a1], bufs[db][b0:b1]
                if _address(src) != _address(dst):       # a self copy of an in-place call
                    cp.append((src, dst))
            sd = [(peer, tag, bufs[name][e0:e1]) for peer, tag, name, e0, e1 in sends]
            rv: list[tuple[int, int, Any, tuple[Any, Any, Any] | None]] = []
            for peer, tag, name, e0, e1, red, bb, c0, c1, off in recvs:
                target = bufs[name][e0:e1]
                if red:
                    if reduce is None:
                        raise ValueError(f"{self.schedule.collective} reduces: give an op")
                    assert scratch is not None
                    landing = scratch[off:off + (e1 - e0)]
                    base = bufs[bb][c0:c1] if bb is not None else target
                    rv.append((peer, tag, landing, (base, landing, target)))
                else:
                    rv.append((peer, tag, target, None))
            prepared = None
            if self._prepare is not None and (sd or rv):
                prepared = self._prepare([(buf, peer, tag) for peer, tag, buf in sd],
                                         [(buf, peer, tag) for peer, tag, buf, _ in rv])
            reds = [red for *_, red in rv if red is not None]
            # one reduction, or several that must wait for the sends anyway: wait for the
            # whole step, then reduce; else reduce each recv as soon as it is in
            ordered = len(reds) > 1 and not defer
            steps.append((cp, sd, rv, reds, ordered, prepared))
        bound = (send, recv, snapshot, steps, reduce)
        self._bound[key] = bound
        if len(self._bound) > _CACHE_SIZE:
            self._evict(self._bound.popitem(last=False)[1])
        return bound

    def _evict(self, bound: tuple[Any, ...]) -> None:
        """A binding leaves the cache: released unless a bound call still holds it."""
        if id(bound) not in self._held:
            _free(bound)

    def _release(self, bound: tuple[Any, ...]) -> None:
        """A bound call went: its binding is released once nothing holds it."""
        entry = self._held.get(id(bound))
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self._held[id(bound)]
            if all(b is not bound for b in self._bound.values()):
                _free(bound)

    def close(self) -> None:
        """Release what the transport prepared (persistent requests); idempotent. Bound
        calls still held must not be run after it."""
        freed = set()
        while self._bound:
            bound = self._bound.popitem()[1]
            freed.add(id(bound))
            _free(bound)
        held, self._held = self._held, {}
        for bound, _ in held.values():
            if id(bound) not in freed:
                _free(bound)

    # -- run ----------------------------------------------------------------------------
    def bound_call(self, send: Any, recv: Any, op: str | None = "sum",
                   dtype_name: str | None = None) -> Any:
        """``run`` with the buffers resolved now: the call a timed loop should make."""
        name = dtype_name or np.dtype(recv.dtype).name
        bound = self.bind(send, recv, op, name)
        call = lambda: self._execute(send, bound)  # noqa: E731
        self._held.setdefault(id(bound), [bound, 0])[1] += 1
        weakref.finalize(call, self._release, bound)
        return call

    def run(self, send: Any, recv: Any, op: str | None = "sum",
            dtype_name: str | None = None) -> None:
        """One collective call. Broadcast: pass ``send=None`` and the buffer as ``recv``."""
        name = dtype_name or np.dtype(recv.dtype).name
        self._execute(send, self.bind(send, recv, op, name))

    def _execute(self, send: Any, bound: tuple[Any, ...]) -> None:
        _, _, snapshot, steps, reduce = bound
        if snapshot is not None:
            snapshot[...] = send
        for copies, sends, recvs, reds, ordered, prepared in steps:
            for src, dst in copies:
                dst[...] = src
            if prepared is not None:
                _run_prepared(prepared, recvs, reds, ordered, reduce, self.timeout)
            else:
                _run_posted(self.transport, sends, recvs, reds, ordered, reduce, self.timeout)


def _run_prepared(prepared: Any, recvs: Any, reds: Any, ordered: bool, reduce: Any,
                  timeout: float | None) -> None:
    """One step on the transport's prepared (persistent) requests."""
    prepared.start()
    if ordered:             # each received block is reduced as soon as it is in
        for i, (*_, red) in enumerate(recvs):
            prepared.wait_recv(i, timeout)
            if red is not None:
                reduce(*red)
        prepared.wait_all(timeout)
        return
    prepared.wait_all(timeout)
    for red in reds:
        reduce(*red)


def _run_posted(transport: Any, sends: Any, recvs: Any, reds: Any, ordered: bool,
                reduce: Any, timeout: float | None) -> None:
    """One step posted as nonblocking receives, then sends."""
    rreqs = [transport.irecv(buf, peer, tag) for peer, tag, buf, _ in recvs]
    sreqs = [transport.isend(buf, peer, tag) for peer, tag, buf in sends]
    if ordered:
        for q, (*_, red) in zip(rreqs, recvs, strict=True):
            q.wait(timeout)
            if red is not None:
                reduce(*red)
        for q in sreqs:
            q.wait(timeout)
        return
    for q in rreqs:
        q.wait(timeout)
    for q in sreqs:
        q.wait(timeout)
    for red in reds:
        reduce(*red)


def _free(bound: tuple[Any, ...]) -> None:
    for step in bound[3]:
        if step[5] is not None:
            step[5].free()
