"""nccl and rccl backends without a device: build and device detection, labelling, version
parsing and metadata, with torch's probes monkeypatched (no CUDA or ROCm hardware here)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from ccbench.backends import backend_class  # noqa: E402
from ccbench.backends import nccl as nccl_module  # noqa: E402
from ccbench.backends.base import RankContext  # noqa: E402
from ccbench.backends.nccl import (  # noqa: E402
    NCCLBackend,
    RCCLBackend,
    format_nccl_version,
    nccl_version,
)
from ccbench.errors import UsageError  # noqa: E402


def fake_build(monkeypatch: pytest.MonkeyPatch, *, cuda: str | None = None, hip: str | None = None,
               devices: int = 0, has_nccl: bool = True) -> None:
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", hip, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: devices > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: devices)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: has_nccl)
    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)


def test_registry_names_and_classes() -> None:
    assert backend_class("nccl") is NCCLBackend
    assert backend_class("rccl") is RCCLBackend
    assert NCCLBackend.name == "nccl" and RCCLBackend.name == "rccl"
    assert NCCLBackend.process_group_backend == RCCLBackend.process_group_backend == "nccl"


def test_cpu_build_is_unavailable_with_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_build(monkeypatch, cuda=None, hip=None)
    assert "CPU-only build" in NCCLBackend.unavailable_reason()
    assert "CPU-only build" in RCCLBackend.unavailable_reason()


def test_cuda_build_without_device(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_build(monkeypatch, cuda="12.4", devices=0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    reason = NCCLBackend.unavailable_reason()
    assert reason is not None
    assert "no CUDA device" in reason and "CUDA_VISIBLE_DEVICES=''" in reason


def test_cuda_build_with_device(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_build(monkeypatch, cuda="12.4", devices=2)
    assert NCCLBackend.unavailable_reason() is None
    reason = RCCLBackend.unavailable_reason()
    assert reason is not None and "CUDA build" in reason and "--backend nccl" in reason


def test_cuda_build_without_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_build(monkeypatch, cuda="12.4", devices=1, has_nccl=False)
    reason = NCCLBackend.unavailable_reason()
    assert reason is not None and "without NCCL" in reason


def test_rocm_build_is_rccl(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_build(monkeypatch, hip="6.2.41133", devices=1)
    assert RCCLBackend.unavailable_reason() is None
    reason = NCCLBackend.unavailable_reason()
    assert reason is not None and "ROCm build" in reason and "--backend rccl" in reason


def test_rocm_build_without_device(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_build(monkeypatch, hip="6.2.41133", devices=0)
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "7")
    reason = RCCLBackend.unavailable_reason()
    assert reason is not None and "no ROCm device" in reason and "HIP_VISIBLE_DEVICES='7'" in reason


def test_torch_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nccl_module, "torch_missing_reason", lambda: "torch is not installed")
    assert NCCLBackend.unavailable_reason() == "torch is not installed"
    assert RCCLBackend.unavailable_reason() == "torch is not installed"
    assert nccl_version() == (None, "torch is not installed")


@pytest.mark.parametrize("raw, text", [
    ((2, 21, 5), "2.21.5"), ((2, 18, 3, "a0"), "2.18.3-a0"), (2708, "2.7.8"), (21905, "2.19.5"),
    ("2.20.5", "2.20.5"),
])
def test_version_text(raw: Any, text: str) -> None:
    assert format_nccl_version(raw) == text


def test_version_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 21, 5))
    assert nccl_version() == ("2.21.5", None)
    assert NCCLBackend.probe_version() == "2.21.5"

    def broken() -> None:
        raise AttributeError("module 'torch._C' has no attribute '_nccl_version'")

    monkeypatch.setattr(torch.cuda.nccl, "version", broken)
    version, why = nccl_version()
    assert version is None and why is not None and "no NCCL" in why


def _ctx(device: str = "cuda", local_rank: int = 0, local_world: int = 1,
         options: dict[str, Any] | None = None) -> RankContext:
    return RankContext(rank=local_rank, world_size=local_world, local_rank=local_rank,
                       local_world_size=local_world, launcher="local", store=None,  # type: ignore[arg-type]
                       hostname="node1", device=device, options=options or {})


def _bare(cls: type[NCCLBackend], ctx: RankContext, version: str = "2.21.5") -> NCCLBackend:
    """An instance without a process group (those need a device)."""
    backend = cls.__new__(cls)
    backend.ctx, backend.torch, backend.dist = ctx, torch, dist
    backend._library_version = version
    return backend


def test_device_from_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    device = _bare(NCCLBackend, _ctx(local_rank=3, local_world=4))._device()
    assert chosen == [3]
    assert device == torch.device("cuda", 3)


def test_device_refuses_cpu_and_sharing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    with pytest.raises(UsageError, match="--device cuda"):
        _bare(NCCLBackend, _ctx(device="cpu"))._device()
    for local_rank in (0, 1):        # rank 0 refuses too, so nobody waits for the other
        with pytest.raises(UsageError, match="one device per rank"):
            _bare(NCCLBackend, _ctx(local_rank=local_rank, local_world=2))._device()


def test_synchronize_waits_for_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    waited: list[Any] = []
    monkeypatch.setattr(torch.cuda, "synchronize", waited.append)
    backend = _bare(NCCLBackend, _ctx())
    backend.device = torch.device("cuda", 0)
    backend.synchronize()
    assert waited == [torch.device("cuda", 0)]


def _info(monkeypatch: pytest.MonkeyPatch, cls: type[NCCLBackend], options: dict[str, Any]
          ) -> dict[str, Any]:
    props = SimpleNamespace(name="Fake GPU", total_memory=80 << 30, major=9, minor=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    backend = _bare(cls, _ctx(options=options))
    backend.device = SimpleNamespace(index=0)
    return backend.info()


def test_nccl_info_records_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.delenv("NCCL_PROTO", raising=False)
    meta = _info(monkeypatch, NCCLBackend, {"nccl_algo": "Ring", "nccl_proto": None})
    assert meta["library"] == "nccl" and meta["library_version"] == "2.21.5"
    assert meta["device"] == "cuda:0" and meta["gpu"] == "Fake GPU"
    assert meta["nccl_algo"] == "Ring" and meta["nccl_proto"] is None
    assert meta["env"]["NCCL_ALGO"] == "Ring" and meta["env"]["NCCL_DEBUG"] == "INFO"
    assert "in-place all_reduce" in meta["allreduce_out_of_place"]
    assert meta["compute_capability"] == "9.0"


def test_rccl_is_labelled_rccl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "hip", "6.2.41133", raising=False)
    monkeypatch.setenv("RCCL_MSCCL_ENABLE", "0")
    monkeypatch.setenv("NCCL_PROTO", "Simple")
    meta = _info(monkeypatch, RCCLBackend, {"nccl_algo": None, "nccl_proto": "Simple"})
    assert meta["library"] == "rccl"
    assert meta["hip_runtime"] == "6.2.41133"
    assert meta["nccl_proto"] == "Simple"
    assert meta["env"]["RCCL_MSCCL_ENABLE"] == "0"


def test_bfloat16_needs_nccl_2_10() -> None:
    bf16 = np.dtype("bfloat16") if hasattr(np, "bfloat16") else __import__("ml_dtypes").bfloat16
    old = _bare(NCCLBackend, _ctx(), version="2.9.9")
    new = _bare(NCCLBackend, _ctx(), version="2.21.5")
    assert "2.10" in (old.unsupported("allreduce", np.dtype(bf16), "sum") or "")
    assert new.unsupported("allreduce", np.dtype(bf16), "sum") is None
    assert new.unsupported("allreduce", np.dtype(np.float16), "prod") is None


def test_cli_run_says_why_nccl_is_unavailable() -> None:
    from conftest import run_ccbench

    if NCCLBackend.unavailable_reason() is None:
        pytest.skip("nccl is available here")
    proc = run_ccbench("allreduce", "--backend", "nccl", "--sizes", "1K", "-q", timeout=120)
    assert proc.returncode == 2
    assert "backend 'nccl' unavailable:" in proc.stderr
    assert "Traceback" not in proc.stderr
