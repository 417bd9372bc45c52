"""Load-time checks of a model file's fitted state: a crafted field is refused at load, never at
prediction.

``bayesmlc.persistence.load_model`` calls the estimator's ``_check_loaded()`` after ``_set_state``
(:meth:`bayesmlc.base.MultiLabelEstimator._check_loaded`): first :func:`check_fitted_state` with the
model's declared table of fields (``bayesmlc/state_checks.py``, ``gp/state_checks.py``,
``bmls/state_checks.py``, ``bnmc/state_checks.py``: one table per model, every fitted field with its
shape, dtype kind, range and finiteness; a failure names the field: ``coef_ must be a float array of
shape (5, 3), got a float64 array of shape (5, 2)``), then :func:`probe_predictions`, which predicts
a few synthetic rows and checks what comes back, for the relations between fields that a table does
not state. Every failure is a :class:`~bayesmlc.exceptions.ModelFormatError`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import scipy.sparse as sp

from .exceptions import ModelFormatError, ValidationError

__all__ = ["PROBE_FEATURES", "PROBE_ROW_NONZEROS", "PROBE_SAMPLE_ROWS", "Field", "all_finite", "array", "check_array", "check_fitted_state", "check_integer",
           "check_number", "check_sparse", "choice", "integer", "number", "probe_predictions", "probe_rows", "rule",
           "sparse", "tensor"]

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


def tensor_all_finite(tensor) -> bool:
    """:func:`all_finite` of a torch tensor: a CPU tensor through its NumPy view (torch's ``isfinite``
    writes a bool tensor first, about 20x slower on a (5000, 1000) float32 basis), any other by torch."""
    import torch

    if tensor.device.type == "cpu" and tensor.dtype in (torch.float16, torch.float32, torch.float64):
        return all_finite(tensor.detach().numpy())
    return bool(torch.isfinite(tensor).all())


def _shape_text(shape) -> str:
    return "(" + ", ".join("*" if n is None else str(n) for n in shape) + ("," if len(shape) == 1 else "") + ")"


def check_array(name: str, value, shape, kind: str = "f", low=None, high=None, finite: bool = True,
                low_open: bool = False, high_open: bool = False) -> None:
    """``value`` is an ndarray of ``shape`` (``None``: any length on that axis) whose dtype kind is in
    ``kind`` ("f" float, "iu" integer; never complex, and bool only where ``kind`` has "b"), with
    finite entries (``finite``) in [``low``, ``high``] (an open end with ``low_open``/``high_open``).
    NaN is refused whenever a bound is given, finite or not."""
    if not (isinstance(value, np.ndarray) and value.ndim == len(shape) and value.dtype.kind in kind
            and all(n is None or n == m for n, m in zip(shape, value.shape))):
        what = _KIND_NAMES.get(kind, "numeric")
        raise ModelFormatError(f"{name} must be a {what} array of shape {_shape_text(shape)}, got {_shown(value)}")
    if finite and not all_finite(value):
        raise ModelFormatError(f"{name} must hold finite numbers")
    if not value.size or (low is None and high is None):
        return
    with np.errstate(invalid="ignore"):
        inside = np.ones(value.shape, dtype=bool)
        if low is not None:
            inside &= value > low if low_open else value >= low
        if high is not None:
            inside &= value < high if high_open else value <= high
    if not inside.all():
        if low_open and high_open:
            raise ModelFormatError(f"{name} must lie strictly between {low:g} and {high:g}")
        low_text = f"{'(' if low_open else '['}{'-inf' if low is None else low}"
        high_text = f"{'inf' if high is None else high}{')' if high_open else ']'}"
        raise ModelFormatError(f"{name} must lie in {low_text}, {high_text}, got values in "
                               f"[{np.nanmin(value) if not np.isnan(value).all() else 'nan'}, "
                               f"{np.nanmax(value) if not np.isnan(value).all() else 'nan'}]"
                               + (" and NaN" if value.dtype.kind == "f" and np.isnan(value).any() else ""))


def check_sparse(name: str, value, shape) -> None:
    """``value`` is a scipy sparse matrix of ``shape`` (``None``: any length) with finite stored entries
    (its structure is checked when the file is decoded)."""
    if not (sp.issparse(value) and value.ndim == 2 and all(n is None or n == m for n, m in zip(shape, value.shape))):
        raise ModelFormatError(f"{name} must be a sparse matrix of shape {_shape_text(shape)}, got {_shown(value)}")
    if value.dtype.kind not in "biuf" or not all_finite(value.data):
        raise ModelFormatError(f"{name} must hold finite numbers")


#: the probe's rows like training rows: this many, each with up to :data:`PROBE_ROW_NONZEROS` features
PROBE_SAMPLE_ROWS = 3
PROBE_ROW_NONZEROS = 8


def probe_rows(n_features: int) -> sp.csr_matrix:
    """The probe's input: CSR float32 (2 + :data:`PROBE_SAMPLE_ROWS`, ``n_features``): an all-zero
    row, a row of ones in every column (at most :data:`PROBE_FEATURES` of them, spread evenly, for a
    wider model), then rows like a sparse training set's: a handful of distinct columns each
    (:data:`PROBE_ROW_NONZEROS` at most) holding small non-negative counts and weights (1 + Poisson(1)
    times a Gamma(2, 1/2) factor), from a fixed-seed generator, so the probe is the same every load."""
    if n_features <= PROBE_FEATURES:
        columns = np.arange(n_features, dtype=np.int64)
    else:
        columns = np.unique(np.linspace(0, n_features - 1, PROBE_FEATURES).round().astype(np.int64))
    rng = np.random.default_rng(20240601)
    rows = [np.zeros(0, np.int64), columns]
    values = [np.zeros(0, np.float32), np.ones(columns.size, np.float32)]
    for _ in range(PROBE_SAMPLE_ROWS):
        picked = np.unique(rng.integers(0, max(n_features, 1), size=min(PROBE_ROW_NONZEROS, n_features)))
        rows.append(picked)
        values.append(((1 + rng.poisson(1.0, picked.size)) * rng.gamma(2.0, 0.5, picked.size)).astype(np.float32))
    indptr = np.concatenate([[0], np.cumsum([r.size for r in rows])])
    return sp.csr_matrix((np.concatenate(values), np.concatenate(rows), indptr), shape=(len(rows), n_features))


def _does_not_predict(exc: BaseException) -> ModelFormatError:
    """The probe's refusal, on one line (torch's state-dict errors span several)."""
    return ModelFormatError(f"fitted state does not predict ({type(exc).__name__}: {' '.join(str(exc).split())[:300]})")


def probe_predictions(model, devices_available) -> None:
    """Predict :func:`probe_rows` of ``model``'s width (``decision_function`` and ``predict_proba``)
    and check that the scores and probabilities have shape (rows, ``n_labels_``), are finite for the
    all-zero row and the rows like training rows (the row of ones, unlike any training row, may
    overflow: BMLS's exp of a sum over every feature), and that the probabilities lie in [0, 1] (NaN
    aside); ``ModelFormatError`` ("fitted state does not predict (TypeError: ...)") otherwise.

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
        # the row of ones (row 1) is unlike any training row: an overflow there (BMLS's exp of a sum
        # over every feature, in float32) is the model's arithmetic, not the file's fault
        if array.dtype.kind not in "fiu" or not np.all(np.isfinite(np.delete(array, 1, axis=0))):
            raise ModelFormatError(f"fitted state does not predict: its {what} are not all finite numbers")
    if np.any(proba < -_PROBABILITY_SLACK) or np.any(proba > 1 + _PROBABILITY_SLACK):
        raise ModelFormatError(f"fitted state does not predict: probabilities in [{proba.min():.6g}, {proba.max():.6g}], "
                               "outside [0, 1]")


