"""BNMC at scale: the low-rank classifiers, solver choice, label blocks, sparse bookkeeping."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import bayesmlc.bnmc.classifier_fitting as classifier_fitting
from bayesmlc.bnmc import BNMC
from bayesmlc.bnmc.classifiers import (LowRankDesign, _sample_cg, choose_auto_solver, choose_solver,
                                       preconditioner_factor)
from bayesmlc.bnmc.labels import ObservedEntries
from bayesmlc.bnmc.mixture import _centred_unit_gram
from bayesmlc.metrics import auc_micro, precision_at_k

FAST = dict(n_passes=2, n_mode_steps=4, n_sweeps=2, n_keep=1, device="cpu")


def _low_rank_problem(n=700, D=60, rank=6, L=30, seed=0):
    """Non-negative sparse features whose signal lives in a rank-``rank`` subspace; labels from
    logistic models of that subspace."""
    rng = np.random.default_rng(seed)
    U = rng.gamma(1.0, 1.0, size=(n, rank))
    V = rng.random((rank, D)) * (rng.random((rank, D)) < 0.3)
    X = U @ V
    X = X * (rng.random(X.shape) < 0.6)
    W = rng.normal(scale=1.2, size=(rank, L))
    P = 1.0 / (1.0 + np.exp(-(U - U.mean(axis=0)) @ W + 1.5))
    Y = (rng.random(P.shape) < P).astype(float)
    return sp.csr_matrix(X), sp.csr_matrix(Y)


def test_low_rank_design_gives_the_exact_conditional_mean_and_precision_diagonal():
    rng = np.random.default_rng(1)
    n, D, r, C = 50, 12, 5, 3
    X = rng.normal(size=(n, D))
    basis = np.linalg.qr(rng.normal(size=(D, r)))[0]
    projected = (X @ basis).astype(np.float32)
    omega = torch.as_tensor(rng.gamma(2.0, 0.2, size=(n, C)), dtype=torch.float32)
    beta = torch.as_tensor(rng.normal(size=(n, C)), dtype=torch.float32)
    prior = torch.full((r + 1,), 2.0)
    prior[-1] = 0.01
    design = LowRankDesign(projected, torch.device("cpu"))
    mean, _ = _sample_cg(design, omega, beta, prior, torch.zeros(r + 1, C), torch.Generator().manual_seed(0), 1e-7, 500,
                         noise=0.0)
    Z = np.hstack([X @ basis, np.ones((n, 1))])
    for c in range(C):
        P = np.diag(prior.numpy().astype(np.float64)) + Z.T @ (omega[:, c].numpy()[:, None] * Z)
        np.testing.assert_allclose(mean[:, c].numpy(), np.linalg.solve(P, Z.T @ beta[:, c].numpy()), rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(design.precision_diagonal(omega, prior)[:, c].numpy(), np.diag(P), rtol=1e-5)


def test_full_rank_basis_has_the_full_space_conditional_mean():
    """w = V u with V square orthonormal: the prior is rotation invariant, so V times the projected
    conditional mean is the conditional mean in the original coordinates."""
    rng = np.random.default_rng(2)
    n, D = 40, 8
    X = rng.normal(size=(n, D))
    basis = np.linalg.qr(rng.normal(size=(D, D)))[0]
    omega = torch.as_tensor(rng.gamma(2.0, 0.2, size=(n, 1)), dtype=torch.float32)
    beta = torch.as_tensor(rng.normal(size=(n, 1)), dtype=torch.float32)
    prior = torch.full((D + 1,), 3.0)
    prior[-1] = 0.01
    design = LowRankDesign((X @ basis).astype(np.float32), torch.device("cpu"))
    u, _ = _sample_cg(design, omega, beta, prior, torch.zeros(D + 1, 1), torch.Generator(), 1e-8, 500, noise=0.0)
    Z = np.hstack([X, np.ones((n, 1))])
    P = np.diag(prior.numpy().astype(np.float64)) + Z.T @ (omega.numpy() * Z)
    w = np.linalg.solve(P, Z.T @ beta.numpy())[:, 0]
    np.testing.assert_allclose(basis @ u[:-1, 0].numpy(), w[:-1], rtol=1e-3, atol=1e-4)
    assert u[-1, 0].item() == pytest.approx(w[-1], rel=1e-3, abs=1e-4)


@pytest.mark.parametrize("shape, expected", [
    ((1211, 294, 6, 1211 * 294), "dense"),              # scene
    ((4880, 1836, 159, 4880 * 69), "cg"),               # bibtex
    ((2473, 77, 4125, 2473 * 77), "cg"),                # hmc_cellcycle_go (dense would cost 6e10)
    ((300, 1000, 20, 300 * 30), "woodbury"),            # few rows, many features, few labels
    ((898, 1001, 53, 898 * 90), "cg"),                  # enron's 80%: woodbury 1.4e10 flops, cg 4e8
    ((1243, 5000, 3993, 1243 * 236), "lowrank"),        # eurlex-4k at 10 %
    ((15539, 5000, 3993, 15539 * 236), "lowrank"),      # eurlex-4k
    ((43410, 13077, 28, 43410 * 10), "lowrank"),        # goemotions: a 13078^2 Cholesky
    ((1200, 3000, 1000, 1200 * 30), "lowrank"),         # cg's preconditioner solves: 1.8e11 flops a sweep
    ((7662, 1892, 4223, 7662 * 50), "lowrank"),         # a tagging set's shape: 3e11
])
def test_auto_solver_keeps_small_problems_exact_and_sends_large_ones_to_lowrank(shape, expected):
    assert choose_solver(*shape) == expected


@pytest.mark.parametrize("shape, expected", [
    ((12920, 500, 983, 12920 * 18), ("lowrank", 500)),   # delicious: cg on 500 features
    ((898, 1001, 53, 898 * 90), ("lowrank", 1001)),      # enron's 80%
    ((2473, 77, 4125, 2473 * 77), ("lowrank", 77)),      # hmc_cellcycle_go
    ((4880, 1836, 159, 4880 * 69), ("cg", None)),        # bibtex: above 1,024 features
    ((1211, 294, 6, 1211 * 294), ("dense", None)),       # scene
    ((15539, 5000, 3993, 15539 * 236), ("lowrank", None)),  # eurlex-4k: the rank is low_rank's
])
def test_auto_solver_runs_cg_on_the_full_rank_basis_up_to_1024_features(shape, expected):
    assert choose_auto_solver(*shape) == expected


def test_auto_solver_takes_a_full_rank_basis_where_it_would_take_cg():
    """Where ``auto`` would take ``cg`` and D <= 1024, the low-rank solver runs on all D right singular
    vectors: the same prior and likelihood, its factorised q(w) taken in that basis (where the design's
    columns are uncorrelated), so the posterior means and predictions stay close to cg's."""
    X, Y = _low_rank_problem(n=700, D=620, rank=8, L=8, seed=3)
    assert choose_solver(700, 620, 8, X.nnz) == "cg"
    params = dict(random_state=0, **FAST, calibration_folds=1)
    auto = BNMC(**params).fit(X, Y)
    exact = BNMC(solver="cg", **params).fit(X, Y)
    assert auto.solver_ == "lowrank" and auto.classifier_basis_.shape == (620, 620)
    spectrum = np.linalg.svd(auto.classifier_basis_.astype(np.float64), compute_uv=False)
    assert spectrum.min() > 0.97 and spectrum.max() < 1.03  # it spans the whole space, near-orthonormal
    weights = auto.classifier_basis_ @ auto.classifier_samples_[-1, :-1]  # back in the feature basis
    scale = np.abs(exact.classifier_samples_[-1, :-1]).max()
    np.testing.assert_allclose(weights, exact.classifier_samples_[-1, :-1], rtol=0, atol=0.1 * scale)
    p_auto, p_exact = auto.predict_proba(X), exact.predict_proba(X)
    assert np.abs(p_auto - p_exact).mean() < 0.01 and np.abs(p_auto - p_exact).max() < 0.08
    capped = BNMC(low_rank=16, **params).fit(X, Y)  # an explicit rank is kept
    assert capped.solver_ == "lowrank" and capped.classifier_basis_.shape == (620, 16)


