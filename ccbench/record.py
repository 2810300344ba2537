"""The results record: one JSON object per (case, size), appended as JSON lines.

Schema history (bump SCHEMA_VERSION on any change that a reader must know about,
keep an old file in tests/fixtures for every version still read):

1 -- first version: case fields, sizes asked/used, time statistics in us,
     per-iteration samples (max over ranks) and per-rank medians, algbw/busbw
     in GB/s (1e9 bytes), wrong, method and environment blocks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ccbench.errors import UsageError

SCHEMA = "ccbench.record"
SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})

__all__ = [
    "SCHEMA", "SCHEMA_VERSION", "Record", "append_record", "case_key", "load_records",
    "record_from_dict",
]


@dataclass(kw_only=True, slots=True)
class Record:
    """One measured (case, size). Times are microseconds, bandwidths GB/s (1e9 B/s)."""

    run_id: str
    timestamp: str                    # ISO 8601, UTC, when the size finished
    ccbench_version: str
    collective: str                   # broadcast | allreduce | allgather | reduce-scatter | alltoall
    backend: str                      # registry name: gloo, mpi, oneccl, nccl, rccl, ring@mpi ...
    library: str                      # e.g. "Intel(R) MPI Library", "gloo", "NCCL"
    library_version: str
    algorithm: str                    # "native" for a library's own choice, else ring, tree ...
    transport: str                    # the library that carries the bytes (= backend if native)
    device: str                       # cpu | cuda:0 ...
    dtype: str
    op: str | None                    # None for collectives that do not reduce
    inplace: bool
    timing: str                       # per-op | pipelined
    world_size: int
    nodes: int
    ranks_per_node: int
    hosts: list[str]
    root: int
    size_asked: int                   # bytes, the S the user asked for
    size_used: int                    # bytes, S after rounding counts to divisibility
    count: int                        # elements, as the nccl-tests count column
    iterations: int
    warmup: int
    time_us: dict[str, float]         # median, mean, min, p5, p95, max, stdev
    samples_us: list[float]           # per timed iteration, max over ranks
    rank_median_us: list[float]       # per rank, median of its own iteration times
    algbw_gbps: float                 # size_used / median time
    busbw_gbps: float                 # algbw x nccl-tests factor
    wrong: int | None                 # wrong elements summed over ranks; None = not checked
    method: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    schema: str = SCHEMA
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))


_FIELD_NAMES = frozenset(f.name for f in fields(Record))

# The fields that identify a measurement; two records with the same key measured the same thing.
CASE_FIELDS = ("collective", "backend", "algorithm", "transport", "device", "dtype", "op",
               "inplace", "timing", "world_size", "nodes", "ranks_per_node", "root")


def case_key(record: Record | dict[str, Any], with_size: bool = True) -> tuple[Any, ...]:
    data = record if isinstance(record, dict) else asdict(record)
    key = tuple(data[name] for name in CASE_FIELDS)
    return key + (data["size_asked"],) if with_size else key


def record_from_dict(data: dict[str, Any], where: str = "record") -> Record:
    if data.get("schema") != SCHEMA:
        raise UsageError(f"{where}: not a ccbench record (schema {data.get('schema')!r})")
    version = data.get("schema_version")
    if version not in SUPPORTED_VERSIONS:
        raise UsageError(
            f"{where}: unknown record schema version {version!r} "
            f"(this ccbench reads: {', '.join(map(str, sorted(SUPPORTED_VERSIONS)))})")
    unknown = set(data) - _FIELD_NAMES
    if unknown:
        raise UsageError(f"{where}: unknown record fields {sorted(unknown)}")
    try:
        return Record(**data)
    except TypeError as exc:
        raise UsageError(f"{where}: malformed record: {exc}") from None


def append_record(path: str | os.PathLike[str], record: Record) -> None:
    """Append one line and fsync, so a crash loses at most the size in flight."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(record.to_json() + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def iter_result_files(paths: Iterable[str | os.PathLike[str]]) -> Iterator[Path]:
    """Files named directly, and every *.jsonl below a named folder."""
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            yield from sorted(path.rglob("*.jsonl"))
        elif path.exists():
            yield path
        else:
            raise UsageError(f"no such results file or folder: {str(path)!r}")


def load_records(*paths: str | os.PathLike[str]) -> list[Record]:
    """Every record of the given files/folders; a truncated last line (a crash) is skipped."""
    records: list[Record] = []
    for path in iter_result_files(paths):
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                if number == len(lines):      # torn final write of a killed run
                    continue
                raise UsageError(f"{path}:{number}: not valid JSON") from None
            records.append(record_from_dict(data, f"{path}:{number}"))
    return records
