#!/usr/bin/env python
"""A small data-parallel training job that records its own PyTorch execution trace.

    torchrun --nproc-per-node 2 examples/train_and_trace.py --out traces/myjob

Each rank writes traces/myjob/rank<r>.json (torch.profiler.ExecutionTraceObserver), which
`ccbench replay traces/myjob`, `ccbench simulate MODEL --trace traces/myjob` and
`ccbench export astra-sim MODEL --trace traces/myjob` read. The five lines marked
"trace" are all a job of your own needs: register a file per rank, start the observer
before the steps you want, stop it and unregister it after (unregistering finishes the file).

The job: a 4-layer MLP under DistributedDataParallel (gradient buckets of 1 MB, so each
step's backward pass issues several allreduces), a few SGD steps on random data, an
all_gather of the loss for logging and a broadcast of rank 0's learning rate, as training
loops do. Runs on CPU with gloo (NCCL on GPUs works the same way: pass --backend nccl).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ExecutionTraceObserver


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for rank<r>.json")
    parser.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
    parser.add_argument("--width", type=int, default=512, help="hidden width (default 512)")
    parser.add_argument("--backend", default="gloo", help="torch.distributed backend")
    args = parser.parse_args()
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) \
        if args.backend == "nccl" else torch.device("cpu")
    torch.manual_seed(0)
    w = args.width
    model = nn.Sequential(nn.Linear(128, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                          nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10)).to(device)
    ddp = DistributedDataParallel(model, bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

    Path(args.out).mkdir(parents=True, exist_ok=True)
    observer = ExecutionTraceObserver()                                    # trace
    observer.register_callback(str(Path(args.out) / f"rank{rank}.json"))  # trace
    observer.start()                                                       # trace
    for _ in range(args.steps):
        opt.zero_grad()
        x = torch.randn(64, 128, device=device)
        y = torch.randint(0, 10, (64,), device=device)
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()                           # DDP: one allreduce per gradient bucket
        opt.step()
        losses = [torch.zeros(1, device=device) for _ in range(dist.get_world_size())]
        dist.all_gather(losses, loss.detach().reshape(1))
        lr = torch.tensor([opt.param_groups[0]["lr"]], device=device)
        dist.broadcast(lr, src=0)
    observer.stop()                                                        # trace
    observer.unregister_callback()                                         # trace
    dist.barrier()
    if rank == 0:
        print(f"wrote {args.out}/rank0..{dist.get_world_size() - 1}.json")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
