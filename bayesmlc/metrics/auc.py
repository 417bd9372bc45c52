"""ROC AUC over (instance, label) pairs: micro (all pairs flattened), macro (per label) and instance
(per row), exact Mann-Whitney statistics with ties counting one half; dense scores only.

Each AUC is computed from its groups' rank sums (:func:`_rank_sums`), in exact integers: the micro
AUC's from a sort of a copy of the scores, the macro and instance AUCs' by compiled kernels that
compare each positive score with the scores of its label or row.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from ..exceptions import ValidationError
from ..threads import enclosing_threads
from ._checks import _check_dense, _check_mask, _check_y_true, _entry_rows, _kernel_array, _restrict, _undefined
from ._kernels import label_rank_sums, row_rank_sums

__all__ = ["auc_micro", "auc_macro", "auc_instance"]


def _auc_inputs(Y_true, scores, label_mask):
    """The checked inputs of every AUC: ``Y_true`` as CSR, ``scores`` as a dense (n, L) array (a top-k
    result is refused: AUC ranks every label) and ``label_mask`` as CSR or None."""
    Y = _check_y_true(Y_true)
    if isinstance(scores, tuple):
        raise ValidationError("AUC needs the scores of every label (a dense (n, L) array), not a top-k result")
    return Y, _check_dense(scores, Y.shape, "scores"), _check_mask(label_mask, Y.shape)


class RankSums(NamedTuple):
    """For each kind of group, (rank sums, positives, observed entries): per group, the sum over its
    positives of (#scores below + #scores at or below, itself included), its number of positives and
    of observed entries. ``micro``: the one group of all pairs, as Python ints; ``macro``: arrays
    over labels and ``instance`` over rows, the inputs of :func:`_auc_per_group`. A kind not asked
    for is None."""

    micro: tuple | None
    macro: tuple | None
    instance: tuple | None


def _grouped(values: np.ndarray, group: np.ndarray, n_groups: int):
    """``values`` ordered by ``group`` and the (n_groups + 1,) int64 offsets of each group's run."""
    sizes = np.bincount(group, minlength=n_groups)
    return values[np.argsort(group, kind="stable")], np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)


def _micro_rank_sum(observed: np.ndarray, positive_values: np.ndarray, pool=None) -> int:
    """The micro group's rank sum from a copy of every observed score (sorted here, in place, in two
    halves on ``pool``'s threads when given): each positive located in each sorted part by binary
    search, the counts below it summed over the parts."""
    needles = np.sort(positive_values)  # ascending needles: each search starts where the last ended

    def below_and_at(part: np.ndarray) -> int:
        part.sort()
        return int(np.searchsorted(part, needles, side="left").sum(dtype=np.int64)
                   + np.searchsorted(part, needles, side="right").sum(dtype=np.int64))

    if pool is None:
        return below_and_at(observed)
    first, second = np.array_split(observed, 2)
    second_part = pool.submit(below_and_at, second)
    return below_and_at(first) + second_part.result()


#: the macro AUC's tiles of scores: at most this many rows, and about _TILE_ENTRIES entries
_TILE_ROWS, _TILE_ENTRIES = 1 << 14, 1 << 16


def _rank_sums(Y: sp.csr_matrix, scores: np.ndarray, mask: sp.csr_matrix | None, micro=True, macro=True,
               instance=True) -> RankSums:
    """The :class:`RankSums` of the checked ``Y`` (CSR), finite ``scores`` (n, L) and ``mask`` (CSR or
    None), in exact int64 counts: the macro ones by :func:`_macro_sums`, the instance ones by the
    compiled :func:`~bayesmlc.metrics._kernels.row_rank_sums`, which also copies the observed scores
    for the micro one's sort (:func:`_micro_rank_sum`). On large inputs the macro sums and half of
    the sort run on helper threads (:func:`_helper_threads`)."""
    n, n_labels = Y.shape
    scores = _kernel_array(scores)
    positives = _restrict(Y, mask)
    positive_rows = _entry_rows(positives)
    values = scores[positive_rows, positives.indices]
    if mask is None:
        observed_ptr, observed_columns = np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64)
        label_observed, row_observed = np.full(n_labels, n), np.full(n, n_labels)
    else:
        if not mask.has_sorted_indices:  # label_rank_sums walks each row's columns in order
            mask = mask.sorted_indices()
        observed_ptr, observed_columns = mask.indptr.astype(np.int64), mask.indices.astype(np.int64)
        label_observed, row_observed = np.bincount(mask.indices, minlength=n_labels), np.diff(mask.indptr)
    with _helper_threads(scores.size) as pool:
        macro_inputs = (scores, observed_ptr, observed_columns, mask, positives, values, label_observed)
        macro_sums = pool.submit(_macro_sums, *macro_inputs) if macro and pool else None
        sums = RankSums(None, None, None)
        if micro or instance:  # one pass over the rows: the instance sums, and the copy the micro AUC sorts
            row_sums = np.zeros(n, dtype=np.int64)
            observed = np.empty(int(row_observed.sum() if micro else row_observed.max()), dtype=scores.dtype)
            row_ptr = positives.indptr.astype(np.int64) if instance else np.zeros(n + 1, dtype=np.int64)
            row_rank_sums(scores, observed_ptr, observed_columns, mask is not None, row_ptr, values, row_sums,
                          observed, micro)
            if instance:  # CSR order: each row's positives in one run
                sums = sums._replace(instance=(row_sums.astype(np.float64), np.diff(positives.indptr), row_observed))
            if micro:
                sums = sums._replace(micro=(_micro_rank_sum(observed, values, pool), positives.nnz, observed.size))
        if macro:  # on the helper thread when there is one, else here
            sums = sums._replace(macro=macro_sums.result() if macro_sums else _macro_sums(*macro_inputs))
    return sums


