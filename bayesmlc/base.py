"""The estimator contract every bayesmlc model follows.

A model subclasses :class:`MultiLabelEstimator` and implements three hooks:

``_fit(X, Y, label_mask, **fit_params)``
    ``X`` is float32 CSR (n, D), ``Y`` float32 CSR (n, L) with stored ones, ``label_mask`` ``None`` or
    float32 CSR (n, L) whose stored ones mark observed entries (unobserved entries of ``Y`` are already
    zeroed). Sets fitted attributes (names ending in ``_``).
``_decision_function(X)``
    Scores for a batch of rows (float32 CSR (b, D), already validated): ndarray (b, L); higher means
    more likely. Used for ranking.
``_predict_proba(X)``
    Probabilities for a batch: ndarray (b, L) in [0, 1]. Defaults to the logistic of the scores.
``_scores_and_proba(X)`` (optional)
    Both of the above for a batch, from one pass of the model where it can share the work (the
    default calls the two hooks, or only the first when the probabilities are its logistic).
    :meth:`~MultiLabelEstimator.score_and_proba` scores a test set with it once per row.

and, when its fitted state is not plain arrays and numbers, ``_get_state`` / ``_set_state``.
It declares what each constructor parameter may be in ``_parameter_constraints``
(:mod:`bayesmlc.parameters`), checked at the start of ``fit``.
The base class does validation, batching, label columns without positives, top-k, save and load,
and runs every public method that computes (:data:`COMPUTING_METHODS`, a subclass's own included)
inside :func:`bayesmlc.threads.compute_threads`: with the model's ``n_threads`` when it has one and
it is set, else with the count of an enclosing ``use_threads`` block, else with one thread per idle
core.
"""

from __future__ import annotations

import functools
import inspect
import numbers
import re
import warnings

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator
from sklearn.utils import ClassifierTags

from . import persistence
from .exceptions import ModelFormatError, NotFittedError, ValidationError
from .fitted_state import check_fitted_state, probe_predictions
from .label_statistics import LabelStatistics
from .metrics import labels_at_or_above, precision_at_k, topk
from .parameters import check_parameters
from .state_checks import COMMON_FIELDS
from .threads import compute_threads
from .utils import iter_batches, resolve_device, sigmoid
from .validation import (check_feature_names, check_features, check_fit_inputs, feature_names,
                         string_column_names)

__all__ = ["MultiLabelEstimator"]

#: rows a prediction hook (``_decision_function``, ``_predict_proba``, ``_scores_and_proba``) gets at a
#: time, at most; fewer for a model that sets ``_prediction_block_entries``
PREDICT_BATCH_ROWS = 2048
#: a block size (rows x labels) for models whose prediction makes several dense (rows, L) float64
#: temporaries: 8 MB each. Larger ones are mapped afresh by every allocation (above glibc's largest mmap
#: threshold, 32 MB) and zero-filled by the kernel on first touch: at 4,000 labels that was over half of
#: BNMC's prediction time (docs/experiments.md, "MLGPF: element-wise passes and large temporaries").
PREDICTION_BLOCK_ENTRIES = 1 << 20

#: the public methods that fit or predict; each runs inside :func:`bayesmlc.threads.compute_threads`:
#: the base class's own in a ``with`` block (no extra frame, so a warning's ``stacklevel`` still reaches
#: the caller), a subclass's own through :func:`computes_with_threads`
COMPUTING_METHODS = ("fit", "partial_fit", "decision_function", "predict_proba", "predict", "predict_topk", "score",
                     "score_and_proba", "predict_interval")


def _thread_parameter(estimator) -> int | None:
    """``estimator.n_threads`` when it is a positive integer, else ``None``."""
    threads = getattr(estimator, "n_threads", None)
    valid = isinstance(threads, numbers.Integral) and not isinstance(threads, bool) and threads >= 1
    return int(threads) if valid else None


