"""What a record measured: the one typed case identity every command keys on by field name.

A `CaseId` holds every field that changes what was measured, plus the run that measured it.
Commands that need a coarser view (the same case across runs, a sweep's case, a fit group)
take `case.only(...)` or `case.without(...)`: the same type with the other fields cleared, so
keys stay typed and named and a new identity field is added here, once.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ccbench.records.schema import Record

__all__ = ["CaseId", "RecordKey", "CASE_ID_FIELDS", "run_metadata"]


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseId:
    """Every field that changes a measurement, and the run id. Cleared fields hold
    their type's empty value ("", 0, False, None); compare only keys cleared alike."""

    collective: str = ""
    backend: str = ""               # registry name: gloo, mpi, ring@mpi ...
    library: str = ""               # "Intel(R) MPI Library", "MPICH", "gloo" ...
    library_version: str = ""
    algorithm: str = ""             # native, ring, tree ...
    transport: str = ""             # the library carrying the bytes
    device: str = ""
    dtype: str = ""
    op: str | None = None           # None for collectives that do not reduce
    inplace: bool = False
    timing: str = ""                # per-op | pipelined
    root: int = 0
    world_size: int = 0
    nodes: int = 0
    ranks_per_node: int = 0
    run_id: str = ""

    @classmethod
    def of(cls, record: Record) -> CaseId:
        return cls(**{name: getattr(record, name) for name in CASE_ID_FIELDS})

    def only(self, names: Collection[str]) -> CaseId:
        """This case with every field not in `names` cleared."""
        _check(names)
        return replace(_EMPTY, **{name: getattr(self, name) for name in names})

    def without(self, names: Collection[str]) -> CaseId:
        """This case with the fields in `names` cleared."""
        _check(names)
        return replace(self, **{name: getattr(_EMPTY, name) for name in names})

    def describe(self) -> str:
        """`allreduce gloo float32 sum out-of-place 2 ranks` -- for messages and legends."""
        mode = "in-place" if self.inplace else "out-of-place"
        parts = [self.collective, self.backend, self.dtype, self.op or "", mode,
                 f"{self.world_size} ranks" if self.world_size else ""]
        if self.run_id:
            parts.append(f"run {self.run_id}")
        return " ".join(p for p in parts if p)


CASE_ID_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(CaseId))
_EMPTY = CaseId()


def _check(names: Collection[str]) -> None:
    unknown = set(names) - set(CASE_ID_FIELDS)
    if unknown:
        raise ValueError(f"not case identity fields: {sorted(unknown)}")


@dataclass(frozen=True, kw_only=True, slots=True)
class RecordKey:
    """One measurement: a case of one run at one asked size. Two records with the same key
    are the same measurement (a duplicate); anything else is a distinct measurement."""

    case: CaseId
    size_asked: int

    @classmethod
    def of(cls, record: Record) -> RecordKey:
        return cls(case=CaseId.of(record), size_asked=record.size_asked)


# What every record of one run shares (one ccbench process tree on one set of hosts). Two
# records that claim the same run id but differ here come from different runs. The method
# keys are the caller's: those ccbench.bench.options.method_record writes (run_method_keys(),
# every Method field and the run's); records/ holds data and never imports the benchmark.
_RUN_ENVIRONMENT_KEYS = ("cpu", "num_cpus", "python", "platform", "hostname", "numpy", "torch",
                         "variables")


def run_metadata(record: Record, method_keys: Iterable[str]) -> dict[str, object]:
    """The fields every record of one run must share: its hosts, world, timing, environment
    and the entries of record.method named by `method_keys`."""
    return {
        "ccbench_version": record.ccbench_version, "hosts": list(record.hosts),
        "world_size": record.world_size, "nodes": record.nodes,
        "ranks_per_node": record.ranks_per_node, "timing": record.timing,
        **{f"method.{k}": record.method.get(k) for k in method_keys},
        **{f"environment.{k}": record.environment.get(k) for k in _RUN_ENVIRONMENT_KEYS},
    }
