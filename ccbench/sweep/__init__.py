"""Sweeps: a YAML file that names a cross product of cases, run locally or as a Slurm job array.

A sweep file (all keys but one of collectives/backends optional; see slurm/sweeps/*.yaml)::

    name: calibration                 # default: the file name without .yaml
    collectives: [allreduce, allgather]   # or "all", or "allreduce,allgather"
    backends: [mpi, ring@mpi]
    dtypes: [float32]
    ops: [sum]                        # only reducing collectives take an op
    sizes: 8-16M                      # ccbench size syntax
    nodes: [1]                        # world = nodes x ranks_per_node, cross product
    ranks_per_node: [2, 3, 4]
    modes: [out-of-place, in-place]
    timing: per-op
    iters: 20                         # every benchmark option (ccbench.bench.options): iters,
    pipeline: 10                      # warmup, min_time, max_iters, pipeline, check, timeout,
    device: cpu                       # connect_timeout, root, device, mpi_thread_level,
                                      # nccl_algo, nccl_proto; the same checks as the flags
    case_timeout: 3600                # seconds one case may run before it is killed
    launcher: auto                    # under Slurm: auto (mpiexec for MPI backends, else srun)
    group_by: [backend]               # cases of one world are split into array tasks by these
    results: results/calibration      # default results/<name>, relative to the working dir
    env: {I_MPI_WAIT_MODE: "1"}       # exported to every case
    slurm: {partition: debug, time: "00:30:00", max_parallel: 4}

A *case* is one (collective, backend, dtype, op, mode, nodes, ranks per node) with a list of
sizes; it is complete when a record of every size is in some results file of the sweep. Cases
are grouped into *tasks* (one Slurm array task each); task i appends to
<results>/task-<i>.jsonl and nothing else writes that file (a lock file guards it), so a rerun
only measures the sizes no file holds yet.
"""

from ccbench.sweep.local import run_local, run_task
from ccbench.sweep.plan import (
    LAUNCHER_IDENTITY_VARS,
    CaseRun,
    bench_arguments,
    build_case_command,
    case_environment,
    case_label,
    missing_sizes,
    plan_runs,
)
from ccbench.sweep.spec import (
    BENCH_KEYS,
    SWEEP_CASE_FIELDS,
    Sweep,
    SweepCase,
    Task,
    check_slurm_options,
    load_sweep,
    measurable_sizes,
    sweep_from_dict,
)
from ccbench.sweep.state import (
    STATE_VERSION,
    completed,
    current_case_file,
    done_sizes,
    load_skipped,
    load_sweep_records,
    read_current_cases,
    result_files,
    skipped_file,
    task_is_locked,
    task_lock,
    write_current_cases,
    write_skipped,
)

__all__ = [
    "run_local", "run_task", "LAUNCHER_IDENTITY_VARS", "CaseRun", "bench_arguments",
    "build_case_command", "case_environment", "case_label", "missing_sizes", "plan_runs",
    "BENCH_KEYS", "SWEEP_CASE_FIELDS", "Sweep", "SweepCase", "Task", "check_slurm_options",
    "load_sweep", "measurable_sizes", "sweep_from_dict", "STATE_VERSION", "completed",
    "current_case_file", "done_sizes", "load_skipped", "load_sweep_records",
    "read_current_cases", "result_files", "skipped_file", "task_is_locked", "task_lock",
    "write_current_cases", "write_skipped",
]
