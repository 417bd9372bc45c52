"""BNMC's low-rank variational logistic classifiers (bnmc/lowrank_fit.py) against the general sampler."""

import numpy as np
import torch

from bayesmlc.bnmc.classifiers import LowRankDesign, gibbs_classifier
import bayesmlc.bnmc.lowrank_fit as lowrank_fit
from bayesmlc.bnmc.lowrank_fit import variational_logistic


def _problem(n=400, r=6, C=9, seed=0):
    rng = np.random.default_rng(seed)
    projected = rng.normal(size=(n, r)).astype(np.float32)
    W = rng.normal(scale=1.5, size=(r, C))
    Y = (rng.random((n, C)) < 1.0 / (1.0 + np.exp(-(projected @ W) + 2.0))).astype(np.float64)
    mask = (rng.random((n, C)) < 0.9).astype(np.float64)
    prior = np.full(r + 1, 0.5)
    prior[-1] = 1e-2
    return projected, Y, mask, prior


def test_variational_logistic_gives_the_general_samplers_variational_fit(monkeypatch):
    monkeypatch.setattr(lowrank_fit, "MODE_CG_TOL", 0.0)  # the Newton steps solved as tightly as the sweeps
    projected, Y, mask, prior = _problem()
    design = LowRankDesign(projected, torch.device("cpu"))
    expected_means, expected_var, expected_trace = gibbs_classifier(
        design, Y * mask, mask, "logistic", prior, 4, 2, np.random.default_rng(0), "cg", cg_tol=1e-7, n_mode_steps=5,
        inference="variational")
    means, variances, trace = variational_logistic(
        design, torch.as_tensor(Y * mask, dtype=torch.float32), torch.as_tensor(mask, dtype=torch.float32), prior, 4, 2,
        n_mode_steps=5, cg_tol=1e-7)
    np.testing.assert_allclose(means, expected_means, rtol=0, atol=2e-4)
    np.testing.assert_allclose(variances, expected_var, rtol=1e-4)
    np.testing.assert_allclose(trace, expected_trace, rtol=1e-5)


def test_no_weights_means_every_entry_observed():
    projected, Y, _, prior = _problem(C=4, seed=5)
    design = LowRankDesign(projected, torch.device("cpu"))
    Y_t = torch.as_tensor(Y, dtype=torch.float32)
    ones = variational_logistic(design, Y_t, torch.ones_like(Y_t), prior, 3, 2, n_mode_steps=3)
    unweighted = variational_logistic(design, Y_t, None, prior, 3, 2, n_mode_steps=3)
    for got, expected in zip(unweighted, ones):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_block_log_likelihood_is_the_weighted_bernoulli_sum():
    """The per-label log-likelihood (softplus over every entry, y m over the positives only) against the
    float64 sum of w (y m - log(1 + e^m)) entry by entry, with and without weights."""
    rng = np.random.default_rng(3)
    margins = rng.normal(scale=3.0, size=(50, 6))
    Y = (rng.random((50, 6)) < 0.2).astype(np.float64)
    weights = rng.random((50, 6)) * (rng.random((50, 6)) < 0.8)
    for w in (None, weights):
        labels = lowrank_fit._Labels.of(torch.as_tensor(Y, dtype=torch.float32),
                                        None if w is None else torch.as_tensor(w, dtype=torch.float32))
        got = lowrank_fit._log_likelihood(torch.as_tensor(margins, dtype=torch.float32), labels, lambda t: t)
        terms = Y * margins - np.logaddexp(0.0, margins)
        expected = (terms if w is None else terms * w).sum(axis=0)
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5)


def test_low_rank_design_products_are_those_of_the_projected_rows_with_a_bias_column():
    projected, _, _, prior = _problem(n=30, r=5)
    design = LowRankDesign(projected, torch.device("cpu"))
    Z = np.hstack([projected.astype(np.float64), np.ones((30, 1))])
    rng = np.random.default_rng(1)
    W, U, row_weights = rng.normal(size=(6, 4)), rng.normal(size=(30, 4)), rng.random(30)
    np.testing.assert_allclose(design.matmul(torch.as_tensor(W, dtype=torch.float32)).numpy(), Z @ W, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(design.rmatmul(torch.as_tensor(U, dtype=torch.float32)).numpy(), Z.T @ U, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(design.shared_precision(row_weights, prior).numpy(),
                               Z.T @ (Z * row_weights[:, None]) + np.diag(prior), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(design.Z_sq.numpy(), Z * Z, rtol=1e-6)
