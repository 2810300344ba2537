"""busbw factors against the nccl-tests table, layouts, and statistics."""

import math

import numpy as np
import pytest

from ccbench.bench.stats import summarize, unstable
from ccbench.collectives import busbw_factor, layout

TABLE = {"allreduce": lambda n: 2 * (n - 1) / n, "reduce-scatter": lambda n: (n - 1) / n,
         "allgather": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0,
         "alltoall": lambda n: (n - 1) / n}


@pytest.mark.parametrize("collective", sorted(TABLE))
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 8, 64, 1000])
def test_factors(collective: str, n: int) -> None:
    assert busbw_factor(collective, n) == pytest.approx(TABLE[collective](n))


def test_layouts_round_down_and_keep_s() -> None:
    lay = layout("allgather", 1000, 4, 3)           # 1000 / (4*3) = 83 elements per rank
    assert (lay.send_count, lay.recv_count, lay.size_used) == (83, 249, 996)
    lay = layout("reduce-scatter", 1024, 4, 4)
    assert (lay.send_count, lay.recv_count, lay.block) == (256, 64, 64)
    lay = layout("alltoall", 4096, 8, 4)
    assert (lay.send_count, lay.recv_count, lay.block) == (512, 512, 128)
    lay = layout("allreduce", 10, 4, 5)
    assert (lay.count, lay.size_used) == (2, 8)


def test_statistics() -> None:
    samples = [1.0, 2.0, 3.0, 4.0, 100.0]
    stats = summarize(samples)
    assert stats["median"] == 3.0 and stats["min"] == 1.0 and stats["max"] == 100.0
    assert stats["mean"] == pytest.approx(22.0)
    assert stats["stdev"] == pytest.approx(float(np.std(samples, ddof=1)))
    assert stats["p95"] == pytest.approx(float(np.percentile(samples, 95)))
    assert unstable(stats)
    assert not unstable(summarize([10.0, 10.1, 9.9, 10.0]))
    assert summarize([5.0])["stdev"] == 0.0 and not math.isnan(summarize([5.0])["p5"])
