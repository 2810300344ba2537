"""Why gloo reaches only half to two thirds of the link at 2 hosts for allgather and
all-to-all: one pair of ranks sending to each other at once, as one message each way or split.

    ccbench testbed up --hosts 2 --link 100M --slurm
    SLURM_CONF=/run/ccbench-testbed/slurm/slurm.conf GLOO_SOCKET_IFNAME=eth0 \
        srun -N2 -n2 python benchmarks/gloo_pair_directions.py --link 100M
    ccbench testbed down

Rank 0 on h0 and rank 1 on h1 (torch.distributed, gloo) move SIZE bytes with isend/irecv:
`one-way` (0 -> 1 only) and `both` (each to the other at once), as 1, 8 or 64 messages. Prints,
per case, the median of 5 timed repetitions and the fraction of the link's payload rate
(1448 of 1514 bytes per frame) that one direction reached. A 2-host allgather or all-to-all
is `both` with one message; a ring at 3+ hosts sends and receives on different pairs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from ccbench.units import parse_rate

PAYLOAD_SHARE = 1448 / 1514      # TCP/IP over Ethernet, MTU 1500, TCP timestamps


def one_case(rank: int, nbytes: int, messages: int, both: bool, reps: int) -> float:
    peer = 1 - rank
    count = nbytes // 4 // messages
    send = [torch.ones(count) for _ in range(messages)]
    recv = [torch.empty(count) for _ in range(messages)]
    times = []
    for _ in range(reps + 1):                     # the first is a warm-up
        dist.barrier()
        start = time.perf_counter()
        requests = []
        for i in range(messages):
            if both or rank == 0:
                requests.append(dist.isend(send[i], peer))
            if both or rank == 1:
                requests.append(dist.irecv(recv[i], peer))
        for request in requests:
            request.wait()
        dist.barrier()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--link", default="100M", help="the testbed's configured link rate")
    ap.add_argument("--master", default="10.213.0.1:29555", help="h0's address:port")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    rank = int(os.environ["SLURM_PROCID"])
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=rank, world_size=2)
    payload_bytes_s = parse_rate(args.link) / 8 * PAYLOAD_SHARE
    for nbytes in (1 << 20, 4 << 20):
        for messages in (1, 8, 64):
            for both in (False, True):
                seconds = one_case(rank, nbytes, messages, both, args.reps)
                if rank == 0:
                    print(f"{nbytes >> 20} MiB each way, {messages:2d} message(s), "
                          f"{'both' if both else 'one-way':7s}: {seconds * 1e3:7.1f} ms, "
                          f"{nbytes / seconds / payload_bytes_s:.2f} of the link's payload rate",
                          flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
