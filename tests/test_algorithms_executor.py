"""The executor on the in-process thread transport: every algorithm x collective x dtype x
op at p = 1..8, bit for bit against the numpy reference; the reduction kernels and their
CPU twin; the CuPy kernels where a GPU is present."""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable, Sequence

import ml_dtypes
import numpy as np
import pytest

from algorithms import REGISTRY, Schedule, generate
from algorithms.executor import Executor
from algorithms.kernels import CUDA_OPS, DTYPE_NAMES, OPS, CupyReducer, NumpyReducer, TwinReducer
from algorithms.patterns import PATTERNS, Combine, Pattern
from algorithms.reference import exact_inputs, reference
from algorithms.transport import ThreadFabric, TransportTimeout, run_threads
from ccbench.dtypes import sentinel

DTYPES = [np.dtype(ml_dtypes.bfloat16) if n == "bfloat16" else np.dtype(n) for n in DTYPE_NAMES]
PAIRS = sorted(REGISTRY)
#: the pairs whose schedule reduces (its pattern says so, not a list of names)
REDUCING = [pc for pc in PAIRS if generate(*pc, 2).computes.reduces]


def _counts(s: Schedule, unit: int) -> tuple[int, int]:
    """(send, recv) elements for `unit`, from the schedule's own buffers (a one-buffer
    schedule's input is its recv buffer)."""
    recv = unit * s.units["recv"]
    return unit * s.units.get("send", 0) or recv, recv


def _buffers(s: Schedule, x: np.ndarray, dtype: np.dtype, rank: int, unit: int,
             inplace: bool, root: int) -> tuple[np.ndarray | None, np.ndarray]:
    """(send, recv) with the harness's in-place aliasing, as the schedule's pattern says."""
    _, recv_count = _counts(s, unit)
    aliasing = s.computes.inplace
    if aliasing == "one-buffer":
        return None, (x.copy() if rank == root else np.full(recv_count, sentinel(-1, dtype)))
    if not inplace:
        return x.copy(), np.full(recv_count, sentinel(-1, dtype))
    if aliasing == "send-in-recv":
        recv = np.full(recv_count, sentinel(-1, dtype))
        recv[rank * unit:(rank + 1) * unit] = x
        return recv[rank * unit:(rank + 1) * unit], recv
    if aliasing == "recv-in-send":
        send = x.copy()
        return send, send[rank * unit:(rank + 1) * unit]
    buf = x.copy()
    return buf, buf


def _run_all(algorithm: str, collective: str, p: int, reducer: object, units: tuple[int, ...],
             segments: int, dtypes: list[np.dtype], make: Callable[..., Schedule] = generate
             ) -> int:
    """Runs every (dtype, op, unit, in-place) case in one thread group; returns cases checked.
    `make(algorithm, collective, p, root, segments)` gives the schedule."""
    pattern = make(algorithm, collective, max(p, 2), 0, 1).computes
    root = p - 1 if pattern.rooted else 0
    s = make(algorithm, collective, p, root, segments)
    ops = OPS if pattern.reduces else (None,)
    modes = (False, True) if pattern.aliases else (False,)
    cases = [(dt, op, u, ip) for dt in dtypes for op in ops for u in units for ip in modes]
    inputs = {c: exact_inputs(collective, c[1], p, _counts(s, c[2])[0], c[0],
                              seed=i) for i, c in enumerate(cases)}

    def body(transport):
        ex = Executor(s, transport.rank, transport, reducer=reducer, timeout=20)
        out = {}
        for case in cases:
            dt, op, unit, inplace = case
            send, recv = _buffers(s, inputs[case][transport.rank], dt, transport.rank, unit,
                                  inplace, root)
            ex.run(send, recv, op)
            if not pattern.reduces and "send" in s.units and not inplace:
                ex.run(send, recv, op)        # again on the same (cached) binding: same result
            out[case] = recv.copy()
        return out

    results = run_threads(p, body, timeout=60)
    checked = 0
    for case in cases:
        want = reference(s.pattern, inputs[case], case[1], root)
        for r in range(p):
            if want[r] is None:
                continue
            got = results[r][case]
            assert got.tobytes() == want[r].tobytes(), (
                f"{algorithm} {collective} p={p} rank {r} {case[0]} {case[1]} unit={case[2]} "
                f"{'in' if case[3] else 'out'}-place: {got} != {want[r]}")
            checked += 1
    return checked


def _assert_checked(checked: int, pattern: Pattern, p: int) -> None:
    """Something was compared wherever some rank has a defined result at p (an exclusive
    scan's rank 0 has none: at p = 1 nothing is)."""
    root = p - 1 if pattern.rooted else 0
    defined = pattern.result([np.zeros(1) for _ in range(p)], lambda xs: xs[0], root)
    assert (checked > 0) == any(out is not None for out in defined), (pattern.name, p, checked)


