"""Input validation shared by every estimator.

Each check raises :class:`~bayesmlc.exceptions.ValidationError` with a message that names the argument
at fault and what is wrong with it.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .exceptions import ValidationError

__all__ = ["check_features", "check_labels", "check_label_mask", "check_fit_inputs"]


def _to_csr(value, name: str, dtype=np.float32) -> sp.csr_matrix:
    if sp.issparse(value):
        matrix = sp.csr_matrix(value)
    else:
        try:
            array = np.asarray(value)
        except Exception as exc:  # ragged lists and the like
            raise ValidationError(f"{name} cannot be read as a 2-D array: {exc}") from None
        if array.ndim != 2:
            raise ValidationError(f"{name} must be 2-D (n_samples, n_columns), got shape {array.shape}")
        if array.dtype.kind not in "biuf":
            raise ValidationError(f"{name} must be numeric, got dtype {array.dtype}")
        matrix = sp.csr_matrix(array)
    if matrix.dtype.kind not in "biuf":
        raise ValidationError(f"{name} must be numeric, got dtype {matrix.dtype}")
    matrix = matrix.astype(dtype, copy=False)
    matrix.sum_duplicates()
    matrix.sort_indices()
    return matrix


def check_features(X, n_features: int | None = None, name: str = "X") -> sp.csr_matrix:
    """Features as float32 CSR; no NaN or inf; at most ``n_features`` columns (padded up to it)."""
    matrix = _to_csr(X, name)
    if matrix.nnz and not np.all(np.isfinite(matrix.data)):
        bad = np.flatnonzero(~np.isfinite(matrix.data))[0]
        row = int(np.searchsorted(matrix.indptr, bad, side="right") - 1)
        raise ValidationError(
            f"{name} contains NaN or inf (first at row {row}, column {int(matrix.indices[bad])})"
        )
    if n_features is not None:
        if matrix.shape[1] > n_features:
            raise ValidationError(
                f"{name} has {matrix.shape[1]} features but the model was fitted with {n_features}"
            )
        if matrix.shape[1] < n_features:  # sparse files infer width from the largest index seen
            matrix = sp.csr_matrix((matrix.data, matrix.indices, matrix.indptr), shape=(matrix.shape[0], n_features))
    return matrix


def check_labels(Y, name: str = "Y") -> sp.csr_matrix:
    """Labels as float32 CSR with stored values exactly 1."""
    matrix = _to_csr(Y, name)
    matrix.eliminate_zeros()
    if matrix.nnz and not np.all(matrix.data == 1):
        bad = np.unique(matrix.data[matrix.data != 1])[:5]
        raise ValidationError(f"{name} must contain only 0 and 1; found {bad.tolist()}")
    return matrix


def check_label_mask(label_mask, shape, name: str = "label_mask") -> sp.csr_matrix | None:
    """Mask of observed label entries (1 = observed) as float32 CSR, or None when all are observed."""
    if label_mask is None:
        return None
    matrix = _to_csr(label_mask, name)
    if matrix.shape != tuple(shape):
        raise ValidationError(f"{name} has shape {matrix.shape} but Y has shape {tuple(shape)}")
    matrix.eliminate_zeros()
    if matrix.nnz and not np.all(matrix.data == 1):
        raise ValidationError(f"{name} must be boolean or 0/1 (1 = observed)")
    return matrix


def check_fit_inputs(X, Y, label_mask=None):
    """Validate ``fit``'s arguments together; returns (X, Y, label_mask) in canonical form."""
    X = check_features(X)
    Y = check_labels(Y)
    if X.shape[0] != Y.shape[0]:
        raise ValidationError(f"X has {X.shape[0]} rows but Y has {Y.shape[0]}: one label row per instance")
    if X.shape[0] == 0:
        raise ValidationError("X and Y have no rows")
    mask = check_label_mask(label_mask, Y.shape)
    if mask is not None:
        # An unobserved entry carries no information whatever Y holds there: drop it, so that flipping
        # a masked value can never change a fit.
        Y = sp.csr_matrix(Y.multiply(mask), dtype=np.float32)
        Y.eliminate_zeros()
    return X, Y, mask
