"""Symbolic verification of a schedule.

Every block holds a *set of contributions* (an int bit mask): atom ``origin * n + b``
stands for block b of rank ``origin``'s input (n = blocks of the input buffer). Copies and copy-recvs move
sets, reduce-recvs unite them. The simulation runs the ranks under rendezvous
semantics, the strictest a transport may have: a step completes only when every
partner has posted the matching operation. The verifier proves:

* every rank's output blocks hold exactly the contributions the collective defines
  (none missing, none extra, none counted twice; undefined data never used);
* sends and recvs pair up per ordered rank pair, in order, with equal sizes
  (same length, same position inside a unit);
* the schedule cannot deadlock, and no step has a hazard (a copy-recv landing where a
  send of the same step reads, or where another recv writes);
* the input buffer is never written, and -- with ``inplace=True`` -- the result is still
  right when the buffers alias as the harness passes them for in-place calls (the
  schedule's pattern says how: ``Pattern.inplace``).

What the output must hold, and how the buffers alias, come from the schedule's pattern
(``Schedule.pattern``), never from its collective's name.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from algorithms.schedule import Schedule, Span, Step

__all__ = ["VerifyResult", "verify"]

Content = int | None           # bit mask of atoms; None: undefined
_MAX_ERRORS = 20


@dataclass
class VerifyResult:
    schedule: Schedule
    inplace: bool
    errors: list[str] = field(default_factory=list)
    num_steps: int = 0
    num_messages: int = 0

    @property
    def ok(self) -> bool:
        return not self.errors

    def __str__(self) -> str:
        head = (f"{self.schedule.algorithm} {self.schedule.collective} p={self.schedule.num_ranks}"
                f"{' in-place' if self.inplace else ''}")
        if self.ok:
            return f"{head}: ok ({self.num_steps} steps, {self.num_messages} messages)"
        return f"{head}: FAILED\n  " + "\n  ".join(self.errors)


Key = tuple[int, int, int]      # a message: (source rank, destination rank, sequence number)


@dataclass
class _Run:
    """A simulation in progress: every rank's buffers, its messages' keys per step, the data
    in flight, and the step each rank is at."""
    state: list[dict[str, list[Content]]]
    keys: list[list[tuple[list[Key], list[Key]]]]
    payload: dict[Key, list[Content]]
    pos: list[int]


def _union(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The symbolic reduction: a block holds every contribution of the blocks it combines."""
    out = np.array(arrays[0], dtype=object)
    for a in arrays[1:]:
        out = out | a
    return out


class _Fail(Exception):
    pass


