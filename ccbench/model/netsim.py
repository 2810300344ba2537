"""Network simulator: run a collective's step-by-step schedule on a topology.

The program of each rank is an ordered list of steps; a step posts its sends and recvs
together and ends when every send has left and every recv has arrived, plus the
reduction time gamma x (bytes reduced). The next step starts then.

A message posted at t waits the largest alpha on its path (the per-message cost the
fit measured), then its bytes flow through the links of its route as a fluid; links
are shared by the flows crossing them, either max-min fair (progressive filling) or
equal share (each link splits its capacity evenly, a flow runs at its worst share).
It arrives after its last byte plus the per-hop latencies. Sends are eager: a message
flows as soon as its sender posts it, whether or not the receiver has reached the
matching recv (messages between an ordered pair match in order).

Without contention (every link carries at most one flow at a time) the replay of a
schedule equals its alpha-beta-gamma formula; tests/test_model_netsim.py checks it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ccbench import collectives
from ccbench.errors import UsageError
from ccbench.model.topology import Topology
from ccbench.model.torus_xor import torus_xor_round_time

__all__ = ["ArrayProgram", "SimStep", "Program", "ReplayResult", "program_from_schedule", "replay",
           "ring_program", "to_arrays", "no_schedule", "replay_rounds", "round_time", "replay_collective",
           "ENGINES",
           "schedule_program", "unit_bytes"]

SHARING = ("max-min", "equal")


@dataclass(slots=True)
class SimStep:
    """sends: (peer, bytes); recvs: (peer, bytes, bytes reduced on arrival)."""

    sends: list[tuple[int, float]] = field(default_factory=list)
    recvs: list[tuple[int, float, float]] = field(default_factory=list)


Program = list[list[SimStep]]


def unit_bytes(collective: str, size: float, p: int) -> float:
    """Bytes of one schedule unit for the nccl-tests size S (see algorithms.schedule): the
    collective's `ModelTerms.schedule_unit`, the whole buffer where it has no model terms."""
    terms = collectives.get(collective).model
    return terms.unit_bytes(size, p) if terms is not None else float(size)


def program_from_schedule(schedule: Any, size: float) -> Program:
    """Convert an algorithms.Schedule to the replay's steps at size S (bytes)."""
    p = schedule.num_ranks
    block = unit_bytes(schedule.collective, size, p) / schedule.blocks_per_unit
    prog: Program = []
    for rank_steps in schedule.steps:
        steps = []
        for st in rank_steps:
            sends = [(s.peer, s.span.length * block) for s in st.sends]
            recvs = [(r.peer, r.span.length * block, r.span.length * block if r.reduce else 0.0)
                     for r in st.recvs]
            if sends or recvs:
                steps.append(SimStep(sends, recvs))
        prog.append(steps)
    return prog


def no_schedule(collective: str) -> str:
    """Why no algorithms/ schedule can replay `collective` ('' when one can)."""
    try:
        from algorithms.registry import REGISTRY
    except ImportError as exc:          # pragma: no cover - algorithms/ ships with ccbench
        return f"schedule replay needs the algorithms package: {exc}"
    if any(c == collective for _, c in REGISTRY):
        return ""
    return f"{collective}: no algorithms/ schedule runs it, nothing to replay"


def schedule_program(collective: str, algorithm: str, p: int, size: float,
                     segments: int = 1) -> Program:
    """The algorithms/ schedule of (algorithm, collective) at p ranks as a replay program."""
    try:
        from algorithms.registry import REGISTRY, generate
    except ImportError as exc:          # pragma: no cover - algorithms/ ships with ccbench
        raise UsageError(f"schedule replay needs the algorithms package: {exc}") from None
    from ccbench.model.rounds import schedule_names

    name = next((n for n in schedule_names(collective, algorithm) if (n, collective) in REGISTRY),
                None)
    if name is None:
        valid = sorted(a for a, c in REGISTRY if c == collective)
        if not valid:
            raise UsageError(f"{no_schedule(collective)} (use --fidelity analytical)")
        raise UsageError(f"no schedule to replay for {collective} {algorithm!r} "
                         f"(valid: {', '.join(valid)})")
    try:
        sched = generate(name, collective, p, 0, segments)
    except ValueError as exc:
        raise UsageError(f"{collective} {algorithm} at {p} ranks: {exc}") from None
    return program_from_schedule(sched, size)


@dataclass
class ReplayResult:
    time: float                       # seconds until the last rank finishes
    rank_finish: np.ndarray
    messages: int
    events: int                       # event batches processed
    max_link_flows: int               # most flows seen on one link at once (1 = no contention)
    engine: str = "events"            # "rounds": rank_finish is not kept (empty)


