"""The declared fitted fields of the models outside the model subpackages, one table per class
(:func:`bayesmlc.fitted_state.check_fitted_state` evaluates them at load): every estimator's own
fields (:data:`COMMON_FIELDS`), the feature preprocessor, logistic regression, the kNN and
file-backed baselines, the averaging ensemble and the calibration wrapper. Shapes use the symbols
``D`` (features), ``L`` (labels) and others bound by the first field that has them."""

from __future__ import annotations

import numpy as np

from .exceptions import ModelFormatError
from .fitted_state import Field, array, check_array, integer, number, rule, sparse

__all__ = ["COMMON_FIELDS", "PREPROCESSOR_FIELDS", "LOGISTIC_FIELDS", "KNN_FIELDS", "FILE_BACKED_FIELDS",
           "ENSEMBLE_FIELDS", "CALIBRATION_FIELDS", "support_term_fields"]


def _fitted_preprocessor(model, dims) -> None:
    preprocessor = getattr(model, "preprocessor_", None)
    if preprocessor is None:
        return
    cls = type(preprocessor)  # by name: bayesmlc.preprocessing imports this module
    if (cls.__module__, cls.__name__) != ("bayesmlc.preprocessing", "FeaturePreprocessor") \
            or not hasattr(preprocessor, "n_features_in_"):
        raise ModelFormatError(f"preprocessor_ must be a fitted FeaturePreprocessor, got {type(preprocessor).__name__}")
    if preprocessor.n_features_in_ != dims["D"]:
        raise ModelFormatError(f"preprocessor_ has {preprocessor.n_features_in_} features, the model {dims['D']}")


def support_term_fields(value_names: tuple[str, str], value_lows: tuple) -> tuple:
    """The fields of a per-label support term: ``support_columns_`` (L, S) feature indices (-1 pads)
    and the two (L, S) arrays ``value_names`` (each >= its ``value_lows`` entry, None: unbounded), all three present
    with one shape or all None (absent from files written before the term)."""
    names = ("support_columns_", *value_names)

    def one_shape(model, dims) -> None:
        parts = [getattr(model, name, None) for name in names]
        if any(part is None for part in parts) != all(part is None for part in parts) or (
                parts[0] is not None and not parts[0].shape == parts[1].shape == parts[2].shape):
            raise ModelFormatError(f"{', '.join(names[:2])} and {names[2]} must be three arrays of one shape (L, K), "
                                   "or all None")

    return (array("support_columns_", ("L", None), dtype="iu", low=-1, high=lambda dims: dims["D"] - 1, nullable=True,
                  optional=True),
            *(array(name, ("L", None), low=low, nullable=True, optional=True)
              for name, low in zip(value_names, value_lows)),
            rule("support_columns_", one_shape))


def _history_field(name: str, optional: bool = True) -> Field:
    return Field(path=(name,), kind="mapping", optional=optional)


#: what every fitted bayesmlc estimator has (:class:`bayesmlc.base.MultiLabelEstimator`)
COMMON_FIELDS = (
    integer("n_features_in_", 0, binds="D"),
    integer("n_labels_", 1, binds="L"),
    array("label_frequencies_", ("L",), dtype="iu", low=0),
    array("label_prior_", ("L",), low=0.0, high=1.0, low_open=True, high_open=True),
    array("empty_labels_", (None,), dtype="iu", low=0, high=lambda dims: dims["L"] - 1),
    Field(path=("feature_names_in_",), kind="strings", shape=("D",), optional=True),
    Field(path=("label_names_",), kind="strings", shape=("L",), optional=True),
    _history_field("history_"),
    Field(path=("preprocessor_",), kind="any", optional=True),
    rule("preprocessor_", _fitted_preprocessor),
)

def _standardized_flag(state: dict) -> None:
    flag = state.get("standardized_")
    if not isinstance(flag, bool) or flag != (state.get("scale_") is not None):
        raise ModelFormatError("FeaturePreprocessor standardized_ must be True exactly when scale_ is set")


#: :class:`bayesmlc.preprocessing.FeaturePreprocessor`'s state (checked in its ``_set_state``, on the
#: mapping the file holds, before anything is converted); idf weights log((1 + N) / (1 + df)) + 1 >= 1
PREPROCESSOR_FIELDS = (
    integer("n_features_in_", 0, binds="D", label="FeaturePreprocessor n_features_in_"),
    rule("standardized_", lambda state, dims: _standardized_flag(state)),
    array("mean_", ("D",), nullable=True, label="FeaturePreprocessor mean_"),
    array("scale_", ("D",), low=0.0, low_open=True, nullable=True, label="FeaturePreprocessor scale_"),
    array("idf_", ("D",), low=0.0, low_open=True, nullable=True, label="FeaturePreprocessor idf_"),
)

