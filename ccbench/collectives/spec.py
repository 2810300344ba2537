"""What one collective is, as data: the `Collective` each module of this package defines.

Every rule that differs between collectives lives in its `Collective`. Its core is what
measuring it needs: how a size S maps to element counts, the busbw factor, how the in-place
case aliases the buffers, the exact inputs and expected outputs of validation and their
brute-force reference, whether it reduces or has a root (each backend binds it by name:
`Backend.builders`). The rest are capabilities, one object each, read only by their users:
`model` (`ModelTerms`: cost formulas, ccbench.model), `export` (`ExportNames`: Chakra and
ASTRA-sim, ccbench.formats), `trace` (`TraceRules`: PyTorch trace ops, ccbench.trace) and
`tools` (`ToolNames`: nccl-tests / OSU programs, the MPI function). Callers ask the registry
(`ccbench.collectives.get`) instead of branching on the name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ccbench.collectives.cost_terms import CostFormula

__all__ = ["ALL_RANKS", "ROOT_ONLY", "Collective", "ExportNames", "InPlace", "Layout", "ModelTerms",
           "Reference", "ResultOn", "ToolNames", "TraceRules", "blocks_both_ways", "one_block_in",
           "one_block_out", "whole_buffer"]

#: how the in-place case lays out send and receive buffers:
#: "one-buffer": one buffer, in-place or not (broadcast);
#: "same": the send buffer is the receive buffer (allreduce, alltoall, reduce);
#: "send-in-recv": the send buffer is this rank's block of the receive buffer (allgather);
#: "recv-in-send": the receive buffer is this rank's block of the send buffer (reduce-scatter);
#: "never": two buffers always, no in-place case (sendrecv: one buffer would race)
InPlace = Literal["one-buffer", "same", "send-in-recv", "recv-in-send", "never"]


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
        from ccbench.collectives import get

        return get(self.collective).block(self)


#: (size S in bytes, element size, world size) -> (count, send_count, recv_count, S used)
Counts = Callable[[int, int, int], tuple[int, int, int, int]]
#: (layout, op, rank, root, element indices, dtype) -> int64 values (the dtype bounds them:
#: no negatives in uint8, float8 sums within 8)
Values = Callable[[Layout, "str | None", int, int, np.ndarray, np.dtype], np.ndarray]
#: (every rank's whole send buffer, in rank order; op, rank, root) -> what `rank` receives
#: (on a rank with no defined result, the root's), computed the obvious way in float64
Reference = Callable[[Sequence[np.ndarray], "str | None", int, int], np.ndarray]


def whole_buffer(size: int, elsize: int, world_size: int) -> tuple[int, int, int, int]:
    """S = count x elsize, the same count sent and received (allreduce, broadcast, reduce)."""
    count = size // elsize
    return count, count, count, count * elsize


def one_block_in(size: int, elsize: int, world_size: int) -> tuple[int, int, int, int]:
    """S = sendcount x n x elsize: one block sent, n received (allgather, gather)."""
    block = size // (elsize * world_size)
    return block * world_size, block, block * world_size, block * world_size * elsize


def one_block_out(size: int, elsize: int, world_size: int) -> tuple[int, int, int, int]:
    """S = recvcount x n x elsize: n blocks sent, one received (reduce-scatter, scatter)."""
    block = size // (elsize * world_size)
    return block * world_size, block * world_size, block, block * world_size * elsize


def blocks_both_ways(size: int, elsize: int, world_size: int) -> tuple[int, int, int, int]:
    """S = count x n x elsize: n blocks sent and n received (alltoall)."""
    block = size // (elsize * world_size)
    return block * world_size, block * world_size, block * world_size, \
        block * world_size * elsize


def _input_bytes(in_bytes: int, out_bytes: int, group_size: int) -> int:
    """A trace op's S where it is the input: the whole buffer (allreduce, broadcast ...)."""
    return in_bytes


def _bytes_kept(in_bytes: int, out_bytes: int, old: int, new: int) -> tuple[int, int]:
    """A whole buffer per rank does not change with the group size."""
    return in_bytes, out_bytes


@dataclass(frozen=True, slots=True)
class ModelTerms:
    """What the cost model and the network simulator know of a collective (ccbench.model)."""

    #: its cost formulas (ccbench.model.costs): algorithm key -> p -> Coefficients
    costs: Mapping[str, CostFormula]
    #: other names of those algorithms (records, algorithms/ registry) -> the formula key
    aliases: Mapping[str, str] = field(default_factory=dict)
    #: what one unit of an algorithms/ schedule is at size S: "block", one rank's shard (S/p;
    #: allgather, reduce-scatter, alltoall), or "buffer", the whole buffer (S)
    schedule_unit: Literal["block", "buffer"] = "buffer"

    def unit_bytes(self, size: float, world_size: int) -> float:
        """Bytes of one schedule unit at the nccl-tests size S (the replay's block size)."""
        return float(size) / world_size if self.schedule_unit == "block" else float(size)


