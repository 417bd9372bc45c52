"""Input checks and row blocking shared by every metric family (``Y_true``, ``k``, dense scores and
probabilities, ``label_mask``, ``zero_division``)."""

from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse as sp
from sklearn.exceptions import UndefinedMetricWarning

from ..exceptions import ValidationError
from ..validation import check_label_mask, check_labels

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


def _check_dense(values, shape, name: str, check_finite: bool = True) -> np.ndarray:
    """A dense, finite, real 2-D array of exactly ``shape`` (no copy when already an ndarray).
    ``check_finite=False`` leaves the scan for NaN and inf to a compiled kernel that reads the array
    anyway (:func:`_raise_if_non_finite` then gives this error)."""
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
    if check_finite and array.dtype.kind == "f":
        for rows in _row_blocks(array.shape[0], array.shape[1]):
            finite = np.isfinite(array[rows])
            if not finite.all():
                bad_row, bad_col = np.argwhere(~finite)[0]
                _raise_if_non_finite((rows.start + bad_row) * array.shape[1] + bad_col, array.shape[1], name)
    return array


def _raise_if_non_finite(position: int, n_cols: int, name: str) -> None:
    """The error for a NaN or inf at flat position ``position`` of a (rows, ``n_cols``) array ``name``
    (row-major; -1: none, nothing is raised)."""
    if position >= 0:
        raise ValidationError(f"{name} contains NaN or inf (first at row {position // n_cols}, "
                              f"column {position % n_cols})")


def _kernel_array(array: np.ndarray) -> np.ndarray:
    """``array`` in a type the compiled kernels (:mod:`._kernels`) take: float32 and float64 as they
    are, float16 as float32, integers and booleans as float64 (exact up to 2^53 in magnitude)."""
    if array.dtype in (np.float32, np.float64):
        return array
    return array.astype(np.float32 if array.dtype == np.float16 else np.float64)


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


def _block_rows(n_cols: int) -> int:
    """Rows in a block of about ``_BLOCK_ENTRIES`` entries (at least one)."""
    return max(1, _BLOCK_ENTRIES // max(1, n_cols))


def _row_blocks(n_rows: int, n_cols: int):
    step = _block_rows(n_cols)
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

def _undefined(message: str) -> float:
    warnings.warn(message, UndefinedMetricWarning, stacklevel=3)
    return float("nan")
