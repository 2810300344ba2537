"""Record every communication call a torch.distributed job issues, wherever it is issued.

A PyTorch execution trace of a gloo or CPU job does not name the process group of a call
(its group argument is written as '<Object>'), nor the reduction of an all-reduce or
reduce-scatter, and it stores the peer of a point-to-point call as a rank of its group.
Run the job under this recorder and each call also goes into `ccbench-comms.rank<r>.jsonl`
beside the trace, one JSON line per call: its op, group (global ranks), dtype, bytes,
split sizes (elements), root or peer (global ranks), reduction (ccbench's names: sum, prod,
min, max, avg), its position on the rank, whether the execution trace was recording, and
the job's own wall time for it: its issue on the host's clock (`clock_us`, microseconds
since the epoch, one clock for every rank of a host) and the time from there to its
completion on this rank (`dur_us`).

How: every torch.distributed call, from Python or from C++, reaches torch's dispatcher as
a `c10d::` operator (`c10d::allreduce_`, `c10d::_reduce_scatter_base_`, `c10d::send` ...):
`dist.all_reduce`, DDP's C++ reducer (its bucket all-reduces, the broadcasts that sync the
replicas, the all-gather that checks parameter shapes), `broadcast_object_list`'s
broadcasts, the single-tensor `all_gather_into_tensor`/`reduce_scatter_tensor`, functional
collectives (their c10d call), DTensor and FSDP2 on a DeviceMesh, `batch_isend_irecv`,
torch.distributed.pipelining. The recorder registers a kernel of its own for each c10d
operator at the ADInplaceOrView dispatch key, which every call on an ordinary tensor
passes, reads the call's arguments there (the ProcessGroup and ReduceOp objects included)
and hands it on below that key, so the execution trace still holds each call once and no
other operator comes to Python. Inside `torch.inference_mode` that key is skipped: there a
`TorchDispatchMode` records the same operators. The job's own functions are not replaced
(so `dist.P2POp(dist.isend, ...)` keeps comparing against torch's own `dist.isend`).

    python -m ccbench.formats.capture -o traces/job -- train.py --epochs 1
    torchrun --nproc-per-node 4 -m ccbench.formats.capture -o traces/job -- train.py

or in the job itself, around the traced steps:

    from ccbench.formats.capture import capture
    with capture("traces/job"):
        observer.start(); step(); observer.stop()
"""

from __future__ import annotations

import argparse
import contextlib
import json
import runpy
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ccbench.errors import error_line

__all__ = ["CAPTURE_NAME", "REDUCTIONS", "capture", "capture_file", "main"]

#: the file name, per rank, beside the trace
CAPTURE_NAME = "ccbench-comms.rank{rank}.jsonl"

#: c10d operator -> the op family ccbench reads (ccbench.formats.named)
_FAMILY: dict[str, str] = {
    "allreduce_": "allreduce", "allreduce_coalesced_": "allreduce",
    "allgather_": "allgather", "_allgather_base_": "allgather",
    "allgather_coalesced_": "allgather", "allgather_into_tensor_coalesced_": "allgather",
    "reduce_scatter_": "reduce-scatter", "_reduce_scatter_base_": "reduce-scatter",
    "reduce_scatter_tensor_coalesced_": "reduce-scatter",
    "alltoall_": "alltoall", "alltoall_base_": "alltoall", "broadcast_": "broadcast",
    "reduce_": "reduce", "gather_": "gather", "scatter_": "scatter", "barrier": "barrier",
    "monitored_barrier_": "barrier", "send": "send", "recv_": "recv",
    "recv_any_source_": "recv",
}
#: torch's ReduceOp.RedOpType values -> ccbench's names (ccbench.collectives.OPS)
REDUCTIONS = {0: "sum", 1: "avg", 2: "prod", 3: "min", 4: "max", 5: "band", 6: "bor",
              7: "bxor", 8: "premul_sum"}
