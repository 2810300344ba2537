#!/usr/bin/env bash
# Replay fidelity against the job itself: tests/jobs/torch_libs_job.py (DDP, ZeRO sharding,
# FSDP2, a P2POp ring, MoE all-to-all, group send/recv, low-precision reductions, async,
# object and functional collectives) recorded on gloo under ccbench.formats.capture at 3
# and 4 ranks, RUNS times each, then replayed on gloo (the job's backend: the ratio line
# compares like with like) and mpi; prints each replay's lines and uptime's load average
# before every recording and replay.
#
#   scripts/replay-fidelity.sh [OUT [RUNS]]     (default traces/fidelity, 3 runs)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-traces/fidelity}
mkdir -p "$out"
runs=${2:-3}
export TORCH_CPP_LOG_LEVEL=ERROR OMP_NUM_THREADS=1 PYTHONPATH=.
[ -f .venv/bin/activate ] && . .venv/bin/activate
for n in 3 4; do
  for run in $(seq 1 "$runs"); do
    job="$out/job$n-$run"
    rm -rf "$job"
    echo "## $n ranks, run $run; before recording: $(uptime)"
    python -m torch.distributed.run --standalone --nproc-per-node "$n" \
      tests/jobs/torch_libs_job.py "$job" --capture >/dev/null 2>"$job.log" || {
        echo "recording failed: $(tail -3 "$job.log")"; continue; }
    echo "## before replay: $(uptime)"
    python -m ccbench launch -n "$n" replay "$job" --backend gloo,mpi --repeat 3 \
      --summary "$job-summary.json" -q | grep -E '^# (gloo|mpi|  replayed|  issued|  skipped|  whole)' || true
  done
done
