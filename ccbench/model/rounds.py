"""Schedules as rounds of array-valued traffic, for replay at any rank count.

The schedules of algorithms/ are built round by round (algorithms.schedule.RoundBuilder):
a transfer of round t is a send in the sender's step t and a recv in the receiver's step t.
Here the same rounds are generated lazily, one at a time, as numpy arrays of messages
(source, destination, bytes, bytes the receiver reduces): the program of a
rank-symmetric algorithm is one formula of the rank, so memory is O(p) per round and
never O(p^2), and a run of identical rounds (the 2(p-1) steps of a ring) is one round
with a repeat count.

tests/test_model_rounds.py checks, message by message, that every generator here yields
the same per-rank steps as the algorithms/ schedule of the same name at small p.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from ccbench import collectives
from ccbench.errors import UsageError

__all__ = ["Round", "RoundProgram", "round_program", "ROUND_ALGORITHMS"]

#: concurrent messages of one round above which a round program is refused (direct
#: all-to-all at p ranks has p(p-1) in one round)
MAX_ROUND_MESSAGES = 1 << 23


@dataclass(frozen=True, slots=True)
class Round:
    """The messages of one round, `repeat` times in a row."""

    src: np.ndarray          # int64 rank ids
    dst: np.ndarray
    nbytes: np.ndarray       # float bytes per message
    reduce: np.ndarray       # bytes the receiver reduces on arrival, per message
    repeat: int = 1
    #: rank r sends to r XOR s, the same bytes on every rank (p a power of two): the
    #: relabellings r -> r XOR t map the round onto itself
    xor_symmetric: bool = False


@dataclass(frozen=True)
class RoundProgram:
    collective: str
    algorithm: str           # algorithms/ registry name
    p: int
    size: float
    num_rounds: int          # counting repeats
    make: Callable[[], Iterator[Round]]

    def rounds(self) -> Iterator[Round]:
        return self.make()


def _round(src: np.ndarray, dst: np.ndarray, nbytes: float | np.ndarray, reduce: bool,
           repeat: int = 1) -> Round:
    src = np.asarray(src, np.int64)
    b = np.broadcast_to(np.asarray(nbytes, float), src.shape).astype(float)
    return Round(src, np.asarray(dst, np.int64), b, b if reduce else np.zeros(src.size), repeat)


def _xor_round(p: int, mask: int, nbytes: float, reduce: bool) -> Round:
    """Every rank r sends nbytes to r XOR mask (p a power of two)."""
    r = np.arange(p, dtype=np.int64)
    b = np.full(p, float(nbytes))
    return Round(r, r ^ mask, b, b if reduce else np.zeros(p), 1, xor_symmetric=True)


class _Fold:
    """MPICH's fold for non-powers of two (as algorithms.hypercube._Fold), vectorised."""

    def __init__(self, p: int) -> None:
        self.p2 = 1 << (p.bit_length() - 1)
        self.rem = p - self.p2

    def real(self, nr: np.ndarray) -> np.ndarray:
        return np.where(nr < self.rem, 2 * nr + 1, nr + self.rem)

    def fold_in(self, nbytes: float) -> Iterator[Round]:
        if self.rem:
            even = np.arange(0, 2 * self.rem, 2)
            yield _round(even, even + 1, nbytes, True)

    def fold_out(self, nbytes: float) -> Iterator[Round]:
        if self.rem:
            odd = np.arange(1, 2 * self.rem, 2)
            yield _round(odd, odd - 1, nbytes, False)


def _levels(p: int) -> int:
    return (p - 1).bit_length()


# -- ring -----------------------------------------------------------------------------------

def _ring_steps(p: int, chunk: float, reduce_steps: int, plain_steps: int) -> Iterator[Round]:
    r = np.arange(p)
    if p > 1 and reduce_steps:
        yield _round(r, (r + 1) % p, chunk, True, reduce_steps)
    if p > 1 and plain_steps:
        yield _round(r, (r + 1) % p, chunk, False, plain_steps)


def _ring_allreduce(p: int, s: float) -> Iterator[Round]:
    return _ring_steps(p, s / p, p - 1, p - 1)


def _ring_reduce_scatter(p: int, s: float) -> Iterator[Round]:
    return _ring_steps(p, s / p, p - 1, 0)


def _ring_allgather(p: int, s: float) -> Iterator[Round]:
    return _ring_steps(p, s / p, 0, p - 1)


def _ring_broadcast(p: int, s: float) -> Iterator[Round]:
    for v in range(p - 1):
        yield _round(np.array([v]), np.array([v + 1]), s, False)


