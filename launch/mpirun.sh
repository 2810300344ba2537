#!/usr/bin/env bash
# Run ccbench under mpiexec (Intel MPI, MPICH or Open MPI); rank and size come from the MPI launcher.
#
#   launch/mpirun.sh 4 allreduce --backend mpi,ring@mpi --sizes 8-16M --output results/ar.jsonl
#
# First argument: number of ranks. The rest: ccbench benchmark arguments. MPIEXEC picks the
# launcher (default: the mpiexec beside $PYTHON, else the one on PATH); MPIEXEC_ARGS adds
# options such as "-ppn 4 -hosts a,b".
set -euo pipefail
if [[ $# -lt 2 ]]; then
    echo "usage: $0 NRANKS COLLECTIVE [ccbench options...]" >&2
    exit 2
fi
nranks=$1
shift
python=${PYTHON:-python}
python_dir=$(dirname "$(command -v "$python")")
mpiexec=${MPIEXEC:-}
if [[ -z $mpiexec ]]; then
    if [[ -x $python_dir/mpiexec ]]; then mpiexec=$python_dir/mpiexec; else mpiexec=mpiexec; fi
fi
# shellcheck disable=SC2086  # MPIEXEC_ARGS is a list of options on purpose
exec "$mpiexec" -n "$nranks" ${MPIEXEC_ARGS:-} "$python" -m ccbench "$@"
