"""Record what an execution trace leaves out of a job's communication calls.

A PyTorch execution trace of a gloo or CPU job does not name the process group of a call
(its group argument is written as '<Object>'), nor the reduction of an all-reduce or
reduce-scatter. Run the job with its torch.distributed calls wrapped, and each call also
goes into `ccbench-comms.rank<r>.jsonl` beside the trace: its op, group ranks, dtype, bytes,
split sizes (elements), root or peer (global ranks) and reduction, one JSON line per call.
`ccbench replay` and `simulate --trace` read that file when it lies beside the trace files
and then take each op's group (group_source "named") and reduction from it.

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
import functools
import json
import runpy
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ccbench.errors import error_line

__all__ = ["CAPTURE_NAME", "capture", "capture_file", "main"]

#: the file name, per rank, beside the trace
CAPTURE_NAME = "ccbench-comms.rank{rank}.jsonl"

# torch.distributed function -> (the c10d op family it becomes, argument names)
_WRAPPED: dict[str, str] = {
    "all_reduce": "allreduce", "all_gather_into_tensor": "allgather",
    "all_gather": "allgather", "reduce_scatter_tensor": "reduce-scatter",
    "reduce_scatter": "reduce-scatter", "all_to_all_single": "alltoall",
    "all_to_all": "alltoall", "broadcast": "broadcast", "reduce": "reduce",
    "gather": "gather", "scatter": "scatter", "barrier": "barrier", "send": "send",
    "recv": "recv", "isend": "send", "irecv": "recv",
}


def capture_file(folder: str | Path, rank: int) -> Path:
    return Path(folder) / CAPTURE_NAME.format(rank=rank)


def _nbytes(value: Any) -> int:
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return int(value.numel() * value.element_size()) if hasattr(value, "numel") else 0


def _dtype(*values: Any) -> str | None:
    for value in values:
        if isinstance(value, (list, tuple)) and value:
            value = value[0]
        if hasattr(value, "dtype"):
            return str(value.dtype).removeprefix("torch.")
    return None


def _reduce_name(op: Any) -> str:
    text = str(getattr(op, "name", None) or op).rsplit(".", 1)[-1]
    return text.lower() if text else "sum"


def _row(tensor: Any) -> int:
    """Elements per dim-0 row: all_to_all_single's split sizes count rows."""
    if tensor is None or not hasattr(tensor, "numel") or tensor.dim() == 0 or not tensor.shape[0]:
        return 1
    return int(tensor.numel() // tensor.shape[0])


def _describe(dist: Any, name: str, bound: dict[str, Any]) -> dict[str, Any]:
    """One call's entry, from its bound arguments (torch.distributed's own names)."""
    group = bound.get("group")
    ranks = list(dist.get_process_group_ranks(group)) if group is not None \
        else list(range(dist.get_world_size()))
    entry: dict[str, Any] = {"op": _WRAPPED[name], "call": name, "group": sorted(ranks)}
    tensors_in = {"all_reduce": "tensor", "broadcast": "tensor", "reduce": "tensor",
                  "send": "tensor", "isend": "tensor", "gather": "tensor",
                  "scatter": "scatter_list", "all_gather": "tensor",
                  "all_gather_into_tensor": "input_tensor", "reduce_scatter": "input_list",
                  "reduce_scatter_tensor": "input", "all_to_all_single": "input",
                  "all_to_all": "input_tensor_list"}
    tensors_out = {"all_reduce": "tensor", "broadcast": "tensor", "reduce": "tensor",
                   "recv": "tensor", "irecv": "tensor", "gather": "gather_list",
                   "scatter": "tensor", "all_gather": "tensor_list",
                   "all_gather_into_tensor": "output_tensor", "reduce_scatter": "output",
                   "reduce_scatter_tensor": "output", "all_to_all_single": "output",
                   "all_to_all": "output_tensor_list"}
    sent: Any = bound.get(tensors_in.get(name, ""))
    got: Any = bound.get(tensors_out.get(name, ""))
    entry["dtype"] = _dtype(sent, got)
    entry["in_bytes"], entry["out_bytes"] = _nbytes(sent), _nbytes(got)
    if name in ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor"):
        entry["reduce_op"] = _reduce_name(bound.get("op", "sum"))
    root = next((bound[k] for k in ("src", "dst") if bound.get(k) is not None), None)
    if root is None:
        local = next((bound[k] for k in ("group_src", "group_dst") if bound.get(k) is not None),
                     None)
        root = ranks[local] if local is not None else None
    if name in ("send", "recv", "isend", "irecv"):
        entry["peer"] = root
    elif root is not None:
        entry["root"] = root
    if name == "all_to_all_single":
        rows_in, rows_out = _row(sent), _row(got)
        split_in, split_out = bound.get("input_split_sizes"), bound.get("output_split_sizes")
        n = len(ranks)
        entry["in_splits"] = [int(s) * rows_in for s in split_in] if split_in \
            else [int(sent.numel()) // n] * n
        entry["out_splits"] = [int(s) * rows_out for s in split_out] if split_out \
            else [int(got.numel()) // n] * n
    if name == "all_to_all":
        entry["in_splits"] = [int(t.numel()) for t in sent]
        entry["out_splits"] = [int(t.numel()) for t in got]
    return entry


def _wrap(dist: Any, name: str, original: Callable[..., Any],
          write: Callable[[dict[str, Any]], None]) -> Callable[..., Any]:
    import inspect

    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            entry = _describe(dist, name, dict(bound.arguments))
        except Exception as exc:  # noqa: BLE001  the job's call must run whatever we make of it
            entry = {"op": _WRAPPED[name], "call": name, "error": f"not described: {exc}"}
        write(entry)
        return original(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def capture(folder: str | Path) -> Iterator[Path]:
    """Inside: every torch.distributed call this module wraps is also written, one JSON line,
    to `folder`/ccbench-comms.rank<r>.jsonl (r: the caller's global rank). The process group
    must be initialised before entering."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("ccbench.formats.capture: initialise torch.distributed first")
    path = capture_file(folder, dist.get_rank())
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a", encoding="utf-8")

    def write(entry: dict[str, Any]) -> None:
        handle.write(json.dumps(entry) + "\n")
        handle.flush()

    saved = {name: getattr(dist, name) for name in _WRAPPED if hasattr(dist, name)}
    for name, original in saved.items():
        setattr(dist, name, _wrap(dist, name, original, write))
    try:
        yield path
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)
        handle.close()


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
    atexit.register(lambda: state.pop("ctx").__exit__(None, None, None) if "ctx" in state
                    else None)


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
