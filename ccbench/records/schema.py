"""The results record: one JSON object per (case, size), appended as JSON lines.

Schema history (bump SCHEMA_VERSION on any change that a reader must know about,
keep an old file in tests/fixtures for every version still read):

1 -- first version: case fields, sizes asked/used, time statistics in us,
     per-iteration samples (max over ranks) and per-rank medians, algbw/busbw
     in GB/s (1e9 bytes), wrong, method and environment blocks.
     The case identity (ccbench.records.identity.CaseId) is made of fields
     every version-1 record already holds, so naming it needed no new version.
"""

from __future__ import annotations

import json
import math
import types
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from ccbench.errors import UsageError

SCHEMA = "ccbench.record"
SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})

__all__ = ["SCHEMA", "SCHEMA_VERSION", "SUPPORTED_VERSIONS", "Record", "BadRecord",
           "record_from_dict"]


@dataclass(kw_only=True, slots=True)
class Record:
    """One measured (case, size). Times are microseconds, bandwidths GB/s (1e9 B/s)."""

    run_id: str                       # one per launch; records of one run share it
    timestamp: str                    # ISO 8601, UTC, when the size finished
    ccbench_version: str              # the ccbench that measured
    collective: str                   # broadcast | allreduce | allgather | reduce-scatter | alltoall
    backend: str                      # registry name: gloo, mpi, oneccl, nccl, rccl, ring@mpi ...
    library: str                      # e.g. "Intel(R) MPI Library", "gloo", "NCCL"
    library_version: str              # as the library reports it
    algorithm: str                    # "native" for a library's own choice, else ring, tree ...
    transport: str                    # the library that carries the bytes (= backend if native)
    device: str                       # cpu | cuda:0 ...
    dtype: str                        # float32, bfloat16, int8 ... (torch names)
    op: str | None                    # None for collectives that do not reduce
    inplace: bool                     # in place (one buffer) or out of place
    timing: str                       # per-op | pipelined
    world_size: int                   # ranks
    nodes: int                        # distinct hosts
    ranks_per_node: int               # world_size / nodes
    hosts: list[str]                  # host names, sorted
    root: int                         # root rank of broadcast and reduce
    size_asked: int                   # bytes, the S the user asked for
    size_used: int                    # bytes, S after rounding counts to divisibility
    count: int                        # elements, as the nccl-tests count column
    iterations: int                   # timed iterations (after --min-time raised them)
    warmup: int                       # untimed iterations before them
    time_us: dict[str, float]         # median, mean, min, p5, p95, max, stdev
    samples_us: list[float]           # per timed iteration, max over ranks
    rank_median_us: list[float]       # per rank, median of its own iteration times
    algbw_gbps: float                 # size_used / median time
    busbw_gbps: float                 # algbw x nccl-tests factor
    wrong: int | None                 # wrong elements summed over ranks; None = not checked
    method: dict[str, Any] = field(default_factory=dict)       # timing, launcher; diagnose, pct_of_expected
    environment: dict[str, Any] = field(default_factory=dict)  # CPU/GPU, versions, NCCL_/CCL_/MPI variables
    schema: str = SCHEMA              # always ccbench.record
    schema_version: int = SCHEMA_VERSION  # see the history above

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @property
    def case(self) -> CaseId:
        """What this record measured (every field that changes the measurement, and the run)."""
        from ccbench.records.identity import CaseId

        return CaseId.of(self)


if typing.TYPE_CHECKING:
    from ccbench.records.identity import CaseId


class BadRecord(ValueError):
    """A line that is not a usable record; the reader skips it and says where and why."""


_HINTS = typing.get_type_hints(Record)
_REQUIRED = frozenset(f.name for f in fields(Record)
                      if f.default is MISSING and f.default_factory is MISSING)


