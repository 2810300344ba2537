"""torchrun --nproc-per-node 3 subgroup_job.py OUT: an all_reduce on the group {0, 2}, then a
world all_reduce; the gloo execution trace of each rank in OUT/rank<r>.json."""

import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ExecutionTraceObserver

warnings.simplefilter("ignore", FutureWarning)
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
dist.init_process_group("gloo")
rank = dist.get_rank()
pair = dist.new_group([0, 2])
observer = ExecutionTraceObserver()
observer.register_callback(str(out / f"rank{rank}.json"))
observer.start()
x = torch.ones(1000)
if rank in (0, 2):
    dist.all_reduce(x, group=pair)
dist.all_reduce(x)
observer.stop()
observer.unregister_callback()
dist.destroy_process_group()
