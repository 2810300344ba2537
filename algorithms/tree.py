"""Tree schedules: binomial broadcast and reduce, allreduce as reduce + broadcast, and the
double binary tree allreduce (two complementary binary trees, half the data on each).

Trees are pipelined over ``segments`` (k): segment j runs the one-segment schedule k
steps late by j, so a node forwards segment j while it receives segment j+1.
"""

from __future__ import annotations

from algorithms.schedule import RoundBuilder, Schedule, Span

__all__ = ["binomial_broadcast", "binomial_reduce", "dbtree_allreduce", "tree_allreduce",
           "binary_tree", "mirror_tree"]


def _levels(p: int) -> int:
    return (p - 1).bit_length()          # ceil(lg p); 0 for p == 1


def _check(segments: int) -> int:
    if segments < 1:
        raise ValueError(f"segments must be >= 1, got {segments}")
    return segments


def _bcast_rounds(b: RoundBuilder, p: int, root: int, k: int, first: int, buf: str = "recv",
                  block0: int = 0) -> int:
    """Binomial broadcast: in round i, virtual ranks v < 2^i send to v + 2^i. Returns the
    first free round."""
    levels = _levels(p)
    for j in range(k):
        for i in range(levels):
            mask = 1 << i
            for v in range(min(mask, p - mask)):
                src, dst = (v + root) % p, (v + mask + root) % p
                lo = block0 + j
                b.transfer(first + i + j, src, dst, Span(buf, lo, lo + 1))
    return first + levels + k - 1 if p > 1 else first


def _reduce_rounds(b: RoundBuilder, p: int, root: int, k: int, first: int) -> int:
    """Binomial reduce into ``recv`` (the non-roots' recv is scratch): rounds in descending
    mask order, v in [2^i, 2^(i+1)) sends to v - 2^i. A node's first reduction reads its own
    contribution straight from ``send``."""
    levels = _levels(p)
    started: set[tuple[int, int]] = set()          # (rank, segment) with a partial in recv
    for j in range(k):
        for d, i in enumerate(reversed(range(levels))):
            mask = 1 << i
            for v in range(mask, min(2 * mask, p)):
                src, dst = (v + root) % p, (v - mask + root) % p
                buf = "recv" if (src, j) in started else "send"
                base = None if (dst, j) in started else Span("send", j, j + 1)
                b.transfer(first + d + j, src, dst, Span(buf, j, j + 1), Span("recv", j, j + 1),
                           reduce=True, base=base)
                started.add((dst, j))
    return first + levels + k - 1 if p > 1 else first


def binomial_broadcast(p: int, root: int = 0, segments: int = 1) -> Schedule:
    """ceil(lg p) steps per segment (MST broadcast)."""
    k = _check(segments)
    b = RoundBuilder(p)
    _bcast_rounds(b, p, root, k, 0)
    return Schedule("tree", "broadcast", p, k, {"recv": 1}, b.steps(), root, k)


def binomial_reduce(p: int, root: int = 0, segments: int = 1) -> Schedule:
    """The result lands in the root's ``recv``; other ranks use their ``recv`` as scratch."""
    k = _check(segments)
    b = RoundBuilder(p)
    if p == 1:
        b.copy(0, 0, Span("send", 0, k), Span("recv", 0, k))
    _reduce_rounds(b, p, root, k, 0)
    return Schedule("tree", "reduce", p, k, {"send": 1, "recv": 1}, b.steps(), root, k)


def tree_allreduce(p: int, root: int = 0, segments: int = 1) -> Schedule:
    """Binomial reduce to rank 0, then binomial broadcast from it: 2 ceil(lg p) steps."""
    k = _check(segments)
    b = RoundBuilder(p)
    if p == 1:
        b.copy(0, 0, Span("send", 0, k), Span("recv", 0, k))
    nxt = _reduce_rounds(b, p, 0, k, 0)
    _bcast_rounds(b, p, 0, k, nxt)
    return Schedule("tree", "allreduce", p, k, {"send": 1, "recv": 1}, b.steps(), root, k)


# -- binary trees --------------------------------------------------------------------------

def binary_tree(p: int) -> tuple[int, list[int], list[list[int]]]:
    """An in-order balanced binary tree on ranks 0..p-1: (root, parent, children)."""
    parent = [-1] * p
    children: list[list[int]] = [[] for _ in range(p)]

    def build(lo: int, hi: int, up: int) -> int:
        if lo > hi:
            return -1
        mid = (lo + hi + 1) // 2
        parent[mid] = up
        for child in (build(lo, mid - 1, mid), build(mid + 1, hi, mid)):
            if child >= 0:
                children[mid].append(child)
        return mid

    root = build(0, p - 1, -1)
    return root, parent, children


def mirror_tree(p: int) -> tuple[int, list[int], list[list[int]]]:
    """The second tree of the pair (as NCCL): the mirror image r -> p-1-r for even p, a shift
    by one for odd p, so most interior nodes of one tree are leaves of the other."""
    root, parent, children = binary_tree(p)
    if p % 2 == 0:
        m = [p - 1 - r for r in range(p)]
    else:
        m = [(r + 1) % p for r in range(p)]
    new_parent = [-1] * p
    new_children: list[list[int]] = [[] for _ in range(p)]
    for r in range(p):
        new_parent[m[r]] = m[parent[r]] if parent[r] >= 0 else -1
        new_children[m[r]] = [m[c] for c in children[r]]
    return m[root], new_parent, new_children


def _depths(root: int, children: list[list[int]]) -> list[int]:
    depth = [0] * len(children)
    stack = [root]
    while stack:
        node = stack.pop()
        for c in children[node]:
            depth[c] = depth[node] + 1
            stack.append(c)
    return depth


def _tree_allreduce_rounds(b: RoundBuilder, tree: tuple[int, list[int], list[list[int]]],
                           blocks: list[int], first: int) -> None:
    """Reduce up `tree` then broadcast down it, on the given blocks (one per segment)."""
    root, parent, children = tree
    depth = _depths(root, children)
    height = max(depth)
    p = len(parent)
    for j, blk in enumerate(blocks):
        # reduce: a node at depth d sends in round height - d (after its children)
        started: set[int] = set()
        order = sorted(range(p), key=lambda r: -depth[r])
        for r in order:
            if parent[r] < 0:
                continue
            src_buf = "recv" if r in started else "send"
            dst = parent[r]
            base = None if dst in started else Span("send", blk, blk + 1)
            b.transfer(first + height - depth[r] + j, r, dst, Span(src_buf, blk, blk + 1),
                       Span("recv", blk, blk + 1), reduce=True, base=base)
            started.add(dst)
        # broadcast: segment j leaves the root in round height + j, right after its reduce
        for r in range(p):
            if parent[r] >= 0:
                b.transfer(first + height + j + depth[r] - 1, parent[r], r,
                           Span("recv", blk, blk + 1))


def dbtree_allreduce(p: int, root: int = 0, segments: int = 1) -> Schedule:
    """Double binary tree: the first half of the buffer is reduced and broadcast over one
    binary tree, the second half over its mirror, both at once (2k blocks)."""
    k = _check(segments)
    b = RoundBuilder(p)
    if p == 1:
        b.copy(0, 0, Span("send", 0, 2 * k), Span("recv", 0, 2 * k))
    else:
        _tree_allreduce_rounds(b, binary_tree(p), list(range(k)), 0)
        _tree_allreduce_rounds(b, mirror_tree(p), list(range(k, 2 * k)), 0)
    return Schedule("dbtree", "allreduce", p, 2 * k, {"send": 1, "recv": 1}, b.steps(), root,
                    k)
