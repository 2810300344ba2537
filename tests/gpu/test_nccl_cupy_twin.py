"""The nccl-cupy backend (NCCL through cupy.cuda.nccl) on its CPU twin: the backend's own code,
unchanged, over the fake CuPy (host memory) and the fake cupy.cuda.nccl (NCCL's calls over
gloo), in real multi-process runs through the harness, validated bit for bit; the algorithms
over its point-to-point groups; and what it refuses, with the reason."""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_cpu_twins import _run_local

from ccbench.records import load_records

ALL_OPS = "sum,max,min,prod"


def _bench(world: int, bench: list[str], tmp_path: Path, counts: Path | None = None,
           env: dict[str, str] | None = None) -> list[Any]:
    out = tmp_path / "r.jsonl"
    env = {**(env or {}), **({"CCBENCH_TWIN_COUNTS": str(counts)} if counts else {})}
    # bounds for a loaded 2-core machine running 3 ranks: minutes, not seconds
    procs = _run_local(world, ["--fake-cupy", "--fake-devices", str(world)],
                       [*bench, "--device", "cuda", "--timeout", "180", "-q", "--output",
                        str(out)], env, timeout=900)
    for proc in procs:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return load_records(out)


@pytest.mark.parametrize("world, timing, ops, extra", [
    (1, "per-op", ALL_OPS, []),
    (2, "pipelined", "sum,max", []),
    (2, "per-op", "sum,prod", ["--cuda-graph"]),
])
def test_nccl_cupy_on_twin(world: int, timing: str, ops: str, extra: list[str],
                           tmp_path: Path) -> None:
    counts = tmp_path / "counts"
    records = _bench(world, ["all", "--backend", "nccl-cupy", "--sizes", "8,1K,3000",
                             "--dtype", "all", "--op", ops, "--iters", "2", "--warmup", "1",
                             "--timing", timing, "--pipeline", "3", *extra],
                     tmp_path, counts)
    assert records and all(r.wrong == 0 for r in records), [r for r in records if r.wrong]
    assert {(r.backend, r.library, r.transport) for r in records} == {
        ("nccl-cupy", "nccl", "cupy")}
    assert {r.world_size for r in records} == {world}
    assert {r.dtype for r in records} == {"float32", "float64", "float16", "bfloat16", "int32",
                                          "int8", "int64", "uint8"}     # no float8 in CuPy
    assert {r.op for r in records if r.collective == "allreduce"} == set(ops.split(","))
    # out-of-place allreduce is NCCL's own (no copy); in-place all-to-all copies aside first
    assert all("local_copy_us" not in r.method for r in records if r.collective != "alltoall")
    assert all(("local_copy_us" in r.method) == r.inplace
               for r in records if r.collective == "alltoall")
    graph = bool(extra)
    assert {r.method.get("cuda_graph") for r in records} == {True if graph else None}
    for rank in range(world):
        seen = json.loads(Path(f"{counts}.{rank}.nccl.json").read_text())
        # every NCCL call of the run went to one stream, the backend's own (not the default)
        assert len(seen["streams"]) == 1 and seen["streams"][0] not in (0, 1, 2)
        assert seen["group_calls"] > 0                         # all-to-all: grouped send/recv
        cupy = seen["cupy"]
        if graph:   # one capture per bound (case, size); the timed calls are graph launches
            assert cupy["capture"] > 0 and cupy["graph_launch"] > cupy["capture"]
        else:
            assert cupy["capture"] == cupy["graph_launch"] == 0


def test_every_algorithm_over_nccl_cupy_twin_is_exact(tmp_path: Path) -> None:
    from ccbench.backends.algorithmic import algorithm_names

    names = [f"{a}@nccl-cupy" for a in algorithm_names()]
    records = _bench(3, ["all", "--backend", ",".join([*names, "nccl-cupy"]), "--sizes", "1K",
                         "--dtype", "all", "--op", ALL_OPS, "--iters", "1", "--warmup", "0"],
                     tmp_path)
    assert records and all(r.wrong == 0 for r in records), [r for r in records if r.wrong]
    mine = [r for r in records if r.backend != "nccl-cupy"]
    assert {r.backend for r in mine} == set(names)
    assert {r.environment["reductions"] for r in mine} == {"CupyReducer"}
    assert {(r.transport, r.library) for r in mine} == {("nccl-cupy", "nccl")}
    seen = {(r.backend, r.collective, r.dtype, r.op) for r in records}
    for r in mine:            # NCCL's own result on the same inputs beside every one
        if not r.dtype.startswith("float8"):      # CuPy's NCCL binding has no float8
            assert ("nccl-cupy", r.collective, r.dtype, r.op) in seen
    assert {r.collective for r in mine} == {"broadcast", "allreduce", "allgather",
                                            "reduce-scatter", "alltoall", "reduce"}
    assert {r.op for r in mine if r.collective == "allreduce"} == set(ALL_OPS.split(","))


