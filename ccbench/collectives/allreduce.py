"""allreduce: every rank gets the reduction of every rank's buffer. S = count x elsize,
busbw factor 2(n-1)/n."""

from __future__ import annotations

from ccbench.collectives.spec import Collective, whole_buffer
from ccbench.collectives.values import reducing_inputs, whole_reduction

ALLREDUCE = Collective(
    name="allreduce", aliases=("all_reduce", "all-reduce"), reduces=True, rooted=False,
    busbw=lambda n: 2.0 * (n - 1) / n, counts=whole_buffer, block=lambda lay: lay.send_count,
    inplace="same", inputs=reducing_inputs, expected=whole_reduction, result_on="all",
    input_on="all",
    chakra="ALL_REDUCE", astra="all-reduce-implementation",
    comm_size=lambda size, p: size, size_meaning="count x elsize")