@dataclass
class ArrayProgram:
    """A program as flat arrays. Steps of rank r are global ids first[r] .. first[r+1]-1.
    Message m goes src -> dst, leaves in step send_step[m], is matched (in order per
    ordered pair) with the recv of step recv_step[m]."""

    p: int
    first: np.ndarray
    step_reduce: np.ndarray
    msg_src: np.ndarray
    msg_dst: np.ndarray
    msg_bytes: np.ndarray
    msg_send_step: np.ndarray
    msg_recv_step: np.ndarray

    @property
    def num_steps(self) -> int:
        return int(self.first[-1])


def to_arrays(program: Program) -> ArrayProgram:
    """Match every send with its recv (k-th a->b send = k-th recv of b from a)."""
    p = len(program)
    first = np.zeros(p + 1, np.int64)
    red: list[float] = []
    s_src, s_dst, s_bytes, s_step = [], [], [], []
    r_src, r_dst, r_step = [], [], []
    g = 0
    for r, steps in enumerate(program):
        first[r] = g
        for st in steps:
            red.append(sum(x[2] for x in st.recvs))
            for peer, nbytes in st.sends:
                s_src.append(r)
                s_dst.append(peer)
                s_bytes.append(nbytes)
                s_step.append(g)
            for peer, _nbytes, _red in st.recvs:
                r_src.append(peer)
                r_dst.append(r)
                r_step.append(g)
            g += 1
    first[p] = g
    s_src_a, s_dst_a = np.asarray(s_src, np.int64), np.asarray(s_dst, np.int64)
    r_src_a, r_dst_a = np.asarray(r_src, np.int64), np.asarray(r_dst, np.int64)
    for peers in (s_dst_a, r_src_a):
        if peers.size and (peers.min() < 0 or peers.max() >= p):
            raise UsageError(f"schedule names a peer outside 0..{p - 1}")
    ks, kr = s_src_a * p + s_dst_a, r_src_a * p + r_dst_a
    os_, or_ = np.argsort(ks, kind="stable"), np.argsort(kr, kind="stable")
    if len(ks) != len(kr) or not np.array_equal(ks[os_], kr[or_]):
        raise UsageError("schedule deadlocks: some sends have no matching recv (or the reverse)")
    recv_step = np.empty(len(ks), np.int64)
    recv_step[os_] = np.asarray(r_step, np.int64)[or_]
    return ArrayProgram(p, first, np.asarray(red, float), s_src_a, s_dst_a,
                        np.asarray(s_bytes, float), np.asarray(s_step, np.int64), recv_step)


def ring_program(collective: str, p: int, size: float) -> ArrayProgram:
    """Ring allreduce / reduce-scatter / allgather built directly as arrays (fast at any p).

    The same steps and messages as algorithms.ring with segments=1 (a test checks the
    replay times agree), without building the per-block schedule objects.
    """
    if collective not in ("allreduce", "reduce-scatter", "allgather"):
        raise UsageError(f"no array ring program for {collective}")
    chunk = float(size) / p
    nsteps = 2 * (p - 1) if collective == "allreduce" else p - 1
    reduce_steps = p - 1 if collective in ("allreduce", "reduce-scatter") else 0
    r = np.repeat(np.arange(p, dtype=np.int64), nsteps)
    s = np.tile(np.arange(nsteps, dtype=np.int64), p)
    first = np.arange(p + 1, dtype=np.int64) * nsteps
    dst = (r + 1) % p
    red = np.where(s < reduce_steps, chunk, 0.0)
    return ArrayProgram(p, first, red, r, dst, np.full(r.size, chunk), r * nsteps + s,
                        dst * nsteps + s)


