"""Facts about an op that the trace file itself leaves out, from two other sources:

- the capture file beside a PyTorch trace (`ccbench.formats.capture`): per rank, each call's
  group ranks, reduction, root and split sizes, in call order;
- the user: `--group NODE=RANKS` (or `RANK:NODE=RANKS`) and a groups file of the same
  entries ({"NODE": [ranks], "RANK:NODE": [ranks]}).

An op so settled has group_source "named", as one whose trace names its group.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ccbench.errors import UsageError
from ccbench.safeio import check_json_depth, load_json, read_lines
from ccbench.trace.ops import CommOp, Group, TraceError

__all__ = ["apply_capture", "apply_user_groups", "parse_group_settings", "read_capture"]

_FAMILY = {"alltoallv": "alltoall"}

RawJson = dict[str, Any]   # a line of a user's capture file before validation (_apply_entry)


def read_capture(path: Path) -> list[RawJson]:
    """The capture file's entries (a torn last line, from a job that died, is left out)."""
    try:
        lines = read_lines(path)                  # bounded in bytes and lines, as every input
    except OSError as exc:
        raise TraceError(path, f"cannot read the capture file ({exc})") from None
    entries = []
    for number, line in enumerate(lines, 1):
        check_json_depth(line, str(path), number)
        try:
            entry = json.loads(line)
        except ValueError:                        # not JSON, not UTF-8
            if number == len(lines):
                break
            raise TraceError(path, f"line {number} is not JSON") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("op"), str):
            raise TraceError(path, f"line {number} is not a captured call")
        entries.append(entry)
    return entries


def _fits(op: CommOp, entry: RawJson) -> bool:
    if _FAMILY.get(op.collective, op.collective) != entry["op"]:
        return False
    if op.collective == "barrier":
        return True
    return op.in_bytes == entry.get("in_bytes") or op.out_bytes == entry.get("out_bytes")


def _settle(op: CommOp, ranks: list[int], world: int, where: object) -> None:
    if not ranks or any(not isinstance(r, int) or not 0 <= r < world for r in ranks) \
            or op.rank not in ranks:
        raise TraceError(where, f"group {ranks} is not a group of rank {op.rank} in a world of "
                                f"{world}", op.node_id)
    op.group = Group(",".join(map(str, sorted(ranks))), tuple(sorted(ranks)))
    op.group_source = "named"


def _apply_entry(op: CommOp, entry: RawJson, world: int, path: Path) -> None:
    ranks = entry.get("group")
    if op.collective in ("send", "recv"):
        # the peer as a global rank (the trace stores it as a rank of the call's group);
        # the message itself runs between the two ranks, whatever group it was sent on
        if isinstance(entry.get("peer"), int) and 0 <= entry["peer"] < world:
            op.peer = entry["peer"]
            _settle(op, list(range(world)), world, path)
    elif isinstance(ranks, list):
        _settle(op, ranks, world, path)
    if isinstance(entry.get("reduce_op"), str):
        op.op, op.op_source = entry["reduce_op"], "named"
    if op.group is not None and isinstance(entry.get("root"), int) \
            and entry["root"] in op.group.ranks:
        op.root = op.group.local(entry["root"])
    for side in ("in_splits", "out_splits"):
        splits = entry.get(side)
        if isinstance(splits, list) and op.collective in ("alltoall", "alltoallv"):
            setattr(op, side, tuple(int(s) for s in splits))
    start, dur = entry.get("start_us"), entry.get("dur_us")
    if isinstance(start, (int, float)) and isinstance(dur, (int, float)) and dur >= 0:
        op.start_us, op.dur_us = float(start), float(dur)   # the job's own time, this rank
        if isinstance(entry.get("clock_us"), (int, float)):
            op.clock_us = float(entry["clock_us"])


def apply_capture(ops: list[CommOp], entries: list[RawJson], world: int,
                  path: Path) -> int:
    """Give each of this rank's ops the captured call it was, in order; returns how many
    ops were settled. A recording that marks the execution trace's window ("traced") is
    read inside it only: calls before the observer started and after it stopped are
    passed over, never matched to a traced call. In an older file without the mark,
    calls no op fits are passed over; an op no call fits keeps what the trace says."""
    if any("traced" in e for e in entries):
        entries = [e for e in entries if e.get("traced")]
    entries = [e for e in entries if "error" not in e]
    at = settled = 0
    for op in ops:
        found = next((i for i in range(at, len(entries)) if _fits(op, entries[i])), None)
        if found is None:
            continue
        _apply_entry(op, entries[found], world, path)
        at, settled = found + 1, settled + 1
    return settled


def parse_group_settings(items: list[str], groups_file: str | None) -> dict[str, list[int]]:
    """`--group NODE=RANKS` / `RANK:NODE=RANKS` and a groups file, as {"[RANK:]NODE": ranks}."""
    settings: dict[str, list[int]] = {}
    if groups_file:
        try:
            data = load_json(groups_file)         # a regular file, bounded, not too deep
        except UsageError as exc:
            raise UsageError(f"--groups-file {exc}") from None
        except OSError as exc:
            raise UsageError(f"--groups-file {groups_file}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise UsageError(f"--groups-file {groups_file}: not JSON ({exc})") from None
        if not isinstance(data, dict) or not all(
                isinstance(v, list) and all(isinstance(r, int) for r in v) for v in data.values()):
            raise UsageError(f"--groups-file {groups_file}: expected "
                             f"{{\"NODE\": [ranks], \"RANK:NODE\": [ranks]}}")
        settings.update({str(k): list(v) for k, v in data.items()})
    for item in items:
        key, sep, value = item.partition("=")
        try:
            ranks = [int(r) for r in value.split(",")] if sep else []
            [int(part) for part in key.split(":", 1)]
        except ValueError:
            ranks = []
        if not ranks:
            raise UsageError(f"--group {item!r}: expected NODE_ID=RANKS or RANK:NODE_ID=RANKS, "
                             f"e.g. 19=0,2")
        settings[key] = ranks
    return settings


def apply_user_groups(ops: list[list[CommOp]], settings: dict[str, list[int]]) -> None:
    """`NODE=RANKS` settles the op of that node id on each rank of RANKS; `RANK:NODE=RANKS`
    that rank's op only."""
    world = len(ops)
    for key, ranks in settings.items():
        rank_text, _, node_text = key.rpartition(":")
        if not node_text.isdigit() or not (rank_text == "" or rank_text.isdigit()):
            raise UsageError(f"--group {key}: expected NODE_ID or RANK:NODE_ID as the key, "
                             f"e.g. 19 or 2:19")
        if len(set(ranks)) != len(ranks) or len(ranks) > world:
            raise UsageError(f"--group {key}: a group names each of the {world} ranks at most "
                             f"once (got {len(ranks)} ranks, {len(set(ranks))} distinct)")
        node = int(node_text)
        for rank in ([int(rank_text)] if rank_text else ranks):
            if not 0 <= rank < world:
                raise UsageError(f"--group {key}={ranks}: rank {rank} outside a world of {world}")
            op = next((o for o in ops[rank] if o.node_id == node), None)
            if op is None:
                raise UsageError(f"--group {key}={ranks}: rank {rank}'s trace has no "
                                 f"communication op with node id {node} (give RANK:NODE=RANKS "
                                 f"where ranks' node ids differ)")
            _settle(op, ranks, world, f"--group {key}")
