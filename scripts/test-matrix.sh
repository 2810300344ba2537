#!/usr/bin/env bash
# The test cells the default run (and CI) leaves out: further cells of kinds the default run
# covers with one cell each (more world sizes, dtypes, launch modes, the whole GPU check
# script on its CPU twin). Run before a release and report the result:
#   bash scripts/test-matrix.sh            # 10 tests, 4 minutes on a quiet 2-core machine
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m pytest -q -p no:cacheprovider -m matrix "$@"
