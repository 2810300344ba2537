"""The benchmark run of one rank: launcher -> control store -> backends -> cases -> records."""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import json
import os
import platform
import signal
import socket
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ccbench import __version__
from ccbench.arrivals import RankStates, await_ranks, rank_states, start_limit
from ccbench.backends import backend_class
from ccbench.backends.base import Backend, RankContext
from ccbench.backends.options import BackendOptions
from ccbench.collectives import REDUCING, layout
from ccbench.collectives import get as get_collective
from ccbench.control import CONNECT_TIMEOUT_S, ControlClient, ControlServer, StoreLost, StoreTimeout
from ccbench.dtypes import numpy_dtype
from ccbench.errors import BackendUnavailable, RunFailure, UsageError
from ccbench.familiar import COMBINE_LABELS
from ccbench.faults import MID_RUN_STEP, inject
from ccbench.harness import Case, Method, SizeResult, host_bytes_per_rank, measure_size
from ccbench.launchers import LaunchInfo, connect_control, detect_launch, hosted_apart
from ccbench.output import Progress, TableWriter, make_writer
from ccbench.records import Record, append_record
from ccbench.records.table import finish_parquet, journal_path
from ccbench.records.writer import torn_warning
from ccbench.repeats import repeat_from_env
from ccbench.sysinfo import available_memory, cpu_model, node_cores, oversubscription_note
from ccbench.watchdog import Watchdog

__all__ = ["BenchConfig", "run_benchmark"]

MPI_LAUNCHERS = ("mpiexec", "srun", "single")
#: what a backend's info() may say that changes what is measured: copied into record.method
METHOD_KEYS = ("buffers", "nccl_algo", "nccl_proto", "allreduce_out_of_place", "mpi_thread_level",
               "torch_threads", "timed_call", "cuda_graph")
# peak resident memory of a rank before its first buffer (python, numpy, torch or MPI);
# benchmarks/host_memory.py measured 305 MiB with torch and gloo; kept with a margin
RANK_BASELINE_BYTES = 512 << 20


@dataclass(kw_only=True)
class BenchConfig:
    """Everything a run needs, already validated by the CLI."""

    collectives: list[str]
    backends: list[str]
    sizes: list[int]
    dtypes: list[str]
    ops: list[str]
    modes: tuple[bool, ...]           # inplace values to run, out-of-place first
    method: Method
    root: int = 0
    device: str = "cpu"
    output: str | None = None
    fmt: str = "table"
    quiet: bool = False
    full: bool = False                # the table shows the spread over ranks too (OSU -f)
    options: dict[str, Any] | None = None
    argv: list[str] | None = None     # as typed, for the agreement check
    connect_timeout: float = CONNECT_TIMEOUT_S    # the CLI makes it min(this, --timeout)


def _environment() -> dict[str, Any]:
    env: dict[str, Any] = {"cpu": cpu_model(), "num_cpus": os.cpu_count(),
                           "python": platform.python_version(), "platform": platform.platform(),
                           "hostname": socket.gethostname()}
    try:
        import numpy

        env["numpy"] = numpy.__version__
    except ImportError:
        pass
    if "torch" in sys.modules:
        env["torch"] = sys.modules["torch"].__version__
    prefixes = ("NCCL_", "CCL_", "MPIR_", "OMPI_MCA_", "I_MPI_", "FI_", "GLOO_", "UCX_", "CUDA_VISIBLE")
    env["variables"] = {k: v for k, v in os.environ.items() if k.startswith(prefixes)}
    return env


