"""Post-hoc calibration of any bayesmlc estimator on held-out rows.

:class:`CalibratedClassifier` fits a clone of an estimator on part of the training rows and, on the
rows held out, a map from the estimator's predicted probabilities to calibrated ones. This is the repair
that Ullah, Schultheis, Zhang and Babbar ("How Well Calibrated are Extreme Multi-label Classifiers?",
arXiv 2411.04276) apply to extreme multi-label classifiers: isotonic regression fitted on the held-out
top-k predictions. Three maps:

``isotonic``
    scikit-learn's ``IsotonicRegression`` of is-relevant on the predicted probability (non-decreasing,
    in [0, 1]), applied by linear interpolation between its thresholds. Below the smallest fitted
    probability p_0 the map is ``g(p_0) p / p_0`` (a straight line to 0), so the probabilities of
    labels far below any top-k prediction stay small and ordered; above the largest it is constant.
``temperature``
    ``sigmoid(logit(p) / T)`` with one T > 0 minimising the binary log-loss (Guo et al. 2017, on
    logits; fitted by 1-D bounded minimisation over log T).
``platt``
    ``sigmoid(a logit(p) + b)`` with a > 0 and b minimising the binary log-loss (Platt 1999).

**Which pairs.** The *global* map is fitted on the held-out (probability, is-relevant) pairs of each
row's ``top_k`` best labels, over all labels at once (unobserved pairs under ``label_mask`` are left
out). It is non-decreasing, so it keeps the order of every row's probabilities (strictly for
temperature and Platt scaling; isotonic regression may tie neighbours).

**Ties.** The isotonic map is a step function: every raw probability within one step gets the
same calibrated value, so labels of a row often share one (``bayesmlc predict`` may print 0.14604
three times). The calibrated values never decide the order: ``decision_function`` is the wrapped
estimator's, so :meth:`~bayesmlc.base.MultiLabelEstimator.predict_topk`, ``predict(top_k=k)``, the
ranking metrics and ``bayesmlc predict`` list tied labels in the order of their raw scores (equal
raw scores: the lower label index first). ``predict_proba(X, top_k=k)`` chooses by the calibrated
probability, ties to the lower label index, so where a tie straddles the k-th place it may keep
other labels than ``predict_topk``. Temperature and Platt scaling are strictly increasing and tie
nothing the raw probabilities did not.

**Per label.** A label gets a map of its own, fitted on *all* its held-out entries, when those
entries hold at least ``min_label_positives`` positives and as many negatives; every other label uses
the global map. ``min_label_positives=None`` turns per-label maps off. Per-label maps are monotone in
each label, but they can reorder labels within a row: ranking always uses the wrapped estimator's
scores (``decision_function`` is the estimator's own), so P@k, nDCG@k and PSP@k are those of the
estimator trained on the ``1 - calibration_fraction`` share of the rows, or with ``cv`` (cross-fitting)
on all of them.

Example
-------
>>> from bayesmlc import LogisticRegression
>>> from bayesmlc.calibration import CalibratedClassifier
>>> model = CalibratedClassifier(LogisticRegression(), method="isotonic", random_state=0)
>>> model.fit(X, Y).predict_proba(X_test)  # doctest: +SKIP
"""

from __future__ import annotations

import time

import numpy as np
from scipy.optimize import minimize, minimize_scalar
from sklearn.base import clone
from sklearn.isotonic import IsotonicRegression

from .base import PREDICT_BATCH_ROWS, MultiLabelEstimator
from .exceptions import ValidationError
from .fitted_state import check_fitted_state
from .state_checks import CALIBRATION_FIELDS
from .metrics import topk
from .parameters import InstanceOf, Integer, Options, Real
from .utils import iter_batches, logit, sigmoid

__all__ = ["CalibratedClassifier", "CALIBRATION_METHODS", "check_calibration_folds"]

CALIBRATION_METHODS = ("isotonic", "temperature", "platt")


def check_calibration_folds(calibrate, folds) -> None:
    """The command-line check of ``--calibration-folds K`` (``bayesmlc train`` and ``bayesmlc bench``): it
    needs ``--calibrate`` (``calibrate``: the method or methods given, empty or ``None`` when none) and
    K >= 2; raises :class:`ValidationError` naming the option. ``folds=None`` passes."""
    if folds is None:
        return
    if not calibrate:
        raise ValidationError("--calibration-folds: only with --calibrate (it sets how the calibration maps are fitted)")
    if isinstance(folds, bool) or not isinstance(folds, (int, np.integer)) or folds < 2:
        raise ValidationError(f"--calibration-folds: needs at least 2 folds, got {folds}")


