#!/usr/bin/env bash
# The cost model against the testbed's shaped network (results/testbed/), one command, as root:
#
#   scripts/make-testbed-results.sh            # measure (switch 2,3,4,6,8 hosts; two-tier 4 and 8;
#                                              # 4 and 8 at SLOW links; 3 and 6 again; iperf3
#                                              # and plain-TCP checks), then analyze
#   scripts/make-testbed-results.sh --analyze  # only the tables and figures from results/testbed/data
#
# LINK (default 100M) is the configured link rate; TRAIN (default 2,4) the world sizes the
# model is fitted on; SLOW (default 50M) the lower rate that tells where the time stops
# following the link. It brings up its own testbed for each host count and takes it down
# again; it refuses to start while another testbed is up. About 60 min on 2 loaded cores.
set -euo pipefail
cd "$(dirname "$0")/.."
LINK="${LINK:-100M}"
TRAIN="${TRAIN:-2,4}"
SLOW="${SLOW:-50M}"
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
  "$PY" benchmarks/testbed_validation.py measure --hosts 4,8 --link "$SLOW" --sizes 64K-1M \
    --tag "rate$SLOW"
  "$PY" benchmarks/testbed_validation.py measure --hosts 3,6 --link "$LINK" --tag repeat
  "$PY" benchmarks/testbed_validation.py checks --hosts 2,3,4,6,8 --link "$LINK"
  "$PY" benchmarks/tcp_alltoall.py --hosts 2,3,4,6,8 --link "$LINK" \
    | tee results/testbed/data/tcp-alltoall.txt
fi
"$PY" benchmarks/testbed_validation.py analyze --train "$TRAIN" --link "$LINK"
