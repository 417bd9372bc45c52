"""Set-based metrics of predicted label sets ``Y_pred``: example, micro and macro F1, exact match and
Hamming loss."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from ..exceptions import ValidationError
from ..validation import check_labels
from ._checks import _check_mask, _check_y_true, _check_zero_division, _restrict, _undefined

__all__ = ["f1_example", "f1_micro", "f1_macro", "exact_match", "hamming_loss"]


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
