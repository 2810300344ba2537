"""Hypercube schedules: recursive doubling, recursive halving, Rabenseifner, Bruck.

Non-powers of two use the standard fold (Thakur, Rabenseifner & Gropp 2005, as MPICH):
with p' the largest power of two <= p and rem = p - p', the first 2 rem ranks pair up;
each even one hands its data to its odd neighbour and sits out; the p' survivors
(``newrank``) run the power-of-two algorithm; at the end the odd ranks hand the result
back. The allgather uses Bruck's algorithm when p is not a power of two (ceil(lg p)
steps, no fold needed).
"""

from __future__ import annotations

from algorithms.schedule import RoundBuilder, Schedule, Span

__all__ = ["bruck_allgather", "halving_reduce_scatter", "hypercube_allgather",
           "rabenseifner_allreduce", "rd_allgather", "rd_allreduce"]


class _Fold:
    def __init__(self, p: int) -> None:
        self.p = p
        self.p2 = 1 << (p.bit_length() - 1)
        self.rem = p - self.p2

    def newrank(self, r: int) -> int:
        if r < 2 * self.rem:
            return r // 2 if r % 2 else -1
        return r - self.rem

    def real(self, nr: int) -> int:
        return 2 * nr + 1 if nr < self.rem else nr + self.rem

    @property
    def levels(self) -> int:
        return self.p2.bit_length() - 1


def _check(segments: int) -> int:
    if segments < 1:
        raise ValueError(f"segments must be >= 1, got {segments}")
    return segments


def _fold_in(b: RoundBuilder, f: _Fold, t: int, nblocks: int, acc: str, has_acc: set[int]) -> int:
    """Even ranks below 2 rem send their whole input to the odd neighbour. Returns next round."""
    if not f.rem:
        return t
    for r in range(0, 2 * f.rem, 2):
        b.transfer(t, r, r + 1, Span("send", 0, nblocks), Span(acc, 0, nblocks), reduce=True,
                   base=Span("send", 0, nblocks))
        has_acc.add(r + 1)
    return t + 1


def _window(ranges: list[tuple[int, int]], a: int, z: int) -> tuple[int, int]:
    return ranges[a][0], ranges[z - 1][1]


def _halving(b: RoundBuilder, f: _Fold, t: int, ranges: list[tuple[int, int]], acc: str,
             has_acc: set[int]) -> int:
    """Recursive halving over newranks: in the round of `mask` (p'/2 down to 1) a rank keeps
    the half of its window its own newrank falls in and reduces the partner's copy of it.
    Afterwards newrank nr holds ranges[nr] fully reduced in `acc`."""
    mask = f.p2 // 2
    while mask >= 1:
        for nr in range(f.p2):
            partner = nr ^ mask
            g = nr & ~(2 * mask - 1)
            lower = (g, g + mask)
            upper = (g + mask, g + 2 * mask)
            give = upper if nr < partner else lower
            lo, hi = _window(ranges, *give)
            src, dst = f.real(nr), f.real(partner)
            src_buf = acc if src in has_acc else "send"
            # the partner's first reduction reads its own input as the base
            base = None if dst in has_acc else Span("send", lo, hi)
            b.transfer(t, src, dst, Span(src_buf, lo, hi), Span(acc, lo, hi), reduce=True,
                       base=base)
        has_acc.update(f.real(nr) for nr in range(f.p2))
        t += 1
        mask //= 2
    return t


def _doubling(b: RoundBuilder, f: _Fold, t: int, ranges: list[tuple[int, int]], buf: str) -> int:
    """Recursive doubling allgather over newranks: each round swaps the windows owned."""
    mask = 1
    while mask < f.p2:
        for nr in range(f.p2):
            g = nr & ~(mask - 1)
            lo, hi = _window(ranges, g, g + mask)
            b.transfer(t, f.real(nr), f.real(nr ^ mask), Span(buf, lo, hi))
        t += 1
        mask *= 2
    return t


def rd_allreduce(p: int, root: int = 0, segments: int = 1) -> Schedule:
    """Recursive doubling: lg p' exchanges of the whole buffer (+2 with the fold)."""
    k = _check(segments)
    f = _Fold(p)
    b = RoundBuilder(p)
    if p == 1:
        b.copy(0, 0, Span("send", 0, k), Span("recv", 0, k))
    has_acc: set[int] = set()
    t = _fold_in(b, f, 0, k, "recv", has_acc)
    mask = 1
    while mask < f.p2:
        for nr in range(f.p2):
            src, dst = f.real(nr), f.real(nr ^ mask)
            src_buf = "recv" if src in has_acc else "send"
            base = None if dst in has_acc else Span("send", 0, k)
            b.transfer(t, src, dst, Span(src_buf, 0, k), Span("recv", 0, k), reduce=True,
                       base=base)
        has_acc.update(f.real(nr) for nr in range(f.p2))
        t += 1
        mask *= 2
    for r in range(1, 2 * f.rem, 2):
        b.transfer(t, r, r - 1, Span("recv", 0, k))
    return Schedule("hypercube", "allreduce", p, k, {"send": 1, "recv": 1}, b.steps(), root, k)