def _is(value: Any, hint: Any) -> bool:
    """Whether a JSON value fits a field's annotation (the few shapes Record uses)."""
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_is(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(_is(v, item) for v in value)
    if origin is dict:
        key, item = typing.get_args(hint)
        return isinstance(value, dict) and all(_is(k, key) and _is(v, item)
                                               for k, v in value.items())
    raise TypeError(f"Record field type {hint!r} has no JSON check")   # a schema edit missed here


def _type_name(hint: Any) -> str:
    return str(hint).replace("typing.", "").replace("<class '", "").replace("'>", "")


def record_from_dict(data: Any) -> Record:
    """A Record from one decoded JSON line.

    Raises BadRecord for a line that is not a well-formed record (the reader skips it) and
    UsageError for a record of a schema version this ccbench does not read (the reader stops:
    a newer writer's data must not be dropped silently)."""
    if not isinstance(data, dict):
        raise BadRecord(f"not a JSON object but {type(data).__name__} {_short(data)}")
    if data.get("schema") != SCHEMA:
        raise BadRecord(f"not a ccbench record (schema {_short(data.get('schema'))})")
    version = data.get("schema_version")
    if version not in SUPPORTED_VERSIONS:
        raise UsageError(
            f"unknown record schema version {_short(version)} "
            f"(this ccbench reads: {', '.join(map(str, sorted(SUPPORTED_VERSIONS)))}; "
            f"a newer ccbench wrote it)")
    unknown = sorted(set(data) - set(_HINTS))
    if unknown:
        raise BadRecord(f"unknown field(s) {', '.join(unknown)}")
    missing = sorted(_REQUIRED - set(data))
    if missing:
        raise BadRecord(f"missing field(s) {', '.join(missing)}")
    for name, value in data.items():
        if not _is(value, _HINTS[name]):
            raise BadRecord(f"field {name!r} is {_short(value)}, expected {_type_name(_HINTS[name])}")
    record = Record(**data)
    problem = implausible(record)
    if problem:
        raise UsageError(f"{problem} (a damaged or forged record)")
    return record


MAX_SIZE = 1 << 50                 # bytes: a PiB per collective is beyond any machine
MAX_COUNT = 1 << 40                # iterations, wrong elements
MAX_RANKS = 1 << 24
MAX_TIME_US = 1e12                 # 11.6 days for one operation
MIN_TIME_US = 1e-6                 # a picosecond: ratios of two times stay finite


def _out_of_range(name: str, value: float, low: float, high: float) -> str | None:
    if low <= value <= high:       # False for NaN
        return None
    return f"{name} is {value!r}, outside {low:g} to {high:g}"


def _bad_times(name: str, values: list[float], positive: bool = True) -> str | None:
    """Times are finite microseconds up to MAX_TIME_US, at least MIN_TIME_US (a spread: 0)."""
    for value in values:
        if not (math.isfinite(value) and (value >= MIN_TIME_US if positive else value >= 0)
                and value <= MAX_TIME_US):
            low = f"{MIN_TIME_US:g}" if positive else "0"
            return f"{name} holds {value!r}: times are finite, {low} to {MAX_TIME_US:g} us"
    return None


def implausible(record: Record) -> str | None:
    """What makes a well-typed record's values impossible (a time that is not a finite
    positive number, a size or count out of range), or None."""
    median = record.time_us.get("median")
    if median is None:
        return "time_us has no median"
    checks = [
        *(_out_of_range(name, getattr(record, name), 0, MAX_SIZE)
          for name in ("size_asked", "size_used", "count")),
        *(_out_of_range(name, getattr(record, name), 0, MAX_COUNT)
          for name in ("iterations", "warmup")),
        _out_of_range("world_size", record.world_size, 1, MAX_RANKS),
        *(_out_of_range(name, getattr(record, name), 0, MAX_RANKS)
          for name in ("nodes", "ranks_per_node")),
        _out_of_range("root", record.root, -1, MAX_RANKS),
        None if record.wrong is None else _out_of_range("wrong", record.wrong, 0, MAX_COUNT),
        *(_out_of_range(name, getattr(record, name), 0, 1e9)          # GB/s
          for name in ("algbw_gbps", "busbw_gbps")),
        _bad_times("time_us median", [median]),
        _bad_times("time_us", list(record.time_us.values()), positive=False),
        _bad_times("samples_us", record.samples_us),
        _bad_times("rank_median_us", record.rank_median_us),
    ]
    return next((problem for problem in checks if problem), None)


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