#: where each operator's (output, input) tensors are among its arguments; None: none
_SIDES: dict[str, tuple[int | None, int | None]] = {
    "allreduce_": (0, 0), "allreduce_coalesced_": (0, 0), "broadcast_": (0, 0),
    "reduce_": (0, 0), "send": (None, 0), "recv_": (0, None), "recv_any_source_": (0, None),
    "scatter_": (0, 1), "barrier": (None, None), "monitored_barrier_": (None, None)}
_ROOT = {"broadcast_": 2, "reduce_": 3, "gather_": 3, "scatter_": 3}
_PEER = {"send": 2, "recv_": 2}
#: functional collectives (torch.distributed._functional_collectives, DTensor): their c10d
#: call is made inside torch's kernel, where the recorder does not see it; recorded here
_FUNCTIONAL: dict[str, str] = {
    "all_reduce": "allreduce", "all_reduce_coalesced": "allreduce",
    "all_gather_into_tensor": "allgather", "all_gather_into_tensor_coalesced": "allgather",
    "reduce_scatter_tensor": "reduce-scatter",
    "reduce_scatter_tensor_coalesced": "reduce-scatter", "all_to_all_single": "alltoall",
    "broadcast": "broadcast"}
#: the functional collectives' reduction names -> ccbench's
_FUNCTIONAL_REDUCTIONS = {"product": "prod", "premul_sum": "premul_sum"}


def capture_file(folder: str | Path, rank: int) -> Path:
    return Path(folder) / CAPTURE_NAME.format(rank=rank)


