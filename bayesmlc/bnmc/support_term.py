"""BNMC's support term: a per-label sparse linear term beside the low-rank classifiers.

The ``lowrank`` solver restricts each label's weights to span(V), the top-r right singular vectors of
the classifier features (:class:`~bayesmlc.bnmc.classifiers.LowRankDesign`). A tail label whose evidence
lies in rare features outside that span sees none of it. The support term gives label l a margin

    m_il = z_i^T u_l + x_{i,S_l}^T v_l,        u_l ~ N(0, I / lambda),  v_l ~ N(0, I / lambda_S),

with z_i = [x_i V, 1] and S_l the K columns of :func:`~bayesmlc.feature_support.gradient_support` (the
largest standardised logistic gradients at zero among the columns of l's positive rows). Both parts are
Gaussian, so eq. 6's classifier keeps a Gaussian prior on w_l = V u_l + P_{S_l} v_l, with covariance
V V^T / lambda + P_S P_S^T / lambda_S: a sum of two linear kernels (Rasmussen and Williams 2006, sec.
4.2.4). lambda_S is :data:`SUPPORT_PRIOR_SHARE` of the basis's lambda (``weight_precision_``).

**Inference.** After the classifiers' variational fit on the low-rank design
(:func:`~bayesmlc.bnmc.lowrank_fit.variational_logistic`), q(v_l) is fitted with q(u_l) held at its mean
(one backfitting pass, Hastie and Tibshirani 1990) as a Laplace approximation with a diagonal
covariance: the mode of

    sum_i w_il log p(y_il | z_i^T E[u_l] + x_{i,S_l}^T v_l) - lambda_S / 2 |v_l|^2

(w_il the entry's weight: 0 where the label is missing) by passes of coordinate Newton steps (the
coordinate descent Newton method of Yuan et al. 2010, JMLR 11, "A comparison of optimization methods and
software for large-scale L1-regularized linear classification", sec. 4.1.2, with the L2 penalty),

    v_lj <- v_lj + (sum_i w_il x_ij (y_il - p_il) - lambda_S v_lj) / (lambda_S + sum_i w_il x_ij^2 p_il (1 - p_il)),

each step capped so that no margin moves by more than :data:`MAX_MARGIN_STEP`; then s_lj = 1 / (lambda_S +
sum_i w_il x_ij^2 p_il (1 - p_il)) at the mode. The Polya-Gamma mean-field updates of the basis
(tanh(xi / 2) / (2 xi) in place of p (1 - p)) converged too slowly here: on a tail label's positive row
at margin -6 their curvature is 30 times the likelihood's, and four passes left |v| at 0.8 of the mode
and validation P@1 below the basis alone. A pass costs O(sum_{j in S_l} nnz(x_j)) per label, on all
cores (labels in parallel).

Prediction adds x_{S_l}^T mu_l to the margins and x_{S_l}^2 . s_l to their variance before the
probit moderation (:func:`~bayesmlc.bnmc.classifiers.classifier_evidence`).

Measured in docs/experiments.md ("BNMC: the support term").
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np
import scipy.sparse as sp
import torch

from ..feature_support import gradient_support, label_blocks, support_products

__all__ = ["MAX_MARGIN_STEP", "SUPPORT_FEATURES", "SUPPORT_PASSES", "SUPPORT_PRIOR_SHARE", "SupportTerm",
           "fit_support_block", "resolve_support_features", "select_supports", "support_term_possible"]

#: ``support_features="auto"``: K, the columns of each label's support, where the term applies (the
#: ``lowrank`` solver with fewer basis vectors than features, one process, variational logistic)
SUPPORT_FEATURES = 128
#: lambda of the term's prior as a share of the basis's ``weight_precision_``: validation P@1 / PSP@5 at
#: 1, 0.5, 0.25 and 0.1 of it: eurlex-4k:0.25 52.17 / 13.27, 54.91 / 14.55, 54.43 / 15.34, 53.46 / 14.54;
#: amazoncat-13k:0.01 68.34 / 22.31, 72.34 / 24.29, 73.76 / 25.90, 73.55 / 26.53; the 8,000-label word
#: counts at 5,000 rows 58.75 / 28.34 (1), 58.75 / 29.72 (0.25), 57.00 / 29.18 (0.1)
SUPPORT_PRIOR_SHARE = 0.25
#: Coordinate Newton passes over each label's support
SUPPORT_PASSES = 2
#: The largest change of any margin in one coordinate step
MAX_MARGIN_STEP = 2.0


def support_term_possible(setting, world_size: int, classifier: str, inference: str) -> bool:
    """Whether BNMC's ``support_features`` ``setting`` can give a term at all: not 0, one process, variational
    logistic classifiers (then a ``lowrank`` basis narrower than the features takes it)."""
    return setting != 0 and world_size == 1 and classifier == "logistic" and inference == "variational"


def resolve_support_features(setting, solver: str, rank: int | None, n_features: int, world_size: int,
                             classifier: str, inference: str) -> int:
    """K of BNMC's ``support_features`` setting ("auto" or an int >= 0) for the resolved fit: 0 (no
    term) unless :func:`support_term_possible` and the classifiers are on a ``lowrank`` basis of
    ``rank`` < ``n_features``; then ``setting`` (capped at ``n_features``), "auto" taking
    :data:`SUPPORT_FEATURES`."""
    if solver != "lowrank" or rank is None or rank >= n_features or not support_term_possible(
            setting, world_size, classifier, inference):
        return 0
    return min(SUPPORT_FEATURES if setting == "auto" else int(setting), n_features)


class SupportTerm(NamedTuple):
    """The fitted term: ``columns`` (L, K) int32 (-1: none), ``means`` and ``variances`` (L, K) float32
    of q(v); a label that was not fitted has no column."""

    columns: np.ndarray
    means: np.ndarray
    variances: np.ndarray

    @classmethod
    def empty(cls, n_labels: int, width: int) -> "SupportTerm":
        """A term of ``n_labels`` supports of ``width`` (K) columns, none filled."""
        return cls(np.full((n_labels, width), -1, dtype=np.int32), np.zeros((n_labels, width), np.float32),
                   np.zeros((n_labels, width), np.float32))

    @classmethod
    def of(cls, model) -> "SupportTerm | None":
        """The term a fitted BNMC holds (``support_columns_``, ...), None where it has none (files written
        before the term existed have none)."""
        columns = getattr(model, "support_columns_", None)
        return None if columns is None else cls(columns, model.support_means_, model.support_variances_)

    def store(self, model) -> None:
        """Set the term on a BNMC (``support_columns_``, ``support_means_``, ``support_variances_``)."""
        model.support_columns_, model.support_means_, model.support_variances_ = self

    @staticmethod
    def clear(model) -> None:
        """Remove a BNMC's term (its three arrays set to None)."""
        model.support_columns_ = model.support_means_ = model.support_variances_ = None

    def margins(self, X: sp.spmatrix) -> tuple[np.ndarray, np.ndarray]:
        """(mean, variance) of x_{S_l}^T v_l for the classifier features ``X`` (n, D), each (n, L) float32."""
        X_csc = sp.csc_matrix(X, dtype=np.float32)
        squares = X_csc.multiply(X_csc).tocsc()
        return (support_products(X_csc, self.columns, self.means).T,
                support_products(squares, self.columns, self.variances).T)


