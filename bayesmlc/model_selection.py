"""scikit-learn model selection on the sparse label matrices that bayesmlc's readers return.

scikit-learn's metrics (``roc_auc_score``, ``f1_score``, ...) and its ``cross_val_score`` and
``cross_validate`` refuse a scipy sparse ``y`` in their parameter validation. ``GridSearchCV`` passes
a sparse ``y`` through to the scorer, where a string ``scoring`` then fails on every fold: scikit-learn
reports that as a ``UserWarning`` ("Scoring failed ...") and a nan score. ``SparseTargetScorer`` wraps
a scikit-learn scorer so that it takes sparse ``y`` (densified one test fold at a time, (n_test, L)),
and ``cross_val_score`` runs k-fold cross-validation on sparse ``Y`` with it.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.metrics import get_scorer
from sklearn.model_selection import check_cv

__all__ = ["SparseTargetScorer", "cross_val_score"]


class SparseTargetScorer:
    """A scorer ``(estimator, X, y) -> float`` for ``GridSearchCV(scoring=...)`` and the like that
    accepts a sparse ``y``.

    Parameters
    ----------
    scoring : str or callable, a scikit-learn scoring name ("roc_auc", "average_precision",
        "f1_micro", ...) or a scorer ``(estimator, X, y)``; ``y`` reaches it as a dense ndarray (n, L).
    """

    def __init__(self, scoring):
        self.scoring = scoring
        self._scorer = get_scorer(scoring)

    def __call__(self, estimator, X, y, **kwargs) -> float:
        return self._scorer(estimator, X, y.toarray() if sp.issparse(y) else y, **kwargs)

    def __repr__(self) -> str:
        return f"SparseTargetScorer({self.scoring!r})"


def _rows(data, indices):
    """Rows ``indices`` of an ndarray, a sparse matrix or a DataFrame."""
    if hasattr(data, "iloc"):
        return data.iloc[indices]
    if sp.issparse(data):
        return sp.csr_matrix(data)[indices]
    return np.asarray(data)[indices]


def cross_val_score(estimator, X, Y, *, cv=5, scoring=None) -> np.ndarray:
    """Scores of ``estimator`` on each test fold of a cross-validation, with ``Y`` dense or sparse.

    Parameters
    ----------
    estimator : an unfitted bayesmlc estimator (cloned for every fold).
    X : (n, D) features, dense, sparse or a DataFrame. Y : (n, L) 0/1 labels, dense or sparse.
    cv : int (k folds, unshuffled ``KFold``, as scikit-learn uses for multi-label targets), a
        splitter or an iterable of (train, test) index arrays.
    scoring : None (the estimator's ``score``: precision at 1) or what ``SparseTargetScorer`` takes.

    Returns
    -------
    ndarray (n_splits,), one score per test fold, in the splitter's order.
    """
    score = (lambda model, X_test, Y_test: model.score(X_test, Y_test)) if scoring is None else SparseTargetScorer(scoring)
    splitter = check_cv(cv, Y, classifier=True)
    scores = []
    for train, test in splitter.split(X, Y):
        model = clone(estimator).fit(_rows(X, train), _rows(Y, train))
        scores.append(score(model, _rows(X, test), _rows(Y, test)))
    return np.asarray(scores, dtype=np.float64)
