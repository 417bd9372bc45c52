"""ROC AUC over (instance, label) pairs: micro (all pairs flattened), macro (per label) and instance
(per row), exact Mann-Whitney statistics with ties counting one half; dense scores only."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..exceptions import ValidationError
from ._checks import _check_dense, _check_mask, _check_y_true, _entry_rows, _restrict, _row_blocks, _undefined

__all__ = ["auc_micro", "auc_macro", "auc_instance"]


def _auc_inputs(Y_true, scores, label_mask):
    """The checked inputs of every AUC: ``Y_true`` as CSR, ``scores`` as a dense (n, L) array (a top-k
    result is refused: AUC ranks every label) and ``label_mask`` as CSR or None."""
    Y = _check_y_true(Y_true)
    if isinstance(scores, tuple):
        raise ValidationError("AUC needs the scores of every label (a dense (n, L) array), not a top-k result")
    return Y, _check_dense(scores, Y.shape, "scores"), _check_mask(label_mask, Y.shape)


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
    Y, scores, mask = _auc_inputs(Y_true, scores, label_mask)
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


def _mean_auc(sums, n_pos, n_observed, return_count: bool, metric: str, group: str):
    """The mean of :func:`_auc_per_group` over the usable groups (NaN with an ``UndefinedMetricWarning``
    when there is none), with their number when ``return_count``."""
    per_group, usable = _auc_per_group(sums, n_pos, n_observed)
    count = int(usable.sum())
    value = float(per_group.mean()) if count else _undefined(f"{metric} is undefined: no {group} has both classes")
    return (value, count) if return_count else value


def _sortable_block(block: np.ndarray, observed: np.ndarray | None) -> np.ndarray:
    """A sorted-ready copy of ``block``; unobserved entries become +inf, above every finite score, so
    they never count as below or equal to an observed positive."""
    if observed is None:
        return np.array(block, order="C")
    out = np.array(block, dtype=block.dtype if block.dtype.kind == "f" else np.float64, order="C")
    out[~observed] = np.inf
    return out


def _rank_sums_per_row(positives: sp.csr_matrix, scores: np.ndarray, mask: sp.csr_matrix | None):
    """Per row g of an (m, w) problem: the sum over its positives of (#observed scores of row g below
    it + #at or below it), the row's positives and its observed entries (the inputs of
    :func:`_auc_per_group`). ``positives`` (m, w) CSR holds the observed positives, ``scores`` (m, w)
    the scores, ``mask`` (m, w) CSR the observed entries (None: all). Rows are sorted in blocks and
    each positive located by binary search."""
    m, width = positives.shape
    n_pos = np.diff(positives.indptr)
    n_observed = np.full(m, width) if mask is None else np.diff(mask.indptr)
    sums = np.zeros(m)
    for rows in _row_blocks(m, width):
        observed = None if mask is None else mask[rows].toarray() > 0
        block = scores[rows]
        groups = _sortable_block(block, observed)
        groups.sort(axis=1)
        part = positives[rows]
        row_of_positive = _entry_rows(part)
        below, at_or_below = _group_counts(groups, row_of_positive, block[row_of_positive, part.indices])
        sums[rows] = np.bincount(row_of_positive, weights=below + at_or_below, minlength=part.shape[0])
    return sums, n_pos, n_observed


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
    Y, scores, mask = _auc_inputs(Y_true, scores, label_mask)
    # a label's AUC is the AUC of its row in the transposed problem
    sums, n_pos, n_observed = _rank_sums_per_row(
        sp.csr_matrix(_restrict(Y, mask).T), scores.T, None if mask is None else sp.csr_matrix(mask.T)
    )
    return _mean_auc(sums, n_pos, n_observed, return_count, "auc_macro", "label")


def auc_instance(Y_true, scores, label_mask=None, return_count: bool = False):
    """Mean over rows of the ROC AUC of ranking that row's labels (``roc_auc_score(..., average="samples")``).

    Rows whose (observed) labels are all positive or all negative have no AUC and are skipped (a row
    without true labels is skipped). Ties count one half. Rows are sorted in blocks.

    Returns
    -------
    float (NaN with an ``UndefinedMetricWarning`` when no row has both classes), or
    ``(value, n_rows_used)`` when ``return_count``.
    """
    Y, scores, mask = _auc_inputs(Y_true, scores, label_mask)
    sums, n_pos, n_observed = _rank_sums_per_row(_restrict(Y, mask), scores, mask)
    return _mean_auc(sums, n_pos, n_observed, return_count, "auc_instance", "row")
