"""Load-time checks of a model file's fitted state: a crafted field is refused at load, never at
prediction.

``bayesmlc.persistence.load_model`` calls the estimator's ``_check_loaded()`` after ``_set_state``
(:meth:`bayesmlc.base.MultiLabelEstimator._check_loaded`): first the type and shape checks of its
fields, written with the helpers below so that the message names the field (``coef_ must be a float
array of shape (5, 3), got a float64 array of shape (5, 2)``), then :func:`probe_predictions`, which
predicts two synthetic rows and checks what comes back, for whatever the field checks do not cover.
Every failure is a :class:`~bayesmlc.exceptions.ModelFormatError`.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse as sp

from .exceptions import ModelFormatError, ValidationError

__all__ = ["PROBE_FEATURES", "all_finite", "check_array", "check_integer", "check_number", "check_sparse",
           "probe_predictions", "probe_rows"]

#: The probe's second row sets every feature of a model at most this wide; a wider model gets this many
#: features set, spread evenly over its columns (first and last included), so the probe stays small.
PROBE_FEATURES = 1 << 14

#: Probabilities may exceed [0, 1] by float32 rounding at most this much.
_PROBABILITY_SLACK = 1e-6

_KIND_NAMES = {"f": "float", "iu": "integer", "b": "bool"}


def _shown(value) -> str:
    if isinstance(value, np.ndarray):
        return f"a {value.dtype} array of shape {value.shape}"
    if sp.issparse(value):
        return f"a sparse {value.dtype} matrix of shape {value.shape}"
    return repr(str(value)[:40])


def check_integer(name: str, value, low: int = 0) -> None:
    """``value`` is an int (not a bool) >= ``low``; else a ModelFormatError naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < low:
        raise ModelFormatError(f"{name} must be an integer >= {low}, got {_shown(value)}")


def check_number(name: str, value, low: float = -np.inf) -> None:
    """``value`` is a finite real number (not a bool) >= ``low``."""
    if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating))
            or not low <= value < np.inf):
        bound = "" if low == -np.inf else f" >= {low:g}"
        raise ModelFormatError(f"{name} must be a finite number{bound}, got {_shown(value)}")


def all_finite(array: np.ndarray) -> bool:
    """Whether every entry of a numeric array is finite, without a bool copy of a large array: a
    float64 sum of float32 (or integer) entries cannot overflow, so it is finite exactly when they all
    are; a non-finite float64 sum is checked entry by entry."""
    if array.dtype.kind in "iub":
        return True
    return bool(np.isfinite(np.sum(array, dtype=np.float64))) or bool(np.all(np.isfinite(array)))


def _shape_text(shape) -> str:
    return "(" + ", ".join("*" if n is None else str(n) for n in shape) + ("," if len(shape) == 1 else "") + ")"


def check_array(name: str, value, shape, kind: str = "f", low=None, high=None, finite: bool = True) -> None:
    """``value`` is an ndarray of ``shape`` (``None``: any length on that axis) whose dtype kind is in
    ``kind`` ("f" float, "iu" integer), with finite entries (``finite``) in [``low``, ``high``]."""
    if not (isinstance(value, np.ndarray) and value.ndim == len(shape) and value.dtype.kind in kind
            and all(n is None or n == m for n, m in zip(shape, value.shape))):
        what = _KIND_NAMES.get(kind, "numeric")
        raise ModelFormatError(f"{name} must be a {what} array of shape {_shape_text(shape)}, got {_shown(value)}")
    if finite and not all_finite(value):
        raise ModelFormatError(f"{name} must hold finite numbers")
    if value.size and ((low is not None and value.min() < low) or (high is not None and value.max() > high)):
        raise ModelFormatError(f"{name} must lie in [{'-inf' if low is None else low}, "
                               f"{'inf' if high is None else high}], got values in [{value.min()}, {value.max()}]")


def check_sparse(name: str, value, shape) -> None:
    """``value`` is a scipy sparse matrix of ``shape`` (``None``: any length) with finite stored entries
    (its structure is checked when the file is decoded)."""
    if not (sp.issparse(value) and value.ndim == 2 and all(n is None or n == m for n, m in zip(shape, value.shape))):
        raise ModelFormatError(f"{name} must be a sparse matrix of shape {_shape_text(shape)}, got {_shown(value)}")
    if value.dtype.kind not in "biuf" or not all_finite(value.data):
        raise ModelFormatError(f"{name} must hold finite numbers")


def probe_rows(n_features: int) -> sp.csr_matrix:
    """The probe's input: CSR float32 (2, ``n_features``), an all-zero row and a row of ones in every
    column (at most :data:`PROBE_FEATURES` of them, spread evenly, for a wider model)."""
    if n_features <= PROBE_FEATURES:
        columns = np.arange(n_features, dtype=np.int64)
    else:
        columns = np.unique(np.linspace(0, n_features - 1, PROBE_FEATURES).round().astype(np.int64))
    return sp.csr_matrix((np.ones(columns.size, dtype=np.float32), columns, np.array([0, 0, columns.size])),
                         shape=(2, n_features))


def _does_not_predict(exc: BaseException) -> ModelFormatError:
    """The probe's refusal, on one line (torch's state-dict errors span several)."""
    return ModelFormatError(f"fitted state does not predict ({type(exc).__name__}: {' '.join(str(exc).split())[:300]})")


def probe_predictions(model, devices_available) -> None:
    """Predict :func:`probe_rows` of ``model``'s width (``decision_function`` and ``predict_proba``)
    and check that the scores and probabilities have shape (2, ``n_labels_``), are finite for the
    all-zero row, and that the probabilities lie in [0, 1] (NaN aside); ``ModelFormatError``
    ("fitted state does not predict (TypeError: ...)") otherwise.

    A :class:`ValidationError` while ``devices_available()`` is False is not the file's fault: the
    model names a device this machine does not have, and predicts only after ``set_params(device=...)``.
    Warnings raised while probing are not shown (they would be about the synthetic rows).
    """
    X = probe_rows(model.n_features_in_)
    expected = (X.shape[0], model.n_labels_)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            scores = np.asarray(model.decision_function(X))
            proba = np.asarray(model.predict_proba(X))
    except (KeyboardInterrupt, SystemExit):
        raise
    except ValidationError as exc:
        if devices_available():
            raise _does_not_predict(exc) from None
        return
    except BaseException as exc:  # also a native library's panic (omikuji's PanicException is no Exception)
        raise _does_not_predict(exc) from None
    for what, array in (("scores", scores), ("probabilities", proba)):
        if array.shape != expected:
            raise ModelFormatError(f"fitted state does not predict: {what} of shape {array.shape}, not {expected}")
        # the row of ones is unlike any training row: an overflow there (BMLS's exp of a sum over
        # every feature, in float32) is the model's arithmetic, not the file's fault
        if array.dtype.kind not in "fiu" or not np.all(np.isfinite(array[0])):
            raise ModelFormatError(f"fitted state does not predict: its {what} are not all finite numbers")
    if np.any(proba < -_PROBABILITY_SLACK) or np.any(proba > 1 + _PROBABILITY_SLACK):
        raise ModelFormatError(f"fitted state does not predict: probabilities in [{proba.min():.6g}, {proba.max():.6g}], "
                               "outside [0, 1]")
