"""What every rank runs for `ccbench replay`: a trace's communication on a backend.

Per backend, two passes over this rank's ops, in trace order:
1. per op: each call of ccbench's collectives measured with the benchmark's own method
   (`ccbench.bench.harness.measure_size`: warm-up, timed iterations, max over the group's ranks,
   bit-exact validation) on the call's process group; barrier and send/recv timed the same
   way; anything else listed as skipped, with the reason. One record per measured call,
   tagged with its trace node id (record.method["trace"]).
2. the sequence: every op back to back (or, `--gaps`, with the trace's gaps between ops kept
   as sleeps), repeated; its time is the max over ranks, median over repetitions.

Where the trace has the job's own time of its calls, a pass before these issues every op
once, in trace order, on buffers new to the pass, as the job did (`as_issued`), and times
each call as the job's time is read (`call_time`): from the last of its ranks' issue to the
last rank's completion, on the host's clock.
"""

from __future__ import annotations

import contextlib
import datetime
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np

from ccbench import __version__
from ccbench.backends import backend_class
from ccbench.backends.base import Backend, RankContext
from ccbench.backends.options import BackendOptions
from ccbench.bench.harness import Case, Method, measure_size
from ccbench.bench.stats import summarize
from ccbench.collectives import COLLECTIVES, busbw_factor, get, layout
from ccbench.dtypes import DTYPES, numpy_dtype
from ccbench.errors import BackendUnavailable, RunFailure, UsageError
from ccbench.records import Record
from ccbench.replay.extra import EXTRA, SAME_WIDTH, ExtraCall, element_type, prepare, prepare_exchange
from ccbench.run.control import ControlClient
from ccbench.run.faults import inject
from ccbench.run.launchers import LaunchInfo, detect_launch
from ccbench.run.watchdog import Watchdog
from ccbench.trace.groups import ambiguous_calls
from ccbench.trace.ops import MEASURED, CommOp, Group, Trace
from ccbench.trace.subcomm import free_groups, split_groups
from ccbench.trace.summary import OpResult

__all__ = ["BackendReplay", "ReplayConfig", "ReplayMeta", "call_time", "replay_rank"]


class ReplayMeta(TypedDict):
    """Which library a backend's replay ran on (rank 0's, once it was up)."""

    backend: str
    library: str
    library_version: str


class BackendReplay(TypedDict):
    """Rank 0's results of one backend's replay."""

    meta: ReplayMeta | None            # None: the backend never came up
    results: list[OpResult]            # per call
    sequence_us: list[float] | None    # per pass of the whole sequence, the slowest rank's

_STEP_BASE = 10_000_000          # step numbers: backend index x this + call number


@dataclass(kw_only=True)
class ReplayConfig:
    """Everything a replay needs, validated by the command before any rank starts."""

    trace: Trace
    backends: list[str]
    method: Method
    sequence: str = "back-to-back"     # back-to-back | gaps | none
    repeat: int = 3
    output: str | None = None
    summary: str | None = None
    quiet: bool = False
    argv: list[str] = field(default_factory=list)


def call_time(spans: list[tuple[float, float]]) -> float:
    """A call's time from its ranks' (issue, completion) on one clock: from the last rank's
    issue (before it the call cannot progress: the others wait for that rank, whatever
    kept it) to the last rank's completion (until then the call is not done)."""
    return max(end for _, end in spans) - max(start for start, _ in spans)


def job_time(ops: list[CommOp]) -> float | None:
    """The job's own time of one call from its ops on every rank (a recording's): the
    call_time of their issues and completions where every rank's issue is on the host's
    clock; else (a trace with per-rank times only) the least of the ranks' own times."""
    spans = [(o.clock_us, o.clock_us + o.dur_us) for o in ops
             if o.clock_us is not None and o.dur_us is not None]
    if ops and len(spans) == len(ops):
        return call_time(spans)
    times = [o.dur_us for o in ops if o.dur_us is not None]
    return min(times) if times else None


