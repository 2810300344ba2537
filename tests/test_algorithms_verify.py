"""The symbolic verifier: every registered schedule is right for p = 1..64, and the
verifier itself rejects broken schedules (missing, doubled, unmatched, deadlocked, hazards)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from algorithms import REGISTRY, Recv, Schedule, Send, Span, Step, generate, verify
from algorithms.executor import block_offsets

PAIRS = sorted(REGISTRY)


def _roots(collective: str, p: int) -> list[int]:
    return sorted({0, p - 1, p // 2}) if collective in ("broadcast", "reduce") else [0]


def _check(s: Schedule) -> None:
    result = verify(s)
    assert result.ok, str(result)
    if s.inplace_safe:
        result = verify(s, inplace=True)
        assert result.ok, str(result)


@pytest.mark.parametrize("algorithm,collective", PAIRS)
@pytest.mark.parametrize("p", list(range(1, 13)))
def test_every_schedule_small_p(algorithm: str, collective: str, p: int) -> None:
    for root in _roots(collective, p):
        for segments in ((1, 3) if p in (5, 8) else (1,)):
            _check(generate(algorithm, collective, p, root, segments))


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(pair=st.sampled_from(PAIRS), p=st.integers(1, 64), segments=st.integers(1, 3),
       data=st.data())
def test_every_schedule_any_p(pair: tuple[str, str], p: int, segments: int,
                              data: st.DataObject) -> None:
    algorithm, collective = pair
    root = data.draw(st.integers(0, p - 1)) if collective in ("broadcast", "reduce") else 0
    _check(generate(algorithm, collective, p, root, segments))


@pytest.mark.parametrize("algorithm,collective", PAIRS)
def test_largest_p(algorithm: str, collective: str) -> None:
    for p in (63, 64):
        _check(generate(algorithm, collective, p, p - 1 if collective in ("broadcast",
                                                                             "reduce") else 0))


# -- the verifier rejects what is wrong -------------------------------------------------

def _replace_step(s: Schedule, rank: int, index: int, step: Step) -> Schedule:
    steps = [list(x) for x in s.steps]
    steps[rank][index] = step
    return dataclasses.replace(s, steps=tuple(tuple(x) for x in steps))


def _errors(s: Schedule, inplace: bool = False) -> str:
    result = verify(s, inplace)
    assert not result.ok, "the verifier accepted a broken schedule"
    return "\n".join(result.errors)


def test_rejects_missing_contribution() -> None:
    s = generate("ring", "allreduce", 4)
    st0 = s.steps[1][0]
    broken = Step(st0.copies, st0.sends,
                  tuple(dataclasses.replace(r, reduce=False, base=None) for r in st0.recvs))
    assert "missing" in _errors(_replace_step(s, 1, 0, broken))


def test_rejects_double_count() -> None:
    s = generate("ring", "allreduce", 4)
    st4 = s.steps[2][4]   # allgather step 2 lands on my partial sum: reduce instead of copy
    broken = Step(st4.copies, st4.sends, tuple(
        dataclasses.replace(r, reduce=True) for r in st4.recvs))
    assert "counted twice" in _errors(_replace_step(s, 2, 4, broken))


def test_rejects_deadlock() -> None:
    # both ranks first wait for the other's message, then send: deadlock under rendezvous
    steps = tuple((Step(recvs=(Recv(1 - r, Span("recv", 0, 1)),)),
                   Step(sends=(Send(1 - r, Span("recv", 0, 1)),))) for r in range(2))
    s = Schedule("bad", "broadcast", 2, 1, {"recv": 1}, steps)
    assert "deadlock" in _errors(s)


def test_rejects_size_mismatch_and_unmatched() -> None:
    s = generate("ring", "allgather", 3, segments=2)
    st0 = s.steps[0][1]
    shrunk = Step(st0.copies, st0.sends, tuple(
        dataclasses.replace(r, span=Span(r.span.buf, r.span.lo, r.span.lo + 1))
        for r in st0.recvs))
    assert "receives into" in _errors(_replace_step(s, 0, 1, shrunk))
    dropped = Step(st0.copies, st0.sends, ())
    assert "sends but" in _errors(_replace_step(s, 0, 1, dropped))


def test_rejects_hazards_and_input_writes() -> None:
    assert "overlaps a send" in _errors(generate("direct", "alltoall", 4), inplace=True)
    assert "missing" in _errors(generate("ring", "alltoall", 5), inplace=True)
    s = generate("ring", "allgather", 2)
    st0 = s.steps[1][0]
    into_send = Step(st0.copies, st0.sends, tuple(
        dataclasses.replace(r, span=Span("send", 0, 1)) for r in st0.recvs))
    assert "input buffer" in _errors(_replace_step(s, 1, 0, into_send))


def test_rejects_undefined_data() -> None:
    s = generate("ring", "allgather", 3)
    st0 = s.steps[0][0]                       # drop the copy of my own block into place
    assert "undefined" in _errors(_replace_step(s, 0, 0, Step((), st0.sends, st0.recvs)))


def test_inplace_claims_are_checked() -> None:
    for algorithm, collective in PAIRS:
        s = generate(algorithm, collective, 5)
        if not s.inplace_safe:
            assert not verify(s, inplace=True).ok, f"{algorithm} {collective} is in-place safe"


# -- cost structure (the alpha and beta terms of ANCHORS.md) ---------------------------

def _sent_fraction(s: Schedule, rank: int, unit: int = 10080) -> float:
    """Elements this rank sends, over the element count of one unit."""
    total = 0
    for step in s.steps[rank]:
        for snd in step.sends:
            o = block_offsets(unit, s.blocks_per_unit, s.num_blocks(snd.span.buf))
            total += o[snd.span.hi] - o[snd.span.lo]
    return total / unit


def _comm_steps(s: Schedule, rank: int) -> int:
    return sum(1 for step in s.steps[rank] if step.sends or step.recvs)


@pytest.mark.parametrize("p", [2, 3, 4, 5, 7, 8, 12, 16])
def test_costs_match_the_textbook(p: int) -> None:
    lg = math.ceil(math.log2(p))
    ring = generate("ring", "allreduce", p)
    assert all(_comm_steps(ring, r) == 2 * (p - 1) for r in range(p))
    assert all(_sent_fraction(ring, r) == pytest.approx(2 * (p - 1) / p) for r in range(p))
    assert _comm_steps(generate("bruck", "allgather", p), 0) == lg
    assert _comm_steps(generate("tree", "broadcast", p), 0) == lg      # the root sends lg p times
    assert _comm_steps(generate("ring", "alltoall", p), 0) == p - 1
    bruck = generate("bruck", "alltoall", p)
    assert _comm_steps(bruck, 0) == lg
    # each step moves the units whose index has that bit set: n/2 per step for p = 2^k
    moved = sum(sum(1 for i in range(p) if i & (1 << j)) for j in range(lg)) / p
    assert _sent_fraction(bruck, 0) == pytest.approx(moved * p)
    if p & (p - 1) == 0:
        rd = generate("hypercube", "allreduce", p)
        assert _comm_steps(rd, 0) == lg and _sent_fraction(rd, 0) == pytest.approx(lg)
        rab = generate("rabenseifner", "allreduce", p)
        assert _comm_steps(rab, 0) == 2 * lg
        assert _sent_fraction(rab, 0) == pytest.approx(2 * (p - 1) / p)
        rs = generate("hypercube", "reduce-scatter", p)
        assert _comm_steps(rs, 0) == lg
        assert _sent_fraction(rs, 0) == pytest.approx(p - 1)        # (p-1)/p of p units
    else:
        # the fold adds one step before and one after
        assert _comm_steps(generate("hypercube", "allreduce", p), 1) == int(math.log2(p)) + 2


def test_dbtree_uses_two_complementary_trees() -> None:
    from algorithms.tree import binary_tree, mirror_tree

    for p in (4, 7, 8, 16, 31):
        _, pa, ca = binary_tree(p)
        _, pb, cb = mirror_tree(p)
        assert sorted(x for x in pa if x < 0) == [-1] and sorted(x for x in pb if x < 0) == [-1]
        both_interior = [r for r in range(p) if ca[r] and cb[r]]
        assert len(both_interior) <= 2, both_interior


def test_generate_rejects_bad_arguments() -> None:
    with pytest.raises(KeyError, match="valid"):
        generate("bruck", "reduce", 4)
    with pytest.raises(ValueError):
        generate("ring", "allreduce", 0)
    with pytest.raises(ValueError):
        generate("tree", "broadcast", 4, root=4)
    with pytest.raises(ValueError):
        generate("ring", "allreduce", 4, segments=0)
