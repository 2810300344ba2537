"""torchrun --nproc-per-node N ring_job.py OUT: every rank isend()s to rank+1 and irecv()s
from rank-1 at once (a ring step; at 2 ranks a swap), then a barrier; the gloo execution
trace of each rank in OUT/rank<r>.json."""

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
send, recv = torch.ones(250), torch.empty(250)
requests = [dist.isend(send, dst=(rank + 1) % world), dist.irecv(recv, src=(rank - 1) % world)]
for request in requests:
    request.wait()
dist.barrier()
observer.stop()
observer.unregister_callback()
dist.destroy_process_group()
