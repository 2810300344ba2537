"""simulate says what a prediction stands on: known answers at 16K ranks, extrapolation and
physics flags, and no silent choice between backends."""

from __future__ import annotations

import json

import pytest

from ccbench.collectives import COLLECTIVES
from ccbench.errors import UsageError
from ccbench.model.sanity import row_flags
from ccbench.model.simulate import LinkOverrides, simulate
from ccbench.model.synthetic import known_model

ALPHA, BETA, GAMMA = 5e-6, 1e-10, 2e-11
P = 16384


@pytest.mark.parametrize("topology", [f"switch:{P}", f"fat-tree:{P}:leaf=64",
                                      f"fully-connected:{P}", f"ring:{P}"])
@pytest.mark.parametrize("collective,formula,expected", [
    # T = a(p) alpha + b(p) n beta + c(p) n gamma, written out at p = 16384, n = 1 GiB
    ("allreduce", "ring", lambda n: 2 * (P - 1) * ALPHA + 2 * (P - 1) / P * n * BETA
     + (P - 1) / P * n * GAMMA),
    ("allreduce", "rabenseifner", lambda n: 2 * 14 * ALPHA + 2 * (P - 1) / P * n * BETA
     + (P - 1) / P * n * GAMMA),
    ("allgather", "ring", lambda n: (P - 1) * ALPHA + (P - 1) / P * n * BETA),
    ("reduce-scatter", "recursive-halving", lambda n: 14 * ALPHA
     + (P - 1) / P * n * (BETA + GAMMA)),
    ("alltoall", "pairwise", lambda n: (P - 1) * ALPHA + (P - 1) / P * n * BETA),
    ("broadcast", "tree", lambda n: 14 * ALPHA + 14 * n * BETA),
])
def test_formula_exact_at_16k_ranks(topology, collective, formula, expected):
    model = known_model(ALPHA, BETA, GAMMA)
    out = simulate(model, collective, P, topology, [1 << 30], formula)
    row = out["rows"][0]
    assert row["size_used"] == 1 << 30
    assert row["time_us"] * 1e-6 == pytest.approx(expected(1 << 30), rel=1e-12)
    assert any(f.startswith("extrapolated 4.1e+03x in ranks from a fit at 2,4 ranks")
               for f in out["flags"]), out["flags"]
    assert row["busbw_gbps"] <= row["bottleneck_link_gbps"]
    assert not row["flags"]          # 1 GiB is inside the fit's sizes; nothing unphysical


def test_size_and_formula_flags():
    model = known_model(ALPHA, BETA, GAMMA)
    for fit in model["fits"]:
        fit["sizes"] = [1024, 1 << 20]
    out = simulate(model, "allreduce", 4, "switch:4", [512, 1 << 20, 1 << 26], "rabenseifner")
    assert [bool(r["flags"]) for r in out["rows"]] == [True, False, True]
    assert "64x above the largest size the fit saw (1 MiB)" in out["rows"][2]["flags"][0]
    assert "formula rabenseifner with constants fitted for ring" in out["flags"]
    assert not any("extrapolated" in f for f in out["flags"])


def test_large_message_intercept_flagged_as_latency():
    model = known_model(ALPHA, BETA, GAMMA, world_sizes=[2])
    fit = next(f for f in model["fits"] if f["collective"] == "allreduce")
    fit["pieces"] = [{"max_bytes": 4194304.0, "alpha": ALPHA, "beta": BETA, "gamma": GAMMA},
                     {"max_bytes": None, "alpha": 833e-6, "beta": BETA, "gamma": GAMMA}]
    out = simulate(model, "allreduce", 1024, "switch:1024", [1 << 20, 1 << 26])
    assert not out["rows"][0]["flags"]
    flag = out["rows"][1]["flags"][0]
    assert "per-step latency 833 us is 167x the fit's small-message alpha" in flag
    assert "charged 2046 times at 1024 ranks" in flag
    assert "extrapolated 512x in ranks from a fit at 2 ranks" in out["flags"]


def test_busbw_above_the_link_is_flagged():
    flags = row_flags({"alpha": 1e-6, "sizes": [1, 1 << 30]}, 1 << 20, 1e-6, 2, [12.0], 10.0, 4)
    assert flags and "above the bottleneck link rate 10 GB/s" in flags[0]
    assert not row_flags({"alpha": 1e-6, "sizes": [1, 1 << 30]}, 1 << 20, 1e-6, 2, [9.9], 10.0, 4)


