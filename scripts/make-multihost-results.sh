#!/usr/bin/env bash
# results/multihost/: 4 emulated hosts x 1 rank on 1 Gbit/s links, switch and two-tier 2:1,
# gloo, oneCCL and Intel MPI, allreduce and allgather 64 KiB-16 MiB; then the report. As root:
#
#   scripts/make-multihost-results.sh            # measure (about 10 minutes), report
#   scripts/make-multihost-results.sh --report   # only the report from results/multihost/data
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
OUT=results/multihost
# all hosts share the machine's 2 cores: ranks must yield instead of busy-polling
export I_MPI_WAIT_MODE=1 CCL_YIELD=sched_yield
BENCH=(allreduce,allgather --sizes 64K-16M:4 --iters 10 --warmup 2 -q)
if [[ "${1:-}" != "--report" ]]; then
  mkdir -p "$OUT/data" "$OUT/logs"
  for topology in switch two-tier:2:oversub=2; do
    name=${topology%%:*}
    rm -f "$OUT/data/$name-4x1.jsonl"
    { echo "load before: $(uptime)"
      scripts/testbed_sweep.sh --hosts 4 --link 1G --topology "$topology" --keep -- \
        "${BENCH[@]}" --backend gloo,oneccl -O "$OUT/data/$name-4x1.jsonl"
      scripts/testbed_sweep.sh --hosts 4 --link 1G --topology "$topology" -- \
        "${BENCH[@]}" --backend mpi -O "$OUT/data/$name-4x1.jsonl"
      echo "load after: $(uptime)"; } 2>&1 | tee "$OUT/logs/$name-4x1.txt"
  done
fi
for name in switch two-tier; do
  "$PY" -m ccbench report "$OUT/data/$name-4x1.jsonl" -o "$OUT/report-$name" --formats png \
    --title "4 emulated hosts x 1 rank, 1 Gbit/s links, $name"
done