def _ring_alltoall(p: int, s: float) -> Iterator[Round]:
    r = np.arange(p)
    for step in range(1, p):
        yield _round(r, (r + step) % p, s / p, False)


# -- binomial trees --------------------------------------------------------------------------

def _bcast(p: int, s: float) -> Iterator[Round]:
    for i in range(_levels(p)):
        mask = 1 << i
        v = np.arange(min(mask, p - mask))
        yield _round(v, v + mask, s, False)


def _reduce(p: int, s: float) -> Iterator[Round]:
    for i in reversed(range(_levels(p))):
        mask = 1 << i
        v = np.arange(mask, min(2 * mask, p))
        yield _round(v, v - mask, s, True)


def _tree_allreduce(p: int, s: float) -> Iterator[Round]:
    yield from _reduce(p, s)
    yield from _bcast(p, s)


# -- hypercube ---------------------------------------------------------------------------------

def _rd_allreduce(p: int, s: float) -> Iterator[Round]:
    f = _Fold(p)
    yield from f.fold_in(s)
    nr = np.arange(f.p2)
    mask = 1
    while mask < f.p2:
        yield _xor_round(p, mask, s, True) if not f.rem else \
            _round(f.real(nr), f.real(nr ^ mask), s, True)
        mask *= 2
    yield from f.fold_out(s)


def _rabenseifner(p: int, s: float) -> Iterator[Round]:
    f = _Fold(p)
    yield from f.fold_in(s)
    nr = np.arange(f.p2)
    block = s / f.p2
    mask = f.p2 // 2
    while mask >= 1:
        yield _xor_round(p, mask, mask * block, True) if not f.rem else \
            _round(f.real(nr), f.real(nr ^ mask), mask * block, True)
        mask //= 2
    mask = 1
    while mask < f.p2:
        yield _xor_round(p, mask, mask * block, False) if not f.rem else \
            _round(f.real(nr), f.real(nr ^ mask), mask * block, False)
        mask *= 2
    yield from f.fold_out(s)


def _halving_reduce_scatter(p: int, s: float) -> Iterator[Round]:
    """Newrank nr < rem owns two units (those of real ranks 2nr, 2nr+1), the rest one."""
    f = _Fold(p)
    unit = s / p
    yield from f.fold_in(s)
    nr = np.arange(f.p2)
    mask = f.p2 // 2
    while mask >= 1:
        partner = nr ^ mask
        g = nr & ~(2 * mask - 1)
        lo = np.where(nr < partner, g + mask, g)
        doubled = np.clip(np.minimum(lo + mask, f.rem) - lo, 0, None)
        yield _round(f.real(nr), f.real(partner), (mask + doubled) * unit, True)
        mask //= 2
    yield from f.fold_out(unit)


def _rd_allgather(p: int, s: float) -> Iterator[Round]:
    mask = 1
    while mask < p:
        yield _xor_round(p, mask, mask * s / p, False)
        mask *= 2


def _bruck_allgather(p: int, s: float) -> Iterator[Round]:
    """Step i sends min(2^i, p - 2^i) units to r - 2^i. A window that wraps past unit p-1
    is two messages in algorithms.hypercube; both leave together for the same peer, so
    here they are one flow (one connection's fair share, as one send of a packed buffer)."""
    r = np.arange(p)
    dist = 1
    while dist < p:
        yield _round(r, (r - dist) % p, min(dist, p - dist) * s / p, False)
        dist *= 2


def _hypercube_allgather(p: int, s: float) -> Iterator[Round]:
    return _rd_allgather(p, s) if p & (p - 1) == 0 else _bruck_allgather(p, s)


# -- all-to-all ---------------------------------------------------------------------------------

def _bruck_alltoall(p: int, s: float) -> Iterator[Round]:
    r = np.arange(p)
    for level in range(_levels(p)):
        dist = 1 << level
        moving = int(np.count_nonzero(r & dist))
        yield _round(r, (r + dist) % p, moving * s / p, False)


def _pairwise_alltoall(p: int, s: float) -> Iterator[Round]:
    r = np.arange(p)
    power_of_two = p & (p - 1) == 0
    for step in range(1, p):
        yield _xor_round(p, step, s / p, False) if power_of_two else \
            _round(r, (r + step) % p, s / p, False)


def _direct(p: int, s: float) -> Iterator[Round]:
    if p * (p - 1) > MAX_ROUND_MESSAGES:
        raise UsageError(f"direct at {p} ranks sends {p * (p - 1)} messages in one round "
                         f"(at most {MAX_ROUND_MESSAGES}); replay pairwise instead")
    if p == 1:
        return
    r = np.arange(p)
    src = np.tile(r, p - 1)
    dst = (src + np.repeat(np.arange(1, p), p)) % p
    yield _round(src, dst, s / p, False)


