"""Replaying a trace recorded at N ranks on M (Mystique's scale-down and scale-up).

- calls on the whole world stay on the whole world; each rank keeps its own bytes: an
  allreduce, broadcast or reduce keeps its buffer (data parallelism: the gradient per rank
  does not change with the rank count), an all-gather or reduce-scatter its shard, an
  all-to-all its block per peer;
- a group whose ranks are consecutive (a tensor-parallel group of k) is re-tiled into M / k
  consecutive groups of k; a strided group (every d-th rank: data parallel across tensor
  parallel groups) into the d groups of every d-th rank of M, each now M / d ranks;
- rank r of the new world runs the op sequence of rank r mod N of the old one;
- whatever cannot be mapped (send/recv, groups of other shapes, sizes that M does not tile)
  is dropped and listed in the trace's notes;
- a tile or stride group that is not one of a set of such groups covering the recorded
  world ({0, 2} of 3 ranks) has no copies to map to: rank r mod N would run it on some
  ranks and not on others, so the trace is refused (`unscalable` says why).
"""

from __future__ import annotations

import dataclasses

from ccbench.collectives import get
from ccbench.errors import UsageError
from ccbench.trace.groups import match_calls
from ccbench.trace.ops import MEASURED, CommOp, Group, Trace

__all__ = ["rescale", "resize_op", "retile_group", "unscalable"]


def _shape(group: Group) -> tuple[int, int] | None:
    """(start, stride) when the group's ranks are an arithmetic progression."""
    ranks = group.ranks
    if len(ranks) == 1:
        return ranks[0], 1
    stride = ranks[1] - ranks[0]
    if stride <= 0 or any(b - a != stride for a, b in zip(ranks, ranks[1:], strict=False)):
        return None
    return ranks[0], stride


def _not_a_tiling(group: Group, old_world: int) -> str:
    """Why a tile or stride group is not one of the set of its copies that covers the
    recorded world ('' when it is, or when it has another shape)."""
    shape = _shape(group)
    if shape is None or group.size == old_world:
        return ""
    start, stride = shape
    k = group.size
    if stride == 1 or k == 1:
        if old_world % k or start % k:
            return (f"group {list(group.ranks)} is not one of the groups of {k} consecutive "
                    f"ranks tiling the recorded {old_world} ranks")
    elif old_world % stride or k != old_world // stride or start >= stride:
        return (f"group {list(group.ranks)} is not one of the groups of ranks {stride} apart "
                f"covering the recorded {old_world} ranks")
    return ""


def unscalable(trace: Trace) -> str:
    """Why the trace cannot be rescaled to another world size ('' when it can)."""
    for group in trace.groups:
        why = _not_a_tiling(group, trace.world_size)
        if why:
            return (f"{why}: rank r of a rescaled world runs recorded rank r mod "
                    f"{trace.world_size}, so no copies of it cover the new world")
    return ""


def retile_group(group: Group, old_world: int, new_world: int, rank: int) -> Group | str:
    """The group of new rank `rank` that plays the role `group` played, or why none does."""
    if group.size == old_world:
        return Group("world", tuple(range(new_world)))
    shape = _shape(group)
    if shape is None:
        return f"group {list(group.ranks)} is not a tile or a stride of the world"
    why = _not_a_tiling(group, old_world)
    if why:
        return why
    _, stride = shape
    if stride == 1 or group.size == 1:
        k = group.size
        if new_world % k:
            return f"groups of {k} consecutive ranks do not tile {new_world} ranks"
        start = rank // k * k
        return Group(f"tile{k}/{start}", tuple(range(start, start + k)))
    if new_world % stride:
        return f"every {stride}th rank does not divide {new_world} ranks"
    return Group(f"stride{stride}/{rank % stride}", tuple(range(rank % stride, new_world, stride)))


def resize_op(op: CommOp, old: int, new: int) -> CommOp:
    """Per-rank bytes kept; the whole-buffer side follows the new group size."""
    out = dataclasses.replace(op, notes=list(op.notes))
    if op.collective in MEASURED:
        out.in_bytes, out.out_bytes = get(op.collective).trace.resize(op.in_bytes, op.out_bytes,
                                                                      old, new)
    elif op.collective == "gather":
        out.out_bytes = op.in_bytes * new if op.out_bytes else 0
    elif op.collective == "scatter":
        out.in_bytes = op.out_bytes * new if op.in_bytes else 0
    return out


def rescale(trace: Trace, world: int) -> Trace:
    """The trace replayed at `world` ranks; unmappable ops listed in notes."""
    if world < 1:
        raise UsageError(f"--world-size must be >= 1, got {world}")
    why = unscalable(trace)
    if why:
        raise UsageError(f"--world-size {world}: the trace cannot be rescaled: {why}")
    old = trace.world_size
    ops: list[list[CommOp]] = []
    dropped: dict[str, int] = {}
    shrunk: dict[tuple[int, ...], set[str]] = {}     # recorded group -> its collectives
    for rank in range(world):
        template = trace.ops[rank % old]
        mine: list[CommOp] = []
        for op in template:
            reason = ""
            group: Group | str = ""
            if op.collective in ("send", "recv") or op.group is None:
                reason = f"{op.collective}: point-to-point peers are not rescaled"
            else:
                group = retile_group(op.group, old, world, rank)
                if isinstance(group, str):
                    reason = f"{op.collective} on {list(op.group.ranks)}: {group}"
                elif op.collective == "alltoallv" and group.size != op.group.size:
                    reason = "alltoallv: per-peer splits are not rescaled to another group size"
                elif op.root is not None and op.root >= group.size:
                    reason = f"{op.collective} root {op.root} outside a group of {group.size}"
            if reason:
                dropped[reason] = dropped.get(reason, 0) + 1
                continue
            assert op.group is not None and isinstance(group, Group)
            if group.size == 1 < op.group.size:
                shrunk.setdefault(op.group.ranks, set()).add(op.collective)
            new = resize_op(op, op.group.size, group.size)
            new.rank, new.index, new.group, new.call = rank, len(mine), group, -1
            mine.append(new)
        ops.append(mine)
    groups = sorted({op.group for rank_ops in ops for op in rank_ops if op.group},
                    key=lambda g: (-g.size, g.ranks))
    world_group = Group("world", tuple(range(world)))
    groups = [world_group] + [g for g in groups if g != world_group]
    out = Trace(kind=trace.kind, paths=trace.paths, world_size=world, ops=ops, groups=groups,
                schema=trace.schema,
                notes=[*trace.notes, f"rescaled from {old} to {world} ranks"]
                + [f"not mapped ({count} ops over all ranks): {why}"
                   for why, count in sorted(dropped.items())])
    match_calls(ops, groups)
    if shrunk:
        out.warnings.append(_one_rank_warning(shrunk, old, world))
    return out


def _one_rank_warning(shrunk: dict[tuple[int, ...], set[str]], old: int, world: int) -> str:
    """The line that says which recorded groups became one-rank groups at `world` ranks
    (data-parallel groups when scaling down): their calls replay on one rank, moving no
    data."""
    groups = ", ".join(str(list(ranks)) for ranks in sorted(shrunk))
    colls = ", ".join(sorted(set().union(*shrunk.values())))
    return (f"--world-size {world}: recorded groups {groups} of the {old} ranks became "
            f"one-rank groups: {colls} on them replay on one rank and move no data")
