"""bayesmlc.metrics scorers in scikit-learn's model selection, against metrics computed by hand with
loops over rows on each fold."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV, KFold, cross_val_score

from conftest import linear_multilabel_problem

from bayesmlc.exceptions import ValidationError
from bayesmlc.linear import LogisticRegression
from bayesmlc.metrics import TopKScorer, get_topk_scorer, make_topk_scorer, training_inverse_propensity

# the fits are cut short on purpose: LogisticRegression's ConvergenceWarning says so, and is not under test
pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")

GRID = {"C": [0.05, 5.0]}


@pytest.fixture(scope="module")
def problem():
    X, Y = linear_multilabel_problem(n=150, d=10, n_labels=7, seed=4, density=0.5)
    return X, sp.csr_matrix(Y)


def model(C=1.0):
    return LogisticRegression(C=C, max_iter=8, device="cpu", random_state=0)


# ---- the metrics by hand: a stable sort of each row's scores, then the textbook sums ---------------------
def ranked(scores, k):
    return [np.argsort(-row, kind="stable")[:k] for row in scores]


def precision_by_hand(Y, scores, k):
    return np.mean([sum(Y[i, l] for l in top) / k for i, top in enumerate(ranked(scores, k))])


def ndcg_by_hand(Y, scores, k):
    values = []
    for i, top in enumerate(ranked(scores, k)):
        dcg = sum(Y[i, l] / math.log2(r + 2) for r, l in enumerate(top))
        ideal = sum(1 / math.log2(r + 2) for r in range(min(k, int(Y[i].sum()))))
        values.append(dcg / ideal if ideal else 0.0)
    return np.mean(values)


def jain_weights(Y_train, A=0.55, B=1.5):
    N = Y_train.shape[0]
    C = (math.log(N) - 1) * (B + 1) ** A
    return np.array([1 + C * (count + B) ** -A for count in Y_train.sum(axis=0)])


def psp_by_hand(Y, scores, k, w):
    numerators, best = [], []
    for i, top in enumerate(ranked(scores, k)):
        numerators.append(sum(w[l] * Y[i, l] for l in top) / k)
        best.append(sum(sorted((w[l] for l in np.flatnonzero(Y[i])), reverse=True)[:k]) / k)
    return np.mean(numerators) / np.mean(best)


def per_fold(X, Y, metrics: dict, C, n_splits=3) -> dict:
    """Each metric of a clone fitted on each KFold training part, scored on its test part:
    name -> (n_splits,) array."""
    Y = Y.toarray().astype(np.float64)  # the sums by hand in float64
    out = {name: [] for name in metrics}
    for train, test in KFold(n_splits).split(X):
        fitted = clone(model(C)).fit(X[train], Y[train])
        scores = fitted.decision_function(X[test])
        for name, metric in metrics.items():
            out[name].append(metric(Y[test], scores, Y[train]))
    return {name: np.array(values) for name, values in out.items()}


HAND = {
    "P@1": lambda Y, s, Y_train: precision_by_hand(Y, s, 1),
    "P@3": lambda Y, s, Y_train: precision_by_hand(Y, s, 3),
    "nDCG@3": lambda Y, s, Y_train: ndcg_by_hand(Y, s, 3),
    "PSP@3": lambda Y, s, Y_train: psp_by_hand(Y, s, 3, jain_weights(Y_train)),
}


def test_grid_search_with_top_k_scorers_matches_the_metrics_by_hand(problem):
    X, Y = problem
    scoring = {"P@1": make_topk_scorer("precision", k=1), "P@3": get_topk_scorer("p@3"),
               "nDCG@3": make_topk_scorer("ndcg", k=3), "PSP@3": make_topk_scorer("psp", k=3)}
    search = GridSearchCV(model(), GRID, scoring=scoring, refit="P@3", cv=KFold(3)).fit(X, Y)
    by_hand = [per_fold(X, Y, HAND, C) for C in GRID["C"]]
    for name in HAND:
        expected = np.array([candidate[name] for candidate in by_hand])  # (candidates, folds)
        got = np.array([search.cv_results_[f"split{fold}_test_{name}"] for fold in range(3)]).T
        np.testing.assert_allclose(got, expected, rtol=1e-9, err_msg=name)
    best = int(np.argmax([candidate["P@3"].mean() for candidate in by_hand]))
    assert search.best_params_["C"] == GRID["C"][best]


def test_cross_val_score_on_dense_y_and_propensities_from_all_training_labels(problem):
    X, Y = problem
    dense = Y.toarray().astype(np.float64)
    scorer = make_topk_scorer("psp", k=2, Y_train=dense)  # one set of weights for every fold
    scores = cross_val_score(model(), X, dense, scoring=scorer, cv=KFold(3))
    weights = jain_weights(dense)
    expected = per_fold(X, Y, {"PSP@2": lambda Yt, s, _: psp_by_hand(Yt, s, 2, weights)}, 1.0)["PSP@2"]
    np.testing.assert_allclose(scores, expected, rtol=1e-9)


def test_the_estimator_s_training_counts_give_jain_s_weights(problem):
    X, Y = problem
    fitted = model().fit(X[:100], Y[:100])
    np.testing.assert_allclose(training_inverse_propensity(fitted), jain_weights(Y[:100].toarray().astype(np.float64)), rtol=1e-12)
    with pytest.raises(ValidationError, match="keeps no training label counts"):
        training_inverse_propensity(object())


def test_a_scorer_ranks_with_decision_function_when_there_is_no_predict_topk(problem):
    X, Y = problem
    fitted = model().fit(X, Y)

    class ScoresOnly:
        decision_function = staticmethod(fitted.decision_function)

    assert make_topk_scorer("ndcg", k=3)(ScoresOnly(), X, Y) == pytest.approx(
        ndcg_by_hand(Y.toarray().astype(np.float64), fitted.decision_function(X), 3), rel=1e-12)
    with pytest.raises(ValidationError, match="no predict_topk, decision_function or predict_proba"):
        make_topk_scorer("precision", k=1)(object(), X, Y)


def test_scorer_names_and_wrong_arguments():
    assert repr(get_topk_scorer(" nDCG @ 5 ")) == "make_topk_scorer('ndcg', k=5)"
    assert get_topk_scorer("psprecision@2").metric == "psp" and get_topk_scorer("PSnDCG@1").metric == "psndcg"
    assert isinstance(make_topk_scorer("precision"), TopKScorer) and make_topk_scorer("precision").k == 5
    for name in ("precision", "p@", "recall@5", "p@x", None):
        with pytest.raises(ValidationError, match="scorer name must be"):
            get_topk_scorer(name)
    with pytest.raises(ValidationError, match="k must be a positive integer"):
        make_topk_scorer("precision", k=0)
    with pytest.raises(ValidationError, match="metric must be one of"):
        make_topk_scorer("recall", k=1)
    with pytest.raises(ValidationError, match="weighs no label"):
        make_topk_scorer("precision", k=1, propensities=np.ones(3))
    with pytest.raises(ValidationError, match="not both"):
        make_topk_scorer("psp", k=1, propensities=np.ones(3), Y_train=np.eye(3))
