"""The oneccl backend on the real library: 1, 2, 3 and 4 processes, every collective x dtype x
op x in-place, bit-exact against numpy. One process launch per world size runs every case
(oneCCL's start-up dominates), so this file is also the worker: `python test_oneccl.py worker`.

Skips when oneCCL is not installed, unless CI=true: there the library must be present
(scripts/install-oneccl.sh) and its absence fails.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

COLLECTIVES = ("broadcast", "allreduce", "allgather", "reduce-scatter", "alltoall")
REDUCING = ("allreduce", "reduce-scatter")
OPS = ("sum", "prod", "max", "min")
DTYPE_NAMES = ("float32", "float64", "float16", "bfloat16", "int32", "int8")
# elements per rank block: odd, one that is not a multiple of the vector width, one larger
BLOCKS = (1, 7, 1027)


# -- inputs and numpy reference ------------------------------------------------------------
def make_input(op: str | None, rank: int, count: int) -> np.ndarray:
    """Small integers, exact in every dtype and every reduction over <= 4 ranks."""
    idx = np.arange(count, dtype=np.int64)
    if op == "prod":
        values = 1 + ((rank * 7 + idx) % 5 == 0)                # 1 or 2: product <= 16
    elif op in ("max", "min"):
        values = (rank * 3 + idx * 5) % 7 - 3                   # -3 .. 3
    else:
        values = (rank + idx) % 3 + 1 + 4 * (rank == 0) * (idx % 2)   # 1 .. 7, sum <= 28
    return values.astype(np.float64)


def reduce_ref(parts: list[np.ndarray], op: str) -> np.ndarray:
    stack = np.stack(parts)
    return {"sum": stack.sum(0), "prod": stack.prod(0), "max": stack.max(0),
            "min": stack.min(0)}[op]


def expected(collective: str, op: str | None, rank: int, world: int, block: int,
             root: int) -> tuple[np.ndarray, np.ndarray]:
    """(input of this rank, expected output of this rank) in float64."""
    if collective == "broadcast":
        return make_input(op, rank, block), make_input(op, root, block)
    if collective == "allreduce":
        return (make_input(op, rank, block),
                reduce_ref([make_input(op, r, block) for r in range(world)], op or "sum"))
    if collective == "allgather":
        return (make_input(op, rank, block),
                np.concatenate([make_input(op, r, block) for r in range(world)]))
    if collective == "reduce-scatter":
        full = reduce_ref([make_input(op, r, block * world) for r in range(world)], op or "sum")
        return make_input(op, rank, block * world), full[rank * block:(rank + 1) * block]
    if collective == "alltoall":
        # rank r sends block j to rank j: element = 10 * r + 3 * j + i % 3 (<= 48: int8-safe)
        def sent(r: int) -> np.ndarray:
            j = np.repeat(np.arange(world), block)
            i = np.tile(np.arange(block), world)
            return (10 * r + 3 * j + i % 3).astype(np.float64)
        mine = np.concatenate([sent(r)[rank * block:(rank + 1) * block] for r in range(world)])
        return sent(rank), mine
    raise ValueError(collective)


def cases(world: int) -> list[tuple[str, str, str | None, bool, int]]:
    out = []
    for collective, dtype, block in itertools.product(COLLECTIVES, DTYPE_NAMES, BLOCKS):
        ops: tuple[str | None, ...] = OPS if collective in REDUCING else (None,)
        modes = (True,) if collective == "broadcast" else (False, True)
        for op, inplace in itertools.product(ops, modes):
            if block == 1027 and dtype not in ("float32", "bfloat16"):
                continue                # the large block only where it adds coverage
            out.append((collective, dtype, op, inplace, block))
    return out


# -- worker (one rank) ---------------------------------------------------------------------
def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def worker(rank: int, world: int, port: int) -> int:
    from ccbench.backends.base import RankContext
    from ccbench.backends.oneccl import OneCCLBackend
    from ccbench.dtypes import numpy_dtype
    from ccbench.run.control import ControlClient

    store = ControlClient("127.0.0.1", port, rank)
    ctx = RankContext(rank=rank, world_size=world, local_rank=rank, local_world_size=world,
                      launcher="local", store=store, hostname="localhost")
    t0 = time.perf_counter()
    backend = OneCCLBackend(ctx)
    t_init = time.perf_counter() - t0
    wrong: list[str] = []
    unsupported: list[str] = []
    ran = 0
    t0 = time.perf_counter()
    for collective, dtype_name, op, inplace, block in cases(world):
        dtype = numpy_dtype(dtype_name)
        why = backend.unsupported(collective, dtype, op)
        if why:
            unsupported.append(f"{collective} {dtype_name} {op}: {why}")
            continue
        root = (block + 1) % world
        inp, want = expected(collective, op, rank, world, block, root)
        inp, want = inp.astype(dtype), want.astype(dtype)
        if collective == "broadcast":
            recv = backend.alloc(block, dtype)
            backend.copy_from_numpy(recv, inp if rank == root else np.full(block, -1, dtype))
            send = recv
        elif not inplace:
            send = backend.alloc(inp.size, dtype)
            recv = backend.alloc(want.size, dtype)
            backend.copy_from_numpy(send, inp)
            backend.copy_from_numpy(recv, np.full(want.size, -1, dtype))
        elif collective == "allgather":
            recv = backend.alloc(want.size, dtype)
            backend.copy_from_numpy(recv, np.full(want.size, -1, dtype))
            send = backend.view(recv, rank * block, (rank + 1) * block)
            backend.copy_from_numpy(send, inp)
        elif collective == "reduce-scatter":
            send = backend.alloc(inp.size, dtype)
            backend.copy_from_numpy(send, inp)
            recv = backend.view(send, rank * block, (rank + 1) * block)
        else:
            send = backend.alloc(inp.size, dtype)
            backend.copy_from_numpy(send, inp)
            recv = send
        backend.run(collective, send, recv, op, root)
        got = backend.to_numpy(recv)
        ran += 1
        if got.shape != want.shape or not np.array_equal(_bits(got), _bits(want)):
            bad = int(np.count_nonzero(_bits(got) != _bits(want))) if got.shape == want.shape \
                else -1
            wrong.append(f"{collective} {dtype_name} {op} {'in' if inplace else 'out'}-place "
                         f"block={block}: {bad} wrong, got {got[:6].tolist()} "
                         f"want {want[:6].tolist()}")
    t_cases = time.perf_counter() - t0
    # point to point (the transport algorithms/ schedules use): a ring shift, send first
    x = (np.arange(5) + 10 * rank).astype(numpy_dtype("bfloat16"))
    y = np.zeros_like(x)
    assert backend.p2p is not None
    backend.p2p.send(x, (rank + 1) % world)
    backend.p2p.recv(y, (rank - 1) % world)
    want_p2p = (np.arange(5) + 10 * ((rank - 1) % world)).astype(y.dtype)
    if not np.array_equal(_bits(y), _bits(want_p2p)):
        wrong.append(f"send/recv ring: got {y.tolist()} want {want_p2p.tolist()}")
    # a library error becomes a RunFailure that carries oneCCL's own message
    from ccbench.errors import RunFailure
    try:
        buf = np.zeros(4, np.float32)
        backend.run("broadcast", buf, buf, None, world + 3)
        wrong.append("broadcast from a root outside the communicator did not fail")
    except RunFailure as exc:
        if "onecclBroadcast failed" not in str(exc) or "root" not in str(exc):
            wrong.append(f"unclear error message: {exc}")
    # latency/bandwidth probe for the docs: float32 allreduce, out-of-place
    timing: dict[str, float] = {}
    for nbytes in (8, 1 << 20):
        n = nbytes // 4
        a, b = np.ones(n, np.float32), np.zeros(n, np.float32)
        call = backend.bind("allreduce", a, b, "sum", 0)
        iters = 50 if nbytes < 4096 else 10
        for _ in range(5):
            call()
        backend.barrier()
        t = time.perf_counter()
        for _ in range(iters):
            call()
        timing[str(nbytes)] = (time.perf_counter() - t) / iters * 1e6
    info = backend.info()
    backend.barrier()
    backend.finalize()
    store.close()
    print("RESULT " + json.dumps({"rank": rank, "ran": ran, "wrong": wrong,
                                  "unsupported": unsupported, "init_s": t_init,
                                  "cases_s": t_cases, "allreduce_us": timing,
                                  "version": info["library_version"]}), flush=True)
    return 1 if wrong else 0


# -- pytest side ---------------------------------------------------------------------------
def _availability() -> str | None:
    """None when oneCCL loads (probed in a child: loading is once per process)."""
    probe = ("from ccbench.backends.oneccl import OneCCLBackend as B; "
             "r = B.unavailable_reason(); print(r or 'OK')")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)
    text = proc.stdout.strip().splitlines()[-1:] or [proc.stderr.strip()[-500:]]
    return None if text == ["OK"] else text[0]


def launch(world: int, env: dict[str, str] | None = None,
           timeout: float = 240) -> list[dict[str, Any]]:
    from ccbench.run.control import ControlServer

    server = ControlServer("127.0.0.1", 0)
    try:
        procs = [subprocess.Popen([sys.executable, __file__, "worker", str(r), str(world),
                                   str(server.port)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, **(env or {}),
                                       "CCBENCH_CONTROL_SECRET": server.secret})
                 for r in range(world)]
        outs = []
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise AssertionError(f"oneccl workers at {world} ranks timed out") from None
            outs.append((p.returncode, out, err))
    finally:
        server.close()
    results = []
    for rank, (rc, out, err) in enumerate(outs):
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert lines, f"rank {rank} exited {rc} without a result:\n{out[-2000:]}\n{err[-3000:]}"
        results.append(json.loads(lines[-1][len("RESULT "):]))
    return results


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "worker":
    sys.exit(worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))

import pytest  # noqa: E402  (the worker does not need pytest)

_REASON = _availability()
_IN_CI = os.environ.get("CI", "").lower() == "true"


def test_oneccl_is_installed_in_ci() -> None:
    """CI runs scripts/install-oneccl.sh: there, a missing oneCCL is a failure, not a skip."""
    if _REASON is not None and _IN_CI:
        pytest.fail(f"CI=true but the oneccl backend is unavailable: {_REASON}")
    if _REASON is not None:
        pytest.skip(f"oneCCL not installed: {_REASON}")


needs_oneccl = pytest.mark.skipif(_REASON is not None and not _IN_CI,
                                  reason=f"oneCCL not installed: {_REASON}")


@needs_oneccl
@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_case_bit_exact(world: int) -> None:
    if _REASON is not None:
        pytest.fail(f"oneccl backend unavailable: {_REASON}")
    results = launch(world)
    expected_ran = len(cases(world)) - len(results[0]["unsupported"])
    for res in results:
        assert res["wrong"] == [], res["wrong"]
        assert res["ran"] == expected_ran
        assert res["version"].startswith("20")
    for res in results:
        assert all("unsupported by oneccl: " in u for u in res["unsupported"])


def test_unavailable_reason_names_the_fix(tmp_path: Path) -> None:
    env = {**os.environ, "CCBENCH_ONECCL_LIB": str(tmp_path / "libccl.so.2")}
    probe = ("from ccbench.backends.oneccl import OneCCLBackend as B; "
             "print(B.unavailable_reason())")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "does not exist" in proc.stdout
    env = {k: v for k, v in os.environ.items() if k not in ("CCBENCH_ONECCL_LIB", "CCL_ROOT")}
    # a prefix with no oneCCL: run a python whose sys.prefix has none (a bare venv is costly;
    # point CCL_ROOT nowhere and CCBENCH_ONECCL_LIB at a directory without the library)
    env["CCBENCH_ONECCL_LIB"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=env, timeout=60)
    assert "without libccl.so.2" in proc.stdout


def test_not_the_c_api(tmp_path: Path) -> None:
    """A library without onecclGetUniqueId (e.g. libccl.so.1 alone) is refused with a reason."""
    import ctypes.util

    libm = ctypes.util.find_library("m")
    if libm is None:
        pytest.skip("no libm to stand in for a wrong library")
    path = next((p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib64/libm.so.6")
                 if Path(p).exists()), None)
    if path is None:
        pytest.skip("libm.so.6 not at a known path")
    probe = ("from ccbench.backends.oneccl import OneCCLBackend as B; "
             "print(B.unavailable_reason())")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={**os.environ, "CCBENCH_ONECCL_LIB": path}, timeout=60)
    assert "does not export the oneCCL C API" in proc.stdout, proc.stdout + proc.stderr


@needs_oneccl
@pytest.mark.slow
def test_through_the_harness(tmp_path: Path) -> None:
    """`ccbench launch -n 2 all --backend oneccl`: the harness's own check, records, metadata."""
    if _REASON is not None:
        pytest.fail(f"oneccl backend unavailable: {_REASON}")
    out = tmp_path / "r.jsonl"
    proc = subprocess.run([sys.executable, "-m", "ccbench", "launch", "-n", "2", "all",
                           "--backend", "oneccl", "--sizes", "8,3000", "--dtype", "all",
                           "--op", "sum,prod,max,min", "--iters", "2", "--warmup", "1",
                           "--check", "1", "-q", "--timeout", "60", "--output", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    # 7 collectives, the 8 dtypes oneCCL has (no float8), 4 ops on the reducing ones
    # (allreduce, reduce-scatter, reduce), both modes except broadcast (in place) and sendrecv
    # (out of place), sizes too small for a dtype at 2 ranks are skipped: at least the
    # 3000-byte ones are all there
    assert len([r for r in records if r["size_asked"] == 3000]) == 8 * (1 + 3 * 4 * 2 + 2 * 2
                                                                        + 1)
    assert all(r["wrong"] == 0 for r in records)
    first = records[0]
    assert first["library"] == "oneCCL" and first["library_version"].startswith("20")
    assert first["backend"] == "oneccl"


@needs_oneccl
@pytest.mark.slow
def test_csv_is_only_csv(tmp_path: Path) -> None:
    """`--format csv` of a oneCCL run parses as CSV: no log line of the library reaches stdout,
    and sendrecv (once a onecclGroupStart/End pair whose events the plugin waited on, warning
    and logging an error per call) leaves no CCL_WARN or CCL_ERROR line on stderr either."""
    if _REASON is not None:
        pytest.fail(f"oneccl backend unavailable: {_REASON}")
    pandas = pytest.importorskip("pandas")
    proc = subprocess.run([sys.executable, "-m", "ccbench", "launch", "-n", "2",
                           "allreduce,sendrecv", "--backend", "oneccl", "--format", "csv",
                           "--sizes", "1K-16K", "--iters", "5", "--warmup", "1", "-q",
                           "--timeout", "60"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CCL_LOG_LEVEL": "warn"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "CCL_" not in proc.stdout, proc.stdout[:2000]
    frame = pandas.read_csv(io.StringIO(proc.stdout))
    assert sorted(set(frame["collective"])) == ["allreduce", "sendrecv"]
    assert len(frame) == 5 * 2 + 5            # 1K-16K: allreduce in both modes, sendrecv once
    assert "within group API" not in proc.stderr and "not completed event" not in proc.stderr


def test_the_own_log_level_warning_is_filtered_and_nothing_else(capfd: pytest.CaptureFixture[str]
                                                                 ) -> None:
    """oneCCL logs that CCL_LOG_LEVEL (set by the backend to quiet it) changed, on every run:
    that one line is dropped from what it prints while it starts; every other line passes."""
    from ccbench.backends.oneccl import _start_up_log_filtered

    with _start_up_log_filtered():
        os.write(1, b"2026:12:05-06:30:48:15024 |CCL_WARN| value of CCL_LOG_LEVEL changed to "
                    b"be error (default:warn)\n")
        os.write(1, b"2026:12:05-06:30:48:15024 |CCL_ERROR| something else\n")
    assert capfd.readouterr().out == "2026:12:05-06:30:48:15024 |CCL_ERROR| something else\n"


@needs_oneccl
def test_a_run_prints_no_ccl_warn_line() -> None:
    from conftest import run_ccbench_forked

    if _REASON is not None:
        pytest.fail(f"oneccl backend unavailable: {_REASON}")
    proc = run_ccbench_forked("allreduce", "--backend", "oneccl", "--sizes", "1K", "--iters",
                              "2", "--warmup", "0", "-q", "--no-output", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "CCL_" not in proc.stderr + proc.stdout, proc.stderr