def computes_with_threads(method):
    """``method`` (of an estimator) run inside :func:`bayesmlc.threads.compute_threads` with the
    estimator's ``n_threads``: that count when it is a positive integer, else (``None``, no such
    parameter, or a bad value that ``fit``'s parameter check reports) the count of an enclosing
    ``use_threads`` block or one thread per idle core. A nested call (``predict`` calling
    ``predict_proba``) keeps the count of the outer one. The wrapper is one more frame between the
    caller and ``method``: a warning raised inside with a ``stacklevel`` counted for a direct call
    points one frame short."""
    if getattr(method, "computes_with_threads", False):
        return method

    @functools.wraps(method)
    def with_threads(self, *args, **kwargs):
        with compute_threads(_thread_parameter(self)):
            return method(self, *args, **kwargs)

    with_threads.computes_with_threads = True
    return with_threads


#: ``label_cardinality``: "independent" leaves the per-label probabilities as the model gives them;
#: "at_least_one" conditions them on the row having at least one label (:func:`at_least_one_label`).
LABEL_CARDINALITY = ("independent", "at_least_one")


def at_least_one_label(proba: np.ndarray) -> np.ndarray:
    """Per-label probabilities conditioned on the row having at least one label.

    Under independent labels with marginals p_il, P(y_il = 1 | sum_l y_il >= 1) =
    p_il / (1 - prod_l (1 - p_il)), since y_il = 1 implies a non-empty row. The zero-truncated
    product of Bernoullis (a hurdle model of the label count with no mass at 0) is the joint
    this conditions on; a row's probabilities are multiplied by one factor >= 1, so every row keeps
    its ranking. ``proba``: (n, L); returns float32 (n, L), each entry in [p_il, 1].
    """
    proba = np.asarray(proba, dtype=np.float64)
    log_none = np.log1p(-np.clip(proba, 0.0, 1.0 - 1e-12)).sum(axis=1, keepdims=True)
    some = -np.expm1(log_none)  # P(at least one label) under independence, computed without cancellation
    return np.minimum(proba / np.maximum(some, np.finfo(np.float64).tiny), 1.0).astype(np.float32)


def _labels_at_threshold(proba: np.ndarray, threshold) -> sp.csr_matrix:
    """Sparse 0/1 float32: the entries of ``proba`` at or above ``threshold`` (a number, or one per
    label column: an (L,) array broadcast over the rows), as ``proba >= threshold`` selects them (a
    Python number is compared in ``proba``'s precision): :func:`bayesmlc.metrics.labels_at_or_above`."""
    return labels_at_or_above(proba, threshold)


def check_threshold(threshold, n_labels: int):
    """``predict``'s ``threshold``: a number in [0, 1], returned as a float, or an array-like of
    ``n_labels`` numbers in [0, 1] (one per label column), returned as a float32 (L,) array (so that
    an array of equal entries selects what that one number selects from the float32
    probabilities). Anything else is a ValidationError naming ``threshold``."""
    values = np.asarray(threshold) if not isinstance(threshold, (str, bytes)) else None
    if values is None or values.dtype.kind not in "iuf" or values.ndim > 1:
        shown = f"shape {values.shape}" if values is not None and values.dtype.kind in "iuf" else repr(threshold)[:80]
        raise ValidationError(f"threshold must be a number in [0, 1] or a 1-D array of {n_labels} numbers in "
                              f"[0, 1] (one per label), got {shown}")
    if values.ndim == 1 and values.shape[0] != n_labels:
        raise ValidationError(f"threshold has {values.shape[0]} entries but the model has {n_labels} labels: give "
                              "one number, or one per label column")
    bad = ~((values >= 0.0) & (values <= 1.0))  # NaN fails both comparisons
    if np.any(bad):
        where = "" if values.ndim == 0 else f" at label {int(np.flatnonzero(bad)[0])}"
        raise ValidationError(f"threshold must be in [0, 1], got {values[bad].ravel()[0]}{where}")
    return float(values) if values.ndim == 0 else values.astype(np.float32)


def label_names_of(Y) -> np.ndarray | None:
    """The column names of a pandas DataFrame ``Y`` as an object array when they are all strings,
    else None (an array or sparse matrix, or pandas' default integer names). Names of mixed types
    are refused with a ValidationError naming ``Y``."""
    return string_column_names(Y, lambda types: ValidationError(
        f"Y's column names (the label names) must all be strings, got {types}; convert them, "
        "e.g. Y.columns = Y.columns.astype(str)"))


