"""Each row's top-K candidate labels with what the risks need to know about them, O(rows x K).

Every procedure of :mod:`bayesmlc.risk_control` sees a data set only through a :class:`Candidates`:
per row the K most probable labels (best first), their probabilities, whether each is a true
label, whether its truth is observed (``label_mask``), and how many true labels the row has in
all, inside or outside its top K. Nothing of size rows x labels is ever formed: the truth of a
(row, label) pair is looked up in the CSR label matrix by a sorted search of its entries.

**Label masks.** ``Y`` holds the observed positives (``bayesmlc`` zeroes unobserved entries of
``Y`` before fitting; :func:`candidates_from_topk` does the same). A candidate whose entry is
unobserved is neither a hit nor a false discovery: ``observed`` is False there. ``n_true`` counts
the observed positives of the row.

**Rows without labels** (no observed positive) keep ``n_true = 0``; each risk says what such a row
costs (:mod:`bayesmlc.risk_control.procedures`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from ..exceptions import ValidationError

__all__ = ["Candidates", "candidates_from_topk", "candidates_from_model", "pair_lookup"]


class Candidates(NamedTuple):
    """The top-K candidates of n rows (every array (n, K) is ordered best first in each row)."""

    #: (n, K) int64 label indices
    labels: np.ndarray
    #: (n, K) float64 probabilities, non-increasing along each row
    proba: np.ndarray
    #: (n, K) bool: the candidate is an observed positive of the row
    hit: np.ndarray
    #: (n, K) bool: the candidate's entry is observed (all True without a label mask)
    observed: np.ndarray
    #: (n,) int64: observed positives of the row, inside or outside its K candidates
    n_true: np.ndarray

    @property
    def n_rows(self) -> int:
        return int(self.proba.shape[0])

    def take(self, rows) -> "Candidates":
        """The candidates of a subset of the rows (an index array or a boolean mask)."""
        return Candidates(*(array[rows] for array in self))


def pair_lookup(matrix: sp.csr_matrix, rows: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """Whether each (row, column) pair is a stored non-zero entry of the CSR ``matrix``: a bool array
    of the pairs' shape, by a sorted search of the entries' keys ``row * n_columns + column``
    (O(nnz + pairs log nnz) time, no dense matrix)."""
    matrix = sp.csr_matrix(matrix)  # may share the caller's arrays: read them only
    n_columns = np.int64(matrix.shape[1])
    entry_rows = np.repeat(np.arange(matrix.shape[0], dtype=np.int64), np.diff(matrix.indptr))
    stored = matrix.data != 0  # explicit zeros are not entries
    keys = np.sort(entry_rows[stored] * n_columns + matrix.indices[stored].astype(np.int64))
    wanted = np.asarray(rows, dtype=np.int64) * n_columns + np.asarray(columns, dtype=np.int64)
    if keys.size == 0:
        return np.zeros(wanted.shape, dtype=bool)
    position = np.minimum(np.searchsorted(keys, wanted), keys.size - 1)
    return keys[position] == wanted


def candidates_from_topk(labels, proba, Y, label_mask=None) -> Candidates:
    """:class:`Candidates` from each row's top-K ``labels`` and their ``proba`` ((n, K), any order
    within a row: they are sorted best first, ties to the lower label index) and the 0/1 label matrix
    ``Y`` (n, L), dense or sparse; ``label_mask`` (n, L) marks the observed entries (None: all)."""
    labels = np.asarray(labels, dtype=np.int64)
    proba = np.asarray(proba, dtype=np.float64)
    if labels.ndim != 2 or labels.shape != proba.shape:
        raise ValidationError(f"labels and proba must be two (n, K) arrays of one shape, got {labels.shape} and "
                              f"{proba.shape}")
    Y = sp.csr_matrix(Y)
    if Y.shape[0] != labels.shape[0]:
        raise ValidationError(f"Y has {Y.shape[0]} rows but the candidates {labels.shape[0]}")
    if labels.size and (labels.min() < 0 or labels.max() >= Y.shape[1]):
        raise ValidationError(f"candidate labels must lie in [0, {Y.shape[1] - 1}] (the columns of Y)")
    if not np.all(np.isfinite(proba)) or (proba.size and (proba.min() < 0 or proba.max() > 1)):
        raise ValidationError("candidate probabilities must be finite numbers in [0, 1]")
    order = np.lexsort((labels, -proba), axis=1) if labels.size else np.zeros(labels.shape, dtype=np.int64)
    labels = np.take_along_axis(labels, order, axis=1)
    proba = np.take_along_axis(proba, order, axis=1)
    rows = np.repeat(np.arange(labels.shape[0], dtype=np.int64)[:, None], labels.shape[1], axis=1)
    if label_mask is None:
        observed = np.ones(labels.shape, dtype=bool)
        positives = Y
    else:
        mask = sp.csr_matrix(label_mask)
        if mask.shape != Y.shape:
            raise ValidationError(f"label_mask has shape {mask.shape}, Y {Y.shape}")
        observed = pair_lookup(mask, rows, labels)
        positives = Y.multiply(mask > 0).tocsr()  # unobserved entries are missing, not positive
    positives = sp.csr_matrix(positives > 0)
    hit = pair_lookup(positives, rows, labels) & observed
    n_true = np.diff(positives.indptr).astype(np.int64)
    return Candidates(labels, proba, hit, observed, n_true)


def candidates_from_model(model, X, Y, top_k: int, label_mask=None) -> Candidates:
    """The :class:`Candidates` of a fitted bayesmlc estimator on (X, Y): each row's ``top_k`` most
    probable labels by ``predict_proba`` (one batch of rows at a time, see
    :meth:`~bayesmlc.base.MultiLabelEstimator.predict_proba` with ``top_k``)."""
    labels, proba = top_candidates(model, X, top_k)
    return candidates_from_topk(labels, proba, Y, label_mask)


def top_candidates(model, X, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(labels, proba)`` (n, K): each row's ``top_k`` most probable labels, best first (ties to the
    lower label index), from ``model.predict_proba`` batch by batch; K = min(top_k, n_labels_)."""
    with model._computing_threads():
        labels, proba = model._top_probability_arrays(X, top_k)
    return labels, proba.astype(np.float64)
