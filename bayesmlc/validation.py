"""Input validation shared by every estimator.

Each check raises :class:`~bayesmlc.exceptions.ValidationError` with a message that names the argument
at fault and what is wrong with it.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse as sp

from .exceptions import ValidationError

__all__ = ["check_features", "check_labels", "check_label_mask", "check_fit_inputs", "feature_names",
           "check_feature_names"]


def _numeric_array(value, name: str) -> np.ndarray:
    """``value`` (list, ndarray, DataFrame, ...) as a numeric ndarray; object arrays of numbers are
    converted, anything else is refused with a message naming ``name``."""
    try:
        array = np.asarray(value)
    except Exception as exc:  # ragged lists and the like
        raise ValidationError(f"{name} cannot be read as a 2-D array: {exc}") from None
    if array.dtype.kind == "c":
        raise ValidationError(f"Complex data not supported: {name} has dtype {array.dtype}")
    if array.dtype.kind == "O":
        try:
            array = array.astype(np.float64)
        except (TypeError, ValueError) as exc:  # a dict, a string, ... among the entries
            raise type(exc)(f"{name} must be numeric: {exc}") from None
    if array.dtype.kind not in "biuf":
        raise ValidationError(f"{name} must be numeric, got dtype {array.dtype}")
    return array


def _to_csr(value, name: str, dtype=np.float32) -> sp.csr_matrix:
    if sp.issparse(value):
        matrix = sp.csr_matrix(value)
        if matrix.dtype.kind == "c":
            raise ValidationError(f"Complex data not supported: {name} has dtype {matrix.dtype}")
    else:
        array = _numeric_array(value, name)
        if array.ndim != 2:
            raise ValidationError(
                f"{name} must be 2-D (n_samples, n_columns), got shape {array.shape}. Reshape your data either "
                "using array.reshape(-1, 1) if it has a single column or array.reshape(1, -1) if it contains "
                "a single sample"
            )
        matrix = sp.csr_matrix(array)
    if matrix.dtype.kind not in "biuf":
        raise ValidationError(f"{name} must be numeric, got dtype {matrix.dtype}")
    matrix = matrix.astype(dtype, copy=False)
    matrix.sum_duplicates()
    matrix.sort_indices()
    return matrix


def check_features(X, n_features: int | None = None, name: str = "X", estimator_name: str | None = None) -> sp.csr_matrix:
    """Features as float32 CSR; no NaN or inf.

    With ``n_features`` (a fitted model's width), wider input is refused, and so is narrower dense
    input; narrower *sparse* input is padded with empty columns, since a sparse file's width is inferred
    from the largest feature index it holds. ``estimator_name`` names the model in that message.
    """
    matrix = _to_csr(X, name)
    if matrix.nnz and not np.all(np.isfinite(matrix.data)):
        bad = np.flatnonzero(~np.isfinite(matrix.data))[0]
        row = int(np.searchsorted(matrix.indptr, bad, side="right") - 1)
        raise ValidationError(
            f"{name} contains NaN or inf (first at row {row}, column {int(matrix.indices[bad])})"
        )
    if n_features is not None and matrix.shape[1] != n_features:
        if matrix.shape[1] > n_features or not sp.issparse(X):
            raise ValidationError(
                f"{name} has {matrix.shape[1]} features, but {estimator_name or 'the model'} is expecting "
                f"{n_features} features as input (the number it was fitted with)"
            )
        matrix = sp.csr_matrix((matrix.data, matrix.indices, matrix.indptr), shape=(matrix.shape[0], n_features))
    return matrix


def check_labels(Y, name: str = "Y") -> sp.csr_matrix:
    """Labels as float32 CSR with stored values exactly 1: a multi-label indicator matrix (n, L)."""
    if not sp.issparse(Y):
        Y = _numeric_array(Y, name)
    if not sp.issparse(Y) and Y.ndim == 1:
        from sklearn.utils.multiclass import type_of_target

        try:
            target_type = type_of_target(Y, input_name=name)
        except ValueError:
            target_type = "unknown"
        raise ValidationError(
            f"{name} must be a 2-D 0/1 indicator matrix (n_samples, n_labels); got a 1-D target of type "
            f"{target_type!r}. Only binary classification is supported per label column: for one binary "
            f"label pass {name}.reshape(-1, 1); one-hot encode a multiclass target "
            "(sklearn.preprocessing.LabelBinarizer)"
        )
    matrix = _to_csr(Y, name)
    matrix.eliminate_zeros()
    if matrix.nnz and not np.all(matrix.data == 1):
        bad = np.unique(matrix.data[matrix.data != 1])[:5]
        kind = ("Unknown label type: continuous values; " if np.any(bad != np.round(bad)) else "")
        raise ValidationError(f"{kind}{name} must contain only 0 and 1; found {bad.tolist()}")
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


def check_fit_inputs(X, Y, label_mask=None, estimator_name: str = "the model"):
    """Validate ``fit``'s arguments together; returns (X, Y, label_mask) in canonical form.
    ``estimator_name`` names the model in the messages."""
    if Y is None:
        raise ValidationError(f"{estimator_name} requires y to be passed, but the target y is None")
    X = check_features(X)
    if X.shape[1] == 0:
        raise ValidationError(f"X has 0 feature(s) (shape={X.shape}) while a minimum of 1 is required.")
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


def string_column_names(table, mixed_types_error) -> np.ndarray | None:
    """The column names of a DataFrame ``table`` as an object array when they are all strings, else
    None (no columns, a sparse matrix, or non-string names such as pandas' default integers). Names of
    mixed types raise ``mixed_types_error(types)`` (``types``: the sorted type names found)."""
    columns = getattr(table, "columns", None)
    if columns is None or sp.issparse(table):
        return None
    names = np.asarray(list(columns), dtype=object)
    is_string = np.array([isinstance(name, str) for name in names], dtype=bool)
    if names.size and is_string.all():
        return names
    if is_string.any():
        raise mixed_types_error(sorted({type(name).__name__ for name in names}))
    return None


def feature_names(X) -> np.ndarray | None:
    """The column names of a DataFrame ``X`` as an object array when they are all strings, else None
    (no columns, or non-string names such as pandas' default integers).

    Names of mixed types are refused, as scikit-learn refuses them."""
    return string_column_names(X, lambda types: TypeError(
        f"Feature names are only supported if all input features have string names, but the input has "
        f"{types} as feature name / column name types. Convert them all to strings, e.g. "
        "X.columns = X.columns.astype(str)"))


def check_feature_names(fitted_names, X, estimator_name: str) -> None:
    """Compare the column names of ``X`` with ``fitted_names`` (the ``feature_names_in_`` of a fitted
    model, or None), as scikit-learn does: a mismatch in names or order is a ValidationError; names on
    one side only are a UserWarning."""
    names = feature_names(X)
    if fitted_names is None and names is None:
        return
    if names is None:
        warnings.warn(f"X does not have valid feature names, but {estimator_name} was fitted with feature names",
                      UserWarning, stacklevel=4)
        return
    if fitted_names is None:
        warnings.warn(f"X has feature names, but {estimator_name} was fitted without feature names",
                      UserWarning, stacklevel=4)
        return
    if len(names) == len(fitted_names) and np.array_equal(names, fitted_names):
        return
    message = "The feature names should match those that were passed during fit.\n"
    unseen = [name for name in names if name not in set(fitted_names)]
    missing = [name for name in fitted_names if name not in set(names)]

    def listed(header, items, shown=5):
        more = [f"- ... ({len(items) - shown} more)"] if len(items) > shown else []
        return header + "\n" + "\n".join([f"- {name}" for name in items[:shown]] + more) + "\n"

    if unseen:
        message += listed("Feature names unseen at fit time:", unseen)
    if missing:
        message += listed("Feature names seen at fit time, yet now missing:", missing)
    if not unseen and not missing:
        message += "Feature names must be in the same order as they were in fit.\n"
    raise ValidationError(message)
