"""Multi-label evaluation metrics, vectorised over sparse ground truth.

Ground truth ``Y_true`` is a 0/1 matrix of shape (n, L), preferably ``scipy.sparse`` CSR; it is never
densified. Ranking metrics take either dense ``scores`` of shape (n, L) or a top-k result
``(indices, values)``, two arrays of shape (n, k) with the best label first, as returned by
:meth:`bayesmlc.base.MultiLabelEstimator.predict_topk`. Every metric returns a Python ``float``, a
fraction (not a percentage).

Conventions for rows without any true label (see ``docs/metrics.md``):

* P@k, nDCG@k and the unnormalised PSP@k / PSnDCG@k count such a row as 0 in their mean over rows
  (as pyxclib does); the row's ideal DCG is 0 and its nDCG is *defined* as 0.
* The normalised PSP@k / PSnDCG@k are ratios of means; an empty row adds 0 to both means, so it does
  not change the value.
* ``auc_instance`` averages over rows with both classes only; ``auc_macro`` over labels with both
  classes only (``return_count=True`` says how many were used).
* ``f1_example``: a row with no true and no predicted label scores ``zero_division`` (default 1).
* ``exact_match``: such a row matches when nothing is predicted for it.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from sklearn.exceptions import UndefinedMetricWarning

from .exceptions import ValidationError
from .validation import check_label_mask, check_labels

__all__ = [
    "topk",
    "inverse_propensity",
    "inverse_propensity_from_counts",
    "precision_at_k",
    "ndcg_at_k",
    "psprecision_at_k",
    "psndcg_at_k",
    "auc_micro",
    "auc_macro",
    "auc_instance",
    "f1_example",
    "f1_micro",
    "f1_macro",
    "exact_match",
    "hamming_loss",
    "ReliabilityCurve",
    "reliability_curve",
    "expected_calibration_error",
    "topk_reliability_curve",
    "ece_at_k",
    "brier_at_k",
    "RiskCoverage",
    "risk_coverage_curve",
    "aurc",
    "calibration_curves",
    "evaluate",
]

# Dense inputs are processed in blocks of about this many entries, so that temporaries (sorted
# copies, selections, bin indices) stay bounded for inputs like 100k x 1k.
_BLOCK_ENTRIES = 1 << 22


# ---- input checks ---------------------------------------------------------------------------------
def _check_y_true(Y_true, name: str = "Y_true") -> sp.csr_matrix:
    Y = check_labels(Y_true, name)
    if Y.shape[0] == 0:
        raise ValidationError(f"{name} has no rows")
    if Y.shape[1] == 0:
        raise ValidationError(f"{name} has no label columns")
    return Y


def _check_k(k, name: str = "k") -> int:
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValidationError(f"{name} must be a positive integer, got {k!r}")
    return int(k)


def _check_dense(values, shape, name: str) -> np.ndarray:
    """A dense, finite, real 2-D array of exactly ``shape`` (no copy when already an ndarray)."""
    if sp.issparse(values):
        raise ValidationError(
            f"{name} must be a dense array of shape {tuple(shape)}, got a sparse matrix; for very many "
            "labels pass the top-k result (indices, values) of predict_topk to the ranking metrics"
        )
    array = np.asarray(values)
    if array.ndim != 2:
        raise ValidationError(f"{name} must be 2-D (n_samples, n_labels), got shape {array.shape}")
    if array.dtype.kind not in "biuf":
        raise ValidationError(f"{name} must be real-valued, got dtype {array.dtype}")
    if array.shape != tuple(shape):
        raise ValidationError(f"{name} has shape {array.shape} but Y_true has shape {tuple(shape)}")
    if array.dtype.kind == "f":
        for rows in _row_blocks(array.shape[0], array.shape[1]):
            finite = np.isfinite(array[rows])
            if not finite.all():
                bad_row, bad_col = np.argwhere(~finite)[0]
                raise ValidationError(
                    f"{name} contains NaN or inf (first at row {rows.start + bad_row}, column {bad_col})"
                )
    return array


def _check_proba(proba, shape, name: str = "proba") -> np.ndarray:
    array = _check_dense(proba, shape, name)
    if array.size and (array.min() < 0 or array.max() > 1):
        raise ValidationError(
            f"{name} must hold probabilities in [0, 1]; found values in [{array.min()}, {array.max()}]"
        )
    return array


def _check_mask(label_mask, shape) -> sp.csr_matrix | None:
    mask = check_label_mask(label_mask, shape)
    if mask is not None and mask.nnz == 0:
        raise ValidationError("label_mask marks no entry as observed: there is nothing to evaluate")
    return mask


def _check_zero_division(zero_division) -> float:
    value = float(zero_division) if isinstance(zero_division, (int, float, np.floating, np.integer)) else None
    if value is None or not (value in (0.0, 1.0) or np.isnan(value)):
        raise ValidationError(f"zero_division must be 0, 1 or numpy.nan, got {zero_division!r}")
    return value


def _row_blocks(n_rows: int, n_cols: int):
    step = max(1, _BLOCK_ENTRIES // max(1, n_cols))
    for start in range(0, n_rows, step):
        yield slice(start, min(start + step, n_rows))


def _entry_rows(matrix: sp.csr_matrix) -> np.ndarray:
    """Row index of each stored entry of a CSR matrix (the COO row array)."""
    return np.repeat(np.arange(matrix.shape[0], dtype=np.int64), np.diff(matrix.indptr))


def _restrict(Y: sp.csr_matrix, mask: sp.csr_matrix | None) -> sp.csr_matrix:
    """``Y`` with unobserved entries dropped."""
    if mask is None:
        return Y
    out = sp.csr_matrix(Y.multiply(mask), dtype=np.float32)
    out.eliminate_zeros()
    out.sort_indices()
    return out


# ---- top-k ----------------------------------------------------------------------------------------
def topk(scores, k: int):
    """The ``k`` highest scores of each row, best first.

    Ties are broken towards the lower label index, everywhere (also at the k-th place), so the result
    equals ``np.argsort(-scores, axis=1, kind="stable")[:, :k]`` and does not depend on the platform.
    Rows are processed in blocks with ``np.partition``, so the cost is O(n L) plus O(n k log k).

    Parameters
    ----------
    scores : array-like, shape (n, L), finite
    k : int, positive; values above L are clipped to L.

    Returns
    -------
    indices : ndarray of int64, shape (n, min(k, L))
    values : ndarray, shape (n, min(k, L)), same dtype as ``scores``
    """
    k = _check_k(k)
    scores = np.asarray(scores)
    if scores.ndim != 2:
        raise ValidationError(f"scores must be 2-D (n_samples, n_labels), got shape {scores.shape}")
    return _topk(_check_dense(scores, scores.shape, "scores"), k)


def _topk(scores: np.ndarray, k: int):
    """:func:`topk` on an already validated array."""
    n, n_labels = scores.shape
    k = min(k, n_labels)
    indices = np.empty((n, k), dtype=np.int64)
    values = np.empty((n, k), dtype=scores.dtype)
    if k == 0:
        return indices, values
    for rows in _row_blocks(n, n_labels):
        block = scores[rows]
        # The k-th largest value of each row; everything above it is in, ties with it fill up the
        # remaining places in label order.
        kth = np.partition(block, n_labels - k, axis=1)[:, n_labels - k][:, None]
        above = block > kth
        tied = block == kth
        missing = k - above.sum(axis=1, keepdims=True)
        if np.array_equal(tied.sum(axis=1, keepdims=True), missing):  # no tie crosses the k-th place
            chosen = above | tied
        else:
            chosen = above | (tied & (np.cumsum(tied, axis=1) <= missing))
        cols = np.nonzero(chosen)[1].reshape(-1, k)  # row-major, so k per row in label order
        vals = np.take_along_axis(block, cols, axis=1)
        order = np.argsort(-vals, axis=1, kind="stable")  # stable: equal values stay in label order
        indices[rows] = np.take_along_axis(cols, order, axis=1)
        values[rows] = np.take_along_axis(vals, order, axis=1)
    return indices, values


def _ranked_indices(scores, k: int, shape) -> np.ndarray:
    """Top-``min(k, L)`` label indices per row, best first, from dense scores or a top-k tuple."""
    n, n_labels = shape
    needed = min(k, n_labels)
    if isinstance(scores, tuple):
        if len(scores) != 2:
            raise ValidationError("a top-k result must be a pair (indices, values) of arrays of shape (n, k)")
        indices, values = (np.asarray(part) for part in scores)
        if indices.ndim != 2 or indices.shape != values.shape:
            raise ValidationError(
                f"top-k indices and values must be 2-D arrays of equal shape, got {indices.shape} and {values.shape}"
            )
        if indices.dtype.kind not in "iu":
            raise ValidationError(f"top-k indices must be integers, got dtype {indices.dtype}")
        if indices.shape[0] != n:
            raise ValidationError(f"top-k result has {indices.shape[0]} rows but Y_true has {n}")
        if indices.shape[1] < needed:
            raise ValidationError(
                f"top-k result holds {indices.shape[1]} labels per row but k={k} needs {needed}; "
                f"call predict_topk with k >= {needed}"
            )
        indices, values = indices[:, :needed], values[:, :needed]
        if indices.size and (indices.min() < 0 or indices.max() >= n_labels):
            raise ValidationError(f"top-k indices must lie in [0, {n_labels}) (the label columns of Y_true)")
        if values.size and not np.all(np.isfinite(values)):
            raise ValidationError("top-k values contain NaN or inf")
        if needed > 1:
            if np.any(np.diff(values, axis=1) > 0):
                bad = int(np.flatnonzero(np.any(np.diff(values, axis=1) > 0, axis=1))[0])
                raise ValidationError(f"top-k values must be sorted best first in every row; row {bad} is not")
            if np.any(np.diff(np.sort(indices, axis=1), axis=1) == 0):
                bad = int(np.flatnonzero(np.any(np.diff(np.sort(indices, axis=1), axis=1) == 0, axis=1))[0])
                raise ValidationError(f"top-k indices repeat a label in row {bad}")
        return indices.astype(np.int64, copy=False)
    return _topk(_check_dense(scores, shape, "scores"), needed)[0]


def _hits(Y: sp.csr_matrix, indices: np.ndarray) -> np.ndarray:
    """Boolean (n, k): whether ranked label ``indices[i, r]`` is a true label of row i.

    Looks every (row, label) pair up in the sorted CSR keys ``row * L + column``; O(n k log nnz).
    """
    n, n_labels = Y.shape
    keys = _entry_rows(Y) * n_labels + Y.indices  # ascending: rows in order, sorted indices within
    query = np.arange(n, dtype=np.int64)[:, None] * n_labels + indices
    where = np.searchsorted(keys, query)
    where = np.minimum(where, max(keys.size - 1, 0))
    return keys[where] == query if keys.size else np.zeros(indices.shape, dtype=bool)


def _discounts(k: int) -> np.ndarray:
    """DCG discounts 1 / log2(r + 1) for ranks r = 1..k."""
    return 1.0 / np.log2(np.arange(2, k + 2, dtype=np.float64))


def _ideal_dcg(Y: sp.csr_matrix, k: int) -> np.ndarray:
    """Per-row ideal DCG@k of binary relevance: sum of the first min(k, |y_i|) discounts (0 if empty)."""
    cumulative = np.concatenate([[0.0], np.cumsum(_discounts(k))])
    return cumulative[np.minimum(np.diff(Y.indptr), k)]


def _best_weighted(Y: sp.csr_matrix, weights: np.ndarray, k: int, discount: bool) -> np.ndarray:
    """Per-row best achievable sum of the top-k weights of the row's true labels (optionally discounted).

    Each row's true labels are ordered by decreasing weight and the first k taken; a row with fewer than
    k true labels is padded with weight 0, i.e. contributes only what it has.
    """
    rows = _entry_rows(Y)
    entry_weights = weights[Y.indices]
    order = np.lexsort((-entry_weights, rows))  # by row, then by decreasing weight
    rank_in_row = np.arange(Y.nnz) - Y.indptr[rows]  # rows[order] == rows: the sort keeps rows grouped
    keep = rank_in_row < k
    gains = entry_weights[order][keep]
    if discount:
        gains = gains * _discounts(k)[rank_in_row[keep]]
    return np.bincount(rows[keep], weights=gains, minlength=Y.shape[0])


def _check_weights(propensities, Y_train, A, B, n_labels: int) -> np.ndarray:
    if (propensities is None) == (Y_train is None):
        raise ValidationError(
            "give exactly one of propensities (the inverse propensity of each label) or Y_train "
            "(training labels to compute them from)"
        )
    if Y_train is not None:
        weights = inverse_propensity(Y_train, A=A, B=B)
    else:
        weights = np.asarray(propensities, dtype=np.float64)
        if weights.ndim != 1:
            raise ValidationError(f"propensities must be 1-D (one weight per label), got shape {weights.shape}")
        if not np.all(np.isfinite(weights)):
            raise ValidationError("propensities contain NaN or inf")
        if weights.size and weights.min() < 1:
            raise ValidationError(
                "propensities must be inverse propensities w_l = 1/p_l >= 1 (p_l in (0, 1]); found "
                f"{weights.min():.4g}. Did you pass p_l instead of 1/p_l? inverse_propensity() computes w"
            )
    if weights.shape[0] != n_labels:
        raise ValidationError(f"propensities have {weights.shape[0]} entries but Y_true has {n_labels} labels")
    return weights


# ---- propensities ---------------------------------------------------------------------------------
def inverse_propensity_from_counts(label_counts, n_rows: int, A: float = 0.55, B: float = 1.5) -> np.ndarray:
    """Jain et al. (2016) inverse propensities from label frequencies.

    ``w_l = 1 / p_l = 1 + C (N_l + B)^(-A)`` with ``C = (ln N - 1) (B + 1)^A``, where ``N_l`` is the
    number of training rows with label l and ``N`` the number of training rows.

    Parameters
    ----------
    label_counts : array-like of int, shape (L,), N_l
    n_rows : int, N (at least 3, so that ln N > 1 and every w_l >= 1)
    A, B : floats, the dataset's constants (0.55 and 1.5 unless the dataset says otherwise;
        Wikipedia-LSHTC: 0.5, 0.4; Amazon: 0.6, 2.6).

    Returns
    -------
    ndarray of float64, shape (L,)
    """
    counts = np.asarray(label_counts, dtype=np.float64)
    if counts.ndim != 1 or (counts.size and counts.min() < 0):
        raise ValidationError("label_counts must be a 1-D array of non-negative counts")
    if n_rows < 3:
        raise ValidationError(f"inverse propensities need at least 3 training rows (ln N > 1), got {n_rows}")
    if counts.size and counts.max() > n_rows:
        raise ValidationError(f"a label count ({counts.max():.0f}) exceeds the number of rows ({n_rows})")
    if not (A > 0 and B > 0):
        raise ValidationError(f"A and B must be positive, got A={A}, B={B}")
    C = (np.log(n_rows) - 1.0) * (B + 1.0) ** A
    return 1.0 + C * (counts + B) ** (-A)


def inverse_propensity(Y_train, A: float = 0.55, B: float = 1.5) -> np.ndarray:
    """Jain et al. (2016) inverse propensity ``w_l = 1/p_l`` of every label, from training labels.

    Parameters
    ----------
    Y_train : sparse or dense 0/1, shape (N, L), the *training* labels.
    A, B : the dataset's constants (defaults 0.55, 1.5).

    Returns
    -------
    ndarray of float64, shape (L,), every entry >= 1. See :func:`inverse_propensity_from_counts`.
    """
    Y = check_labels(Y_train, "Y_train")
    counts = np.bincount(Y.indices, minlength=Y.shape[1])
    return inverse_propensity_from_counts(counts, Y.shape[0], A=A, B=B)


# ---- ranking metrics ------------------------------------------------------------------------------
def _precision(hits: np.ndarray, k: int, gains: np.ndarray | None = None) -> np.ndarray:
    """Per-row (1/k) sum of the gains of the ranked hits (gains default to 1)."""
    values = hits if gains is None else hits * gains
    return values.sum(axis=1) / k


def _dcg(hits: np.ndarray, gains: np.ndarray | None = None) -> np.ndarray:
    values = hits if gains is None else hits * gains
    return values @ _discounts(hits.shape[1])


def _safe_ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    out = np.zeros_like(numerator, dtype=np.float64)
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out


def _ratio_of_means(numerator: np.ndarray, best: np.ndarray) -> float:
    total_best = best.sum()
    return float(numerator.sum() / total_best) if total_best > 0 else 0.0


def precision_at_k(Y_true, scores, k: int) -> float:
    """Precision at k: mean over rows of (1/k) * (number of true labels among the k best ranked).

    Parameters
    ----------
    Y_true : sparse or dense 0/1, shape (n, L)
    scores : dense array (n, L), higher = more likely; or a top-k tuple ``(indices, values)`` of shape
        (n, k') with k' >= min(k, L), best first.
    k : int >= 1. The divisor is always k, also when k > L.

    Returns
    -------
    float in [0, 1]. A row without true labels counts as 0 (pyxclib's convention).
    """
    k = _check_k(k)
    Y = _check_y_true(Y_true)
    hits = _hits(Y, _ranked_indices(scores, k, Y.shape))
    return float(_precision(hits, k).mean())


def ndcg_at_k(Y_true, scores, k: int) -> float:
    """Normalised discounted cumulative gain at k with binary relevance.

    ``DCG_i = sum_{r<=k} y_{i,pi(r)} / log2(r+1)``, ``IDCG_i = sum_{r<=min(k,|y_i|)} 1/log2(r+1)``,
    nDCG@k = mean_i DCG_i / IDCG_i. A row without true labels has IDCG 0; its nDCG is defined as 0 and
    it counts in the mean (as in pyxclib). Arguments as for :func:`precision_at_k`.
    """
    k = _check_k(k)
    Y = _check_y_true(Y_true)
    hits = _hits(Y, _ranked_indices(scores, k, Y.shape))
    return float(_safe_ratio(_dcg(hits), _ideal_dcg(Y, k)).mean())


def _psp(Y, indices, hits, weights, k, normalize) -> float:
    numerator = _precision(hits, k, weights[indices])
    if not normalize:
        return float(numerator.mean())
    return _ratio_of_means(numerator, _best_weighted(Y, weights, k, discount=False) / k)


def _psndcg(Y, indices, hits, weights, k, normalize) -> float:
    ideal = _ideal_dcg(Y, k)
    numerator = _safe_ratio(_dcg(hits, weights[indices]), ideal)
    if not normalize:
        return float(numerator.mean())
    return _ratio_of_means(numerator, _safe_ratio(_best_weighted(Y, weights, k, discount=True), ideal))


def psprecision_at_k(
    Y_true, scores, k: int, propensities=None, normalize: bool = True, *, Y_train=None, A: float = 0.55, B: float = 1.5
) -> float:
    """Propensity-scored precision at k (Jain et al. 2016), normalised as pyxclib does.

    With w the inverse propensities and pi_i the predicted ranking of row i::

        num_i  = (1/k) sum_{r<=k} w_{pi_i(r)} y_{i,pi_i(r)}
        best_i = (1/k) sum_{r<=k} w_{s_i(r)}          (s_i: row i's true labels by decreasing w,
                                                       padded with weight 0 when |y_i| < k)
        PSP@k  = mean_i num_i / mean_i best_i          (normalize=True: a ratio of means, in [0, 1])
        PSP@k  = mean_i num_i                          (normalize=False)

    Rows without true labels add 0 to both means (normalised value unchanged, unnormalised value
    lowered). When no row has a true label the normalised value is 0.

    Parameters
    ----------
    Y_true, scores, k : as for :func:`precision_at_k`.
    propensities : array (L,), the inverse propensities ``w_l = 1/p_l >= 1`` (see
        :func:`inverse_propensity`). Give this or ``Y_train``.
    normalize : bool, divide by the best achievable value (default) or not.
    Y_train, A, B : training labels and constants to compute the inverse propensities from.
    """
    k = _check_k(k)
    Y = _check_y_true(Y_true)
    weights = _check_weights(propensities, Y_train, A, B, Y.shape[1])
    indices = _ranked_indices(scores, k, Y.shape)
    return _psp(Y, indices, _hits(Y, indices), weights, k, normalize)


def psndcg_at_k(
    Y_true, scores, k: int, propensities=None, normalize: bool = True, *, Y_train=None, A: float = 0.55, B: float = 1.5
) -> float:
    """Propensity-scored nDCG at k, normalised as pyxclib does.

    ``num_i = [sum_{r<=k} w_{pi_i(r)} y_{i,pi_i(r)} / log2(r+1)] / IDCG_i(k)`` with the *unweighted*
    ``IDCG_i(k) = sum_{r<=min(k,|y_i|)} 1/log2(r+1)``; ``best_i`` is the same with the row's true labels
    ordered by decreasing weight. normalize=True gives ``mean_i num_i / mean_i best_i``; False gives
    ``mean_i num_i``. Rows without true labels have num_i = best_i = 0. Arguments as for
    :func:`psprecision_at_k`.
    """
    k = _check_k(k)
    Y = _check_y_true(Y_true)
    weights = _check_weights(propensities, Y_train, A, B, Y.shape[1])
    indices = _ranked_indices(scores, k, Y.shape)
    return _psndcg(Y, indices, _hits(Y, indices), weights, k, normalize)


# ---- AUC ------------------------------------------------------------------------------------------
def _undefined(message: str) -> float:
    warnings.warn(message, UndefinedMetricWarning, stacklevel=3)
    return float("nan")


def _dense_scores_for_auc(scores, shape) -> np.ndarray:
    if isinstance(scores, tuple):
        raise ValidationError(
            "AUC needs the scores of every label (a dense (n, L) array), not a top-k result"
        )
    return _check_dense(scores, shape, "scores")


def auc_micro(Y_true, scores, label_mask=None) -> float:
    """ROC AUC over all (instance, label) pairs flattened (the BMLS paper's "global AUC").

    Equals ``sklearn.metrics.roc_auc_score(Y.ravel(), S.ravel())``: the Mann-Whitney statistic
    ``U / (P N)``, where U counts (positive, negative) pairs with the positive scored higher, ties
    counting one half. Computed from one sort of the scores and a binary search per positive; the
    label matrix is never densified.

    Parameters
    ----------
    Y_true : sparse or dense 0/1, shape (n, L)
    scores : dense array, shape (n, L) (scores or probabilities; only their order matters)
    label_mask : optional 0/1, shape (n, L), 1 = observed; unobserved pairs are left out.

    Returns
    -------
    float, or NaN (with an ``UndefinedMetricWarning``) when there is no positive or no negative pair.
    """
    Y = _check_y_true(Y_true)
    scores = _dense_scores_for_auc(scores, Y.shape)
    mask = _check_mask(label_mask, Y.shape)
    if mask is None:
        candidates = scores.ravel()
    else:
        candidates = scores[_entry_rows(mask), mask.indices]
    positives_matrix = _restrict(Y, mask)
    positive_scores = scores[_entry_rows(positives_matrix), positives_matrix.indices]
    n_pos = positive_scores.size
    n_neg = candidates.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return _undefined("auc_micro is undefined: every evaluated (instance, label) pair has the same class")
    ordered = np.sort(candidates)
    # 2U = sum over positives of (#below + #at or below) - P^2, in exact integers (see _auc_per_group)
    sums = np.searchsorted(ordered, positive_scores, side="left").sum(dtype=np.int64)
    sums += np.searchsorted(ordered, positive_scores, side="right").sum(dtype=np.int64)
    twice_u = int(sums) - n_pos * n_pos
    return float(twice_u / (2.0 * n_pos * n_neg))


def _group_counts(sorted_groups: np.ndarray, group: np.ndarray, values: np.ndarray):
    """For each query (group g, value v): how many entries of row g of ``sorted_groups`` (ascending)
    are < v and <= v. A binary search over all queries at once, ceil(log2(width + 1)) numpy steps."""
    width = sorted_groups.shape[1]
    results = []
    for strict in (True, False):
        lo = np.zeros(values.shape[0], dtype=np.int64)
        hi = np.full(values.shape[0], width, dtype=np.int64)
        for _ in range(int(np.ceil(np.log2(width + 1)))):
            active = lo < hi
            mid = (lo + hi) // 2
            probe = sorted_groups[group, np.minimum(mid, width - 1)]
            right = active & ((probe < values) if strict else (probe <= values))
            lo = np.where(right, mid + 1, lo)
            hi = np.where(active & ~right, mid, hi)
        results.append(lo)
    return results[0], results[1]


def _auc_per_group(sums: np.ndarray, n_pos: np.ndarray, n_observed: np.ndarray):
    """Mann-Whitney AUC of every group with both classes.

    ``sums[g]`` is the sum over the group's positives of (#scores below it + #scores at or below it,
    itself included), i.e. ``2U + P^2``: the positive-positive pairs add P^2 / 2 (each unordered pair 1,
    each self-pair 1/2). Returns (AUC of the usable groups, boolean mask of usable groups).
    """
    usable = (n_pos > 0) & (n_observed > n_pos)
    pos = n_pos[usable].astype(np.float64)
    return (sums[usable] - pos**2) / (2.0 * pos * (n_observed[usable] - pos)), usable


def _sortable_block(block: np.ndarray, observed: np.ndarray | None) -> np.ndarray:
    """A sorted-ready copy of ``block``; unobserved entries become +inf, above every finite score, so
    they never count as below or equal to an observed positive."""
    if observed is None:
        return np.array(block, order="C")
    out = np.array(block, dtype=block.dtype if block.dtype.kind == "f" else np.float64, order="C")
    out[~observed] = np.inf
    return out


def auc_macro(Y_true, scores, label_mask=None, return_count: bool = False):
    """Mean over labels of the per-label ROC AUC (``roc_auc_score(..., average="macro")``).

    A label whose (observed) column has only positives or only negatives has no AUC; it is skipped.
    Ties count one half. Columns are sorted in blocks; each positive is located by binary search.

    Parameters
    ----------
    Y_true, scores, label_mask : as for :func:`auc_micro`.
    return_count : bool, also return the number of labels averaged over.

    Returns
    -------
    float (NaN with an ``UndefinedMetricWarning`` when no label has both classes), or
    ``(value, n_labels_used)`` when ``return_count``.
    """
    Y = _check_y_true(Y_true)
    scores = _dense_scores_for_auc(scores, Y.shape)
    mask = _check_mask(label_mask, Y.shape)
    n, n_labels = Y.shape
    positives = _restrict(Y, mask).tocsc()
    mask_csc = None if mask is None else mask.tocsc()
    n_pos = np.diff(positives.indptr)
    n_observed = np.full(n_labels, n) if mask is None else np.diff(mask_csc.indptr)
    sums = np.zeros(n_labels)  # per label: sum over positives of (#below + #at or below)
    step = max(1, _BLOCK_ENTRIES // n)
    for start in range(0, n_labels, step):
        cols = slice(start, min(start + step, n_labels))
        observed = None if mask is None else mask_csc[:, cols].toarray().T > 0
        groups = _sortable_block(scores[:, cols].T, observed)  # (labels in block, n), one label per row
        groups.sort(axis=1)
        part = positives[:, cols]
        label_of_positive = np.repeat(np.arange(part.shape[1]), np.diff(part.indptr))
        below, at_or_below = _group_counts(groups, label_of_positive, scores[part.indices, label_of_positive + start])
        sums[cols] = np.bincount(label_of_positive, weights=below + at_or_below, minlength=part.shape[1])
    per_label, usable = _auc_per_group(sums, n_pos, n_observed)
    count = int(usable.sum())
    value = float(per_label.mean()) if count else _undefined("auc_macro is undefined: no label has both classes")
    return (value, count) if return_count else value


def auc_instance(Y_true, scores, label_mask=None, return_count: bool = False):
    """Mean over rows of the ROC AUC of ranking that row's labels (``roc_auc_score(..., average="samples")``).

    Rows whose (observed) labels are all positive or all negative have no AUC and are skipped (a row
    without true labels is skipped). Ties count one half. Rows are sorted in blocks.

    Returns
    -------
    float (NaN with an ``UndefinedMetricWarning`` when no row has both classes), or
    ``(value, n_rows_used)`` when ``return_count``.
    """
    Y = _check_y_true(Y_true)
    scores = _dense_scores_for_auc(scores, Y.shape)
    mask = _check_mask(label_mask, Y.shape)
    n, n_labels = Y.shape
    positives = _restrict(Y, mask)
    n_pos = np.diff(positives.indptr)
    n_observed = np.full(n, n_labels) if mask is None else np.diff(mask.indptr)
    sums = np.zeros(n)  # per row: sum over positives of (#below + #at or below)
    for rows in _row_blocks(n, n_labels):
        observed = None if mask is None else mask[rows].toarray() > 0
        groups = _sortable_block(scores[rows], observed)
        groups.sort(axis=1)
        part = positives[rows]
        row_of_positive = _entry_rows(part)
        below, at_or_below = _group_counts(groups, row_of_positive, scores[rows][row_of_positive, part.indices])
        sums[rows] = np.bincount(row_of_positive, weights=below + at_or_below, minlength=part.shape[0])
    per_row, usable = _auc_per_group(sums, n_pos, n_observed)
    count = int(usable.sum())
    value = float(per_row.mean()) if count else _undefined("auc_instance is undefined: no row has both classes")
    return (value, count) if return_count else value


# ---- set-based metrics (F1, exact match, Hamming) -------------------------------------------------
class _Counts(NamedTuple):
    true_positive: sp.csr_matrix
    Y_true: sp.csr_matrix
    Y_pred: sp.csr_matrix
    mask: sp.csr_matrix | None


def _label_sets(Y_true, Y_pred, label_mask) -> _Counts:
    Y = _check_y_true(Y_true)
    P = check_labels(Y_pred, "Y_pred")
    if P.shape != Y.shape:
        raise ValidationError(f"Y_pred has shape {P.shape} but Y_true has shape {Y.shape}")
    mask = _check_mask(label_mask, Y.shape)
    Y, P = _restrict(Y, mask), _restrict(P, mask)
    both = sp.csr_matrix(Y.multiply(P), dtype=np.float32)
    both.eliminate_zeros()
    return _Counts(both, Y, P, mask)


def _f_scores(tp, n_true, n_pred, zero_division):
    """F1 = 2 tp / (|y| + |y_hat|) elementwise; ``zero_division`` where both are empty."""
    denominator = (n_true + n_pred).astype(np.float64)
    out = np.full(denominator.shape, zero_division)
    np.divide(2.0 * tp, denominator, out=out, where=denominator > 0)
    return out


def _mean_f(values: np.ndarray, what: str) -> float:
    defined = values[~np.isnan(values)]
    if defined.size == 0:
        return _undefined(f"{what} is undefined: every term is 0/0 and zero_division is nan")
    return float(defined.mean())


def f1_example(Y_true, Y_pred, label_mask=None, zero_division=1.0) -> float:
    """Example-based F1: mean over rows of ``2 |y_i & yhat_i| / (|y_i| + |yhat_i|)``.

    A row with no true and no predicted label scores ``zero_division``: 1 by default (an empty
    prediction for an empty row is correct, Mulan's convention), or 0, or ``numpy.nan`` to leave such
    rows out of the mean. Equals ``sklearn.metrics.f1_score(Y, Yhat, average="samples",
    zero_division=zero_division)``.

    Parameters
    ----------
    Y_true, Y_pred : sparse or dense 0/1, shape (n, L)
    label_mask : optional 0/1, shape (n, L), 1 = observed; unobserved entries are ignored in both.
    """
    zero_division = _check_zero_division(zero_division)
    c = _label_sets(Y_true, Y_pred, label_mask)
    per_row = _f_scores(
        np.diff(c.true_positive.indptr), np.diff(c.Y_true.indptr), np.diff(c.Y_pred.indptr), zero_division
    )
    return _mean_f(per_row, "f1_example")


def f1_micro(Y_true, Y_pred, label_mask=None, zero_division=1.0) -> float:
    """Micro-averaged F1 over all (instance, label) entries: ``2 TP / (2 TP + FP + FN)``.

    ``zero_division`` (default 1) when there is no true and no predicted positive at all; equals
    ``f1_score(..., average="micro", zero_division=zero_division)``. This is the number BNMC's
    ``MultiLabelEvaluation.m`` reports as F1.
    """
    zero_division = _check_zero_division(zero_division)
    c = _label_sets(Y_true, Y_pred, label_mask)
    value = _f_scores(np.array(c.true_positive.nnz), np.array(c.Y_true.nnz), np.array(c.Y_pred.nnz), zero_division)
    return float(value) if not np.isnan(value) else _undefined("f1_micro is undefined: no true or predicted positive")


def f1_macro(Y_true, Y_pred, label_mask=None, zero_division=1.0) -> float:
    """Macro-averaged F1: mean over labels of ``2 TP_l / (2 TP_l + FP_l + FN_l)``.

    A label with no true and no predicted positive (in the evaluated rows) scores ``zero_division``:
    1 by default (Mulan's convention), 0 (scikit-learn's default, with its warning), or ``numpy.nan``
    to leave it out of the mean. Equals ``f1_score(..., average="macro", zero_division=...)``.
    """
    zero_division = _check_zero_division(zero_division)
    c = _label_sets(Y_true, Y_pred, label_mask)
    n_labels = c.Y_true.shape[1]
    per_label = _f_scores(
        np.bincount(c.true_positive.indices, minlength=n_labels),
        np.bincount(c.Y_true.indices, minlength=n_labels),
        np.bincount(c.Y_pred.indices, minlength=n_labels),
        zero_division,
    )
    return _mean_f(per_label, "f1_macro")


def exact_match(Y_true, Y_pred, label_mask=None) -> float:
    """Subset accuracy: the fraction of rows whose predicted label set equals the true one exactly.

    A row with no true label matches when nothing is predicted for it. With ``label_mask`` only the
    observed entries of a row are compared (a row with none observed matches trivially).
    """
    c = _label_sets(Y_true, Y_pred, label_mask)
    tp = np.diff(c.true_positive.indptr)
    mismatches = np.diff(c.Y_true.indptr) + np.diff(c.Y_pred.indptr) - 2 * tp
    return float(np.mean(mismatches == 0))


def hamming_loss(Y_true, Y_pred, label_mask=None) -> float:
    """Fraction of (observed) label entries where prediction and truth differ: ``|Y xor Yhat| / (n L)``.

    With ``label_mask`` the divisor is the number of observed entries.
    """
    c = _label_sets(Y_true, Y_pred, label_mask)
    n_entries = c.Y_true.shape[0] * c.Y_true.shape[1] if c.mask is None else c.mask.nnz
    return float((c.Y_true.nnz + c.Y_pred.nnz - 2 * c.true_positive.nnz) / n_entries)


# ---- calibration ----------------------------------------------------------------------------------
class ReliabilityCurve(NamedTuple):
    """Per-bin calibration summary (arrays of length n_bins; empty bins hold NaN and count 0)."""

    bin_centers: np.ndarray
    mean_predicted: np.ndarray
    observed_frequency: np.ndarray
    counts: np.ndarray


def _bin_of(probabilities: np.ndarray, n_bins: int) -> np.ndarray:
    """Equal-width bin of each probability: [b/n, (b+1)/n), the last bin closed at 1."""
    return np.minimum((np.asarray(probabilities, dtype=np.float64) * n_bins).astype(np.int64), n_bins - 1)


def _check_n_bins(n_bins) -> int:
    if not isinstance(n_bins, (int, np.integer)) or isinstance(n_bins, bool) or n_bins < 1:
        raise ValidationError(f"n_bins must be a positive integer, got {n_bins!r}")
    return int(n_bins)


def _bin_sums(Y_true, proba, n_bins, label_mask):
    """(count, sum of predicted probability, number of positives) per bin over all evaluated pairs."""
    n_bins = _check_n_bins(n_bins)
    Y = _check_y_true(Y_true)
    proba = _check_proba(proba, Y.shape)
    mask = _check_mask(label_mask, Y.shape)
    counts = np.zeros(n_bins, dtype=np.int64)
    predicted = np.zeros(n_bins)
    if mask is None:
        for rows in _row_blocks(*Y.shape):
            block = proba[rows].ravel()
            bins = _bin_of(block, n_bins)
            counts += np.bincount(bins, minlength=n_bins)
            predicted += np.bincount(bins, weights=block, minlength=n_bins)
    else:
        observed = proba[_entry_rows(mask), mask.indices]
        bins = _bin_of(observed, n_bins)
        counts += np.bincount(bins, minlength=n_bins)
        predicted += np.bincount(bins, weights=observed, minlength=n_bins)
    positives = _restrict(Y, mask)
    positives_bins = _bin_of(proba[_entry_rows(positives), positives.indices], n_bins)
    return counts, predicted, np.bincount(positives_bins, minlength=n_bins).astype(np.float64)


def _pair_bin_sums(probabilities: np.ndarray, relevant: np.ndarray, n_bins: int):
    """:func:`_bin_sums` for flattened (probability, is-relevant) pairs, 1-D arrays of equal length."""
    bins = _bin_of(probabilities, n_bins)
    counts = np.bincount(bins, minlength=n_bins).astype(np.int64)
    predicted = np.bincount(bins, weights=probabilities, minlength=n_bins)
    positives = np.bincount(bins, weights=relevant.astype(np.float64), minlength=n_bins)
    return counts, predicted, positives


def _curve(counts, predicted, positives, n_bins) -> "ReliabilityCurve":
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_predicted = np.where(counts > 0, predicted / counts, np.nan)
        observed = np.where(counts > 0, positives / counts, np.nan)
    centers = (np.arange(n_bins) + 0.5) / n_bins
    return ReliabilityCurve(centers, mean_predicted, observed, counts)


def reliability_curve(Y_true, proba, n_bins: int = 15, label_mask=None) -> ReliabilityCurve:
    """Reliability diagram data over all (instance, label) pairs, ``n_bins`` equal-width bins on [0, 1].

    Bin b holds the pairs with predicted probability in [b/n_bins, (b+1)/n_bins) (the last bin also
    holds 1). For each bin: its centre, the mean predicted probability, the observed frequency of the
    positive class, and the number of pairs.

    Parameters
    ----------
    Y_true : sparse or dense 0/1, shape (n, L)
    proba : dense array in [0, 1], shape (n, L), predicted probability that each label is on
    n_bins : int
    label_mask : optional 0/1, shape (n, L), 1 = observed; unobserved pairs are left out.
    """
    counts, predicted, positives = _bin_sums(Y_true, proba, n_bins, label_mask)
    return _curve(counts, predicted, positives, n_bins)


def expected_calibration_error(Y_true, proba, n_bins: int = 15, label_mask=None) -> float:
    """Expected calibration error, binary over *all* (instance, label) pairs (the all-pairs figure).

    With a few positives among many labels per row nearly every pair is a confident negative, so this
    figure is small for every reasonable model; :func:`ece_at_k` measures the predictions that matter.

    ``ECE = sum_b (n_b / N) |freq_b - conf_b|``, with equal-width bins as in :func:`reliability_curve`,
    ``conf_b`` the mean predicted probability of the *positive* class in bin b and ``freq_b`` the
    fraction of positives there (not the max-class confidence of multi-class ECE). N is the number of
    evaluated pairs (n L, or the observed ones under ``label_mask``).
    """
    counts, predicted, positives = _bin_sums(Y_true, proba, n_bins, label_mask)
    # n_b |freq_b - conf_b| = |positives_b - predicted_b|
    return float(np.abs(positives - predicted).sum() / counts.sum())


# ---- calibration of the top-k predictions --------------------------------------------------------
def _topk_pairs(Y_true, proba, k: int, label_mask, scores=None):
    """The top-``k`` (probability, is-relevant) pairs of every row.

    ``proba`` is a dense (n, L) array in [0, 1] or a top-k pair ``(indices, probabilities)`` of shape
    (n, k') with k' >= min(k, L), best first. The top k are ranked by ``scores`` when given (dense
    (n, L) or a top-k pair, with a dense ``proba`` to read the probabilities from), else by ``proba``;
    ties go to the lower label index, as in :func:`topk`. Pairs that ``label_mask`` marks unobserved are
    dropped (their relevance is unknown).

    Returns
    -------
    probabilities : float64 (n, k'') with k'' = min(k, L)
    relevant : bool (n, k'')
    observed : bool (n, k''), or None without a mask
    """
    k = _check_k(k)
    Y = _check_y_true(Y_true)
    mask = _check_mask(label_mask, Y.shape)
    if scores is not None:
        if isinstance(proba, tuple):
            raise ValidationError("with scores to rank by, proba must be the dense (n, L) probabilities")
        dense = _check_proba(proba, Y.shape)
        indices = _ranked_indices(scores, k, Y.shape)
        values = np.take_along_axis(dense, indices, axis=1).astype(np.float64)
    elif isinstance(proba, tuple):
        indices = _ranked_indices(proba, k, Y.shape)
        values = np.asarray(proba[1])[:, : indices.shape[1]].astype(np.float64)
        if values.size and (values.min() < 0 or values.max() > 1):
            raise ValidationError(
                f"top-k probabilities must lie in [0, 1]; found values in [{values.min()}, {values.max()}]"
            )
    else:
        dense = _check_proba(proba, Y.shape)
        indices, values = _topk(dense, k)
        values = values.astype(np.float64)
    return _pairs_at(Y, mask, indices, values, k)


def _pairs_at(Y: sp.csr_matrix, mask, indices: np.ndarray, values: np.ndarray, k: int):
    """(values, relevant, observed) of the ranked ``indices`` (n, k'), cut to the first min(k, L)."""
    needed = min(k, Y.shape[1])
    indices, values = indices[:, :needed], values[:, :needed]
    relevant = _hits(Y, indices)
    observed = None
    if mask is not None:
        if not mask.has_sorted_indices:
            mask = mask.copy()
            mask.sort_indices()
        observed = _hits(mask, indices)
        if not observed.any():
            raise ValidationError(f"label_mask marks none of the top-{k} predictions as observed: nothing to evaluate")
    return values, relevant, observed


def _flat_pairs(values, relevant, observed):
    if observed is None:
        return values.ravel(), relevant.ravel()
    return values[observed], relevant[observed]


def topk_reliability_curve(Y_true, proba, k: int, n_bins: int = 15, label_mask=None, scores=None) -> ReliabilityCurve:
    """Reliability diagram data over the flattened top-``k`` (probability, is-relevant) pairs.

    Each row contributes its ``k`` best labels (by ``scores`` when given, else by ``proba``; ties to the
    lower label index); the n k pairs are binned as in :func:`reliability_curve`. Pairs unobserved
    under ``label_mask`` are left out. ``proba``: dense (n, L) in [0, 1], or a top-k pair ``(indices,
    probabilities)``, best first.
    """
    n_bins = _check_n_bins(n_bins)
    p, y = _flat_pairs(*_topk_pairs(Y_true, proba, k, label_mask, scores))
    return _curve(*_pair_bin_sums(p, y, n_bins), n_bins)


def ece_at_k(Y_true, proba, k: int, n_bins: int = 15, label_mask=None, scores=None) -> float:
    """ECE@k: binary L1 calibration error of the flattened top-``k`` (probability, is-relevant) pairs.

    ``ECE@k = sum_b (n_b / N) |freq_b - conf_b|`` over ``n_bins`` equal-width bins of [0, 1] (bin b
    holds p in [b/n_bins, (b+1)/n_bins), the last bin also p = 1), where the N = n min(k, L) pairs are
    each row's ``k`` most probable labels with their predicted probability and whether the label is
    relevant; conf_b is the mean probability and freq_b the fraction relevant in bin b. This is the
    definition of Ullah, Schultheis, Zhang and Babbar, "How Well Calibrated are Extreme Multi-label
    Classifiers?" (arXiv 2411.04276), with 15 bins. The top k are the labels ranked first by
    ``scores`` when given (the ranking P@k evaluates), else by ``proba`` (ties to the lower label
    index); pairs unobserved under ``label_mask`` are dropped from N.

    Parameters
    ----------
    Y_true : sparse or dense 0/1, shape (n, L)
    proba : dense (n, L) in [0, 1], or a top-k pair ``(indices, probabilities)`` (n, k'), best first
    k : int >= 1 (clipped to L)
    n_bins : int, 15 as in the paper
    label_mask : optional 0/1, shape (n, L), 1 = observed
    scores : optional dense (n, L) or top-k pair: rank by these instead of ``proba`` (then ``proba``
        must be dense)

    Returns
    -------
    float in [0, 1]
    """
    n_bins = _check_n_bins(n_bins)
    return _ece_of_pairs(*_flat_pairs(*_topk_pairs(Y_true, proba, k, label_mask, scores)), n_bins)


def _ece_of_pairs(p: np.ndarray, y: np.ndarray, n_bins: int = 15) -> float:
    counts, predicted, positives = _pair_bin_sums(p, y, n_bins)
    # n_b |freq_b - conf_b| = |positives_b - predicted_b|
    return float(np.abs(positives - predicted).sum() / counts.sum())


def brier_at_k(Y_true, proba, k: int, label_mask=None, scores=None) -> float:
    """Brier score of the top-``k`` predictions: mean over the flattened top-k pairs of (p - y)^2.

    Pairs as in :func:`ece_at_k` (each row's ``k`` best labels; unobserved ones dropped). Unlike
    ECE@k it has no bins and rewards sharpness as well as calibration.
    """
    p, y = _flat_pairs(*_topk_pairs(Y_true, proba, k, label_mask, scores))
    return float(np.mean((p - y) ** 2))


class RiskCoverage(NamedTuple):
    """Selective prediction of the top-1 label: ``risk[m-1]`` is the error rate among the ``m`` most
    confident rows, kept at ``coverage[m-1] = m / n``; ``threshold[m-1]`` is the m-th highest top-1
    probability (arrays of length n, the number of rows evaluated)."""

    coverage: np.ndarray
    risk: np.ndarray
    threshold: np.ndarray


def risk_coverage_curve(Y_true, proba, label_mask=None, scores=None) -> RiskCoverage:
    """The risk-coverage curve of the top-1 label (Geifman and El-Yaniv 2017).

    The top-1 label of a row is its best by ``scores`` when given, else by ``proba``; its probability
    is the row's confidence. Rows are ordered by confidence, most confident first; the top-1 label of a row is
    an error when it is not a true label of the row (a row without true labels is always an error, so
    the risk at full coverage is ``1 - P@1`` when ranking by ``proba``). ``risk[m-1]`` is the error
    rate among the first m rows. Rows whose top-1 probabilities tie are interchangeable: the curve is
    the expectation over their orders, i.e. each row of a tie group counts the group's mean error.
    With ``label_mask``, rows whose top-1 pair is unobserved are left out.

    Parameters
    ----------
    Y_true : sparse or dense 0/1, shape (n, L)
    proba : dense (n, L) in [0, 1], or a top-k pair ``(indices, probabilities)``, best first

    Returns
    -------
    :class:`RiskCoverage` of arrays of length n (rows evaluated).
    """
    values, relevant, observed = _topk_pairs(Y_true, proba, 1, label_mask, scores)
    confidence, correct = values[:, 0], relevant[:, 0]
    if observed is not None:
        confidence, correct = confidence[observed[:, 0]], correct[observed[:, 0]]
    order = np.argsort(-confidence, kind="stable")
    confidence = confidence[order]
    errors = (~correct[order]).astype(np.float64)
    # tie groups: runs of equal confidence; every member gets the group's mean error
    starts = np.flatnonzero(np.r_[True, confidence[1:] != confidence[:-1]])
    group = np.cumsum(np.r_[True, confidence[1:] != confidence[:-1]]) - 1
    sizes = np.diff(np.r_[starts, confidence.size])
    errors = (np.add.reduceat(errors, starts) / sizes)[group]
    kept = np.arange(1, confidence.size + 1, dtype=np.float64)
    return RiskCoverage(kept / confidence.size, np.cumsum(errors) / kept, confidence)


def aurc(Y_true, proba, label_mask=None, scores=None) -> float:
    """Area under the top-1 risk-coverage curve: ``AURC = (1/n) sum_{m=1..n} risk(m/n)``.

    Lower is better; it mixes how often the top-1 label is wrong with how well confidence orders the
    errors. A predictor whose confidence carries no information (all rows tied) has AURC equal to its
    top-1 error rate; one whose confidence puts every error last reaches the minimum for that error
    rate. Arguments as for :func:`risk_coverage_curve`.
    """
    return float(np.mean(risk_coverage_curve(Y_true, proba, label_mask, scores).risk))


def _curve_json(curve: ReliabilityCurve) -> dict:
    return {key: [None if np.isnan(v) else float(v) for v in np.asarray(value, dtype=float)]
            for key, value in zip(("bin_centers", "mean_predicted", "observed", "counts"), curve)}


def calibration_curves(Y_true, proba, label_mask=None, ks=(1, 5), n_bins: int = 15, max_points: int = 200,
                       scores=None) -> dict:
    """The calibration plots' data as plain lists (JSON-ready), for a run's ``reliability.json``.

    Keys: ``bin_centers``, ``mean_predicted``, ``observed``, ``counts`` (all pairs, as
    :func:`reliability_curve`; NaN as None); ``"top{k}"`` for each k in ``ks``, the same four keys for
    :func:`topk_reliability_curve`; ``"risk_coverage"``: ``coverage`` and ``risk`` of
    :func:`risk_coverage_curve` at about ``max_points`` evenly spaced coverages (the last one 1).
    The top-k labels are ranked by ``scores`` when given, else by ``proba``.
    """
    out = _curve_json(reliability_curve(Y_true, proba, n_bins=n_bins, label_mask=label_mask))
    for k in ks:
        out[f"top{k}"] = _curve_json(topk_reliability_curve(Y_true, proba, k, n_bins, label_mask, scores))
    curve = risk_coverage_curve(Y_true, proba, label_mask, scores)
    n = curve.coverage.size
    keep = np.unique(np.linspace(0, n - 1, min(n, max_points)).round().astype(np.int64))
    out["risk_coverage"] = {"coverage": curve.coverage[keep].tolist(), "risk": curve.risk[keep].tolist()}
    return out


# ---- everything at once ---------------------------------------------------------------------------
def evaluate(
    Y_true,
    scores=None,
    proba=None,
    Y_pred=None,
    inv_propensity=None,
    ks=(1, 3, 5),
    label_mask=None,
) -> dict:
    """All metrics the given inputs allow, as a dict of Python floats (fractions, not percentages).

    Keys, in this order, when their inputs are given:

    * ``P@k``, ``nDCG@k`` for each k in ``ks``: need ``scores`` (dense or top-k tuple) or ``proba``
      (used for ranking when ``scores`` is None);
    * ``PSP@k``, ``PSnDCG@k`` (normalised): also need ``inv_propensity`` (array (L,), see
      :func:`inverse_propensity`);
    * ``AUC_micro``, ``AUC_macro``, ``AUC_instance``: need dense ``scores``, or ``proba`` when scores
      is None or a top-k tuple;
    * ``F1_example``, ``F1_micro``, ``F1_macro`` (zero_division=1), ``exact_match``,
      ``hamming_loss``: need ``Y_pred`` (sparse 0/1);
    * ``ECE`` (15 bins, all pairs), ``ECE@k`` and ``Brier@k`` for each k in ``ks`` (15 bins; the top-k
      labels of the ranking P@k uses, i.e. by ``scores`` when given, with their ``proba``), ``AURC``
      (top-1 risk-coverage area, same ranking): need ``proba``.

    ``label_mask`` (1 = observed) applies to AUC, F1, exact match, Hamming loss and the calibration
    figures; the ranking metrics rank all labels. An undefined AUC is NaN (with a warning).
    """
    Y = _check_y_true(Y_true)
    ks = tuple(_check_k(k, "every entry of ks") for k in ks)
    if not ks:
        raise ValidationError("ks must name at least one k")
    results: dict[str, float] = {}
    ranking = scores if scores is not None else proba
    indices = None
    if ranking is not None:
        indices = _ranked_indices(ranking, max(ks), Y.shape)
        hits = _hits(Y, indices)
        for k in ks:
            results[f"P@{k}"] = float(_precision(hits[:, :k], k).mean())
        for k in ks:
            results[f"nDCG@{k}"] = float(_safe_ratio(_dcg(hits[:, :k]), _ideal_dcg(Y, k)).mean())
        if inv_propensity is not None:
            weights = _check_weights(inv_propensity, None, None, None, Y.shape[1])
            for k in ks:
                results[f"PSP@{k}"] = _psp(Y, indices[:, :k], hits[:, :k], weights, k, True)
            for k in ks:
                results[f"PSnDCG@{k}"] = _psndcg(Y, indices[:, :k], hits[:, :k], weights, k, True)
    elif inv_propensity is not None:
        raise ValidationError("inv_propensity was given but neither scores nor proba to rank labels by")
    dense = scores if scores is not None and not isinstance(scores, tuple) else proba
    if dense is not None:
        results["AUC_micro"] = auc_micro(Y, dense, label_mask)
        results["AUC_macro"] = auc_macro(Y, dense, label_mask)
        results["AUC_instance"] = auc_instance(Y, dense, label_mask)
    if Y_pred is not None:
        results["F1_example"] = f1_example(Y, Y_pred, label_mask)
        results["F1_micro"] = f1_micro(Y, Y_pred, label_mask)
        results["F1_macro"] = f1_macro(Y, Y_pred, label_mask)
        results["exact_match"] = exact_match(Y, Y_pred, label_mask)
        results["hamming_loss"] = hamming_loss(Y, Y_pred, label_mask)
    if proba is not None:
        results["ECE"] = expected_calibration_error(Y, proba, label_mask=label_mask)
        mask = _check_mask(label_mask, Y.shape)
        dense = _check_proba(proba, Y.shape)
        values = np.take_along_axis(dense, indices, axis=1).astype(np.float64)  # the ranking of P@k
        for k in ks:
            results[f"ECE@{k}"] = _ece_of_pairs(*_flat_pairs(*_pairs_at(Y, mask, indices, values, k)))
        for k in ks:
            p, y = _flat_pairs(*_pairs_at(Y, mask, indices, values, k))
            results[f"Brier@{k}"] = float(np.mean((p - y) ** 2))
        results["AURC"] = aurc(Y, dense, label_mask=label_mask, scores=(indices[:, :1], values[:, :1]))
    return results
