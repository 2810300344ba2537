"""Matching every rank's comm ops into calls, and each call to its process group.

A collective call is one op on every rank of its group, at the same place in each member's
sequence of calls on that group. NCCL traces name the group of each op; gloo traces do not,
so the group is found here: the ranks are walked forward together and each op is matched with
the ops its group's other members have next, trying the candidate groups (those the trace
declares, that contain the rank and whose size the op's buffers divide by). A call that
every rank of the world makes next, alike, is read as one world call unless a smaller group
fits strictly better (the rank's same op ran on that group before, or the world is not
ready: the ranks' next ops differ); otherwise the smallest group first (`prefer="small"`
reads every call so: the other reading of the uncertain ones). An op whose group the trace
(or a capture file, or the user) names keeps it (op.group_source = "named"); one matched to
the only group that fitted is "inferred"; one where another group was ready as well is
"ambiguous": the first consistent assignment is kept, and the op says so. Where no
assignment is consistent, the ranks' sequences disagree and the trace is refused.

Point-to-point ops are matched as exchanges: a run of consecutive sends and receives on a
rank (isend/irecv posted together, a ring step, a pipeline hand-off, batch_isend_irecv) is
matched as a set with its peers' runs, as NCCL's group calls are, so that every rank may
send first. Each send and its receive stay one call; the ops of one exchange share
op.exchange (ccbench.replay.rank posts them together). Where the runs do not pair up as
a set, ops are paired one at a time, in order.
"""

from __future__ import annotations

import dataclasses

from ccbench.trace.ops import CommOp, Group, Trace, TraceError

__all__ = ["ambiguous_calls", "global_peers", "match_calls", "other_reading", "uncertain_calls"]

_MAX_STEPS = 200_000       # backtracking budget; real traces need one step per call
_P2P = ("send", "recv")

# A move: one step of the walk. (group, members, calls): each call the (rank, op index) of
# its ops; a collective is one call of every member's next op, an exchange several pairs.
Move = tuple[Group, tuple[int, ...], tuple[tuple[tuple[int, int], ...], ...]]


def _divides(op: CommOp, group: Group) -> str | None:
    """None if the op's buffers fit a group of this size, else why not."""
    n = group.size
    # out_bytes 0: the trace gave one side only (Chakra); the group decides the other
    if op.collective == "reduce-scatter" and not op.out_bytes and op.in_bytes:
        if op.in_bytes % (n * max(op.elsize, 1)):
            return f"reduce-scatter input {op.in_bytes} B does not divide into {n} blocks"
    elif op.collective == "allgather" and not op.out_bytes and op.in_bytes:
        pass
    elif op.collective == "allgather" and op.out_bytes != op.in_bytes * n:
        return f"all-gather output {op.out_bytes} B is not {n} x its input {op.in_bytes} B"
    elif op.collective == "reduce-scatter" and op.in_bytes != op.out_bytes * n:
        return f"reduce-scatter input {op.in_bytes} B is not {n} x its output {op.out_bytes} B"
    # a PyTorch trace gives the root's whole list: one block per member of the group
    if op.name in ("c10d::scatter_", "c10d::gather_") and op.in_bytes and op.out_bytes:
        whole, block = (op.in_bytes, op.out_bytes) if op.collective == "scatter" \
            else (op.out_bytes, op.in_bytes)
        if whole != block * n:
            return f"{op.collective} root's list of {whole} B is not {n} x {block} B"
    if op.collective == "alltoall" and op.in_bytes % (n * max(op.elsize, 1)):
        return f"all-to-all of {op.in_bytes} B does not divide into {n} blocks"
    if op.collective == "alltoallv" and op.in_splits and len(op.in_splits) != n:
        return f"all-to-allv has {len(op.in_splits)} splits, not {n}"
    if op.root is not None and not 0 <= op.root < n:
        return f"root {op.root} outside a group of {n}"
    return None