def _ranges(ptr: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Concatenated index ranges ptr[i] .. ptr[i+1]-1 for every i in ids."""
    lo, hi = ptr[ids], ptr[ids + 1]
    lens = hi - lo
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    offs = np.repeat(lo - np.concatenate(([0], np.cumsum(lens)[:-1])), lens)
    return offs + np.arange(total)


def _rates(links: np.ndarray, cap: np.ndarray, sharing: str) -> tuple[np.ndarray, int]:
    """Rates of flows whose links are the rows of `links` (-1 padded); cap has a last
    entry (inf) that the padding points at."""
    nl = len(cap)
    valid = links >= 0
    lv = np.where(valid, links, nl - 1)
    cnt = np.bincount(lv[valid], minlength=nl)
    most = int(cnt[:-1].max()) if nl > 1 else 0
    if sharing == "equal":
        share = cap / np.maximum(cnt, 1)
        share[-1] = np.inf
        return share[lv].min(axis=1), most
    nf = links.shape[0]
    rate = np.zeros(nf)
    frozen = np.zeros(nf, bool)
    rem = cap.astype(float).copy()
    while not frozen.all():
        live = ~frozen
        c = np.bincount(lv[live][valid[live]], minlength=nl)
        share = np.where(c > 0, rem / np.maximum(c, 1), np.inf)
        share[-1] = np.inf
        fshare = share[lv].min(axis=1)
        fshare[frozen] = np.inf
        m = fshare.min()
        newly = live & (fshare <= m * (1 + 1e-9))
        rate[newly] = m
        w = np.where(valid[newly], m, 0.0)
        rem = np.maximum(rem - np.bincount(lv[newly].ravel(), weights=w.ravel(), minlength=nl), 0)
        frozen |= newly
    return rate, most


@dataclass
class _Subflows:
    """Every message split into its route's subflows (a multipath route has several): per
    distinct ordered pair its largest alpha and its hop latency, per subflow its links (rows
    of `pad`, -1 padded) and bytes."""

    pad: np.ndarray            # links of each pair's subflows, -1 padded
    cap: np.ndarray            # link capacities, with a last inf entry the padding points at
    msg_alpha: np.ndarray
    msg_hop: np.ndarray
    msg_sub_ptr: np.ndarray    # subflows of message m: msg_sub_ptr[m] .. msg_sub_ptr[m+1]-1
    sf_pairsub: np.ndarray     # subflow -> row of pad
    sf_msg: np.ndarray         # subflow -> message
    sf_bytes: np.ndarray
    nsub: np.ndarray           # subflows per message


def _route_pairs(uniq: list[int], p: int, topo: Topology
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[list[int]], list[float]]:
    """Routes per distinct ordered pair (key src * p + dst): alpha, hop latency, and the
    subflows' links and fractions, pair i's subflows being sub_first[i] .. sub_first[i+1]-1."""
    pair_alpha = np.zeros(len(uniq))
    pair_hop = np.zeros(len(uniq))
    sub_first = np.zeros(len(uniq) + 1, np.int64)
    sub_links: list[list[int]] = []
    sub_frac: list[float] = []
    for i, key in enumerate(uniq):
        paths = topo.routes(key // p, key % p)
        pair_alpha[i] = max((max(topo.alpha[j] for j in links) for links, _ in paths if links),
                            default=0.0)
        pair_hop[i] = max((sum(topo.hop[j] for j in links) for links, _ in paths), default=0.0)
        for links, frac in paths:
            sub_links.append(links)
            sub_frac.append(frac)
        sub_first[i + 1] = len(sub_links)
    return pair_alpha, pair_hop, sub_first, sub_links, sub_frac


def _subflows(prog: ArrayProgram, topo: Topology) -> _Subflows:
    p, nmsg = prog.p, len(prog.msg_src)
    keys = prog.msg_src * p + prog.msg_dst
    uniq, inv = np.unique(keys, return_inverse=True)
    pair_alpha, pair_hop, sub_first, sub_links, sub_frac = _route_pairs(uniq.tolist(), p, topo)
    hmax = max((len(x) for x in sub_links), default=0) or 1
    pad = np.full((len(sub_links), hmax), -1, np.int64)
    for i, links in enumerate(sub_links):
        pad[i, :len(links)] = links
    cap = np.append(np.asarray(topo.cap, float), np.inf)
    nsub = (sub_first[1:] - sub_first[:-1])[inv]
    msg_sub_ptr = np.concatenate(([0], np.cumsum(nsub)))
    sf_pairsub = _ranges(sub_first, inv) if nmsg else np.zeros(0, np.int64)
    sf_msg = np.repeat(np.arange(nmsg), nsub)
    sf_bytes = prog.msg_bytes[sf_msg] * np.asarray(sub_frac, float)[sf_pairsub] \
        if nmsg else np.zeros(0)
    return _Subflows(pad, cap, pair_alpha[inv], pair_hop[inv], msg_sub_ptr, sf_pairsub, sf_msg,
                     sf_bytes, nsub)


_START, _ACT, _ARR = 0, 1, 2      # events: steps start, messages leave alpha, messages arrive


class _EventReplay:
    """The event loop of `replay`: a heap of timed batches (steps starting, messages whose
    alpha has passed, messages arriving) and the live flows between them."""

    def __init__(self, prog: ArrayProgram, sub: _Subflows, gamma: float, sharing: str) -> None:
        self.prog, self.sub, self.gamma, self.sharing = prog, sub, gamma, sharing
        p, nsteps = prog.p, prog.num_steps
        self.msg_left = sub.nsub.copy()
        self.send_order = np.argsort(prog.msg_send_step, kind="stable")
        self.send_ptr = np.searchsorted(prog.msg_send_step[self.send_order],
                                        np.arange(nsteps + 1))
        parts = (np.bincount(prog.msg_send_step, minlength=nsteps)
                 + np.bincount(prog.msg_recv_step, minlength=nsteps)) if nsteps \
            else np.zeros(0, int)
        self.remaining = parts.astype(np.int64)
        self.started = np.zeros(nsteps, bool)
        self.step_rank = np.repeat(np.arange(p), np.diff(prog.first))
        self.last_of_rank = prog.first[1:] - 1
        self.rank_finish = np.zeros(p)
        self.rank_done = np.diff(prog.first) == 0
        self.heap: list[tuple[float, int, int, np.ndarray]] = []
        self.seq = 0
        self.flows_sf = np.zeros(0, np.int64)
        self.flows_rem = np.zeros(0)
        self.rates = np.zeros(0)
        self.dirty = False
        self.most = 0
        self.batches = 0
        self.now = 0.0

    def push_grouped(self, times: np.ndarray, kind: int, ids: np.ndarray) -> None:
        if ids.size == 0:
            return
        t0 = times[0]
        if np.all(times == t0):
            heapq.heappush(self.heap, (float(t0), self.seq, kind, ids))
            self.seq += 1
            return
        ut, where = np.unique(times, return_inverse=True)
        for j, t in enumerate(ut.tolist()):
            heapq.heappush(self.heap, (t, self.seq, kind, ids[where == j] if len(ut) > 1 else ids))
            self.seq += 1

    def complete(self, steps: np.ndarray, t: float) -> None:
        done_t = t + self.gamma * self.prog.step_reduce[steps]
        is_last = steps == self.last_of_rank[self.step_rank[steps]]
        if np.any(is_last):
            self.rank_finish[self.step_rank[steps[is_last]]] = done_t[is_last]
            self.rank_done[self.step_rank[steps[is_last]]] = True
        self.push_grouped(done_t[~is_last], _START, steps[~is_last] + 1)

    def part_done(self, steps: np.ndarray, t: float) -> None:
        u, c = np.unique(steps, return_counts=True)
        self.remaining[u] -= c
        ready = u[(self.remaining[u] == 0) & self.started[u]]
        if ready.size:
            self.complete(ready, t)

    def message_done(self, msgs: np.ndarray, t: float) -> None:
        self.part_done(self.prog.msg_send_step[msgs], t)
        arr_t = t + self.sub.msg_hop[msgs]
        now_mask = arr_t <= t
        if np.any(now_mask):
            self.part_done(self.prog.msg_recv_step[msgs[now_mask]], t)
        self.push_grouped(arr_t[~now_mask], _ARR, msgs[~now_mask])

    def subflows_done(self, sfs: np.ndarray) -> None:
        """Count finished subflows off their messages; a message with none left is done."""
        np.subtract.at(self.msg_left, self.sub.sf_msg[sfs], 1)
        um = np.unique(self.sub.sf_msg[sfs])
        fin = um[self.msg_left[um] == 0]
        if fin.size:
            self.message_done(fin, self.now)

    def start_steps(self, ids: np.ndarray) -> None:
        self.started[ids] = True
        msgs = self.send_order[_ranges(self.send_ptr, ids)]
        ready = ids[self.remaining[ids] == 0]
        if ready.size:
            self.complete(ready, self.now)
        self.push_grouped(self.now + self.sub.msg_alpha[msgs], _ACT, msgs)

    def activate(self, msgs: np.ndarray) -> None:
        """Messages past their alpha: their subflows join the fluid (empty ones finish now)."""
        sub = self.sub
        sfs = _ranges(sub.msg_sub_ptr, msgs)
        instant = (sub.sf_bytes[sfs] <= 0) | (sub.pad[sub.sf_pairsub[sfs], 0] < 0)
        live = sfs[~instant]
        if live.size:
            self.flows_sf = np.concatenate((self.flows_sf, live))
            self.flows_rem = np.concatenate((self.flows_rem, sub.sf_bytes[live]))
            self.dirty = True
        if np.any(instant):
            self.subflows_done(sfs[instant])

    def update_rates(self) -> None:
        if self.flows_sf.size:
            self.rates, m = _rates(self.sub.pad[self.sub.sf_pairsub[self.flows_sf]], self.sub.cap,
                                   self.sharing)
            self.most = max(self.most, m)
        else:
            self.rates = np.zeros(0)
        self.dirty = False

    def handle_events(self, t_ev: float) -> None:
        if self.flows_sf.size:
            self.flows_rem = self.flows_rem - self.rates * (t_ev - self.now)
        self.now = t_ev
        while self.heap and self.heap[0][0] <= self.now:
            _, _, kind, ids = heapq.heappop(self.heap)
            if kind == _START:
                self.start_steps(ids)
            elif kind == _ACT:
                self.activate(ids)
            else:
                self.part_done(self.prog.msg_recv_step[ids], self.now)

    def finish_flows(self, dts: np.ndarray, dtmin: float) -> None:
        self.now += dtmin
        done = dts <= dtmin * (1 + 1e-9) + 1e-18
        self.flows_rem = self.flows_rem - self.rates * dtmin
        fin_sf = self.flows_sf[done]
        self.flows_sf, self.flows_rem = self.flows_sf[~done], self.flows_rem[~done]
        self.dirty = True
        self.subflows_done(fin_sf)

    def run(self) -> None:
        first = self.prog.first
        if self.prog.num_steps:
            self.push_grouped(np.zeros(int(np.sum(np.diff(first) > 0))), _START,
                              first[:-1][np.diff(first) > 0])
        while True:
            if self.dirty:
                self.update_rates()
            dts, dtmin, t_fin = np.zeros(0), 0.0, np.inf
            if self.flows_sf.size:
                dts = self.flows_rem / self.rates
                dtmin = float(dts.min())
                t_fin = self.now + dtmin
            t_ev = self.heap[0][0] if self.heap else np.inf
            if t_ev == np.inf and t_fin == np.inf:
                return
            self.batches += 1
            if t_ev <= t_fin:
                self.handle_events(t_ev)
            else:
                self.finish_flows(dts, dtmin)


def replay(program: Program | ArrayProgram, topo: Topology, gamma: float = 0.0,
           sharing: str = "max-min") -> ReplayResult:
    if sharing not in SHARING:
        raise UsageError(f"unknown sharing {sharing!r} (valid: {', '.join(SHARING)})")
    prog = program if isinstance(program, ArrayProgram) else to_arrays(program)
    p = prog.p
    if p != topo.ranks:
        raise UsageError(f"schedule has {p} ranks, topology {topo.spec!r} has {topo.ranks}")
    loop = _EventReplay(prog, _subflows(prog, topo), gamma, sharing)
    loop.run()
    if not loop.rank_done.all():
        stuck = np.flatnonzero(~loop.rank_done)[:8].tolist()
        raise UsageError(f"schedule deadlocked: ranks {stuck} wait for messages that never come")
    return ReplayResult(float(loop.rank_finish.max()) if p else 0.0, loop.rank_finish,
                        len(prog.msg_src), loop.batches, loop.most)


# -- the rounds engine: one fluid solve per round, arrays of O(p) -------------------------------

def _column_min(table: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """min over j of table[cols[j]] (cols is links x flows: a path per column)."""
    out = table[cols[0]]
    for row in cols[1:]:
        np.minimum(out, table[row], out=out)
    return out


def _fair_rates(cols: np.ndarray, cap: np.ndarray, sharing: str) -> tuple[np.ndarray, int]:
    """Rates of flows whose paths are the columns of `cols` (hops x flows; padding points
    at the last entry of `cap`, which is inf), and the most flows on one link."""
    nl = len(cap)
    cnt = np.bincount(cols.ravel(), minlength=nl)
    most = int(cnt[:-1].max()) if nl > 1 else 0
    with np.errstate(divide="ignore", invalid="ignore"):
        share = cap / cnt
        share[-1] = np.inf
        fshare = _column_min(share, cols)
        if sharing == "equal":
            return fshare, most
        m = fshare.min()
        newly = fshare <= m * (1 + 1e-9)
        if newly.all():                   # one bottleneck share for every flow
            return fshare, most
        rate = np.empty(cols.shape[1])
        todo = np.arange(cols.shape[1])
        rem = cap.astype(float)
        sub = cols
        while True:
            # progressive filling: the links with the smallest fair share saturate first
            rate[todo[newly]] = m
            rem = np.maximum(rem - np.bincount(sub[:, newly].ravel(), minlength=nl) * m, 0.0)
            todo, sub = todo[~newly], sub[:, ~newly]
            if not todo.size:
                return rate, most
            share = rem / np.bincount(sub.ravel(), minlength=nl)
            share[-1] = np.inf
            fshare = _column_min(share, sub)
            m = fshare.min()
            newly = fshare <= m * (1 + 1e-9)


def _fluid(cols: np.ndarray, nbytes: np.ndarray, start: np.ndarray, cap: np.ndarray,
           sharing: str) -> tuple[np.ndarray, int]:
    """Finish times of flows that start at `start` and share links as a fluid; rates are
    solved again whenever a flow starts or ends."""
    if start.min() == start.max():
        rates, most = _fair_rates(cols, cap, sharing)
        dts = nbytes / rates
        if dts.max() <= dts.min() * (1 + 1e-9):      # every flow ends together
            return start + dts, most
    finish = start.copy()
    starts = np.unique(start)
    pending = 0
    active = np.zeros(0, np.int64)
    left = np.zeros(0)
    now, most = 0.0, 0
    while pending < len(starts) or active.size:
        t_start = starts[pending] if pending < len(starts) else np.inf
        if active.size:
            rates, m = _fair_rates(cols if active.size == cols.shape[1] else cols[:, active],
                                   cap, sharing)
            most = max(most, m)
            dts = left / rates
            dt = float(dts.min())
        else:
            dt = np.inf
        if t_start <= now + dt:
            if active.size:
                left = left - rates * (t_start - now)
            now = float(t_start)
            new = np.flatnonzero(start == t_start)
            active = np.concatenate((active, new))
            left = np.concatenate((left, nbytes[new]))
            pending += 1
            continue
        now += dt
        done = dts <= dt * (1 + 1e-9) + 1e-18
        finish[active[done]] = now
        left = (left - rates * dt)[~done]
        active = active[~done]
    return finish, most


@dataclass
class _LinkArrays:
    cap: np.ndarray        # bytes/s per link, then inf for the padding
    alpha: np.ndarray      # then 0
    hop: np.ndarray        # then 0
    one_alpha: float | None = None     # the alpha of every link, when they share one
    no_hops: bool = True
    one_cap: float | None = None       # the capacity of every link, when they share one

    @classmethod
    def of(cls, topo: Topology) -> _LinkArrays:
        alpha = np.asarray(topo.alpha, float)
        hop = np.asarray(topo.hop, float)
        cap = np.asarray(topo.cap, float)
        one = float(alpha[0]) if alpha.size and np.all(alpha == alpha[0]) else None
        one_cap = float(cap[0]) if cap.size and np.all(cap == cap[0]) else None
        return cls(np.append(cap, np.inf), np.append(alpha, 0.0), np.append(hop, 0.0), one,
                   not np.any(hop), one_cap)


def round_time(rnd: Any, topo: Topology, gamma: float = 0.0, sharing: str = "max-min",
               arrays: _LinkArrays | None = None,
               cache: dict[Any, tuple[float, int]] | None = None) -> tuple[float, int]:
    """Seconds from the start of a round (every rank starts it together) until its last
    rank has sent, received and reduced, and the most flows on one link.

    A message waits the largest alpha on its path, then flows; a send is done when its
    last byte left, a recv when it arrived (plus per-hop latencies); a rank then reduces
    gamma x the bytes it received to reduce."""
    p = topo.ranks
    nmsg = rnd.src.size
    if nmsg == 0:
        return 0.0, 0
    if getattr(rnd, "xor_symmetric", False) and topo.xor_orbits() is not None:
        return _xor_round_time(rnd, topo, gamma, sharing, arrays or _LinkArrays.of(topo), cache)
    if getattr(rnd, "xor_symmetric", False) and topo.kind == "torus":
        # every line of a dimension carries the same 1-D pattern: solved per dimension
        # when the fluid ends in one step (else None, and the flows are solved below)
        same = arrays if arrays is not None else _LinkArrays.of(topo)
        if same.one_alpha is not None and same.one_cap is not None and same.no_hops:
            quick = torus_xor_round_time(topo, int(rnd.src[0] ^ rnd.dst[0]),
                                         float(rnd.nbytes[0]), float(rnd.reduce[0]), gamma,
                                         sharing, same.one_cap, same.one_alpha)
            if quick is not None:
                return quick
    paths = topo.paths(rnd.src, rnd.dst)
    la = arrays
    if la is None or len(la.cap) != len(topo.cap) + 1:   # fully-connected adds links on use
        la = _LinkArrays.of(topo)
    nl = len(la.cap) - 1
    nsub = paths.msg.size
    cols = np.ascontiguousarray(paths.links.T)
    if not cols.shape[0]:
        cols = np.full((1, nsub), -1, np.int64)
    pad = cols < 0
    crosses = ~pad.all(axis=0)
    cols[pad] = nl
    if la.one_alpha is not None:
        sub_alpha = np.where(crosses, la.one_alpha, 0.0)
    else:
        sub_alpha = _column_max(la.alpha, cols)
    hop = 0.0 if la.no_hops else la.hop[cols].sum(axis=0)
    if paths.single:
        msg_alpha = sub_alpha
    else:
        msg_alpha = np.zeros(nmsg)
        np.maximum.at(msg_alpha, paths.msg, sub_alpha)
    sub_bytes = rnd.nbytes[paths.msg] * paths.frac
    start = msg_alpha[paths.msg] if not paths.single else msg_alpha
    flowing = crosses & (sub_bytes > 0)
    most = 0
    if flowing.all():
        finish, most = _fluid(cols, sub_bytes, start, la.cap, sharing)
    else:
        finish = start.copy()
        idx = np.flatnonzero(flowing)
        if idx.size:
            finish[idx], most = _fluid(cols[:, idx], sub_bytes[idx], start[idx], la.cap,
                                       sharing)
    arrive = finish + hop
    if paths.single:
        msg_sent, msg_arrived = finish, arrive
    else:
        msg_sent, msg_arrived = np.zeros(nmsg), np.zeros(nmsg)
        np.maximum.at(msg_sent, paths.msg, finish)
        np.maximum.at(msg_arrived, paths.msg, arrive)
    # a rank ends when its last send left and its last recv arrived, then it reduces
    if gamma and rnd.reduce.any():
        red = gamma * np.bincount(rnd.dst, weights=rnd.reduce, minlength=p)
        return float(max((msg_sent + red[rnd.src]).max(),
                         (msg_arrived + red[rnd.dst]).max())), most
    return float(max(msg_sent.max(), msg_arrived.max())), most


def _xor_round_time(rnd: Any, topo: Topology, gamma: float, sharing: str,
                    la: _LinkArrays, cache: dict[Any, tuple[float, int]] | None = None
                    ) -> tuple[float, int]:
    """round_time of a round that the relabellings r -> r XOR t map onto itself, on a
    topology they are automorphisms of: every rank's flows are alike, so the fluid model
    runs on rank 0's subflows with each link orbit as one link carrying p x (uses) /
    (orbit size) flows. Equals round_time on the p flows (tests check it)."""
    orbit, size = topo.xor_orbits()  # type: ignore[misc]
    p = topo.ranks
    rep = np.flatnonzero(rnd.src == 0)
    paths = topo.paths(rnd.src[rep], rnd.dst[rep])
    # rounds alike up to the relabelling (same orbits crossed, same bytes) end alike
    key = (tuple(tuple(sorted(orbit[row[row >= 0]].tolist())) for row in paths.links),
           paths.msg.tobytes(), paths.frac.tobytes(), rnd.nbytes[rep].tobytes(),
           float(rnd.reduce[rep].sum()), gamma, sharing)
    if cache is not None and key in cache:
        return cache[key]
    out = _xor_solve(rnd, rep, paths, orbit, size, p, gamma, sharing, la)
    if cache is not None:
        cache[key] = out
    return out


def _xor_solve(rnd: Any, rep: np.ndarray, paths: Any, orbit: np.ndarray, size: np.ndarray,
               p: int, gamma: float, sharing: str, la: _LinkArrays) -> tuple[float, int]:
    nsub = paths.msg.size
    norb = size.size
    load = np.zeros((nsub, norb + 1))           # flows of each class on one link of an orbit
    alpha = np.zeros(nsub)
    hop = np.zeros(nsub)
    for i in range(nsub):
        links = paths.links[i][paths.links[i] >= 0]
        if links.size:
            np.add.at(load[i], orbit[links], float(p) / size[orbit[links]])
            alpha[i] = la.alpha[links].max()
            hop[i] = la.hop[links].sum()
    cap = np.full(norb + 1, np.inf)
    cap[orbit] = la.cap[:-1]
    msg_alpha = np.zeros(rep.size)
    np.maximum.at(msg_alpha, paths.msg, alpha)
    nbytes = rnd.nbytes[rep][paths.msg] * paths.frac
    start = msg_alpha[paths.msg]
    flowing = (load[:, :-1].sum(axis=1) > 0) & (nbytes > 0)
    finish = start.copy()
    most = 0
    if flowing.any():
        finish[flowing], most = _fluid_classes(load[flowing], nbytes[flowing], start[flowing],
                                               cap, sharing)
    sent, arrived = np.zeros(rep.size), np.zeros(rep.size)
    np.maximum.at(sent, paths.msg, finish)
    np.maximum.at(arrived, paths.msg, finish + hop)
    # every rank receives what rank 0 sends (the round is a union of XOR pairings)
    red = gamma * float(rnd.reduce[rep].sum())
    return float(max(sent.max(), arrived.max())) + red, most


def _fluid_classes(load: np.ndarray, nbytes: np.ndarray, start: np.ndarray, cap: np.ndarray,
                   sharing: str) -> tuple[np.ndarray, int]:
    """_fluid for flow classes: load[f, l] flows of class f cross each link of class l
    (the last column is unused padding, cap inf); every flow of a class runs alike."""
    finish = start.copy()
    active = np.zeros(len(nbytes), bool)
    left = nbytes.astype(float).copy()
    now, most = 0.0, 0
    with np.errstate(divide="ignore", invalid="ignore"):
        while True:
            waiting = ~active & (finish == start) & (left > 0)
            t_start = start[waiting].min() if waiting.any() else np.inf
            if active.any():
                rate = _class_rates(load, active, cap, sharing)
                most = max(most, int(round(load[active].sum(axis=0)[:-1].max())))
                dts = np.where(active, left / rate, np.inf)
                dt = float(dts.min())
            else:
                dt = np.inf
            if t_start == np.inf and dt == np.inf:
                return finish, most
            if t_start <= now + dt:
                if active.any():
                    left = np.where(active, left - rate * (t_start - now), left)
                now = float(t_start)
                active |= waiting & (start == t_start)
                continue
            now += dt
            done = active & (dts <= dt * (1 + 1e-9) + 1e-18)
            left = np.where(active, left - rate * dt, left)
            finish[done] = now
            left[done] = 0.0
            active &= ~done


def _class_rates(load: np.ndarray, active: np.ndarray, cap: np.ndarray,
                 sharing: str) -> np.ndarray:
    """Max-min (progressive filling) or equal-share rates of the active flow classes."""
    uses = load > 0
    count = load[active].sum(axis=0)
    rate = np.zeros(len(load))
    if sharing == "equal":
        share = np.where(count > 0, cap / count, np.inf)
        for f in np.flatnonzero(active):
            rate[f] = share[uses[f]].min()
        return rate
    rem = cap.astype(float).copy()
    todo = active.copy()
    while todo.any():
        count = load[todo].sum(axis=0)
        share = np.where(count > 0, rem / count, np.inf)
        fshare = np.array([share[uses[f]].min() if todo[f] else np.inf
                           for f in range(len(load))])
        m = fshare.min()
        newly = todo & (fshare <= m * (1 + 1e-9))
        rate[newly] = m
        rem = np.maximum(rem - load[newly].sum(axis=0) * m, 0.0)
        todo &= ~newly
    return rate


def _column_max(table: np.ndarray, cols: np.ndarray) -> np.ndarray:
    out = table[cols[0]]
    for row in cols[1:]:
        np.maximum(out, table[row], out=out)
    return out


ProgressFn = Callable[[int, int], None]


def replay_rounds(program: Any, topo: Topology, gamma: float = 0.0, sharing: str = "max-min",
                  progress: ProgressFn | None = None) -> ReplayResult:
    """Replay a RoundProgram (ccbench.model.rounds) round by round.

    Rounds are bulk-synchronous: round k+1 starts on every rank when round k has ended on
    all of them. The schedules here run their ranks in lock step when no link is shared
    (so this equals the event replay and the alpha-beta-gamma formula); under contention
    a rank that ends a round early waits for the slowest one, where the event replay lets
    it start its next step, so this can be slower (tests/test_model_rounds.py measures
    the gap on small cases). Memory is O(p x path length) per round.
    """
    if sharing not in SHARING:
        raise UsageError(f"unknown sharing {sharing!r} (valid: {', '.join(SHARING)})")
    p = program.p
    if p != topo.ranks:
        raise UsageError(f"schedule has {p} ranks, topology {topo.spec!r} has {topo.ranks}")
    arrays = _LinkArrays.of(topo)
    cache: dict[Any, tuple[float, int]] = {}
    now, most, done, messages, solved = 0.0, 0, 0, 0, 0
    for rnd in program.rounds():
        dt, m = round_time(rnd, topo, gamma, sharing, arrays, cache)
        solved += 1
        now += rnd.repeat * dt
        most = max(most, m)
        done += rnd.repeat
        messages += rnd.repeat * rnd.src.size
        if progress is not None:
            progress(done, program.num_rounds)
    return ReplayResult(now, np.zeros(0), messages, solved, most, "rounds")


ENGINES = ("auto", "rounds", "events")


def replay_collective(collective: str, algorithm: str, p: int, size: float, topo: Topology,
                      gamma: float = 0.0, sharing: str = "max-min", segments: int = 1,
                      engine: str = "auto", progress: ProgressFn | None = None) -> ReplayResult:
    """Replay (algorithm, collective) of S bytes at p ranks on `topo`.

    auto: the rounds engine (O(p) memory, any p) when the schedule has a round generator
    and one segment, else the event engine on the algorithms/ schedule (pipelined
    segments, double binary tree), whose memory grows with the messages of the whole
    schedule."""
    from ccbench.model.rounds import round_program

    if engine not in ENGINES:
        raise UsageError(f"unknown replay engine {engine!r} (valid: {', '.join(ENGINES)})")
    program = round_program(collective, algorithm, p, size) \
        if segments == 1 and engine != "events" else None
    if program is not None:
        return replay_rounds(program, topo, gamma, sharing, progress)
    if engine == "rounds":
        raise UsageError(f"no round program for {collective} {algorithm} with "
                         f"{segments} segment(s) (use the events engine)")
    if segments == 1 and algorithm == "ring" and collective in ("allreduce", "reduce-scatter",
                                                                 "allgather"):
        return replay(ring_program(collective, p, size), topo, gamma, sharing)
    return replay(schedule_program(collective, algorithm, p, size, segments), topo, gamma,
                  sharing)


def program_stats(program: Sequence[Sequence[SimStep]]) -> dict[str, float]:
    return {"steps": max((len(s) for s in program), default=0),
            "messages": sum(len(st.sends) for s in program for st in s),
            "bytes": sum(b for s in program for st in s for _, b in st.sends)}
