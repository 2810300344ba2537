"""What the next collective or backend plugin needs no edit for: a collective whose result is
defined on ranks of its own choosing (an exclusive scan: all but rank 0) is validated, and the
collectives reference says where it is compared, from its `ResultOn`; one without cost
formulas is left out of the synthetic model; a plugin on the path stays out of the generated
docs; a backend's note on one collective's out-of-place call is on that collective's records
only."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ccbench import collectives
from ccbench.backends import REGISTRY, builtin_only, device_backends
from ccbench.backends.base import Backend, BackendInfo
from ccbench.bench.validation import checked, count_wrong, expected_output
from ccbench.collectives.spec import ALL_RANKS, ResultOn
from ccbench.model import costs
from ccbench.model.synthetic import known_model
from ccbench.records import load_records

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ROOT / "tests" / "fixtures" / "plugins"
ALL_BUT_FIRST = ResultOn(lambda world_size, rank, root: rank != 0,
                         "on every rank but rank 0, which has none")


@pytest.fixture
def all_but_first(monkeypatch: pytest.MonkeyPatch) -> collectives.Collective:
    """A collective (allreduce's rules otherwise) with no result on rank 0, in the registry."""
    spec = dataclasses.replace(collectives.get("allreduce"), name="all-but-first", aliases=(),
                               result_on=ALL_BUT_FIRST)
    monkeypatch.setitem(collectives._BY_NAME, spec.name, spec)
    monkeypatch.setattr(collectives, "_ALL", (*collectives.every(), spec))
    return spec


def test_validation_compares_the_ranks_its_result_on_names(
        all_but_first: collectives.Collective) -> None:
    assert all_but_first.result_ranks(3, 0) == [1, 2] and all_but_first.result_ranks(1, 0) == []
    lay = collectives.layout("all-but-first", 96, 4, 3)
    f32 = np.dtype("float32")
    for rank in range(3):
        got = expected_output(lay, f32, "sum", rank, 0)
        got[0] += 1
        assert checked(lay, rank, 0) == (rank != 0)
        assert count_wrong(got, lay, "sum", rank, 0) == int(rank != 0)


def test_the_reference_says_where_every_collective_is_compared(
        all_but_first: collectives.Collective) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gen_docs
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    text = " ".join(gen_docs.collectives_reference().split())
    found = re.search(r"Results are compared bit for bit on every rank, except (.+?)\. `", text)
    assert found is not None, text
    groups = [part.split(": ", 1) for part in found.group(1).split("; ")]
    where = {name.strip("`"): place for names, place in groups for name in names.split(", ")}
    assert where["all-but-first"] == "on every rank but rank 0, which has none"
    assert where == {c.name: c.result_on.where for c in collectives.every()
                     if c.result_on != ALL_RANKS}
    assert where["reduce"] == "on its root, where it has a result"


def test_a_collective_without_cost_formulas_is_left_out_of_the_known_model(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`Collective.model=None` (no formulas): the synthetic model has no fit of it."""
    monkeypatch.delitem(costs.FORMULAS, "reduce")
    fits = {fit["collective"] for fit in known_model(1e-6, 1e-10, 1e-11)["fits"]}
    assert fits == set(costs.FORMULAS) and "reduce" not in fits


def _generated(*paths: Path) -> subprocess.CompletedProcess[str]:
    """scripts/gen_docs.py's text, with `paths` on PYTHONPATH as installed distributions."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (*paths, ROOT)))}
    code = ("import sys; sys.path.insert(0, 'scripts'); import gen_docs; "
            "from ccbench.backends import REGISTRY; print(' '.join(REGISTRY)); "
            "print(*gen_docs.outputs().values())")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_generated_docs_list_built_in_backends_only() -> None:
    """A plugin installed beside ccbench (the fixtures' gloo-plugin) is registered, yet the
    generated reference is what it is without it."""
    with_plugin, without = _generated(PLUGINS / "good"), _generated()
    assert with_plugin.returncode == 0 and without.returncode == 0, with_plugin.stderr
    registered, _, docs = with_plugin.stdout.partition("\n")
    assert "gloo-plugin" in registered.split() and "gloo" in docs
    assert docs == without.stdout.partition("\n")[2]


class _OnDevice(Backend):
    """A plugin's backend whose buffers live on the GPU: it would join the help's lists."""

    name = "on-device-plugin"
    default_device = "cuda"

    def info(self) -> BackendInfo:
        return {"library": "none", "library_version": "0", "device": "cuda:0", "env": {}}

    def barrier(self) -> None:
        return None


def test_builtin_only_hides_the_plugins_for_the_block(monkeypatch: pytest.MonkeyPatch) -> None:
    from ccbench.backends import PLUGINS as INSTALLED
    from ccbench.backends.plugins import Plugin

    target = f"{__name__}:_OnDevice"
    monkeypatch.setattr("ccbench.backends.PLUGINS", [*INSTALLED, Plugin(_OnDevice.name, target,
                                                                        "a-plugin 1.0")])
    monkeypatch.setitem(REGISTRY, _OnDevice.name, target)
    before = list(REGISTRY)
    assert _OnDevice.name in device_backends()
    with builtin_only():
        assert _OnDevice.name not in REGISTRY and _OnDevice.name not in device_backends()
        from ccbench.cli import option_words

        assert _OnDevice.name not in option_words()["gpu_backends"]
    assert list(REGISTRY) == before


NOTE = "send copied into recv, then the in-place call, both timed"


class _Noted(Backend):
    """One rank's allreduce and broadcast by numpy; its info() notes how its out-of-place
    allreduce is made."""

    name = "noted"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    def info(self) -> BackendInfo:
        return {"library": "numpy", "library_version": np.__version__, "device": "cpu",
                "env": {}, "allreduce_out_of_place": NOTE}

    def _allreduce(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        return functools.partial(np.copyto, recv, send)

    def _broadcast(self, send: Any, recv: Any, op: str, root: int) -> Callable[[], None]:
        return lambda: None

    builders = {"allreduce": _allreduce, "broadcast": _broadcast}

    def barrier(self) -> None:
        return None


def test_a_note_on_one_collective_is_on_its_out_of_place_records_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ccbench.cli import main

    monkeypatch.setitem(REGISTRY, _Noted.name, f"{__name__}:_Noted")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "CCBENCH_CONTROL", "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(var, raising=False)
    out = tmp_path / "r.jsonl"
    assert main(["allreduce,broadcast", "--backend", _Noted.name, "--sizes", "1K", "-q",
                 "--iters", "2", "--warmup", "1", "--output", str(out)]) == 0
    records = load_records(out)
    noted = {(r.collective, r.inplace): r.method.get("allreduce_out_of_place") for r in records}
    assert noted == {("allreduce", False): NOTE, ("allreduce", True): None,
                     ("broadcast", True): None}
