"""A training job written with torch's own parallelism libraries, as users write them, on
CPU and gloo, at 3 or 4 ranks (torchrun):

    torchrun --standalone --nproc-per-node 4 tests/jobs/torch_libs_job.py OUT [--capture]

In the execution trace's window: a DistributedDataParallel step (the C++ reducer's bucket
all-reduces), ZeRO-style gradient sharding with the single-tensor reduce_scatter_tensor /
all_gather_into_tensor, an FSDP2 (`fully_shard`) step on a DeviceMesh (2-D, replicate x
shard, HSDP, at 4 ranks; 1-D at 3), a GPipe step of torch.distributed.pipelining
(PipelineStage + ScheduleGPipe, 3 microbatches) on the group of ranks 1..world-1, a ring
exchange with dist.P2POp + batch_isend_irecv,
an MoE token dispatch with uneven all_to_all_single, a send/recv on a sub-group (group_dst /
group_src), PRODUCT / MIN / MAX on bfloat16 and float16, async ops, broadcast_object_list,
a functional all_reduce, an all-reduce under torch.inference_mode and a barrier. Before
the window: DDP's construction (its replica sync) and two warm-up steps (its bucket
rebuild), the pipeline's first step (its stages' warm-up vote and shape exchange), and a
MAX all-reduce;
after it, one more all-reduce.

Writes OUT/rank<r>.json (ExecutionTraceObserver) and OUT/calls/rank<r>.json: the job's own
list of the calls it issued in the window, written by the job from what it asked for and
what the libraries state about their own work (DDP's bucket sizes from its logging data,
FSDP2's shard sizes from its sharded parameters, the pipeline's messages from GPipe's
order and the stages' shapes), not read back from any recording; each
entry: op, group (global ranks), dtype, bytes in and out, reduction, root / peer (global
ranks), split sizes (elements), and who issued it; OUT/calls/window-rank<r>.json: the
window's wall time on the rank. With --capture the job runs inside
`ccbench.formats.capture.capture(OUT)`.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import ExecutionTraceObserver

CALLS: list[dict[str, Any]] = []


def note(op: str, group: list[int], dtype: torch.dtype | None, in_bytes: int, out_bytes: int,
         by: str = "job", **extra: Any) -> None:
    CALLS.append({"op": op, "group": sorted(group), "by": by,
                  "dtype": str(dtype).removeprefix("torch.") if dtype is not None else None,
                  "in_bytes": in_bytes, "out_bytes": out_bytes, **extra})


def ddp_step(model: Any, world: int) -> None:
    """One DDP step; DDP all-reduces each gradient bucket (sum) from its C++ reducer."""
    model(torch.randn(8, 64)).square().mean().backward()
    for size in model._get_ddp_logging_data()["rebuilt_bucket_sizes"].split(", "):
        note("allreduce", list(range(world)), torch.float32, int(size), int(size), "ddp",
             reduce_op="sum")


def zero_step(rank: int, world: int) -> None:
    """ZeRO-style: each rank keeps a shard of the gradients and gathers the parameters."""
    grads = torch.randn(world * 1000)
    shard = torch.empty(1000)
    dist.reduce_scatter_tensor(shard, grads)
    note("reduce-scatter", list(range(world)), shard.dtype, grads.nbytes, shard.nbytes,
         reduce_op="sum")
    params = torch.empty(world * 1000)
    dist.all_gather_into_tensor(params, shard)
    note("allgather", list(range(world)), shard.dtype, shard.nbytes, params.nbytes)


def fsdp_model(world: int) -> tuple[Any, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard")) \
        if world == 4 else init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Linear(48, 16))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model[2], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, mesh


def fsdp_step(model: Any, mesh: Any, world: int) -> None:
    """FSDP2 gathers each layer's sharded parameters for forward and again for backward
    (the layers reshard after forward), and reduce-scatters their gradients, averaged (then,
    with HSDP, all-reduces them across the replicas); the root's own group has no
    parameters."""
    model(torch.randn(4, 32)).sum().backward()
    shard_dim = mesh["shard"]
    shard = dist.get_process_group_ranks(shard_dim.get_group())
    replicas = dist.get_process_group_ranks(mesh["replicate"].get_group()) if world == 4 \
        else None
    n = len(shard)
    for layer in (model[0], model[2], model[2], model[0]):      # forward, then backward
        # each parameter's dim 0 padded to a multiple of the shard group, one flat buffer
        numel = sum(-(-p.shape[0] // n) * (p.numel() // p.shape[0]) for p in layer.parameters())
        note("allgather", shard, torch.float32, numel * 4, numel * 4 * n, "fsdp")
    for layer in (model[2], model[0]):
        numel = sum(-(-p.shape[0] // n) * (p.numel() // p.shape[0]) for p in layer.parameters())
        note("reduce-scatter", shard, torch.float32, numel * 4 * n, numel * 4, "fsdp",
             reduce_op="avg")
        if replicas is not None:
            note("allreduce", replicas, torch.float32, numel * 4, numel * 4, "fsdp",
                 reduce_op="avg")


def ring_exchange(rank: int, world: int) -> None:
    send, recv = torch.randn(600), torch.empty(600)
    right, left = (rank + 1) % world, (rank - 1) % world
    ops = [dist.P2POp(dist.isend, send, right), dist.P2POp(dist.irecv, recv, left)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    note("send", [rank, right], send.dtype, send.nbytes, 0, peer=right)
    note("recv", [rank, left], recv.dtype, 0, recv.nbytes, peer=left)


def moe_dispatch(rank: int, world: int) -> None:
    send_rows = [(rank + peer) % 3 + 1 for peer in range(world)]
    recv_rows = [(peer + rank) % 3 + 1 for peer in range(world)]
    tokens = torch.randn(sum(send_rows), 16)
    routed = torch.empty(sum(recv_rows), 16)
    dist.all_to_all_single(routed, tokens, recv_rows, send_rows)
    note("alltoall", list(range(world)), tokens.dtype, tokens.nbytes, routed.nbytes,
         in_splits=[r * 16 for r in send_rows], out_splits=[r * 16 for r in recv_rows])


def group_p2p(rank: int, world: int, pair: Any) -> None:
    """Rank 0 hands a tensor to the last rank on the group {0, last} (group ranks 0, 1)."""
    last = world - 1
    message = torch.randn(300)
    if rank == 0:
        dist.send(message, group=pair, group_dst=1)
        note("send", [0, last], message.dtype, message.nbytes, 0, peer=last)
    elif rank == last:
        dist.recv(message, group=pair, group_src=0)
        note("recv", [0, last], message.dtype, 0, message.nbytes, peer=0)


def low_precision(world: int) -> None:
    """Reductions other than sum on 16-bit floats (gloo has no ReduceOp.AVG: not issued)."""
    for dtype, op, name in ((torch.bfloat16, dist.ReduceOp.PRODUCT, "prod"),
                            (torch.float16, dist.ReduceOp.MIN, "min"),
                            (torch.bfloat16, dist.ReduceOp.MAX, "max")):
        x = torch.ones(512, dtype=dtype)
        dist.all_reduce(x, op=op)
        note("allreduce", list(range(world)), dtype, x.nbytes, x.nbytes, reduce_op=name)
    y = torch.ones(256, dtype=torch.float16)
    dist.reduce(y, dst=1, op=dist.ReduceOp.MAX)
    note("reduce", list(range(world)), y.dtype, y.nbytes, y.nbytes, reduce_op="max", root=1)


def async_ops(world: int) -> None:
    a, shard = torch.randn(2000), torch.randn(100)
    full = torch.empty(100 * world)
    works = [dist.all_reduce(a, async_op=True),
             dist.all_gather_into_tensor(full, shard, async_op=True)]
    note("allreduce", list(range(world)), a.dtype, a.nbytes, a.nbytes, reduce_op="sum")
    note("allgather", list(range(world)), shard.dtype, shard.nbytes, full.nbytes)
    for work in works:
        work.wait()


def object_and_functional(rank: int, world: int) -> None:
    import torch.distributed._functional_collectives as funcol

    config = [{"lr": 0.1, "step": 7, "name": "warmup"}] if rank == 1 else [None]
    dist.broadcast_object_list(config, src=1)
    size = len(pickle.dumps(config[0]))
    # torch sends the objects' sizes (int64), then their pickled bytes
    note("broadcast", list(range(world)), torch.int64, 8, 8, "broadcast_object_list", root=1)
    note("broadcast", list(range(world)), torch.uint8, size, size, "broadcast_object_list",
         root=1)
    world_group = dist.group.WORLD
    assert world_group is not None
    out = funcol.all_reduce(torch.ones(700), "sum", world_group)
    float(out.sum())                  # the result used: waits for it
    note("allreduce", list(range(world)), torch.float32, 2800, 2800, "functional",
         reduce_op="sum")
    with torch.inference_mode():            # an evaluation metric, summed over the world
        metric = torch.full((3,), float(rank), dtype=torch.float64)
        dist.all_reduce(metric)
    note("allreduce", list(range(world)), metric.dtype, 24, 24, reduce_op="sum")
    dist.barrier()
    note("barrier", list(range(world)), None, 0, 0)


PIPE_BATCH, PIPE_MICRO = 6, 3


def pipeline(rank: int, world: int, group: Any) -> Any:
    """A GPipe pipeline (torch.distributed.pipelining) on the ranks 1..world-1, one stage a
    rank; stage k is a Linear from width 8 + 4k to 12 + 4k, so each hop's tensors have their
    own shape. Rank 0 is not in it."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    if rank == 0:
        return None
    stage, stages = rank - 1, world - 1
    torch.manual_seed(stage)
    module = nn.Linear(8 + 4 * stage, 12 + 4 * stage)
    # no example shapes: the stages infer them in their first step (sending them as objects)
    pipe = PipelineStage(module, stage, stages, torch.device("cpu"), group=group)
    return ScheduleGPipe(pipe, PIPE_MICRO,
                         loss_fn=lambda out, target: (out - target).square().mean())