def rabenseifner_allreduce(p: int, root: int = 0, segments: int = 1) -> Schedule:
    """Recursive-halving reduce-scatter then recursive-doubling allgather over p' chunks:
    2 lg p' steps moving 2n(p'-1)/p' (+2 full-buffer steps with the fold)."""
    k = _check(segments)
    f = _Fold(p)
    b = RoundBuilder(p)
    nblocks = f.p2 * k
    if p == 1:
        b.copy(0, 0, Span("send", 0, nblocks), Span("recv", 0, nblocks))
    ranges = [(nr * k, (nr + 1) * k) for nr in range(f.p2)]
    has_acc: set[int] = set()
    t = _fold_in(b, f, 0, nblocks, "recv", has_acc)
    t = _halving(b, f, t, ranges, "recv", has_acc)
    t = _doubling(b, f, t, ranges, "recv")
    for r in range(1, 2 * f.rem, 2):
        b.transfer(t, r, r - 1, Span("recv", 0, nblocks))
    return Schedule("rabenseifner", "allreduce", p, nblocks, {"send": 1, "recv": 1}, b.steps(),
                    root, k)


def halving_reduce_scatter(p: int, root: int = 0, segments: int = 1) -> Schedule:
    """Recursive halving in ``tmp``; after the fold, newrank nr < rem reduces the units of
    real ranks 2nr and 2nr+1 and hands unit 2nr back at the end."""
    k = _check(segments)
    f = _Fold(p)
    b = RoundBuilder(p)
    ranges = []
    for nr in range(f.p2):
        first, last = (2 * nr, 2 * nr + 2) if nr < f.rem else (nr + f.rem, nr + f.rem + 1)
        ranges.append((first * k, last * k))
    has_acc: set[int] = set()
    t = _fold_in(b, f, 0, p * k, "tmp", has_acc)
    t = _halving(b, f, t, ranges, "tmp", has_acc)
    for r in range(p):
        if f.newrank(r) < 0:
            continue
        own = "tmp" if r in has_acc else "send"
        b.copy(t, r, Span(own, r * k, (r + 1) * k), Span("recv", 0, k))
        if r < 2 * f.rem:
            b.transfer(t, r, r - 1, Span("tmp", (r - 1) * k, r * k), Span("recv", 0, k))
    return Schedule("hypercube", "reduce-scatter", p, k, {"send": p, "recv": 1, "tmp": p},
                    b.steps(), root, k)


def rd_allgather(p: int, root: int = 0, segments: int = 1) -> Schedule:
    """Recursive doubling (p a power of two): lg p steps, windows doubling."""
    if p & (p - 1):
        raise ValueError(f"recursive doubling allgather needs a power of two, got p={p}")
    k = _check(segments)
    f = _Fold(p)
    b = RoundBuilder(p)
    for r in range(p):
        b.copy(0, r, Span("send", 0, k), Span("recv", r * k, (r + 1) * k))
    _doubling(b, f, 1, [(u * k, (u + 1) * k) for u in range(p)], "recv")
    return Schedule("hypercube", "allgather", p, k, {"send": 1, "recv": p}, b.steps(), root, k)


def _wrapped(buf: str, first_unit: int, count: int, p: int, k: int) -> list[Span]:
    """Units first .. first+count-1 (mod p) as at most two spans."""
    first_unit %= p
    end = first_unit + count
    if end <= p:
        return [Span(buf, first_unit * k, end * k)]
    return [Span(buf, first_unit * k, p * k), Span(buf, 0, (end - p) * k)]


def bruck_allgather(p: int, root: int = 0, segments: int = 1) -> Schedule:
    """Bruck (any p): in step i rank r sends the min(2^i, p - 2^i) units it holds, starting
    at its own, to r - 2^i. Units stay in natural order (a wrapped window is two messages)
    so no final rotation is needed."""
    k = _check(segments)
    b = RoundBuilder(p)
    for r in range(p):
        b.copy(0, r, Span("send", 0, k), Span("recv", r * k, (r + 1) * k))
    dist, t = 1, 1
    while dist < p:
        count = min(dist, p - dist)
        for r in range(p):
            for span in _wrapped("recv", r, count, p, k):
                b.transfer(t, r, (r - dist) % p, span)
        dist *= 2
        t += 1
    return Schedule("bruck", "allgather", p, k, {"send": 1, "recv": p}, b.steps(), root, k)


def hypercube_allgather(p: int, root: int = 0, segments: int = 1) -> Schedule:
    """Recursive doubling when p is a power of two, else Bruck (the textbook choice)."""
    if p & (p - 1) == 0:
        return rd_allgather(p, root, segments)
    s = bruck_allgather(p, root, segments)
    return Schedule("hypercube", s.collective, p, s.blocks_per_unit, s.units, s.steps, root,
                    s.segments, s.inplace_safe, notes="Bruck (p is not a power of two)")