# ---- declared fields: one table per model ---------------------------------------------------------
#: a shape's entry: a length, ``None`` (any), or a symbol bound by the first field that uses it (``"L"``
#: labels and ``"D"`` features are bound from ``n_labels_`` and ``n_features_in_``)
_MISSING = object()


@dataclass(frozen=True)
class Field:
    """One fitted field of a model and what it must be.

    ``path``: the attribute, then attribute names or mapping keys inside it (``("parameters_",
    "Phi")``; ``("_mixture", "emission", "kappa")`` reaches a state the model keeps privately, shown
    as ``label``). ``kind``: "array", "tensor" (torch), "sparse", "integer", "number", "choice",
    "strings", "mapping" (a dict of lists: histories, timings), "files", "estimator" (checked as a
    fitted member, :meth:`bayesmlc.base.MultiLabelEstimator._fitted_members`), "any" (derived state
    rebuilt by ``_set_state``), or "rule" (``test(model, dims)`` raises or returns a message).
    ``shape`` entries are lengths, ``None`` or symbols (bound on first use; one of a tuple of shapes
    when ``shape`` is a list), ``dtype`` the accepted kinds ("f" float: never complex, int or bool),
    ``low``/``high`` the range (open ends with ``low_open``/``high_open``; a callable of the bound
    symbols for a range that depends on them), ``finite`` whether NaN and infinities are refused,
    ``optional`` whether files written before the field existed may lack it, ``nullable`` whether
    ``None`` is allowed, ``binds`` the symbol an integer field's value defines.
    """

    path: tuple
    kind: str
    shape: Any = ()
    dtype: str = "f"
    low: Any = None
    high: Any = None
    low_open: bool = False
    high_open: bool = False
    finite: bool = True
    optional: bool = False
    nullable: bool = False
    options: tuple = ()
    binds: str | None = None
    label: str | None = None
    test: Callable | None = None

    @property
    def name(self) -> str:
        if self.label is not None:
            return self.label
        head, *rest = self.path
        return head + "".join(f"[{key!r}]" for key in rest)