def _candidates(op: CommOp, groups: list[Group], world: Group) -> list[Group]:
    if op.group is not None:
        why = _divides(op, op.group)
        if why:
            raise TraceError(op.source, f"op size not divisible by the group: {why} "
                                        f"(group {list(op.group.ranks)})", op.node_id)
        return [op.group]
    if op.collective in ("send", "recv"):
        return [world]
    fits = [g for g in groups if op.rank in g.ranks and _divides(op, g) is None]
    if not fits:
        reasons = "; ".join(f"{list(g.ranks)}: {_divides(op, g)}" for g in groups
                            if op.rank in g.ranks)
        raise TraceError(op.source, f"op size not divisible by the group ({reasons})",
                         op.node_id)
    return sorted(fits, key=lambda g: (g.size, g.ranks))


def _same_call(a: CommOp, b: CommOp) -> bool:
    if (a.collective, a.dtype, a.root) != (b.collective, b.dtype, b.root):
        return False
    if a.collective in ("alltoallv", "gather", "scatter", "barrier"):
        return True                          # per-rank sizes may differ by design
    return a.size == b.size


def _signature(op: CommOp) -> tuple[object, ...]:
    return (op.collective, op.dtype, op.size, op.root)


def _call_key(op: CommOp) -> tuple[object, ...]:
    """What the ops of one call share (as _same_call)."""
    variable = op.collective in ("alltoallv", "gather", "scatter", "barrier")
    return (op.collective, op.dtype, op.root, None if variable else op.size)


_LISTED = ("c10d::scatter_", "c10d::gather_")     # the root passes one tensor per member


def _listed(op: CommOp) -> bool:
    """The op is the root's part of a PyTorch scatter or gather: it holds the list."""
    return op.name in _LISTED and bool(op.in_bytes if op.collective == "scatter"
                                       else op.out_bytes)


def _list_fits(op: CommOp, group: Group, roots: dict[tuple[int, object], set[int]]) -> bool:
    """A PyTorch scatter's or gather's root member, in this group, has an op of this kind
    whose list is one block per member (other ops: True)."""
    if op.name not in _LISTED or op.root is None:
        return True
    block = op.out_bytes if op.collective == "scatter" else op.in_bytes
    return block * group.size in roots.get((group.ranks[op.root], _call_key(op)), set())


def _other_fit(op: CommOp, chosen: Group, groups: list[Group],
               keys: list[set[tuple[object, ...]]],
               roots: dict[tuple[int, object], set[int]]) -> bool:
    """Another group fits the op, and each of its members has an op of the same kind (and,
    for a PyTorch scatter or gather, its root member one whose list fits): the trace alone
    cannot tell which group the call ran on."""
    key = _call_key(op)
    return any(g != chosen and op.rank in g.ranks and _divides(op, g) is None
               and all(key in keys[m] for m in g.ranks) and _list_fits(op, g, roots)
               for g in groups)


def _op_count(move: Move) -> int:
    return sum(len(call) for call in move[2])


