"""The five collectives: names, how a size S maps to element counts, and the busbw factors.

S follows nccl-tests (see the README's method section):

| collective     | S                          | busbw factor |
|----------------|----------------------------|--------------|
| allreduce      | count x elsize             | 2(n-1)/n     |
| reduce-scatter | recvcount x n x elsize     | (n-1)/n      |
| allgather      | sendcount x n x elsize     | (n-1)/n      |
| broadcast      | count x elsize             | 1            |
| alltoall       | count x n x elsize         | (n-1)/n      |
"""

from __future__ import annotations

from dataclasses import dataclass

from ccbench.errors import UsageError, choices_error

COLLECTIVES: tuple[str, ...] = ("broadcast", "allreduce", "allgather", "reduce-scatter", "alltoall")
REDUCING: frozenset[str] = frozenset({"allreduce", "reduce-scatter"})
OPS: tuple[str, ...] = ("sum", "max", "min", "prod")

_ALIASES = {
    "all_reduce": "allreduce", "all-reduce": "allreduce",
    "all_gather": "allgather", "all-gather": "allgather",
    "reduce_scatter": "reduce-scatter", "reducescatter": "reduce-scatter",
    "all_to_all": "alltoall", "all-to-all": "alltoall", "bcast": "broadcast",
}

__all__ = [
    "COLLECTIVES", "OPS", "REDUCING", "Layout", "busbw_factor", "layout",
    "parse_collectives", "parse_ops",
]


def canonical_collective(name: str) -> str:
    name = _ALIASES.get(name.lower(), name.lower())
    if name not in COLLECTIVES:
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
    n = world_size
    if collective == "allreduce":
        return 2.0 * (n - 1) / n
    if collective in ("reduce-scatter", "allgather", "alltoall"):
        return (n - 1) / n
    if collective == "broadcast":
        return 1.0
    raise choices_error("collective", collective, COLLECTIVES)


@dataclass(frozen=True, slots=True)
class Layout:
    """Element counts of one collective call at one size on every rank.

    send_count / recv_count are whole-buffer element counts; `size_used` is the
    nccl-tests S after rounding the per-rank count down to divisibility.
    """

    collective: str
    world_size: int
    elsize: int
    size_asked: int
    count: int        # the nccl-tests "count" column: elements per rank buffer unit
    send_count: int
    recv_count: int
    size_used: int

    @property
    def block(self) -> int:
        """Elements of one rank's block (the shard of allgather / reduce-scatter / alltoall)."""
        if self.collective == "allgather":
            return self.send_count
        if self.collective == "reduce-scatter":
            return self.recv_count
        if self.collective == "alltoall":
            return self.send_count // self.world_size
        return self.send_count


def layout(collective: str, size: int, elsize: int, world_size: int) -> Layout:
    """How many elements each rank sends and receives for size S (bytes)."""
    n = world_size
    if collective in ("allreduce", "broadcast"):
        count = size // elsize
        return Layout(collective, n, elsize, size, count, count, count, count * elsize)
    block = size // (elsize * n)
    if collective == "allgather":
        return Layout(collective, n, elsize, size, block * n, block, block * n, block * n * elsize)
    if collective == "reduce-scatter":
        return Layout(collective, n, elsize, size, block * n, block * n, block, block * n * elsize)
    if collective == "alltoall":
        return Layout(collective, n, elsize, size, block * n, block * n, block * n,
                      block * n * elsize)
    raise choices_error("collective", collective, COLLECTIVES)
