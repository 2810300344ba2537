"""Reading a trace: files or folders -> one file per rank -> a matched `Trace`."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ccbench.errors import UsageError
from ccbench.formats.chakra_et import parse_chakra_et, read_comm_groups
from ccbench.formats.pytorch_et import parse_pytorch_et, read_json
from ccbench.safeio import check_memory, inflated_size
from ccbench.trace.groups import global_peers, match_calls, uncertain_calls
from ccbench.trace.ops import CommOp, Group, Trace, TraceError

__all__ = ["load_trace", "rank_files", "require_communication"]

_RANK_RE = re.compile(r"(\d+)(?=\D*$)")
# memory a parsed trace takes per byte of its (inflated) files, measured on this reader:
# protobuf nodes plus ops and simulate's results 39-48x (nodes of 71 and 57 bytes), JSON
# objects ~8.5x; a Chakra file is checked again by its node count once read
# (chakra.NODE_MEMORY), since small nodes take more per byte
_MEMORY_PER_BYTE = {"chakra-et": 40, "pytorch-et": 10}


def _kind(path: Path) -> str:
    name = path.name.lower()
    if name.endswith((".et", ".et.gz")):
        return "chakra-et"
    if name.endswith(".json"):
        return "pytorch-et"
    raise UsageError(f"{path}: not a trace file (valid: PyTorch ET *.json, Chakra *.et, *.et.gz)")


def _expand(paths: list[str | os.PathLike[str]]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.iterdir()
                           if p.is_file() and p.name.lower().endswith((".json", ".et", ".et.gz")))
            # a folder of Chakra files (an ASTRA-sim export) also holds JSON configs
            chakra = [p for p in found if p.name.lower().endswith((".et", ".et.gz"))]
            found = chakra or found
            if not found:
                raise UsageError(f"{path}: no trace files in this folder "
                                 f"(valid: PyTorch ET *.json, Chakra *.et, *.et.gz)")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise UsageError(f"no such trace file or folder: {str(path)!r}")
    return files


def rank_files(paths: list[str | os.PathLike[str]]) -> tuple[str, list[Path]]:
    """(kind, file of rank r at index r): the rank is the last number in each file name."""
    files = _expand(paths)
    kinds = {_kind(p) for p in files}
    if len(kinds) > 1:
        raise UsageError(f"mixed trace kinds {sorted(kinds)}: give one kind per replay")
    by_rank: dict[int, Path] = {}
    for path in files:
        match = _RANK_RE.search(path.name)
        if match is None:
            if len(files) == 1:
                return kinds.pop(), [path]
            raise UsageError(f"{path}: no rank number in the file name (expected e.g. rank3.json "
                             f"or workload.3.et)")
        rank = int(match.group(1))
        if rank in by_rank:
            raise UsageError(f"two files for rank {rank}: {by_rank[rank]} and {path}")
        by_rank[rank] = path
    missing = sorted(set(range(len(by_rank))) - set(by_rank))
    if missing:
        raise UsageError(f"trace files for ranks {sorted(by_rank)} but not {missing} "
                         f"(need one file per rank 0..N-1)")
    return kinds.pop(), [by_rank[r] for r in range(len(by_rank))]


def _merge_groups(declared: list[dict[str, Group]], world: int, path: Path) -> list[Group]:
    """The world first, then every other group once (by its ranks)."""
    world_group = Group("world", tuple(range(world)))
    groups = [world_group]
    for table in declared:
        for group in table.values():
            if any(r >= world for r in group.ranks):
                raise TraceError(path, f"process group {group.name} has ranks {list(group.ranks)} "
                                       f"outside a world of {world}")
            if all(g.ranks != group.ranks for g in groups):
                groups.append(group)
    return groups


def _canonical_groups(ops: list[list[CommOp]], groups: list[Group]) -> None:
    """An op's named group becomes the one group of those ranks (the world: "world"), so that
    a group named in one place (pg_name "0", a capture file) is the group the replay splits."""
    by_ranks = {g.ranks: g for g in groups}
    for op in (op for rank_ops in ops for op in rank_ops):
        if op.group is not None:
            op.group = by_ranks[op.group.ranks]


def _captured(path: Path, rank: int, rank_ops: list[CommOp], world: int) -> int:
    """Settle this rank's ops from the capture file beside its trace, if there is one."""
    from ccbench.formats.capture import capture_file
    from ccbench.formats.named import apply_capture, read_capture

    beside = capture_file(path.parent, rank)
    if not beside.is_file():
        return 0
    return apply_capture(rank_ops, read_capture(beside), world, beside)


