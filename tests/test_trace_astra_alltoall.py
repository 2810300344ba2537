"""`export astra-sim --trace` and `simulate --trace` model the same all-to-all: a trace with
all-to-alls (even and uneven, on the world and on pairs), process groups and point-to-point
exported, run by the real AstraSim_Analytical_Congestion_Unaware and compared with
simulate --trace, for an all-to-all fitted by the direct formula (gloo's) and by the
pairwise one. Without the binaries the tests skip (tests/conftest.py's need_astra_sim)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from conftest import need_astra_sim

from ccbench.formats import load_trace
from ccbench.formats.astra import run_astra
from ccbench.formats.astra_trace import DIRECT_ALLTOALL, export_astra_trace, trace_export_lines
from ccbench.formats.chakra import node_attrs, read_trace
from ccbench.model.synthetic import known_model
from ccbench.model.tracesim import simulate_trace
from tests.et_synth import write_et

BASE = known_model(alpha=5e-6, beta=1e-10, gamma=2e-11)


def _model(alltoall: str) -> dict:
    model = copy.deepcopy(BASE)
    next(f for f in model["fits"] if f["collective"] == "alltoall")["model_algorithm"] = alltoall
    return model


def _trace(folder: Path) -> Path:
    """4 ranks, pairs {0,1} {2,3} and {0,2} {1,3}: a pair all-reduce, an even world
    all-to-all, an uneven one (MoE dispatch), a send on each pair, an all-to-all per pair."""
    calls = []
    for rank in range(4):
        calls.append([
            {"op": "allreduce", "count": 400000 + 80000 * (rank // 2)},
            {"op": "alltoallv", "count": 80000, "in_splits": [1] * 4, "out_splits": [1] * 4},
            {"op": "alltoallv", "count": 40000,
             "in_splits": [1 + (rank + p) % 3 for p in range(4)],
             "out_splits": [1 + (p + rank) % 3 for p in range(4)]},
            {"op": "send" if rank % 2 == 0 else "recv", "count": 100000, "peer": 1 - rank % 2},
            {"op": "alltoallv", "count": 20000 * (1 + rank // 2), "in_splits": [1, 1],
             "out_splits": [1, 1]}])
    return write_et(folder, calls, [[0, 1], [2, 3], [0, 2], [1, 3]])


@pytest.mark.parametrize("alltoall", ["direct", "pairwise"])
@pytest.mark.parametrize("topology,ranks", [("switch:16", 16), ("fully-connected:8", 8)])
def test_binary_agrees_on_all_to_all_groups_and_p2p(tmp_path: Path, alltoall: str,
                                                    topology: str, ranks: int) -> None:
    need_astra_sim("AstraSim_Analytical_Congestion_Unaware")
    model, trace = _model(alltoall), load_trace([_trace(tmp_path / "t")])
    assert {op.collective for op in trace.all_ops()} >= {"alltoall", "alltoallv", "send"}
    man = export_astra_trace(model, trace, tmp_path / "out", ranks, topology)
    predicted = simulate_trace(model, trace, ranks, topology)
    assert [r["collective"] for r in predicted["ops"]].count("alltoall") >= 2
    assert any("point-to-point" in s["reason"] for s in predicted["not_modelled"])
    assert man["workload"]["simulate_total_us"] == pytest.approx(predicted["total_us"],
                                                                 rel=1e-12)
    assert man["workload"]["total_us"] == pytest.approx(predicted["total_us"], rel=0.01)
    assert run_astra(man) * 1e6 == pytest.approx(predicted["total_us"], rel=0.01)


def test_direct_all_to_all_is_its_predicted_time_pairwise_runs_natively(tmp_path: Path) -> None:
    """No binary needed: what the export writes for each formula."""
    trace = load_trace([_trace(tmp_path / "t")])
    direct = export_astra_trace(_model("direct"), trace, tmp_path / "d", 8)
    assert direct["workload"]["predicted_duration_ops"] == ["alltoall"]
    assert direct["workload"]["predicted_duration_why"] == {"alltoall": DIRECT_ALLTOALL}
    assert any("-a alltoall=pairwise runs it natively" in line
               for line in trace_export_lines(direct))
    _, nodes = read_trace(tmp_path / "d" / "workload.0.et")
    kinds = [node_attrs(n).get("ccbench_collective") for n in nodes]
    # the world all-to-alls as compute nodes, the pair's (direct = direct1 at 2) natively
    assert kinds.count("alltoall") == 2 and kinds[-1] is None
    # read back, the export is the same all-to-alls at the same sizes
    back = load_trace([tmp_path / "d"])
    assert [op.collective for op in back.ops[0]].count("alltoall") == 3
    pairwise = export_astra_trace(_model("pairwise"), trace, tmp_path / "p", 8)
    assert pairwise["workload"]["predicted_duration_ops"] == []
    assert pairwise["implementations"]["alltoall"] == "direct1"
