"""What a schedule can compute: one `Pattern` per computation, in `PATTERNS`, the one place
a new one is added. A pattern says whether it has a root and reduces, how an in-place call
aliases its buffers, how long its buffers are (in units, see algorithms.schedule), and its
result as a function of every rank's input. That one function gives both the numpy reference
(algorithms.reference: elements and a numeric reduction) and what the symbolic verifier
expects (algorithms.verify: blocks holding sets of contributions, united by the reduction).

| pattern        | U (elements)        | send units | recv units |
|----------------|---------------------|------------|------------|
| broadcast      | count               | -          | 1          |
| reduce         | count               | 1          | 1          |
| allreduce      | count               | 1          | 1          |
| allgather      | block (= sendcount) | 1          | p          |
| reduce-scatter | block (= recvcount) | p          | 1          |
| alltoall       | block (= count / p) | p          | p          |

(`Pattern.unit`, `send_units`, `recv_units`; tests/test_algorithms_patterns.py keeps this
table and algorithms/README.md's equal to PATTERNS.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["PATTERNS", "Combine", "Pattern", "Result"]

#: reduces a list of rank inputs (or slices of them) element by element into one array
Combine = Callable[[Sequence[np.ndarray]], np.ndarray]
#: (every rank's input, the reduction, root) -> every rank's output (None: it defines none)
Result = Callable[[Sequence[np.ndarray], Combine, int], list[np.ndarray | None]]

_UNITS = ("-", "1", "p")


@dataclass(frozen=True, slots=True)
class Pattern:
    """What a schedule computes: the one place the executor, the verifier and the reference
    look up a result's shape."""

    name: str
    #: has a root rank
    rooted: bool
    #: reduces with an op
    reduces: bool
    #: how an in-place call aliases the buffers, in ccbench.collectives' words (`InPlace`):
    #: "one-buffer" (recv is the only buffer), "same" (send is recv), "send-in-recv" (send
    #: is recv's block r), "recv-in-send" (recv is send's block r)
    inplace: str
    #: what one unit of its buffers is: "count" (the whole buffer) or "block" (one rank's share)
    unit: str
    #: units of the send and the recv buffer: "-" (none), "1" or "p" (one per rank)
    send_units: str
    recv_units: str
    #: every rank's output from every rank's input: on elements for the numpy reference, on
    #: blocks of contribution sets (object arrays of ints) for the verifier; so it only
    #: slices, copies, concatenates and reduces with `combine`, never computes on values
    result: Result

    def __post_init__(self) -> None:
        for what in (self.send_units, self.recv_units):
            if what not in _UNITS:
                raise ValueError(f"pattern {self.name}: units {what!r} (valid: {', '.join(_UNITS)})")
        if self.unit not in ("count", "block"):
            raise ValueError(f"pattern {self.name}: unit {self.unit!r} (valid: count, block)")

    @property
    def aliases(self) -> bool:
        """Whether an in-place call passes two aliased buffers the schedule must be right for
        (a rooted pattern's in-place call is snapshotted: nothing is verified for it)."""
        return not self.rooted and self.inplace != "one-buffer"

    def units(self, p: int) -> dict[str, int]:
        """The send and recv buffers' lengths in units at p ranks (a buffer it lacks: absent)."""
        count = {"1": 1, "p": p}
        return {buf: count[what] for buf, what in (("send", self.send_units),
                                                   ("recv", self.recv_units)) if what != "-"}


def _broadcast(inputs: Sequence[np.ndarray], combine: Combine, root: int
               ) -> list[np.ndarray | None]:
    return [inputs[root].copy() for _ in inputs]


def _reduce(inputs: Sequence[np.ndarray], combine: Combine, root: int
            ) -> list[np.ndarray | None]:
    full = combine(inputs)
    return [full.copy() if r == root else None for r in range(len(inputs))]


def _allreduce(inputs: Sequence[np.ndarray], combine: Combine, root: int
               ) -> list[np.ndarray | None]:
    full = combine(inputs)
    return [full.copy() for _ in inputs]


def _allgather(inputs: Sequence[np.ndarray], combine: Combine, root: int
               ) -> list[np.ndarray | None]:
    full = np.concatenate(inputs)
    return [full.copy() for _ in inputs]


def _reduce_scatter(inputs: Sequence[np.ndarray], combine: Combine, root: int
                    ) -> list[np.ndarray | None]:
    full, p = combine(inputs), len(inputs)
    unit = full.size // p
    return [full[r * unit:(r + 1) * unit].copy() for r in range(p)]


def _alltoall(inputs: Sequence[np.ndarray], combine: Combine, root: int
              ) -> list[np.ndarray | None]:
    p = len(inputs)
    unit = inputs[0].size // p
    return [np.concatenate([inputs[u][r * unit:(r + 1) * unit] for u in range(p)])
            for r in range(p)]


PATTERNS: dict[str, Pattern] = {p.name: p for p in (
    Pattern("broadcast", rooted=True, reduces=False, inplace="one-buffer", unit="count",
            send_units="-", recv_units="1", result=_broadcast),
    Pattern("reduce", rooted=True, reduces=True, inplace="same", unit="count",
            send_units="1", recv_units="1", result=_reduce),
    Pattern("allreduce", rooted=False, reduces=True, inplace="same", unit="count",
            send_units="1", recv_units="1", result=_allreduce),
    Pattern("allgather", rooted=False, reduces=False, inplace="send-in-recv", unit="block",
            send_units="1", recv_units="p", result=_allgather),
    Pattern("reduce-scatter", rooted=False, reduces=True, inplace="recv-in-send", unit="block",
            send_units="p", recv_units="1", result=_reduce_scatter),
    Pattern("alltoall", rooted=False, reduces=False, inplace="same", unit="block",
            send_units="p", recv_units="p", result=_alltoall),
)}