def _field(kind, path, **spec) -> Field:
    return Field(path=(path,) if isinstance(path, str) else tuple(path), kind=kind, **spec)


def array(path, shape, dtype="f", **spec) -> Field:
    """An ndarray field (:func:`check_array` with ``shape``'s symbols bound)."""
    return _field("array", path, shape=shape, dtype=dtype, **spec)


def tensor(path, shape, **spec) -> Field:
    """A torch tensor field: a floating dtype (not complex, integer or bool), ``shape``, finite."""
    return _field("tensor", path, shape=shape, **spec)


def sparse(path, shape, **spec) -> Field:
    """A scipy sparse matrix with finite stored entries (its structure is checked when decoded)."""
    return _field("sparse", path, shape=shape, **spec)


def integer(path, low=0, **spec) -> Field:
    """An int (not a bool) >= ``low`` (and <= ``high``)."""
    return _field("integer", path, low=low, **spec)


def number(path, low=-np.inf, **spec) -> Field:
    """A finite real number (not a bool) >= ``low`` (> with ``low_open``; <= ``high``)."""
    return _field("number", path, low=low, **spec)


def choice(path, options, **spec) -> Field:
    """One of ``options``."""
    return _field("choice", path, options=tuple(options), **spec)


def rule(path, test: Callable, **spec) -> Field:
    """A relation between fields: ``test(model, dims)`` raises ``ModelFormatError`` or returns ``None``."""
    return _field("rule", path, test=test, **spec)


def _lookup(model, path):
    value = model
    for step in path:
        if isinstance(value, dict):
            value = value.get(step, _MISSING)
        else:
            value = getattr(value, step, _MISSING)
        if value is _MISSING:
            return _MISSING
    return value


def _resolved(bound, dims):
    return bound(dims) if callable(bound) else bound


def _bind_shape(field: Field, actual: tuple, dims: dict):
    """``field``'s shape (the alternative that fits ``actual``) with its symbols bound from ``dims``,
    binding the symbols met for the first time to ``actual``'s lengths; ``None`` if none fits."""
    alternatives = field.shape if isinstance(field.shape, list) else [field.shape]
    for shape in alternatives:
        if len(shape) != len(actual):
            continue
        trial, concrete = dict(dims), []
        for want, got in zip(shape, actual):
            if callable(want):  # a length derived from bound symbols (BMLS's D + 1 rows)
                want = want(trial)
            elif isinstance(want, str):
                trial.setdefault(want, got)
                want = trial[want]
            concrete.append(want)
        if all(w is None or w == g for w, g in zip(concrete, actual)):
            dims.update(trial)
            return tuple(concrete)
    shape = alternatives[0]
    return tuple(n(dims) if callable(n) else dims.get(n, None) if isinstance(n, str) else n for n in shape)


