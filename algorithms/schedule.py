"""The schedule data model: what every rank does, step by step, on blocks of its buffers.

Buffers. Each rank owns up to three buffers, named ``send`` (the input, read only),
``recv`` (the output; for broadcast the one buffer) and ``tmp`` (scratch). A buffer is
``units[name]`` units long; a unit is split into ``blocks_per_unit`` (B) blocks, and a
schedule addresses blocks, never elements. The executor maps block ``b`` of a unit of
``U`` elements to elements ``[(b % B) * U // B, ...)`` offset by ``(b // B) * U``, so two
block ranges hold the same number of elements whenever they have the same length and
start at the same position inside their unit (``lo % B``). That is the rule a send and
its matching recv must obey.

What a unit is, and how many units the send and recv buffers hold, is the schedule's
pattern's (``algorithms.patterns.PATTERNS``: ``Pattern.unit``, ``send_units``,
``recv_units``); a schedule whose ``units`` disagree is refused.

Steps. A rank executes its steps in order. One step is:

1. its ``copies``, in order (local block copies between buffers);
2. all its ``sends`` and ``recvs``, posted together and concurrent. Sends read the
   buffer as it is after the copies; a recv either copies the incoming blocks into its
   span or reduces them into it (``reduce=True``): ``span = base (op) incoming`` when
   ``base`` is given, else ``span = span (op) incoming``. All recv results are applied
   after the step's sends have read their data, in the listed order.

Patterns. What a schedule computes is its ``pattern`` (a key of ``PATTERNS``, defined in
algorithms.patterns, where a new computation is one entry): by default its collective's
name; a schedule of another collective that computes one of them (a scatter-allgather
broadcast computes "broadcast") names it, and the executor, the verifier and the reference
read the pattern, never the collective's name.

Messages between an ordered pair of ranks are matched in order: the k-th send from a to
b is the k-th recv of b from a (the executor tags each with k, so transports need not
be FIFO). ``Schedule.verify`` (algorithms.verify) proves a schedule right.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from algorithms.patterns import PATTERNS, Pattern

__all__ = ["BUFFERS", "PATTERNS", "Copy", "Pattern", "Recv", "Schedule", "Send", "Span", "Step"]

BUFFERS: tuple[str, ...] = ("send", "recv", "tmp")


@dataclass(frozen=True, slots=True)
class Span:
    """Blocks ``lo .. hi-1`` of one buffer."""

    buf: str
    lo: int
    hi: int

    def __post_init__(self) -> None:
        if self.buf not in BUFFERS:
            raise ValueError(f"unknown buffer {self.buf!r} (valid: {', '.join(BUFFERS)})")
        if not 0 <= self.lo < self.hi:
            raise ValueError(f"empty or negative span {self.buf}[{self.lo}:{self.hi}]")

    @property
    def length(self) -> int:
        return self.hi - self.lo

    def overlaps(self, other: Span) -> bool:
        return self.buf == other.buf and self.lo < other.hi and other.lo < self.hi

    def __str__(self) -> str:
        return f"{self.buf}[{self.lo}:{self.hi}]"


@dataclass(frozen=True, slots=True)
class Send:
    peer: int
    span: Span


@dataclass(frozen=True, slots=True)
class Recv:
    peer: int
    span: Span
    reduce: bool = False
    base: Span | None = None        # reduce: span = base (op) incoming; needs reduce=True


@dataclass(frozen=True, slots=True)
class Copy:
    src: Span
    dst: Span


@dataclass(frozen=True, slots=True)
class Step:
    copies: tuple[Copy, ...] = ()
    sends: tuple[Send, ...] = ()
    recvs: tuple[Recv, ...] = ()

    def is_empty(self) -> bool:
        return not (self.copies or self.sends or self.recvs)


@dataclass(frozen=True)
class Schedule:
    """One collective on ``num_ranks`` ranks: ``steps[r]`` is rank r's program."""

    algorithm: str
    collective: str
    num_ranks: int
    blocks_per_unit: int
    units: dict[str, int]
    steps: tuple[tuple[Step, ...], ...]
    root: int = 0
    segments: int = 1
    #: correct when the harness passes aliased buffers (in-place call); else the executor
    #: snapshots the input first. ``verify(..., inplace=True)`` proves the claim.
    inplace_safe: bool = True
    notes: str = ""
    meta: dict[str, object] = field(default_factory=dict)
    #: what it computes (a key of PATTERNS); empty: its collective's name
    pattern: str = ""

    def __post_init__(self) -> None:
        if not self.pattern:
            object.__setattr__(self, "pattern", self.collective)
        if self.pattern not in PATTERNS:
            raise ValueError(f"the {self.algorithm} {self.collective} schedule computes no known "
                             f"pattern {self.pattern!r}: name the one it computes "
                             f"(Schedule(..., pattern=...): {', '.join(PATTERNS)})")
        want = PATTERNS[self.pattern].units(self.num_ranks)
        have = {buf: n for buf, n in self.units.items() if buf != "tmp"}
        if have != want:
            raise ValueError(f"the {self.algorithm} {self.collective} schedule at p={self.num_ranks}"
                             f" has units {have}, but its pattern {self.pattern!r} has {want} "
                             f"(algorithms.patterns.PATTERNS)")

    @property
    def computes(self) -> Pattern:
        """Its pattern's rules."""
        return PATTERNS[self.pattern]

    def num_blocks(self, buf: str) -> int:
        return self.units.get(buf, 0) * self.blocks_per_unit

    def num_steps(self) -> int:
        return max((len(s) for s in self.steps), default=0)

    def num_messages(self) -> int:
        return sum(len(step.sends) for rank in self.steps for step in rank)

    def describe(self, rank: int) -> list[str]:
        """One line per step of `rank` (for `ccbench algorithms show`)."""
        lines = []
        for index, step in enumerate(self.steps[rank]):
            parts = [f"copy {c.src} -> {c.dst}" for c in step.copies]
            parts += [f"send {s.span} -> {s.peer}" for s in step.sends]
            for r in step.recvs:
                if r.reduce:
                    base = f" with {r.base}" if r.base is not None else ""
                    parts.append(f"recv {r.peer} -> reduce into {r.span}{base}")
                else:
                    parts.append(f"recv {r.peer} -> {r.span}")
            lines.append(f"{index:4d}  " + "; ".join(parts))
        return lines


