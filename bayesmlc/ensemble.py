"""An ensemble that averages the predictive probabilities of several bayesmlc models.

Averaging the predictive distributions of independently fitted posteriors (a mixture of the
approximate posteriors, each weighted equally unless ``weights`` says otherwise) is the simplest way
to combine models that err differently. For MLGPF on Bibtex, two different recipes averaged this way
rank better than either alone (docs/mlgpf.md, "The best configuration"); two seeds of one recipe do
not gain, because their errors are nearly the same.

Example
-------
>>> from bayesmlc import MLGPF
>>> from bayesmlc.ensemble import AveragingEnsemble
>>> ensemble = AveragingEnsemble([
...     ("subspace", MLGPF(n_inducing=400, epochs=15, kl_weight=0.5)),
...     ("free", MLGPF(kernel="linear+se", ard=True, inducing="free", n_latent=30, epochs=100)),
... ], random_state=0)
>>> ensemble.fit(X, Y).predict_topk(X_test, 5)  # doctest: +SKIP
"""

from __future__ import annotations

import time

import numpy as np
from sklearn.base import clone

from .base import MultiLabelEstimator
from .exceptions import ModelFormatError, ValidationError
from .fitted_state import check_fitted_state
from .state_checks import ENSEMBLE_FIELDS
from .parameters import Integer
from .utils import logit

__all__ = ["AveragingEnsemble"]

# probabilities are kept this far from 0 and 1 before the logit, so scores stay finite
_PROBA_FLOOR = 1e-12


class AveragingEnsemble(MultiLabelEstimator):
    """Fit several estimators on the same data; predict the weighted mean of their probabilities.

    Parameters
    ----------
    estimators : list of (str, estimator) pairs
        Unfitted bayesmlc estimators with distinct names. ``fit`` fits a clone of each (the objects
        given here are never changed, as in scikit-learn); the fitted clones are ``estimators_``.
    weights : sequence of float, optional
        One non-negative weight per estimator (normalised to sum to one); equal weights by default.
    random_state : int or None
        ``None`` keeps each member's own ``random_state``. An int gives the members seeds drawn from
        it (member ``i`` gets the ``i``-th draw), so one seed fixes the whole ensemble.
    verbose : bool
        Print which member is being fitted and how long it took.

    Fitted attributes
    -----------------
    estimators_ : list of fitted estimators, in the order of ``estimators``
    named_estimators_ : dict, name -> fitted estimator
    weights_ : ndarray (n_estimators,), the normalised weights
    fit_seconds_ : ndarray (n_estimators,), wall time of each member's fit

    ``predict_proba`` is ``sum_i weights_[i] * estimators_[i].predict_proba(X)``;
    ``decision_function`` is its logit, so ranking by scores and by probabilities agree.
    """

    _parameter_constraints = {"random_state": [None, Integer()]}

    def __init__(self, estimators, weights=None, random_state=None, verbose=False):
        self.estimators = estimators
        self.weights = weights
        self.random_state = random_state
        self.verbose = verbose

    def _check_members(self) -> tuple[list[str], list[MultiLabelEstimator], np.ndarray]:
        items = list(self.estimators) if isinstance(self.estimators, (list, tuple)) else None
        if not items:
            raise ValidationError(f"estimators must be a non-empty list of (name, estimator) pairs, got {self.estimators!r}")
        names, members = [], []
        for i, item in enumerate(items):
            if not (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)):
                raise ValidationError(f"estimators[{i}] must be a (name, estimator) pair, got {item!r}")
            if not isinstance(item[1], MultiLabelEstimator):
                raise ValidationError(
                    f"estimators[{i}] ({item[0]!r}) is a {type(item[1]).__name__}, not a bayesmlc estimator"
                )
            names.append(item[0])
            members.append(item[1])
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValidationError(f"estimator names must be distinct; repeated: {', '.join(repeated)}")
        if self.weights is None:
            weights = np.ones(len(members))
        else:
            weights = np.asarray(self.weights, dtype=np.float64)
            if weights.shape != (len(members),):
                raise ValidationError(f"weights must hold one number per estimator ({len(members)}), got {self.weights!r}")
            if not np.all(np.isfinite(weights)) or np.any(weights < 0) or weights.sum() <= 0:
                raise ValidationError(f"weights must be finite, non-negative and not all zero, got {self.weights!r}")
        return names, members, weights / weights.sum()

    def _fit(self, X, Y, label_mask, **fit_params):
        names, members, self.weights_ = self._check_members()
        seeds = (None if self.random_state is None
                 else np.random.RandomState(self.random_state).randint(np.iinfo(np.int32).max, size=len(members)))
        fitted, seconds = [], []
        for i, (name, member) in enumerate(zip(names, members)):
            model = clone(member)
            if seeds is not None:
                model.set_params(random_state=int(seeds[i]))
            if self.verbose:
                print(f"AveragingEnsemble: fitting {name} ({i + 1}/{len(members)})", flush=True)
            start = time.perf_counter()
            model.fit(X, Y, label_mask, **fit_params)
            seconds.append(time.perf_counter() - start)
            if self.verbose:
                print(f"AveragingEnsemble: {name} fitted in {seconds[-1]:.1f} s", flush=True)
            fitted.append(model)
        self.estimators_ = fitted
        self.named_estimators_ = dict(zip(names, fitted))
        self.fit_seconds_ = np.asarray(seconds)
        self.history_["wall_time"] = list(np.cumsum(seconds))
        self.history_["objective"] = [float("nan")] * len(seconds)  # the members keep their own

    def _mean_proba(self, X) -> np.ndarray:
        """The weighted mean of the members' probabilities for a batch, (b, L) float64."""
        total = np.zeros((X.shape[0], self.n_labels_), dtype=np.float64)
        for weight, model in zip(self.weights_, self.estimators_):
            total += weight * model.predict_proba(X)
        return total

    def _predict_proba(self, X) -> np.ndarray:
        return self._mean_proba(X).astype(np.float32)

    def _decision_function(self, X) -> np.ndarray:
        return self._scores_and_proba(X)[0]

    def _scores_and_proba(self, X):
        mean = self._mean_proba(X)
        # the logit is taken in float64, so close probabilities keep their order as float32 scores
        return logit(mean, _PROBA_FLOOR).astype(np.float32), mean.astype(np.float32)

    # ---- persistence: the members are stored whole (bayesmlc.persistence nests estimators) ------
    def _get_state(self) -> dict:
        state = super()._get_state()
        del state["named_estimators_"]  # the same models as estimators_: stored once
        return state

    def _set_state(self, state: dict) -> None:
        super()._set_state(state)
        self.estimators_ = list(self.estimators_)
        self.weights_ = np.asarray(self.weights_)  # no coercion: the table refuses a non-float dtype
        names = [name for name, _ in self.estimators]
        self.named_estimators_ = dict(zip(names, self.estimators_))

    def _fitted_members(self) -> list:
        if not isinstance(self.estimators_, list) or not self.estimators_:
            raise ModelFormatError("estimators_ must be a non-empty list of fitted estimators")
        return [(f"estimators_[{i}]", member) for i, member in enumerate(self.estimators_)]

    def _check_fitted_state(self) -> None:
        check_fitted_state(self, ENSEMBLE_FIELDS)
