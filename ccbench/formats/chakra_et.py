"""Chakra execution traces (.et, gzip or not; one file per rank, `<prefix>.<rank>.et`).

A comm op is a COMM_COLL_NODE, COMM_SEND_NODE or COMM_RECV_NODE. Sizes follow ASTRA-sim's
reading of comm_size (ANCHORS.md): the per-rank shard for all-gather, the whole buffer for
the other collectives. The other side of an all-gather or reduce-scatter depends on its
group's size, which the node does not carry: it is left 0 here and set when the op is
matched to its group (ccbench.trace.groups). A node's `pg_name` names its group in
ASTRA-sim's communicator-group file (`comm_groups.json` beside the traces, as
`ccbench export astra-sim --trace` writes it: {"1": [ranks], ...}); without it, an op
runs on the world. Chakra records no element type: ops are taken as float32 when the size
allows, else as bytes (int8), and say so in their notes.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from ccbench.collectives import ROOTED, every
from ccbench.errors import UsageError
from ccbench.trace.ops import CommOp, Group, TraceError

__all__ = ["parse_chakra_et", "read_comm_groups"]


def read_comm_groups(path: Path, world: int) -> dict[str, Group]:
    """ASTRA-sim's communicator-group file: {"<id>": [ranks], ...}."""
    from ccbench.safeio import load_json

    try:
        data = load_json(path)
    except (OSError, ValueError) as exc:
        raise TraceError(path, f"not a communicator-group file ({exc})") from None
    if not isinstance(data, dict):
        raise TraceError(path, "not a communicator-group file (expected {\"<id>\": [ranks]})")
    groups: dict[str, Group] = {}
    for name, ranks in data.items():
        if not isinstance(ranks, list) or not all(isinstance(r, int) for r in ranks) \
                or not ranks or any(not 0 <= r < world for r in ranks):
            raise TraceError(path, f"group {name!r}: ranks {ranks!r} are not ranks of a world "
                                   f"of {world}")
        groups[str(name)] = Group(str(name), tuple(sorted(ranks)))
    return groups

#: Chakra's collective types ccbench replays without measuring them
_TRACE_ONLY = {"GATHER": "gather", "SCATTER": "scatter", "REDUCE_SCATTER_BLOCK": "reduce-scatter",
               "BARRIER": "barrier"}


@functools.cache
def _collectives() -> dict[int, str]:
    """comm_type code -> ccbench's collective: the registry's Chakra names (`Collective.export`),
    then the trace-only ones."""
    from ccbench.formats.chakra import COLL_TYPES

    named = {**_TRACE_ONLY,
             **{c.export.chakra: c.name for c in every() if c.export is not None}}
    return {code: named[name] for name, code in COLL_TYPES.items()}


_COMP_NODE, _SEND, _RECV, _COLL_NODE = 4, 5, 6, 7


def _predicted_op(node: Any, attrs: dict[str, Any], rank: int, index: int, path: Path
                  ) -> CommOp:
    """A compute node of ccbench's own ASTRA-sim export standing for an op ASTRA-sim has no
    implementation of (broadcast, reduce, barrier): read back as that op."""
    collective = str(attrs["ccbench_collective"])
    size = 0 if collective == "barrier" else int(attrs.get("ccbench_size", 0) or 0)
    elsize = 4 if size % 4 == 0 else 1
    return CommOp(rank=rank, index=index, node_id=int(node.id), name=node.name,
                  collective=collective, dtype="float32" if elsize == 4 else "int8",
                  elsize=elsize, in_bytes=size, out_bytes=size, source=str(path),
                  root=0 if collective in ROOTED else None,
                  notes=["element type not in the trace", "ccbench's stand-in for an op "
                         "ASTRA-sim does not implement"])


def _op(node: Any, attrs: dict[str, Any], rank: int, index: int, path: Path) -> CommOp:
    size = int(attrs.get("comm_size", 0) or 0)
    node_id = int(node.id)
    if node.type == _COLL_NODE:
        code = attrs.get("comm_type")
        if code not in _collectives():
            raise TraceError(path, f"unknown comm_type {code!r} (valid: 0-9)", node_id)
        collective = _collectives()[int(code)]
    else:
        collective = "send" if node.type == _SEND else "recv"
    elsize = 4 if size % 4 == 0 else 1
    op = CommOp(rank=rank, index=index, node_id=node_id, name=node.name, collective=collective,
                dtype="float32" if elsize == 4 else "int8", elsize=elsize, in_bytes=size,
                out_bytes=size, source=str(path), notes=["element type not in the trace"])
    if collective == "send":
        op.out_bytes, op.peer = 0, int(attrs.get("comm_dst", 0))
    if collective == "recv":
        op.in_bytes, op.peer = 0, int(attrs.get("comm_src", 0))
    if collective == "barrier":
        op.in_bytes = op.out_bytes = 0
    if collective == "allgather":          # comm_size is the shard: the input
        op.out_bytes = 0
    if collective == "reduce-scatter":     # comm_size is the whole input
        op.out_bytes = 0
    if collective in ROOTED:
        op.root = int(attrs.get("comm_root", attrs.get("root", 0)) or 0)
    if node.duration_micros or node.start_time_micros:
        op.start_us, op.dur_us = float(node.start_time_micros), float(node.duration_micros)
    return op


def collective_on_world(op: CommOp) -> bool:
    """A collective (send and recv name their peer, not a group)."""
    return op.collective not in ("send", "recv")


def parse_chakra_et(path: Path, rank: int, world: int,
                    groups: dict[str, Group] | None = None) -> tuple[list[CommOp], str, list[str]]:
    """(this rank's comm ops in file order, the schema version, pg names seen); an op whose
    pg_name is in `groups` runs on that group."""
    from ccbench.formats.chakra import node_attrs, read_trace

    try:
        meta, nodes = read_trace(path)
    except TraceError:
        raise
    except UsageError as exc:
        raise TraceError(path, str(exc).removeprefix(f"{path}: ")) from None
    except Exception as exc:  # noqa: BLE001  protobuf's DecodeError and friends: bad bytes
        raise TraceError(path, f"not a Chakra trace ({type(exc).__name__}: {exc})") from None
    version = str(meta.version)
    ops: list[CommOp] = []
    pg_names: list[str] = []
    for node in nodes:
        attrs = node_attrs(node) if node.type in (_SEND, _RECV, _COLL_NODE, _COMP_NODE) else {}
        if node.type == _COMP_NODE and "ccbench_collective" in attrs:
            op = _predicted_op(node, attrs, rank, len(ops), path)
            attrs = {"pg_name": attrs.get("ccbench_pg_name")}
        elif node.type in (_SEND, _RECV, _COLL_NODE):
            op = _op(node, attrs, rank, len(ops), path)
        else:
            continue
        pg = str(attrs.get("pg_name") or "")
        if (not pg or pg == "0") and collective_on_world(op):
            # the module's rule, as ASTRA-sim reads it: no pg_name is the whole world
            op.group, op.group_source = Group("world", tuple(range(world))), "named"
        if pg and pg != "0":
            pg_names.append(pg)
            if groups is not None:
                if pg not in groups:
                    raise TraceError(path, f"pg_name {pg!r} is not in the communicator-group "
                                           f"file (groups {', '.join(sorted(groups))})",
                                     int(node.id))
                if rank not in groups[pg].ranks:
                    raise TraceError(path, f"rank {rank} runs an op on group {pg} "
                                           f"{list(groups[pg].ranks)}, which it is not in",
                                     int(node.id))
                op.group, op.group_source = groups[pg], "named"
        ops.append(op)
    return ops, version, pg_names
