#!/usr/bin/env bash
# One command: bring up H emulated hosts with shaped links and a Slurm cluster on them, run a
# ccbench benchmark across all of them, take the testbed down again (as root).
#
#   scripts/testbed_sweep.sh --hosts 4 --link 1G -- allreduce --backend gloo --sizes 64K-16M -O out.jsonl
#   scripts/testbed_sweep.sh --hosts 4 --topology two-tier:2:oversub=2 -- allreduce --backend mpi,ring@mpi
#   LAUNCHER=torchrun scripts/testbed_sweep.sh --hosts 2 -- allreduce --backend gloo
#   scripts/testbed_sweep.sh --hosts 4 --keep -- ...      # leave the testbed up afterwards
#
# Options before `--` go to `ccbench testbed up` (--hosts, --ranks-per-host, --link,
# --topology); everything after `--` is the benchmark (`ccbench COLLECTIVE ...`).
# LAUNCHER: auto (default: mpiexec when a backend needs MPI, else srun), srun, mpiexec, torchrun.
#   srun      srun -N H --ntasks-per-node K from this namespace
#   mpiexec   Intel MPI's mpiexec on h0 with `-bootstrap slurm` inside an salloc of H nodes
#             (hydra's ssh bootstrap is not available between namespaces)
#   torchrun  one torchrun per host (`ccbench testbed exec hI -- torchrun ...`), static
#             rendezvous at h0:29500; RDZV=c10d uses the c10d rendezvous instead
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
HOSTS=2 RPH=1 KEEP=0 UP_ARGS=()
while [[ $# -gt 0 && $1 != "--" ]]; do
  case $1 in
    --hosts) HOSTS=$2; UP_ARGS+=("$1" "$2"); shift 2 ;;
    --ranks-per-host) RPH=$2; UP_ARGS+=("$1" "$2"); shift 2 ;;
    --link|--topology) UP_ARGS+=("$1" "$2"); shift 2 ;;
    --keep) KEEP=1; shift ;;
    *) echo "testbed_sweep: error: unknown option $1 (valid: --hosts, --ranks-per-host, --link, --topology, --keep)" >&2; exit 2 ;;
  esac
done
[[ ${1:-} == "--" ]] && shift
[[ $# -gt 0 ]] || { echo "testbed_sweep: error: no benchmark after -- (e.g. -- allreduce --backend gloo)" >&2; exit 2; }
BENCH=("$@")

if (( ! KEEP )); then trap '"$PY" -m ccbench testbed down >/dev/null' EXIT; fi
"$PY" -m ccbench testbed up --slurm "${UP_ARGS[@]}"
export SLURM_CONF=/run/ccbench-testbed/slurm/slurm.conf
"$PY" -m ccbench testbed measure --seconds 2

LAUNCHER="${LAUNCHER:-auto}"
if [[ $LAUNCHER == auto ]]; then
  LAUNCHER=srun
  if printf '%s\n' "${BENCH[@]}" | grep -Eq '(^|,|@)mpi(,|$)'; then LAUNCHER=mpiexec; fi
fi
NPROCS=$(( HOSTS * RPH ))
case $LAUNCHER in
  srun)
    srun -N "$HOSTS" --ntasks-per-node "$RPH" "$PY" -m ccbench "${BENCH[@]}" ;;
  mpiexec)
    MPIEXEC="$(dirname "$(command -v "$PY")")/mpiexec"
    salloc -N "$HOSTS" --ntasks-per-node "$RPH" "$PY" -m ccbench testbed exec h0 -- \
      "$MPIEXEC" -bootstrap slurm -n "$NPROCS" -ppn "$RPH" "$PY" -m ccbench "${BENCH[@]}" ;;
  torchrun)
    if [[ ${RDZV:-static} == c10d ]]; then
      RDZV_ARGS=(--rdzv-backend c10d --rdzv-endpoint h0:29400 --rdzv-id testbed)
    else
      RDZV_ARGS=(--master-addr h0 --master-port 29500)
    fi
    pids=()
    for (( i = 0; i < HOSTS; i++ )); do
      node_rank=(); [[ ${RDZV:-static} == c10d ]] || node_rank=(--node-rank "$i")
      "$PY" -m ccbench testbed exec "h$i" -- "$PY" -m torch.distributed.run --nnodes "$HOSTS" \
        --nproc-per-node "$RPH" "${node_rank[@]}" "${RDZV_ARGS[@]}" -m ccbench "${BENCH[@]}" &
      pids+=($!)
    done
    status=0
    for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
    exit "$status" ;;
  *) echo "testbed_sweep: error: unknown LAUNCHER $LAUNCHER (valid: auto, srun, mpiexec, torchrun)" >&2; exit 2 ;;
esac
