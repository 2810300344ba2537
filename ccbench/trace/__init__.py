"""Execution traces in (PyTorch ET JSON, Chakra ET), the communication they contain out.

`load_trace(paths)` reads one file per rank (or a folder of them) into a `Trace`: every
communication op of every rank, in issue order, with its collective, bytes in and out, dtype,
root or peer, process group ranks and, when the trace has them, start times and durations.
Replay (`ccbench replay`), prediction (`simulate --trace`) and the ASTRA-sim export all start
from that one parsed trace. This package never imports a backend; `ccbench.trace.replay`
(the per-rank replay loop) is the only module that does.
"""

from ccbench.trace.load import load_trace
from ccbench.trace.ops import CommOp, Group, Trace, TraceError

__all__ = ["CommOp", "Group", "Trace", "TraceError", "load_trace"]
