"""The extracted op model: what one communication call of one rank did."""

from __future__ import annotations

from dataclasses import dataclass, field

from ccbench.collectives import COLLECTIVES, REDUCING, get
from ccbench.errors import UsageError

__all__ = ["MEASURED", "REPLAYABLE", "CommOp", "Group", "Trace", "TraceError"]

#: the collectives the harness measures (size semantics as in ccbench.collectives)
MEASURED = frozenset(COLLECTIVES)
#: every collective name an extracted op can carry
REPLAYABLE = MEASURED | {"reduce", "gather", "scatter", "barrier", "send", "recv", "alltoallv"}


class TraceError(UsageError):
    """Bad trace input: one line naming the file and, where there is one, the node id."""

    def __init__(self, path: object, what: str, node: int | None = None) -> None:
        where = f"{path}" + (f", node {node}" if node is not None else "")
        super().__init__(f"{where}: {what}")


@dataclass(frozen=True, slots=True)
class Group:
    """A process group: its name in the trace and its global ranks, ascending."""

    name: str
    ranks: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.ranks)

    def local(self, rank: int) -> int:
        return self.ranks.index(rank)


@dataclass(kw_only=True, slots=True)
class CommOp:
    """One communication call on one rank, as the trace recorded it."""

    rank: int                      # global rank whose trace holds it
    index: int                     # position among this rank's comm ops (issue order)
    node_id: int                   # the node id in the trace file
    name: str                      # the trace's own op name (c10d::allreduce_, ALL_REDUCE ...)
    collective: str                # ccbench name: allreduce, ..., reduce, gather, send, alltoallv
    dtype: str                     # ccbench dtype name, or the trace's when ccbench has none
    elsize: int                    # bytes per element
    in_bytes: int                  # this rank's input bytes
    out_bytes: int                 # this rank's output bytes
    root: int | None = None        # group-local root of rooted collectives
    peer: int | None = None        # peer rank of send / recv
    op: str | None = None          # reduction, when the trace says ("sum" is assumed otherwise)
    op_source: str = ""            # named: the trace or a capture file says; "": assumed
    async_op: bool = False
    in_splits: tuple[int, ...] = ()    # alltoallv: elements sent to each group rank
    out_splits: tuple[int, ...] = ()
    group: Group | None = None     # None until matched (ccbench.trace.groups)
    # named: the trace, a capture file or the user names it; inferred: matched across ranks,
    # the only group that fits; ambiguous: matched, but another group fitted as well
    group_source: str = ""
    call: int = -1                 # which matched call across ranks (ops of one call share it)
    exchange: int = -1             # send/recv posted together with others (ccbench.trace.groups)
    start_us: float | None = None  # when the trace has timings
    dur_us: float | None = None
    clock_us: float | None = None  # the issue on the host's clock (a capture file), all ranks'
    source: str = ""               # file it came from
    notes: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        """The nccl-tests S of the op in bytes (ccbench.collectives; the whole buffer, except
        send/recv: the message, and alltoallv: what this rank sends)."""
        n = self.group.size if self.group else 1
        if self.collective in MEASURED:
            return get(self.collective).trace.size(self.in_bytes, self.out_bytes, n)
        if self.collective == "gather":
            return self.in_bytes * n
        if self.collective == "scatter":
            return self.out_bytes * n
        if self.collective == "recv":
            return self.out_bytes or self.in_bytes
        return self.in_bytes

    @property
    def reduce_op(self) -> str | None:
        """The reduction of a reducing op: the one named, else sum (assumed; see op_source)."""
        return (self.op or "sum") if self.collective in REDUCING else None

    def describe(self) -> str:
        group = f" on {list(self.group.ranks)}" if self.group else ""
        return f"{self.collective} {self.dtype} {self.size} B{group}"


@dataclass(kw_only=True, slots=True)
class Trace:
    """Every rank's comm ops, in issue order, plus where they came from."""

    kind: str                              # pytorch-et | chakra-et
    paths: list[str]                       # file of rank r at index r
    world_size: int
    ops: list[list[CommOp]]                # ops[rank] = that rank's comm ops
    groups: list[Group]                    # every group an op runs on (the world first)
    # every group an op could run on (the world first): the trace's, the capture's, the user's
    candidates: list[Group] = field(default_factory=list)
    schema: str = ""
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)   # said once on stderr (rescale's)

    @property
    def has_timings(self) -> bool:
        return any(op.dur_us is not None for ops in self.ops for op in ops)

    def all_ops(self) -> list[CommOp]:
        return [op for ops in self.ops for op in ops]