def _case(op: CommOp) -> tuple[Case, str]:
    """The harness case of a call of the five, and a note when its dtype was substituted."""
    dtype, note = op.dtype, ""
    if dtype not in DTYPES:
        if dtype not in SAME_WIDTH:
            raise UsageError(f"{op.source}, node {op.node_id}: element type {dtype!r} has no "
                             f"ccbench dtype of the same width (valid: {', '.join(DTYPES)})")
        dtype, note = SAME_WIDTH[dtype], f"{op.dtype} measured as {SAME_WIDTH[dtype]}"
    reduce_op = op.reduce_op
    # as c10d's op works: allreduce_, broadcast_ and reduce_ in place (TraceRules.in_place)
    inplace = op.collective in COLLECTIVES and get(op.collective).trace.in_place
    return Case(op.collective, dtype, reduce_op, inplace, op.root or 0), note


class _Rank:
    def __init__(self, config: ReplayConfig, info: LaunchInfo, store: ControlClient,
                 watchdog: Watchdog) -> None:
        self.config, self.info, self.store, self.watchdog = config, info, store, watchdog
        self.trace = config.trace
        self.ops = self.trace.ops[info.rank]
        self.ambiguous = ambiguous_calls(self.trace)
        self.hosts: list[str] = []
        self.run_id = ""
        self.wrong = 0
        self.original: dict[int, list[CommOp]] = {}
        for each in self.trace.all_ops():
            if each.dur_us is not None:
                self.original.setdefault(each.call, []).append(each)

    # -- per op ---------------------------------------------------------------------------
    def _measure_five(self, sub: Backend, op: CommOp, step: int) -> OpResult | str | None:
        case, note = _case(op)
        reason = sub.unsupported(case.collective, numpy_dtype(case.dtype), case.op)
        if reason:
            return reason
        result, wrong = measure_size(sub, self.store, self.watchdog, case, op.size,
                                     self.config.method, step)
        self.wrong += wrong
        if sub.ctx.rank != 0:
            return None
        if result is None:
            return f"{op.collective} of {op.size} B rounds to zero elements per rank"
        record = self._record(sub, op, case, result, note)
        self._append(record)
        return OpResult(call=op.call, node_id=op.node_id, name=op.name,
                        collective=op.collective, size=op.size, group=list(op.group.ranks)
                        if op.group else [], time_us=result.time_us["median"],
                        busbw_gbps=result.busbw_gbps, original_us=self._original(op), wrong=result.wrong,
                        extra={"size_used": result.layout.size_used, **self._trace_tag(op, note)})

    def _append(self, record: Record) -> None:
        """Every call's first rank appends its record (ccbench.records.writer locks each
        append and moves a torn tail aside, once, whichever rank comes first)."""
        from ccbench.run.lifecycle import append_output

        if self.config.output:
            append_output(self.config.output, record, self.watchdog)

    def _group_source(self, op: CommOp) -> str:
        """The call's group_source: 'ambiguous' where any rank's op of it is."""
        return "ambiguous" if op.call in self.ambiguous else op.group_source

    def _trace_tag(self, op: CommOp, note: str) -> dict[str, Any]:
        """method.trace of a record: which call of which trace, and how sure its facts are."""
        group = sorted((op.rank, op.peer)) if op.collective in ("send", "recv") \
            and op.peer is not None else list(op.group.ranks) if op.group else None
        return {"file": op.source, "node_id": op.node_id, "name": op.name, "call": op.call,
                "index": op.index, "group": group,
                "group_source": self._group_source(op),
                "reduce_op_source": ("named" if op.op_source else "assumed")
                if op.reduce_op else None,
                "in_splits": list(op.in_splits) or None, "out_splits": list(op.out_splits) or None,
                "trace_world_size": self.trace.world_size, "trace_dtype": op.dtype,
                "root": op.group.ranks[op.root] if op.group and op.root is not None else None,
                "note": note, "original_us": self._original(op), "start_us": op.start_us}

    def _original(self, op: CommOp) -> float | None:
        """The job's own time for the call (job_time)."""
        return job_time(self.original.get(op.call, []))

    def _record(self, sub: Backend, op: CommOp, case: Case, result: Any, note: str) -> Record:
        lay = result.layout
        return self._make_record(sub, op, case, note, size_used=lay.size_used, count=lay.count,
                                 time_us=result.time_us, samples_us=result.samples_us,
                                 rank_median_us=result.rank_median_us,
                                 algbw_gbps=result.algbw_gbps, busbw_gbps=result.busbw_gbps,
                                 wrong=result.wrong, iterations=result.iterations)

    def _make_record(self, sub: Backend, op: CommOp, case: Case, note: str, **measured: Any
                     ) -> Record:
        meta = sub.info()
        method = self.config.method
        return Record(
            run_id=self.run_id,
            timestamp=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            ccbench_version=__version__, collective=case.collective, backend=sub.name,
            library=meta["library"], library_version=meta["library_version"],
            algorithm=sub.algorithm, transport=sub.transport, device=meta["device"],
            dtype=case.dtype, op=case.op, inplace=case.inplace, timing=method.timing,
            world_size=sub.ctx.world_size, nodes=len(self.hosts),
            ranks_per_node=max(1, self.info.world_size // max(1, len(self.hosts))),
            hosts=self.hosts, root=case.root, size_asked=op.size, warmup=method.warmup,
            method={"timing": method.timing, "check": method.check, "combine": "max over ranks",
                    "launcher": self.info.launcher, "timeout_s": method.timeout,
                    "trace": self._trace_tag(op, note)},
            environment={"backend": meta.get("env", {})}, **measured)

    def _time_loop(self, sub: Backend, op: CommOp, step: int, body: Any) -> list[float]:
        method = self.config.method
        self.watchdog.begin_step(step, f"{op.name} (node {op.node_id})")
        samples = []
        for i in range(method.warmup + method.iters):
            self.watchdog.enter()
            start = time.perf_counter()
            body()
            sub.synchronize()
            if i >= method.warmup:
                samples.append(time.perf_counter() - start)
            self.watchdog.leave()
        return samples

    def _measure_extra(self, sub: Backend, op: CommOp, step: int) -> OpResult | str | None:
        """barrier, send/recv and alltoallv on their group (ccbench.replay.extra), timed as
        the harness times (warm-up, timed iterations, max over the call's ranks) and checked
        bit for bit; the call's first rank writes its record."""
        call = prepare(sub, op, self.info.rank, self.config.method.timeout)
        if isinstance(call, str):
            return call
        key = f"trace/x/{step}"
        samples = self._time_loop(sub, op, step, call.run)
        wrong = call.check() if self.config.method.check else 0
        self.store.set(f"{key}/{self.info.rank}", {"samples": samples, "wrong": wrong})
        if self.info.rank != call.members[0]:
            return None
        with self.watchdog.waiting():
            per_rank = [self.store.get(f"{key}/{r}", self.config.method.timeout)
                        for r in call.members]
        return self._extra_result(sub, op, call, per_rank)

    def _extra_result(self, sub: Backend, op: CommOp, call: ExtraCall,
                      per_rank: list[dict[str, Any]]) -> OpResult:
        by_rank = np.asarray([p["samples"] for p in per_rank]) * 1e6
        samples = by_rank.max(axis=0)
        total_wrong = sum(int(p["wrong"]) for p in per_rank) if self.config.method.check \
            else None
        self.wrong += total_wrong or 0
        collective = "sendrecv" if op.collective in ("send", "recv") else op.collective
        time_us = summarize(samples.tolist())
        median_s = time_us["median"] * 1e-6
        algbw = op.size / median_s / 1e9 if median_s > 0 else 0.0
        factor = busbw_factor("alltoall", len(call.members)) if collective == "alltoallv" \
            else 1.0 if collective == "sendrecv" else 0.0
        dtype = element_type(op.dtype)
        case = Case(collective, dtype.name if op.collective != "barrier" else "uint8", None,
                    False, 0)
        record = self._make_record(
            sub, op, case, "", size_used=op.size, count=call.count,
            time_us=time_us, samples_us=samples.tolist(),
            rank_median_us=[float(np.median(row)) for row in by_rank],
            algbw_gbps=algbw, busbw_gbps=algbw * factor, wrong=total_wrong,
            iterations=self.config.method.iters)
        record.world_size = len(call.members)
        self._append(record)
        return OpResult(call=op.call, node_id=op.node_id, name=op.name, collective=collective,
                        size=op.size, group=list(call.members), time_us=time_us["median"],
                        busbw_gbps=algbw * factor, original_us=self._original(op), wrong=total_wrong,
                        extra=self._trace_tag(op, ""))

    def per_op(self, number: int, subs: dict[Group, Backend | str]) -> None:
        # in call order: the calls of an exchange come in a different order on each rank
        for op in sorted(self.ops, key=lambda o: o.call):
            step = _STEP_BASE * (number + 1) + op.call
            sub = subs.get(op.group) if op.group else None
            leader = op.group.ranks[0] if op.group else self.info.rank
            if op.collective in ("send", "recv") and op.peer is not None:
                leader = min(self.info.rank, op.peer)
            if sub is None or isinstance(sub, str):
                outcome: OpResult | str | None = sub or "no communicator for its group"
            elif op.collective in MEASURED:
                outcome = self._measure_five(sub, op, step)
            else:
                outcome = self._measure_extra(sub, op, step)
            if isinstance(outcome, str) and self.info.rank == leader:
                outcome = OpResult(call=op.call, node_id=op.node_id, name=op.name,
                                   collective=op.collective, size=op.size,
                                   group=list(op.group.ranks) if op.group else [],
                                   reason=outcome, original_us=self._original(op),
                                   extra=self._trace_tag(op, ""))
            if isinstance(outcome, OpResult):
                outcome.group_source, outcome.reduce_op = self._group_source(op), op.reduce_op
                self.store.set(f"trace/{number}/op/{op.call}", outcome.to_dict())

    # -- the sequence ---------------------------------------------------------------------
    def _bound(self, sub: Backend, op: CommOp, cache: dict[Any, Any]) -> Any:
        if op.collective in MEASURED:
            case, _ = _case(op)
            dtype = numpy_dtype(case.dtype)
            if sub.unsupported(case.collective, dtype, case.op):
                return None
            lay = layout(case.collective, op.size, dtype.itemsize, sub.ctx.world_size)
            if lay.send_count == 0 or lay.recv_count == 0:
                return None
            key = (id(sub), case, op.size)
            if key not in cache:
                send = sub.alloc(lay.send_count, dtype)
                recv = send if case.inplace else sub.alloc(lay.recv_count, dtype)
                sub.copy_from_numpy(send, np.zeros(lay.send_count, dtype=dtype))
                # the buffers stay in the cache: a bound call may hold only their addresses
                cache[key] = (sub.bind(case.collective, send, recv, case.op, case.root),
                              send, recv)
            return cache[key][0]
        if op.collective in EXTRA:
            call = prepare(sub, op, self.info.rank, self.config.method.timeout)
            if isinstance(call, str):
                return None
            cache[("extra", op.call)] = call            # keeps its buffers alive
            return call.run
        return None

    def _bound_exchange(self, sub: Backend, op: CommOp, cache: dict[Any, Any]) -> Any:
        """The first op of an exchange posts all of this rank's ops in it; the others none."""
        key = ("exchange", op.exchange)
        if key in cache:
            return None
        ops = [o for o in self.ops if o.exchange == op.exchange]
        call = prepare_exchange(sub, ops, self.info.rank, self.config.method.timeout)
        cache[key] = call                                 # keeps its buffers alive
        return None if isinstance(call, str) else call.run

    def _gaps(self) -> list[float]:
        """Seconds to sleep before each op: the trace's idle time since the previous one."""
        gaps, end = [], None
        for op in self.ops:
            if op.start_us is None or end is None:
                gaps.append(0.0)
            else:
                gaps.append(max(0.0, (op.start_us - end) * 1e-6))
            if op.start_us is not None:
                end = op.start_us + (op.dur_us or 0.0)
        return gaps

    def _bind_all(self, subs: dict[Group, Backend | str], cache: dict[Any, Any]
                  ) -> list[Any]:
        """Every op of this rank bound to its buffers, in trace order (None: not run, or
        posted with the first op of its exchange)."""
        calls = []
        for op in self.ops:
            sub = subs.get(op.group) if op.group else None
            if op.exchange >= 0 and isinstance(sub, Backend):
                calls.append(self._bound_exchange(sub, op, cache))
            else:
                calls.append(self._bound(sub, op, cache) if isinstance(sub, Backend) else None)
        return calls

    def as_issued(self, number: int, backend: Backend, subs: dict[Group, Backend | str]
                  ) -> None:
        """Every op once, in trace order, back to back, on buffers new to this pass (one set
        per kind and size of call, as the sequence binds them; a job's calls in one step are
        each issued once), after one barrier: per call this rank's issue and completion on
        the host's clock (an exchange's calls: its posting and completion), for call_time."""
        cache: dict[Any, Any] = {}
        calls = self._bind_all(subs, cache)
        step = _STEP_BASE * (number + 1) + _STEP_BASE // 4
        self.watchdog.begin_step(step, f"{backend.name}: the trace's calls once, as issued")
        clock = time.time_ns
        spans: dict[int, list[float]] = {}
        exchanges: dict[int, list[float]] = {}
        self.watchdog.enter()
        backend.barrier()
        for op, call in zip(self.ops, calls, strict=True):
            if call is None:
                continue
            self.watchdog.enter()
            start = clock()
            call()
            backend.synchronize()
            span = [start / 1e3, clock() / 1e3]
            spans[op.call] = span
            if op.exchange >= 0:
                exchanges[op.exchange] = span
        self.watchdog.leave()
        for op in self.ops:                 # an exchange's other calls: posted with its first
            if op.exchange in exchanges:
                spans.setdefault(op.call, exchanges[op.exchange])
        self.store.set(f"trace/{number}/issued/{self.info.rank}", spans)

    def sequence(self, number: int, backend: Backend, subs: dict[Group, Backend | str]
                 ) -> None:
        cache: dict[Any, Any] = {}
        calls = self._bind_all(subs, cache)
        gaps = self._gaps() if self.config.sequence == "gaps" else [0.0] * len(calls)
        totals = []
        step = _STEP_BASE * (number + 1) + _STEP_BASE // 2
        for rep in range(self.config.repeat):
            self.watchdog.begin_step(step + rep, f"{backend.name}: the trace's whole sequence, "
                                                 f"pass {rep + 1}")
            if number == 0 and rep == 0:
                inject("mid-run", self.info.rank)
            self.watchdog.enter()
            backend.barrier()
            start = time.perf_counter()
            for call, gap in zip(calls, gaps, strict=True):
                if gap:
                    time.sleep(gap)
                if call is not None:
                    self.watchdog.enter()
                    call()
            backend.synchronize()
            totals.append(time.perf_counter() - start)
            self.watchdog.leave()
        self.store.set(f"trace/{number}/seq/{self.info.rank}", totals)

    @contextlib.contextmanager
    def _library_errors(self, backend: str) -> Iterator[None]:
        """A library's error (usually: a peer died) ends the run as the benchmark's does:
        one line from the watchdog naming the step and the ranks, no traceback."""
        try:
            yield
        except (UsageError, RunFailure):
            raise
        except Exception as exc:  # noqa: BLE001
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            self.watchdog.abort(f"{backend} failed: {text[:160]}")

    # -- the whole replay -----------------------------------------------------------------
    def run_backend(self, number: int, name: str) -> None:
        info = self.info
        cls = backend_class(name)
        reason = cls.unavailable_reason()
        if reason:
            raise BackendUnavailable(f"backend {name!r} unavailable: {reason}")
        ctx = RankContext(rank=info.rank, world_size=info.world_size, local_rank=info.local_rank,
                          local_world_size=info.local_world_size, launcher=info.launcher,
                          store=self.store, hostname=socket.gethostname(), device="cpu",
                          options=BackendOptions.from_mapping({
                              "timeout": self.config.method.timeout,
                              "multi_host": len(self.hosts) > 1}))
        self.watchdog.label = f"{name}: initialisation"
        inject("init", info.rank)
        with self.watchdog.waiting():
            backend = cls(ctx)
            subs = split_groups(backend, self.trace.groups, info.world_size,
                                self.config.method.timeout)
        try:
            if info.rank == 0:
                meta = backend.info()
                self.store.set(f"trace/{number}/meta", {"backend": name,
                                                        "library": meta["library"],
                                                        "library_version": meta["library_version"]})
            with self._library_errors(name):
                if self.config.sequence != "none" and self.original:
                    self.as_issued(number, backend, subs)
                self.per_op(number, subs)
                if self.config.sequence != "none":
                    self.sequence(number, backend, subs)
            with self.watchdog.waiting():
                self.store.barrier(f"trace/{number}/done", info.world_size,
                                   self.config.method.timeout)
        finally:
            self.watchdog.label = f"{name}: finalisation"
            with self.watchdog.waiting():
                free_groups(subs, backend)
                backend.finalize()


def _collect(store: ControlClient, number: int, world: int, calls: int) -> BackendReplay:
    results = [OpResult(**store.get(f"trace/{number}/op/{c}", 60)) for c in range(calls)]
    seq = [store.peek(f"trace/{number}/seq/{r}") for r in range(world)]
    passes = None
    if all(s is not None for s in seq):
        passes = [max(s[i] for s in seq) * 1e6 for i in range(len(seq[0]))]
    spans: dict[int, list[tuple[float, float]]] = {}
    for r in range(world):
        for call, (start, end) in (store.peek(f"trace/{number}/issued/{r}") or {}).items():
            spans.setdefault(int(call), []).append((start, end))
    for result in results:
        if result.call in spans and result.time_us is not None:
            result.extra["as_issued_us"] = call_time(spans[result.call])
    return {"meta": store.peek(f"trace/{number}/meta"), "results": results,
            "sequence_us": passes}


def replay_rank(config: ReplayConfig) -> tuple[int, list[BackendReplay] | None]:
    """One rank's replay, in the benchmark's rank lifecycle (ccbench.run.lifecycle.rank_lifecycle:
    start-up waits, watchdog, step labels, fault points, exit alarm). Returns (exit status,
    rank 0: per backend its results)."""
    from ccbench.bench.options import connect_timeout
    from ccbench.run.launchers import require_mpi_launcher
    from ccbench.run.lifecycle import rank_lifecycle

    info = detect_launch()
    trace = config.trace
    if info.world_size != trace.world_size:
        from ccbench.trace.scale import unscalable

        why = unscalable(trace)
        hint = f"; it cannot be rescaled: {why}" if why else \
            f", or pass --world-size {info.world_size} to rescale the trace"
        raise UsageError(f"the trace has {trace.world_size} ranks but {info.world_size} were "
                         f"started (start {trace.world_size}{hint})")
    for name in config.backends:
        if backend_class(name).needs_mpi_launcher:
            require_mpi_launcher(info, name)
    timeout = config.method.timeout
    collected: list[BackendReplay] = []

    def body(store: ControlClient, watchdog: Watchdog) -> int:
        rank = _Rank(config, info, store, watchdog)
        with watchdog.waiting():
            rank.hosts = sorted(set(store.gather("trace/hosts", socket.gethostname(),
                                                 info.world_size, timeout)))
            if info.rank == 0:
                store.set("trace/run_id", uuid.uuid4().hex[:12])
            rank.run_id = store.get("trace/run_id", timeout)
        calls = 1 + max((op.call for op in trace.all_ops()), default=-1)
        for number, name in enumerate(config.backends):
            rank.run_backend(number, name)
        if info.rank == 0:
            with watchdog.waiting():
                collected.extend(_collect(store, n, info.world_size, calls)
                                 for n in range(len(config.backends)))
        return 0

    rank_lifecycle(info, timeout, connect_timeout(timeout), config.argv, body)
    status = 1 if any(r.wrong for c in collected for r in c["results"]) else 0
    return status, collected if info.rank == 0 else None
