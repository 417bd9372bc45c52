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
