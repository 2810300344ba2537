"""Process groups of a trace as sub-communicators of a backend.

Every rank calls `split_groups` with the same groups in the same order (creating a
communicator is collective). Each rank gets, per group it belongs to, a backend object that
runs on that group only, or the reason it cannot. How a library makes one is the backend's
own `groups.split` (ccbench.backends: `Backend.groups`); here only what is common: the whole
world is the backend itself, the groups a rank is not in are left out, and a backend without
sub-communicators answers why for each group it is in.
"""

from __future__ import annotations

from ccbench.backends.base import Backend
from ccbench.trace.ops import Group

__all__ = ["free_groups", "split_groups"]


def split_groups(backend: Backend, groups: list[Group], world_size: int, timeout: float
                 ) -> dict[Group, Backend | str]:
    """Group -> its backend on this rank (or why there is none), for the groups this rank is
    in. The whole world is the backend itself."""
    whole = tuple(range(world_size))
    out: dict[Group, Backend | str] = {g: backend for g in groups
                                       if g.ranks == whole and backend.ctx.rank in g.ranks}
    subs = [g for g in groups if g.ranks != whole]
    if subs:
        made = _split(backend, [g.ranks for g in subs], timeout)
        out.update((g, sub) for g, sub in zip(subs, made, strict=True) if sub is not None)
    return out


def _split(backend: Backend, groups: list[tuple[int, ...]], timeout: float
           ) -> list[Backend | str | None]:
    """The backend's sub-communicators, or its reason on every group this rank is in."""
    if backend.groups is None:
        return [f"{backend.name}: no sub-communicators" if backend.ctx.rank in ranks else None
                for ranks in groups]
    return backend.groups.split(groups, timeout)


def free_groups(subs: dict[Group, Backend | str], whole: Backend) -> None:
    """Release the sub-communicators (the whole one is finalised by its owner)."""
    for sub in subs.values():
        if isinstance(sub, Backend) and sub is not whole:
            sub.finalize()