def pipeline_step(schedule: Any, rank: int, world: int, log: bool) -> None:
    """One GPipe step: every microbatch forward (each stage receives its input activation
    from the stage before, then sends its output to the stage after), then every
    microbatch backward (each stage receives its output's gradient from the stage after,
    then sends its input's gradient to the stage before)."""
    if schedule is None:
        return
    stage, last = rank - 1, world - 2
    if stage == 0:
        schedule.step(torch.randn(PIPE_BATCH, 8))
    elif stage == last:
        schedule.step(target=torch.randn(PIPE_BATCH, 12 + 4 * last), losses=[])
    else:
        schedule.step()
    if not log:
        return
    mb = PIPE_BATCH // PIPE_MICRO
    before, after = rank - 1, rank + 1
    into, out = mb * (8 + 4 * stage) * 4, mb * (12 + 4 * stage) * 4
    for _ in range(PIPE_MICRO):
        if stage > 0:
            note("recv", [rank, before], torch.float32, 0, into, "pipelining", peer=before)
        if stage < last:
            note("send", [rank, after], torch.float32, out, 0, "pipelining", peer=after)
    for _ in range(PIPE_MICRO):
        if stage < last:
            note("recv", [rank, after], torch.float32, 0, out, "pipelining", peer=after)
        if stage > 0:
            note("send", [rank, before], torch.float32, into, 0, "pipelining", peer=before)