def test_a_fit_without_beta_is_flagged():
    # results/model.json's hypercube@mpi allreduce across 2,3,4 ranks fitted beta = 0: the
    # links then have no rate, the replay no contention, and busbw nothing to be checked by
    model = known_model(ALPHA, 0.0, GAMMA)
    out = simulate(model, "allreduce", 64, "fat-tree:64:leaf=8:oversub=4", [1 << 20],
                   "recursive-doubling", "both")
    row = out["rows"][0]
    assert row["bottleneck_link_gbps"] == float("inf")
    assert row["replay_vs_analytical"] == pytest.approx(1.0)
    assert any(f.startswith("the links have no rate: the fit's beta is 0") for f in row["flags"])
    with_bw = simulate(model, "allreduce", 64, "fat-tree:64:leaf=8:oversub=4", [1 << 20],
                       "recursive-doubling", "both", links=LinkOverrides(inter_beta=BETA))
    assert not with_bw["rows"][0]["flags"]
    assert not row_flags({"alpha": 1e-6, "sizes": [1, 1 << 30]}, 1 << 20, 1e-6, 2, [9.9],
                         10.0, 4)


def test_no_silent_backend_choice():
    model = known_model(ALPHA, BETA, GAMMA)
    model["fits"] += known_model(ALPHA * 2, BETA, GAMMA, backend="gloo")["fits"]
    with pytest.raises(UsageError, match="2 backends; choose one with --backend"):
        simulate(model, "allreduce", 8, "switch:8", [1024])
    out = simulate(model, "allreduce", 8, "switch:8", [1024], backend="gloo")
    assert out["fit"]["backend"] == "gloo"


def test_simulate_cli_flags_in_table_and_json(tmp_path, capsys):
    from ccbench.cli import main as cli_main

    model = known_model(ALPHA, BETA, GAMMA)
    path = tmp_path / "model.json"
    path.write_text(json.dumps(model))
    assert cli_main(["simulate", str(path), "allreduce", "--topology", "switch:64",
                     "--sizes", "1M,2G"]) == 0
    out = capsys.readouterr().out
    assert "# warning: extrapolated 16x in ranks from a fit at 2,4 ranks" in out
    assert "fitted at 2,4 ranks, sizes 1 KiB-1 GiB" in out
    assert "# flag 1: size 2 GiB is 2x above the largest size the fit saw (1 GiB)" in out
    assert cli_main(["simulate", str(path), "all", "--topology", "switch:8", "--sizes", "1M",
                     "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["collective"] for p in data["predictions"]] == list(COLLECTIVES)
    assert all("flags" in p and "fit_scope" in p for p in data["predictions"])


@pytest.mark.parametrize("topology,needle", [
    ("torus:3x0", "--topology 'torus:3x0': every dimension must be >= 1, got 0"),
    ("ring:1", "--topology 'ring:1' has 1 rank; need 2 or more"),
])
def test_topology_errors_name_the_topology(tmp_path, capsys, topology, needle):
    from ccbench.cli import main as cli_main

    path = tmp_path / "model.json"
    path.write_text(json.dumps(known_model(ALPHA, BETA, GAMMA)))
    assert cli_main(["simulate", str(path), "allreduce", "--topology", topology]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "--ranks" not in err.split(":", 2)[2].split("(")[0]


def test_hierarchical_ring_known_answer():
    # fat tree of 4 leaves x 8 ranks, spine 2:1 oversubscribed: dims (8, beta), (4, 2 beta)
    model = known_model(ALPHA, BETA, GAMMA)
    n = 1 << 30
    out = simulate(model, "allreduce", 32, "fat-tree:32:leaf=8:oversub=2", [n],
                   "hierarchical-ring")
    expected = (2 * 7 * ALPHA + 2 * 7 / 8 * n * BETA + 7 / 8 * n * GAMMA
                + 2 * 3 * ALPHA + 2 * 3 / 4 * (n / 8) * 2 * BETA + 3 / 4 * (n / 8) * GAMMA)
    assert out["rows"][0]["time_us"] * 1e-6 == pytest.approx(expected, rel=1e-12)
    flat = simulate(model, "allgather", 32, "switch:32", [n], "ring")["rows"][0]["time_us"]
    one = simulate(model, "allgather", 32, "switch:32", [n], "hierarchical-ring")
    assert one["rows"][0]["time_us"] == pytest.approx(flat, rel=1e-12)   # one dimension: ring
    with pytest.raises(UsageError, match="no replayable schedule"):
        simulate(model, "allreduce", 32, "fat-tree:32:leaf=8", [n], "hierarchical-ring",
                 fidelity="replay")