def _agree_on_arguments(store: ControlClient, info: LaunchInfo, argv: list[str], timeout: float,
                        watchdog: Watchdog | None = None, connect_timeout: float | None = None
                        ) -> None:
    """Every rank checks in with its arguments; rank 0 compares them. With a watchdog and a
    connect timeout, rank 0 first waits for every rank the way ccbench.arrivals says (a late
    rank is waited for, a dead one named at once)."""
    digest = hashlib.sha256(json.dumps(argv).encode()).hexdigest()
    store.set(f"args/{info.rank}", {"digest": digest, "argv": argv})
    if info.rank == 0:
        if watchdog is not None and connect_timeout is not None:
            _await_ranks(store, info, watchdog, connect_timeout)
        verdict = None
        for rank in range(1, info.world_size):
            other = store.get(f"args/{rank}", timeout)
            if other["digest"] != digest:
                verdict = (f"ranks launched with different arguments: rank 0 has "
                           f"{' '.join(argv)!r}, rank {rank} has {' '.join(other['argv'])!r}")
                break
        store.set("args/verdict", verdict)
    verdict = store.get("args/verdict", timeout)
    if verdict:
        if info.rank == 0:      # it hosts the store: the others read the verdict before it goes
            for rank in range(1, info.world_size):
                store.get(f"args/read/{rank}", timeout)
        else:
            store.set(f"args/read/{info.rank}", 1)
        raise UsageError(verdict)


def _await_ranks(store: ControlClient, info: LaunchInfo, watchdog: Watchdog,
                 connect_timeout: float) -> None:
    def arrived() -> set[int]:
        return {int(key.split("/")[1]) for key in store.prefix("args/")
                if key.split("/")[1].isdigit()}

    def states() -> RankStates | None:
        return rank_states(info.launcher, info.world_size, info.local_world_size)

    started = time.monotonic()
    missing = await_ranks(arrived, info.world_size, connect_timeout, states)
    if missing:
        if all(why == "dead" for why in missing.values()):
            why = "a rank exited before it reached the control store"
        else:
            why = f"not every rank arrived within {time.monotonic() - started:.0f} s"
        watchdog.ranks_missing(why, missing)


def _check_memory(config: BenchConfig, info: LaunchInfo) -> None:
    """Refuse sizes that cannot fit before allocating anything."""
    available = available_memory()
    if available is None:
        return
    largest = 0
    for collective in config.collectives:
        for dtype in config.dtypes:
            lay = layout(collective, max(config.sizes), numpy_dtype(dtype).itemsize, info.world_size)
            largest = max(largest, host_bytes_per_rank(lay))
    # what a rank holds before any buffer (interpreter, numpy, the backend's library), as
    # measured by benchmarks/host_memory.py
    needed = (largest + RANK_BASELINE_BYTES) * info.local_world_size
    if needed > available:
        raise UsageError(f"size {max(config.sizes)} needs about {needed / 2**30:.1f} GiB on this "
                         f"node ({info.local_world_size} ranks) but {available / 2**30:.1f} GiB "
                         f"is free (use smaller --sizes)")


def check_measurable(config: BenchConfig, world_size: int) -> None:
    """Refuse a run in which no size has a non-zero element count (nothing would be measured),
    before any rank starts; a mix of measurable and too-small sizes runs the measurable ones."""
    for collective in config.collectives:
        for dtype in config.dtypes:
            elsize = numpy_dtype(dtype).itemsize
            for size in config.sizes:
                lay = layout(collective, size, elsize, world_size)
                if lay.send_count and lay.recv_count:
                    return
    smallest = max(config.sizes)
    raise UsageError(f"nothing to measure: every size in --sizes (largest {smallest} B) rounds "
                     f"down to 0 elements per rank for {', '.join(config.collectives)} in "
                     f"{', '.join(config.dtypes)} on {world_size} ranks (use larger --sizes)")


def _cases(config: BenchConfig) -> list[tuple[str, str, str | None]]:
    groups = []
    for collective in config.collectives:
        for dtype in config.dtypes:
            for op in (config.ops if collective in REDUCING else [None]):
                groups.append((collective, dtype, op))
    return groups


def _placement(device: str, ranks_on_node: int) -> dict[str, Any]:
    """Whether this node's ranks outnumber its cores (or GPUs): then they take turns and the
    times include that wait. The node's core count, not this rank's affinity: mpiexec pins
    each rank to one core."""
    cores = node_cores()
    units, what = cores, "cores"
    if device == "cuda" and "torch" in sys.modules:
        gpus = int(sys.modules["torch"].cuda.device_count())
        if gpus:
            units, what = gpus, "GPUs"
    return {"oversubscribed": ranks_on_node > units, "cores": cores,
            "note": oversubscription_note(ranks_on_node, units, what)}


