#!/usr/bin/env bash
# Run ccbench under torchrun (one process per GPU; RANK/WORLD_SIZE/MASTER_ADDR come from torchrun).
#
#   launch/torchrun.sh 8 allreduce --backend nccl --sizes 1K-1G --output results/ar.jsonl
#
# First argument: processes per node. The rest: ccbench benchmark arguments. Multi-node: set
# NNODES, NODE_RANK and MASTER_ADDR (and MASTER_PORT) the way torchrun expects them.
set -euo pipefail
if [[ $# -lt 2 ]]; then
    echo "usage: $0 NPROC_PER_NODE COLLECTIVE [ccbench options...]" >&2
    exit 2
fi
nproc=$1
shift
exec "${PYTHON:-python}" -m torch.distributed.run \
    --nnodes "${NNODES:-1}" --node-rank "${NODE_RANK:-0}" --nproc-per-node "$nproc" \
    --master-addr "${MASTER_ADDR:-127.0.0.1}" --master-port "${MASTER_PORT:-29500}" \
    -m ccbench "$@"
