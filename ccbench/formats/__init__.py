"""Files other tools write or read, in and out of ccbench's data.

Readers: `load_trace(paths)` reads one execution-trace file per rank (or a folder of them),
PyTorch ET JSON (`pytorch_et`) or Chakra ET (`chakra_et`), with the capture file beside it
(`named`, written by `capture`), into a `ccbench.trace.Trace`: every communication op of
every rank, in issue order. Replay (`ccbench replay`), prediction (`simulate --trace`) and
the ASTRA-sim export all start from that one parsed trace.

Codec: `chakra` (Chakra's protobuf schema, built without protoc; read and write).

Writers: `astra` (ASTRA-sim network/system configs and Chakra workloads from a fitted model,
and running the binaries), `astra_trace` (a recorded trace as ASTRA-sim inputs).

Dependencies point one way: formats -> model -> trace; nothing in model/ or trace/ reads or
writes a file format. No module here imports a backend.
"""

from ccbench.formats.load import load_trace

__all__ = ["load_trace"]
