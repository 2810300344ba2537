"""Schedule replay: run a collective's step-by-step schedule on a topology.

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
schedule equals its alpha-beta-gamma formula; tests/test_model_replay.py checks it.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ccbench.errors import UsageError
from ccbench.model.topology import Topology

__all__ = ["SimStep", "Program", "ReplayResult", "program_from_schedule", "replay",
           "schedule_program", "unit_bytes"]

SHARING = ("max-min", "equal")


@dataclass(slots=True)
class SimStep:
    """sends: (peer, bytes); recvs: (peer, bytes, bytes reduced on arrival)."""

    sends: list[tuple[int, float]] = field(default_factory=list)
    recvs: list[tuple[int, float, float]] = field(default_factory=list)


Program = list[list[SimStep]]


def unit_bytes(collective: str, size: float, p: int) -> float:
    """Bytes of one schedule unit for the nccl-tests size S (see algorithms.schedule)."""
    if collective in ("allreduce", "broadcast", "reduce"):
        return float(size)
    return float(size) / p


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


_ALGO_NAMES = {   # formula key -> algorithms/ registry name
    "ring": "ring", "tree": "tree", "double-binary-tree": "dbtree",
    "recursive-doubling": "hypercube", "recursive-halving": "hypercube",
    "rabenseifner": "rabenseifner", "bruck": "bruck", "pairwise": "pairwise",
}


def schedule_program(collective: str, algorithm: str, p: int, size: float,
                     segments: int = 1) -> Program:
    """The algorithms/ schedule of (algorithm, collective) at p ranks as a replay program."""
    try:
        from algorithms.registry import REGISTRY, generate
    except ImportError as exc:          # pragma: no cover - algorithms/ ships with ccbench
        raise UsageError(f"schedule replay needs the algorithms package: {exc}") from None
    name = algorithm
    if (name, collective) not in REGISTRY:
        name = _ALGO_NAMES.get(algorithm, algorithm)
    if collective == "allgather" and name == "hypercube" and algorithm == "recursive-doubling":
        name = "hypercube"
    if (name, collective) not in REGISTRY:
        valid = sorted(a for a, c in REGISTRY if c == collective)
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
    events: int
    max_link_flows: int               # most flows seen on one link at once (1 = no contention)


def _rates(flow_links: list[np.ndarray], cap: np.ndarray, sharing: str) -> np.ndarray:
    nf = len(flow_links)
    lens = np.fromiter((len(x) for x in flow_links), int, nf)
    rates = np.full(nf, np.inf)
    has = lens > 0
    if not np.any(has):
        return rates
    idx = np.flatnonzero(has)
    links = np.concatenate([flow_links[i] for i in idx])
    owner = np.repeat(np.arange(len(idx)), lens[idx])
    starts = np.concatenate(([0], np.cumsum(lens[idx])[:-1]))
    nl = len(cap)
    if sharing == "equal":
        cnt = np.bincount(links, minlength=nl)
        share = cap / np.maximum(cnt, 1)
        rates[idx] = np.minimum.reduceat(share[links], starts)
        return rates
    # max-min fair: progressive filling
    rem = cap.astype(float).copy()
    frozen = np.zeros(len(idx), bool)
    out = np.zeros(len(idx))
    while not frozen.all():
        live_e = ~frozen[owner]
        cnt = np.bincount(links[live_e], minlength=nl)
        share = np.where(cnt > 0, rem / np.maximum(cnt, 1), np.inf)
        fshare = np.minimum.reduceat(share[links], starts)
        fshare[frozen] = np.inf
        m = fshare.min()
        newly = (~frozen) & (fshare <= m * (1 + 1e-9))
        out[newly] = m
        used = np.bincount(links, weights=np.where(newly[owner], m, 0.0), minlength=nl)
        rem = np.maximum(rem - used, 0.0)
        frozen |= newly
    rates[idx] = out
    return rates


def replay(program: Program, topo: Topology, gamma: float = 0.0,
           sharing: str = "max-min") -> ReplayResult:
    if sharing not in SHARING:
        raise UsageError(f"unknown sharing {sharing!r} (valid: {', '.join(SHARING)})")
    p = len(program)
    if p != topo.ranks:
        raise UsageError(f"schedule has {p} ranks, topology {topo.spec!r} has {topo.ranks}")
    cap = np.asarray(topo.cap, float)
    link_alpha = topo.alpha
    link_hop = topo.hop

    # per-message route data, cached per (src, dst)
    route_cache: dict[tuple[int, int], tuple[float, float, list[tuple[np.ndarray, float]]]] = {}

    def route(src: int, dst: int):
        r = route_cache.get((src, dst))
        if r is None:
            paths = topo.routes(src, dst)
            alpha = max((max(link_alpha[i] for i in links) for links, _ in paths if links),
                        default=0.0)
            hop = max((sum(link_hop[i] for i in links) for links, _ in paths), default=0.0)
            r = (alpha, hop, [(np.asarray(links, int), frac) for links, frac in paths])
            route_cache[(src, dst)] = r
            if len(cap) != len(topo.cap):            # links made on first use
                nonlocal_cap[0] = np.asarray(topo.cap, float)
        return r

    nonlocal_cap = [cap]

    step_idx = [0] * p
    pending = [0] * p                   # outstanding sends + recvs of the current step
    reduce_bytes = [0.0] * p
    finish = np.zeros(p)
    arrived: dict[tuple[int, int], deque] = defaultdict(deque)    # (src,dst) -> arrival times
    waiting: dict[tuple[int, int], deque] = defaultdict(deque)    # (src,dst) -> waiting ranks
    heap: list[tuple[float, int, int, Any]] = []
    seq = 0
    # flows
    f_rem: list[float] = []
    f_links: list[np.ndarray] = []
    f_msg: list[int] = []
    msg_src: list[int] = []
    msg_dst: list[int] = []
    msg_parts: list[int] = []
    msg_hop: list[float] = []
    state = {"dirty": True, "events": 0, "max_flows": 0}
    EV_START, EV_ACTIVATE, EV_ARRIVE = 0, 1, 2

    def push(t: float, kind: int, payload: Any) -> None:
        nonlocal seq
        heapq.heappush(heap, (t, seq, kind, payload))
        seq += 1

    def part_done(r: int, t: float) -> None:
        pending[r] -= 1
        if pending[r] == 0:
            done_step(r, t)

    def done_step(r: int, t: float) -> None:
        t_next = t + gamma * reduce_bytes[r]
        step_idx[r] += 1
        push(t_next, EV_START, r)

    def start_step(r: int, t: float) -> None:
        steps = program[r]
        i = step_idx[r]
        if i >= len(steps):
            finish[r] = t
            return
        st = steps[i]
        pending[r] = len(st.sends) + len(st.recvs)
        reduce_bytes[r] = sum(x[2] for x in st.recvs)
        if pending[r] == 0:
            done_step(r, t)
            return
        for peer, nbytes in st.sends:
            alpha, hop, paths = route(r, peer)
            mid = len(msg_src)
            msg_src.append(r)
            msg_dst.append(peer)
            msg_hop.append(hop)
            msg_parts.append(len(paths))
            push(t + alpha, EV_ACTIVATE, (mid, nbytes, paths))
        for peer, _nbytes, _red in st.recvs:
            q = arrived[(peer, r)]
            if q:
                q.popleft()
                pending[r] -= 1
            else:
                waiting[(peer, r)].append(r)
        if pending[r] == 0:
            done_step(r, t)

    def message_done(mid: int, t: float) -> None:
        src, dst = msg_src[mid], msg_dst[mid]
        part_done(src, t)                    # the send has left
        push(t + msg_hop[mid], EV_ARRIVE, mid)

    def arrive(mid: int, t: float) -> None:
        key = (msg_src[mid], msg_dst[mid])
        w = waiting[key]
        if w:
            part_done(w.popleft(), t)
        else:
            arrived[key].append(t)

    for r in range(p):
        push(0.0, EV_START, r)
    now = 0.0
    rates = np.zeros(0)
    rem = np.zeros(0)
    while heap or f_rem:
        if state["dirty"]:
            rem = np.asarray(f_rem, float)
            rates = _rates(f_links, nonlocal_cap[0], sharing) if f_rem else np.zeros(0)
            state["dirty"] = False
        if len(rem):
            with np.errstate(divide="ignore"):
                dt = np.where(rates > 0, rem / rates, np.inf)
            t_fin = now + float(dt.min())
        else:
            t_fin = np.inf
        t_ev = heap[0][0] if heap else np.inf
        if t_ev <= t_fin:
            if len(rem):
                rem = rem - rates * (t_ev - now)
                f_rem[:] = rem.tolist()
            now = t_ev
            while heap and heap[0][0] <= now:
                _, _, kind, payload = heapq.heappop(heap)
                state["events"] += 1
                if kind == EV_START:
                    start_step(payload, now)
                elif kind == EV_ACTIVATE:
                    mid, nbytes, paths = payload
                    for links, frac in paths:
                        if nbytes * frac <= 0 or len(links) == 0:
                            msg_parts[mid] -= 1
                            continue
                        f_rem.append(nbytes * frac)
                        f_links.append(links)
                        f_msg.append(mid)
                        state["dirty"] = True
                    if msg_parts[mid] == 0:
                        message_done(mid, now)
                else:
                    arrive(payload, now)
        else:
            rem = rem - rates * (t_fin - now)
            now = t_fin
            tol = np.maximum(rates * 1e-12 * max(now, 1e-12), 1e-9)
            done = rem <= tol
            keep = ~done
            finished = [f_msg[i] for i in np.flatnonzero(done)]
            if len(f_links) > state["max_flows"]:
                pass
            f_rem[:] = rem[keep].tolist()
            f_links[:] = [f_links[i] for i in np.flatnonzero(keep)]
            f_msg[:] = [f_msg[i] for i in np.flatnonzero(keep)]
            state["dirty"] = True
            for mid in finished:
                msg_parts[mid] -= 1
                if msg_parts[mid] == 0:
                    message_done(mid, now)
        if state["dirty"] and f_links:
            counts = np.bincount(np.concatenate(f_links), minlength=1) if f_links else [0]
            state["max_flows"] = max(state["max_flows"], int(np.max(counts)))
    unfinished = [r for r in range(p) if step_idx[r] < len(program[r])]
    if unfinished:
        raise UsageError(f"schedule deadlocked: ranks {unfinished[:8]} wait for messages "
                         f"that are never sent")
    return ReplayResult(float(finish.max()) if p else 0.0, finish, len(msg_src),
                        state["events"], state["max_flows"])


def program_stats(program: Sequence[Sequence[SimStep]]) -> dict[str, float]:
    return {"steps": max((len(s) for s in program), default=0),
            "messages": sum(len(st.sends) for s in program for st in s),
            "bytes": sum(b for s in program for st in s for _, b in st.sends)}