class _Matcher:
    def __init__(self, ops: list[list[CommOp]], groups: list[Group],
                 prefer: str = "world") -> None:
        self.ops = ops
        self.world = Group(groups[0].name, tuple(range(len(ops))))
        self.prefer_world = prefer == "world"
        self.cands = [[_candidates(op, groups, self.world) for op in rank_ops]
                      for rank_ops in ops]
        # (rank, op signature) -> groups it ran on so far: a training loop repeats an op
        # (same collective and shape) on the same group, so the last one is tried first
        self.history: dict[tuple[int, tuple[object, ...]], list[Group]] = {}

    def _ready(self, pos: list[int], rank: int, group: Group) -> bool:
        op = self.ops[rank][pos[rank]]
        if not all(pos[m] < len(self.ops[m]) and group in self.cands[m][pos[m]]
                   and _same_call(self.ops[m][pos[m]], op) for m in group.ranks):
            return False
        if op.name in _LISTED and op.root is not None:     # its root holds the list
            root = group.ranks[op.root]
            return _listed(self.ops[root][pos[root]])
        return True

    def _run(self, pos: list[int], rank: int) -> list[int]:
        """Indices of the rank's consecutive point-to-point ops from its position."""
        rank_ops, end = self.ops[rank], pos[rank]
        while end < len(rank_ops) and rank_ops[end].collective in _P2P:
            end += 1
        return list(range(pos[rank], end))

    def _exchange(self, pos: list[int], rank: int) -> Move | None:
        """The rank's run of sends and receives with its peers' runs, when together they pair
        every send with a receive (matched as a set, not in order); else None."""
        runs: dict[int, list[int]] = {}
        todo = [rank]
        while todo:
            m = todo.pop()
            if m in runs:
                continue
            runs[m] = self._run(pos, m)
            if not runs[m]:
                return None
            for i in runs[m]:
                peer = self.ops[m][i].peer
                if peer is None or not 0 <= peer < len(self.ops) or peer == m:
                    return None
                todo.append(peer)
        recvs = {m: [i for i in run if self.ops[m][i].collective == "recv"]
                 for m, run in runs.items()}
        calls = []
        for m, run in sorted(runs.items()):
            for i in run:
                send = self.ops[m][i]
                if send.collective != "send":
                    continue
                dst = send.peer
                assert dst is not None
                match = next((j for j in recvs[dst] if self.ops[dst][j].peer == m
                              and self.ops[dst][j].size == send.size), None)
                if match is None:
                    return None
                recvs[dst].remove(match)
                calls.append(tuple(sorted(((m, i), (dst, match)))))
        if any(recvs.values()):
            return None
        return self.world, tuple(sorted(runs)), tuple(calls)

    def _p2p(self, pos: list[int], rank: int) -> list[Move]:
        exchange = self._exchange(pos, rank)
        if exchange is not None:
            return [exchange]
        op = self.ops[rank][pos[rank]]
        peer = op.peer if op.peer is not None else -1
        want = "recv" if op.collective == "send" else "send"
        if 0 <= peer < len(self.ops) and pos[peer] < len(self.ops[peer]):
            other = self.ops[peer][pos[peer]]
            if other.collective == want and other.peer == rank and other.size == op.size:
                members = tuple(sorted((rank, peer)))
                return [(self.world, members, (tuple((m, pos[m]) for m in members),))]
        return []

    def _collective(self, group: Group, pos: list[int]) -> Move:
        return group, group.ranks, (tuple((m, pos[m]) for m in group.ranks),)

    def _moves(self, pos: list[int]) -> list[Move]:
        """Calls that can happen next: (group, members) whose next ops all agree. Sends and
        receives first (they settle no group). A rank whose op ran on a known group before
        waits for that group rather than taking another; reading world calls first (see the
        module doc), a rank whose op the world could take does not take a smaller group
        while another rank can still move: the ranks behind may catch up and make it a
        world call. Other groups are kept as the fallback a dead end backtracks to."""
        for rank, rank_ops in enumerate(self.ops):
            if pos[rank] < len(rank_ops) and rank_ops[pos[rank]].collective in _P2P:
                moves = self._p2p(pos, rank)
                if moves:
                    return moves
        later: list[Move] = []
        fallback: list[Move] = []
        for rank, rank_ops in enumerate(self.ops):
            if pos[rank] >= len(rank_ops) or rank_ops[pos[rank]].collective in _P2P:
                continue
            op = rank_ops[pos[rank]]
            before = self.history.get((rank, _signature(op)))
            ready = [g for g in self.cands[rank][pos[rank]] if self._ready(pos, rank, g)]
            if self.prefer_world:       # every rank makes it next, alike: one world call
                ready.sort(key=lambda g: g.size != self.world.size)
            if before and before[-1] in ready:
                return [self._collective(before[-1], pos)] + \
                    [self._collective(g, pos) for g in ready if g != before[-1]]
            if ready and not before:
                waits = self.prefer_world and ready[0] != self.world \
                    and self.world in self.cands[rank][pos[rank]]
                if not waits:
                    return [self._collective(g, pos) for g in ready]
                later.extend(self._collective(g, pos) for g in ready
                             if all(g != f[0] for f in later))
                continue
            fallback.extend(self._collective(g, pos) for g in ready
                            if all(g != f[0] for f in fallback))
        # the calls of the ranks furthest behind first: the others wait for them
        later.sort(key=lambda move: max(i for _, i in move[2][0]))
        return later + [f for f in fallback if all(f[0] != m[0] for m in later)]

    def _apply(self, pos: list[int], move: Move, step: int) -> None:
        """step +1: make the move's calls; -1: undo them."""
        group = move[0]
        for m, i in (ref for call in move[2] for ref in call):
            key = (m, _signature(self.ops[m][i]))
            if step > 0:
                self.history.setdefault(key, []).append(group)
                pos[m] += 1
            else:
                self.history[key].pop()
                pos[m] -= 1

    def run(self) -> list[Move]:
        pos = [0] * len(self.ops)
        total = sum(len(o) for o in self.ops)
        done = 0
        path: list[Move] = []
        self.alternatives: list[bool] = []     # per call of path: another group was ready too
        stack = [self._moves(pos)]
        deepest = (0, list(pos))
        steps = 0
        while done < total:
            steps += 1
            if not stack or steps > _MAX_STEPS:
                self._disagree(deepest[1])
            moves = stack[-1]
            if not moves:                      # dead end: undo the last call
                stack.pop()
                if not path:
                    self._disagree(deepest[1])
                move = path.pop()
                self.alternatives.pop()
                self._apply(pos, move, -1)
                done -= _op_count(move)
                continue
            move = moves.pop(0)
            group, members = move[0], move[1]
            path.append(move)
            self.alternatives.append(any(g != group and set(m) & set(members)
                                         for g, m, _ in moves))
            self._apply(pos, move, +1)
            done += _op_count(move)
            if done > deepest[0]:
                deepest = (done, list(pos))
            stack.append(self._moves(pos) if done < total else [])
        return path

    def _disagree(self, pos: list[int]) -> None:
        stuck = [(r, self.ops[r][p]) for r, p in enumerate(pos) if p < len(self.ops[r])]
        # blame the rank whose next op is the odd one out (a rank missing an op has the next
        # one where the others have the one it lacks), not simply the lowest rank
        seen = [_call_key(o) for _, o in stuck]
        rank, op = min(stuck, key=lambda ro: seen.count(_call_key(ro[1])))
        stuck = [(rank, op)] + [(r, o) for r, o in stuck if r != rank]
        others = ", ".join(f"rank {r} next has {o.collective} {o.size} B (node {o.node_id})"
                           for r, o in stuck[1:4]) or "no other rank has an op left"
        raise TraceError(op.source, f"ranks' op sequences disagree: rank {rank}'s op #{op.index} "
                                    f"({op.name}: {op.describe()}) matches no other rank's next "
                                    f"op; {others}", op.node_id)


