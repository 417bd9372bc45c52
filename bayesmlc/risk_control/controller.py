""":class:`RiskController`: label sets with a guarantee, for any fitted bayesmlc estimator.

The controller holds an estimator and one threshold on its probabilities, calibrated on rows the
estimator was not fitted on (:mod:`bayesmlc.risk_control.procedures` for the risks, the procedures and
their exchangeability assumption). ``predict`` returns per row, as a CSR 0/1 matrix, the labels among
the row's ``top_k`` most probable whose probability is >= the threshold (``risk="selective"``: the top
label when its probability is, else nothing: the row is abstained on). Everything works from each
row's ``top_k`` candidates, O(rows x top_k) memory; probabilities and scores are the estimator's own.

Example
-------
>>> from bayesmlc import LogisticRegression
>>> from bayesmlc.risk_control import RiskController
>>> controller = RiskController(LogisticRegression(), risk="recall", alpha=0.1, random_state=0)
>>> sets = controller.fit(X, Y).predict(X_test)          # doctest: +SKIP
>>> controller.threshold_, controller.feasible_         # doctest: +SKIP
"""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp
from sklearn.base import clone

from ..base import PREDICT_BATCH_ROWS, MultiLabelEstimator
from ..exceptions import ModelFormatError, ValidationError
from ..fitted_state import Field, array, check_fitted_state, integer, number, rule
from ..metrics import topk
from ..parameters import InstanceOf, Integer, Options, Real
from ..state_checks import COMMON_FIELDS
from ..utils import iter_batches
from .candidates import candidates_from_model
from .evaluation import realised
from .procedures import FWER_PROCEDURES, METHODS, RCPS_BOUNDS, RISKS, calibrate_threshold

__all__ = ["RiskController", "RISK_CONTROL_FIELDS"]


def _threshold_in_range(model, dims) -> None:
    """``threshold_`` is a probability in [0, 1], or ``inf`` (no label)."""
    threshold = model.threshold_
    if (isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.floating))
            or not (0.0 <= threshold <= 1.0 or threshold == np.inf)):
        raise ModelFormatError(f"threshold_ must be a number in [0, 1] or inf, got {str(threshold)[:40]!r}")


def _feasible_flag(model, dims) -> None:
    if not isinstance(model.feasible_, (bool, np.bool_)):
        raise ModelFormatError(f"feasible_ must be true or false, got {str(model.feasible_)[:40]!r}")


def _method_of_risk(model, dims) -> None:
    if model.method_ not in METHODS.get(model.risk, ()):
        raise ModelFormatError(f"method_ must be a method of the {model.risk} risk, got {str(model.method_)[:40]!r}")


#: the fitted fields of :class:`RiskController` (checked at load, :mod:`bayesmlc.fitted_state`)
RISK_CONTROL_FIELDS = COMMON_FIELDS + (
    Field(path=("estimator_",), kind="estimator"),
    rule("threshold_", _threshold_in_range),
    rule("feasible_", _feasible_flag),
    rule("method_", _method_of_risk),
    number("calibration_risk_", 0.0, high=1.0),
    integer("n_calibration_rows_", 0),
    array("calibration_rows_", (None,), dtype="iu", low=0),
    number("calibration_seconds_", 0.0, optional=True),
)


