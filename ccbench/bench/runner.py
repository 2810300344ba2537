"""The benchmark run of one rank: launcher -> control store -> backends -> cases -> records."""

from __future__ import annotations

import datetime
import functools
import os
import platform
import re
import socket
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ccbench import __version__
from ccbench.backends import backend_class, prepare_process
from ccbench.backends.base import Backend, BackendInfo, RankContext
from ccbench.backends.options import BackendOptions
from ccbench.bench.harness import Case, Method, SizeResult, host_bytes_per_rank, measure_size
from ccbench.bench.options import COMBINE_LABELS, method_record
from ccbench.bench.output.progress import Progress
from ccbench.bench.output.table import TableWriter
from ccbench.bench.output.writers import QuietWhenClosed, make_writer
from ccbench.bench.repeats import RepeatIndex, repeat_from_env
from ccbench.collectives import REDUCING, layout
from ccbench.collectives import get as get_collective
from ccbench.dtypes import numpy_dtype
from ccbench.errors import BackendUnavailable, RunFailure, UsageError
from ccbench.records import Record
from ccbench.records.table import finish_parquet
from ccbench.run.control import CONNECT_TIMEOUT_S, ControlClient
from ccbench.run.faults import MID_RUN_STEP, inject
from ccbench.run.launchers import LaunchInfo, detect_launch, require_mpi_launcher
from ccbench.run.lifecycle import append_output, rank_lifecycle
from ccbench.run.watchdog import Watchdog
from ccbench.sysinfo import available_memory, cpu_model, node_cores, oversubscription_note
from ccbench.units import size_text

__all__ = ["BenchConfig", "run_benchmark"]

#: what a backend's info() may say that changes what is measured: copied into record.method
METHOD_KEYS = ("buffers", "nccl_algo", "nccl_proto", "mpi_thread_level", "torch_threads",
               "timed_call", "cuda_graph")


