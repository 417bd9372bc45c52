"""BNMC's declared fitted fields (:func:`bayesmlc.fitted_state.check_fitted_state`): shapes over
``L`` (labels), ``D`` (features), ``K`` (the mixture's truncation), ``E`` (the emission's feature
columns), ``F`` (the classifiers' inputs) and ``S`` (kept classifier draws). The mixture's and the
SGD classifier's states live in private objects after loading; the table reaches them by path and
names them as the file does (``mixture_state['emission.kappa']``)."""

from __future__ import annotations

from ..exceptions import ModelFormatError
from ..fitted_state import Field, array, choice, integer, number, rule
from ..state_checks import COMMON_FIELDS, support_term_fields
from .classifier_fitting import CLASSIFIER_CHOICES, FEATURE_WEIGHTINGS
from .label_sets import COUNT_RULES

__all__ = ["BNMC_FIELDS", "RANK_TERMS"]

#: the rank terms of the calibrated probability, in the order of RankTerms (files written before one
#: existed load it as 0)
RANK_TERMS = ("top_label_offset_", "top_label_slope_", "top_label_runner_up_", "second_label_offset_",
              "second_label_slope_", "next_labels_offset_", "next_labels_slope_")
_SOLVERS = ("dense", "woodbury", "cg", "lowrank", "sgd")


def _mixture(key, shape, **spec) -> Field:
    path = ("_mixture", "emission", key.split(".", 1)[1]) if key.startswith("emission.") else ("_mixture", key)
    return array(path, shape, label=f"mixture_state[{key!r}]", **spec)


def _emission_prior(key, **spec) -> Field:
    return Field(path=("_mixture", "emission", key), kind="number", label=f"mixture_state['emission.{key}']",
                 low=0.0, low_open=True, optional=True, **spec)


def _sgd(key, kind="array", **spec) -> Field:
    return Field(path=("_sgd", key), kind=kind, label=f"sgd_state[{key!r}]", **spec)


def _top_label_map(model, dims) -> None:
    top_map = getattr(model, "top_label_map_", None)
    if top_map is not None and top_map[:2].min() < 0:
        raise ModelFormatError("top_label_map_ must be three finite numbers, the first two >= 0")


def _sgd_present(model, dims) -> None:
    if getattr(model, "_sgd", None) is not None:
        from ..fitted_state import check_fields

        check_fields(model, _SGD_FIELDS, dims)


_SGD_FIELDS = (
    _sgd("W", shape=("F", "L")),
    _sgd("W_avg", shape=("F", "L")),
    _sgd("steps", kind="integer", low=0),
    _sgd("n_averaged", kind="integer", low=0),
    _sgd("alpha", kind="number", low=0.0, low_open=True),
)

#: :class:`bayesmlc.bnmc.BNMC` (optional fields: files written before they existed)
BNMC_FIELDS = COMMON_FIELDS + (
    choice("emission_", ("dirichlet", "gaussian")),
    array("observed_counts_", ("L",), dtype="iu", low=0, optional=True),
    array("count_sums_", (3,), low=0.0),
    number("label_count_mean_", 0.0),
    number("label_count_std_", 0.0),
    integer("n_seen_", 0),
    integer("svi_steps_", 0),
    number("weight_precision_", 0.0, low_open=True),
    integer("calibration_folds_", 0, optional=True),
    choice("classifier_", CLASSIFIER_CHOICES, optional=True),
    choice("feature_weighting_", FEATURE_WEIGHTINGS, optional=True),
    array("evidence_weights_", (3,)),  # (a, b, d); files written before the rename: calibration_
    array("probability_evidence_weights_", (3,), optional=True),
    *(number(name, optional=True) for name in RANK_TERMS),
    number("top_label_offset_", 0.0, optional=True),
    array("top_label_map_", (3,), optional=True),
    rule("top_label_map_", _top_label_map),
    number("threshold_", 0.0),
    choice("count_rule_", COUNT_RULES),
    choice("solver_", _SOLVERS),
    array("pattern_weights_", ("K",), low=0.0),
    integer("n_patterns_", 0, high=lambda dims: dims["K"]),
    array("label_share_", ("L",), low=0.0),
    array("classifier_basis_", ("D", None), nullable=True),
    array("classifier_samples_", ("S", "F", "L"), nullable=True),
    array("classifier_variances_", ("F", "L"), low=0.0, nullable=True),
    array("classifier_trace_", (None,), finite=False),
    *support_term_fields(("support_means_", "support_variances_"), (None, 0.0)),
    _mixture("label_conc", ("K", "L"), low=0.0, low_open=True),
    _mixture("stick_a", (lambda dims: dims["K"] - 1,), low=0.0, low_open=True),
    _mixture("stick_b", (lambda dims: dims["K"] - 1,), low=0.0, low_open=True),
    _mixture("emission.conc", ("K", "E"), low=0.0, low_open=True, optional=True),
    _mixture("emission.kappa", ("K", "E"), low=0.0, low_open=True, optional=True),
    _mixture("emission.h", ("K", "E"), optional=True),
    _mixture("emission.twice_shape", ("K", "E"), low=0.0, low_open=True, optional=True),
    _mixture("emission.g", ("K", "E"), optional=True),
    _mixture("emission.mean0", ("E",), optional=True),
    _mixture("emission.rate0", ("E",), low=0.0, low_open=True, optional=True),
    _emission_prior("kappa0"),
    _emission_prior("shape0"),
    rule("sgd_state", _sgd_present),
)
