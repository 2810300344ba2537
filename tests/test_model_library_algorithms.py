"""The algorithm a library really runs for a native record (ccbench.model.library_algorithms),
the direct all-to-all formula, and its replay under contention against hand-computed
max-min answers."""

from __future__ import annotations

import dataclasses

import pytest

from ccbench.errors import UsageError
from ccbench.model.costs import canonical_algorithm, coefficients
from ccbench.model.fit import calibrate
from ccbench.model.library_algorithms import library_algorithm
from ccbench.model.modelfile import build_model
from ccbench.model.netsim import replay_collective
from ccbench.model.simulate import simulate
from ccbench.model.synthetic import known_model, synthetic_records
from ccbench.model.topology import LinkClass, build_topology

BETA = 1e-8          # s/B: a link of 100 MB/s
N = 1 << 20          # bytes every rank sends in all (the all-to-all's S)
SIZES = [1 << 16, 1 << 18, 1 << 20, 1 << 22]


def test_direct_alltoall_formula_is_its_own():
    assert canonical_algorithm("alltoall", "direct") == "direct"
    assert canonical_algorithm("alltoall", "pairwise") == "pairwise"
    k = coefficients("alltoall", "direct", 6)
    assert (k.a, k.b, k.c) == (1.0, pytest.approx(5 / 6), 0.0)     # one latency, (p-1)/p n
    assert canonical_algorithm("allgather", "direct") == "ring"


def _replay(algo: str, topology: str, p: int, engine: str = "auto") -> float:
    topo = build_topology(topology, p, LinkClass(0.0, BETA))
    return replay_collective("alltoall", algo, p, N, topo, engine=engine).time


@pytest.mark.parametrize("engine", ["rounds", "events"])
def test_direct_on_oversubscribed_fat_tree_known_answer(engine):
    # 4 ranks, leaves {0,1} {2,3}, uplink 2 x C / 2 = C (C = 1/BETA). Every rank sends N/4 to
    # each of 3 peers at once. Each uplink direction carries 4 cross-leaf flows: C/4 each.
    # A rank's link then has C - 2 C/4 = C/2 left for its one same-leaf flow, which ends at
    # (N/4)/(C/2) = N/(2C); the cross flows stay at C/4 (the uplink is full) and end at
    # (N/4)/(C/4) = N/C: the whole all-to-all takes N BETA.
    assert _replay("direct", "fat-tree:4:leaf=2:oversub=2", 4, engine) == pytest.approx(N * BETA)
    # one switch: 3 flows share the rank's link, C/3 each: (N/4)/(C/3) = 3/4 N BETA
    assert _replay("direct", "switch:4", 4, engine) == pytest.approx(0.75 * N * BETA)
    # pairwise on the same fat tree: step 1 (r^1) stays in the leaf, N/4 at C; steps 2 and 3
    # (r^2, r^3) cross, 2 flows per uplink direction at C/2: N/4 BETA (1 + 2 + 2)
    assert _replay("pairwise", "fat-tree:4:leaf=2:oversub=2", 4, engine) == \
        pytest.approx(1.25 * N * BETA)


def test_direct_eight_ranks_known_answer():
    # leaves of 4, uplink 4 C / 2 = 2 C; per uplink direction 4 x 4 = 16 cross flows: C/8
    # each; a rank's 4 cross flows use C/2 of its link, its 3 same-leaf flows share the
    # other C/2 (C/6 each) and end at (N/8)/(C/6) = 3/4 N/C; the cross flows, held by the
    # uplink, end at (N/8)/(C/8) = N/C. One switch: 7 flows at C/7: 7/8 N/C.
    assert _replay("direct", "fat-tree:8:leaf=4:oversub=2", 8) == pytest.approx(N * BETA)
    assert _replay("direct", "switch:8", 8) == pytest.approx(7 / 8 * N * BETA)


