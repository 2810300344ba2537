"""`ccbench export astra-sim` against the real ASTRA-sim analytical binary.

The binaries live in ../shared/tools/astra-sim/bin beside the repository (or
$CCBENCH_ASTRA_SIM_BIN). Without them the tests skip (also under CI=true: a clone
cannot install them) and the run's last lines say so. The exhaustive matrix is
scripts/astra_check.py; this is a fast, representative part of it: every exportable
formula on each one-dimension network, powers of two and not, 1 KiB to 1 GiB, single- and
multi-size workloads.
"""

from __future__ import annotations

import json

import pytest
from conftest import need_astra_sim

from ccbench.errors import UsageError
from ccbench.formats.astra import astra_bin_dir, export_astra, run_astra
from ccbench.formats.chakra import read_trace
from ccbench.model.synthetic import known_model

UNAWARE = astra_bin_dir() / "AstraSim_Analytical_Congestion_Unaware"
AWARE = astra_bin_dir() / "AstraSim_Analytical_Congestion_Aware"


@pytest.fixture(autouse=True)
def binaries():
    need_astra_sim(UNAWARE.name, AWARE.name)


MODEL = known_model(alpha=5e-6, beta=1e-10, gamma=2e-11)
SIZES = [1 << 10, 1 << 20, 1 << 30]

# (network, ranks, collective, formula)
CASES = [
    ("switch", 2, "allreduce", "ring"), ("switch", 3, "allreduce", "ring"),
    ("switch", 8, "allreduce", "rabenseifner"), ("switch", 6, "reduce-scatter", "ring"),
    ("switch", 4, "reduce-scatter", "recursive-halving"), ("switch", 5, "allgather", "ring"),
    ("switch", 8, "allgather", "recursive-doubling"), ("switch", 7, "alltoall", "pairwise"),
    ("ring", 5, "allreduce", "ring"), ("ring", 4, "allgather", "ring"),
    ("ring", 3, "alltoall", "pairwise"), ("ring", 6, "reduce-scatter", "ring"),
    ("fully-connected", 4, "allreduce", "ring"), ("fully-connected", 6, "alltoall", "pairwise"),
    ("fully-connected", 16, "allgather", "bruck"),
    ("fully-connected", 8, "reduce-scatter", "recursive-halving"),
    # every message at once, one alpha: runs as direct1 with the latency split over p-1
    ("switch", 5, "alltoall", "direct"), ("fully-connected", 8, "alltoall", "direct"),
    ("ring", 3, "alltoall", "direct"),
]


@pytest.mark.parametrize("network,ranks,collective,formula", CASES)
def test_binary_matches_simulate(tmp_path, network, ranks, collective, formula):
    workloads = [[s] for s in SIZES] + [SIZES]
    for i, sizes in enumerate(workloads):
        man = export_astra(MODEL, tmp_path / str(i), ranks, f"{network}:{ranks}", collective,
                           sizes, algorithm=formula)
        expected = man["workload"]["total_us"] * 1e-6
        assert run_astra(man) == pytest.approx(expected, rel=0.01), (sizes, man["system_notes"])


@pytest.mark.parametrize("topology,ranks,intra_gbps", [
    ("fat-tree:32:leaf=8:oversub=2", 32, None), ("dual-plane:24:gpus=4", 24, 300.0),
    ("torus:2x3x4", 24, None),
])
@pytest.mark.parametrize("collective", ["allreduce", "allgather", "reduce-scatter"])
def test_multi_dimensional_hierarchical_ring_matches(tmp_path, topology, ranks, intra_gbps,
                                                      collective):
    intra = None if intra_gbps is None else 1 / (intra_gbps * 1e9)
    man = export_astra(MODEL, tmp_path, ranks, topology, collective, SIZES,
                       intra_beta=intra, algorithm="hierarchical-ring")
    assert len(man["dims"]) > 1
    assert run_astra(man) == pytest.approx(man["workload"]["total_us"] * 1e-6, rel=0.01)


