#!/usr/bin/env bash
# Run ccbench under srun inside a Slurm allocation (rank from SLURM_PROCID, size from
# SLURM_NTASKS, rendezvous on the first host of SLURM_NODELIST).
#
#   salloc -N 2 --ntasks-per-node 4 launch/srun.sh allreduce --backend gloo --sizes 1K-64M
#
# Arguments: ccbench benchmark arguments. SRUN_ARGS adds srun options (e.g. "--gpus-per-task 1").
# MPI backends need ranks started by mpiexec or by srun with a PMI library that the MPI reads
# (Intel MPI: I_MPI_PMI_LIBRARY=/path/libpmi2.so and SRUN_ARGS=--mpi=pmi2); launch/mpirun.sh
# inside the allocation works without it.
set -euo pipefail
if [[ $# -lt 1 ]]; then
    echo "usage: $0 COLLECTIVE [ccbench options...]" >&2
    exit 2
fi
if [[ -z ${SLURM_JOB_ID:-} ]]; then
    echo "$0: not inside a Slurm allocation (run it under salloc or sbatch)" >&2
    exit 2
fi
# shellcheck disable=SC2086  # SRUN_ARGS is a list of options on purpose
exec srun --kill-on-bad-exit=1 ${SRUN_ARGS:-} "${PYTHON:-python}" -m ccbench "$@"