@dataclass(frozen=True, slots=True)
class ExportNames:
    """What Chakra and ASTRA-sim call a collective (ccbench.formats: the exporters and the
    Chakra ET reader)."""

    #: Chakra's CollectiveCommType name
    chakra: str
    #: the size of one call as ASTRA-sim / Chakra's comm_size see it, from S and p
    comm_size: Callable[[int, int], int]
    #: the ASTRA-sim system-file key of its implementation (None: ASTRA-sim has none)
    astra: str | None = None
    #: which ASTRA-sim implementation reproduces each of its cost formulas (ModelTerms.costs
    #: key -> implementation); the first is the one a system file names when a workload does
    #: not use the collective. The implementations' own limits (powers of two, what they
    #: charge for reductions) are the exporter's (ccbench.formats.astra)
    astra_impls: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TraceRules:
    """How a collective appears in a PyTorch execution trace and scales with its group
    (ccbench.formats.pytorch_et, ccbench.trace.ops, ccbench.trace.scale)."""

    #: PyTorch's c10d dispatcher ops that run it, as PyTorch execution traces name them
    c10d: tuple[str, ...] = ()
    #: a trace op's S from (input bytes, output bytes, group size) (ccbench.trace.ops)
    size: Callable[[int, int, int], int] = _input_bytes
    #: a trace op's (input bytes, output bytes) when its group goes from `old` to `new` ranks,
    #: each rank's share kept (ccbench.trace.scale)
    resize: Callable[[int, int, int, int], tuple[int, int]] = _bytes_kept
    #: c10d's op works in place (its one tensor is input and output): a replay measures it
    #: in place (ccbench.replay)
    in_place: bool = False


@dataclass(frozen=True, slots=True)
class ResultOn:
    """Which ranks' receive buffers hold a defined result (validation compares those only):
    `ALL_RANKS`, `ROOT_ONLY`, or a collective's own (an exclusive scan: every rank but rank 0,
    whose result MPI leaves undefined)."""

    #: (world size, rank, root) -> whether `rank` has a defined result
    ranks: Callable[[int, int, int], bool]
    #: where results are compared, as docs/reference/collectives.md says it after the
    #: collective's name: "on its root, where it has a result"
    where: str


ALL_RANKS = ResultOn(lambda world_size, rank, root: True, "on every rank")
#: the root alone (nccl-tests checks a reduce on its root alone)
ROOT_ONLY = ResultOn(lambda world_size, rank, root: rank == root,
                     "on its root, where it has a result")


@dataclass(frozen=True, slots=True)
class ToolNames:
    """What other benchmarks and libraries call a collective."""

    #: the nccl-tests and OSU programs that measure it (`ccbench all_reduce_perf -b 8 ...`;
    #: ccbench.bench.familiar)
    programs: tuple[str, ...] = ()
    #: the MPI function that runs it (the C loop of ccbench.backends.mpi_loop calls it)
    mpi: str | None = None


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective's rules (see the module docstring)."""

    name: str
    aliases: tuple[str, ...]
    #: takes a reduction op (sum, max, min, prod, avg)
    reduces: bool
    #: has a root rank (--root)
    rooted: bool
    #: world size -> busbw / algbw, as nccl-tests
    busbw: Callable[[int], float]
    counts: Counts
    #: elements of one rank's block (the shard); the whole buffer where there is none
    block: Callable[[Layout], int]
    inplace: InPlace
    #: this rank's send-buffer values at the given indices
    inputs: Values
    #: this rank's expected receive-buffer values at the given indices
    expected: Values
    #: a brute-force reference from every rank's inputs, independent of `expected`: what the
    #: tests check `expected` against and what the test suite's loopback backend delivers
    reference: Reference
    #: the ranks whose receive buffer has a defined result: `ALL_RANKS`, `ROOT_ONLY` or
    #: its own `ResultOn`
    result_on: ResultOn
    #: the ranks whose send buffer holds inputs: "all", or only the "root" (the others'
    #: buffers start as the sentinel, so a broadcast that does not arrive shows)
    input_on: Literal["all", "root"]
    #: what S is, for docs and help: "count x elsize" ...
    size_meaning: str
    #: its cost formulas and schedule unit (None: the cost model and simulators have none)
    model: ModelTerms | None = None
    #: its Chakra and ASTRA-sim names (None: Chakra cannot express it, the exporters refuse)
    export: ExportNames | None = None
    #: its nccl-tests / OSU program names and its MPI function (the defaults: none)
    tools: ToolNames = field(default_factory=ToolNames)
    #: its c10d op names and trace-size rules (the defaults: no c10d op, S is the input)
    trace: TraceRules = field(default_factory=TraceRules)
    #: the reduction ops it defines (None: every op of ccbench.collectives.OPS); an op it lacks
    #: is refused for every backend (`undefined_op`): a prefix scan has no avg, say
    #: ("sum", "max", "min", "prod")
    ops: tuple[str, ...] | None = None

    def undefined_op(self, op: str | None) -> str | None:
        """Why it defines no result for `op` (None: it does, or it takes no op)."""
        if op is None or not self.reduces or self.ops is None or op in self.ops:
            return None
        return f"{self.name} defines no {op} (its ops: {', '.join(self.ops)})"

    def layout(self, size: int, elsize: int, world_size: int) -> Layout:
        count, send, recv, used = self.counts(size, elsize, world_size)
        return Layout(self.name, world_size, elsize, size, count, send, recv, used)

    def modes(self, asked: tuple[bool, ...]) -> tuple[bool, ...]:
        """The in-place values measured when `asked` are (out-of-place first): a one-buffer
        collective has no out-of-place case, so it is measured in place only; one that
        never aliases its buffers, out of place only."""
        if self.inplace == "one-buffer":
            return (True,)
        return (False,) if self.inplace == "never" else asked

    def checked(self, rank: int, root: int, world_size: int) -> bool:
        """Whether this rank's receive buffer has a defined result to compare."""
        return self.result_on.ranks(world_size, rank, root)

    def result_ranks(self, world_size: int, root: int) -> list[int]:
        """The ranks with a defined result, lowest first (none: a world too small for one)."""
        return [r for r in range(world_size) if self.checked(r, root, world_size)]

    def has_input(self, rank: int, root: int) -> bool:
        """Whether this rank's send buffer holds inputs (else the sentinel)."""
        return self.input_on == "all" or rank == root
