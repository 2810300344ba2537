"""What to run next: the sizes a case still misses, grouped into benchmark invocations, and
the command line and environment of each."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ccbench.bench.options import option_argv
from ccbench.errors import UsageError
from ccbench.records import CaseId
from ccbench.run.launcher_env import LOCAL, MPI_ENVS, TORCHRUN
from ccbench.run.launcher_env import variables as launcher_variables
from ccbench.run.launchers import mpiexec_beside
from ccbench.sweep.spec import Sweep, SweepCase

__all__ = ["CaseRun", "missing_sizes", "plan_runs", "case_label", "bench_arguments",
           "build_case_command", "case_environment", "LAUNCHER_IDENTITY_VARS"]

def missing_sizes(case: SweepCase, done: Mapping[CaseId, set[int]]) -> list[int]:
    have = done.get(case.identity, set())
    return [size for size in case.sizes if size not in have]


@dataclass(frozen=True, slots=True)
class CaseRun:
    """One benchmark invocation: cases that differ only in mode and miss the same sizes run
    together (the benchmark measures both modes in one pass)."""

    cases: tuple[SweepCase, ...]
    sizes: tuple[int, ...]

    @property
    def first(self) -> SweepCase:
        return self.cases[0]

    @property
    def modes(self) -> tuple[str, ...]:
        return tuple(case.mode for case in self.cases)


def plan_runs(cases: Iterable[SweepCase], done: Mapping[CaseId, set[int]]) -> list[CaseRun]:
    runs: list[CaseRun] = []
    pending: dict[CaseId, list[tuple[SweepCase, tuple[int, ...]]]] = {}
    for case in cases:
        sizes = tuple(missing_sizes(case, done))
        if sizes:
            base = case.identity.without({"inplace"})     # everything but the mode
            pending.setdefault(base, []).append((case, sizes))
    for entries in pending.values():
        if len(entries) == 2 and entries[0][1] == entries[1][1]:
            runs.append(CaseRun(cases=(entries[0][0], entries[1][0]), sizes=entries[0][1]))
        else:
            runs.extend(CaseRun(cases=(case,), sizes=sizes) for case, sizes in entries)
    return runs


def case_label(case: SweepCase) -> str:
    op = f" {case.op}" if case.op else ""
    return (f"{case.collective} {case.backend} {case.dtype}{op} {case.mode} "
            f"{case.nodes}x{case.ranks_per_node}")


# -- running ----------------------------------------------------------------------------------

def _needs_mpi(backend: str) -> bool:
    from ccbench.backends import backend_class

    return bool(backend_class(backend).needs_mpi_launcher)


def bench_arguments(sweep: Sweep, run: CaseRun, output: str | os.PathLike[str]) -> list[str]:
    case = run.first
    args = [case.collective, "--backend", case.backend, "--sizes", ",".join(map(str, run.sizes)),
            "--dtype", case.dtype, "--op", case.op or sweep.ops[0], "--timing", sweep.timing]
    if len(run.cases) == 1:
        args.append("--inplace" if case.inplace else "--outofplace")
    return [*args, *option_argv(sweep.bench), "--output", str(output), "--quiet"]


def build_case_command(sweep: Sweep, run: CaseRun, output: str | os.PathLike[str],
                       where: str, python: str | None = None) -> list[str]:
    """argv of one case: `ccbench launch` locally; srun or mpiexec inside a Slurm allocation."""
    python = python or sys.executable
    case = run.first
    bench = bench_arguments(sweep, run, output)
    if where == "local":
        if case.nodes != 1:
            raise UsageError(f"{sweep.source}: nodes: a local sweep runs on one node, "
                             f"got {case.nodes} (use --slurm)")
        return [python, "-m", "ccbench", "launch", "-n", str(case.world_size), *bench]
    launcher = sweep.launcher
    if launcher == "auto":
        launcher = "mpiexec" if _needs_mpi(case.backend) else "srun"
    if launcher == "mpiexec":
        # Intel MPI / MPICH Hydra: starts its proxies on the allocation's nodes through srun
        mpiexec = sweep.mpiexec or _default_mpiexec(python)
        return [mpiexec, "-n", str(case.world_size), "-ppn", str(case.ranks_per_node),
                python, "-m", "ccbench", *bench]
    return ["srun", f"--nodes={case.nodes}", f"--ntasks={case.world_size}",
            f"--ntasks-per-node={case.ranks_per_node}", "--kill-on-bad-exit=1",
            python, "-m", "ccbench", *bench]


def _default_mpiexec(python: str) -> str:
    return mpiexec_beside(python) or "mpiexec"


# Variables by which a process learns its rank from a launcher (ccbench.run.launchers reads them,
# MPI and torchrun first, srun last). The process that runs a sweep is not a rank of the
# cases it starts, but it can carry such variables from where it was started: an MPI
# singleton (Intel MPI's MPI_Init with no mpiexec) sets MPI_LOCALRANKID and MPI_LOCALNRANKS
# in its own environment, every child inherits them, and sbatch exports them into the job.
# Left in, every srun task of a case finds them, takes itself for rank 0 of a one-rank MPI
# world, and writes its own record of every size. The launcher of the case sets the ones
# that apply to it; the sweep's `env:` can still set any of them on purpose.
# (srun's stay: a case runs inside the sbatch job they name)
LAUNCHER_IDENTITY_VARS = launcher_variables((LOCAL, TORCHRUN, *MPI_ENVS))
_LAUNCHER_IDENTITY_PREFIXES = ("OMPI_COMM_WORLD_",)


def case_environment(sweep: Sweep, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a case starts with: this process's, less launcher identity variables
    it inherited (see LAUNCHER_IDENTITY_VARS), plus the sweep's `env:`."""
    base = os.environ if environ is None else environ
    env = {name: value for name, value in base.items()
           if name not in LAUNCHER_IDENTITY_VARS
           and not name.startswith(_LAUNCHER_IDENTITY_PREFIXES)}
    return {**env, **sweep.env}


