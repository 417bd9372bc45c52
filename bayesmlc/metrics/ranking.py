"""Ranking metrics: top-k selection, P@k, nDCG@k and the propensity-scored PSP@k / PSnDCG@k with
Jain et al.'s inverse propensities. ``scores`` are dense (n, L) or a top-k pair ``(indices, values)``."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..exceptions import ValidationError
from ..validation import check_labels
from ._checks import _check_dense, _check_k, _check_y_true, _entry_rows, _kernel_array, _raise_if_non_finite
from ._kernels import entries_at_or_above, top_k_rows

__all__ = [
    "topk",
    "labels_at_or_above",
    "inverse_propensity",
    "inverse_propensity_from_counts",
    "precision_at_k",
    "ndcg_at_k",
    "psprecision_at_k",
    "psndcg_at_k",
]


# ---- top-k ----------------------------------------------------------------------------------------
def topk(scores, k: int):
    """The ``k`` highest scores of each row, best first.

    Ties are broken towards the lower label index, everywhere (also at the k-th place), so the result
    equals ``np.argsort(-scores, axis=1, kind="stable")[:, :k]`` and does not depend on the platform.
    One pass over the scores keeps a heap of each row's k best, so the cost is O(n L log k) at worst
    and about O(n L) when few scores enter the heap.

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
    return _topk(_check_dense(scores, scores.shape, "scores", check_finite=False), k)


def _topk(scores: np.ndarray, k: int):
    """:func:`topk` on an array of the right shape and type: one pass of
    :func:`~bayesmlc.metrics._kernels.top_k_rows`, which also checks that every score is finite."""
    n, n_labels = scores.shape
    k = min(k, n_labels)
    indices = np.empty((n, k), dtype=np.int64)
    values = np.empty((n, k), dtype=scores.dtype)
    if k == 0 or n == 0:
        return indices, values
    compiled = _kernel_array(scores)
    found = values if compiled.dtype == scores.dtype else np.empty((n, k), dtype=compiled.dtype)
    _raise_if_non_finite(top_k_rows(compiled, k, indices, found), n_labels, "scores")
    if found is not values:  # a converted copy was ranked: the values of the original
        values[:] = np.take_along_axis(scores, indices, axis=1)
    return indices, values


def labels_at_or_above(values: np.ndarray, bounds, fill_empty: bool = False) -> sp.csr_matrix:
    """Sparse 0/1 float32 (n, L) with a one where ``values[i, j] >= bounds[j]``, as NumPy compares
    them (a NaN is never selected); canonical CSR (each row's columns ascending), int32 indices where
    they fit. One compiled pass to count and one to fill, with no (n, L) temporary.

    Parameters
    ----------
    values : ndarray, shape (n, L), float32 or float64
    bounds : a number, compared in ``values``' precision as NumPy compares a Python number; or an
        ndarray of shape (L,), one per label column, compared in the wider of the two dtypes
    fill_empty : bool, give a row with no entry selected its ``np.argmax`` label instead
    """
    values = np.asarray(values)
    if np.ndim(bounds) == 0 and values.ndim == 2:
        bounds = np.full(values.shape[1], bounds, dtype=values.dtype if values.dtype.kind == "f" else np.float64)
    values, bounds = _kernel_array(values), _kernel_array(np.asarray(bounds))
    if values.ndim != 2 or bounds.shape != (values.shape[1],):
        raise ValidationError(f"labels_at_or_above takes values (n, L) and bounds (L,), got shapes {values.shape} "
                              f"and {bounds.shape}")
    indptr, indices = entries_at_or_above(values, bounds, bool(fill_empty))
    index_type = np.int32 if max(indptr[-1], values.shape[1]) < np.iinfo(np.int32).max else np.int64
    return sp.csr_matrix((np.ones(indices.size, dtype=np.float32), indices.astype(index_type, copy=False),
                          indptr.astype(index_type, copy=False)), shape=values.shape)


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
    return _topk(_check_dense(scores, shape, "scores", check_finite=False), needed)[0]


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


def _weight_order(Y: sp.csr_matrix, weights: np.ndarray) -> np.ndarray:
    """The stored entries of ``Y`` by row, then by decreasing weight: what :func:`_best_weighted` ranks."""
    return np.lexsort((-weights[Y.indices], _entry_rows(Y)))


def _best_weighted(Y: sp.csr_matrix, weights: np.ndarray, k: int, discount: bool, order=None) -> np.ndarray:
    """Per-row best achievable sum of the top-k weights of the row's true labels (optionally discounted).

    Each row's true labels are ordered by decreasing weight and the first k taken; a row with fewer than
    k true labels is padded with weight 0, i.e. contributes only what it has. ``order``: the
    :func:`_weight_order` of ``Y`` and ``weights``, when already computed.
    """
    rows = _entry_rows(Y)
    entry_weights = weights[Y.indices]
    order = _weight_order(Y, weights) if order is None else order
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


def _psp(Y, indices, hits, weights, k, normalize, order=None) -> float:
    """PSP@k of checked inputs; ``order`` as for :func:`_best_weighted`."""
    numerator = _precision(hits, k, weights[indices])
    if not normalize:
        return float(numerator.mean())
    return _ratio_of_means(numerator, _best_weighted(Y, weights, k, False, order) / k)


def _psndcg(Y, indices, hits, weights, k, normalize, order=None) -> float:
    """PSnDCG@k of checked inputs; ``order`` as for :func:`_best_weighted`."""
    ideal = _ideal_dcg(Y, k)
    numerator = _safe_ratio(_dcg(hits, weights[indices]), ideal)
    if not normalize:
        return float(numerator.mean())
    return _ratio_of_means(numerator, _safe_ratio(_best_weighted(Y, weights, k, True, order), ideal))


def _propensity_scored_inputs(Y_true, scores, k, propensities, Y_train, A, B) -> tuple:
    """The checked arguments of PSP@k and PSnDCG@k: ``(Y, indices, hits, weights, k)`` (labels as CSR,
    each row's top-k label indices and whether each is true, the inverse propensities, k)."""
    k = _check_k(k)
    Y = _check_y_true(Y_true)
    weights = _check_weights(propensities, Y_train, A, B, Y.shape[1])
    indices = _ranked_indices(scores, k, Y.shape)
    return Y, indices, _hits(Y, indices), weights, k


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
    return _psp(*_propensity_scored_inputs(Y_true, scores, k, propensities, Y_train, A, B), normalize)


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
    return _psndcg(*_propensity_scored_inputs(Y_true, scores, k, propensities, Y_train, A, B), normalize)
