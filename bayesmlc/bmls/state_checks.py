"""BMLS's declared fitted fields (:func:`bayesmlc.fitted_state.check_fitted_state`): shapes over
``L`` (labels), ``D`` (features; ``log_h_`` has a bias row more), ``K`` (topics) and ``S`` (kept
draws)."""

from __future__ import annotations

from ..exceptions import ModelFormatError
from ..fitted_state import Field, array, choice, integer, number, rule
from ..state_checks import COMMON_FIELDS, support_term_fields

__all__ = ["BMLS_FIELDS"]


def _with_bias(dims) -> int:
    return dims["D"] + 1


def _topics_agree(model, dims) -> None:
    stored = getattr(model, "n_topics_", dims["K"])  # files written before n_topics_ existed: phi_'s
    if stored != dims["K"]:
        raise ModelFormatError(f"n_topics_ is {stored} but phi_ holds {dims['K']} topics")


def _draws_kept(model, dims) -> None:
    if model.predictor_ == "draws" and dims["S"] == 0:
        raise ModelFormatError("predictor_ 'draws' needs kept draws, phi_samples_ holds none")


#: :class:`bayesmlc.bmls.BMLS`; the draws are float16 and only summed (an overflow there is not a
#: crafted file's doing), so their finiteness is left to the probe
BMLS_FIELDS = COMMON_FIELDS + (
    choice("predictor_", ("moments", "draws")),
    array("phi_", ("L", "K"), low=0.0),
    integer("n_topics_", 1, optional=True),
    rule("n_topics_", _topics_agree),
    array("log_h_", (_with_bias, "K")),
    array("log_h_var_", (_with_bias, "K"), low=0.0),
    array("phi_samples_", ("S", "L", "K"), finite=False),
    array("log_h_samples_", ("S", _with_bias, "K"), finite=False),
    rule("phi_samples_", _draws_kept),
    array("topic_usage_", ("K",), low=0.0),
    array("feature_thresholds_", ("D",), optional=True, nullable=True),
    array("cooccurrence_weights_", ("K",), low=0.0, optional=True),
    *support_term_fields(("support_shape_", "support_rate_"), (0.0, 0.0)),
    number("beta0_", 0.0),
    integer("n_sweeps_", 0),
    integer("n_burnin_", 0),
    integer("n_collected_", 0),
    Field(path=("sweep_step_seconds_",), kind="mapping", optional=True),
    Field(path=("schedule_trace_",), kind="mapping", optional=True),
)