def _out_of_place_note(meta: Mapping[str, object], collective: str, inplace: bool
                       ) -> dict[str, object]:
    """How the backend makes `collective`'s out-of-place call where its info() says so
    (`<collective>_out_of_place`, e.g. torch's copy then in-place all_reduce): for
    record.method of that collective's out-of-place records only."""
    key = f"{collective.replace('-', '_')}_out_of_place"
    note = None if inplace else meta.get(key)
    return {} if note is None else {key: note}
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
    keep_records: bool = False        # no --output given: rank 0 keeps them in a new file
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
        raise UsageError(f"size {max(config.sizes)} needs about {size_text(needed)} on this "
                         f"node ({info.local_world_size} ranks) but {size_text(available)} "
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
                 repeat: RepeatIndex | None = None) -> None:
        self.config, self.info, self.store = config, info, store
        self.repeat = repeat or {}         # which launch of `ccbench launch --repeat N`
        self.is_root = info.rank == 0
        self.writer: TableWriter = make_writer(config.fmt, full=config.full)
        self.run_id = uuid.uuid4().hex[:12] if self.is_root else ""
        self.environment = _environment() if self.is_root else {}
        self.hosts: list[str] = []
        self.wrong_total = 0
        self.wrong_cases: list[str] = []   # rank 0: the measurements that had wrong values
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
        self.writer.stream = QuietWhenClosed(progress.rows(self.writer.stream))
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
            # what reports call it: the factory's (an algorithm's is `ring over <transport>`)
            shown = cls.display_name
            for collective, dtype, op in _cases(config):
                self._run_group(backend, meta, shown, watchdog, progress, collective, dtype, op)
            if self.is_root:               # one footer per table: this backend's rows
                self.writer.footer(self.wrong_total - wrong_before if config.method.check
                                   else None)
        finally:
            watchdog.label = f"{name}: finalisation"
            with watchdog.waiting():
                backend.finalize()

    def _run_group(self, backend: Backend, meta: BackendInfo, shown: str, watchdog: Watchdog,
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
                    watchdog.abort(f"{backend.name} failed: {library_message(exc).rstrip('.')}")
                self.wrong_total += own_wrong if not self.is_root else 0
                progress.step(case.label(size))
                if result is not None:
                    self._emit(backend, meta, shown, case, size, result, modes)

    def _emit(self, backend: Backend, meta: BackendInfo, shown: str, case: Case, size: int,
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
            iterations=result.iterations, warmup=result.warmup, time_us=result.time_us,
            samples_us=result.samples_us, rank_median_us=result.rank_median_us,
            algbw_gbps=result.algbw_gbps, busbw_gbps=result.busbw_gbps, wrong=result.wrong,
            method={**method_record(config.method, {"launcher": info.launcher, **self.repeat}),
                    "oversubscribed": self.placement["oversubscribed"],
                    "cores_per_node": self.placement["cores"],
                    # settings that change what is measured, when the backend has them
                    **{k: v for k in METHOD_KEYS if (v := meta.get(k)) is not None},
                    **_out_of_place_note(meta, case.collective, case.inplace),
                    # a builder that is not one library call says what it times
                    **({"timed_call": own} if (own := backend.describe_call(case.collective))
                       else {}),
                    # what the clock saw: one bound call (per-op) or a batch's loop (pipelined)
                    **({"timed_call": result.batch_loop} if result.batch_loop else {}),
                    **({"local_copy_us": result.local_copy_us}
                       if result.local_copy_us is not None else {})},
            # the backend's display name: what a report calls a backend the registry's data
            # does not know (a plugin's), never its library's name alone
            environment={**self.environment, "backend": meta.get("env", {}),
                         "backend_display_name": shown,
                         **{k: v for k, v in meta.items() if k not in ("library", "library_version",
                                                                       "device", "env")}},
        )
        self.wrong_total += result.wrong or 0
        if result.wrong:
            self.wrong_cases.append(f"{backend.name} {case.label(size)}: {result.wrong}")
        if config.output:
            self._append(record)
        self.writer.add(record, modes)

    def _append(self, record: Record) -> None:
        assert self.config.output is not None and self.watchdog is not None
        append_output(self.config.output, record, self.watchdog)


def run_benchmark(config: BenchConfig) -> int:
    """One rank's whole run; returns the exit status."""
    # what the backends' libraries read from this process (MPI's thread level, NCCL_ALGO),
    # before anything here starts one: finding the launch may initialise MPI
    prepare_process(config.backends, config.device,
                    BackendOptions.from_mapping(config.options or {}))
    info = detect_launch()
    for name in config.backends:            # before any rendezvous, so nothing waits on it
        if backend_class(name).needs_mpi_launcher:
            require_mpi_launcher(info, name)
    if config.root >= info.world_size:
        raise UsageError(f"--root {config.root} is not a rank of this run of {info.world_size} "
                         f"(valid: 0 to {info.world_size - 1})")
    check_measurable(config, info.world_size)
    repeat = repeat_from_env()

    chosen: list[str | None] = [None]

    runs: list[_Run] = []

    def body(store: ControlClient, watchdog: Watchdog) -> int:
        _check_memory(config, info)
        if config.keep_records and config.output is None and info.rank == 0:
            from ccbench.bench.output.files import new_records_file

            chosen[0] = config.output = new_records_file()     # only rank 0 writes records
        runs.append(_Run(config, info, store, repeat))
        return runs[-1].run(watchdog)

    status = rank_lifecycle(info, config.method.timeout, config.connect_timeout,
                            config.argv or [], body)
    if info.world_size == 1:
        _say_one_rank(config)
    if status and runs and runs[0].wrong_cases:     # rank 0 says why, last: what a launcher reports
        raise RunFailure(_wrong_line(runs[0].wrong_total, runs[0].wrong_cases, config.output))
    if chosen[0] is not None and os.path.exists(chosen[0]):
        from ccbench.bench.output.files import say_where_records_are

        say_where_records_are(chosen[0])
    return status


#: where a library's message starts with the place in its source: [.../pair.cc:537]
_SOURCE_PLACE = re.compile(r"^\[[^\]]*\.(?:c|cc|cpp|cxx|h|hpp|cu):\d+\]\s*")


def library_message(exc: BaseException, limit: int = 160) -> str:
    """A library's error for the one line: its first line, without the place in its source,
    at most `limit` characters: its first sentences, else cut between words (marked ...)."""
    text = str(exc).strip()
    first = _SOURCE_PLACE.sub("", text.splitlines()[0]) if text else repr(exc)
    if len(first) <= limit:
        return first
    cut = first[:limit]
    sentence = cut.rfind(". ")
    if sentence >= 20:           # its first sentences, the rest being advice
        return cut[:sentence + 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > 0 else cut).rstrip(" ,;:") + " ..."


def _wrong_line(total: int, cases: list[str], output: str | None) -> str:
    """The line of a run whose results were wrong (rank 0 sees every rank's count)."""
    shown = "; ".join(cases[:3]) + (f"; {len(cases) - 3} more" if len(cases) > 3 else "")
    kept = (f"every record is kept in {output}, with its count in `wrong`" if output
            else "no records file (--no-output)")
    return (f"validation failed: {total} wrong value{'s' if total != 1 else ''} in "
            f"{len(cases)} measurement{'s' if len(cases) != 1 else ''} ({shown}); {kept}")


def _say_one_rank(config: BenchConfig) -> None:
    """A world of one rank communicates nothing (bus bandwidth 0): say so, and how to start
    more."""
    import shlex

    args = shlex.join(config.argv or [])
    print(f"ccbench: note: one rank ran, so nothing crossed between ranks (busbw 0); start "
          f"more with `ccbench launch -n 2 {args}`, or torchrun --nproc-per-node 2 -m ccbench, "
          f"mpiexec -n 2 or srun -n 2 ccbench", file=sys.stderr, flush=True)
