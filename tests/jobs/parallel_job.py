"""A 4-rank training step as users write one, on gloo, started by torchrun:

    torchrun --standalone --nproc-per-node 4 tests/jobs/parallel_job.py OUT [--capture]

Tensor-parallel groups {0,1},{2,3}, data-parallel groups {0,2},{1,3}, a pipeline hand-off
from stage {0,1} to stage {2,3}, an MoE token dispatch with uneven split sizes, a broadcast
from a non-zero root, a ReduceOp.MIN reduce-scatter and a world barrier.

Writes OUT/rank<r>.json (torch.profiler.ExecutionTraceObserver) and OUT/calls/rank<r>.json:
the job's own list of its communication calls, in the order it made them, written by the
job itself (not read back from the trace): op, group ranks, dtype, bytes in and out, split
sizes, root and peer (global ranks) and reduction. With --capture the step runs inside
`ccbench.formats.capture.capture(OUT)` as well.
"""

from __future__ import annotations

import contextlib
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ExecutionTraceObserver

CALLS: list[dict[str, Any]] = []


def note(op: str, group: list[int], tensor_in: torch.Tensor | None,
         tensor_out: torch.Tensor | None, **extra: Any) -> None:
    """One entry of the job's own call list."""
    any_tensor = tensor_in if tensor_in is not None else tensor_out
    CALLS.append({"op": op, "group": group,
                  "dtype": str(any_tensor.dtype).removeprefix("torch.") if any_tensor is not None
                  else None,
                  "in_bytes": tensor_in.nbytes if tensor_in is not None else 0,
                  "out_bytes": tensor_out.nbytes if tensor_out is not None else 0, **extra})


def step(rank: int, world: int, tp: Any, dp: Any, tp_ranks: list[int],
         dp_ranks: list[int]) -> None:
    torch.manual_seed(rank)
    # tensor parallel: the partial activations of a row-parallel layer summed in the pair
    act = torch.randn(2048)
    dist.all_reduce(act, group=tp)
    note("all_reduce", tp_ranks, act, act, reduce_op="sum")

    # data parallel: each replica gathers its peer's weight shard (ZeRO-style)
    shard = torch.randn(768)
    full = torch.empty(768 * len(dp_ranks))
    dist.all_gather_into_tensor(full, shard, group=dp)
    note("all_gather_into_tensor", dp_ranks, shard, full)

    # MoE dispatch: each rank sends a different number of tokens (rows of 32) to each expert
    send_rows = [(rank + peer) % 3 + 1 for peer in range(world)]
    recv_rows = [(peer + rank) % 3 + 1 for peer in range(world)]
    tokens = torch.randn(sum(send_rows), 32)
    routed = torch.empty(sum(recv_rows), 32)
    dist.all_to_all_single(routed, tokens, recv_rows, send_rows)
    note("all_to_all_single", list(range(world)), tokens, routed,
         in_splits=[r * 32 for r in send_rows], out_splits=[r * 32 for r in recv_rows])

    # pipeline: stage {0,1} hands its activations to stage {2,3}
    boundary = torch.randn(1536)
    if rank < 2:
        dist.send(boundary, dst=rank + 2)
        note("send", sorted([rank, rank + 2]), boundary, None, peer=rank + 2)
    else:
        dist.recv(boundary, src=rank - 2)
        note("recv", sorted([rank, rank - 2]), None, boundary, peer=rank - 2)

    # the last stage broadcasts the loss scale
    scale = torch.randn(96, dtype=torch.float64)
    dist.broadcast(scale, src=3)
    note("broadcast", list(range(world)), scale, scale, root=3)

    # a clipping bound per shard: the minimum over the world, each rank keeping its shard
    bounds = torch.randn(256 * world)
    mine = torch.empty(256)
    dist.reduce_scatter_tensor(mine, bounds, op=dist.ReduceOp.MIN)
    note("reduce_scatter_tensor", list(range(world)), bounds, mine, reduce_op="min")

    dist.barrier()
    note("barrier", list(range(world)), None, None)


def main() -> int:
    out = Path(sys.argv[1])
    capture = "--capture" in sys.argv[2:]
    warnings.simplefilter("ignore", FutureWarning)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 4, "this job is laid out for 4 ranks"
    # groups are made at start-up, as a training job makes them; every rank makes every group
    tp_ranks, dp_ranks = [2 * (rank // 2), 2 * (rank // 2) + 1], [rank % 2, rank % 2 + 2]
    tp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    tp, dp = tp_groups[rank // 2], dp_groups[rank % 2]
    (out / "calls").mkdir(parents=True, exist_ok=True)
    wrapper: Any = contextlib.nullcontext()
    if capture:
        from ccbench.formats.capture import capture as capture_calls

        wrapper = capture_calls(out)
    observer = ExecutionTraceObserver()
    observer.register_callback(str(out / f"rank{rank}.json"))
    with wrapper:
        observer.start()
        step(rank, world, tp, dp, tp_ranks, dp_ranks)
        observer.stop()
    observer.unregister_callback()
    (out / "calls" / f"rank{rank}.json").write_text(json.dumps(CALLS, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