class _Run:
    def __init__(self, config: BenchConfig, info: LaunchInfo, store: ControlClient,
                 repeat: dict[str, Any] | None = None) -> None:
        self.config, self.info, self.store = config, info, store
        self.repeat = repeat or {}         # which launch of `ccbench launch --repeat N`
        self.is_root = info.rank == 0
        self.writer: TableWriter = make_writer(config.fmt, full=config.full)
        self.run_id = uuid.uuid4().hex[:12] if self.is_root else ""
        self.environment = _environment() if self.is_root else {}
        self.hosts: list[str] = []
        self.wrong_total = 0
        self.step = 0
        self.placement = _placement(config.device, info.local_world_size)
        self.watchdog: Watchdog | None = None

    def run(self, watchdog: Watchdog) -> int:
        config, info = self.config, self.info
        self.watchdog = watchdog
        hosts = self.store.gather("hosts", socket.gethostname(), info.world_size,
                                  config.method.timeout)
        self.hosts = sorted(set(hosts))
        if self.is_root:
            self.store.set("run_id", self.run_id)
        self.run_id = self.store.get("run_id", config.method.timeout)
        if self.is_root and self.placement["note"]:
            print(self.placement["note"], file=sys.stderr, flush=True)
        num_sizes = len(_cases(config)) * len(config.sizes) * len(config.modes) * len(config.backends)
        progress = Progress(num_sizes, enabled=self.is_root and not config.quiet)
        self.writer.stream = progress.rows(self.writer.stream)
        try:
            for name in config.backends:
                self._run_backend(name, watchdog, progress)
        finally:
            progress.close()
        if self.is_root:
            if config.output:
                finish_parquet(config.output)
        return 1 if self.wrong_total else 0

    def _run_backend(self, name: str, watchdog: Watchdog, progress: Progress) -> None:
        config, info = self.config, self.info
        cls = backend_class(name, config.device)
        reason = cls.unavailable_reason()
        if reason:
            raise BackendUnavailable(f"backend {name!r} unavailable: {reason}")
        ctx = RankContext(rank=info.rank, world_size=info.world_size, local_rank=info.local_rank,
                          local_world_size=info.local_world_size, launcher=info.launcher,
                          store=self.store, hostname=socket.gethostname(), device=config.device,
                          options=BackendOptions.from_mapping({
                              **(config.options or {}), "timeout": config.method.timeout,
                              "multi_host": len(self.hosts) > 1}))
        watchdog.label = f"{name}: initialisation"
        inject("init", info.rank)
        watchdog.enter()
        watchdog.lenient = True
        backend = cls(ctx)
        watchdog.lenient = False
        watchdog.leave()
        try:
            meta = backend.info()
            if self.is_root:
                self.writer.header(
                    f"ccbench {__version__}  backend {name} ({meta['library']} "
                    f"{meta['library_version']})  world {info.world_size} on {len(self.hosts)} "
                    f"node(s)  launcher {info.launcher}  timing {config.method.timing}  "
                    f"iters {config.method.iters} warmup {config.method.warmup}  time "
                    f"{COMBINE_LABELS[config.method.combine]}")
            wrong_before = self.wrong_total
            for collective, dtype, op in _cases(config):
                self._run_group(backend, meta, watchdog, progress, collective, dtype, op)
            if self.is_root:               # one footer per table: this backend's rows
                self.writer.footer(self.wrong_total - wrong_before if config.method.check
                                   else None)
        finally:
            watchdog.label = f"{name}: finalisation"
            with watchdog.waiting():
                backend.finalize()

    def _run_group(self, backend: Backend, meta: dict[str, Any], watchdog: Watchdog,
                   progress: Progress, collective: str, dtype: str, op: str | None) -> None:
        config = self.config
        reason = backend.unsupported(collective, numpy_dtype(dtype), op)
        if reason:
            if self.is_root:
                self.writer.note(f"{collective} {dtype} {op or ''}: {reason}".replace("  ", " "))
            return
        modes = get_collective(collective).modes(config.modes)
        if self.is_root:
            self.writer.note(f"{collective}  {dtype}{'  ' + op if op else ''}")
        for size in config.sizes:
            for inplace in modes:
                case = Case(collective, dtype, op, inplace, config.root)
                self.step += 1
                if self.step == MID_RUN_STEP:
                    inject("mid-run", self.info.rank)
                try:
                    label = case.label(size)
                    result, own_wrong = measure_size(
                        backend, self.store, watchdog, case, size, config.method, self.step,
                        on_sample=functools.partial(progress.sample, label))
                except (UsageError, RunFailure):
                    raise
                except Exception as exc:  # noqa: BLE001  a library error: one line naming the case and ranks
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                    watchdog.abort(f"{backend.name} failed: {first[:160]}")
                self.wrong_total += own_wrong if not self.is_root else 0
                progress.step(case.label(size))
                if result is not None:
                    self._emit(backend, meta, case, size, result, modes)

    def _emit(self, backend: Backend, meta: dict[str, Any], case: Case, size: int,
              result: SizeResult, modes: tuple[bool, ...]) -> None:
        config, info, lay = self.config, self.info, result.layout
        record = Record(
            run_id=self.run_id,
            timestamp=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            ccbench_version=__version__, collective=case.collective, backend=backend.name,
            library=meta["library"], library_version=meta["library_version"],
            algorithm=backend.algorithm, transport=backend.transport, device=meta["device"],
            dtype=case.dtype, op=case.op, inplace=case.inplace, timing=config.method.timing,
            world_size=info.world_size, nodes=len(self.hosts),
            ranks_per_node=max(1, info.world_size // max(1, len(self.hosts))), hosts=self.hosts,
            root=case.root, size_asked=size, size_used=lay.size_used, count=lay.count,
            iterations=result.iterations, warmup=config.method.warmup, time_us=result.time_us,
            samples_us=result.samples_us, rank_median_us=result.rank_median_us,
            algbw_gbps=result.algbw_gbps, busbw_gbps=result.busbw_gbps, wrong=result.wrong,
            method={"timing": config.method.timing, "pipeline": config.method.pipeline,
                    "min_time_s": config.method.min_time, "check": config.method.check,
                    "combine": COMBINE_LABELS[config.method.combine],
                    "launcher": info.launcher,
                    "timeout_s": config.method.timeout,
                    "oversubscribed": self.placement["oversubscribed"],
                    "cores_per_node": self.placement["cores"],
                    **self.repeat,
                    # settings that change what is measured, when the backend has them
                    **{k: meta[k] for k in METHOD_KEYS if meta.get(k) is not None},
                    # what the clock saw: one bound call (per-op) or a batch's loop (pipelined)
                    **({"timed_call": result.batch_loop} if result.batch_loop else {}),
                    **({"local_copy_us": result.local_copy_us}
                       if result.local_copy_us is not None else {})},
            environment={**self.environment, "backend": meta.get("env", {}),
                         **{k: v for k, v in meta.items() if k not in ("library", "library_version",
                                                                       "device", "env")}},
        )
        self.wrong_total += result.wrong or 0
        if config.output:
            self._append(record)
        self.writer.add(record, modes)

    def _append(self, record: Record) -> None:
        assert self.config.output is not None and self.watchdog is not None
        append_output(self.config.output, record, self.watchdog)


def append_output(output: str, record: Record, watchdog: Watchdog) -> None:
    """Append one record to --output, for the benchmark and the replay alike: whole lines
    only (ccbench.records.writer: a torn last line moved to .torn first, with a warning) and
    a failed write ends the run in one line naming the file."""
    journal = journal_path(output)     # itself, unless it is .parquet
    try:
        torn = append_record(journal, record)
    except OSError as exc:
        watchdog.fail(f"cannot append to --output {output!r}: "
                      f"{exc.strerror or exc} (records before are kept)")
    if torn:
        print(torn_warning(journal, torn), file=sys.stderr, flush=True)


def run_benchmark(config: BenchConfig) -> int:
    """One rank's whole run; returns the exit status."""
    info = detect_launch()
    for name in config.backends:            # before any rendezvous, so nothing waits on it
        if backend_class(name).needs_mpi_launcher and info.launcher not in MPI_LAUNCHERS:
            raise UsageError(f"backend {name!r} needs ranks started by mpiexec (or srun), not "
                             f"{info.launcher}; `ccbench launch` starts it under mpiexec")
    if config.root >= info.world_size:
        raise UsageError(f"--root {config.root} is not a rank of this run of {info.world_size} "
                         f"(valid: 0 to {info.world_size - 1})")
    check_measurable(config, info.world_size)
    repeat = repeat_from_env()

    def body(store: ControlClient, watchdog: Watchdog) -> int:
        _check_memory(config, info)
        return _Run(config, info, store, repeat).run(watchdog)

    return rank_lifecycle(info, config.method.timeout, config.connect_timeout,
                          config.argv or [], body)


def rank_lifecycle(info: LaunchInfo, timeout: float, connect_timeout: float, argv: list[str],
                   body: Callable[[ControlClient, Watchdog], int]) -> int:
    """One rank's life around `body` (the benchmark's runs, or a trace's replay): connect to
    the control store, start the watchdog, wait for late ranks and agree on the arguments,
    run the body, meet at the end (a step of its own, with its fault point), close, and arm
    the exit alarm. Returns the body's exit status."""
    store, server = connect_control(info, timeout, connect_timeout)
    watchdog = Watchdog(store, info.rank, info.world_size, timeout)
    apart = info.launcher == "mpiexec" and hosted_apart()
    watchdog.post_labels = apart
    watchdog.rank_states = functools.partial(rank_states, info.launcher, info.world_size,
                                             info.local_world_size)
    watchdog.start()
    try:
        # the others connect within the connect timeout or say why not; rank 0 waits for late
        # ranks (ccbench.arrivals) and decides, the others wait for its verdict a little longer
        limit = start_limit(connect_timeout) + 5
        with watchdog.waiting(limit=limit + (5 if info.rank else 0)):
            _agree_on_arguments(store, info, argv, limit, watchdog, connect_timeout)
        status = body(store, watchdog)
        # a step of its own, and reaching the closing barrier counts as its one op: a rank that
        # never gets there is behind the others' posted progress and named (with the store
        # outside rank 0 nothing else would tell a stopped rank 0 from a slow one)
        watchdog.begin_step(watchdog.position[0] + 1, "the end of the run")
        inject("shutdown", info.rank)
        watchdog.reached()
        with watchdog.waiting():
            store.barrier("end", info.world_size, timeout)
    except (StoreLost, StoreTimeout) as failure:
        watchdog.store_failed(failure)
        raise
    except BaseException:
        if apart:               # this rank says why (the CLI prints it): the store host must not
            with contextlib.suppress(RunFailure):
                store.set("aborted", info.rank)
        raise
    finally:
        watchdog.stop()
    _close(store, server, info)
    # what runs after us (MPI_Finalize at interpreter exit, library destructors) is collective
    # too and runs when no Python thread can act any more: if a peer never gets there, the
    # alarm's default action ends this process instead of letting it hang. Not sooner than
    # 25 s beyond the timeout: tearing torch down took over 10 s on a loaded machine (load 20
    # on 2 cores), and a healthy run must not end killed by this alarm
    signal.alarm(int(timeout) + 25)
    return status


def _close(store: ControlClient, server: ControlServer | None, info: LaunchInfo) -> None:
    """Rank 0 hosts the store and leaves last: once its interpreter shuts down (MPI_Finalize
    runs after Python's threads are frozen) the store can no longer answer, so it waits for
    a bye on both connections of every other rank (main and watchdog) first."""
    if server is None:
        store.close()
        return
    expected = 2 * (info.world_size - 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        byes = store.prefix("byes/")
        if sum(int(v) for k, v in byes.items() if k != "byes/0") >= expected:
            break
        time.sleep(0.01)
    store.close()
    server.close()
