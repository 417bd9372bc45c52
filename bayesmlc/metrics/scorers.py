"""Scorers for scikit-learn's model selection: P@k, nDCG@k, PSP@k and PSnDCG@k of a fitted model.

A scorer is what ``GridSearchCV(scoring=...)``, ``cross_val_score(scoring=...)`` and
``cross_validate`` call as ``scorer(estimator, X_test, y_test)``; higher is better for every metric
here. The ranking comes from the estimator's ``predict_topk(X, k)`` (one batch of scores in memory
at a time) when it has one, else from its ``decision_function`` or ``predict_proba``; ``y_test`` may
be dense or scipy-sparse::

    from sklearn.model_selection import GridSearchCV
    from bayesmlc.metrics import make_topk_scorer

    search = GridSearchCV(LogisticRegression(), {"C": [0.1, 1.0]}, cv=3,
                          scoring={"P@5": make_topk_scorer("precision", k=5),
                                   "PSP@5": make_topk_scorer("psp", k=5)}, refit="P@5")

:func:`get_topk_scorer` builds the same from a name such as ``"ndcg@3"``.
"""

from __future__ import annotations

import re

import numpy as np

from ..exceptions import ValidationError
from ..label_statistics import LabelStatistics
from ._checks import _check_k
from .ranking import (
    inverse_propensity,
    inverse_propensity_from_counts,
    ndcg_at_k,
    precision_at_k,
    psndcg_at_k,
    psprecision_at_k,
)

__all__ = ["TOPK_METRICS", "TopKScorer", "make_topk_scorer", "get_topk_scorer", "training_inverse_propensity"]

#: metric name -> (function, whether it weighs labels by inverse propensity)
TOPK_METRICS = {
    "precision": (precision_at_k, False),
    "ndcg": (ndcg_at_k, False),
    "psp": (psprecision_at_k, True),
    "psndcg": (psndcg_at_k, True),
}
_SHORT_NAMES = {"p": "precision", "psprecision": "psp"}


def training_inverse_propensity(estimator, A: float = 0.55, B: float = 1.5) -> np.ndarray:
    """Jain et al.'s inverse propensities (:func:`~bayesmlc.metrics.inverse_propensity_from_counts`)
    from the label counts a fitted bayesmlc estimator keeps of its training rows
    (:meth:`~bayesmlc.label_statistics.LabelStatistics.of_fitted`): N_l = ``label_frequencies_``, and N
    the number of training rows, the largest observed count (the row count whenever some label is
    observed in every row, always without a ``label_mask``)."""
    if getattr(estimator, "label_frequencies_", None) is None or getattr(estimator, "label_prior_", None) is None:
        raise ValidationError(f"{type(estimator).__name__} keeps no training label counts (label_frequencies_, "
                              "label_prior_): give the scorer propensities= or Y_train=")
    counts = LabelStatistics.of_fitted(estimator)
    return inverse_propensity_from_counts(counts.positives, counts.n_rows, A=A, B=B)


def _ranking(estimator, X, k: int):
    """The estimator's ranking of the labels of ``X``: a top-k pair from ``predict_topk``, or dense
    scores from ``decision_function`` / ``predict_proba``."""
    if hasattr(estimator, "predict_topk"):
        return tuple(estimator.predict_topk(X, k))
    for method in ("decision_function", "predict_proba"):
        if hasattr(estimator, method):
            return getattr(estimator, method)(X)
    raise ValidationError(f"{type(estimator).__name__} has no predict_topk, decision_function or predict_proba "
                          "to rank labels with")


class TopKScorer:
    """``scorer(estimator, X, y_true)``: the ``metric`` at ``k`` of the estimator's ranking of ``X``'s
    labels against ``y_true`` (dense or sparse 0/1, (n, L)), a float where higher is better.

    Parameters
    ----------
    metric : {"precision", "ndcg", "psp", "psndcg"}, the functions of :mod:`bayesmlc.metrics.ranking`
        (:func:`precision_at_k`, :func:`ndcg_at_k`, :func:`psprecision_at_k`, :func:`psndcg_at_k`).
    k : int >= 1
    propensities : array (L,) or None, the inverse propensities of the propensity-scored metrics.
    Y_train : (N, L) 0/1 or None, labels to compute them from (:func:`inverse_propensity`), for
        example the whole training set, so that every fold weighs labels alike.
    A, B : the constants of Jain et al.'s propensity model.

    With neither ``propensities`` nor ``Y_train``, a propensity-scored metric takes them from the
    scored estimator's own training rows (:func:`training_inverse_propensity`): in cross-validation,
    from each fold's training part, never from the test rows.
    """

    def __init__(self, metric: str, k: int = 5, *, propensities=None, Y_train=None, A: float = 0.55, B: float = 1.5):
        if metric not in TOPK_METRICS:
            raise ValidationError(f"metric must be one of {', '.join(TOPK_METRICS)}, got {metric!r}")
        self.metric, self.k = metric, _check_k(k)
        self.function, self.weighted = TOPK_METRICS[metric]
        if not self.weighted and (propensities is not None or Y_train is not None):
            raise ValidationError(f"{metric}@k weighs no label: propensities and Y_train are for 'psp' and 'psndcg'")
        if propensities is not None and Y_train is not None:
            raise ValidationError("give propensities or Y_train, not both")
        self.propensities = inverse_propensity(Y_train, A=A, B=B) if Y_train is not None else propensities
        self.A, self.B = A, B

    def __call__(self, estimator, X, y_true) -> float:
        ranking = _ranking(estimator, X, self.k)
        if not self.weighted:
            return self.function(y_true, ranking, self.k)
        weights = self.propensities if self.propensities is not None \
            else training_inverse_propensity(estimator, self.A, self.B)
        return self.function(y_true, ranking, self.k, propensities=weights)

    def __repr__(self) -> str:
        return f"make_topk_scorer({self.metric!r}, k={self.k})"


def make_topk_scorer(metric: str, k: int = 5, *, propensities=None, Y_train=None, A: float = 0.55,
                     B: float = 1.5) -> TopKScorer:
    """A scorer of ``metric`` at ``k`` for ``scoring=``: see :class:`TopKScorer` for the arguments.

    >>> make_topk_scorer("precision", k=5)
    make_topk_scorer('precision', k=5)
    """
    return TopKScorer(metric, k, propensities=propensities, Y_train=Y_train, A=A, B=B)


def get_topk_scorer(name: str, **kwargs) -> TopKScorer:
    """The scorer named ``"<metric>@<k>"``: metric ``precision`` (or ``p``), ``ndcg``, ``psp`` (or
    ``psprecision``) or ``psndcg``, case-insensitive; ``kwargs`` as for :func:`make_topk_scorer`.

    >>> get_topk_scorer("P@3")
    make_topk_scorer('precision', k=3)
    """
    match = re.fullmatch(r"\s*([a-z]+)\s*@\s*(\d+)\s*", str(name).lower())
    metric = _SHORT_NAMES.get(match.group(1), match.group(1)) if match else None
    if metric not in TOPK_METRICS:
        raise ValidationError(f"scorer name must be '<metric>@<k>' with metric one of {', '.join(TOPK_METRICS)} "
                              f"(or p, psprecision), e.g. 'precision@5'; got {name!r}")
    return make_topk_scorer(metric, int(match.group(2)), **kwargs)
