"""Ring schedules: every rank talks only to its neighbours r-1 and r+1 (any p >= 1).

``segments`` (k) splits each ring chunk into k messages sent in the same step, so the
executor reduces one piece while the next is still arriving; for the broadcast chain it
is the pipeline depth.
"""

from __future__ import annotations

from algorithms.schedule import RoundBuilder, Schedule, Span

__all__ = ["ring_allgather", "ring_allreduce", "ring_alltoall", "ring_broadcast",
           "ring_reduce", "ring_reduce_scatter"]


def _segments(segments: int) -> int:
    if segments < 1:
        raise ValueError(f"segments must be >= 1, got {segments}")
    return segments


def _copy_all(b: RoundBuilder, p: int, nblocks: int) -> None:
    for r in range(p):
        b.copy(0, r, Span("send", 0, nblocks), Span("recv", 0, nblocks))


def ring_allreduce(p: int, root: int = 0, segments: int = 1) -> Schedule:
    """Reduce-scatter then allgather around the ring: 2(p-1) steps, each moving n/p.

    The buffer is p chunks of k blocks. In reduce-scatter step s rank r sends chunk
    r-s-1 and reduces chunk r-s-2 arriving from r-1 (the first partial is read straight
    from ``send``, so no initial copy); rank r then owns chunk r and the allgather
    forwards chunk r-s in step s.
    """
    k = _segments(segments)
    b = RoundBuilder(p)
    if p == 1:
        _copy_all(b, p, k)
    _ring_reduce_scatter_into_recv(b, p, k)
    for s in range(p - 1):
        for r in range(p):
            c = (r - s) % p
            lo, hi = c * k, (c + 1) * k
            b.transfer(p - 1 + s, r, (r + 1) % p, Span("recv", lo, hi))
    return Schedule("ring", "allreduce", p, p * k, {"send": 1, "recv": 1}, b.steps(),
                    root, k, inplace_safe=True)


def _ring_reduce_scatter_into_recv(b: RoundBuilder, p: int, k: int) -> None:
    """Reduce-scatter around the ring into ``recv`` (p chunks of k blocks): in step s rank r
    sends chunk r-s-1 and reduces chunk r-s-2 arriving from r-1 (the first partial read
    straight from ``send``); after p-1 steps rank r holds chunk r complete."""
    for s in range(p - 1):
        for r in range(p):
            c = (r - s - 1) % p
            dst = (r + 1) % p
            for j in range(k):
                lo = c * k + j
                src = Span("send" if s == 0 else "recv", lo, lo + 1)
                b.transfer(s, r, dst, src, Span("recv", lo, lo + 1), reduce=True,
                           base=Span("send", lo, lo + 1))


def ring_reduce(p: int, root: int = 0, segments: int = 1) -> Schedule:
    """Reduce-scatter around the ring, then every rank sends its complete chunk to the root:
    p steps, n(p-1)/p on every rank's wire and n(p-1)/p into the root (MPICH's long-message
    reduce, with a ring in place of recursive halving). The others' ``recv`` is scratch."""
    k = _segments(segments)
    b = RoundBuilder(p)
    if p == 1:
        _copy_all(b, p, k)
    _ring_reduce_scatter_into_recv(b, p, k)
    for r in range(p):
        if r != root:
            b.transfer(p - 1, r, root, Span("recv", r * k, (r + 1) * k))
    return Schedule("ring", "reduce", p, p * k, {"send": 1, "recv": 1}, b.steps(), root, k,
                    inplace_safe=True)


def ring_reduce_scatter(p: int, root: int = 0, segments: int = 1) -> Schedule:
    """p-1 steps; partials travel in ``tmp`` and the last reduction lands in ``recv``."""
    k = _segments(segments)
    b = RoundBuilder(p)
    if p == 1:
        _copy_all(b, p, k)
    for s in range(p - 1):
        for r in range(p):
            c = (r - s - 1) % p
            dst = (r + 1) % p
            last = s == p - 2          # then c == dst: the receiver's own unit is complete
            for j in range(k):
                lo = c * k + j
                src = Span("send" if s == 0 else "tmp", lo, lo + 1)
                into = Span("recv", j, j + 1) if last else Span("tmp", lo, lo + 1)
                b.transfer(s, r, dst, src, into, reduce=True, base=Span("send", lo, lo + 1))
    return Schedule("ring", "reduce-scatter", p, k, {"send": p, "recv": 1, "tmp": p},
                    b.steps(), root, k, inplace_safe=True)


def ring_allgather(p: int, root: int = 0, segments: int = 1) -> Schedule:
    """Own block into place, then p-1 steps forwarding block r-s to r+1."""
    k = _segments(segments)
    b = RoundBuilder(p)
    for r in range(p):
        b.copy(0, r, Span("send", 0, k), Span("recv", r * k, (r + 1) * k))
    for s in range(p - 1):
        for r in range(p):
            c = (r - s) % p
            b.transfer(s, r, (r + 1) % p, Span("recv", c * k, (c + 1) * k))
    return Schedule("ring", "allgather", p, k, {"send": 1, "recv": p}, b.steps(), root, k,
                    inplace_safe=True)


def ring_broadcast(p: int, root: int = 0, segments: int = 1) -> Schedule:
    """A pipelined chain root -> root+1 -> ...: k segments, p-1+k-1 steps; virtual rank v
    forwards segment j in step v+j."""
    k = _segments(segments)
    b = RoundBuilder(p)
    for v in range(p - 1):
        src, dst = (root + v) % p, (root + v + 1) % p
        for j in range(k):
            b.transfer(v + j, src, dst, Span("recv", j, j + 1))
    return Schedule("ring", "broadcast", p, k, {"recv": 1}, b.steps(), root, k,
                    inplace_safe=True)


def ring_alltoall(p: int, root: int = 0, segments: int = 1) -> Schedule:
    """Ring-shifted pairwise exchange: in step s rank r sends block r+s to r+s and receives
    block r-s from r-s (p-1 steps, one message each way)."""
    k = _segments(segments)
    b = RoundBuilder(p)
    for r in range(p):
        b.copy(0, r, Span("send", r * k, (r + 1) * k), Span("recv", r * k, (r + 1) * k))
    for s in range(1, p):
        for r in range(p):
            dst = (r + s) % p
            b.transfer(s, r, dst, Span("send", dst * k, (dst + 1) * k),
                       Span("recv", r * k, (r + 1) * k))
    return Schedule("ring", "alltoall", p, k, {"send": p, "recv": p}, b.steps(), root, k,
                    inplace_safe=False)
