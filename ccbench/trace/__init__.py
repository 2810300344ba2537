"""A trace's communication as data, and the rules about it, with no file format and no backend.

`ops`: the parsed form (`Trace`, one `CommOp` per call, `Group`); `groups`: matching each
rank's calls into collective calls and exchanges; `scale`: resizing a trace to another world;
`summary`: what a replay reports per op. Reading trace files is `ccbench.formats`
(`load_trace`); replaying a trace on a backend is `ccbench.replay`; predicting it is
`ccbench.model.tracesim`. (`subcomm`, the sub-communicators replay makes per backend, is the
one module here that knows a backend; it belongs with the backends.)
"""

from ccbench.trace.ops import CommOp, Group, Trace, TraceError

__all__ = ["CommOp", "Group", "Trace", "TraceError"]
