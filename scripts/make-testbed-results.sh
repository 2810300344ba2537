#!/usr/bin/env bash
# The cost model against the testbed's shaped network (results/testbed/), one command, as root:
#
#   scripts/make-testbed-results.sh            # measure (switch 2,3,4,6,8 hosts; two-tier 8), analyze
#   scripts/make-testbed-results.sh --analyze  # only the tables and figures from results/testbed/data
#
# LINK (default 100M) is the configured link rate; TRAIN (default 2,4) the world sizes the
# model is fitted on. It brings up its own testbed for each host count and takes it down
# again; it refuses to start while another testbed is up.
set -euo pipefail
cd "$(dirname "$0")/.."
LINK="${LINK:-100M}"
TRAIN="${TRAIN:-2,4}"
PY="${PYTHON:-python}"
if [[ "${1:-}" != "--analyze" ]]; then
  "$PY" benchmarks/testbed_validation.py measure --hosts 2,3,4,6,8 --link "$LINK"
  "$PY" benchmarks/testbed_validation.py twotier --hosts 8 --leaves 2 --oversub 2 --link "$LINK"
fi
"$PY" benchmarks/testbed_validation.py analyze --train "$TRAIN" --link "$LINK"