def test_preconditioner_factor_adds_jitter_only_where_rounding_leaves_the_matrix_indefinite():
    rng = np.random.default_rng(0)
    A = rng.normal(size=(40, 30)).astype(np.float32)
    good = torch.as_tensor(A.T @ A + np.eye(30, dtype=np.float32))
    np.testing.assert_array_equal(preconditioner_factor(good).numpy(), torch.linalg.cholesky(good).numpy())
    singular = torch.as_tensor(A[:, :20] @ A[:, :20].T)  # 40 x 40 of rank 20
    with pytest.raises(RuntimeError):
        torch.linalg.cholesky(singular)
    L = preconditioner_factor(singular)
    assert L.dtype == torch.float32 and torch.isfinite(L).all()
    np.testing.assert_allclose((L @ L.T).numpy(), singular.numpy(), rtol=0, atol=1e-3 * singular.diagonal().mean().item())


def test_label_blocks_give_the_one_block_fit(monkeypatch):
    X, Y = _low_rank_problem(n=300, L=12)
    params = dict(solver="lowrank", low_rank=8, random_state=0, **FAST)
    whole = BNMC(**params).fit(X, Y)
    monkeypatch.setattr(classifier_fitting, "BLOCK_ENTRIES", 300 * 5)  # blocks of 5, 5 and 2 labels (240 rows)
    blocked = BNMC(**params).fit(X, Y)
    # equal up to the CG tolerance (1e-3 relative residual; the shared preconditioner is per block)
    np.testing.assert_allclose(blocked.classifier_samples_, whole.classifier_samples_, rtol=0, atol=2e-3)
    np.testing.assert_allclose(blocked.predict_proba(X), whole.predict_proba(X), rtol=0, atol=1e-3)