class _Verifier:
    def __init__(self, s: Schedule, inplace: bool) -> None:
        self.s, self.inplace = s, inplace
        self.p, self.B = s.num_ranks, s.blocks_per_unit
        self.result = VerifyResult(s, inplace)
        #: the input: the send buffer, or on a one-buffer pattern the root's recv buffer
        self.src = "send" if s.num_blocks("send") else "recv"
        self.src_blocks = s.num_blocks(self.src)
        self._expected: list[list[int] | None] | None = None

    # -- helpers ------------------------------------------------------------------------
    def error(self, text: str) -> None:
        self.result.errors.append(text)
        if len(self.result.errors) >= _MAX_ERRORS:
            raise _Fail

    def canon(self, rank: int, span: Span) -> Span:
        """Where a span really lives when the buffers alias (in-place calls)."""
        if not self.inplace:
            return span
        aliasing = self.s.computes.inplace
        if aliasing == "same" and span.buf == "send":
            return Span("recv", span.lo, span.hi)
        if aliasing == "send-in-recv" and span.buf == "send":
            off = rank * self.B
            return Span("recv", span.lo + off, span.hi + off)
        if aliasing == "recv-in-send" and span.buf == "recv":
            off = rank * self.B
            return Span("send", span.lo + off, span.hi + off)
        return span

    def same_shape(self, a: Span, b: Span) -> bool:
        return a.length == b.length and a.lo % self.B == b.lo % self.B

    # -- static checks ------------------------------------------------------------------
    def check_static(self) -> None:
        s = self.s
        if len(s.steps) != self.p:
            self.error(f"{len(s.steps)} rank programs for p={self.p}")
            raise _Fail
        for r, program in enumerate(s.steps):
            for i, step in enumerate(program):
                where = f"rank {r} step {i}"
                spans = (self._check_copies(r, where, step) + self._check_sends(r, where, step)
                         + self._check_recvs(r, where, step))
                for sp in spans:
                    if sp.hi > s.num_blocks(sp.buf):
                        self.error(f"{where}: {sp} outside the buffer "
                                   f"({s.num_blocks(sp.buf)} blocks)")
                self.check_hazards(r, i, step)

    def _check_copies(self, r: int, where: str, step: Step) -> list[Span]:
        spans: list[Span] = []
        for c in step.copies:
            spans += [c.src, c.dst]
            if c.dst.buf == "send":
                self.error(f"{where}: copy writes the input buffer ({c.dst})")
            if not self.same_shape(c.src, c.dst):
                self.error(f"{where}: copy {c.src} -> {c.dst} changes size")
            a, b = self.canon(r, c.src), self.canon(r, c.dst)
            if a.overlaps(b) and a != b:
                self.error(f"{where}: copy {c.src} -> {c.dst} overlaps itself")
        return spans

    def _check_sends(self, r: int, where: str, step: Step) -> list[Span]:
        for snd in step.sends:
            if not 0 <= snd.peer < self.p or snd.peer == r:
                self.error(f"{where}: send to invalid peer {snd.peer}")
        return [snd.span for snd in step.sends]

    def _check_recvs(self, r: int, where: str, step: Step) -> list[Span]:
        spans: list[Span] = []
        for rcv in step.recvs:
            spans.append(rcv.span)
            if not 0 <= rcv.peer < self.p or rcv.peer == r:
                self.error(f"{where}: recv from invalid peer {rcv.peer}")
            if rcv.span.buf == "send":
                self.error(f"{where}: recv writes the input buffer ({rcv.span})")
            if rcv.base is not None:
                spans.append(rcv.base)
                if not rcv.reduce:
                    self.error(f"{where}: a base on a copying recv")
                if not self.same_shape(rcv.base, rcv.span):
                    self.error(f"{where}: base {rcv.base} and {rcv.span} differ in size")
        return spans

    def check_hazards(self, r: int, i: int, step: Step) -> None:
        sends = [self.canon(r, x.span) for x in step.sends]
        recvs = [(self.canon(r, x.span), x) for x in step.recvs]
        bases = [self.canon(r, x.base) for x in step.recvs if x.base is not None]
        for n, (span, rcv) in enumerate(recvs):
            if rcv.reduce:
                continue
            for other in sends:
                if span.overlaps(other):
                    self.error(f"rank {r} step {i}: recv into {rcv.span} overlaps a send")
            for m, (o, _) in enumerate(recvs):
                if m != n and span.overlaps(o):
                    self.error(f"rank {r} step {i}: recv into {rcv.span} overlaps another recv")
            for base in bases:
                if span.overlaps(base):
                    self.error(f"rank {r} step {i}: recv into {rcv.span} overlaps a base")

    # -- matching -----------------------------------------------------------------------
    def match(self) -> tuple[dict[tuple[int, int, int], int], dict[tuple[int, int, int], int]]:
        """(src, dst, seq) -> step index at the sender / at the receiver."""
        sends: dict[tuple[int, int], list[tuple[int, Span]]] = defaultdict(list)
        recvs: dict[tuple[int, int], list[tuple[int, Span]]] = defaultdict(list)
        for r, program in enumerate(self.s.steps):
            for i, step in enumerate(program):
                for snd in step.sends:
                    sends[(r, snd.peer)].append((i, snd.span))
                for rcv in step.recvs:
                    recvs[(rcv.peer, r)].append((i, rcv.span))
        send_step, recv_step = {}, {}
        for pair in set(sends) | set(recvs):
            ss, rr = sends.get(pair, []), recvs.get(pair, [])
            if len(ss) != len(rr):
                self.error(f"ranks {pair[0]} -> {pair[1]}: {len(ss)} sends but {len(rr)} recvs")
                continue
            for seq, ((i, a), (j, b)) in enumerate(zip(ss, rr, strict=True)):
                if not self.same_shape(a, b):
                    self.error(f"ranks {pair[0]} -> {pair[1]} message {seq}: sends {a} "
                               f"(step {i}) but receives into {b} (step {j})")
                send_step[(*pair, seq)] = i
                recv_step[(*pair, seq)] = j
        self.result.num_messages = len(send_step)
        return send_step, recv_step

    # -- simulation ---------------------------------------------------------------------
    def initial_state(self) -> list[dict[str, list[Content]]]:
        s = self.s
        state = []
        for _ in range(self.p):
            bufs: dict[str, list[Content]] = {b: [None] * s.num_blocks(b) for b in s.units}
            if self.inplace:
                bufs.pop("recv" if s.computes.inplace == "recv-in-send" else "send", None)
            state.append(bufs)
        for r in range(self.p):
            if self.src == "recv":
                if r == s.root:
                    self.write(state, r, Span("recv", 0, self.src_blocks),
                               [1 << (r * self.src_blocks + b)
                                for b in range(self.src_blocks)])
            elif self.src_blocks:
                self.write(state, r, Span("send", 0, self.src_blocks),
                           [1 << (r * self.src_blocks + b) for b in range(self.src_blocks)])
        return state

    def read(self, state: list[dict[str, list[Content]]], r: int, span: Span) -> list[Content]:
        c = self.canon(r, span)
        return state[r][c.buf][c.lo:c.hi]

    def write(self, state: list[dict[str, list[Content]]], r: int, span: Span,
              values: list[Content]) -> None:
        c = self.canon(r, span)
        state[r][c.buf][c.lo:c.hi] = values

    def _message_keys(self) -> list[list[tuple[list[Key], list[Key]]]]:
        """Per rank and step: the (src, dst, seq) keys of its sends and of its recvs."""
        seqs: dict[tuple[int, int], int] = defaultdict(int)
        rseqs: dict[tuple[int, int], int] = defaultdict(int)
        keys = []
        for r, program in enumerate(self.s.steps):
            per_step = []
            for step in program:
                sk, rk = [], []
                for snd in step.sends:
                    sk.append((r, snd.peer, seqs[(r, snd.peer)]))
                    seqs[(r, snd.peer)] += 1
                for rcv in step.recvs:
                    rk.append((rcv.peer, r, rseqs[(rcv.peer, r)]))
                    rseqs[(rcv.peer, r)] += 1
                per_step.append((sk, rk))
            keys.append(per_step)
        return keys

    def simulate(self, send_step: dict[Key, int], recv_step: dict[Key, int]
                 ) -> list[dict[str, list[Content]]]:
        s, p = self.s, self.p
        run = _Run(self.initial_state(), self._message_keys(), {}, [0] * p)
        for r in range(p):
            if s.steps[r]:
                self._post(run, r)
        active = [r for r in range(p) if s.steps[r]]
        while active:
            progressed = []
            for r in active:
                if self._ready(run, r, send_step, recv_step):
                    self._complete(run, r)
                    run.pos[r] += 1
                    if run.pos[r] < len(s.steps[r]):
                        self._post(run, r)
                    progressed.append(r)
            if not progressed:
                stuck = ", ".join(f"rank {r} at step {run.pos[r]}" for r in active[:8])
                self.error(f"deadlock: {stuck}")
                raise _Fail
            active = [r for r in active if run.pos[r] < len(s.steps[r])]
        self.result.num_steps = max((len(x) for x in s.steps), default=0)
        return run.state

    def _post(self, run: _Run, r: int) -> None:
        """Rank r starts its current step: local copies, then its sends take their data."""
        step = self.s.steps[r][run.pos[r]]
        for c in step.copies:
            self.write(run.state, r, c.dst, list(self.read(run.state, r, c.src)))
        for snd, key in zip(step.sends, run.keys[r][run.pos[r]][0], strict=True):
            data = list(self.read(run.state, r, snd.span))
            if any(x is None for x in data):
                self.error(f"rank {r} step {run.pos[r]}: sends undefined data from {snd.span}")
            run.payload[key] = data

    @staticmethod
    def _ready(run: _Run, r: int, send_step: dict[Key, int], recv_step: dict[Key, int]) -> bool:
        """Every peer of rank r's current step has reached the step that matches it."""
        sk, rk = run.keys[r][run.pos[r]]
        return (all(recv_step.get(k, 1 << 60) <= run.pos[k[1]] for k in sk)
                and all(send_step.get(k, 1 << 60) <= run.pos[k[0]] for k in rk))

    def _complete(self, run: _Run, r: int) -> None:
        """Rank r's recvs land: copied, or reduced into their base (each atom at most once)."""
        step = self.s.steps[r][run.pos[r]]
        where = f"rank {r} step {run.pos[r]}"
        for rcv, key in zip(step.recvs, run.keys[r][run.pos[r]][1], strict=True):
            data = run.payload.pop(key)
            if not rcv.reduce:
                self.write(run.state, r, rcv.span, data)
                continue
            base = self.read(run.state, r, rcv.base if rcv.base is not None else rcv.span)
            out: list[Content] = []
            for b, (mine, theirs) in enumerate(zip(base, data, strict=True)):
                if mine is None or theirs is None:
                    self.error(f"{where}: reduces undefined data into {rcv.span} (block {b})")
                    out.append(None)
                    continue
                twice = mine & theirs
                if twice:
                    self.error(f"{where}: contributions counted twice in {rcv.span}: "
                               f"{self.atoms(twice)}")
                out.append(mine | theirs)
            self.write(run.state, r, rcv.span, out)

    def atoms(self, content: int) -> str:
        n = max(self.src_blocks, 1)
        items = [i for i in range(content.bit_length()) if content >> i & 1]
        text = ", ".join(f"r{a // n}.b{a % n}" for a in items[:6])
        return text + (", ..." if len(items) > 6 else "")

    # -- the answer ---------------------------------------------------------------------
    def expected(self, r: int) -> list[int] | None:
        """Rank r's output blocks as the pattern's result defines them, computed on every
        rank's input blocks as sets (``1 << atom``) and the reduction as their union."""
        if self._expected is None:
            n = self.src_blocks
            inputs = [np.array([1 << (q * n + b) for b in range(n)], dtype=object)
                      for q in range(self.p)]
            outputs = self.s.computes.result(inputs, _union, self.s.root)
            self._expected = [None if out is None else [int(x) for x in out]
                              for out in outputs]
        return self._expected[r]

    def check_final(self, state: list[dict[str, list[Content]]]) -> None:
        for r in range(self.p):
            want = self.expected(r)
            if want is None:
                continue
            got = self.read(state, r, Span("recv", 0, len(want))) if want else []
            if len(got) != len(want):
                self.error(f"rank {r}: output has {len(got)} blocks, expected {len(want)}")
                continue
            for b, (g, w) in enumerate(zip(got, want, strict=True)):
                if g is None:
                    self.error(f"rank {r}: output block {b} never written")
                elif g != w:
                    missing, extra = w & ~g, g & ~w
                    parts = []
                    if missing:
                        parts.append(f"missing {self.atoms(missing)}")
                    if extra:
                        parts.append(f"extra {self.atoms(extra)}")
                    self.error(f"rank {r}: output block {b} " + "; ".join(parts))

    def run(self) -> VerifyResult:
        try:
            self.check_static()
            if self.result.errors:
                return self.result
            send_step, recv_step = self.match()
            if self.result.errors:
                return self.result
            state = self.simulate(send_step, recv_step)
            self.check_final(state)
        except _Fail:
            pass
        return self.result


def verify(schedule: Schedule, inplace: bool = False) -> VerifyResult:
    """Prove `schedule` right for its p (see the module docstring for what is checked)."""
    if inplace and not schedule.computes.aliases:
        inplace = False          # one buffer (broadcast) or rooted: nothing aliases
    return _Verifier(schedule, inplace).run()