def test_tree_without_gamma_matches(tmp_path):
    model = known_model(alpha=2e-6, beta=4e-10, gamma=0.0)
    for size in SIZES:
        man = export_astra(model, tmp_path / str(size), 8, "switch:8", "allreduce", [size],
                           algorithm="tree")
        sysconf = json.loads((tmp_path / str(size) / "system.json").read_text())
        assert sysconf["all-reduce-implementation"] == ["doubleBinaryTree"]
        assert run_astra(man) == pytest.approx(man["workload"]["total_us"] * 1e-6, rel=0.01)
    # its ranks finish at different times, so a chain of sizes overlaps: refused
    with pytest.raises(UsageError, match="one size per run"):
        export_astra(model, tmp_path / "chain", 8, "switch:8", "allreduce", SIZES,
                     algorithm="tree")


@pytest.mark.parametrize("topology,ranks,collective,formula,needle", [
    ("switch:6", 6, "allreduce", "rabenseifner", "power-of-two"),
    ("switch:2", 2, "allreduce", "rabenseifner", "no reduction at 2 ranks"),
    ("switch:8", 8, "allreduce", "recursive-doubling", "no implementation"),
    ("switch:8", 8, "allreduce", "double-binary-tree", "no implementation"),
    ("switch:8", 8, "alltoall", "bruck", "no implementation"),
    ("ring:8", 8, "alltoall", "pairwise", "more than one hop"),
    ("fat-tree:32:leaf=8", 32, "allreduce", "ring", "dimension by dimension"),
    ("switch:8", 8, "broadcast", "tree", "no broadcast"),
])
def test_export_refuses_with_reason(tmp_path, topology, ranks, collective, formula, needle):
    with pytest.raises(UsageError, match=needle) as err:
        export_astra(MODEL, tmp_path, ranks, topology, collective, [1 << 20], algorithm=formula)
    assert "\n" not in str(err.value)
    assert not list(tmp_path.glob("*.et"))


def test_piecewise_fit_exports_one_piece_at_a_time(tmp_path):
    model = known_model(alpha=5e-6, beta=1e-10, gamma=2e-11)
    fit = next(f for f in model["fits"] if f["collective"] == "allgather")
    fit["pieces"] = [{"max_bytes": 65536.0, "alpha": 5e-6, "beta": 1e-10, "gamma": 0.0},
                     {"max_bytes": None, "alpha": 5e-6, "beta": 2e-10, "gamma": 0.0}]
    with pytest.raises(UsageError, match="pieces of the piecewise fit"):
        export_astra(model, tmp_path / "x", 4, None, "allgather", [1024, 1 << 20])
    for sizes in ([1024, 4096], [1 << 20, 1 << 24]):
        man = export_astra(model, tmp_path / str(sizes[0]), 4, None, "allgather", sizes)
        assert "piece" in man["fit_used"]
        assert run_astra(man) == pytest.approx(man["workload"]["total_us"] * 1e-6, rel=0.01)


def test_export_cli_prints_fit_and_runs(tmp_path, capsys):
    from ccbench.cli import main as cli_main

    path = tmp_path / "model.json"
    path.write_text(json.dumps(MODEL))
    rc = cli_main(["export", "astra-sim", str(path), "-o", str(tmp_path / "out"), "--ranks", "5",
                   "--collective", "allreduce", "--sizes", "1K-1M:32"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "fit used: synthetic/synthetic allreduce fit" in out and "world sizes 2,4" in out
    man = json.loads((tmp_path / "out" / "ccbench-export.json").read_text())
    assert run_astra(man) == pytest.approx(man["workload"]["total_us"] * 1e-6, rel=0.01)
    # Chakra's format: every rank's file reads back with one node per size
    for rank in range(5):
        _, nodes = read_trace(tmp_path / "out" / f"workload.{rank}.et")
        assert len(nodes) == 3


def test_congestion_aware_binary_runs_on_switch(tmp_path):
    man = export_astra(MODEL, tmp_path, 8, "switch:8", "allreduce", [1 << 20])
    unaware, aware = run_astra(man), run_astra(man, aware=True)
    assert aware >= unaware * 0.99
