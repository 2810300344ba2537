"""How long a wakeup takes between two processes on the same core and across cores.

    python benchmarks/bench_wakeup.py [--rounds 2000]

A pipe ping-pong: the parent writes a byte, the child (pinned to another core, or the same)
reads it and answers. Each round trip is two wakeups. Gloo hands work between threads several
times per operation, so where a cross-core wakeup is slow now and then (a VM whose idle vCPU
must be woken by its host), gloo's small-message times become bimodal; this shows whether a
machine does that. Prints median, 99th percentile, max and the share over 1 ms per placement.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def ping_pong(parent_cpu: int, child_cpu: int, rounds: int) -> np.ndarray:
    """Round-trip times in microseconds."""
    to_child_r, to_child_w = os.pipe()
    to_parent_r, to_parent_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.sched_setaffinity(0, {child_cpu})
        for _ in range(rounds):
            os.read(to_child_r, 1)
            os.write(to_parent_w, b"x")
        os._exit(0)
    os.sched_setaffinity(0, {parent_cpu})
    times = np.empty(rounds)
    for i in range(rounds):
        start = time.perf_counter()
        os.write(to_child_w, b"x")
        os.read(to_parent_r, 1)
        times[i] = (time.perf_counter() - start) * 1e6
    os.waitpid(pid, 0)
    for fd in (to_child_r, to_child_w, to_parent_r, to_parent_w):
        os.close(fd)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    print(f"# {len(cpus)} usable cores; load {os.getloadavg()[0]:.1f}")
    placements = [("same core", cpus[0], cpus[0])]
    if len(cpus) > 1:
        placements.append(("across cores", cpus[0], cpus[1]))
    for label, a, b in placements:
        t = ping_pong(a, b, args.rounds)
        print(f"{label:<13} median {np.median(t):7.1f} us  p99 {np.percentile(t, 99):7.0f} us  "
              f"max {t.max():6.0f} us  over 1 ms {100 * np.mean(t > 1000):5.2f} %")


if __name__ == "__main__":
    main()
