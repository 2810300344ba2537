"""PyTorch execution traces (torch.profiler.ExecutionTraceObserver JSON, one file per rank).

A comm op is a `c10d::<op>` node: the dispatcher call the Python API makes (the backend's
own child node, `gloo:all_reduce` or `nccl:all_reduce`, is the same call and is not counted
again). NCCL traces add `record_param_comms` nodes under it, which name the process group;
gloo traces do not, and the group is then matched across ranks (ccbench.trace.groups).
Tensor values are [tensor id, storage id, offset, numel, element bytes, device].
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ccbench.collectives import every
from ccbench.safeio import check_json_depth, json_too_deep, read_input
from ccbench.trace.ops import CommOp, Group, TraceError

__all__ = ["KNOWN_SCHEMAS", "parse_pytorch_et", "read_json"]

RawJson = dict[str, Any]   # a user's execution trace (or one node of it) before validation

#: schema versions this reader was checked against (1.0.x: torch 2.1-2.3; 1.1.x: 2.4 on)
KNOWN_SCHEMAS = re.compile(r"^1\.(0\.[1-4]|1\.[0-9])(-chakra\.0\.0\.4)?$")

_DTYPES = {"float": "float32", "double": "float64", "c10::Half": "float16",
           "c10::BFloat16": "bfloat16", "int": "int32", "signed char": "int8",
           "long int": "int64", "unsigned char": "uint8", "bool": "bool", "short int": "int16"}

# c10d op -> collective: the registry's (`Collective.trace.c10d`), and the ops ccbench replays
# without measuring them
_TRACE_ONLY: dict[str, str] = {
    "c10d::gather_": "gather", "c10d::scatter_": "scatter", "c10d::barrier": "barrier",
    "c10d::monitored_barrier_": "barrier", "c10d::send": "send", "c10d::recv_": "recv",
    "c10d::recv_any_source_": "recv",
}
_OPS: dict[str, str] = {**_TRACE_ONLY, **{op: c.name for c in every() for op in c.trace.c10d}}
_ROOT_ARG = {"c10d::broadcast_": 2, "c10d::reduce_": 3, "c10d::gather_": 3, "c10d::scatter_": 3}
_PEER_ARG = {"c10d::send": 2, "c10d::recv_": 2}


def read_json(path: Path) -> RawJson:
    try:
        raw = read_input(path)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(path, f"cannot read the trace ({exc})") from None
    check_json_depth(raw, str(path))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        truncated = exc.pos >= len(text.rstrip()) - 1
        hint = ("; the job probably ended before its ExecutionTraceObserver finished the "
                "file: call observer.stop() and observer.unregister_callback() after the "
                "traced steps" if truncated else "")
        raise TraceError(path, f"{'truncated' if truncated else 'malformed'} JSON at line "
                               f"{exc.lineno} column {exc.colno} ({exc.msg}){hint}") from None
    if not isinstance(data, dict):
        raise TraceError(path, "not a PyTorch execution trace (top level is not an object)")
    return data


def _tensors(value: Any) -> list[list[Any]]:
    """Every tensor record inside an argument (tensors, lists of them, lists of lists)."""
    if isinstance(value, list) and len(value) == 6 and isinstance(value[3], int) \
            and isinstance(value[5], str):
        return [value]
    if isinstance(value, list):
        return [t for item in value for t in _tensors(item)]
    return []


def _dtype(types: list[str], path: Path, node: int) -> str:
    for text in types:
        match = re.search(r"Tensor\(([^)]*)\)", text)
        if match:
            name = match.group(1)
            return _DTYPES.get(name, name)
    raise TraceError(path, "comm op without a tensor argument", node)


def _numel(value: Any) -> tuple[int, int]:
    tensors = _tensors(value)
    return sum(int(t[3]) for t in tensors), max((int(t[4]) for t in tensors), default=0)


def _ints(value: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in value) if isinstance(value, list) else ()


def _rows_to_elements(splits: tuple[int, ...], count: int) -> tuple[int, ...]:
    rows = sum(splits)
    if not splits or rows == 0 or count % rows:
        return splits
    return tuple(s * (count // rows) for s in splits)


def _attr(node: RawJson, name: str) -> Any:
    for attr in node.get("attrs", []):
        if attr.get("name") == name:
            return attr.get("value")
    return node.get(name)


def _comm_op(node: RawJson, rank: int, index: int, path: Path) -> CommOp:
    name, node_id = node["name"], int(node["id"])
    args = node.get("inputs", {}).get("values", [])
    types = node.get("inputs", {}).get("types", [])
    collective = _OPS[name]
    if collective == "barrier":
        return CommOp(rank=rank, index=index, node_id=node_id, name=name, collective="barrier",
                      dtype="uint8", elsize=1, in_bytes=0, out_bytes=0, source=str(path),
                      async_op=bool(args[3]) if len(args) > 3 else False)
    dtype = _dtype(types, path, node_id)
    # layout of the arguments: (outputs first | inputs first) as the c10d schema declares
    if name in ("c10d::allreduce_", "c10d::allreduce_coalesced_", "c10d::broadcast_",
                "c10d::reduce_", "c10d::send", "c10d::recv_", "c10d::recv_any_source_"):
        count, elsize = _numel(args[0])
        in_count = out_count = count
    elif name in ("c10d::scatter_",):
        out_count, elsize = _numel(args[0])
        in_count, _ = _numel(args[1])
    else:          # (output, input, ...) : allgather, reduce_scatter, alltoall, gather
        out_count, elsize = _numel(args[0])
        in_count, in_el = _numel(args[1])
        elsize = elsize or in_el
    if name == "c10d::send":
        out_count = 0
    if name in ("c10d::recv_", "c10d::recv_any_source_"):
        in_count = 0
    op = CommOp(rank=rank, index=index, node_id=node_id, name=name, collective=collective,
                dtype=dtype, elsize=elsize, in_bytes=in_count * elsize,
                out_bytes=out_count * elsize, source=str(path))
    if name in _ROOT_ARG:
        op.root = int(args[_ROOT_ARG[name]])
    if name in _PEER_ARG:
        op.peer = int(args[_PEER_ARG[name]])
    if name == "c10d::recv_any_source_":
        op.peer = -1
    if name == "c10d::alltoall_base_":
        op.out_splits, op.in_splits = _ints(args[3]), _ints(args[4])
    if name == "c10d::alltoall_":
        op.out_splits = tuple(int(t[3]) for t in _tensors(args[0]))
        op.in_splits = tuple(int(t[3]) for t in _tensors(args[1]))
    if name == "c10d::alltoall_base_":         # splits count rows (dim 0): make them elements
        op.in_splits = _rows_to_elements(op.in_splits, in_count)
        op.out_splits = _rows_to_elements(op.out_splits, out_count)
    if (op.in_splits and len(set(op.in_splits)) > 1) or \
            (op.out_splits and len(set(op.out_splits)) > 1):
        op.collective = "alltoallv"
    flags = [a for a, t in zip(args, types, strict=False) if t == "Bool"]
    op.async_op = bool(flags[-1]) if flags else False
    return op


def _param_comms(node: RawJson) -> RawJson:
    """What a record_param_comms node (NCCL traces) says about its call: attributes pg_name,
    pg_size, global_rank_start, global_rank_stride, collective_name, dtype."""
    return {str(a.get("name")): a.get("value") for a in node.get("attrs", [])
            if isinstance(a, dict)}


_MAX_GROUP = 1 << 24         # ranks in a group at most, as a record's world_size


def _group_of(info: RawJson, groups: dict[str, Group]) -> Group | None:
    name = info.get("pg_name")
    if name is not None and str(name) in groups:
        return groups[str(name)]
    size, start, stride = (info.get(k) for k in ("pg_size", "global_rank_start",
                                                 "global_rank_stride"))
    if isinstance(size, int) and isinstance(start, int) and isinstance(stride, int) \
            and 0 < size <= _MAX_GROUP:
        ranks = tuple(start + stride * i for i in range(size))
        return Group(str(name if name is not None else ranks), ranks)
    return None


def _pg_table(nodes: list[RawJson], world: int) -> dict[str, Group]:
    """Process groups from the `## process_group:init ##` node (torch 2.2 on)."""
    groups: dict[str, Group] = {}
    for node in nodes:
        if node.get("name") != "## process_group:init ##":
            continue
        for value in node.get("inputs", {}).get("values", []):
            try:
                deep = isinstance(value, str) and json_too_deep(value.encode("utf-8"))
                entries = json.loads(value) if isinstance(value, str) and not deep else []
            except json.JSONDecodeError:
                continue
            for entry in entries if isinstance(entries, list) else []:
                ranks = tuple(sorted(int(r) for r in entry.get("ranks") or range(world)))
                size = entry.get("group_size", entry.get("pg_size"))
                if isinstance(size, int) and not entry.get("ranks") and size != world:
                    continue            # a group whose members the trace does not list
                groups[str(entry.get("pg_name"))] = Group(str(entry.get("pg_name")), ranks)
    return groups


def parse_pytorch_et(path: Path, rank: int, world: int, data: RawJson | None = None
                     ) -> tuple[list[CommOp], dict[str, Group], str]:
    """(this rank's comm ops in issue order, the process groups the file declares, schema)."""
    data = read_json(path) if data is None else data
    schema = str(data.get("schema", ""))
    if not KNOWN_SCHEMAS.match(schema):
        raise TraceError(path, f"unknown execution trace schema version {schema!r} "
                               f"(this ccbench reads 1.0.1 to 1.1.x, e.g. '1.1.1-chakra.0.0.4')")
    nodes = data.get("nodes")
    if not isinstance(nodes, list):
        raise TraceError(path, "no 'nodes' list: not a PyTorch execution trace")
    try:
        nodes = sorted(nodes, key=lambda n: int(n["id"]))
        by_parent: dict[int, list[RawJson]] = {}
        for node in nodes:
            by_parent.setdefault(int(node.get("ctrl_deps", -1)), []).append(node)
        groups = _pg_table(nodes, world)
        ops: list[CommOp] = []
        for node in nodes:
            if node.get("name") not in _OPS:
                continue
            try:
                op = _comm_op(node, rank, len(ops), path)
            except (IndexError, KeyError, TypeError, ValueError) as exc:
                raise TraceError(path, f"malformed {node.get('name')} arguments ({exc})",
                                 int(node["id"])) from None
            for child in by_parent.get(op.node_id, []):
                if child.get("name") == "record_param_comms":
                    group = _group_of(_param_comms(child), groups)
                    if group is not None:
                        op.group, op.group_source = group, "named"
            start, dur = _attr(node, "ts"), _attr(node, "dur")
            if isinstance(start, (int, float)) and isinstance(dur, (int, float)):
                op.start_us, op.dur_us = float(start), float(dur)
            ops.append(op)
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceError(path, f"malformed node ({exc})") from None
    return ops, groups, schema