@pytest.mark.parametrize("id_type", ["bytes", "tuple"])
def test_unique_id_reaches_every_rank_in_the_bindings_own_type(id_type: str,
                                                               tmp_path: Path) -> None:
    """CuPy 14's get_unique_id gives bytes and its NcclCommunicator takes bytes only; CuPy 13
    used a tuple of signed chars both ways: the id crosses the control store and comes back
    as the type the binding gave."""
    records = _bench(2, ["allreduce", "--backend", "nccl-cupy", "--sizes", "1K", "--iters", "1",
                         "--warmup", "0"], tmp_path, env={"CCBENCH_FAKE_NCCL_ID": id_type})
    assert records and all(r.wrong == 0 for r in records)
    assert {r.world_size for r in records} == {2}


# -- without a run -----------------------------------------------------------------------------

#: the methods of cupy_backends/cuda/libs/nccl.pyx's NcclCommunicator (CuPy 13 and 14), parameters
#: in order: the fake must take the same arguments the real binding takes
REAL_SIGNATURES = {
    "allReduce": ["sendbuf", "recvbuf", "count", "datatype", "op", "stream"],
    "reduce": ["sendbuf", "recvbuf", "count", "datatype", "op", "root", "stream"],
    "broadcast": ["sendbuff", "recvbuff", "count", "datatype", "root", "stream"],
    "bcast": ["buff", "count", "datatype", "root", "stream"],
    "reduceScatter": ["sendbuf", "recvbuf", "recvcount", "datatype", "op", "stream"],
    "allGather": ["sendbuf", "recvbuf", "count", "datatype", "stream"],
    "send": ["sendbuf", "count", "datatype", "peer", "stream"],
    "recv": ["recvbuf", "count", "datatype", "peer", "stream"],
}


def test_fake_binding_matches_the_real_signatures() -> None:
    import fake_nccl

    for name, params in REAL_SIGNATURES.items():
        got = list(inspect.signature(getattr(fake_nccl.NcclCommunicator, name)).parameters)
        assert got[1:] == params, name
    assert list(inspect.signature(fake_nccl.NcclCommunicator).parameters) == [
        "ndev", "commId", "rank"]
    # the constants' values are nccl.h's enums
    assert (fake_nccl.NCCL_SUM, fake_nccl.NCCL_PROD, fake_nccl.NCCL_MAX, fake_nccl.NCCL_MIN) == (
        0, 1, 2, 3)
    assert (fake_nccl.NCCL_INT8, fake_nccl.NCCL_INT32, fake_nccl.NCCL_FLOAT16,
            fake_nccl.NCCL_FLOAT32, fake_nccl.NCCL_FLOAT64, fake_nccl.NCCL_BFLOAT16) == (
        0, 2, 6, 7, 8, 9)
    with pytest.raises(TypeError):      # Cython's `bytes commId` (CuPy 14) refuses a tuple
        fake_nccl.NcclCommunicator(1, tuple(range(128)), 0)
    with pytest.raises(TypeError):      # and a list
        fake_nccl.NcclCommunicator(1, list(range(128)), 0)


@pytest.mark.parametrize("raw", [bytes(range(128)),
                                 tuple(b - 256 if b > 127 else b for b in range(256)[::2])])
def test_unique_id_round_trips_through_json(raw: Any) -> None:
    from ccbench.backends.nccl_cupy import unique_id_from_store, unique_id_to_store

    stored = json.loads(json.dumps(unique_id_to_store(raw)))
    back = unique_id_from_store(stored)
    assert type(back) is type(raw) and back == raw


def _with_fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    """`import cupy` gives the fakes for this test only."""
    import fake_cupy
    import fake_nccl

    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", fake_cupy.cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", fake_nccl)
    monkeypatch.setattr(fake_cupy.cuda, "nccl", fake_nccl, raising=False)
    return fake_cupy


def test_available_on_the_fake_and_reasons_without(monkeypatch: pytest.MonkeyPatch) -> None:
    from ccbench.backends import backend_class
    from ccbench.backends.nccl_cupy import NCCLCupyBackend, nccl_cupy_version

    assert backend_class("nccl-cupy") is NCCLCupyBackend
    fake = _with_fake(monkeypatch)
    assert NCCLCupyBackend.unavailable_reason() is None
    assert nccl_cupy_version() == ("2.27.4", None)
    monkeypatch.setattr(fake.cuda.nccl, "available", False)
    reason = NCCLCupyBackend.unavailable_reason()
    assert reason is not None and "available is False" in reason
    monkeypatch.setattr(fake, "DEVICE_COUNT", 0)
    assert NCCLCupyBackend.unavailable_reason() == "cupy sees no CUDA device"


def _ctx(device: str, local_world: int = 1, local_rank: int = 0) -> Any:
    from ccbench.backends.base import RankContext

    return RankContext(rank=local_rank, world_size=local_world, local_rank=local_rank,
                       local_world_size=local_world, launcher="single",
                       store=SimpleNamespace(), hostname="here", device=device)


def test_refusals_are_usage_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    from ccbench.backends.nccl_cupy import NCCLCupyBackend
    from ccbench.errors import UsageError

    _with_fake(monkeypatch)
    with pytest.raises(UsageError, match="device buffers only"):
        NCCLCupyBackend(_ctx("cpu"))
    with pytest.raises(UsageError, match="one device per rank"):   # 1 device, 2 local ranks
        NCCLCupyBackend(_ctx("cuda", local_world=2, local_rank=1))