def _notes(trace: Trace, captured: int) -> None:
    ops = trace.all_ops()
    if captured:
        trace.notes.append(f"{captured} of {len(ops)} ops settled from the capture files beside "
                           f"the trace (group, reduction, root, splits)")
    calls = uncertain_calls(trace)
    if calls:
        trace.notes.append(
            f"{calls} of {1 + max(op.call for op in ops)} calls' process groups are "
            f"ambiguous (the trace does not name them "
            f"and more than one group fits; group_source 'ambiguous' on each): record the job "
            f"under `python -m ccbench.formats.capture` or settle them with --group NODE=RANKS")
    assumed = [op for op in ops if op.reduce_op and not op.op_source]
    if assumed:
        trace.notes.append(f"{len({op.call for op in assumed})} reducing calls do not say their "
                           f"reduction in the trace: taken as sum (a capture file says)")


#: bytes one op may move, as a record's size (docs/input-limits.md): 1 PiB
MAX_OP_BYTES = 1 << 50


def _check_sizes(ops: list[list[CommOp]]) -> None:
    """An op that moves a negative or absurd number of bytes is a damaged trace: refused,
    naming the node, before it turns into a negative or astronomical prediction."""
    for op in (op for rank_ops in ops for op in rank_ops):
        for what, value in (("input", op.in_bytes), ("output", op.out_bytes)):
            if not 0 <= value <= MAX_OP_BYTES:
                raise TraceError(op.source, f"{op.collective} of {value:,} {what} bytes "
                                            f"(sizes are 0 to 2^50 bytes: a damaged trace)",
                                 op.node_id)


def require_communication(trace: Trace) -> None:
    """A trace without a single communication op: one line, exit 2 (replaying it would
    measure nothing and say nothing)."""
    if not any(trace.ops):
        raise TraceError(trace.paths[0], f"no communication ops in the trace "
                                         f"({trace.world_size} rank files): nothing to replay")


def load_trace(paths: list[str | os.PathLike[str]], readers: int = 1,
               group_settings: dict[str, list[int]] | None = None) -> Trace:
    """Parse, match across ranks and check a trace; TraceError (exit 2) on bad input.
    `readers`: processes of this machine that will hold it at once (replay: each rank);
    `group_settings` ({"[RANK:]NODE": ranks}, from --group) name ops' groups."""
    kind, files = rank_files(paths)
    world = len(files)
    need = _MEMORY_PER_BYTE[kind] * sum(inflated_size(p) for p in files)
    check_memory(f"{files[0]}{' ...' if world > 1 else ''}: the trace of {world} rank(s)"
                 f"{f', read by {readers} processes,' if readers > 1 else ''}", need * readers)
    ops: list[list[CommOp]] = []
    declared: list[dict[str, Group]] = []
    schema = ""
    captured = 0
    comm_groups: dict[str, Group] | None = None
    beside = files[0].parent / "comm_groups.json"
    if kind == "chakra-et" and beside.is_file():
        comm_groups = read_comm_groups(beside, world)
        declared.append(comm_groups)
    for rank, path in enumerate(files):
        if kind == "pytorch-et":
            data = read_json(path)
            if "traceEvents" in data and "nodes" not in data:
                raise TraceError(path, "a Kineto (profiler timeline) trace, not an execution "
                                       "trace: record with torch.profiler.ExecutionTraceObserver")
            rank_ops, table, schema = parse_pytorch_et(path, rank, world, data)
            declared.append(table)
            captured += _captured(path, rank, rank_ops, world)
        else:
            rank_ops, schema, _ = parse_chakra_et(path, rank, world, comm_groups)
        ops.append(rank_ops)
    _check_sizes(ops)
    if group_settings:
        from ccbench.formats.named import apply_user_groups

        apply_user_groups(ops, group_settings)
    declared.append({op.group.name: op.group for rank_ops in ops for op in rank_ops
                     if op.group is not None})
    groups = _merge_groups(declared, world, files[0])
    if kind == "pytorch-et":          # its send/recv peers are ranks of their groups
        global_peers(ops, groups)
    _canonical_groups(ops, groups)
    trace = Trace(kind=kind, paths=[str(p) for p in files], world_size=world, ops=ops,
                  groups=groups, schema=schema)
    match_calls(ops, groups)
    trace.candidates = groups
    used = {op.group for op in trace.all_ops() if op.group is not None}
    trace.groups = [g for g in groups if g in used] or groups[:1]
    _notes(trace, captured)
    return trace
