"""scikit-learn model selection on sparse Y, and feature names, against hand computations."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import GridSearchCV, KFold
from sklearn.model_selection import cross_val_score as sklearn_cross_val_score

from conftest import linear_multilabel_problem

from bayesmlc.exceptions import ValidationError
from bayesmlc.linear import LogisticRegression
from bayesmlc.metrics import precision_at_k
from bayesmlc.model_selection import SparseTargetScorer, cross_val_score


@pytest.fixture(scope="module")
def sparse_problem():
    """Sparse X and sparse Y as the readers return them; every label has positives in every fold."""
    X, Y = linear_multilabel_problem(n=150, d=10, n_labels=4, seed=3, density=0.5)
    Y = sp.csr_matrix(Y)
    for _, test in KFold(3).split(X):
        positives = np.asarray(Y[test].sum(axis=0)).ravel()
        assert np.all((positives > 0) & (positives < len(test)))
    return X, Y


def model(C=1.0):
    return LogisticRegression(C=C, max_iter=8, device="cpu", random_state=0)


def by_hand(X, Y, score, C=1.0, n_splits=3):
    """Per-fold scores with KFold, clone, fit and a metric on the test fold."""
    scores = []
    for train, test in KFold(n_splits).split(X):
        fitted = clone(model(C)).fit(X[train], Y[train])
        scores.append(score(fitted, X[test], Y[test]))
    return np.array(scores)


def test_cross_val_score_on_sparse_y_matches_the_hand_computation(sparse_problem):
    X, Y = sparse_problem
    p_at_1 = by_hand(X, Y, lambda m, X_test, Y_test: precision_at_k(Y_test, m.decision_function(X_test), k=1))
    np.testing.assert_allclose(cross_val_score(model(), X, Y, cv=3), p_at_1, rtol=1e-12)
    auc = by_hand(X, Y, lambda m, X_test, Y_test: roc_auc_score(Y_test.toarray(), m.predict_proba(X_test)))
    ours = cross_val_score(model(), X, Y, cv=3, scoring="roc_auc")
    np.testing.assert_allclose(ours, auc, rtol=1e-12)
    assert np.all((0.5 < ours) & (ours <= 1.0))  # a real fit, not a constant
    # scikit-learn's own cross_val_score takes the dense Y and agrees
    np.testing.assert_allclose(sklearn_cross_val_score(model(), X, Y.toarray(), cv=3, scoring="roc_auc"), auc,
                               rtol=1e-12)


def test_scikit_learn_refuses_sparse_y_in_cross_val_score(sparse_problem):
    """What docs/estimators.md says scikit-learn does with sparse Y (our cross_val_score is the way out)."""
    X, Y = sparse_problem
    with pytest.raises(ValueError, match="'y' parameter of cross_val_score"):
        sklearn_cross_val_score(model(), X, Y, cv=3)


@pytest.mark.filterwarnings("ignore:One or more of the test scores are non-finite")
def test_grid_search_roc_auc_on_sparse_y_is_a_real_number(sparse_problem):
    X, Y = sparse_problem
    grid = {"C": [0.1, 1.0]}
    search = GridSearchCV(model(), grid, scoring=SparseTargetScorer("roc_auc"), cv=KFold(3)).fit(X, Y)
    expected = [by_hand(X, Y, lambda m, X_test, Y_test: roc_auc_score(Y_test.toarray(), m.predict_proba(X_test)),
                        C=C).mean() for C in grid["C"]]
    np.testing.assert_allclose(search.cv_results_["mean_test_score"], expected, rtol=1e-12)
    assert search.best_params_["C"] == grid["C"][int(np.argmax(expected))]
    # a plain scoring string: scikit-learn's metric refuses sparse y_true on every fold and says so
    with pytest.warns(UserWarning, match="y_true"):
        plain = GridSearchCV(model(), grid, scoring="roc_auc", cv=KFold(3)).fit(X, Y)
    assert np.all(np.isnan(plain.cv_results_["mean_test_score"]))


# ---- feature names ---------------------------------------------------------------------------------------
class Frame:
    """The two things read from a DataFrame: ``columns`` and the values (``__array__``)."""

    def __init__(self, values, columns):
        self.values, self.columns = np.asarray(values), list(columns)

    def __array__(self, dtype=None, copy=None):
        return self.values if dtype is None else self.values.astype(dtype)

    def __getitem__(self, names):  # frame[["b", "a"]]: the named columns, in that order
        return Frame(self.values[:, [self.columns.index(name) for name in names]], names)


@pytest.fixture(scope="module")
def named_problem():
    X, Y = linear_multilabel_problem(n=80, d=4, n_labels=3, seed=5, density=0.7)
    return Frame(X.toarray(), ["a", "b", "c", "d"]), Y


def test_feature_names_are_recorded_and_a_mismatch_is_refused(named_problem):
    frame, Y = named_problem
    fitted = model().fit(frame, Y)
    assert fitted.feature_names_in_.dtype == object
    np.testing.assert_array_equal(fitted.feature_names_in_, ["a", "b", "c", "d"])
    reference = fitted.predict_proba(frame)
    np.testing.assert_allclose(reference, model().fit(frame.values, Y).predict_proba(frame.values), rtol=1e-6)
    with pytest.raises(ValidationError, match="same order as they were in fit"):
        fitted.predict_proba(frame[["b", "a", "c", "d"]])
    with pytest.raises(ValidationError, match="(?s)unseen at fit time:\n- e.*now missing:\n- d"):
        fitted.decision_function(Frame(frame.values, ["a", "b", "c", "e"]))
    with pytest.raises(ValidationError, match="now missing:\n- d"):
        fitted.predict(frame[["a", "b", "c"]])
    with pytest.warns(UserWarning, match="does not have valid feature names"):
        np.testing.assert_array_equal(fitted.predict_proba(frame.values), reference)
    # fitted without names, given names: a warning, as scikit-learn gives
    with pytest.warns(UserWarning, match="fitted without feature names"):
        model().fit(frame.values, Y).predict_proba(frame)
    # a refit without names forgets them
    assert not hasattr(fitted.fit(frame.values, Y), "feature_names_in_")


def test_feature_names_survive_save_and_load(named_problem, tmp_path):
    frame, Y = named_problem
    fitted = model().fit(frame, Y)
    fitted.save(tmp_path / "model.npz")
    loaded = LogisticRegression.load(tmp_path / "model.npz")
    np.testing.assert_array_equal(loaded.feature_names_in_, fitted.feature_names_in_)
    with pytest.raises(ValidationError, match="same order"):
        loaded.predict_proba(frame[["d", "c", "b", "a"]])


def test_non_string_and_mixed_feature_names(named_problem):
    frame, Y = named_problem
    assert not hasattr(model().fit(Frame(frame.values, [0, 1, 2, 3]), Y), "feature_names_in_")
    with pytest.raises(TypeError, match="all input features have string names"):
        model().fit(Frame(frame.values, ["a", 1, "c", "d"]), Y)


def test_pandas_dataframe(named_problem):
    pd = pytest.importorskip("pandas")
    frame, Y = named_problem
    df = pd.DataFrame(frame.values, columns=frame.columns)
    fitted = model().fit(df, Y)
    np.testing.assert_array_equal(fitted.feature_names_in_, df.columns)
    with pytest.raises(ValidationError, match="same order"):
        fitted.predict_proba(df[["b", "a", "c", "d"]])
    reference = model().fit(frame, Y).predict_proba(frame)  # outside the block: max_iter=8 warns of convergence
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fitted names: no warning
        np.testing.assert_array_equal(fitted.predict_proba(df), reference)