def test_low_rank_classifiers_match_the_exact_ones_on_a_low_rank_problem():
    X, Y = _low_rank_problem()
    Xtr, Ytr, Xte, Yte = X[:500], Y[:500], X[500:], Y[500:]
    exact = BNMC(solver="cg", random_state=0, **FAST).fit(Xtr, Ytr)
    low = BNMC(solver="lowrank", low_rank=10, random_state=0, **FAST).fit(Xtr, Ytr)
    assert low.solver_ == "lowrank" and low.classifier_basis_.shape == (X.shape[1], 10)
    assert low.classifier_samples_.shape[1:] == (11, Y.shape[1])  # r + 1 coordinates per label
    p_exact, p_low = exact.predict_proba(Xte), low.predict_proba(Xte)
    assert auc_micro(Yte, p_low) > auc_micro(Yte, p_exact) - 0.01
    assert auc_micro(Yte, p_low) > 0.75
    assert precision_at_k(Yte, p_low, 1) > precision_at_k(Yte, p_exact, 1) - 0.05


def test_low_rank_model_saves_and_loads(tmp_path):
    X, Y = _low_rank_problem(n=200, L=8)
    model = BNMC(solver="lowrank", low_rank=6, random_state=0, **FAST).fit(X, Y)
    path = tmp_path / "bnmc.npz"
    model.save(path)
    loaded = BNMC.load(path)
    np.testing.assert_allclose(loaded.predict_proba(X), model.predict_proba(X), rtol=1e-6)


def test_online_sgd_on_the_basis_when_dense_weights_would_be_too_many(monkeypatch):
    monkeypatch.setattr(classifier_fitting, "SGD_DENSE_WEIGHTS", 100)
    X, Y = _low_rank_problem(n=800, L=20)
    stream = BNMC(random_state=0, low_rank=10, **FAST)
    for start in range(0, 600, 100):
        stream.partial_fit(X[start:start + 100], Y[start:start + 100])
    assert stream.classifier_basis_.shape == (X.shape[1], 10)
    assert stream._sgd.W.shape == (11, Y.shape[1])
    assert auc_micro(Y[600:], stream.predict_proba(X[600:])) > 0.7
    online = BNMC(online=True, random_state=0, low_rank=10, **FAST).fit(X[:600], Y[:600])
    assert online._sgd.W.shape == (11, Y.shape[1])
    assert auc_micro(Y[600:], online.predict_proba(X[600:])) > 0.7