def test_uplink_rate_option():
    # uplink=R sets the spine links' rate per rank link: with R = 2 C the 4-rank tree's
    # uplink carries 2 C, more than the 4 cross flows at C/3 (a rank's link shared by its 3
    # flows) need: no contention left, the one-switch time
    rate_bits = 2 / BETA * 8
    topo = f"fat-tree:4:leaf=2:oversub=2:uplink={rate_bits / 1e6:g}M"
    assert _replay("direct", topo, 4) == pytest.approx(0.75 * N * BETA)
    # R = C / 2: the uplink carries C / 2, 4 flows at C/8: (N/4)/(C/8) = 2 N BETA
    topo = f"fat-tree:4:leaf=2:oversub=2:uplink={1 / BETA * 8 / 2 / 1e6:g}M"
    assert _replay("direct", topo, 4) == pytest.approx(2 * N * BETA)
    for bad in ("fat-tree:4:leaf=2:uplink=fast", "switch:4:uplink=1G"):
        with pytest.raises(UsageError, match="uplink"):
            build_topology(bad, 4, LinkClass(0.0, BETA))


def _gloo(records):
    return [dataclasses.replace(r, backend="gloo", library="gloo", transport="gloo")
            for r in records]


def _intel(records, value: str | None):
    env = {"variables": {"I_MPI_ADJUST_ALLTOALL": value}} if value else {"variables": {}}
    return [dataclasses.replace(r, backend="mpi", library="Intel MPI", transport="mpi",
                                run_id=f"run-{value}", environment=env) for r in records]


def test_calibrate_prices_gloo_alltoall_as_direct_and_simulate_replays_it():
    recs = _gloo(synthetic_records("alltoall", "direct", [2, 4], SIZES, 2e-4, BETA, 0.0))
    assert library_algorithm(recs[0])[0] == "direct"
    fits = calibrate(recs, bootstrap=0)
    across = [f for f in fits if f.scope == "all-world-sizes"][0]
    assert across.line.algorithm == "direct"
    assert across.key["algorithm"] == "direct"
    assert "gloo/alltoall.cc" in across.algorithm_source
    assert across.line.beta == pytest.approx(BETA, rel=0.05)
    model = build_model(fits, recs, [])
    out = simulate(model, "alltoall", 4, "fat-tree:4:leaf=2:oversub=2", [N], fidelity="both")
    row = out["rows"][0]
    assert out["algorithm"] == "direct"
    alpha, beta = row["alpha_s"], row["beta_s_per_byte"]
    assert row["replay_time_us"] * 1e-6 == pytest.approx(alpha + N * beta)
    assert row["time_us"] * 1e-6 == pytest.approx(alpha + 0.75 * N * beta)


def test_intel_mpi_adjust_variables_pick_the_formula_and_split_groups():
    base = synthetic_records("alltoall", "pairwise", [2, 4], SIZES, 2e-4, BETA, 0.0)
    direct = _intel(synthetic_records("alltoall", "direct", [2, 4], SIZES, 2e-4, BETA, 0.0), "2")
    pairwise = _intel(base, "3")
    chosen = _intel(base, None)
    assert library_algorithm(direct[0]) == ("direct", "Intel MPI with I_MPI_ADJUST_ALLTOALL=2 "
                                                      "(Isend/Irecv + waitall)")
    assert library_algorithm(pairwise[0])[0] == "pairwise"
    assert library_algorithm(chosen[0]) is None
    assert library_algorithm(_intel(base, "8:0-1024;3")[0]) is None     # size ranges: native
    fits = [f for f in calibrate(direct + pairwise + chosen, bootstrap=0)
            if f.scope == "all-world-sizes"]
    by_algorithm = {f.key["algorithm"]: f for f in fits}
    assert set(by_algorithm) == {"direct", "pairwise", "native"}
    assert by_algorithm["direct"].line.algorithm == "direct"
    assert by_algorithm["pairwise"].line.algorithm == "pairwise"
    assert by_algorithm["native"].algorithm_source == ""
    assert by_algorithm["direct"].to_json()["algorithm_source"].startswith("Intel MPI with")


