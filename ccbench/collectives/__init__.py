"""The collective registry: one module per collective (its `Collective`: layout, busbw factor,
in-place aliasing, exact inputs and expected outputs, root, model and exporter names).

S follows nccl-tests (docs/design/method.md); every collective's S, busbw factor and the
rest are in docs/reference/collectives.md, which scripts/gen_docs.py writes from here.

Adding a collective: one module here defining its `Collective` (sizes, validation, cost
formulas, other tools' names, trace rules, the ops it defines where not every one: `ops`),
one line in `_ALL`, and a builder in the
`builders` table of each backend whose library has it (docs/design/architecture.md).
"""

from __future__ import annotations

from ccbench.collectives.allgather import ALLGATHER
from ccbench.collectives.allreduce import ALLREDUCE
from ccbench.collectives.alltoall import ALLTOALL
from ccbench.collectives.broadcast import BROADCAST
from ccbench.collectives.gather import GATHER
from ccbench.collectives.reduce import REDUCE
from ccbench.collectives.reduce_scatter import REDUCE_SCATTER
from ccbench.collectives.scatter import SCATTER
from ccbench.collectives.sendrecv import SENDRECV
from ccbench.collectives.spec import Collective, Layout
from ccbench.errors import UsageError, choices_error

__all__ = [
    "COLLECTIVES", "IN_PLACE_ONLY", "OPS", "REDUCING", "ROOTED", "Collective", "Layout", "busbw_factor",
    "canonical_collective", "every", "get", "layout", "parse_collectives", "parse_ops",
]

#: every collective, in the order `all` runs them
_ALL: tuple[Collective, ...] = (BROADCAST, ALLREDUCE, ALLGATHER, REDUCE_SCATTER, ALLTOALL,
                                REDUCE, SENDRECV, GATHER, SCATTER)
_BY_NAME: dict[str, Collective] = {c.name: c for c in _ALL}

COLLECTIVES: tuple[str, ...] = tuple(_BY_NAME)
REDUCING: frozenset[str] = frozenset(c.name for c in _ALL if c.reduces)
ROOTED: frozenset[str] = frozenset(c.name for c in _ALL if c.rooted)
#: those with one buffer, measured in place only (their only form)
IN_PLACE_ONLY: frozenset[str] = frozenset(c.name for c in _ALL if c.inplace == "one-buffer")
#: avg: the mean over ranks (NCCL's ncclAvg, torch's ReduceOp.AVG); MPI has none
OPS: tuple[str, ...] = ("sum", "max", "min", "prod", "avg")

_ALIASES = {alias: c.name for c in _ALL for alias in c.aliases}


def every() -> tuple[Collective, ...]:
    """Every collective's rules, in the order `all` runs them."""
    return _ALL


def get(name: str) -> Collective:
    """The rules of collective `name` (canonical name); UsageError names the valid ones."""
    spec = _BY_NAME.get(name)
    if spec is None:
        raise choices_error("collective", name, COLLECTIVES)
    return spec


def canonical_collective(name: str) -> str:
    name = _ALIASES.get(name.lower(), name.lower())
    if name not in _BY_NAME:
        raise choices_error("collective", name, (*COLLECTIVES, "all"))
    return name


def parse_collectives(text: str) -> list[str]:
    if text == "all":
        return list(COLLECTIVES)
    return [canonical_collective(part) for part in text.split(",") if part]


def parse_ops(text: str) -> list[str]:
    if text.strip().lower() == "all":           # as nccl-tests' -o all: every op offered
        return list(OPS)
    ops = [part.strip().lower() for part in text.split(",") if part.strip()]
    if not ops:
        raise UsageError(f"empty --op (valid: {', '.join(OPS)})")
    for op in ops:
        if op not in OPS:
            raise choices_error("op", op, OPS)
    return ops


def busbw_factor(collective: str, world_size: int) -> float:
    return get(collective).busbw(world_size)


def layout(collective: str, size: int, elsize: int, world_size: int) -> Layout:
    """How many elements each rank sends and receives for size S (bytes)."""
    return get(collective).layout(size, elsize, world_size)