#: (algorithms/ registry name, collective) -> (p, S) -> rounds; the rounds of the
#: algorithms/ schedule of that name with root 0 and one segment
_GENERATORS: dict[tuple[str, str], Callable[[int, float], Iterator[Round]]] = {
    ("ring", "allreduce"): _ring_allreduce,
    ("ring", "reduce-scatter"): _ring_reduce_scatter,
    ("ring", "allgather"): _ring_allgather,
    ("ring", "broadcast"): _ring_broadcast,
    ("ring", "alltoall"): _ring_alltoall,
    ("tree", "broadcast"): _bcast,
    ("tree", "reduce"): _reduce,
    ("tree", "allreduce"): _tree_allreduce,
    ("hypercube", "allreduce"): _rd_allreduce,
    ("hypercube", "reduce-scatter"): _halving_reduce_scatter,
    ("hypercube", "allgather"): _hypercube_allgather,
    ("hypercube", "broadcast"): _bcast,
    ("hypercube", "reduce"): _reduce,
    ("hypercube", "alltoall"): _bruck_alltoall,
    ("rabenseifner", "allreduce"): _rabenseifner,
    ("bruck", "allgather"): _bruck_allgather,
    ("bruck", "alltoall"): _bruck_alltoall,
    ("direct", "alltoall"): _direct,
    ("direct", "allgather"): _direct,
    ("pairwise", "alltoall"): _pairwise_alltoall,
}

ROUND_ALGORITHMS: tuple[tuple[str, str], ...] = tuple(_GENERATORS)

_FORMULA_TO_REGISTRY = {
    "ring": "ring", "tree": "tree", "double-binary-tree": "dbtree",
    "recursive-doubling": "hypercube", "recursive-halving": "hypercube",
    "rabenseifner": "rabenseifner", "bruck": "bruck", "pairwise": "pairwise",
}


def schedule_names(collective: str, algorithm: str) -> list[str]:
    """The algorithms/ registry names that may hold the schedule of `algorithm` (a formula key
    or a registry name), in the order tried: the name itself, its usual registry name, then
    every other name the collective gives that formula (`ModelTerms.aliases`: a collective
    whose formula is "linear" and whose schedule is "ring" says {"ring": "linear"})."""
    terms = collectives.get(collective).model
    aliases = terms.aliases if terms is not None else {}
    key = aliases.get(algorithm, algorithm)
    names = [algorithm, _FORMULA_TO_REGISTRY.get(algorithm, algorithm), key,
             _FORMULA_TO_REGISTRY.get(key, key), *sorted(n for n, k in aliases.items() if k == key)]
    return list(dict.fromkeys(names))


def registry_name(collective: str, algorithm: str) -> str:
    """The algorithms/ registry name for a formula key or registry name (`schedule_names`:
    the first with a round generator)."""
    return next((n for n in schedule_names(collective, algorithm) if (n, collective) in _GENERATORS),
                _FORMULA_TO_REGISTRY.get(algorithm, algorithm))


def round_program(collective: str, algorithm: str, p: int, size: float) -> RoundProgram | None:
    """The rounds of (algorithm, collective) at p ranks for the nccl-tests size S, or None
    when there is no round generator (double binary tree; pipelined segments)."""
    name = registry_name(collective, algorithm)
    gen = _GENERATORS.get((name, collective))
    if gen is None:
        return None

    def make() -> Iterator[Round]:
        return gen(p, float(size))

    return RoundProgram(collective, name, p, float(size), _count(name, collective, p), make)


def _count(name: str, collective: str, p: int) -> int:
    """Rounds (with repeats) of a generator, without running it."""
    if p == 1:
        return 0
    fold = 2 if p & (p - 1) else 0
    lg2 = p.bit_length() - 1                 # lg of the fold's power of two
    if name == "ring":
        return 2 * (p - 1) if collective == "allreduce" else p - 1
    if name == "pairwise":
        return p - 1
    if name == "direct":
        return 1
    if collective == "allreduce" and name == "tree":
        return 2 * _levels(p)
    if collective == "allreduce" and name == "hypercube":
        return lg2 + fold
    if collective == "allreduce":            # rabenseifner
        return 2 * lg2 + fold
    if collective == "reduce-scatter":       # recursive halving
        return lg2 + fold
    return _levels(p)                        # trees, Bruck, recursive-doubling allgather
