#!/usr/bin/env python
"""Record PyTorch execution traces of small real workloads on gloo (one JSON per rank).

    python scripts/make-traces.py ddp -n 2 -o traces/ddp
    python scripts/make-traces.py all -n 4 -o traces/

Workloads (each a few tiny steps, seconds on a laptop CPU):
  ddp     an MLP under DistributedDataParallel (small buckets: several allreduces per step)
  tp      a tensor-parallel / FSDP-style layer: all_gather of weight shards, reduce_scatter
          of gradients
  moe     MoE-style dispatch: all_to_all_single with equal and with uneven split sizes
  groups  two process groups: tensor-parallel groups of 2 (allreduce, allgather inside a
          group) plus data-parallel allreduce across groups (needs an even rank count)
  p2p     the ops beyond the five: reduce, gather, scatter, barrier, send/recv, broadcast

The files are what torch.profiler.ExecutionTraceObserver writes: rank<r>.json in the
workload's folder; `ccbench replay FOLDER` reads them.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

# p2p before groups: a trace lists the process groups that exist when it starts
WORKLOADS = ("ddp", "tp", "moe", "p2p", "groups")


def _ddp(rank: int, world: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 8))
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for _ in range(2):
        opt.zero_grad()
        loss = ddp(torch.randn(16, 64)).square().mean()
        loss.backward()
        opt.step()
    dist.barrier()


def _tp(rank: int, world: int) -> None:
    import torch
    import torch.distributed as dist

    shard = torch.randn(512, dtype=torch.float32)          # this rank's slice of a weight
    full = torch.empty(512 * world, dtype=torch.float32)
    for _ in range(2):
        dist.all_gather_into_tensor(full, shard)            # unshard the weight
        grad = full * 2.0
        out = torch.empty_like(shard)
        dist.reduce_scatter_tensor(out, grad)                # shard the gradient
        half = torch.ones(512, dtype=torch.bfloat16)
        dist.all_reduce(half, op=dist.ReduceOp.MAX)


def _moe(rank: int, world: int) -> None:
    import torch
    import torch.distributed as dist

    tokens = torch.randn(world * 48, 16)
    out = torch.empty_like(tokens)
    dist.all_to_all_single(out, tokens)                       # equal dispatch
    send_splits = [(rank + peer) % 3 + 1 for peer in range(world)]
    recv_splits = [(peer + rank) % 3 + 1 for peer in range(world)]
    src = torch.randn(sum(send_splits), 16)
    dst = torch.empty(sum(recv_splits), 16)
    dist.all_to_all_single(dst, src, recv_splits, send_splits)   # uneven (all_to_allv)
    dist.all_to_all_single(out, tokens)                       # combine


def _make_groups(rank: int, world: int) -> tuple[object, object]:
    """Tensor-parallel groups of 2 and data-parallel groups across them, made before tracing
    starts (as a training job does at start-up), so the trace's process-group table has them."""
    import torch.distributed as dist

    tp_groups = [dist.new_group([r, r + 1]) for r in range(0, world, 2)]
    dp_groups = [dist.new_group(list(range(i, world, 2))) for i in range(2)]
    return tp_groups[rank // 2], dp_groups[rank % 2]


def _groups(rank: int, world: int, tp: object, dp: object) -> None:
    import torch
    import torch.distributed as dist

    # each tensor-parallel pair's activations differ in size, so the trace alone tells its
    # all-reduce from a world call (one the whole world makes alike is read as a world call)
    act = torch.randn(1024 + 256 * (rank // 2))
    # the data-parallel gradient differs by tensor-parallel rank (an uneven shard)
    grad = torch.randn(4096 + 256 * (rank % 2))
    for _ in range(2):
        dist.all_reduce(act, group=tp)
        gathered = torch.empty(2 * 256)
        dist.all_gather_into_tensor(gathered, act[:256].contiguous(), group=tp)
        dist.all_reduce(grad, group=dp)
    dist.broadcast(torch.randn(64), src=world - 1)


def _p2p(rank: int, world: int) -> None:
    import torch
    import torch.distributed as dist

    buf = torch.arange(256, dtype=torch.float32)
    dist.broadcast(buf, src=world - 1)
    dist.reduce(buf, dst=0)
    gather_list = [torch.empty(256) for _ in range(world)] if rank == 0 else None
    dist.gather(buf, gather_list, dst=0)
    scatter_list = [torch.full((128,), float(r)) for r in range(world)] if rank == 0 else None
    part = torch.empty(128)
    dist.scatter(part, scatter_list, src=0)
    dist.barrier()
    msg = torch.ones(300, dtype=torch.int32)
    if rank == 0:
        dist.send(msg, dst=1)
    elif rank == 1:
        dist.recv(msg, src=0)
    chunks = [torch.empty(64) for _ in range(world)]
    dist.all_gather(chunks, torch.full((64,), float(rank)))


def _worker(rank: int, world: int, port: int, jobs: list[tuple[str, str]]) -> None:
    import warnings

    import torch.distributed as dist
    from torch.profiler import ExecutionTraceObserver

    warnings.simplefilter("ignore", FutureWarning)     # all_gather_into_tensor's rename notice
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    for workload, folder in jobs:
        groups = _make_groups(rank, world) if workload == "groups" else ()
        observer = ExecutionTraceObserver()
        observer.register_callback(str(Path(folder) / f"rank{rank}.json"))
        observer.start()
        run = {"ddp": _ddp, "tp": _tp, "moe": _moe, "groups": _groups, "p2p": _p2p}[workload]
        run(rank, world, *groups)
        observer.stop()
        observer.unregister_callback()
        dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def record(jobs: dict[str, str | os.PathLike[str]], world: int) -> None:
    """Run each workload (name -> folder) on `world` gloo ranks, one process per rank and one
    process group for all of them, each under its own ExecutionTraceObserver."""
    import torch.multiprocessing as mp

    for folder in jobs.values():
        Path(folder).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")   # one observer notice per rank each
    mp.start_processes(_worker, nprocs=world, start_method="spawn",
                       args=(world, _free_port(), [(k, str(v)) for k, v in jobs.items()]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=(*WORKLOADS, "all"))
    parser.add_argument("-n", "--nprocs", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("-o", "--output", required=True, help="folder (all: one subfolder each)")
    args = parser.parse_args()
    if args.nprocs < 2:
        parser.error(f"-n must be >= 2, got {args.nprocs}")
    names = WORKLOADS if args.workload == "all" else (args.workload,)
    if args.nprocs % 2 and "groups" in names:
        if args.workload == "groups":
            parser.error(f"groups needs an even rank count, not {args.nprocs}")
        print(f"skipping groups: needs an even rank count, not {args.nprocs}", file=sys.stderr)
        names = tuple(n for n in names if n != "groups")
    jobs = {n: Path(args.output) / n if args.workload == "all" else Path(args.output)
            for n in names}
    record(dict(jobs), args.nprocs)
    for name, folder in jobs.items():
        print(f"wrote {folder}/rank0..{args.nprocs - 1}.json ({name}, {args.nprocs} ranks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