def match_calls(ops: list[list[CommOp]], groups: list[Group], prefer: str = "world") -> int:
    """Give every op its group and call number (in place); returns the number of calls.
    `groups` starts with the world group; `prefer` ("world" or "small") which group a call
    that fits several is read on (see the module doc)."""
    matcher = _Matcher(ops, groups, prefer)
    path = matcher.run()
    keys = [{_call_key(op) for op in rank_ops} for rank_ops in ops]
    roots: dict[tuple[int, object], set[int]] = {}     # (root rank, kind) -> list bytes
    for op in (op for rank_ops in ops for op in rank_ops if _listed(op)):
        whole = op.in_bytes if op.collective == "scatter" else op.out_bytes
        roots.setdefault((op.rank, _call_key(op)), set()).add(whole)
    call = 0
    for number, (group, _, calls) in enumerate(path):
        exchange = number if len(calls) > 1 else -1
        for refs in calls:
            for m, i in refs:
                _settle(ops[m][i], group, call, exchange,
                        matcher.alternatives[number] or (
                            ops[m][i].collective not in _P2P
                            and _other_fit(ops[m][i], group, groups, keys, roots)))
            call += 1
    return call


def _settle(op: CommOp, group: Group, call: int, exchange: int, unsure: bool) -> None:
    """Give a matched op its group (unless named), call and exchange."""
    if op.group is None:
        op.group_source = "ambiguous" if unsure else "inferred"
        op.group = group
    if not op.out_bytes and op.in_bytes:      # one side given (Chakra): the other
        if op.collective == "allgather":
            op.out_bytes = op.in_bytes * op.group.size
        elif op.collective == "reduce-scatter":
            op.out_bytes = op.in_bytes // op.group.size
    op.call, op.exchange = call, exchange