def test_nothing_to_compare_where_no_rank_has_a_result() -> None:
    """The exclusive scan's shape: rank r gets ranks 0..r-1 reduced, rank 0 nothing."""
    def exclusive(xs: Sequence[np.ndarray], combine: Combine, root: int
                  ) -> list[np.ndarray | None]:
        return [None, *(combine(xs[:r]) for r in range(1, len(xs)))]

    no_first = dataclasses.replace(PATTERNS["allreduce"], name="no-first", result=exclusive)
    _assert_checked(0, no_first, 1)
    _assert_checked(3, no_first, 2)
    with pytest.raises(AssertionError):
        _assert_checked(0, PATTERNS["allreduce"], 1)


@pytest.mark.parametrize("algorithm,collective", PAIRS)
@pytest.mark.parametrize("p", list(range(1, 9)))
def test_bit_exact_against_numpy(algorithm: str, collective: str, p: int) -> None:
    checked = _run_all(algorithm, collective, p, NumpyReducer(), (0, 1, 5, 17),
                       segments=1 if p % 2 else 3, dtypes=DTYPES)
    _assert_checked(checked, generate(algorithm, collective, 2).computes, p)


@pytest.mark.parametrize("algorithm,collective", PAIRS)
def test_each_schedule_computes_what_its_collective_is(algorithm: str, collective: str) -> None:
    """A schedule's pattern (what the executor, the verifier and the reference read) has the
    root, the reduction and the in-place aliasing of its ccbench collective."""
    from ccbench.collectives import get

    pattern, spec = generate(algorithm, collective, 4).computes, get(collective)
    assert (pattern.rooted, pattern.reduces, pattern.inplace) == (
        spec.rooted, spec.reduces, spec.inplace), (algorithm, collective)


def _renamed(name: str) -> Callable[..., Schedule]:
    """Registered schedules under another collective's name, as a new collective's are."""
    def make(algorithm: str, collective: str, p: int, root: int, segments: int) -> Schedule:
        return dataclasses.replace(generate(algorithm, collective, p, root, segments),
                                   collective=name)
    return make


@pytest.mark.parametrize("algorithm,collective", [("ring", "broadcast"), ("tree", "reduce"),
                                                  ("hypercube", "allgather"),
                                                  ("ring", "reduce-scatter"),
                                                  ("bruck", "alltoall")])
def test_a_new_collective_runs_by_its_pattern(algorithm: str, collective: str) -> None:
    """A schedule of a collective algorithms/ has never heard of (a new one's) runs, verifies
    and is checked against the reference by its pattern, with no list of names to edit."""
    make = _renamed(f"{collective}-new")
    from algorithms import verify

    for inplace in (False, True):
        assert verify(make(algorithm, collective, 5, 0, 2), inplace).ok
    assert _run_all(algorithm, collective, 5, NumpyReducer(), (0, 3), 2, DTYPES[:2],
                    make) > 0


def test_a_schedule_that_names_no_pattern_says_so() -> None:
    with pytest.raises(ValueError, match=r"ring broadcast-new schedule computes no known "
                                         r"pattern 'broadcast-new': name the one it computes"):
        dataclasses.replace(generate("ring", "broadcast", 3), collective="broadcast-new",
                            pattern="")


@pytest.mark.parametrize("algorithm,collective", REDUCING)
def test_kernel_twin_in_the_executor(algorithm: str, collective: str) -> None:
    """The CuPy kernels' arithmetic (run on the CPU) gives the same bits through a schedule."""
    assert _run_all(algorithm, collective, 5, TwinReducer(), (3, 16), 2, DTYPES) > 0


def test_repeated_calls_reuse_one_binding() -> None:
    s = generate("ring", "allreduce", 3)

    def body(transport):
        ex = Executor(s, transport.rank, transport)
        send = np.full(7, transport.rank + 1, np.float32)
        recv = np.empty_like(send)
        ex.run(send, recv, "sum")
        first = ex.bind(send, recv, "sum", "float32")
        ex.run(send, recv, "sum")
        assert ex.bind(send, recv, "sum", "float32") is first
        return recv
    for out in run_threads(3, body):
        assert (out == 6).all()


class _Persistent:
    """A transport's prepared step as MPI's persistent requests behave: started again on
    every call, unusable once freed (MPI: 'Invalid MPI_Request')."""

    def __init__(self, transport, sends, recvs, freed: list) -> None:
        self.transport, self.sends, self.recvs, self.freed = transport, sends, recvs, freed
        self.reqs: list = []

    def start(self) -> None:
        if self in self.freed:
            raise RuntimeError("Invalid MPI_Request: a freed persistent request was started")
        self.reqs = [self.transport.irecv(b, p, t) for b, p, t in self.recvs] + \
                    [self.transport.isend(b, p, t) for b, p, t in self.sends]

    def wait_recv(self, i: int, timeout) -> None:
        self.reqs[i].wait(timeout)

    def wait_all(self, timeout) -> None:
        for req in self.reqs:
            req.wait(timeout)

    def free(self) -> None:
        self.freed.append(self)


