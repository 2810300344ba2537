"""A collective says which reduction ops it defines (`Collective.ops`), and every backend
refuses the others with that reason before its own `unsupported_case` is asked: a prefix scan
declares no avg once, instead of each backend overriding `unsupported_case` for it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from seams import LoopbackBackend, ThreadWorld, rank_context

from ccbench import collectives

NO_AVG = ("sum", "max", "min", "prod")


@pytest.fixture
def allreduce_without_avg(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = dataclasses.replace(collectives.get("allreduce"), ops=NO_AVG)
    monkeypatch.setitem(collectives._BY_NAME, "allreduce", spec)


def test_a_collective_that_names_no_ops_defines_every_op() -> None:
    for spec in collectives.every():
        assert spec.ops is None or set(spec.ops) <= set(collectives.OPS), spec.name
        if spec.ops is None:
            assert [spec.undefined_op(op) for op in (*collectives.OPS, None)] == \
                [None] * (len(collectives.OPS) + 1), spec.name


def test_a_backend_refuses_an_op_its_collective_defines_not(allreduce_without_avg: None
                                                            ) -> None:
    world = ThreadWorld(2)
    backend = LoopbackBackend(rank_context(world, 0), world)
    f32 = np.dtype("float32")
    assert backend.unsupported("allreduce", f32, "avg") == \
        "allreduce defines no avg (its ops: sum, max, min, prod)"
    for op in NO_AVG:
        assert backend.unsupported("allreduce", f32, op) is None
    assert backend.unsupported("reduce", f32, "avg") is None
    assert backend.unsupported("broadcast", f32, None) is None
