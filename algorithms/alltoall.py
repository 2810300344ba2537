"""All-to-all schedules (and the one-step direct allgather)."""

from __future__ import annotations

from algorithms.schedule import RoundBuilder, Schedule, Span

__all__ = ["direct_allgather", "direct_alltoall", "pairwise_alltoall"]


def _check(segments: int) -> int:
    if segments < 1:
        raise ValueError(f"segments must be >= 1, got {segments}")
    return segments


def _own_block(b: RoundBuilder, p: int, k: int) -> None:
    for r in range(p):
        b.copy(0, r, Span("send", r * k, (r + 1) * k), Span("recv", r * k, (r + 1) * k))


def direct_alltoall(p: int, root: int = 0, segments: int = 1) -> Schedule:
    """Every pair at once: one step with p-1 sends and p-1 recvs per rank (sends posted in
    the order r+1, r+2, ... so no rank is everyone's first peer)."""
    k = _check(segments)
    b = RoundBuilder(p)
    _own_block(b, p, k)
    for s in range(1, p):
        for r in range(p):
            dst = (r + s) % p
            b.transfer(0, r, dst, Span("send", dst * k, (dst + 1) * k),
                       Span("recv", r * k, (r + 1) * k))
    return Schedule("direct", "alltoall", p, k, {"send": p, "recv": p}, b.steps(), root, k,
                    inplace_safe=False)


def pairwise_alltoall(p: int, root: int = 0, segments: int = 1) -> Schedule:
    """p-1 steps of one exchange each: partner r XOR s when p is a power of two (each step a
    perfect matching), else send to r+s and receive from r-s."""
    k = _check(segments)
    b = RoundBuilder(p)
    _own_block(b, p, k)
    power_of_two = p & (p - 1) == 0
    for s in range(1, p):
        for r in range(p):
            dst = r ^ s if power_of_two else (r + s) % p
            b.transfer(s, r, dst, Span("send", dst * k, (dst + 1) * k),
                       Span("recv", r * k, (r + 1) * k))
    return Schedule("pairwise", "alltoall", p, k, {"send": p, "recv": p}, b.steps(), root, k,
                    inplace_safe=False)


def direct_allgather(p: int, root: int = 0, segments: int = 1) -> Schedule:
    """One step: every rank sends its block to every other rank."""
    k = _check(segments)
    b = RoundBuilder(p)
    for r in range(p):
        b.copy(0, r, Span("send", 0, k), Span("recv", r * k, (r + 1) * k))
    for s in range(1, p):
        for r in range(p):
            b.transfer(0, r, (r + s) % p, Span("recv", r * k, (r + 1) * k))
    return Schedule("direct", "allgather", p, k, {"send": 1, "recv": p}, b.steps(), root, k)