def _peer_candidates(op: CommOp, groups: list[Group]) -> list[int]:
    """The global ranks a send's or recv's group-local peer can be: rank `peer` of each
    group of the op's rank (the world first), never the rank itself."""
    assert op.peer is not None
    found: list[int] = []
    for group in groups:
        if op.rank in group.ranks and op.peer < group.size:
            peer = group.ranks[op.peer]
            if peer != op.rank and peer not in found:
                found.append(peer)
    if not found:
        raise TraceError(op.source, f"{op.collective} peer {op.peer} (a rank of the call's "
                                    f"process group) is no other rank of any group of rank "
                                    f"{op.rank}", op.node_id)
    return found


def global_peers(ops: list[list[CommOp]], groups: list[Group]) -> None:
    """A PyTorch trace stores a send's or recv's peer as a rank of the call's process group,
    which a gloo trace does not name: make every peer a global rank (in place). An op whose
    group is named (a capture file, --group) is translated by it; otherwise each group of the
    rank that has such a rank gives a candidate, and the candidates whose own ops hold the
    other half (a recv from this rank, of the same size, for a send) are kept. Where several
    remain, the world's reading is taken and the op is marked ambiguous."""
    world = groups[0]
    cands: dict[tuple[int, int], list[int]] = {}
    for op in (op for rank_ops in ops for op in rank_ops):
        if op.collective not in _P2P or op.peer is None or op.peer < 0:
            continue
        if op.group is not None:
            if op.peer >= op.group.size:
                raise TraceError(op.source, f"{op.collective} peer {op.peer} is not a rank of "
                                            f"its group {list(op.group.ranks)}", op.node_id)
            op.peer = op.group.ranks[op.peer]
            continue
        cands[(op.rank, op.index)] = _peer_candidates(op, groups)
    # (rank, kind, size, peer) of every half a rank holds, under each reading of its peer
    halves = {(r, ops[r][i].collective, ops[r][i].size, p) for (r, i), found in cands.items()
              for p in found}
    halves |= {(op.rank, op.collective, op.size, op.peer) for rank_ops in ops for op in rank_ops
               if op.collective in _P2P and op.peer is not None
               and (op.rank, op.index) not in cands}
    for (rank, index), found in cands.items():
        op = ops[rank][index]
        want = "recv" if op.collective == "send" else "send"
        fits = [p for p in found if (p, want, op.size, rank) in halves] or found
        local, op.peer = op.peer, fits[0]
        if len(fits) > 1:
            op.group, op.group_source = world, "ambiguous"
            op.notes.append(f"peer {local} of an unnamed process group: global ranks {fits} "
                            f"fit, read as {fits[0]}")


def ambiguous_calls(trace: Trace) -> set[int]:
    """The calls whose group the trace leaves open: those with an op of any rank whose
    group_source is 'ambiguous' (a send whose receive is matched on one side only counts).
    The one definition `replay`, `simulate --trace` and the trace's note count."""
    return {op.call for op in trace.all_ops() if op.group_source == "ambiguous"}


def uncertain_calls(trace: Trace) -> int:
    """How many calls' groups the trace leaves open (ambiguous_calls)."""
    return len(ambiguous_calls(trace))


def other_reading(trace: Trace) -> Trace | None:
    """The trace with every group it does not name read on the smallest group that fits
    (match_calls' prefer="small"), where the trace leaves some call's group open; else None.
    The two readings bound what the uncertain calls cost."""
    if not uncertain_calls(trace) or not trace.candidates:
        return None
    def unsettled(op: CommOp) -> CommOp:
        named = op.group_source == "named"
        return dataclasses.replace(op, notes=list(op.notes), call=-1, exchange=-1,
                                   group=op.group if named else None,
                                   group_source=op.group_source if named else "")

    ops = [[unsettled(op) for op in rank_ops] for rank_ops in trace.ops]
    match_calls(ops, trace.candidates, prefer="small")
    used = {op.group for rank_ops in ops for op in rank_ops if op.group is not None}
    return dataclasses.replace(trace, ops=ops, notes=list(trace.notes),
                               groups=[g for g in trace.candidates if g in used])
