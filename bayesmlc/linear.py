"""Baseline: one L2-regularised logistic regression per label, fitted for all labels at once."""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp
import torch

from .base import MultiLabelEstimator
from .exceptions import ValidationError
from .utils import csr_to_torch, iter_batches, numpy_rng, resolve_device, torch_generator

__all__ = ["LogisticRegression"]

_CHUNK_ROWS = 8192


class LogisticRegression(MultiLabelEstimator):
    """Independent per-label logistic regressions (one-vs-rest), the field's standard baseline.

    Minimises, for every label l at once,

        C * sum_i m_il * log(1 + exp(-s_il (x_i . w_l + b_l))) + 0.5 * ||w_l||^2,

    with s_il = +1 for a positive and -1 otherwise, and m_il = 1 where the label entry is observed
    (0 where ``label_mask`` hides it). This is scikit-learn's ``LogisticRegression(C=C)`` objective
    per label, solved by full-batch L-BFGS over the (D + 1) x L parameters with sparse ``X``.

    Parameters
    ----------
    C : float, default=1.0
        Inverse regularisation strength (as in scikit-learn).
    max_iter : int, default=100
        L-BFGS iterations.
    tol : float, default=1e-6
        Stopping tolerance on the gradient's largest entry (relative to C * n_samples).
    standardize : bool, default=False
        Divide each feature by its standard deviation (without centring, so sparsity is kept).
        Useful for dense real-valued features (emotions, scene, yeast).
    random_state : int, Generator or None
        Unused by the deterministic solver; kept for the common contract.
    device : {"auto", "cpu", "cuda"}
    verbose : bool

    Examples
    --------
    >>> from bayesmlc.linear import LogisticRegression
    >>> import numpy as np
    >>> X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    >>> Y = np.array([[1, 0], [0, 1], [1, 1], [0, 0]])
    >>> model = LogisticRegression(C=10.0).fit(X, Y)
    >>> model.predict(X).toarray().astype(int).tolist()
    [[1, 0], [0, 1], [1, 1], [0, 0]]
    """

    def __init__(self, C=1.0, max_iter=100, tol=1e-6, standardize=False, random_state=None, device="auto", verbose=False):
        self.C = C
        self.max_iter = max_iter
        self.tol = tol
        self.standardize = standardize
        self.random_state = random_state
        self.device = device
        self.verbose = verbose

    def _check_params(self):
        if not (isinstance(self.C, (int, float)) and self.C > 0):
            raise ValidationError(f"C must be a positive number, got {self.C!r}")
        if not (isinstance(self.max_iter, (int, np.integer)) and self.max_iter >= 1):
            raise ValidationError(f"max_iter must be a positive integer, got {self.max_iter!r}")

    def _fit(self, X, Y, label_mask):
        self._check_params()
        numpy_rng(self.random_state)  # validates the argument
        device = resolve_device(self.device)
        start = time.perf_counter()
        n, d = X.shape
        n_labels = Y.shape[1]
        if self.standardize:
            mean = np.asarray(X.mean(axis=0)).ravel()
            sq = np.asarray(X.multiply(X).mean(axis=0)).ravel()
            std = np.sqrt(np.maximum(sq - mean**2, 0.0))
            self.feature_scale_ = np.where(std > 0, 1.0 / np.maximum(std, 1e-12), 1.0).astype(np.float32)
            X = sp.csr_matrix(X.multiply(self.feature_scale_[None, :]), dtype=np.float32)
        else:
            self.feature_scale_ = None
        chunks = []
        for rows in iter_batches(n, _CHUNK_ROWS):
            x = csr_to_torch(X[rows], device)
            y = torch.from_numpy(Y[rows].toarray()).to(device)
            m = None if label_mask is None else torch.from_numpy(label_mask[rows].toarray()).to(device)
            chunks.append((x, y, m))
        weights = torch.zeros(d, n_labels, device=device, requires_grad=True)
        prior = np.clip(self.label_prior_, 1e-6, 1 - 1e-6)
        bias = torch.tensor(np.log(prior / (1 - prior)), dtype=torch.float32, device=device).requires_grad_(True)
        scale = 1.0 / n  # objective divided by C * n for a well-conditioned line search

        def objective():
            total = 0.5 * (weights * weights).sum() / (self.C * n)
            for x, y, m in chunks:
                logits = torch.sparse.mm(x, weights) + bias
                loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y, weight=m, reduction="sum")
                total = total + loss * scale
            return total

        optimizer = torch.optim.LBFGS(
            [weights, bias], max_iter=self.max_iter, tolerance_grad=self.tol, tolerance_change=1e-10,
            history_size=20, line_search_fn="strong_wolfe",
        )

        def closure():
            optimizer.zero_grad()
            value = objective()
            value.backward()
            self.history_["objective"].append(-float(value.detach()) * n)  # log posterior up to a constant
            self.history_["wall_time"].append(time.perf_counter() - start)
            return value

        optimizer.step(closure)
        self.coef_ = weights.detach().cpu().numpy()
        self.intercept_ = bias.detach().cpu().numpy()
        self.n_iter_ = len(self.history_["objective"])

    def _decision_function(self, X):
        if self.feature_scale_ is not None:
            X = sp.csr_matrix(X.multiply(self.feature_scale_[None, :]), dtype=np.float32)
        return np.asarray(X @ self.coef_) + self.intercept_
