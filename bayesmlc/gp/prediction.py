"""Predictions of a trained :class:`~bayesmlc.gp.objective.MLGPFModule`: the mean utilities E_q[f] and
the predictive probabilities E_q[sigmoid(f)] (journal paper sec. 4.3), for prepared rows."""

from __future__ import annotations

import numpy as np
import torch

from .likelihoods import BernoulliLogit
from .objective import MLGPFModule, utility_moments

__all__ = ["QUADRATURE_GRID_ENTRIES", "mean_utilities", "predictive_probabilities"]

#: ``predictive_probabilities`` scores rows in chunks whose (rows, L, Q) quadrature grid holds at most this many entries.
QUADRATURE_GRID_ENTRIES = 1 << 24


def mean_utilities(module: MLGPFModule, X, jitter: float, mean_weights: torch.Tensor | None = None):
    """E_q[f] = E_q[h] Phi^T + b (+ X W^T with the linear term) for prepared rows ``X`` (b, D),
    without gradients.

    Returns ((b, L) float32 array, the (M, P) weights W with E_q[h(x)] = k_Z(x)^T W). Passing
    ``mean_weights`` from an earlier call with the same parameters and jitter skips the M x M
    factorisation.
    """
    with torch.no_grad():
        batch = module.inducing.make_batch(X)
        blocks = module.kernel(module.inducing.inner_products(batch, module.kernel.input_weights()))
        if mean_weights is None:
            mean_weights = module.variational.mean_weights(module.variational.prepare(blocks.zz, jitter))
        mean_h = blocks.xz @ mean_weights
        scores = mean_h @ module.Phi.T + module.bias
        if module.linear is not None:
            scores = scores + module.linear.utilities(X)
    return scores.float().cpu().numpy(), mean_weights


def predictive_probabilities(module: MLGPFModule, X, jitter: float, quadrature_points: int,
                             return_mean: bool = False):
    """E_q[sigmoid(f)] for prepared rows ``X`` (n, D): the moments of q(f) (:func:`utility_moments`
    of the conditional, as :func:`~bayesmlc.gp.objective.latent_marginals` gives it), integrated
    against the sigmoid by Gauss-Hermite quadrature with ``quadrature_points`` nodes. Returns an (n, L) float32 array; with
    ``return_mean``, also the mean utilities E_q[f] (n, L) of the same pass (equal to
    :func:`mean_utilities` to float rounding: the conditional's mean is the same k(x, Z) alpha,
    computed in another order).

    Rows are processed in chunks so the (rows, L, Q) grid stays under ``QUADRATURE_GRID_ENTRIES``;
    the inducing inputs' factorisations do not depend on the rows and are made once.
    """
    n_labels = module.Phi.shape[0]
    likelihood = BernoulliLogit(quadrature_points)
    chunk = max(1, QUADRATURE_GRID_ENTRIES // (n_labels * quadrature_points))
    out = np.empty((X.shape[0], n_labels), dtype=np.float32)
    means = np.empty_like(out) if return_mean else None
    prep = None
    with torch.no_grad():
        for start in range(0, X.shape[0], chunk):
            batch = module.inducing.make_batch(X[start : start + chunk])
            blocks = module.kernel(module.inducing.inner_products(batch, module.kernel.input_weights()))
            if prep is None:
                prep = module.variational.prepare(blocks.zz, jitter)
            mean_h, var_h = module.variational.marginals(prep, blocks.xz, blocks.xx)
            f_mean, f_var = utility_moments(mean_h, var_h, module.Phi, module.bias)
            if module.linear is not None:  # a MAP term: it moves the mean, adds no variance
                f_mean = f_mean + module.linear.utilities(X[start : start + chunk])
            out[start : start + chunk] = likelihood.predictive_mean(f_mean, f_var).float().cpu().numpy()
            if return_mean:
                means[start : start + chunk] = f_mean.float().cpu().numpy()
    return (out, means) if return_mean else out
