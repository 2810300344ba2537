"""Which environment variables each launcher sets in the ranks it starts: the one table that
launch detection (launchers), the rank-process scans (procfs, arrivals), `ccbench launch`'s
own ranks (supervisor), doctor and the sweep's clean case environment all read."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CONTROL_VAR", "LAUNCHER_ENVS", "LOCAL", "MPI_ENVS", "MPI_RANK_VARS", "RANK_VARS",
           "SRUN", "TORCHRUN", "LauncherEnv", "variables"]

#: the control store address `ccbench launch` gives its plain ranks
CONTROL_VAR = "CCBENCH_CONTROL"


@dataclass(frozen=True, slots=True)
class LauncherEnv:
    """The variables one launcher sets in each rank's environment."""

    name: str
    rank: str
    size: str
    local_rank: str
    local_size: str
    # together, they tell one run's ranks from another's (ccbench.run.arrivals)
    run_keys: tuple[str, ...] = ()
    # also set by it: shown by doctor, and cleared from a sweep case's inherited environment
    others: tuple[str, ...] = ()

    def names(self) -> tuple[str, ...]:
        return (self.rank, self.size, self.local_rank, self.local_size, *self.run_keys,
                *self.others)


LOCAL = LauncherEnv("local", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                    run_keys=(CONTROL_VAR,))
TORCHRUN = LauncherEnv("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                       run_keys=("TORCHELASTIC_RUN_ID", "MASTER_PORT"),
                       others=("MASTER_ADDR", "GROUP_RANK", "TORCHELASTIC_RESTART_COUNT"))
# the local size is SLURM_TASKS_PER_NODE's entry for this node (a list such as "2(x3),1")
SRUN = LauncherEnv("srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_TASKS_PER_NODE",
                   run_keys=("SLURM_JOB_ID", "SLURM_STEP_ID"), others=("SLURM_NODELIST",))
# mpiexec, in the order they are read: Open MPI, hydra (MPICH, Intel MPI), PMIx. Hydra's local
# variables: Intel MPI also sets them in a process that merely called MPI_Init (a singleton),
# and every child of that process inherits them, so they never say alone that a launcher ran.
MPI_ENVS = (
    LauncherEnv("mpiexec (Open MPI)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    LauncherEnv("mpiexec (hydra)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
                others=("PMI_FD", "PMI_PORT", "PMI_ID")),
    LauncherEnv("mpiexec (PMIx)", "PMIX_RANK", "PMIX_SIZE", "", ""),
)
LAUNCHER_ENVS = (LOCAL, TORCHRUN, SRUN, *MPI_ENVS)


def variables(envs: tuple[LauncherEnv, ...] = LAUNCHER_ENVS) -> tuple[str, ...]:
    """Every variable the given launchers set, each once, in table order."""
    return tuple(dict.fromkeys(name for env in envs for name in env.names() if name))


#: set by an MPI launcher for each rank it starts
MPI_RANK_VARS = tuple(env.rank for env in MPI_ENVS)
#: a rank's number, under any launcher
RANK_VARS = tuple(dict.fromkeys(env.rank for env in LAUNCHER_ENVS))
