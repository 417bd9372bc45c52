"""BNMC's label bookkeeping: which label entries are observed and which rows carry a label vector
(:class:`ObservedEntries`), the label-count distribution of eq. 9 (its sums over rows, which add up over
batches and processes), and the label columns of a later ``partial_fit`` batch."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..exceptions import ValidationError
from ..validation import check_labels

__all__ = ["ObservedEntries", "label_count_moments", "label_count_sums", "observed_entries", "pad_columns",
           "stream_labels"]


class ObservedEntries:
    """Which label entries are observed, kept sparse: the stored entries of a CSR ``label_mask``, or,
    without one, every entry of the ``labelled`` rows. :meth:`block` densifies only the rows and
    labels asked for.
    """

    def __init__(self, label_mask, labelled: np.ndarray, n_labels: int):
        self.label_mask = None if label_mask is None else sp.csr_matrix(label_mask)
        self.labelled = np.asarray(labelled, dtype=bool)
        self.n_labels = int(n_labels)

    def block(self, rows=None, labels=None) -> np.ndarray:
        """Dense float64 0/1 array (len(rows), len(labels)) of the observed entries; ``labels`` a slice or
        an array of label indices (None: all)."""
        labels = slice(0, self.n_labels) if labels is None else labels
        if self.label_mask is not None:
            part = self.label_mask if rows is None else self.label_mask[rows]
            return part[:, labels].toarray().astype(np.float64)
        flags = self.labelled if rows is None else self.labelled[rows]
        width = np.arange(self.n_labels)[labels].size
        return np.repeat(flags[:, None].astype(np.float64), width, axis=1)

    def per_label(self, rows=None) -> np.ndarray:
        """Observed entries per label among ``rows`` (None: all rows), (L,) int64."""
        if self.label_mask is not None:
            part = self.label_mask if rows is None else self.label_mask[rows]
            return np.asarray(part.sum(axis=0)).ravel().astype(np.int64)
        flags = self.labelled if rows is None else self.labelled[rows]
        return np.full(self.n_labels, int(flags.sum()), dtype=np.int64)

    def complete_rows(self) -> np.ndarray:
        """Rows whose every label entry is observed, (n,) bool."""
        if self.label_mask is not None:
            return np.asarray(self.label_mask.sum(axis=1)).ravel() == self.n_labels
        return self.labelled


def observed_entries(Y: sp.csr_matrix, label_mask, empty_rows_missing: bool) -> tuple[ObservedEntries, np.ndarray]:
    """The observed entries of the labels ``Y`` (kept sparse) and the boolean vector of rows with a label
    vector: the rows with an observed entry of ``label_mask``; without one, every row, or with
    ``empty_rows_missing`` (``unlabeled_rows="missing"``, section 3.4) the rows with a positive label."""
    n, L = Y.shape
    if label_mask is not None:
        labelled = np.asarray(label_mask.sum(axis=1)).ravel() > 0
    else:
        labelled = np.ones(n, dtype=bool)
        if empty_rows_missing:
            labelled = np.diff(Y.indptr) > 0
    return ObservedEntries(label_mask, labelled, L), labelled


def label_count_sums(Y: sp.csr_matrix, entries: ObservedEntries, labelled: np.ndarray) -> np.ndarray:
    """(rows, sum of their label counts, sum of the squared counts) over the ``labelled`` rows of ``Y``
    whose every entry is observed, float64 (3,): the sums of :func:`label_count_moments`."""
    complete = labelled & entries.complete_rows()
    counts = np.diff(Y.indptr)[complete].astype(np.float64)
    return np.array([counts.size, counts.sum(), (counts**2).sum()])


def label_count_moments(count_sums: np.ndarray) -> tuple[float, float]:
    """The mean and the (n - 1) standard deviation of the label counts whose :func:`label_count_sums`
    (added up) are ``count_sums`` (at least one row)."""
    n, total, total_sq = count_sums
    return float(total / n), float(np.sqrt(max(total_sq / n - (total / n) ** 2, 0.0) * n / max(n - 1, 1)))


def stream_labels(Y, n_rows: int, n_labels: int) -> sp.csr_matrix:
    """The labels of a later ``partial_fit`` batch of ``n_rows`` rows as CSR with the model's
    ``n_labels`` columns: fewer columns are padded with zeros; a positive beyond them is an error
    (labels cannot be added to a stream)."""
    Y = check_labels(Y, name="Y")
    if Y.shape[0] != n_rows:
        raise ValidationError(f"Y has {Y.shape[0]} rows but X has {n_rows}")
    if Y.shape[1] > n_labels:
        beyond = Y.indices[Y.indices >= n_labels]
        if beyond.size:
            raise ValidationError(
                f"Y uses label index {int(beyond.max())} but the model was initialised with "
                f"{n_labels} labels (0..{n_labels - 1}); new labels cannot be added online"
            )
    return sp.csr_matrix((Y.data, Y.indices, Y.indptr), shape=(n_rows, n_labels))


def pad_columns(matrix, n_cols: int, name: str) -> sp.csr_matrix:
    """``matrix`` as CSR with ``n_cols`` columns (zeros added); more columns than that are an error
    naming ``name``."""
    matrix = sp.csr_matrix(matrix)
    if matrix.shape[1] > n_cols:
        raise ValidationError(f"{name} has {matrix.shape[1]} columns but the model has {n_cols} labels")
    return sp.csr_matrix((matrix.data, matrix.indices, matrix.indptr), shape=(matrix.shape[0], n_cols))
