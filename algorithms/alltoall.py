"""All-to-all schedules: direct, pairwise, Bruck (and the one-step direct allgather)."""

from __future__ import annotations

from algorithms.schedule import RoundBuilder, Schedule, Span

__all__ = ["bruck_alltoall", "direct_allgather", "direct_alltoall", "pairwise_alltoall"]


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


def bruck_alltoall(p: int, root: int = 0, segments: int = 1) -> Schedule:
    """Bruck (any p): ceil(lg p) steps of about half the data each.

    ``tmp`` holds p rotated units (tmp[i] = send[r+i]), then a pack area and an unpack area
    of ceil(p/2) units each. In step k rank r packs the units whose index has bit k set,
    sends them to r + 2^k and receives the same positions from r - 2^k (unpacked at the
    start of the next step). Afterwards tmp[i] holds the block from rank r - i, copied to
    recv[r - i]. The input is read only by the first copy, so in-place calls are safe.
    """
    k = _check(segments)
    b = RoundBuilder(p)
    half = (p + 1) // 2
    pack, unpack = p, p + half                       # unit offsets inside tmp
    levels = (p - 1).bit_length()

    def unit(buf: str, u: int, n: int = 1) -> Span:
        return Span(buf, u * k, (u + n) * k)

    for r in range(p):
        # rotation: tmp[0 : p-r] = send[r : p], tmp[p-r : p] = send[0 : r]
        b.copy(0, r, unit("send", r, p - r), unit("tmp", 0, p - r))
        if r:
            b.copy(0, r, unit("send", 0, r), unit("tmp", p - r, r))
    for level in range(levels):
        dist = 1 << level
        moving = [i for i in range(p) if i & dist]
        for r in range(p):
            if level:
                previous = [i for i in range(p) if i & (dist >> 1)]
                for slot, i in enumerate(previous):
                    b.copy(level, r, unit("tmp", unpack + slot), unit("tmp", i))
            for slot, i in enumerate(moving):
                b.copy(level, r, unit("tmp", i), unit("tmp", pack + slot))
            b.transfer(level, r, (r + dist) % p, unit("tmp", pack, len(moving)),
                       unit("tmp", unpack, len(moving)))
    last = levels
    for r in range(p):
        if levels:
            previous = [i for i in range(p) if i & (1 << (levels - 1))]
            for slot, i in enumerate(previous):
                b.copy(last, r, unit("tmp", unpack + slot), unit("tmp", i))
        for i in range(p):
            b.copy(last, r, unit("tmp", i), unit("recv", (r - i) % p))
    return Schedule("bruck", "alltoall", p, k, {"send": p, "recv": p, "tmp": p + 2 * half},
                    b.steps(), root, k, inplace_safe=True)