def _frame_values(Y):
    """A DataFrame ``Y`` whose columns are all of pandas' sparse dtype as a scipy COO matrix (never
    densified); anything else unchanged."""
    try:
        accessor = Y.sparse  # pandas: only a DataFrame of sparse columns has it (else AttributeError)
    except AttributeError:
        return Y
    return accessor.to_coo() if hasattr(accessor, "to_coo") and hasattr(Y, "columns") else Y


def _topk_csr(indices: np.ndarray, values: np.ndarray, n_labels: int) -> sp.csr_matrix:
    """(n, k) label indices and values as a canonical float32 CSR (n, L): k stored entries per row
    (zero probabilities included), the columns of each row in ascending order."""
    n, k = indices.shape
    order = np.argsort(indices, axis=1)
    return sp.csr_matrix(
        (np.take_along_axis(values, order, axis=1).ravel().astype(np.float32),
         np.take_along_axis(indices, order, axis=1).ravel(), np.arange(0, n * k + 1, k, dtype=np.int64)),
        shape=(n, n_labels),
    )


def _warn_about_empty_rows(Y, label_mask, name: str) -> None:
    """One warning when rows with every label observed have none positive: ``label_cardinality=
    "at_least_one"`` assumes that every row has a label."""
    complete = np.ones(Y.shape[0], dtype=bool) if label_mask is None else np.diff(label_mask.indptr) == Y.shape[1]
    empty = int(np.count_nonzero(complete & (np.diff(Y.indptr) == 0)))
    if empty:
        warnings.warn(f"{name}: label_cardinality='at_least_one' assumes every row has a label, but {empty} of "
                      f"{Y.shape[0]} training rows have none; their probabilities will be too high", UserWarning,
                      stacklevel=3)


def _is_fitted_attribute_name(key) -> bool:
    """A name scikit-learn's convention gives a fitted attribute: ``lower_case_``, not private."""
    return isinstance(key, str) and re.fullmatch(r"[a-z][a-z0-9_]*_", key) is not None


