"""`<algorithm>@<transport>` names, the backend classes they make, the `algorithms`
subcommand, and one harness run whose records carry the algorithm and transport."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from algorithms import REGISTRY, generate
from ccbench.backends import backend_class, transports
from ccbench.backends.algorithmic import AlgorithmBackend, AlgorithmSpec, algorithm_backend_class, parse_name
from ccbench.commands import algorithms as cmd
from ccbench.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = Path(sys.executable).parent / "mpiexec"


def test_names_parse() -> None:
    assert parse_name("ring@mpi") == ("ring", None, "mpi")
    assert parse_name("rabenseifner:256K@gloo") == ("rabenseifner", 256 << 10, "gloo")


@pytest.mark.parametrize("name,match", [
    ("foo@mpi", r"unknown algorithm 'foo' \(valid: ring, tree"),
    ("ring@rccl", rf"unknown transport 'rccl' \(valid: {', '.join(transports())}\)"),
    ("ring:abc@mpi", "malformed size"),
    ("@mpi", "malformed algorithm backend"),
    ("ring@", "malformed algorithm backend"),
])
def test_bad_names_are_usage_errors(name: str, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        backend_class(name)


def _backend(name: str, device: str = "cpu", world_size: int = 4) -> AlgorithmBackend:
    """An AlgorithmBackend with its spec and context but no communicator (what the pure
    methods read)."""
    backend = object.__new__(AlgorithmBackend)
    backend.spec = algorithm_backend_class(name)
    backend.ctx = argparse.Namespace(device=device, world_size=world_size)
    backend.name = name
    return backend


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="needs mpi4py")
def test_spec_wraps_the_transport_class() -> None:
    from ccbench.backends.cuda_mpi import CudaMPIBackend
    from ccbench.backends.mpi import MPIBackend

    spec = backend_class("dbtree:1M@mpi")
    assert isinstance(spec, AlgorithmSpec) and spec == algorithm_backend_class("dbtree:1M@mpi")
    assert spec.name == "dbtree:1M@mpi" and spec.label == "dbtree:1M"
    assert spec.transport == "mpi" and spec.chunk_bytes == 1 << 20
    assert spec.transport_factory is MPIBackend and spec.needs_mpi_launcher
    assert spec.unavailable_reason() == MPIBackend.unavailable_reason()
    # on a device the same name wraps the CuPy buffers' class: no new class per pair
    assert backend_class("ring@mpi", "cuda").transport_factory is CudaMPIBackend
    # the timed call runs the schedule, never the transport's own collective
    assert AlgorithmBackend.bind is not MPIBackend.bind


def test_every_transport_is_a_registered_backend_with_messages() -> None:
    from ccbench.backends import REGISTRY
    from ccbench.backends.algorithmic import TRANSPORTS
    from ccbench.backends.base import Backend

    for transport in TRANSPORTS:
        cls = backend_class(transport)
        assert transport in REGISTRY and isinstance(cls, type) and issubclass(cls, Backend)
        assert cls.p2p is not Backend.p2p, transport


def test_unsupported_names_missing_schedules() -> None:
    backend = _backend("tree@mpi")
    reason = backend.unsupported("alltoall", np.dtype(np.float32), None)
    assert reason and "no alltoall schedule" in reason and "broadcast" in reason
    # reductions run in ccbench's kernels, so bfloat16 works even where MPI cannot reduce it,
    # on the host and on a device
    import ml_dtypes

    assert backend.unsupported("allreduce", np.dtype(ml_dtypes.bfloat16), "sum") is None
    assert _backend("tree@nccl", "cuda").unsupported("allreduce", np.dtype(np.float16),
                                                     "prod") is None
    assert "dtype uint16" in _backend("ring@gloo").unsupported("allgather", np.dtype(np.uint16),
                                                               None)


def test_every_algorithm_has_a_five_collective_schedule() -> None:
    five = {"broadcast", "allreduce", "allgather", "reduce-scatter", "alltoall"}
    for algorithm in {a for a, _ in REGISTRY}:
        assert any(c in five for a, c in REGISTRY if a == algorithm), algorithm


def test_segments_follow_the_chunk() -> None:
    backend = _backend("ring:1M@gloo")
    assert backend._segments("broadcast", 8 << 20, 0) == 8
    assert backend._segments("broadcast", 1 << 10, 0) == 1
    assert backend._segments("allreduce", 64 << 20, 0) == 16      # 16 MiB per ring chunk
    assert backend._segments("broadcast", 1 << 40, 0) == 64       # capped
    default = _backend("ring@gloo")
    assert default._segments("allreduce", 64 << 20, 0) == 1
    assert default._segments("broadcast", 4 << 20, 0) == 8        # 512 KiB default pipeline


# -- the subcommand ------------------------------------------------------------------------

def _main(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    cmd.register(parser.add_subparsers(dest="command", required=True))
    return cmd.main(parser.parse_args(["algorithms", *argv]))


def test_verify_prints_a_table_and_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert _main("verify", "--ranks", "1-9", "--segments", "1") == 0
    out = capsys.readouterr().out
    assert "all schedules verified" in out
    for algorithm, collective in REGISTRY:
        assert any(line.split()[:2] == [algorithm, collective] for line in out.splitlines())


def test_verify_fails_when_a_schedule_is_wrong(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import dataclasses

    import algorithms.registry as registry

    good = registry.REGISTRY[("ring", "allgather")]

    def broken(p: int, root: int = 0, segments: int = 1):
        s = good(p, root, segments)
        return dataclasses.replace(s, steps=tuple(steps[1:] for steps in s.steps))

    monkeypatch.setitem(registry.REGISTRY, ("ring", "allgather"), broken)
    registry.generate.cache_clear()
    try:
        assert _main("verify", "--ranks", "2-4", "--algorithm", "ring",
                     "--collective", "allgather") == 1
    finally:
        registry.generate.cache_clear()
    assert "FAILED" in capsys.readouterr().out


def test_show_prints_every_rank(capsys: pytest.CaptureFixture[str]) -> None:
    assert _main("show", "ring", "allreduce", "--ranks", "3") == 0
    out = capsys.readouterr().out
    assert "rank 0:" in out and "rank 2:" in out and "reduce into recv" in out
    assert out.strip().endswith(f"ok ({generate('ring', 'allreduce', 3).num_steps()} steps, "
                                f"12 messages)")


@pytest.mark.parametrize("argv,match", [
    (["verify", "--ranks", "0-3"], "bad --ranks"),
    (["verify", "--ranks", "x"], "malformed --ranks"),
    (["verify", "--algorithm", "nope"], "unknown algorithm 'nope'"),
    (["show", "bruck", "reduce"], "unknown schedule 'bruck reduce'"),
    (["show", "ring", "allreduce", "--root", "5"], "--root"),
])
def test_bad_input_is_a_usage_error(argv: list[str], match: str) -> None:
    with pytest.raises(UsageError, match=match):
        _main(*argv)


def test_cli_exit_codes() -> None:
    ok = subprocess.run([sys.executable, "-m", "ccbench", "algorithms", "verify", "--ranks",
                         "5", "--segments", "2"], cwd=ROOT, capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([sys.executable, "-m", "ccbench", "algorithms", "verify", "--ranks",
                          "0"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.startswith("ccbench: error: ") and "Traceback" not in bad.stderr


@pytest.mark.slow
@pytest.mark.skipif(not MPIEXEC.exists(), reason="needs mpiexec")
def test_harness_records_carry_algorithm(tmp_path: Path) -> None:
    from ccbench.records import load_records

    out = tmp_path / "r.jsonl"
    proc = subprocess.run([sys.executable, "-m", "ccbench", "launch", "-n", "2", "--",
                           "allreduce,allgather", "--backend", "ring@mpi", "--sizes", "1K,64K",
                           "--dtype", "float32,bfloat16", "--iters", "3", "--warmup", "1",
                           "-O", str(out), "-q"], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = load_records(out)
    assert len(records) == 2 * 2 * 2 * 2            # collectives x dtypes x sizes x modes
    assert {(r.backend, r.algorithm, r.transport) for r in records} == {
        ("ring@mpi", "ring", "mpi")}
    assert all(r.wrong == 0 for r in records)
