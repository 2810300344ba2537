"""torchrun --nproc-per-node N gather_job.py OUT: one all_reduce, then a gather to rank 1;
the gloo execution trace of each rank in OUT/rank<r>.json."""

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
rank, world = dist.get_rank(), dist.get_world_size()
observer = ExecutionTraceObserver()
observer.register_callback(str(out / f"rank{rank}.json"))
observer.start()
x = torch.ones(1000)
dist.all_reduce(x)
dist.gather(x, gather_list=[torch.empty(1000) for _ in range(world)] if rank == 1 else None,
            dst=1)
observer.stop()
observer.unregister_callback()
dist.destroy_process_group()
