"""`ccbench export astra-sim --trace` against the real ASTRA-sim analytical binary: traces
recorded by real PyTorch runs (gloo, ExecutionTraceObserver), exported at more ranks, run by
AstraSim_Analytical_Congestion_Unaware, and compared with `simulate --trace`.

The binary is found as in tests/test_model_astra_binary.py ($CCBENCH_ASTRA_SIM_BIN, else
../shared/tools/astra-sim/bin beside the repository); without it the tests skip (also under
CI=true: a clone cannot install them) and the run's last lines say so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import need_astra_sim

from ccbench.errors import UsageError
from ccbench.formats import load_trace
from ccbench.formats.astra import astra_bin_dir, run_astra
from ccbench.formats.astra_trace import export_astra_trace
from ccbench.formats.chakra import node_attrs, read_trace
from ccbench.model.synthetic import known_model
from ccbench.model.tracesim import simulate_trace

UNAWARE = astra_bin_dir() / "AstraSim_Analytical_Congestion_Unaware"
MODEL = known_model(alpha=5e-6, beta=1e-10, gamma=2e-11)


@pytest.fixture(autouse=True)
def binary():
    need_astra_sim(UNAWARE.name)


@pytest.mark.parametrize("workload", ["ddp", "tp", "moe", "groups", "p2p"])
@pytest.mark.parametrize("topology,ranks", [("switch:16", 16), ("fully-connected:8", 8)])
def test_binary_agrees_with_simulate_trace(traces4: Path, tmp_path: Path, workload: str,
                                           topology: str, ranks: int) -> None:
    trace = load_trace([traces4 / workload])
    man = export_astra_trace(MODEL, trace, tmp_path, ranks, topology)
    predicted = simulate_trace(MODEL, trace, ranks, topology)["total_us"]
    assert man["workload"]["simulate_total_us"] == pytest.approx(predicted, rel=1e-12)
    assert run_astra(man) * 1e6 == pytest.approx(predicted, rel=0.01), man["workload"]


def test_groups_become_communicator_groups(traces4: Path, tmp_path: Path) -> None:
    man = export_astra_trace(MODEL, load_trace([traces4 / "groups"]), tmp_path, 16)
    groups = json.loads((tmp_path / "comm_groups.json").read_text())
    # 8 tensor-parallel pairs and the even and odd data-parallel groups
    assert sorted(len(g) for g in groups.values()) == [2] * 8 + [8] * 2
    assert man["comm_groups"] == 10
    _, nodes = read_trace(tmp_path / "workload.5.et")
    pgs = [node_attrs(n).get("pg_name") for n in nodes]
    by_id = {int(k): v for k, v in groups.items()}
    # NPU 5 plays recorded rank 1: its pair is [4, 5], its data-parallel group the odd ranks
    assert by_id[int(pgs[0])] == [4, 5]
    assert by_id[int(pgs[2])] == list(range(1, 16, 2))
    assert all(list(n.data_deps) == ([i - 1] if i else []) for i, n in enumerate(nodes))
    assert run_astra(man) * 1e6 == pytest.approx(man["workload"]["simulate_total_us"],
                                                 rel=0.01)


def test_export_refuses_what_astra_sim_times_differently(traces4: Path, tmp_path: Path) -> None:
    trace = load_trace([traces4 / "groups"])
    with pytest.raises(UsageError, match="dimension by dimension"):
        export_astra_trace(MODEL, trace, tmp_path / "a", 32, "fat-tree:32:leaf=8")
    with pytest.raises(UsageError, match="several hops apart"):
        export_astra_trace(MODEL, trace, tmp_path / "b", 8, "ring:8")
    mixed = known_model(alpha=5e-6, beta=1e-10, gamma=2e-11)
    next(f for f in mixed["fits"] if f["collective"] == "allgather")["beta"] = 2e-10
    with pytest.raises(UsageError, match="different beta") as err:
        export_astra_trace(mixed, trace, tmp_path / "c", 8)
    assert "allgather" in str(err.value) and "\n" not in str(err.value)
    assert not list(tmp_path.rglob("*.et"))


def test_fits_of_different_links_export_with_one_network_given(traces4: Path,
                                                              tmp_path: Path) -> None:
    """A calibrated model's fits differ per collective (and gloo's allreduce fits a tree):
    the network given to both, and ring for the allreduce, make them comparable."""
    from ccbench.model.simulate import LinkOverrides

    mixed = known_model(alpha=5e-6, beta=1e-10, gamma=2e-11)
    for i, fit in enumerate(mixed["fits"]):     # a different alpha for every collective
        fit["alpha"] = 3e-6 + i * 1e-6
    next(f for f in mixed["fits"] if f["collective"] == "allreduce")["model_algorithm"] = "tree"
    trace = load_trace([traces4 / "groups"])
    links = LinkOverrides(inter_alpha=20e-6, inter_beta=1 / 12.5e9)
    with pytest.raises(UsageError, match="doubleBinaryTree"):
        export_astra_trace(mixed, trace, tmp_path / "tree", 32, links=links)
    ring = {"allreduce": "ring"}
    man = export_astra_trace(mixed, trace, tmp_path / "ring", 32, links=links, algorithms=ring)
    predicted = simulate_trace(mixed, trace, 32, "switch:32", links=links, algorithms=ring)
    assert any("formula ring with constants fitted for tree" in f for f in predicted["flags"])
    assert run_astra(man) * 1e6 == pytest.approx(predicted["total_us"], rel=0.01)


def test_cli_writes_and_prints_the_run_line(traces4: Path, tmp_path: Path, capsys) -> None:
    from ccbench.cli import main as cli_main

    model = tmp_path / "model.json"
    model.write_text(json.dumps(MODEL))
    rc = cli_main(["export", "astra-sim", str(model), "-o", str(tmp_path / "out"), "--ranks",
                   "8", "--trace", str(traces4 / "tp")])
    out = capsys.readouterr().out
    assert rc == 0 and "--comm-group-configuration=" in out and "recorded at 4 ranks" in out
    man = json.loads((tmp_path / "out" / "ccbench-export.json").read_text())
    assert run_astra(man) * 1e6 == pytest.approx(man["workload"]["simulate_total_us"],
                                                 rel=0.01)
    assert len(list((tmp_path / "out").glob("workload.*.et"))) == 8
