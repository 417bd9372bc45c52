"""Per-label feature supports: for each label, the K feature columns where its evidence lies, and
products with weights restricted to them. Shared by MLGPF's linear term (:mod:`bayesmlc.gp.linear_support`)
and BNMC's support term (:mod:`bayesmlc.bnmc.support_term`).

**The support** of label l: the K columns with the largest |g_lj|, g_lj = sum_i (y_il - p_l) x_ij
the gradient of the logistic log-likelihood in w_lj at w = 0 with the bias at its maximum-likelihood
value p_l = n_l / N, among the columns stored in l's positive rows (elsewhere g_lj = -n_l mean_j,
evidence against the label that a ranking does not need). Ranking predictors by |x_j^T r| at the
start of a path is the screening of the lasso's strong rules (Tibshirani et al. 2012, "Strong rules
for discarding predictors in lasso-type problems", JRSS B 74(2), sec. 2) and of sure independence
screening (Fan and Lv 2008). A label with fewer than K such columns pads its support with -1.
"""

from __future__ import annotations

import numba
import numpy as np
import scipy.sparse as sp

from .utils import run_blocks, thread_bounds

__all__ = ["gradient_support", "label_blocks", "support_products"]

#: :func:`gradient_support` forms X^T y_l for at most this many (label, feature) stored entries at a time
SUPPORT_BLOCK_ENTRIES = 1 << 24


def gradient_support(X: sp.csr_matrix, Y: sp.csr_matrix, n_features: int) -> np.ndarray:
    """(L, K) int64: for each label the K = ``n_features`` columns of the prepared rows ``X`` (n, D)
    with the largest standardised gradient |sum_i (y_il - n_l / n) x_ij| / sd_j among the columns
    stored in its positive rows (module docstring), ascending; -1 pads a label with fewer such
    columns. X^T Y is formed a block of labels at a time (about :data:`SUPPORT_BLOCK_ENTRIES` stored
    entries a block)."""
    X, Y = sp.csr_matrix(X, dtype=np.float64), sp.csc_matrix(Y, dtype=np.float64)
    Y.data[:] = 1.0
    n_rows, n_labels = Y.shape
    column_mean = np.asarray(X.mean(axis=0)).ravel()
    column_var = np.asarray(X.multiply(X).sum(axis=0)).ravel() / max(n_rows, 1) - column_mean**2
    column_sd = np.sqrt(np.maximum(column_var, 1e-12))
    counts = np.diff(Y.indptr)
    support = np.full((n_labels, n_features), -1, dtype=np.int64)
    X_t = sp.csr_matrix(X.T)
    entries_per_positive = X.nnz / max(n_rows, 1)
    start = 0
    while start < n_labels:
        stop = start + 1 + int(np.searchsorted(np.cumsum(counts[start + 1 :] * entries_per_positive),
                                               SUPPORT_BLOCK_ENTRIES))
        block = sp.csc_matrix(X_t @ Y[:, start:stop])  # (D, labels): x_j^T y_l
        block.sort_indices()
        _top_columns(block.indptr, block.indices, block.data, column_mean, column_sd,
                     counts[start:stop].astype(np.float64), support[start:stop])
        start = stop
    return support



@numba.njit(cache=True, nogil=True)
def _top_columns(indptr, indices, data, column_mean, column_sd, counts, out):
    """out[l] = the stored columns j of label l (CSC block column l) with the largest
    |data - counts[l] column_mean[j]| / column_sd[j], ascending, -1 padded (ties: the lower column)."""
    k = out.shape[1]
    for label in range(out.shape[0]):
        lo, hi = indptr[label], indptr[label + 1]
        size = hi - lo
        if size == 0:
            continue
        score = np.empty(size)
        for p in range(size):
            j = indices[lo + p]
            score[p] = -abs(data[lo + p] - counts[label] * column_mean[j]) / column_sd[j]
        take = min(k, size)
        chosen = np.sort(indices[lo:hi][np.argsort(score, kind="mergesort")[:take]])
        out[label, :take] = chosen



@numba.njit(cache=True, nogil=True)
def _support_times(colptr, rows, values, support, weight, out, start, stop):
    """out[t, i] = sum_s weight[t, s] x_{i, support[t, s]} for labels t in [start, stop), from a CSC
    (``colptr``, ``rows``, ``values``) of the rows x; ``out`` (T, n) zeroed by the caller."""
    for t in range(start, stop):
        row_out = out[t]
        for s in range(support.shape[1]):
            j = support[t, s]
            w = weight[t, s]
            if j < 0 or w == 0.0:
                continue
            for p in range(colptr[j], colptr[j + 1]):
                row_out[rows[p]] += w * values[p]



def label_blocks(n_labels: int, work) -> None:
    """Run ``work(start, stop)`` over label blocks on ``torch.get_num_threads()`` threads (the
    kernels release the GIL; each block writes its own rows)."""
    run_blocks(thread_bounds(n_labels, 64), work)



def support_products(X_csc: sp.csc_matrix, support: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """(T, n): w_t^T x_i over the support columns, for a CSC ``X_csc`` (n, D) and ``support``,
    ``weight`` (T, K)."""
    out = np.zeros((support.shape[0], X_csc.shape[0]), dtype=weight.dtype)
    values = X_csc.data.astype(weight.dtype, copy=False)
    label_blocks(support.shape[0], lambda a, b: _support_times(X_csc.indptr, X_csc.indices, values, support,
                                                                 weight, out, a, b))
    return out