def test_known_model_direct_export_matches_formula(tmp_path):
    from ccbench.formats.astra import export_astra

    model = known_model(5e-5, BETA, 0.0, backend="gloo")
    for fit in model["fits"]:
        if fit["collective"] == "alltoall":
            fit["model_algorithm"] = "direct"
    man = export_astra(model, tmp_path, 5, "switch:5", "alltoall", [N])
    assert man["workload"]["implementation"] == "direct1"
    used = man["workload"]["nodes"][0]["size_used"]        # whole float32s per peer
    assert man["workload"]["total_us"] * 1e-6 == pytest.approx(5e-5 + 0.8 * used * BETA)
    assert man["dims"][0]["latency_ns"] == pytest.approx((5e-5 / 4 * 1e9 - 1) / 2)


def _mpich(records, variables: dict[str, str]):
    return [dataclasses.replace(r, backend="mpi", library="MPICH", transport="mpi",
                                environment={"variables": variables}) for r in records]


def test_mpich_cvars_pick_the_formula():
    ring = synthetic_records("allreduce", "ring", [3], SIZES, 2e-4, BETA, 1e-10)
    assert library_algorithm(_mpich(ring, {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "ring"})[0]) \
        == ("ring", "MPICH with MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=ring (ring)")
    assert library_algorithm(_mpich(ring, {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "auto"})[0]) \
        is None
    rs = synthetic_records("reduce-scatter", "ring", [3], SIZES, 2e-4, BETA, 1e-10)
    assert library_algorithm(_mpich(rs, {"MPIR_CVAR_REDUCE_SCATTER_BLOCK_INTRA_ALGORITHM":
                                         "pairwise"})[0])[0] == "ring"
    a2a = synthetic_records("alltoall", "direct", [4], SIZES, 2e-4, BETA, 0.0)
    scattered = {"MPIR_CVAR_ALLTOALL_INTRA_ALGORITHM": "scattered"}
    assert library_algorithm(_mpich(a2a, scattered)[0])[0] == "direct"
    # posted in batches of 2 at 4 ranks: not every message at once
    assert library_algorithm(_mpich(a2a, {**scattered, "MPIR_CVAR_ALLTOALL_THROTTLE": "2"})[0]) \
        is None
    assert library_algorithm(_mpich(a2a, {**scattered, "MPIR_CVAR_ALLTOALL_THROTTLE": "0"})[0])[0] \
        == "direct"


def test_intel_reduce_scatter_variable_is_not_the_block_one():
    # ccbench calls MPI_Reduce_scatter_block: I_MPI_ADJUST_REDUCE_SCATTER does not govern it
    rs = synthetic_records("reduce-scatter", "ring", [3], SIZES, 2e-4, BETA, 1e-10)
    for name in ("I_MPI_ADJUST_REDUCE_SCATTER", "I_MPI_ADJUST_REDUCE_SCATTER_BLOCK"):
        recs = [dataclasses.replace(r, backend="mpi", library="Intel MPI", transport="mpi",
                                    environment={"variables": {name: "2"}}) for r in rs]
        assert library_algorithm(recs[0]) is None


def test_direct_alltoall_fit_across_world_sizes_leaves_out_two_ranks():
    # at 2 ranks each port carries one flow; at 4 and 8 the p-1 flows share it and (as over
    # TCP) reach less of the link: the fit across world sizes follows the shared ports
    shared = synthetic_records("alltoall", "direct", [4, 8], SIZES, 2e-4, BETA, 0.0)
    single = synthetic_records("alltoall", "direct", [2], SIZES, 2e-4, 0.8 * BETA, 0.0)
    fits = calibrate(_gloo(shared + single), bootstrap=0)
    across = [f for f in fits if f.scope == "all-world-sizes"][0]
    assert across.world_sizes == [4, 8]
    assert across.line.beta == pytest.approx(BETA, rel=0.02)
    assert any("2 ranks left out" in note for note in across.notes)
    assert sorted(f.world_sizes[0] for f in fits if f.scope == "world-size") == [2, 4, 8]
    # 2 ranks alone: their own fit
    only = calibrate(_gloo(single), bootstrap=0)
    assert [f.world_sizes for f in only] == [[2]]
