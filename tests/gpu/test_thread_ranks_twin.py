"""Ranks as threads on one device (algorithms.device_threads) on the CPU twin: every algorithm
x collective x dtype x op x mode at 2, 3 and 8 thread ranks through tests/gpu/thread_ranks.py
on the fake CuPy, the reductions in the CuPy kernels' code (TwinReducer on the fake), exact;
every message ordered by events on both sides; a stray message times out with its name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent


def test_every_algorithm_at_thread_ranks_on_the_fake_device() -> None:
    proc = subprocess.run([sys.executable, str(HERE / "thread_ranks.py"), "--fake-cupy",
                           "--worlds", "2,3,8", "--size", "3000"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    from algorithms import ALGORITHMS

    lines = proc.stdout.splitlines()
    for world in (2, 3, 8):
        for algorithm in ALGORITHMS:
            assert any(line.startswith(f"PASS  {algorithm} at {world} thread ranks")
                       for line in lines), (algorithm, world, proc.stdout[-2000:])
    assert not any(line.startswith("FAIL") for line in lines)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    sys.path.insert(0, str(HERE))
    import fake_cupy

    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)       # CupyReducer imports it
    monkeypatch.setitem(sys.modules, "cupy.cuda", fake_cupy.cuda)
    monkeypatch.setattr(fake_cupy, "COUNTERS", {k: 0 for k in fake_cupy.COUNTERS})
    return fake_cupy


def test_each_message_is_ordered_by_events_and_kernels_run(fake: Any) -> None:
    """Per message: a ready event the receiver's stream waits for, a copy on the receiver's
    stream, a consumed event the sender's stream waits for; the reductions are kernels."""
    import thread_ranks

    cases = thread_ranks._cases(["ring"], ["sum"])
    cases = [c for c in cases if c[1] == "allreduce" and c[2] in ("float32", "bfloat16")]
    wrong, messages = thread_ranks.run_world(4, cases, 4096, fake)
    assert wrong and all(w == 0 for w in wrong.values())
    counters = fake.COUNTERS
    assert messages > 0
    assert counters["memcpy"] == messages
    assert counters["wait_event"] == 2 * messages
    assert counters["event_record"] == 2 * messages
    assert counters["kernel"] > 0


def test_a_message_nobody_receives_times_out_with_its_name(fake: Any) -> None:
    from algorithms.device_threads import DeviceThreadFabric
    from algorithms.transport import TransportTimeout

    fabric = DeviceThreadFabric(2, fake, timeout=0.2)
    stream = fake.cuda.Stream(non_blocking=True)
    send = fabric.transport(0, stream).isend(fake.empty(4, np.float32), 1, 7)
    with pytest.raises(TransportTimeout, match=r"rank 0: send to 1 \(tag 7\) not received"):
        send.wait()
    recv = fabric.transport(1, stream).irecv(fake.empty(4, np.float32), 0, 8)
    with pytest.raises(TransportTimeout, match=r"rank 1: no message from 0 \(tag 8\)"):
        recv.wait()


def test_messages_of_a_pair_and_tag_stay_in_order(fake: Any) -> None:
    from algorithms.device_threads import run_device_threads

    def body(transport: Any) -> list[float]:
        if transport.rank == 0:
            bufs = [fake.empty(3, np.float32) for _ in range(3)]
            for i, buf in enumerate(bufs):
                buf.set(np.full(3, i, np.float32))
            for req in [transport.isend(buf, 1, 5) for buf in bufs]:
                req.wait()
            return []
        got = [fake.empty(3, np.float32) for _ in range(3)]
        for req in [transport.irecv(buf, 0, 5) for buf in got]:
            req.wait()
        return [float(buf.get()[0]) for buf in got]

    assert run_device_threads(2, fake, body, timeout=30)[1] == [0.0, 1.0, 2.0]