def select_supports(X: sp.csr_matrix, Y: sp.spmatrix, labels: np.ndarray, n_features: int) -> np.ndarray:
    """(len(labels), K) int32: the supports of ``labels`` on the rows ``X`` (CSR) and ``Y`` (CSR or CSC)."""
    return gradient_support(X, Y[:, labels], n_features).astype(np.int32)


def fit_support_block(X_csc: sp.csc_matrix, columns: np.ndarray, Y: torch.Tensor, weights, margins: torch.Tensor,
                      precision: float, n_passes: int = SUPPORT_PASSES):
    """q(v) of a block of C labels (module docstring): ``X_csc`` (n, D) the fitted rows' classifier
    features, ``columns`` (C, K) their supports, ``Y`` (n, C) 0/1 and ``weights`` (n, C) or None (every
    entry observed), ``margins`` (n, C) z_i^T E[u_l] under the fitted q(u), ``precision`` lambda_S.
    Returns (means, variances), each (C, K) float32."""
    labels, offsets = (np.ascontiguousarray(t.T.cpu().numpy(), dtype=np.float32) for t in (Y, margins))
    entry_weights = np.ones((0, 0), np.float32) if weights is None else np.ascontiguousarray(
        weights.T.cpu().numpy(), dtype=np.float32)
    means = np.zeros(columns.shape, np.float32)
    variances = np.zeros(columns.shape, np.float32)
    values = X_csc.data.astype(np.float32, copy=False)
    label_blocks(columns.shape[0], lambda a, b: _coordinate_newton(
        X_csc.indptr, X_csc.indices, values, columns, labels, offsets, entry_weights, np.float32(precision),
        n_passes, means, variances, a, b))
    return means, variances


@numba.njit(cache=True, nogil=True)
def _coordinate_newton(colptr, rows, values, columns, labels, margins, entry_weights, precision, n_passes, means,
                       variances, start, stop):
    """``n_passes`` passes of coordinate Newton steps (module docstring) for the labels t in [start, stop),
    then one pass for the variances at the mode: their rows of ``margins`` (C, n) are updated in place,
    ``means`` and ``variances`` (C, K) written. ``labels`` (C, n) 0/1; ``entry_weights`` (C, n), or
    (0, 0) for every entry observed."""
    weighted = entry_weights.shape[0] > 0
    for t in range(start, stop):
        m, y = margins[t], labels[t]
        for sweep in range(n_passes + 1):
            for s in range(columns.shape[1]):
                j = columns[t, s]
                if j < 0:
                    continue
                old = means[t, s]
                gradient = -precision * old
                curvature = precision
                largest = 0.0
                for p in range(colptr[j], colptr[j + 1]):
                    i, x = rows[p], values[p]
                    weight = entry_weights[t, i] if weighted else 1.0
                    prob = 1.0 / (1.0 + np.exp(-m[i]))
                    gradient += weight * x * (y[i] - prob)
                    curvature += weight * x * x * prob * (1.0 - prob)
                    largest = max(largest, abs(x))
                if sweep == n_passes:
                    variances[t, s] = 1.0 / curvature
                    continue
                step = gradient / curvature
                if largest > 0.0:  # no margin moves by more than MAX_MARGIN_STEP in one step
                    bound = MAX_MARGIN_STEP / largest
                    step = min(max(step, -bound), bound)
                means[t, s] = old + step
                for p in range(colptr[j], colptr[j + 1]):
                    m[rows[p]] += values[p] * step