class RoundBuilder:
    """Builds a schedule as global rounds: a transfer in round t is a send in the sender's
    step t and a recv in the receiver's step t, so message order is consistent by
    construction. Empty steps are dropped at the end."""

    def __init__(self, num_ranks: int) -> None:
        self.num_ranks = num_ranks
        self._rounds: dict[int, dict[int, tuple[list[Copy], list[Send], list[Recv]]]] = {}

    def _slot(self, t: int, rank: int) -> tuple[list[Copy], list[Send], list[Recv]]:
        return self._rounds.setdefault(t, {}).setdefault(rank, ([], [], []))

    def copy(self, t: int, rank: int, src: Span, dst: Span) -> None:
        self._slot(t, rank)[0].append(Copy(src, dst))

    def transfer(self, t: int, src: int, dst: int, src_span: Span, dst_span: Span | None = None,
                 reduce: bool = False, base: Span | None = None) -> None:
        self._slot(t, src)[1].append(Send(dst, src_span))
        self._slot(t, dst)[2].append(Recv(src, dst_span or src_span, reduce, base))

    def last_round(self) -> int:
        return max(self._rounds, default=-1)

    def steps(self) -> tuple[tuple[Step, ...], ...]:
        out: list[list[Step]] = [[] for _ in range(self.num_ranks)]
        for t in sorted(self._rounds):
            for rank, (copies, sends, recvs) in self._rounds[t].items():
                step = Step(tuple(copies), tuple(sends), tuple(recvs))
                if not step.is_empty():
                    out[rank].append(step)
        return tuple(tuple(s) for s in out)