def test_centred_unit_gram_matches_the_dense_computation():
    X = sp.random(30, 50, density=0.2, random_state=4, format="lil")
    X[5] = 0.0  # an empty row
    X = X.tocsr()
    dense = X.toarray()
    centred = dense - dense.mean(axis=0)
    unit = centred / (np.linalg.norm(centred, axis=1, keepdims=True) + 1e-12)
    np.testing.assert_allclose(_centred_unit_gram(X), unit @ unit.T, atol=1e-9)
    np.testing.assert_allclose(_centred_unit_gram(dense), unit @ unit.T, atol=1e-9)


def test_observed_entries_blocks_equal_the_dense_mask():
    rng = np.random.default_rng(5)
    mask = (rng.random((9, 7)) < 0.6).astype(float)
    entries = ObservedEntries(sp.csr_matrix(mask), mask.sum(axis=1) > 0, 7)
    rows = np.array([0, 3, 8])
    np.testing.assert_array_equal(entries.block(rows, slice(2, 5)), mask[rows][:, 2:5])
    np.testing.assert_array_equal(entries.per_label(), mask.sum(axis=0))
    np.testing.assert_array_equal(entries.complete_rows(), mask.sum(axis=1) == 7)
    labelled = np.array([True, False, True])
    no_mask = ObservedEntries(None, labelled, 4)
    np.testing.assert_array_equal(no_mask.block(), np.repeat(labelled[:, None], 4, axis=1).astype(float))
    np.testing.assert_array_equal(no_mask.per_label(), [2, 2, 2, 2])


def test_dirichlet_loglik_on_the_columns_a_sparse_minibatch_uses_equals_the_full_product():
    from scipy.special import digamma

    from bayesmlc.bnmc.mixture import DirichletEmission

    emission = DirichletEmission(500, 0.1)
    emission.conc = np.random.default_rng(0).gamma(1.0, 1.0, (7, 500)) + 0.1
    X = sp.random(20, 500, density=0.01, format="csr", random_state=1)  # uses < 250 columns
    e_log = digamma(emission.conc) - digamma(emission.conc.sum(axis=1, keepdims=True))
    np.testing.assert_allclose(emission.expected_loglik(X), X.toarray() @ e_log.T, rtol=1e-12, atol=1e-12)


def test_label_term_of_the_responsibilities_takes_the_digammas_of_the_used_labels_only():
    """The mixture's label term (and the feature term) for a sparse label minibatch using few of the L
    labels equals the product with every label's E[log psi]."""
    from scipy.special import digamma

    from bayesmlc.bnmc.mixture import LazyConcentration, _expected_log_counts

    conc = np.random.default_rng(2).gamma(1.0, 1.0, (5, 300)) + 0.05
    Y = sp.random(40, 300, density=0.01, format="csr", random_state=3, data_rvs=np.ones)
    assert np.unique(Y.indices).size < 150  # the restricted path
    e_log = digamma(conc) - digamma(conc.sum(axis=1, keepdims=True))
    lazy = LazyConcentration(conc, 0.05)
    np.testing.assert_allclose(_expected_log_counts(Y, lazy), Y.toarray() @ e_log.T, rtol=1e-12, atol=1e-12)
    dense_Y = sp.csr_matrix(np.ones((3, 300)))  # every label used: the full product
    np.testing.assert_allclose(_expected_log_counts(dense_Y, lazy), dense_Y.toarray() @ e_log.T, rtol=1e-12)


