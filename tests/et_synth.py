"""Small PyTorch execution traces written as torch 2.13 writes them for gloo (checked
against an ExecutionTraceObserver trace of a 2-D job: each call's process group an
'<Object>', a send's or recv's peer a rank of that group, the `## process_group:init ##`
node listing the groups that hold the rank), for tests that need a shape no recorded
fixture has."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCHEMA = "1.1.1-chakra.0.0.4"
_TYPE = {"float32": "float", "bfloat16": "c10::BFloat16", "int64": "long int"}
_SIZE = {"float32": 4, "bfloat16": 2, "int64": 8}


def _tensor(tid: int, count: int, dtype: str) -> list[Any]:
    return [tid, tid, 0, count, _SIZE[dtype], "cpu"]


def _node(nid: int, call: dict[str, Any]) -> dict[str, Any]:
    """One c10d node: call = {"op": allreduce|broadcast|send|recv|barrier|alltoallv|scatter,
    "count", "dtype", "root"/"peer" (group-local), "in_splits"/"out_splits" (rows),
    "blocks" (scatter: the root's list)}."""
    op, count, dtype = call["op"], call.get("count", 4), call.get("dtype", "float32")
    ttype = f"Tensor({_TYPE[dtype]})"
    tlist = f"GenericList[{ttype}]"
    t = _tensor(nid, count, dtype)
    if op == "allreduce":
        name, values = "c10d::allreduce_", [[t], "<Object>", "<Object>", "<None>", False, -1]
        types = [tlist, "Object", "Object", "None", "Bool", "Int"]
    elif op == "broadcast":
        name, values = "c10d::broadcast_", [[t], "<Object>", call.get("root", 0), 0, False, -1]
        types = [tlist, "Object", "Int", "Int", "Bool", "Int"]
    elif op in ("send", "recv"):
        name = "c10d::send" if op == "send" else "c10d::recv_"
        values, types = [[t], "<Object>", call["peer"], 0], [tlist, "Object", "Int", "Int"]
    elif op == "scatter":               # the root passes one tensor per member
        name = "c10d::scatter_"
        blocks = [_tensor(nid + 1 + i, count, dtype) for i in range(call.get("blocks", 0))]
        values = [[t], [blocks] if blocks else [], "<Object>", call["root"], False, -1]
        types = [tlist, f"GenericList[GenericList[{ttype}]]" if blocks else "GenericList[]",
                 "Object", "Int", "Bool", "Int"]
    elif op == "barrier":
        name = "c10d::barrier"
        values = [_tensor(nid, 1, "float32"), "<Object>", [], False, -1]
        types = ["Tensor(unsigned char)", "Object", "GenericList[]", "Bool", "Int"]
    elif op == "alltoallv":
        out_rows, in_rows = call["out_splits"], call["in_splits"]
        name = "c10d::alltoall_base_"
        values = [_tensor(nid, sum(out_rows) * count, dtype), _tensor(nid + 1, sum(in_rows)
                                                                     * count, dtype),
                  "<Object>", out_rows, in_rows, False, -1]
        types = [ttype, ttype, "Object", "GenericList[Int]", "GenericList[Int]", "Bool", "Int"]
    else:
        raise ValueError(op)
    return {"id": nid, "name": name, "ctrl_deps": 1,
            "inputs": {"values": values, "types": types}, "attrs": []}


def write_et(folder: Path, calls: list[list[dict[str, Any]]],
             groups: list[list[int]] = ()) -> Path:
    """rank<r>.json for every rank r of `calls` (each rank's calls in order); `groups`: the
    process groups the job made besides the world (each rank's file declares those that
    hold it, as torch does)."""
    folder.mkdir(parents=True, exist_ok=True)
    world = len(calls)
    for rank, rank_calls in enumerate(calls):
        table = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [], "group_size": world,
                  "group_count": len(groups) + 1}]
        table += [{"pg_name": str(i + 1), "pg_desc": "undefined", "ranks": list(g),
                   "group_size": len(g), "group_count": len(groups) + 1}
                  for i, g in enumerate(groups) if rank in g]
        nodes = [{"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 0,
                  "inputs": {"values": [], "types": []}, "attrs": []},
                 {"id": 2, "name": "## process_group:init ##", "ctrl_deps": 1,
                  "inputs": {"values": [json.dumps(table)], "types": ["String"]},
                  "attrs": []}]
        nodes += [_node(10 + 2 * i, call) for i, call in enumerate(rank_calls)]
        (folder / f"rank{rank}.json").write_text(json.dumps({"schema": SCHEMA, "nodes": nodes}))
    return folder