def _tensors(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return [value] if hasattr(value, "numel") else []


def _nbytes(value: Any) -> int:
    return sum(int(t.numel() * t.element_size()) for t in _tensors(value))


def _dtype(*values: Any) -> str | None:
    for value in values:
        for tensor in _tensors(value):
            return str(tensor.dtype).removeprefix("torch.")
    return None


def _rows(tensor: Any) -> int:
    """Elements per dim-0 row: all_to_all_single's split sizes count rows."""
    if not hasattr(tensor, "dim") or tensor.dim() == 0 or not tensor.shape[0]:
        return 1
    return int(tensor.numel() // tensor.shape[0])


def _script_type(value: Any) -> str:
    try:
        return str(value._type().qualified_name()).rsplit(".", 1)[-1]
    except (AttributeError, RuntimeError):
        return ""


def _describe(dist: Any, name: str, args: tuple[Any, ...]) -> dict[str, Any]:
    """One call's entry, from the c10d operator's arguments (schemas of torch 2.x)."""
    pg_arg = next(a for a in args if _script_type(a) == "ProcessGroup")
    group = dist.ProcessGroup.unbox(pg_arg)
    ranks = [int(r) for r in dist.get_process_group_ranks(group)]
    entry: dict[str, Any] = {"op": _FAMILY[name], "call": f"c10d::{name}", "group": sorted(ranks)}
    out_at, in_at = _SIDES.get(name, (0, 1))
    got = args[out_at] if out_at is not None else None
    sent = args[in_at] if in_at is not None else None
    entry["dtype"] = _dtype(sent, got)
    entry["in_bytes"], entry["out_bytes"] = _nbytes(sent), _nbytes(got)
    reduce_op = next((a for a in args if _script_type(a) == "ReduceOp"), None)
    if reduce_op is not None:
        code = int(reduce_op.op())
        entry["reduce_op"] = REDUCTIONS.get(code, str(code))
    if name in _ROOT:
        entry["root"] = ranks[int(args[_ROOT[name]])]
    if name in _PEER:
        entry["peer"] = ranks[int(args[_PEER[name]])]
    if name == "alltoall_base_":
        n = len(ranks)
        for side, tensor, splits in (("in_splits", args[1], args[4]),
                                     ("out_splits", args[0], args[3])):
            entry[side] = [int(s) * _rows(tensor) for s in splits] if splits \
                else [int(tensor.numel()) // n] * n
    if name == "alltoall_":
        entry["in_splits"] = [int(t.numel()) for t in _tensors(sent)]
        entry["out_splits"] = [int(t.numel()) for t in _tensors(got)]
    return entry


def _describe_functional(dist: Any, name: str, args: tuple[Any, ...]) -> dict[str, Any]:
    """A functional collective's entry (schemas of torch 2.x: the group by name, last)."""
    group = dist.distributed_c10d._resolve_process_group(args[-1])
    ranks = [int(r) for r in dist.get_process_group_ranks(group)]
    n = len(ranks)
    sent = args[0]
    in_bytes = _nbytes(sent)
    out_bytes = {"all_gather_into_tensor": in_bytes * n,
                 "all_gather_into_tensor_coalesced": in_bytes * n,
                 "reduce_scatter_tensor": in_bytes // n,
                 "reduce_scatter_tensor_coalesced": in_bytes // n}.get(name, in_bytes)
    entry: dict[str, Any] = {"op": _FUNCTIONAL[name], "call": f"_c10d_functional::{name}",
                             "group": sorted(ranks), "dtype": _dtype(sent),
                             "in_bytes": in_bytes, "out_bytes": out_bytes}
    if name.startswith(("all_reduce", "reduce_scatter")):
        entry["reduce_op"] = _FUNCTIONAL_REDUCTIONS.get(str(args[1]), str(args[1]))
    if name == "broadcast":
        entry["root"] = ranks[int(args[1])]
    if name == "all_to_all_single":
        rows = _rows(sent)
        out_splits = [int(s) * rows for s in args[1]] or [in_bytes // sent.element_size() // n] * n
        in_splits = [int(s) * rows for s in args[2]] or [in_bytes // sent.element_size() // n] * n
        entry.update(in_splits=in_splits, out_splits=out_splits,
                     out_bytes=sum(out_splits) * sent.element_size())
    return entry


class _Log:
    """Entries in issue order; each line is written once it and every earlier call have
    completed (their times known), the rest at the end."""

    def __init__(self, path: Path) -> None:
        self.handle = path.open("a", encoding="utf-8")
        self.lock = threading.Lock()
        self.pending: list[dict[str, Any]] = []
        self.done: set[int] = set()
        self.seq = 0
        self.origin = time.perf_counter()
        self.traced = False
        # Works without a future, until the job waits: id -> (work, entry, returned at)
        self.unwaited: dict[int, tuple[Any, dict[str, Any], float]] = {}

    def add(self, entry: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            entry["seq"] = self.seq
            entry["traced"] = self.traced
            self.seq += 1
            self.pending.append(entry)
        return entry

    def finish(self, entry: dict[str, Any], end: float, how: str) -> None:
        with self.lock:
            entry["dur_us"] = round((end - self.origin) * 1e6 - entry["start_us"], 3)
            entry["timed_to"] = how
            self.done.add(entry["seq"])
            self._flush(everything=False)

    def _flush(self, everything: bool) -> None:
        while self.pending and (everything or self.pending[0]["seq"] in self.done):
            entry = self.pending.pop(0)
            self.done.discard(entry["seq"])
            self.handle.write(json.dumps(entry) + "\n")
        self.handle.flush()

    def close(self) -> None:
        for _, entry, returned in list(self.unwaited.values()):
            self.finish(entry, returned, "return")
        self.unwaited.clear()
        with self.lock:
            self._flush(everything=True)
            self.handle.close()


def _watch(log: _Log, entry: dict[str, Any], result: Any, dist: Any) -> None:
    """The call's end: when its Work completes (gloo runs it on its own threads); for a
    Work without a future (gloo's send/recv, reduce-scatter) when the job's wait on it
    returns (or, never waited for from Python, when the operator returned)."""
    returned = time.perf_counter()
    works = [r for r in (result if isinstance(result, (tuple, list)) else (result,))
             if _script_type(r) == "Work"]
    if not works:
        log.finish(entry, returned, "return")
        return
    work = dist.distributed_c10d.Work.unbox(works[0])
    try:
        future = work.get_future()
    except RuntimeError:
        with log.lock:
            log.unwaited[id(work)] = (work, entry, returned)
        return
    future.add_done_callback(lambda _: log.finish(entry, time.perf_counter(), "completion"))


@contextlib.contextmanager
def _waits(dist: Any, log: _Log) -> Iterator[None]:
    """Work.wait, timed: the end of a call whose Work has no future."""
    work_class = dist.distributed_c10d.Work
    wait = work_class.wait

    def timed_wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = wait(self, *args, **kwargs)
        with log.lock:
            held = log.unwaited.pop(id(self), None)
        if held is not None:
            log.finish(held[1], time.perf_counter(), "wait")
        return result

    work_class.wait = timed_wait
    try:
        yield
    finally:
        work_class.wait = wait


def _first_tensor(value: Any) -> Any:
    tensors = _tensors(value)
    return tensors[0] if tensors else None


def _call_once(func: Any, args: Any, kwargs: dict[str, Any], after: Any) -> Any:
    """Run the operator below the dispatch key `after`: `func(*args)` would dispatch it
    again from the top, and the execution trace (its RecordFunction) would hold it twice."""
    import torch

    tensor = _first_tensor(args)
    if tensor is None or type(tensor) is not torch.Tensor:
        return func(*args, **kwargs)
    below = torch._C._dispatch_keyset_full_after(after)
    return func.redispatch(torch._C._dispatch_keys(tensor) & below, *args, **kwargs)


def _record(dist: Any, log: _Log, name: str, args: tuple[Any, ...], functional: bool,
            call: Callable[[], Any]) -> Any:
    """One call: its entry, then the call itself, timed."""
    entry = log.add(_entry(dist, name, args, functional))
    entry["clock_us"] = time.time_ns() / 1e3      # the host's clock: the ranks' issues compare
    entry["start_us"] = round((time.perf_counter() - log.origin) * 1e6, 3)
    result = call()
    if functional:      # its Work stays inside torch: the time to issue it
        log.finish(entry, time.perf_counter(), "return")
    else:
        _watch(log, entry, result, dist)
    return result


def _entry(dist: Any, name: str, args: tuple[Any, ...], functional: bool) -> dict[str, Any]:
    try:
        return _describe_functional(dist, name, args) if functional \
            else _describe(dist, name, args)
    except Exception as exc:  # noqa: BLE001  the job's call must run whatever we make of it
        family = (_FUNCTIONAL if functional else _FAMILY)[name]
        return {"op": family, "call": name, "error": f"not described: {exc}"}


@contextlib.contextmanager
def _c10d_kernels(dist: Any, log: _Log) -> Iterator[None]:
    """A kernel of ours for every c10d operator at the ADInplaceOrView dispatch key, which
    every call on an ordinary tensor passes (none is registered there by torch): it records
    the call and hands it on below that key. Only the communication operators come to
    Python; every thread's calls come (DDP's, gloo's, the job's own threads)."""
    import torch

    library = torch.library.Library("c10d", "IMPL")
    view = torch._C.DispatchKey.ADInplaceOrView

    def kernel_of(name: str) -> Callable[..., Any]:
        op = getattr(torch.ops.c10d, name).default
        below = torch._C._dispatch_keyset_full_after(view)

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            return _record(dist, log, name, args, False,
                           lambda: op.redispatch(keyset & below, *args, **kwargs))

        return kernel

    for name in _FAMILY:
        library.impl(name, kernel_of(name), "ADInplaceOrView", with_keyset=True)
    try:
        yield
    finally:
        library._destroy()


def _recorder(dist: Any, log: _Log) -> Any:
    """Inside torch.inference_mode the ADInplaceOrView key is skipped: there a dispatch
    mode records the c10d and functional operators (it sees every operator, so it is
    entered only there)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            name = func.__name__.split(".")[0]
            functional = func.namespace == "_c10d_functional"
            if name not in (_FUNCTIONAL if functional else _FAMILY) or \
                    func.namespace not in ("c10d", "_c10d_functional"):
                return func(*args, **kwargs)
            after = torch._C.DispatchKey.Python if functional \
                else torch._C.DispatchKey.ADInplaceOrView
            return _record(dist, log, name, tuple(args), functional,
                           lambda: _call_once(func, args, kwargs, after))

    return Recorder()


@contextlib.contextmanager
def _inference_mode(dist: Any, log: _Log) -> Iterator[None]:
    """torch.inference_mode, entered by the job, also enters the recorder's dispatch mode."""
    from torch.autograd import grad_mode

    cls = grad_mode.inference_mode
    enter, leave = cls.__enter__, cls.__exit__

    def entered(self: Any) -> None:
        enter(self)
        if self.mode:
            self._ccbench_recorder = _recorder(dist, log)
            self._ccbench_recorder.__enter__()

    def left(self: Any, *exc: Any) -> None:
        recorder = self.__dict__.pop("_ccbench_recorder", None)
        if recorder is not None:
            recorder.__exit__(*exc)
        leave(self, *exc)

    cls.__enter__, cls.__exit__ = entered, left  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.__enter__, cls.__exit__ = enter, leave  # type: ignore[method-assign]


@contextlib.contextmanager
def _trace_window(log: _Log) -> Iterator[None]:
    """Mark the calls made while torch's ExecutionTraceObserver records: the trace holds
    those, and only those (calls before its start and after its stop are passed over)."""
    from torch.profiler import ExecutionTraceObserver

    start, stop = ExecutionTraceObserver.start, ExecutionTraceObserver.stop

    def started(self: Any) -> Any:
        result = start(self)
        log.traced = True
        return result

    def stopped(self: Any) -> Any:
        log.traced = False
        return stop(self)

    ExecutionTraceObserver.start, ExecutionTraceObserver.stop = started, stopped  # type: ignore[method-assign]
    try:
        yield
    finally:
        ExecutionTraceObserver.start, ExecutionTraceObserver.stop = start, stop  # type: ignore[method-assign]


@contextlib.contextmanager
def capture(folder: str | Path) -> Iterator[Path]:
    """Inside: every communication call of this process, from Python or C++, on any thread,
    is also written, one JSON line, to
    `folder`/ccbench-comms.rank<r>.jsonl (r: the caller's global rank). The process group
    must be initialised before entering."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("ccbench.formats.capture: initialise torch.distributed first")
    path = capture_file(folder, dist.get_rank())
    path.parent.mkdir(parents=True, exist_ok=True)
    log = _Log(path)
    try:
        with _trace_window(log), _waits(dist, log), _c10d_kernels(dist, log), \
                _inference_mode(dist, log):
            yield path
    finally:
        log.close()


def _install_at_init(folder: str) -> None:
    """For `-m ccbench.formats.capture -- job.py`: start capturing once the job has called
    init_process_group, and stop at destroy_process_group (or at exit)."""
    import atexit

    import torch.distributed as dist

    state: dict[str, Any] = {}
    init, destroy = dist.init_process_group, dist.destroy_process_group

    def start(*args: Any, **kwargs: Any) -> Any:
        result = init(*args, **kwargs)
        if "ctx" not in state:
            state["ctx"] = capture(folder)
            state["ctx"].__enter__()
        return result

    def stop(*args: Any, **kwargs: Any) -> Any:
        if "ctx" in state:
            state.pop("ctx").__exit__(None, None, None)
        return destroy(*args, **kwargs)

    dist.init_process_group, dist.destroy_process_group = start, stop
    end: Callable[[], Any] = lambda: state.pop("ctx").__exit__(None, None, None) \
        if "ctx" in state else None  # noqa: E731
    atexit.register(end)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ccbench.formats.capture",
        description="run a torch.distributed job, writing each communication call's group, "
                    "op, splits, root and reduction beside its execution trace")
    parser.add_argument("-o", "--output", required=True,
                        help="folder of the job's execution trace files (rank<r>.json)")
    parser.add_argument("script", help="the job: a Python file, then its arguments after --")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the job's arguments")
    options = parser.parse_args(argv)
    script = Path(options.script)
    if not script.is_file():
        print(error_line(f"no such job script: {str(script)!r}"), file=sys.stderr)
        return 2
    _install_at_init(options.output)
    sys.argv = [str(script), *options.args]
    sys.path.insert(0, str(script.resolve().parent))
    runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