def _macro_sums(scores, observed_ptr, observed_columns, mask, positives, values, label_observed) -> tuple:
    """:class:`RankSums`'s ``macro`` entry, by the compiled
    :func:`~bayesmlc.metrics._kernels.label_rank_sums` (a tile of scores at a time)."""
    n, n_labels = scores.shape
    label_values, label_ptr = _grouped(values, positives.indices, n_labels)
    label_sums = np.zeros(n_labels, dtype=np.int64)
    tile_rows = min(n, _TILE_ROWS)
    label_rank_sums(scores, observed_ptr, observed_columns, mask is not None, label_ptr, label_values, tile_rows,
                    max(1, min(n_labels, _TILE_ENTRIES // tile_rows)), label_sums)
    return label_sums.astype(np.float64), np.diff(label_ptr), label_observed


#: scores from which :func:`_rank_sums` shares its work with a second thread (when the enclosing
#: :func:`bayesmlc.threads.use_threads` block allows two or more)
PARALLEL_MIN_SCORES = 1 << 20


@contextlib.contextmanager
def _helper_threads(n_scores: int):
    """A pool of two threads for :func:`_rank_sums`'s parts (the compiled kernels and NumPy's sort
    release the GIL) when there are at least :data:`PARALLEL_MIN_SCORES` scores and the enclosing
    thread count is two or more; else None (everything on the calling thread). The sums are exact
    integers, so the result does not depend on the split."""
    if n_scores < PARALLEL_MIN_SCORES or (enclosing_threads() or 1) < 2:
        yield None
        return
    with ThreadPoolExecutor(2, thread_name_prefix="bayesmlc-auc") as pool:
        yield pool


def auc_micro(Y_true, scores, label_mask=None) -> float:
    """ROC AUC over all (instance, label) pairs flattened (the BMLS paper's "global AUC").

    Equals ``sklearn.metrics.roc_auc_score(Y.ravel(), S.ravel())``: the Mann-Whitney statistic
    ``U / (P N)``, where U counts (positive, negative) pairs with the positive scored higher, ties
    counting one half, in exact integers (:func:`_rank_sums`); the label matrix is never densified.

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
    return _micro_value(_rank_sums(Y, scores, mask, macro=False, instance=False).micro)


def _micro_value(micro) -> float:
    """:func:`auc_micro` from the micro group's rank sum: ``2U = sums - P^2`` in exact integers (see
    :func:`_auc_per_group`)."""
    sums, n_pos, n_observed = micro
    n_neg = n_observed - n_pos
    if n_pos == 0 or n_neg == 0:
        return _undefined("auc_micro is undefined: every evaluated (instance, label) pair has the same class")
    return float((sums - n_pos * n_pos) / (2.0 * n_pos * n_neg))


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


def auc_macro(Y_true, scores, label_mask=None, return_count: bool = False):
    """Mean over labels of the per-label ROC AUC (``roc_auc_score(..., average="macro")``).

    A label whose (observed) column has only positives or only negatives has no AUC; it is skipped.
    Ties count one half.

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
    return _mean_auc(*_rank_sums(Y, scores, mask, micro=False, instance=False).macro, return_count, "auc_macro",
                     "label")


def auc_instance(Y_true, scores, label_mask=None, return_count: bool = False):
    """Mean over rows of the ROC AUC of ranking that row's labels (``roc_auc_score(..., average="samples")``).

    Rows whose (observed) labels are all positive or all negative have no AUC and are skipped (a row
    without true labels is skipped). Ties count one half.

    Returns
    -------
    float (NaN with an ``UndefinedMetricWarning`` when no row has both classes), or
    ``(value, n_rows_used)`` when ``return_count``.
    """
    Y, scores, mask = _auc_inputs(Y_true, scores, label_mask)
    return _mean_auc(*_rank_sums(Y, scores, mask, micro=False, macro=False).instance, return_count,
                     "auc_instance", "row")


def _all_aucs(Y: sp.csr_matrix, scores: np.ndarray, mask: sp.csr_matrix | None) -> dict:
    """``AUC_micro``, ``AUC_macro`` and ``AUC_instance`` of checked inputs (``Y`` CSR, finite dense
    ``scores``, ``mask`` CSR or None), the AUCs of :class:`~bayesmlc.metrics.StreamingEvaluation`:
    equal to the three functions' values, without checking the scores again."""
    sums = _rank_sums(Y, scores, mask)
    return {"AUC_micro": _micro_value(sums.micro),
            "AUC_macro": _mean_auc(*sums.macro, False, "auc_macro", "label"),
            "AUC_instance": _mean_auc(*sums.instance, False, "auc_instance", "row")}