def test_lazy_concentration_steps_equal_the_dense_natural_gradient_steps(monkeypatch):
    """Steps on a few columns at a time (and whole-matrix and rho = 1 steps) of the scaled form against
    conc <- (1 - rho) conc + rho (prior + stats) on the dense matrix, through a renormalisation."""
    from bayesmlc.bnmc.mixture import LazyConcentration

    monkeypatch.setattr(LazyConcentration, "MIN_SCALE", 1e-2)  # several renormalisations in 400 steps
    rng = np.random.default_rng(5)
    prior = 0.3
    dense = prior + rng.gamma(1.0, 2.0, (4, 50))
    lazy = LazyConcentration(dense, prior)
    for t in range(400):
        rho = 1.0 if t == 150 else (t + 2.0) ** -0.6
        if t % 7 == 0:
            columns, stats = None, rng.gamma(0.5, 1.0, (4, 50))
            full = stats
        else:
            columns = np.sort(rng.choice(50, 6, replace=False))
            stats = rng.gamma(0.5, 1.0, (4, 6))
            full = np.zeros((4, 50))
            full[:, columns] = stats
        dense = (1.0 - rho) * dense + rho * (prior + full)
        lazy.step(rho, stats, columns)
    np.testing.assert_allclose(lazy.dense(), dense, rtol=1e-10)
    np.testing.assert_allclose(lazy.row_sums(), dense.sum(axis=1), rtol=1e-10)
    np.testing.assert_allclose(lazy.columns(np.array([3, 7])), dense[:, [3, 7]], rtol=1e-10)


def test_the_float32_low_rank_basis_spans_the_top_singular_vectors():
    # BNMC's lowrank solver: top_singular_vectors in float32, transposed to (D, r)
    from bayesmlc.linalg import top_singular_vectors

    rng = np.random.default_rng(6)
    # a spectrum with a gap after the 8th direction; sparse rows
    left = np.linalg.qr(rng.normal(size=(400, 40)))[0]
    right = np.linalg.qr(rng.normal(size=(90, 40)))[0]
    spectrum = np.r_[np.linspace(20, 10, 8), np.linspace(2, 0.1, 32)]
    X = sp.csr_matrix((left * spectrum) @ right.T)
    Vt, s = top_singular_vectors(X, 8, seed=0, dtype=np.float32)
    V = Vt.T
    assert V.dtype == np.float32
    np.testing.assert_allclose(V.T @ V, np.eye(8), atol=1e-5)
    np.testing.assert_allclose(s, spectrum[:8], rtol=1e-5)
    top = right[:, :8]
    assert np.linalg.norm(V @ V.T - top @ top.T, 2) < 1e-3
    # the largest entry of each column is positive (a convention independent of the seed)
    assert np.all(V[np.abs(V).argmax(axis=0), np.arange(8)] > 0)


def test_the_automatic_basis_rank_is_the_largest_whose_sweep_fits_the_budget():
    from bayesmlc.bnmc.classifiers import EXACT_BUDGET_FLOPS, choose_low_rank

    # 15 n (r + 1) L <= budget, worked out by hand at L = 28: n <= budget / (15 * 1025 * 28) = 69,686
    # for r = 1024, <= 92,885 for r = 768, <= 139,236 for r = 512, and 256 below that whatever the cost
    assert choose_low_rank(69_686, 50_000, 28) == 1024
    assert choose_low_rank(69_687, 50_000, 28) == 768
    assert choose_low_rank(92_885, 50_000, 28) == 768
    assert choose_low_rank(92_886, 50_000, 28) == 512
    assert choose_low_rank(139_236, 50_000, 28) == 512
    assert choose_low_rank(139_237, 50_000, 28) == 256
    assert choose_low_rank(10**7, 50_000, 28) == 256
    assert choose_low_rank(1_000, 300, 28) == 300  # never above D
    assert choose_low_rank(1_000, 50_000, 28, budget=EXACT_BUDGET_FLOPS / 1e6) == 256
    # the EURLex-4K and goemotions shapes (training rows, features, labels), the budget alone
    assert choose_low_rank(15_539, 5_000, 3_993) == 256
    assert choose_low_rank(43_410, 13_077, 28) == 1024