class MultiLabelEstimator(BaseEstimator):
    """Base class: ``fit``, ``decision_function``, ``predict_proba``, ``predict``, ``predict_topk``,
    ``score``, ``save`` and ``load`` for every model.

    Fitted attributes set here
    --------------------------
    n_features_in_ : int
    feature_names_in_ : ndarray of str objects (n_features_in_,), the column names of a DataFrame ``X``
        whose names are all strings; absent otherwise. Predicting on other names, or the same names in
        another order, is refused.
    label_names_ : ndarray of str objects (L,), the column names of a pandas DataFrame ``Y`` whose
        names are all strings (:func:`label_names_of`); absent otherwise. Saved and loaded with the
        model.
    classes_ : ndarray (L,), ``arange(n_labels_)``: the label columns, as in scikit-learn's multi-label
        estimators.
    n_labels_ : int
    label_frequencies_ : ndarray (L,), positives per label in the observed training labels
    label_prior_ : ndarray (L,), smoothed positive rate (freq + 0.5) / (observed + 1) per label
        (:class:`~bayesmlc.label_statistics.LabelStatistics`, which reads both counts back)
    empty_labels_ : ndarray of int, label columns with no positive training example; their
        probabilities are the prior and their scores its logit.
    history_ : dict of equal-length lists, at least ``wall_time`` (seconds since fit began) and
        ``objective`` (the model's training objective: ELBO, log-likelihood, ...); may be empty.
    """

    #: parameter name -> list of allowed values or constraints (bayesmlc.parameters)
    _parameter_constraints: dict = {}
    #: a model file's fitted attributes and parameters written under earlier names (old -> current):
    #: ``_set_state`` and :func:`bayesmlc.persistence.load_model` read them under the current names
    _renamed_attributes: dict = {}
    _renamed_parameters: dict = {}

    def _computing_threads(self):
        """:func:`bayesmlc.threads.compute_threads` with this estimator's ``n_threads`` (a positive
        integer, else ``None``: a missing parameter, or a bad value that ``fit``'s parameter check
        reports); every public method that computes runs in it."""
        return compute_threads(_thread_parameter(self))

    def __init_subclass__(cls, **kwargs):
        """Run the :data:`COMPUTING_METHODS` a subclass defines inside ``compute_threads`` too."""
        super().__init_subclass__(**kwargs)
        for name in COMPUTING_METHODS:
            method = cls.__dict__.get(name)
            if inspect.isfunction(method):
                setattr(cls, name, computes_with_threads(method))

    # ---- scikit-learn: tags (a multi-label classifier on sparse or dense X, 2-D 0/1 Y only) ----
    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.estimator_type = "classifier"
        tags.classifier_tags = ClassifierTags(multi_class=False, multi_label=True)
        tags.target_tags.required = True
        tags.target_tags.two_d_labels = True
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = False
        tags.input_tags.sparse = True
        return tags

    @staticmethod
    def _check_partial_fit_classes(classes) -> None:
        """``partial_fit(classes=...)`` as scikit-learn's incremental classifiers take it: the label set
        here is the columns of Y, so ``classes`` can only name the values Y holds (a subset of {0, 1})."""
        if classes is not None and not set(np.unique(np.asarray(classes)).tolist()) <= {0, 1}:
            raise ValidationError(f"classes must be None or a subset of [0, 1] (the values of the 0/1 label "
                                  f"matrix; labels are its columns), got {np.asarray(classes).tolist()[:10]}")

    @property
    def _conditions_on_a_label(self) -> bool:
        """Whether ``predict_proba`` conditions on a non-empty row (``label_cardinality="at_least_one"``;
        models without the parameter never do)."""
        return getattr(self, "label_cardinality", "independent") == "at_least_one"

    @property
    def classes_(self) -> np.ndarray:
        """The label columns ``arange(n_labels_)`` (scikit-learn's multi-label convention)."""
        self._check_is_fitted()
        return np.arange(self.n_labels_)

    # ---- hooks ------------------------------------------------------------------------------
    def _set_label_statistics(self, statistics: LabelStatistics) -> None:
        """``label_frequencies_``, ``label_prior_`` and ``empty_labels_`` from the label counts of the
        training rows (:class:`~bayesmlc.label_statistics.LabelStatistics`; a data-parallel model
        passes the counts summed over its processes)."""
        for name, value in statistics.fitted_attributes().items():
            setattr(self, name, value)

    def _start_partial_fit(self, Y, classes):
        """The start every ``partial_fit`` shares: ``classes`` checked, whether this call is the first
        (the model is not fitted), and ``Y`` with its label names taken (:meth:`_take_label_names`).
        Returns ``(first, Y)``."""
        self._check_partial_fit_classes(classes)
        first = not hasattr(self, "n_labels_")
        return first, self._take_label_names(Y, first)

    def _add_label_statistics(self, batch: LabelStatistics, first: bool, n_features: int) -> LabelStatistics:
        """Count one ``partial_fit`` batch's labels (``batch``) into the label statistics. The first
        call fixes ``n_features_in_`` and ``n_labels_`` and starts an empty ``history_``; a later one
        adds ``batch`` to the counts kept of earlier calls (or of ``fit``, a loaded model's
        included: :meth:`LabelStatistics.of_fitted`). Returns the counts of every row seen."""
        if first:
            self.n_features_in_, self.n_labels_ = n_features, batch.n_labels
            self.history_ = {"wall_time": [], "objective": []}
        else:
            batch = LabelStatistics.of_fitted(self) + batch
        self._set_label_statistics(batch)
        return batch

    def _fit(self, X, Y, label_mask, **fit_params):  # pragma: no cover - abstract
        raise NotImplementedError

    def _decision_function(self, X) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def _predict_proba(self, X) -> np.ndarray:
        return sigmoid(self._decision_function(X))

    def _scores_and_proba(self, X) -> tuple[np.ndarray, np.ndarray]:
        """``(_decision_function(X), _predict_proba(X))`` for a batch; a model whose two hooks share
        work overrides it to do that work once. The default computes the scores once when the
        probabilities are their logistic (the default ``_predict_proba``)."""
        if type(self)._predict_proba is MultiLabelEstimator._predict_proba:
            scores = self._decision_function(X)
            return scores, sigmoid(scores)
        return self._decision_function(X), self._predict_proba(X)

    def _labels_from_proba(self, proba: np.ndarray, X) -> sp.csr_matrix:
        """``predict(X)`` from ``proba = predict_proba(X)``: the labels with probability >= 0.5. A model
        whose ``predict`` has another rule overrides this with it; until it does, ``predict(X)`` is
        called (a second pass of the model)."""
        if type(self).predict is not MultiLabelEstimator.predict:
            return self.predict(X)
        return _labels_at_threshold(proba, 0.5)

    def _fitted_attribute_names(self):
        return [k for k in vars(self) if k.endswith("_") and not k.startswith("_")]

    def _get_state(self) -> dict:
        """Fitted state to save: by default every public attribute ending in ``_``."""
        state = {k: getattr(self, k) for k in self._fitted_attribute_names()}
        for name in ("feature_names_in_", "label_names_"):  # an object array cannot be stored without pickle
            if name in state:
                state[name] = [str(value) for value in state[name]]
        return state

    def _set_state(self, state: dict) -> None:
        """Set the fitted attributes a model file holds. Only fitted-attribute names are accepted (a
        public lower-case name ending in ``_`` that the class does not define itself): a state entry
        named after a method, a property or a private attribute (``"_check_loaded": null`` would
        switch off every load check) is refused with ``ModelFormatError``. Entries under an earlier
        name (:attr:`_renamed_attributes`) are set under the current one."""
        state = persistence.current_names(state, type(self)._renamed_attributes)
        for key in state:
            if not _is_fitted_attribute_name(key) or hasattr(type(self), key):
                raise ModelFormatError(f"the fitted state has an entry {str(key)[:80]!r} that is not a fitted "
                                       f"attribute of {type(self).__name__}")
        for key, value in state.items():
            setattr(self, key, value)
        for name in ("feature_names_in_", "label_names_"):
            if name in state:
                setattr(self, name, np.asarray(state[name], dtype=object))

    # ---- load-time checks (bayesmlc.persistence.load_model, after _set_state) -----------------
    def _check_loaded(self) -> None:
        """Refuse a loaded state that could fail at prediction: :meth:`_check_fitted_state` (the fields,
        by name), then a probe that predicts two synthetic rows of the model's width
        (:func:`bayesmlc.fitted_state.probe_predictions`). Raises ``ModelFormatError``."""
        self._check_fitted_state()
        probe_predictions(self, self._devices_available)

    def _check_fitted_state(self) -> None:
        """Type and shape checks of what a model file sets, each failure a ``ModelFormatError`` naming
        the field: :func:`bayesmlc.fitted_state.check_fitted_state` with the model's table (here the
        fields every model has, :data:`bayesmlc.state_checks.COMMON_FIELDS`; each model passes its
        own), which also checks the declared parameters and, through :meth:`_fitted_members`, the
        nested fitted estimators."""
        check_fitted_state(self, COMMON_FIELDS)

    def _fitted_members(self) -> list:
        """The fitted estimators this one predicts with, as (field name, estimator) pairs (an
        ensemble's members, a calibrated model's estimator); none by default."""
        return []

    def _devices_available(self) -> bool:
        """Whether this machine has the ``device`` of this model and of its fitted members."""
        try:
            resolve_device(self.get_params(deep=False).get("device"))
        except ValidationError:
            return False
        return all(member._devices_available() for _, member in self._fitted_members())

    # ---- public API -------------------------------------------------------------------------
    def fit(self, X, Y, label_mask=None, **fit_params):
        """Fit the model.

        Parameters
        ----------
        X : array-like or sparse, shape (n_samples, n_features)
        Y : array-like or sparse 0/1, shape (n_samples, n_labels)
            A pandas DataFrame whose column names are all strings sets ``label_names_``; one whose
            columns are all of pandas' sparse dtype is read without densifying it.
        label_mask : array-like or sparse 0/1, shape (n_samples, n_labels), optional
            1 where the label entry is observed. Unobserved entries are missing, not negative,
            whatever ``Y`` holds there.

        Returns
        -------
        self
        """
        with self._computing_threads():
            check_parameters(self)
            self._check_fit_params(fit_params)
            names = feature_names(X)
            Y = self._take_label_names(Y, first=True)
            X, Y, label_mask = check_fit_inputs(X, Y, label_mask, estimator_name=type(self).__name__)
            n_labels = Y.shape[1]
            self.n_features_in_ = X.shape[1]
            if names is None:
                self.__dict__.pop("feature_names_in_", None)
            else:
                self.feature_names_in_ = names
            self.n_labels_ = n_labels
            self._set_label_statistics(LabelStatistics.of_labels(Y, label_mask))
            if self.empty_labels_.size:
                shown = ", ".join(map(str, self.empty_labels_[:10])) + (" ..." if self.empty_labels_.size > 10 else "")
                warnings.warn(
                    f"{self.empty_labels_.size} label column(s) have no positive training example ({shown}); "
                    "they are kept and predicted from the prior",
                    UserWarning,
                    stacklevel=2,
                )
            if self._conditions_on_a_label:
                _warn_about_empty_rows(Y, label_mask, type(self).__name__)
            self.history_ = {"wall_time": [], "objective": []}
            self._fit(X, Y, label_mask, **fit_params)
            return self

    def _take_label_names(self, Y, first: bool):
        """Record the label names of a DataFrame ``Y`` (:func:`label_names_of`) as ``label_names_``
        when ``first`` (a fit, or the first ``partial_fit``), forgetting earlier ones when it has none;
        a later ``partial_fit`` batch with other names is refused. Returns ``Y``'s values, a sparse
        DataFrame as a scipy matrix."""
        names = label_names_of(Y)
        if first:
            if names is None:
                self.__dict__.pop("label_names_", None)
            else:
                self.label_names_ = names
        elif names is not None and hasattr(self, "label_names_") and not np.array_equal(names, self.label_names_):
            raise ValidationError(f"Y's column names differ from the label names of the first call "
                                  f"(label_names_, {len(self.label_names_)} names): the label columns are fixed")
        return _frame_values(Y)

    def _check_fit_params(self, fit_params) -> None:
        """Refuse keyword arguments ``_fit`` does not take before any work, with the TypeError Python
        gives for an unexpected keyword. ``sample_weight`` is refused unless ``_fit`` names it, also
        where ``_fit`` passes ``**fit_params`` on to other models (no model here weights rows)."""
        accepted = inspect.signature(self._fit).parameters
        if "sample_weight" in fit_params and "sample_weight" not in accepted:
            raise TypeError(f"{type(self).__name__}.fit() got an unexpected keyword argument 'sample_weight' "
                            "(rows cannot be weighted)")
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
            return
        unknown = sorted(set(fit_params) - set(accepted))
        if unknown:
            raise TypeError(f"{type(self).__name__}.fit() got an unexpected keyword argument {unknown[0]!r}")

    def _check_is_fitted(self):
        if not hasattr(self, "n_labels_"):
            raise NotFittedError(
                f"This {type(self).__name__} instance is not fitted yet: call fit(X, Y) before predicting"
            )

    def _validated(self, X) -> sp.csr_matrix:
        self._check_is_fitted()
        if not sp.issparse(X):  # a sparse matrix has no column names
            check_feature_names(getattr(self, "feature_names_in_", None), X, type(self).__name__)
        return check_features(X, self.n_features_in_, estimator_name=type(self).__name__)

    #: (rows x labels) entries a prediction hook gets at a time, at most (None: ``PREDICT_BATCH_ROWS`` rows)
    _prediction_block_entries: int | None = None

    def _prediction_rows(self) -> int:
        """How many rows the prediction hooks get at a time: ``PREDICT_BATCH_ROWS``, or fewer for
        ``_prediction_block_entries``."""
        if self._prediction_block_entries is None:
            return PREDICT_BATCH_ROWS
        return max(1, min(PREDICT_BATCH_ROWS, self._prediction_block_entries // self.n_labels_))

    def _batched(self, X, hook, fill) -> np.ndarray:
        X = self._validated(X)
        out = np.empty((X.shape[0], self.n_labels_), dtype=np.float32)
        for rows in iter_batches(X.shape[0], self._prediction_rows()):
            block = X[rows]
            out[rows] = self._checked_block(hook(block), block.shape[0])
        if self.empty_labels_.size:
            out[:, self.empty_labels_] = fill[self.empty_labels_]
        return out

    def _checked_block(self, values, n_rows: int) -> np.ndarray:
        """A hook's output for ``n_rows`` rows, refused unless it is (n_rows, n_labels_)."""
        values = np.asarray(values)
        if values.shape != (n_rows, self.n_labels_):  # never broadcast a model's wrong-shaped output
            raise ValueError(f"{type(self).__name__} computed an array of shape {values.shape} for {n_rows} "
                             f"rows and {self.n_labels_} labels: its fitted state is inconsistent")
        return values

    def decision_function(self, X) -> np.ndarray:
        """Scores, shape (n_samples, n_labels): higher is more likely. Use for ranking metrics."""
        with self._computing_threads():
            fill = self._prior_logit() if hasattr(self, "label_prior_") else None
            return self._batched(X, self._decision_function, fill)

    def _prior_logit(self) -> np.ndarray:
        """The logit of ``label_prior_``: the score of a label without a training positive."""
        return np.log(self.label_prior_) - np.log1p(-self.label_prior_)

    def predict_proba(self, X, top_k: int | None = None):
        """Probabilities that each label is on; conditioned on at least one label per row when the
        model's ``label_cardinality`` is "at_least_one" (:func:`at_least_one_label`).

        Parameters
        ----------
        X : array-like or sparse, shape (n_samples, n_features)
        top_k : int >= 1 or None
            None: every label's probability, dense. An int: only each row's ``top_k`` most probable
            labels, as a sparse matrix computed ``PREDICT_BATCH_ROWS`` rows at a time, so that at
            most one batch of dense probabilities is held (at 13,330 labels a dense row is 53 kB).
            Ties go to the lower label index (as in :meth:`predict_topk` and
            :func:`bayesmlc.metrics.topk`); ``top_k`` above ``n_labels_`` is lowered to it. The
            ranking is by probability: for a model whose ``decision_function`` ranks otherwise
            (MLGPF with ``rank_by="mean"``) :meth:`predict_topk` may choose other labels.

        Returns
        -------
        ndarray of float32, shape (n_samples, n_labels), when ``top_k`` is None; otherwise a
        ``scipy.sparse.csr_matrix`` of float32, shape (n_samples, n_labels), with exactly
        ``min(top_k, n_labels_)`` stored entries per row (their probabilities, zeros included, in
        ascending column order; every other entry is absent).
        """
        with self._computing_threads():
            if top_k is not None:
                return self._top_probabilities(X, top_k)
            proba = self._batched(X, self._predict_proba, getattr(self, "label_prior_", None))
            if self._conditions_on_a_label:
                proba = at_least_one_label(proba)
            return proba

    def _top_probabilities(self, X, top_k) -> sp.csr_matrix:
        """``predict_proba(X, top_k=top_k)``: :meth:`_top_probability_arrays` as a CSR matrix."""
        return _topk_csr(*self._top_probability_arrays(X, top_k), self.n_labels_)

    def _top_probability_arrays(self, X, top_k) -> tuple[np.ndarray, np.ndarray]:
        """Each row's ``top_k`` most probable labels (int64, best first, ties to the lower label index)
        and their probabilities (float32), both (n, min(top_k, n_labels_)): the dense probabilities
        of one batch of rows at a time, cut to the largest."""
        k = self._checked_k(top_k, "top_k")
        X = self._validated(X)
        indices = np.empty((X.shape[0], k), dtype=np.int64)
        values = np.empty((X.shape[0], k), dtype=np.float32)
        for rows in iter_batches(X.shape[0], PREDICT_BATCH_ROWS):
            indices[rows], values[rows] = topk(self.predict_proba(X[rows]), k)
        return indices, values

    def _checked_k(self, k, name: str = "k") -> int:
        """A positive integer ``k`` (named ``name`` in the error), lowered to ``n_labels_``."""
        self._check_is_fitted()
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValidationError(f"{name} must be a positive integer, got {k!r}")
        return min(int(k), self.n_labels_)

    def score_and_proba(self, X, return_labels: bool = False):
        """``(decision_function(X), predict_proba(X))``, equal to what the two methods return, from
        one pass of the model over each batch of rows (:meth:`_scores_and_proba`); with
        ``return_labels``, ``predict(X)`` as a third element, derived from the probabilities by the
        model's own rule. This is how :func:`bayesmlc.evaluation.evaluate_model` scores a test set.

        Returns
        -------
        scores, proba : ndarray of float32, shape (n_samples, n_labels)
        labels : sparse 0/1 CSR, shape (n_samples, n_labels), only with ``return_labels``
        """
        with self._computing_threads():
            X = self._validated(X)
            scores = np.empty((X.shape[0], self.n_labels_), dtype=np.float32)
            proba = np.empty_like(scores)
            for rows in iter_batches(X.shape[0], self._prediction_rows()):
                block = X[rows]
                for out, values in zip((scores, proba), self._scores_and_proba(block)):
                    out[rows] = self._checked_block(values, block.shape[0])
            if self.empty_labels_.size:
                scores[:, self.empty_labels_] = self._prior_logit()[self.empty_labels_]
                proba[:, self.empty_labels_] = self.label_prior_[self.empty_labels_]
            if self._conditions_on_a_label:
                proba = at_least_one_label(proba)
            if not return_labels:
                return scores, proba
            return scores, proba, self._labels_from_proba(proba, X)

    def predict(self, X, threshold=0.5, top_k: int | None = None) -> sp.csr_matrix:
        """Sparse 0/1 predictions: labels with probability >= ``threshold``, or the ``top_k`` best
        (by :meth:`decision_function`, as :meth:`predict_topk`).

        ``threshold``: one number in [0, 1] for every label, or an array-like of ``n_labels_``
        numbers in [0, 1], one per label column (tuned per label, for example); anything else is a
        ``ValidationError`` naming ``threshold`` (:func:`check_threshold`).
        """
        with self._computing_threads():
            if top_k is not None:
                indices, _ = self.predict_topk(X, top_k)
                n, k = indices.shape
                return sp.csr_matrix(
                    (np.ones(n * k, dtype=np.float32), indices.ravel(), np.arange(0, n * k + 1, k)),
                    shape=(n, self.n_labels_),
                )
            self._check_is_fitted()
            threshold = check_threshold(threshold, self.n_labels_)
            X = self._validated(X)
            parts = []
            for rows in iter_batches(X.shape[0], PREDICT_BATCH_ROWS):
                parts.append(_labels_at_threshold(self.predict_proba(X[rows]), threshold))
            if not parts:
                return sp.csr_matrix((0, self.n_labels_), dtype=np.float32)
            return sp.vstack(parts, format="csr")

    def predict_topk(self, X, k: int = 5, batch_size: int = PREDICT_BATCH_ROWS):
        """The ``k`` highest-scoring labels per row, best first (ties to the lower label index),
        one batch of scores at a time.

        Returns
        -------
        indices : ndarray of int64, shape (n_samples, k)
        scores : ndarray of float32, shape (n_samples, k)
        """
        with self._computing_threads():
            k = self._checked_k(k)
            X = self._validated(X)
            indices = np.empty((X.shape[0], k), dtype=np.int64)
            scores = np.empty((X.shape[0], k), dtype=np.float32)
            for rows in iter_batches(X.shape[0], batch_size):
                # ties go to the lower label index, as in bayesmlc.metrics.topk
                indices[rows], scores[rows] = topk(self.decision_function(X[rows]), k)
            return indices, scores

    def score(self, X, y) -> float:
        """Precision at 1 on (X, y), the field's headline number; ``y`` is the (n, L) 0/1 label
        matrix, dense or sparse (named ``y`` as scikit-learn's model selection passes it)."""
        with self._computing_threads():
            scores = self.decision_function(X)  # X is checked before y, as in scikit-learn
            return float(precision_at_k(y, scores, k=1))

    # ---- persistence ------------------------------------------------------------------------
    def save(self, path) -> None:
        """Save the fitted model to ``path`` (a versioned ``.npz`` archive, no pickle)."""
        self._check_is_fitted()
        from . import __version__

        persistence.save_model(path, self, __version__)

    @classmethod
    def load(cls, path, allow_native: bool = False):
        """Load a model saved by :meth:`save`. ``MultiLabelEstimator.load`` accepts any model;
        ``Model.load`` checks that the file holds a ``Model``. ``allow_native``: load a napkinXC or
        omikuji baseline, whose embedded files a native library reads (only from files you trust;
        :func:`bayesmlc.persistence.load_model`)."""
        model = persistence.load_model(path, allow_native=allow_native)
        if not isinstance(model, cls):
            raise ModelFormatError(f"{path}: holds a {type(model).__name__}, not a {cls.__name__}")
        return model