# probabilities are kept this far from 0 and 1 before the logit, so logits stay finite
_PROBA_FLOOR = 1e-7
# the slope a of Platt scaling is kept at least this large, so the map stays increasing
_MIN_SLOPE = 1e-3


def _log_loss(z: np.ndarray, y: np.ndarray) -> float:
    """Mean binary log-loss of logits ``z`` against 0/1 ``y``: mean of log(1 + e^z) - y z."""
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


# ---- the maps ---------------------------------------------------------------------------------
def fit_isotonic(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Isotonic regression of ``y`` on ``p``: its thresholds as a (2, m) array (x row, then g(x) row)."""
    regression = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip").fit(p, y)
    return np.vstack([regression.X_thresholds_, regression.y_thresholds_]).astype(np.float64)


def apply_isotonic(thresholds: np.ndarray, p: np.ndarray) -> np.ndarray:
    """The isotonic map of :func:`fit_isotonic` at ``p``; below the first threshold x_0 a line from
    (0, 0) to (x_0, g(x_0)), above the last one constant."""
    x, g = thresholds
    out = np.interp(p, x, g)
    if x[0] > 0:
        below = p < x[0]
        out[below] = g[0] * p[below] / x[0]
    return out


def fit_temperature(p: np.ndarray, y: np.ndarray) -> float:
    """The temperature T > 0 minimising the log-loss of ``sigmoid(logit(p) / T)``."""
    z = logit(p, _PROBA_FLOOR)
    result = minimize_scalar(lambda log_t: _log_loss(z * np.exp(-log_t), y), bounds=(-7.0, 7.0), method="bounded",
                             options={"xatol": 1e-6})
    return float(np.exp(result.x))


def fit_platt(p: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(a, b), a >= 1e-3, minimising the log-loss of ``sigmoid(a logit(p) + b)`` (L-BFGS-B with the
    exact gradient, started at the identity a = 1, b = 0)."""
    z = logit(p, _PROBA_FLOOR)

    def loss_and_gradient(theta):
        a, b = theta
        t = a * z + b
        residual = sigmoid(t) - y  # d loss / d t per pair
        return _log_loss(t, y), np.array([np.mean(residual * z), np.mean(residual)])

    result = minimize(loss_and_gradient, x0=np.array([1.0, 0.0]), jac=True, method="L-BFGS-B",
                      bounds=[(_MIN_SLOPE, None), (None, None)])
    return float(result.x[0]), float(result.x[1])


class CalibratedClassifier(MultiLabelEstimator):
    """An estimator whose probabilities are recalibrated on held-out rows.

    Parameters
    ----------
    estimator : an unfitted bayesmlc estimator
        ``fit`` fits a clone (the object given is never changed); the fitted clone is ``estimator_``.
    method : "isotonic", "temperature" or "platt"
        The calibration map (module docstring).
    calibration_fraction : float in (0, 1)
        Share of the training rows held out to fit the maps (at least one row each way), when ``cv``
        is None.
    cv : int >= 2 or None, default None
        Cross-fitting: the rows are split into ``cv`` folds, a clone fitted on all but each fold
        predicts that fold, the maps are fitted on every row's held-out predictions, and
        ``estimator_`` is then fitted on all rows (``cv + 1`` fits). The ranking (P@k) is then the raw
        model's, and the maps see every row instead of a ``calibration_fraction`` of them; the maps
        are fitted to clones trained on ``(cv - 1) / cv`` of the rows, which are applied to the
        model trained on all of them. None: one held-out split.
    top_k : int
        The global map is fitted on each held-out row's ``top_k`` best labels.
    min_label_positives : int or None
        A label gets its own map when its held-out entries hold at least this many positives and as
        many negatives; ``None``: the global map for every label.
    random_state : int or None
        Seeds the choice of held-out rows. The wrapped estimator keeps its own ``random_state``.

    Fitted attributes
    -----------------
    estimator_ : the estimator fitted on the rows not held out (with ``cv``: on all rows)
    calibration_rows_ : ndarray of int (n_held_out,), the training rows whose held-out predictions
        fitted the maps (with ``cv``: every row)
    global_map_ : ndarray; isotonic: (2, m) thresholds; temperature: [1 / T, 0]; platt: [a, b]
    label_maps_ : list of ndarrays, one per label in ``calibrated_labels_``, same forms
    calibrated_labels_ : ndarray of int, the labels with a map of their own
    fit_seconds_ : float, wall time of the estimator's fits (with ``cv``: all ``cv + 1``)
    calibration_seconds_ : float, wall time of predicting the held-out rows and fitting the maps
    history_ : the estimator's ``history_``

    ``decision_function`` is the estimator's; ``predict_proba`` applies the maps to its probabilities.
    """

    _parameter_constraints = {
        "estimator": [InstanceOf(MultiLabelEstimator, "a bayesmlc estimator")],
        "method": [Options(*CALIBRATION_METHODS)],
        "calibration_fraction": [Real(0, 1, low_open=True, high_open=True)],
        "cv": [None, Integer(2)],
        "top_k": [Integer(1)],
        "min_label_positives": [None, Integer(1)],
        "random_state": [None, Integer()],
    }

    def __init__(self, estimator=None, method="isotonic", calibration_fraction=0.2, cv=None, top_k=5,
                 min_label_positives=50, random_state=None):
        self.estimator = estimator
        self.method = method
        self.calibration_fraction = calibration_fraction
        self.cv = cv
        self.top_k = top_k
        self.min_label_positives = min_label_positives
        self.random_state = random_state

    # ---- fitting ----------------------------------------------------------------------------
    def _fit_map(self, p: np.ndarray, y: np.ndarray) -> np.ndarray:
        if self.method == "isotonic":
            return fit_isotonic(p, y)
        if self.method == "temperature":
            return np.array([1.0 / fit_temperature(p, y), 0.0])
        return np.array(fit_platt(p, y))

    def _apply_map(self, calibration_map: np.ndarray, p: np.ndarray) -> np.ndarray:
        if self.method == "isotonic":
            return apply_isotonic(calibration_map, p)
        slope, offset = calibration_map
        return sigmoid(slope * logit(p, _PROBA_FLOOR) + offset)

    def _folds(self, n: int) -> list:
        """The held-out rows of each fit: one split of ``calibration_fraction``, or ``cv`` folds."""
        order = np.random.RandomState(self.random_state).permutation(n)
        if self.cv is not None:
            if int(self.cv) > n:
                raise ValidationError(f"cv={self.cv} folds need at least {self.cv} rows, got n_samples={n}")
            return [np.sort(order[fold::int(self.cv)]) for fold in range(int(self.cv))]
        n_held_out = int(round(self.calibration_fraction * n))
        if n_held_out < 1 or n_held_out >= n:
            raise ValidationError(
                f"calibration_fraction={self.calibration_fraction} of n_samples={n} rows leaves no rows to "
                f"{'calibrate on' if n_held_out < 1 else 'train on'}"
            )
        return [np.sort(order[:n_held_out])]

    def _held_out_predictions(self, model, X_held, Y_held, mask_held, candidates: np.ndarray):
        """The held-out rows' top-k (probability, is-relevant) pairs of the estimator's own ranking (the
        observed ones) and the candidate labels' probability columns, predicted batch by batch."""
        k = min(int(self.top_k), Y_held.shape[1])
        top_p, top_y, columns = [], [], []
        for rows in iter_batches(X_held.shape[0], PREDICT_BATCH_ROWS):
            proba = model.predict_proba(X_held[rows]).astype(np.float64)
            indices, _ = topk(model.decision_function(X_held[rows]), k)
            labels = indices.ravel()
            row_of = np.repeat(np.arange(indices.shape[0]), k)
            p = proba[row_of, labels]
            y = np.asarray(Y_held[rows][row_of, labels]).ravel()
            if mask_held is not None:
                seen = np.asarray(mask_held[rows][row_of, labels]).ravel() > 0
                p, y = p[seen], y[seen]
            top_p.append(p)
            top_y.append(y)
            columns.append(proba[:, candidates])
        return np.concatenate(top_p), np.concatenate(top_y), np.vstack(columns)

    def _fit(self, X, Y, label_mask, **fit_params):
        n = X.shape[0]
        folds = self._folds(n)
        held_out = np.concatenate(folds)
        Y_held = Y[held_out]
        mask_held = None if label_mask is None else label_mask[held_out]
        # labels that may get a map of their own: enough positives and negatives among observed entries
        candidates = np.zeros(0, dtype=np.int64)
        if self.min_label_positives is not None:
            positives = np.bincount(Y_held.indices, minlength=Y.shape[1])
            observed = (np.full(Y.shape[1], held_out.size) if mask_held is None
                        else np.bincount(mask_held.indices, minlength=Y.shape[1]))
            candidates = np.flatnonzero((positives >= self.min_label_positives)
                                        & (observed - positives >= self.min_label_positives))
        self.fit_seconds_ = self.calibration_seconds_ = 0.0
        pairs_p, pairs_y, columns = [], [], []
        for fold in folds:
            kept = np.setdiff1d(np.arange(n), fold, assume_unique=True)
            model = clone(self.estimator)
            start = time.perf_counter()
            model.fit(X[kept], Y[kept], None if label_mask is None else label_mask[kept], **fit_params)
            self.fit_seconds_ += time.perf_counter() - start
            start = time.perf_counter()
            p, y, column = self._held_out_predictions(model, X[fold], Y[fold],
                                                      None if label_mask is None else label_mask[fold], candidates)
            pairs_p.append(p)
            pairs_y.append(y)
            columns.append(column)
            self.calibration_seconds_ += time.perf_counter() - start
        start = time.perf_counter()
        p, y = np.concatenate(pairs_p), np.concatenate(pairs_y)
        if p.size == 0:
            raise ValidationError("no held-out top-k prediction is observed under label_mask: nothing to calibrate on")
        self.global_map_ = self._fit_map(p, y)
        label_maps = []
        if candidates.size:
            column_proba = np.vstack(columns)  # rows in the order of held_out
            column_truth = Y_held[:, candidates].toarray()
            seen = None if mask_held is None else mask_held[:, candidates].toarray() > 0
            for j in range(candidates.size):
                keep = slice(None) if seen is None else seen[:, j]
                label_maps.append(self._fit_map(column_proba[keep, j], column_truth[keep, j]))
        self.label_maps_ = label_maps
        self.calibrated_labels_ = np.asarray(candidates, dtype=np.int64)
        self.calibration_seconds_ += time.perf_counter() - start
        if self.cv is not None:  # cross-fitting: the estimator itself is fitted on every row
            model = clone(self.estimator)
            start = time.perf_counter()
            model.fit(X, Y, label_mask, **fit_params)
            self.fit_seconds_ += time.perf_counter() - start
        self.estimator_ = model
        self.calibration_rows_ = np.sort(held_out)
        self.history_ = {key: list(values) for key, values in getattr(model, "history_", {}).items()}

    # ---- prediction -------------------------------------------------------------------------
    def _decision_function(self, X) -> np.ndarray:
        return self.estimator_.decision_function(X)

    def calibrate(self, proba: np.ndarray) -> np.ndarray:
        """The calibrated probabilities of raw ones ``proba`` (b, L) from ``estimator_``: (b, L) float64."""
        proba = np.asarray(proba, dtype=np.float64)
        out = self._apply_map(self.global_map_, proba.ravel()).reshape(proba.shape)
        for label, calibration_map in zip(self.calibrated_labels_, self.label_maps_):
            out[:, label] = self._apply_map(calibration_map, proba[:, label])
        return np.clip(out, 0.0, 1.0)

    def _predict_proba(self, X) -> np.ndarray:
        return self.calibrate(self.estimator_.predict_proba(X)).astype(np.float32)

    def _scores_and_proba(self, X):
        scores, proba = self.estimator_.score_and_proba(X)
        return scores, self.calibrate(proba).astype(np.float32)

    # ---- persistence: the fitted estimator is stored whole (bayesmlc.persistence nests it) ---
    def _set_state(self, state: dict) -> None:
        super()._set_state(state)
        # lists become arrays; no dtype is imposed, so that the table refuses what is not float (integer)
        if isinstance(self.label_maps_, (list, tuple)):
            self.label_maps_ = [np.asarray(m) for m in self.label_maps_]
        self.global_map_ = np.asarray(self.global_map_)
        self.calibrated_labels_ = np.asarray(self.calibrated_labels_)

    def _fitted_members(self) -> list:
        return [("estimator_", self.estimator_)]

    def _check_fitted_state(self) -> None:
        check_fitted_state(self, CALIBRATION_FIELDS)
