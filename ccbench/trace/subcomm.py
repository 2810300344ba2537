"""Process groups of a trace as sub-communicators of a backend.

Every rank calls `split_groups` with the same groups in the same order (creating a
communicator is collective). Each rank gets, per group it belongs to, a backend object that
runs on that group only (its ctx says the group rank and size, so the harness's layouts,
inputs and validation are the group's), or the reason it cannot:

- torch.distributed (gloo, nccl): `new_group`, calls made with `group=`;
- MPI (mpi, <algorithm>@mpi): `Comm.Split`;
- oneCCL: a new communicator from a unique id the group's first rank publishes.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from ccbench.backends.base import Backend
from ccbench.trace.ops import Group

__all__ = ["split_groups"]


def _with_ctx(backend: Backend, group: Group) -> Backend:
    sub = copy.copy(backend)
    sub.ctx = dataclasses.replace(backend.ctx, rank=group.local(backend.ctx.rank),
                                  world_size=group.size)
    return sub


def _torch(backend: Any, groups: list[Group]) -> dict[Group, Backend | str]:
    out: dict[Group, Backend | str] = {}
    for group in groups:
        pg = backend.dist.new_group(list(group.ranks))       # every rank, every group
        if backend.ctx.rank not in group.ranks:
            continue
        sub = _with_ctx(backend, group)
        sub.group = pg                                        # type: ignore[attr-defined]
        out[group] = sub
    return out


def _mpi(backend: Any, groups: list[Group]) -> dict[Group, Backend | str]:
    out: dict[Group, Backend | str] = {}
    MPI = backend.MPI
    rank = backend.ctx.rank
    for group in groups:
        comm = backend.comm.Split(0 if rank in group.ranks else MPI.UNDEFINED, rank)
        if rank not in group.ranks:
            continue
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        sub = _with_ctx(backend, group)
        sub.comm = comm                                       # type: ignore[attr-defined]
        if hasattr(sub, "_probed"):
            sub._probed = {}                                  # type: ignore[attr-defined]
        out[group] = sub
    return out


def _oneccl(backend: Any, groups: list[Group], timeout: float) -> dict[Group, Backend | str]:
    import ctypes

    from ccbench.backends._oneccl_lib import UniqueId

    out: dict[Group, Backend | str] = {}
    rank, lib, store = backend.ctx.rank, backend.lib, backend.ctx.store
    for number, group in enumerate(groups):
        if rank not in group.ranks:
            continue
        key = f"trace/oneccl/{number}"
        if group.local(rank) == 0:
            uid = UniqueId()
            backend._check(lib.onecclGetUniqueId(ctypes.byref(uid)), "onecclGetUniqueId")
            store.set(key, uid.to_bytes())
        else:
            uid = UniqueId.from_bytes(bytes(store.get(key, timeout)))
        sub = _with_ctx(backend, group)
        comm = ctypes.c_void_p()
        backend._check(lib.onecclCommInitRank(ctypes.byref(comm), group.size, uid,
                                              group.local(rank)), "onecclCommInitRank")
        sub.comm, sub._handle = comm, comm.value              # type: ignore[attr-defined]
        sub.rank, sub.world = group.local(rank), group.size   # type: ignore[attr-defined]
        sub._destroyed = False                                # type: ignore[attr-defined]
        out[group] = sub
    return out


def _algorithm(backend: Any, groups: list[Group], world_size: int, timeout: float
               ) -> dict[Group, Backend | str]:
    """<algorithm>@<transport>: the transport split, the schedules run on each part."""
    out: dict[Group, Backend | str] = {}
    for group, inner in split_groups(backend.inner, groups, world_size, timeout).items():
        if isinstance(inner, str):
            out[group] = inner
            continue
        if getattr(inner, "group", None) is not None:
            out[group] = (f"{backend.name}: sub-communicators need MPI or oneCCL as transport "
                          f"(torch point-to-point addresses global ranks)")
            continue
        transport = inner.point_to_point(False)
        if transport is None:
            out[group] = f"{backend.name}: the transport has no point-to-point messages"
            continue
        sub = _with_ctx(backend, group)
        sub.inner, sub._transport = inner, transport          # type: ignore[attr-defined]
        sub._executors = {}                                   # type: ignore[attr-defined]
        out[group] = sub
    return out


def split_groups(backend: Backend, groups: list[Group], world_size: int, timeout: float
                 ) -> dict[Group, Backend | str]:
    """Group -> its backend on this rank (or why there is none), for the groups this rank is
    in. The whole world is the backend itself."""
    out: dict[Group, Backend | str] = {}
    subs = [g for g in groups if g.ranks != tuple(range(world_size))]
    for group in groups:
        if group not in subs and backend.ctx.rank in group.ranks:
            out[group] = backend
    if not subs:
        return out
    if hasattr(backend, "inner") and hasattr(backend, "_transport"):
        out.update(_algorithm(backend, subs, world_size, timeout))
    elif hasattr(backend, "comm") and hasattr(backend, "MPI"):
        out.update(_mpi(backend, subs))
    elif hasattr(backend, "dist") and hasattr(backend, "group"):
        out.update(_torch(backend, subs))
    elif hasattr(backend, "lib") and hasattr(backend, "ccl"):
        out.update(_oneccl(backend, subs, timeout))
    else:
        for group in subs:
            if backend.ctx.rank in group.ranks:
                out[group] = f"{backend.name}: no sub-communicators"
    return out


def free_groups(subs: dict[Group, Backend | str], whole: Backend) -> None:
    """Release the sub-communicators (the whole one is finalised by its owner)."""
    for sub in subs.values():
        if isinstance(sub, Backend) and sub is not whole:
            for ex in getattr(sub, "_executors", {}).values():
                ex.close()
            inner = getattr(sub, "inner", sub)
            if hasattr(inner, "comm") and hasattr(inner, "MPI"):
                inner.comm.Free()
            elif hasattr(inner, "lib") and hasattr(inner, "ccl"):
                inner.finalize()
