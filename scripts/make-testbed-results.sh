#!/usr/bin/env bash
# The cost model against the testbed's shaped network (results/testbed/), one command, as root:
#
#   scripts/make-testbed-results.sh            # measure (switch 2,3,4,6,8 hosts; two-tier 4 and 8;
#                                              # the cores' limit), then analyze
#   scripts/make-testbed-results.sh --analyze  # only the tables and figures from results/testbed/data
#
# LINK (default 100M) is the configured link rate; TRAIN (default 2,4) the world sizes the
# model is fitted on. It brings up its own testbed for each host count and takes it down
# again; it refuses to start while another testbed is up. About 40 min on 2 loaded cores.
set -euo pipefail
cd "$(dirname "$0")/.."
LINK="${LINK:-100M}"
TRAIN="${TRAIN:-2,4}"
PY="${PYTHON:-python}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [[ "${1:-}" != "--analyze" ]]; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "make-testbed-results: error: measuring needs root (ccbench testbed); --analyze does not" >&2
    exit 2
  fi
  "$PY" benchmarks/testbed_validation.py measure --hosts 2,3,4,6,8 --link "$LINK"
  "$PY" benchmarks/testbed_validation.py twotier --hosts 4,8 --leaves 2 --oversub 2 --link "$LINK"
  "$PY" benchmarks/testbed_validation.py limit --hosts 8 --rates 100M,200M,400M,1G
fi
"$PY" benchmarks/testbed_validation.py analyze --train "$TRAIN" --link "$LINK"