def test_the_automatic_basis_rank_allows_products_of_a_fixed_number_of_passes_over_the_features():
    from bayesmlc.bnmc.classifiers import LOW_RANK_PASSES, choose_low_rank

    assert LOW_RANK_PASSES == 16_384
    # (r + 1) L <= 16,384 x entries a row, worked out by hand at L = 3,993 (far over the flop budget):
    # r = 1024 from 1025 x 3993 / 16384 = 249.80 entries a row, 768 from 769 x 3993 / 16384 = 187.41,
    # 512 from 513 x 3993 / 16384 = 125.03; below that 256 whatever the cost
    n, D, L = 12_431, 5_000, 3_993
    assert choose_low_rank(n, D, L, nnz_per_row=249.81) == 1024
    assert choose_low_rank(n, D, L, nnz_per_row=249.79) == 768
    assert choose_low_rank(n, D, L, nnz_per_row=236.2) == 768  # the EURLex-4K shape
    assert choose_low_rank(n, D, L, nnz_per_row=187.42) == 768
    assert choose_low_rank(n, D, L, nnz_per_row=187.40) == 512
    assert choose_low_rank(n, D, L, nnz_per_row=125.04) == 512
    assert choose_low_rank(n, D, L, nnz_per_row=125.02) == 256
    assert choose_low_rank(n, D, L, nnz_per_row=None) == 256
    # 8,000 labels over 100 word counts a row: 257 x 8000 = 2,056,000 > 16,384 x 100, so 256
    assert choose_low_rank(16_000, 20_000, 8_000, nnz_per_row=100.0) == 256
    # either condition is enough: goemotions' shape keeps 1024 by the budget (11 entries a row)
    assert choose_low_rank(43_410, 13_077, 28, nnz_per_row=11.1) == 1024
    assert choose_low_rank(n, 600, L, nnz_per_row=300.0) == 600  # never above D


def test_beside_the_support_term_the_rank_rule_may_go_down_to_128():
    from bayesmlc.bnmc.classifiers import LOW_RANKS, SUPPORT_LOW_RANK, choose_low_rank

    ranks = LOW_RANKS + (SUPPORT_LOW_RANK,)
    assert ranks == (1024, 768, 512, 256, 128)
    # 129 x 8000 = 1,032,000 <= 16,384 x 100 < 257 x 8000: 128 on the word counts' shape
    assert choose_low_rank(16_000, 20_000, 8_000, nnz_per_row=100.0, ranks=ranks) == 128
    assert choose_low_rank(16_000, 20_000, 8_000, nnz_per_row=125.49, ranks=ranks) == 256  # 257 x 8000 / 16384
    # AmazonCat-13K's shape (71 entries a row): none is affordable, so the smallest
    assert choose_low_rank(118_624, 203_882, 13_330, nnz_per_row=70.9, ranks=ranks) == 128
    assert choose_low_rank(12_431, 5_000, 3_993, nnz_per_row=236.2, ranks=ranks) == 768  # EURLex-4K: as before


def test_the_fit_gives_the_rank_rule_the_mean_stored_entries_of_the_fitted_rows(monkeypatch):
    X, Y = _low_rank_problem(n=300, L=12)
    seen = []

    def spy(n, n_features, n_labels, budget=None, nnz_per_row=None, ranks=None):
        seen.append((n, n_features, n_labels, nnz_per_row, ranks))
        return 8
    monkeypatch.setattr(classifier_fitting, "choose_low_rank", spy)
    model = BNMC(solver="lowrank", low_rank="auto", random_state=0, validation_fraction=0.0, **FAST).fit(X, Y)
    assert model.classifier_basis_.shape == (60, 8)
    assert seen[0][4][-1] == 128  # the support term is on: the ladder goes down to 128
    BNMC(solver="lowrank", support_features=0, random_state=0, validation_fraction=0.0, **FAST).fit(X, Y)
    assert seen[-1][4][-1] == 256
    # every labelled row is fitted (no validation split; rows without a label are missing label
    # vectors); the features' weighting keeps the sparsity pattern
    labelled = np.flatnonzero(np.diff(Y.indptr) > 0)
    assert seen[0][:3] == (labelled.size, 60, 12)
    assert seen[0][3] == pytest.approx(X[labelled].nnz / labelled.size, rel=1e-12)


def test_low_rank_shared_precision_matches_a_float64_computation():
    rng = np.random.default_rng(3)
    projected = rng.normal(size=(400, 30)).astype(np.float32)
    weights, prior = rng.gamma(2.0, 0.1, size=400), np.full(31, 0.5)
    design = LowRankDesign(projected, torch.device("cpu"))
    Z = np.hstack([projected.astype(np.float64), np.ones((400, 1))])
    expected = Z.T @ (weights[:, None] * Z) + np.diag(prior)
    got = design.shared_precision(weights, prior).double().numpy()
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())