#: :class:`bayesmlc.linear.LogisticRegression`
LOGISTIC_FIELDS = COMMON_FIELDS + (
    array("coef_", ("D", "L")),
    array("intercept_", ("L",)),
    integer("n_iter_", 0),
)


def _has_training_rows(model, dims) -> None:
    if dims.get("N") == 0:
        raise ModelFormatError("train_features_ must hold at least one training row")


#: :class:`bayesmlc.baselines.KNNBaseline`: its training rows (N) and their labels
KNN_FIELDS = COMMON_FIELDS + (
    sparse("train_features_", ("N", "D")),
    rule("train_features_", _has_training_rows),
    sparse("train_labels_", ("N", "L")),
    sparse("train_mask_", ("N", "L"), nullable=True),
)


def _library_files(model, dims) -> None:
    model._check_model_files()  # what the library's format declares, against the bytes present


#: napkinXC and omikuji (:class:`bayesmlc.baselines._FileBackedModel`): the library's files, as bytes
FILE_BACKED_FIELDS = COMMON_FIELDS + (
    Field(path=("model_files_",), kind="files"),
    rule("model_files_", _library_files),
)


def _members(model, dims) -> None:
    members = model.estimators_
    if not isinstance(members, list) or not members:
        raise ModelFormatError("estimators_ must be a non-empty list of fitted estimators")
    dims["M"] = len(members)


def _some_weight(model, dims) -> None:
    if not model.weights_.sum() > 0:
        raise ModelFormatError("weights_ must not all be zero")


#: :class:`bayesmlc.ensemble.AveragingEnsemble`: M members (checked as fitted members), their weights
ENSEMBLE_FIELDS = COMMON_FIELDS + (
    Field(path=("estimators_",), kind="any"),
    rule("estimators_", _members),
    Field(path=("named_estimators_",), kind="any", optional=True),
    array("weights_", ("M",), low=0.0),
    rule("weights_", _some_weight),
    array("fit_seconds_", ("M",), low=0.0, optional=True),
)


def check_calibration_map(name: str, calibration_map, method: str) -> None:
    """An isotonic map: (2, m) thresholds x non-decreasing, g(x) in [0, 1]; a temperature or Platt
    map: two finite floats."""
    if method == "isotonic":
        check_array(name, calibration_map, (2, None))
        x, g = calibration_map
        if x.size == 0 or np.any(np.diff(x) < 0) or g.min() < 0 or g.max() > 1:
            raise ModelFormatError(f"{name} must be isotonic thresholds: x non-decreasing, g(x) in [0, 1]")
    else:
        check_array(name, calibration_map, (2,))


def _calibration_maps(model, dims) -> None:
    check_calibration_map("global_map_", model.global_map_, model.method)
    if not isinstance(model.label_maps_, list) or len(model.label_maps_) != dims["C"]:
        shown = len(model.label_maps_) if isinstance(model.label_maps_, list) else type(model.label_maps_).__name__
        raise ModelFormatError(f"label_maps_ must hold one map per calibrated label ({dims['C']}), got {shown}")
    for i, calibration_map in enumerate(model.label_maps_):
        check_calibration_map(f"label_maps_[{i}]", calibration_map, model.method)
    if np.unique(model.calibrated_labels_).size != dims["C"]:
        raise ModelFormatError("calibrated_labels_ must not name a label twice")


#: :class:`bayesmlc.calibration.CalibratedClassifier`: the fitted estimator (a fitted member), the
#: global map and one map per calibrated label (C of them)
CALIBRATION_FIELDS = COMMON_FIELDS + (
    Field(path=("estimator_",), kind="any"),
    array("calibrated_labels_", ("C",), dtype="iu", low=0, high=lambda dims: dims["L"] - 1),
    Field(path=("global_map_",), kind="any"),
    Field(path=("label_maps_",), kind="any"),
    rule("label_maps_", _calibration_maps),
    number("fit_seconds_", 0.0, optional=True),
    number("calibration_seconds_", 0.0, optional=True),
    array("calibration_rows_", (None,), dtype="iu", low=0, optional=True),
)
