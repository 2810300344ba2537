"""Calibration: known alpha/beta/gamma recovered from noisy synthetic records."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ccbench.errors import UsageError
from ccbench.model.costs import FORMULAS, canonical_algorithm, coefficients, predict_time
from ccbench.model.fit import calibrate, fit_line, nnls_small, summarize_validation, validate_world_sizes
from ccbench.model.modelfile import build_model, load_model, save_model
from ccbench.model.synthetic import synthetic_records

ALPHA, BETA, GAMMA = 20e-6, 1 / 5e9, 1 / 20e9
SIZES = [2 ** k for k in range(10, 25)]


def _across(fits, collective):
    return next(f for f in fits if f.key["collective"] == collective and f.scope == "all-world-sizes")


def test_nnls_small_matches_constraints():
    rng = np.random.default_rng(1)
    a = rng.random((30, 3))
    x_true = np.array([1.0, 0.0, 2.0])
    y = a @ x_true
    assert np.allclose(nnls_small(a, y), x_true, atol=1e-9)
    y2 = a @ np.array([1.0, -1.0, 2.0])          # the unconstrained optimum is negative
    assert np.all(nnls_small(a, y2) >= 0)


def test_formula_table_values():
    assert coefficients("allreduce", "ring", 4) == coefficients("allreduce", "ring", 4)
    k = coefficients("allreduce", "ring", 4)
    assert (k.a, k.b, k.c) == (6, 1.5, 0.75)
    k = coefficients("allreduce", "rabenseifner", 8)
    assert (k.a, k.b, k.c) == (6, 2 * 7 / 8, 7 / 8)
    assert coefficients("allgather", "bruck", 5).a == 3
    assert coefficients("alltoall", "bruck", 8).b == 1.5
    k = coefficients("reduce", "ring", 5)       # ring reduce-scatter, then blocks to the root
    assert (k.a, k.b, k.c) == (8, 2 * 4 / 5, 4 / 5)
    k = coefficients("reduce", "binomial", 5)
    assert (k.a, k.b, k.c) == (3, 3, 3)
    assert canonical_algorithm("reduce", "hypercube") == "tree"
    assert canonical_algorithm("allreduce", "hypercube") == "recursive-doubling"
    assert canonical_algorithm("allreduce", "dbtree") == "double-binary-tree"
    with pytest.raises(UsageError):
        canonical_algorithm("allreduce", "nonsense")
    for coll, algos in FORMULAS.items():
        for algo in algos:
            for p in (2, 3, 5, 8, 12):
                k = coefficients(coll, algo, p)
                assert k.a >= 0 and k.b >= 0 and k.c >= 0


def test_fit_recovers_alpha_beta_gamma_with_noise():
    recs = synthetic_records("allgather", "ring", [2, 3, 4, 8], SIZES, ALPHA, BETA, GAMMA,
                             noise=0.03, seed=3)
    recs += synthetic_records("allreduce", "ring", [2, 3, 4, 8], SIZES, ALPHA, BETA, GAMMA,
                              noise=0.03, seed=4)
    fits = calibrate(recs, bootstrap=40)
    ag, ar = _across(fits, "allgather"), _across(fits, "allreduce")
    assert ag.line.algorithm == "ring" and ar.line.algorithm == "ring"
    assert ag.line.alpha == pytest.approx(ALPHA, rel=0.03)
    assert ag.line.beta == pytest.approx(BETA, rel=0.03)
    assert ar.line.alpha == pytest.approx(ALPHA, rel=0.03)
    assert ar.line.gamma == pytest.approx(GAMMA, rel=0.15)
    assert ar.line.gamma_source.startswith("fitted with beta fixed")
    lo, hi = ag.ci95["alpha"]
    assert lo <= ALPHA * 1.02 and hi >= ALPHA * 0.98 and hi - lo < 0.05 * ALPHA
    assert ag.goodness["r2_log"] > 0.999 and ag.goodness["median_rel_err"] < 0.02
    assert ag.holdout["sizes"]["median_rel_err"] < 0.03
    assert set(ag.holdout["world_sizes"]) >= {"2", "3", "4", "8"}


def test_gamma_not_identifiable_alone_is_said():
    recs = synthetic_records("allreduce", "ring", [2, 4], SIZES, ALPHA, BETA, GAMMA, noise=0.01)
    fits = calibrate(recs, bootstrap=0)
    f = _across(fits, "allreduce")
    assert f.line.gamma == 0.0
    assert any("gamma not identifiable" in n for n in f.notes)
    # beta absorbs gamma: ring allreduce's c/b is 1/2
    assert f.line.beta == pytest.approx(BETA + GAMMA / 2, rel=0.03)


@pytest.mark.parametrize("coll,truth", [("allreduce", "recursive-doubling"),
                                        ("allreduce", "ring"), ("allreduce", "rabenseifner"),
                                        ("allgather", "bruck"), ("alltoall", "pairwise"),
                                        ("broadcast", "tree"), ("reduce", "tree"),
                                        ("reduce", "ring")])
def test_candidate_selection_picks_true_algorithm(coll, truth):
    recs = synthetic_records(coll, truth, [2, 3, 4, 6, 8, 16], SIZES, ALPHA, BETA, GAMMA,
                             noise=0.02, seed=7)
    if coll in ("allreduce", "reduce"):
        recs += synthetic_records("allgather", "ring", [2, 3, 4, 6, 8, 16], SIZES, ALPHA, BETA,
                                  GAMMA, noise=0.02, seed=8)
    fits = calibrate(recs, bootstrap=0)
    f = _across(fits, coll)
    assert f.line.algorithm == truth
    assert any("native: kept" in n for n in f.notes)
    per_p = [g for g in fits if g.key["collective"] == coll and g.scope == "world-size"]
    assert all(g.line.algorithm == truth for g in per_p)


def test_piecewise_breakpoint_detected():
    # one world size: a bandwidth change is a piece; the pieces share the small-message alpha
    recs = synthetic_records("broadcast", "tree", [4], SIZES, ALPHA, BETA, 0.0, noise=0.01,
                             breakpoint=(65536, ALPHA, 1 / 2e9))
    fits = calibrate(recs, bootstrap=0)
    f = fits[0]
    assert f.pieces is not None and f.pieces[0]["max_bytes"] == 65536
    assert f.pieces[0]["alpha"] == pytest.approx(ALPHA, rel=0.05)
    assert f.pieces[1]["alpha"] == f.pieces[0]["alpha"]
    assert f.pieces[1]["beta"] == pytest.approx(1 / 2e9, rel=0.05)
    assert f.goodness["max_rel_err"] < 0.05
    assert any("breakpoint at 65536" in n for n in f.notes)
    assert any("shares the lower piece's alpha" in n for n in f.notes)


def test_piecewise_alpha_of_its_own_only_across_world_sizes():
    # a large-message intercept (80 us per step) is identified when the piece spans p
    recs = synthetic_records("broadcast", "tree", [2, 4, 8], SIZES, ALPHA, BETA, 0.0,
                             noise=0.01, breakpoint=(65536, 80e-6, 1 / 8e9))
    across = next(f for f in calibrate(recs, bootstrap=0) if f.scope == "all-world-sizes")
    assert across.pieces is not None and across.pieces[0]["max_bytes"] == 65536
    assert across.pieces[1]["alpha"] == pytest.approx(80e-6, rel=0.05)
    assert across.pieces[1]["alpha_source"] == "fitted across world sizes"
    # the same intercept seen at one world size is not turned into a per-step latency
    one = calibrate([r for r in recs if r.world_size == 2], bootstrap=0)[0]
    assert all(p["alpha"] < 40e-6 for p in one.pieces or [{"alpha": one.line.alpha}])


def test_unidentifiable_fits_are_refused_or_flagged():
    one = synthetic_records("allreduce", "ring", [2], [1 << 20], ALPHA, BETA, 0.0)
    with pytest.raises(UsageError, match="one size.*cannot be told apart"):
        calibrate(one, bootstrap=0)
    skipped: list[str] = []
    two = synthetic_records("allgather", "ring", [2], [1024, 1 << 20], ALPHA, BETA, 0.0)
    fits = calibrate(one + two, bootstrap=0, skipped=skipped)
    assert len(fits) == 1 and fits[0].key["collective"] == "allgather"
    assert any("allreduce" in s and "one size" in s for s in skipped)
    assert any("exact by construction" in f for f in fits[0].flags)
    # gamma without a non-reducing collective: flagged in the model
    ar = synthetic_records("allreduce", "ring", [2, 4], SIZES, ALPHA, BETA, GAMMA)
    f = calibrate(ar, bootstrap=0)[-1]
    assert any(flag.startswith("gamma not identified") for flag in f.to_json()["flags"])
    assert f.to_json()["sizes"] == [SIZES[0], SIZES[-1]]


def test_unknown_algorithm_groups_are_skipped():
    recs = synthetic_records("allgather", "ring", [2, 4], SIZES[:6], ALPHA, BETA, 0.0)
    odd = synthetic_records("allgather", "ring", [2, 4], SIZES[:6], ALPHA, BETA, 0.0,
                            algorithm="nvls")
    skipped: list[str] = []
    fits = calibrate(recs + odd, bootstrap=0, skipped=skipped)
    assert fits and all(f.key["algorithm"] == "native" for f in fits)
    assert len(skipped) == 1 and "nvls" in skipped[0]
    with pytest.raises(UsageError, match="no records with a cost formula"):
        calibrate(odd, bootstrap=0)


def test_no_breakpoint_on_one_line():
    recs = synthetic_records("allgather", "ring", [4], SIZES, ALPHA, BETA, 0.0, noise=0.02)
    assert calibrate(recs, bootstrap=0)[0].pieces is None


def test_validate_train_2_4_predict_3():
    recs = []
    for coll, algo in (("allgather", "ring"), ("allreduce", "ring")):
        recs += synthetic_records(coll, algo, [2, 3, 4], SIZES, ALPHA, BETA, GAMMA,
                                  noise=0.02, seed=hash(coll) % 100)
    rows = validate_world_sizes(recs, [2, 4], [3])
    assert {r["world_size"] for r in rows} == {3}
    summary = summarize_validation(rows)
    assert len(summary) == 2
    for s in summary:
        assert s["median_rel_err"] < 0.03 and s["p90_rel_err"] < 0.06


def test_model_file_roundtrip_and_refusals(tmp_path):
    recs = synthetic_records("allgather", "ring", [2, 4], SIZES[:6], ALPHA, BETA, 0.0)
    fits = calibrate(recs, bootstrap=0)
    model = build_model(fits, recs, ["x.jsonl"])
    path = tmp_path / "model.json"
    save_model(model, path)
    loaded = load_model(path)
    assert loaded["units"]["alpha"] == "seconds" and loaded["version"] == 1
    assert loaded["sources"]["run_ids"] == ["synthetic"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**model, "version": 99}))
    with pytest.raises(UsageError, match="unknown model version"):
        load_model(bad)
    with pytest.raises(UsageError, match="no such model"):
        load_model(tmp_path / "missing.json")


def test_fit_line_exact_without_noise():
    ps = np.array([4.0] * 5 + [8.0] * 5)
    ns = np.array([1e3, 1e4, 1e5, 1e6, 1e7] * 2)
    ts = np.array([predict_time("allgather", "bruck", int(p), n, ALPHA, BETA, 0)
                   for p, n in zip(ps, ns, strict=True)])
    f = fit_line("allgather", "bruck", ps, ns, ts)
    assert f.alpha == pytest.approx(ALPHA, rel=1e-9) and f.beta == pytest.approx(BETA, rel=1e-9)


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:          # pragma: no cover
    given = None

if given is not None:
    @settings(max_examples=40, deadline=None)
    @given(alpha=st.floats(1e-7, 1e-3), beta=st.floats(1e-12, 1e-8),
           algo=st.sampled_from(["ring", "recursive-doubling", "bruck"]))
    def test_exact_recovery_property(alpha, beta, algo):
        ps = np.repeat([2.0, 3.0, 4.0, 8.0], 6)
        ns = np.tile([1e2, 1e3, 1e4, 1e5, 1e6, 1e7], 4)
        ts = np.array([predict_time("allgather", algo, int(p), n, alpha, beta, 0)
                       for p, n in zip(ps, ns, strict=True)])
        f = fit_line("allgather", algo, ps, ns, ts)
        assert f.alpha == pytest.approx(alpha, rel=1e-6)
        assert f.beta == pytest.approx(beta, rel=1e-6)


def test_a_fit_over_single_host_and_multi_host_records_is_flagged() -> None:
    """Memory and the network are different links: one alpha-beta over both is flagged."""
    from dataclasses import replace

    one_host = synthetic_records("allgather", "ring", [2, 4], SIZES, ALPHA, BETA, GAMMA)
    assert {r.nodes for r in one_host} == {1}
    alone = calibrate(one_host, bootstrap=0)
    assert not any("multi-host" in flag for f in alone for flag in f.flags)
    hosts = [replace(r, nodes=r.world_size, ranks_per_node=1)
             for r in synthetic_records("allgather", "ring", [2, 4], SIZES, ALPHA, 4 * BETA,
                                        GAMMA, seed=1)]
    mixed = calibrate(one_host + hosts, bootstrap=0)
    flagged = [f for f in mixed if any("mixes single-host and multi-host" in x for x in f.flags)]
    assert flagged and {f.scope for f in flagged} >= {"all-world-sizes"}