class RiskController(MultiLabelEstimator):
    """An estimator whose ``predict`` returns label sets with a guaranteed risk.

    Parameters
    ----------
    estimator : a bayesmlc estimator
        ``fit`` fits a clone on the rows not held out; :meth:`calibrate` takes it already fitted.
    risk : "recall", "precision" or "selective"
    alpha : float in (0, 1)
        The risk level: recall >= 1 - alpha, precision >= 1 - alpha, or accuracy of the answered rows
        >= 1 - alpha.
    delta : float in (0, 1)
        The high-probability methods (RCPS, LTT) hold with probability >= 1 - delta over the
        calibration rows; CRC bounds the expected risk and ignores it.
    method : None, "crc", "rcps" or "ltt"
        None: "crc" for recall, "ltt" for precision and selective.
    bound : "hb", "hoeffding" or "bernstein"
        RCPS's upper confidence bound.
    fwer : "fixed_sequence" or "holm"
        LTT's multiple-testing procedure over :data:`~bayesmlc.risk_control.procedures.DEFAULT_GRID`.
    n_starts : int >= 1 or None
        Fixed-sequence chains (None: :data:`~bayesmlc.risk_control.procedures.DEFAULT_STARTS`).
    top_k : int >= 1
        Candidates per row; a true label outside them is always missed (recall).
    calibration_fraction : float in (0, 1)
        ``fit``: the share of the rows held out, chosen at random by ``random_state``, to calibrate on.
    empty_set_loss : float in [0, 1]
        The precision loss of a set with no observed label (0: false discovery rate convention).
    random_state : int or None

    Fitted attributes
    -----------------
    estimator_ : the fitted estimator
    threshold_ : float, labels with probability >= it are in the set (``inf``: none)
    feasible_ : bool, whether the target was met on the calibration rows (False: no guarantee)
    method_ : str, the method used
    calibration_risk_ : float, the empirical risk of the calibration rows at ``threshold_``
    n_calibration_rows_ : int
    calibration_rows_ : ndarray of int, the training rows held out by ``fit`` (empty after ``calibrate``)
    calibration_seconds_ : float, wall time of predicting the calibration rows' candidates and choosing the threshold
    """

    _parameter_constraints = {
        "estimator": [InstanceOf(MultiLabelEstimator, "a bayesmlc estimator")],
        "risk": [Options(*RISKS)],
        "alpha": [Real(0, 1, low_open=True, high_open=True)],
        "delta": [Real(0, 1, low_open=True, high_open=True)],
        "method": [None, Options("crc", "rcps", "ltt")],
        "bound": [Options(*RCPS_BOUNDS)],
        "fwer": [Options(*FWER_PROCEDURES)],
        "n_starts": [None, Integer(1)],
        "top_k": [Integer(1)],
        "calibration_fraction": [Real(0, 1, low_open=True, high_open=True)],
        "empty_set_loss": [Real(0, 1)],
        "random_state": [None, Integer()],
    }

    def __init__(self, estimator=None, risk="recall", alpha=0.1, delta=0.1, method=None, bound="hb",
                 fwer="fixed_sequence", n_starts=None, top_k=100, calibration_fraction=0.2, empty_set_loss=0.0,
                 random_state=None):
        self.estimator = estimator
        self.risk = risk
        self.alpha = alpha
        self.delta = delta
        self.method = method
        self.bound = bound
        self.fwer = fwer
        self.n_starts = n_starts
        self.top_k = top_k
        self.calibration_fraction = calibration_fraction
        self.empty_set_loss = empty_set_loss
        self.random_state = random_state

    # ---- fitting ----------------------------------------------------------------------------
    def _resolved_method(self) -> str:
        method = METHODS[self.risk][0] if self.method is None else self.method
        if method not in METHODS[self.risk]:
            raise ValidationError(f"method={method!r} does not control the {self.risk} risk; use "
                                  f"{' or '.join(METHODS[self.risk])}")
        return method

    def _fit(self, X, Y, label_mask, **fit_params):
        self._resolved_method()
        n = X.shape[0]
        n_held_out = int(round(self.calibration_fraction * n))
        if n_held_out < 1 or n_held_out >= n:
            raise ValidationError(f"calibration_fraction={self.calibration_fraction} of n_samples={n} rows leaves no "
                                  f"rows to {'calibrate on' if n_held_out < 1 else 'train on'}")
        order = np.random.RandomState(self.random_state).permutation(n)
        held_out, kept = np.sort(order[:n_held_out]), np.sort(order[n_held_out:])
        model = clone(self.estimator)
        model.fit(X[kept], Y[kept], None if label_mask is None else label_mask[kept], **fit_params)
        self.estimator_ = model
        self._calibrate_on(X[held_out], Y[held_out], None if label_mask is None else label_mask[held_out])
        self.calibration_rows_ = held_out.astype(np.int64)
        self.history_ = {key: list(values) for key, values in getattr(model, "history_", {}).items()}

    def calibrate(self, X, Y, label_mask=None):
        """Calibrate the threshold of the already fitted ``estimator`` on held-out rows (X, Y), which
        it must not have been fitted on. ``estimator_`` is then ``estimator`` itself (not a copy).

        Returns
        -------
        self
        """
        from ..validation import check_fit_inputs

        with self._computing_threads():
            from ..parameters import check_parameters

            check_parameters(self)
            self._resolved_method()
            model = self.estimator
            if not hasattr(model, "n_labels_"):
                raise ValidationError("calibrate needs a fitted estimator; call fit(X, Y) to fit and calibrate")
            X, Y, label_mask = check_fit_inputs(X, Y, label_mask, estimator_name=type(self).__name__)
            if Y.shape[1] != model.n_labels_:
                raise ValidationError(f"Y has {Y.shape[1]} labels, the estimator {model.n_labels_}")
            for name in ("n_features_in_", "n_labels_", "label_frequencies_", "label_prior_", "empty_labels_",
                         "feature_names_in_", "label_names_"):
                if hasattr(model, name):
                    setattr(self, name, getattr(model, name))
            self.estimator_ = model
            self._calibrate_on(X, Y, label_mask)
            self.calibration_rows_ = np.zeros(0, dtype=np.int64)
            self.history_ = {key: list(values) for key, values in getattr(model, "history_", {}).items()}
            return self

    def _calibrate_on(self, X, Y, label_mask) -> None:
        start = time.perf_counter()
        candidates = candidates_from_model(self.estimator_, X, Y, self.top_k, label_mask)
        method = self._resolved_method()
        chosen = calibrate_threshold(candidates, self.risk, self.alpha, self.delta, method, bound=self.bound,
                                     fwer=self.fwer, empty_set_loss=self.empty_set_loss, n_starts=self.n_starts)
        self.method_ = method
        self.threshold_ = float(chosen.threshold)
        self.feasible_ = bool(chosen.feasible)
        self.calibration_risk_ = float(chosen.empirical_risk)
        self.n_calibration_rows_ = int(candidates.n_rows)
        self.calibration_seconds_ = time.perf_counter() - start

    # ---- prediction -------------------------------------------------------------------------
    def _decision_function(self, X) -> np.ndarray:
        return self.estimator_.decision_function(X)

    def _predict_proba(self, X) -> np.ndarray:
        return self.estimator_.predict_proba(X)

    def _scores_and_proba(self, X):
        return self.estimator_.score_and_proba(X)

    def _sets_from_proba(self, proba: np.ndarray) -> sp.csr_matrix:
        """The label sets (CSR 0/1 float32) of rows with dense probabilities ``proba`` (b, L)."""
        k = 1 if self.risk == "selective" else min(int(self.top_k), self.n_labels_)
        labels, values = topk(proba, k)
        keep = values >= self.threshold_
        rows = np.repeat(np.arange(proba.shape[0]), k).reshape(labels.shape)
        return sp.csr_matrix((np.ones(np.count_nonzero(keep), dtype=np.float32), (rows[keep], labels[keep])),
                             shape=(proba.shape[0], self.n_labels_))

    def _labels_from_proba(self, proba: np.ndarray, X) -> sp.csr_matrix:
        return self._sets_from_proba(proba)

    def predict(self, X) -> sp.csr_matrix:
        """The label sets: CSR 0/1 float32 (n_samples, n_labels), per row the labels among its ``top_k``
        most probable with probability >= ``threshold_`` (selective: the top label, or none)."""
        self._check_is_fitted()
        X = self._validated(X)
        parts = [self._sets_from_proba(self.predict_proba(X[rows])) for rows in iter_batches(X.shape[0],
                                                                                             PREDICT_BATCH_ROWS)]
        if not parts:
            return sp.csr_matrix((0, self.n_labels_), dtype=np.float32)
        return sp.vstack(parts, format="csr")

    def evaluate(self, X, Y, label_mask=None) -> dict:
        """On test rows (X, Y): ``realised_risk``, ``mean_set_size`` and ``coverage`` of the sets
        (:func:`bayesmlc.risk_control.evaluation.realised`)."""
        self._check_is_fitted()
        candidates = candidates_from_model(self, self._validated(X), Y, self.top_k, label_mask)
        return realised(candidates, self.risk, self.threshold_, self.empty_set_loss)

    def summary(self) -> dict:
        """The calibration as the CLI's JSON reports it: ``risk``, ``alpha``, ``delta``, ``method``,
        ``threshold`` (None for no label), ``feasible``, ``top_k``, ``calibration_rows``."""
        self._check_is_fitted()
        return {"risk": self.risk, "alpha": float(self.alpha), "delta": float(self.delta), "method": self.method_,
                "threshold": self.threshold_ if np.isfinite(self.threshold_) else None, "feasible": self.feasible_,
                "top_k": int(self.top_k), "calibration_rows": self.n_calibration_rows_}

    # ---- persistence: the estimator is nested (bayesmlc.persistence) ------------------------
    def _fitted_members(self) -> list:
        return [("estimator_", self.estimator_)]

    def _check_fitted_state(self) -> None:
        check_fitted_state(self, RISK_CONTROL_FIELDS)