def _check_value(field: Field, value, dims: dict) -> None:
    name, low, high = field.name, _resolved(field.low, dims), _resolved(field.high, dims)
    if field.kind == "array":
        actual = value.shape if isinstance(value, np.ndarray) else ()
        shape = _bind_shape(field, actual, dims)
        check_array(name, value, shape, kind=field.dtype, low=low, high=high, finite=field.finite,
                    low_open=field.low_open, high_open=field.high_open)
    elif field.kind == "tensor":
        import torch

        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            shown = f"a {value.dtype} tensor" if isinstance(value, torch.Tensor) else _shown(value)
            raise ModelFormatError(f"{name} must be a float tensor, got {shown}")
        shape = _bind_shape(field, tuple(value.shape), dims)
        if len(shape) != value.dim() or any(n is not None and n != m for n, m in zip(shape, value.shape)):
            raise ModelFormatError(f"{name} must be a float tensor of shape {_shape_text(shape)}, got shape "
                                   f"{tuple(value.shape)}")
        if field.finite and not tensor_all_finite(value):
            raise ModelFormatError(f"{name} must hold finite numbers (it holds NaN or infinity)")
    elif field.kind == "sparse":
        shape = _bind_shape(field, value.shape if sp.issparse(value) else (), dims)
        check_sparse(name, value, shape)
    elif field.kind == "integer":
        check_integer(name, value, low)
        if high is not None and value > high:
            raise ModelFormatError(f"{name} must be an integer in [{low}, {high}], got {value}")
        if field.binds is not None:
            dims[field.binds] = int(value)
    elif field.kind == "number":
        check_number(name, value, low)
        if (field.low_open and value <= low) or (high is not None and value > high):
            raise ModelFormatError(f"{name} must be a finite number {'>' if field.low_open else '>='} {low:g}"
                                   f"{'' if high is None else f' and <= {high:g}'}, got {value!r}")
    elif field.kind == "choice":
        if not isinstance(value, str) or value not in field.options:
            raise ModelFormatError(f"{name} must be one of {', '.join(field.options)}, got {str(value)[:40]!r}")
    elif field.kind == "strings":
        size = dims.get(field.shape[0]) if isinstance(field.shape[0], str) else field.shape[0]
        if not (isinstance(value, np.ndarray) and value.shape == (size,) and all(isinstance(v, str) for v in value)):
            raise ModelFormatError(f"{name} must be {size} strings{' (one per label)' if field.shape[0] == 'L' else ''}")
    elif field.kind == "mapping":
        if not (isinstance(value, dict) and all(isinstance(k, str) for k in value)):
            raise ModelFormatError(f"{name} must be a mapping of names, got {type(value).__name__}")
    elif field.kind == "files":
        if not isinstance(value, dict) or not value:
            raise ModelFormatError(f"{name} must hold the library's model files")
    elif field.kind == "estimator":
        if not (hasattr(value, "_check_fitted_state") and hasattr(value, "n_labels_")):
            raise ModelFormatError(f"{name} must be a fitted bayesmlc estimator, got {type(value).__name__}")


def check_fields(model, table, dims: dict | None = None) -> dict:
    """Check ``model``'s (an object, or a mapping of a state) fields against ``table`` (a sequence of
    :class:`Field`), in order; returns the bound shape symbols. The first failure raises a one-line
    ``ModelFormatError`` naming the field."""
    dims = {} if dims is None else dims
    for field in table:
        if field.kind == "rule":
            field.test(model, dims)
            continue
        value = _lookup(model, field.path)
        if value is _MISSING:
            if field.optional:
                continue
            raise ModelFormatError(f"the fitted state has no {field.name}")
        if value is None and field.nullable:
            continue
        _check_value(field, value, dims)
    return dims


def check_fitted_state(model, table) -> dict:
    """Every load-time field check of ``model`` against its model's ``table``: the declared
    parameters, each field of the table (:func:`check_fields`), no fitted attribute the table does not
    declare, then the fitted members (an ensemble's estimators, a calibrated model's estimator), each
    against its own table and of the same width and labels. Returns the bound shape symbols."""
    from .parameters import check_parameters

    try:
        check_parameters(model)
    except ValidationError as exc:
        raise ModelFormatError(f"parameter {exc}") from None
    dims = check_fields(model, table)
    declared = {field.path[0] for field in table}
    for key in vars(model):
        if key.endswith("_") and not key.startswith("_") and key not in declared:
            raise ModelFormatError(f"the fitted state has an entry {key[:80]!r} that is not a fitted attribute of "
                                   f"{type(model).__name__}")
    for name, member in model._fitted_members():
        _check_value(Field(path=(name,), kind="estimator"), member, dims)
        try:
            member._check_fitted_state()
        except ModelFormatError as exc:
            raise ModelFormatError(f"{name}: {exc}") from None
        if (member.n_features_in_, member.n_labels_) != (model.n_features_in_, model.n_labels_):
            raise ModelFormatError(f"{name} has {member.n_features_in_} features and {member.n_labels_} labels, "
                                   f"the model {model.n_features_in_} and {model.n_labels_}")
    return dims
