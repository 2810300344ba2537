"""A 2-D job (tensor-parallel pairs x data-parallel pairs, 4 gloo ranks) whose execution
trace tests/test_trace_groups.py reads as torch 2.13 writes it, beside the synthetic
traces of tests/et_synth.py: python -m torch.distributed.run --nproc-per-node 4
tests/torch_2d_job.py OUT."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.profiler import ExecutionTraceObserver


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tp = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]
    dp = [dist.new_group([0, 2]), dist.new_group([1, 3])][rank % 2]
    observer = ExecutionTraceObserver()
    observer.register_callback(f"{out}/rank{rank}.json")
    observer.start()
    dist.all_reduce(torch.ones(64), group=tp)                          # alike everywhere
    dist.all_reduce(torch.ones(100 + 28 * (rank % 2)), group=dp)       # differs by tp rank
    dist.all_reduce(torch.ones(16), op=dist.ReduceOp.MIN)             # world
    dist.broadcast(torch.ones(16), src=1)                              # world, root 1
    message = torch.ones(8)
    if rank % 2 == 0:
        dist.send(message, dst=rank + 1, group=tp)                     # peer: tp rank 1
    else:
        dist.recv(message, src=rank - 1, group=tp)
    dist.barrier()
    observer.stop()
    observer.unregister_callback()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