def main() -> int:
    out = Path(sys.argv[1])
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world in (3, 4), "this job is laid out for 3 or 4 ranks"
    pair = dist.new_group([0, world - 1])
    stages = dist.new_group(list(range(1, world)))
    (out / "calls").mkdir(parents=True, exist_ok=True)
    wrapper: Any = contextlib.nullcontext()
    if "--capture" in sys.argv[2:]:
        from ccbench.formats.capture import capture

        wrapper = capture(out)
    observer = ExecutionTraceObserver()
    observer.register_callback(str(out / f"rank{rank}.json"))
    with wrapper:
        torch.manual_seed(rank)
        ddp = nn.parallel.DistributedDataParallel(
            nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)), bucket_cap_mb=0.05)
        for _ in range(2):          # warm-up: DDP rebuilds its buckets in its second step
            ddp(torch.randn(8, 64)).sum().backward()
        bound = torch.tensor([float(rank)])
        dist.all_reduce(bound, op=dist.ReduceOp.MAX)   # before the window
        model, mesh = fsdp_model(world)
        schedule = pipeline(rank, world, stages)
        pipeline_step(schedule, rank, world, log=False)  # warm-up: the stages' first step
        observer.start()
        began = time.perf_counter()
        ddp_step(ddp, world)
        zero_step(rank, world)
        fsdp_step(model, mesh, world)
        ring_exchange(rank, world)
        moe_dispatch(rank, world)
        group_p2p(rank, world, pair)
        pipeline_step(schedule, rank, world, log=True)
        low_precision(world)
        async_ops(world)
        object_and_functional(rank, world)
        window_us = (time.perf_counter() - began) * 1e6
        observer.stop()
        dist.all_reduce(torch.ones(64))                # after the window
    observer.unregister_callback()
    (out / "calls" / f"rank{rank}.json").write_text(json.dumps(CALLS, indent=1))
    (out / "calls" / f"window-rank{rank}.json").write_text(json.dumps({"window_us": window_us}))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