def test_bound_calls_outlive_the_binding_cache() -> None:
    """A trace's whole sequence binds every call first, then runs them: more bound calls
    than the cache holds must each keep their prepared requests until dropped."""
    s = generate("ring", "allreduce", 3)

    def body(transport):
        freed: list = []
        transport.prepare = lambda sends, recvs: _Persistent(transport, sends, recvs, freed)
        ex = Executor(s, transport.rank, transport, timeout=20)
        pairs = [(np.full(n, transport.rank + 1, np.float32), np.zeros(n, np.float32))
                 for n in range(3, 12)]                  # 9 distinct bindings
        calls = [ex.bound_call(a, b, "sum") for a, b in pairs]
        assert not freed
        for call in calls + calls:
            call()
        held = len(freed)
        del calls
        import gc
        gc.collect()
        released = len(freed)
        ex.close()
        return [b.copy() for _, b in pairs], held, released, len(freed), len(set(map(id, freed)))
    for outs, held, released, closed, distinct in run_threads(3, body):
        assert all((out == 6).all() for out in outs)
        assert held == 0 and released > 0 and closed == distinct


def test_executor_rejects_wrong_sizes_and_worlds() -> None:
    s = generate("ring", "allgather", 2)
    fabric = ThreadFabric(2)
    ex = Executor(s, 0, fabric.transport(0))
    with pytest.raises(ValueError, match="expected"):
        ex.run(np.zeros(3, np.float32), np.zeros(5, np.float32), None)
    with pytest.raises(ValueError, match="transport"):
        Executor(s, 0, ThreadFabric(3).transport(0))


def test_thread_transport_times_out() -> None:
    fabric = ThreadFabric(2, timeout=0.2)
    req = fabric.transport(0).irecv(np.zeros(1), 1, 0)
    with pytest.raises(TransportTimeout, match="no message from rank 1"):
        req.wait()


# -- kernels ----------------------------------------------------------------------------

@pytest.mark.parametrize("op", OPS)
def test_bf16_twin_rounds_like_ml_dtypes(op: str) -> None:
    rng = np.random.default_rng(1)
    a = (rng.standard_normal(4096) * 100).astype(ml_dtypes.bfloat16)
    b = (rng.standard_normal(4096) * 100).astype(ml_dtypes.bfloat16)
    a[:4] = [np.inf, -np.inf, 0.0, -0.0]
    out = np.empty_like(a)
    TwinReducer()(op, "bfloat16")(a, b, out)
    f = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    want = f(a.astype(np.float32), b.astype(np.float32)).astype(ml_dtypes.bfloat16)
    assert out.view(np.uint16).tobytes() == want.view(np.uint16).tobytes()


def test_bf16_twin_keeps_nan() -> None:
    a = np.array([np.nan, 1.0], dtype=ml_dtypes.bfloat16)
    b = np.array([2.0, np.nan], dtype=ml_dtypes.bfloat16)
    out = np.empty_like(a)
    TwinReducer()("sum", "bfloat16")(a, b, out)
    assert np.isnan(out.astype(np.float32)).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("op", OPS)
def test_reducers_agree_and_write_in_place(dtype: np.dtype, op: str) -> None:
    a = np.arange(-6, 6).astype(dtype)
    b = np.arange(6, -6, -1).astype(dtype)
    want = np.empty_like(a)
    NumpyReducer()(op, dtype.name)(a, b, want)
    twin = a.copy()
    TwinReducer()(op, dtype.name)(twin, b, twin)          # out aliases a, as in the executor
    assert twin.tobytes() == want.tobytes()


def test_every_kernel_has_a_source() -> None:
    for op in OPS:
        for name in DTYPE_NAMES:
            in_p, out_p, body = CupyReducer.kernel_source(op, name)
            assert "out" in out_p and body.strip()
            assert CUDA_OPS[op] in body
    with pytest.raises(ValueError, match="valid"):
        CupyReducer.kernel_source("avg", "float32")


def _gpu() -> bool:
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001  no driver / no device: the reason is in the skip
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs cupy and a CUDA device")
@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("op", OPS)
def test_cupy_kernels_match_numpy(dtype: str, op: str) -> None:
    import cupy

    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    a = np.arange(-6, 6).astype(np_dtype)
    b = np.arange(6, -6, -1).astype(np_dtype)
    want = np.empty_like(a)
    NumpyReducer()(op, dtype)(a, b, want)
    raw = (lambda x: x.view(np.uint16)) if dtype == "bfloat16" else (lambda x: x)
    ga, gb = cupy.asarray(raw(a)), cupy.asarray(raw(b))
    out = cupy.empty_like(ga)
    CupyReducer()(op, dtype)(ga, gb, out)
    assert cupy.asnumpy(out).tobytes() == raw(want).tobytes()


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs cupy and a CUDA device")
def test_executor_on_cupy_buffers() -> None:
    import cupy

    p = 4
    s = generate("ring", "allreduce", p)
    inputs = [np.full(1000, r + 1, np.float32) for r in range(p)]

    def body(transport):
        ex = Executor(s, transport.rank, transport, reducer=CupyReducer(), xp=cupy)
        send = cupy.asarray(inputs[transport.rank])
        recv = cupy.empty_like(send)
        ex.run(send, recv, "sum")
        cupy.cuda.Device().synchronize()
        return cupy.asnumpy(recv)
    for out in run_threads(p, body):
        assert (out == sum(range(1, p + 1))).all()
