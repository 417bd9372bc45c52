"""CalibratedClassifier: monotone maps that keep rankings, save/load, isotonic regression against a
pool-adjacent-violators loop, temperature and Platt scaling against grid search and scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression as SkLogisticRegression

from bayesmlc import metrics as M
from bayesmlc.base import MultiLabelEstimator
from bayesmlc.baselines import KNNBaseline
from bayesmlc.calibration import CalibratedClassifier, apply_isotonic, fit_isotonic, fit_platt, fit_temperature
from bayesmlc.exceptions import ValidationError
from bayesmlc.linear import LogisticRegression

from conftest import linear_multilabel_problem

METHODS = ("isotonic", "temperature", "platt")


class Overconfident(LogisticRegression):
    """A logistic regression whose probabilities are sigmoid(4 x score): right ranking, far too sure."""

    def _predict_proba(self, X):
        return 1.0 / (1.0 + np.exp(-4.0 * self._decision_function(X)))


def problem(n=600, n_labels=8, seed=0):
    X, Y = linear_multilabel_problem(n=n, d=40, n_labels=n_labels, seed=seed)
    return X, sp.csr_matrix(Y)


def pool_adjacent_violators(p, y):
    """Least-squares non-decreasing fit of y on p by the textbook loop; value at each sorted input."""
    order = np.argsort(p, kind="stable")
    xs, ys = np.asarray(p)[order], np.asarray(y, dtype=float)[order]
    # equal inputs are one block from the start (isotonic regression treats ties as one point)
    blocks = []  # [sum, count]
    for value in np.unique(xs):
        same = ys[xs == value]
        blocks.append([same.sum(), len(same)])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    fitted = np.concatenate([[total / count] * count for total, count in blocks])
    return xs, fitted


def brute_ece_at_1(dense_y, proba, scores):
    """ECE@1 with 15 bins by a loop: the top label of each row by score, its probability."""
    pairs = []
    for y, p, s in zip(dense_y, proba, scores):
        j = max(range(len(s)), key=lambda c: (s[c], -c))
        pairs.append((p[j], y[j]))
    total = 0.0
    for b in range(15):
        members = [(p, y) for p, y in pairs if min(int(p * 15), 14) == b]
        if members:
            total += abs(sum(y for _, y in members) - sum(p for p, _ in members))
    return total / len(pairs)


# ---- the maps --------------------------------------------------------------------------------------
def test_isotonic_map_is_pool_adjacent_violators():
    rng = np.random.default_rng(0)
    p = rng.random(300)
    y = (rng.random(300) < p**2).astype(float)
    thresholds = fit_isotonic(p, y)
    xs, fitted = pool_adjacent_violators(p, y)
    np.testing.assert_allclose(apply_isotonic(thresholds, xs), fitted, atol=1e-12)
    # below the smallest fitted probability: a line to (0, 0); above the largest: constant
    x0, g0 = thresholds[0, 0], thresholds[1, 0]
    assert apply_isotonic(thresholds, np.array([x0 / 2]))[0] == pytest.approx(g0 / 2)
    assert apply_isotonic(thresholds, np.array([1.0]))[0] == pytest.approx(thresholds[1, -1])


def test_temperature_matches_grid_search():
    rng = np.random.default_rng(1)
    z = rng.normal(scale=3.0, size=2000)
    y = (rng.random(2000) < 1 / (1 + np.exp(-z / 2.5))).astype(float)  # true temperature 2.5
    p = 1 / (1 + np.exp(-z))
    temperature = fit_temperature(p, y)
    grid = np.exp(np.linspace(np.log(0.2), np.log(20), 20001))
    losses = [np.mean(np.logaddexp(0, z / t) - y * z / t) for t in grid]
    assert temperature == pytest.approx(grid[int(np.argmin(losses))], rel=1e-3)
    assert temperature == pytest.approx(2.5, rel=0.15)


def test_platt_matches_unregularised_logistic_regression():
    rng = np.random.default_rng(2)
    z = rng.normal(scale=2.0, size=3000)
    y = (rng.random(3000) < 1 / (1 + np.exp(-(0.6 * z - 0.8)))).astype(float)
    a, b = fit_platt(1 / (1 + np.exp(-z)), y)
    reference = SkLogisticRegression(C=1e10, tol=1e-10, max_iter=1000).fit(z[:, None], y)
    assert a == pytest.approx(reference.coef_[0, 0], rel=1e-4)
    assert b == pytest.approx(reference.intercept_[0], rel=1e-4, abs=1e-5)


# ---- the estimator ---------------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_global_map_is_monotone_and_keeps_rankings(method):
    X, Y = problem()
    model = CalibratedClassifier(Overconfident(device="cpu"), method=method, min_label_positives=None,
                                 random_state=0).fit(X, Y)
    grid = np.linspace(0, 1, 2001)[None, :]
    assert np.all(np.diff(model.calibrate(grid)[0]) >= 0)
    raw = model.estimator_.predict_proba(X)
    calibrated = model.predict_proba(X)
    assert calibrated.min() >= 0 and calibrated.max() <= 1
    # in every row, a strictly higher raw probability never gets a strictly lower calibrated one
    for r, c in zip(raw, calibrated):
        higher = r[:, None] > r[None, :]
        assert not np.any(higher & (c[:, None] < c[None, :]))
        if method != "isotonic":  # strictly increasing maps keep clear differences strict
            inside = (r > 1e-6) & (r < 1 - 1e-6)
            clear = (r[:, None] > r[None, :] + 1e-4) & inside[:, None] & inside[None, :]
            assert not np.any(clear & (c[:, None] <= c[None, :]))
    # ranking is the wrapped estimator's
    np.testing.assert_array_equal(model.decision_function(X), model.estimator_.decision_function(X))


def test_isotonic_repairs_an_overconfident_model():
    X, Y = problem(n=3000, n_labels=10, seed=3)
    noise = np.random.default_rng(3).random(Y.shape) < 0.15  # flipped labels: no model can be sure
    Y = sp.csr_matrix(np.logical_xor(Y.toarray() > 0, noise).astype(np.float32))
    X_train, Y_train, X_test, Y_test = X[:2000], Y[:2000], X[2000:], Y[2000:]
    raw = Overconfident(device="cpu").fit(X_train, Y_train)
    model = CalibratedClassifier(Overconfident(device="cpu"), random_state=0).fit(X_train, Y_train)
    dense_y = Y_test.toarray()
    scores = model.decision_function(X_test)
    before = brute_ece_at_1(dense_y, raw.predict_proba(X_test), raw.decision_function(X_test))
    after = brute_ece_at_1(dense_y, model.predict_proba(X_test), scores)
    assert after == pytest.approx(M.ece_at_k(Y_test, model.predict_proba(X_test), 1, scores=scores), abs=1e-6)
    assert before > 0.08 and after < before / 2
    # the global map is the pool-adjacent-violators fit of the held-out top-5 pairs
    held = model.calibration_rows_
    held_scores = model.estimator_.decision_function(X[held[held < 2000]])
    assert held.max() < 2000 and held.size == 400
    top = np.argsort(-held_scores, axis=1, kind="stable")[:, :5]
    held_proba = model.estimator_.predict_proba(X_train[held])
    p = np.take_along_axis(held_proba, top, axis=1).ravel().astype(np.float64)
    y = np.take_along_axis(Y_train[held].toarray(), top, axis=1).ravel()
    xs, fitted = pool_adjacent_violators(p, y)
    np.testing.assert_allclose(apply_isotonic(model.global_map_, xs), fitted, atol=1e-6)


def test_per_label_maps_follow_the_documented_rule():
    X, Y = problem(n=800, n_labels=6, seed=4)
    rare = (np.random.default_rng(4).random((800, 2)) < 0.03).astype(np.float32)  # too few held-out positives
    Y = sp.hstack([Y, sp.csr_matrix(rare)], format="csr")
    model = CalibratedClassifier(LogisticRegression(device="cpu"), min_label_positives=40, random_state=1).fit(X, Y)
    held = Y[model.calibration_rows_].toarray()
    positives, negatives = held.sum(axis=0), (1 - held).sum(axis=0)
    expected = np.flatnonzero((positives >= 40) & (negatives >= 40))
    assert 0 < expected.size < Y.shape[1]
    np.testing.assert_array_equal(model.calibrated_labels_, expected)
    raw = model.estimator_.predict_proba(X)
    label = expected[0]
    np.testing.assert_allclose(model.predict_proba(X)[:, label],
                               apply_isotonic(model.label_maps_[0], raw[:, label].astype(np.float64)), atol=1e-6)


def test_label_mask_leaves_unobserved_pairs_out():
    X, Y = problem(n=500, seed=5)
    mask = (np.random.default_rng(5).random(Y.shape) < 0.8).astype(np.float32)
    model = CalibratedClassifier(LogisticRegression(device="cpu"), random_state=2).fit(X, Y, label_mask=mask)
    # flipping unobserved labels changes nothing
    flipped = Y.toarray()
    flipped[mask == 0] = 1 - flipped[mask == 0]
    again = CalibratedClassifier(LogisticRegression(device="cpu"), random_state=2).fit(X, flipped, label_mask=mask)
    np.testing.assert_allclose(model.predict_proba(X), again.predict_proba(X), atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_round_trip_through_save_and_load(tmp_path, method):
    X, Y = problem(n=500, seed=6)
    model = CalibratedClassifier(LogisticRegression(device="cpu"), method=method, min_label_positives=30,
                                 random_state=3).fit(X, Y)
    assert model.calibrated_labels_.size > 0
    path = tmp_path / "calibrated.npz"
    model.save(path)
    loaded = MultiLabelEstimator.load(path)
    assert isinstance(loaded, CalibratedClassifier)
    assert loaded.get_params(deep=False).keys() == model.get_params(deep=False).keys()
    assert isinstance(loaded.estimator, LogisticRegression) and not hasattr(loaded.estimator, "n_labels_")
    np.testing.assert_array_equal(loaded.predict_proba(X), model.predict_proba(X))
    np.testing.assert_array_equal(loaded.decision_function(X), model.decision_function(X))
    np.testing.assert_array_equal(loaded.calibrated_labels_, model.calibrated_labels_)


def test_wraps_a_baseline_and_round_trips(tmp_path):
    X, Y = problem(n=400, seed=7)
    model = CalibratedClassifier(KNNBaseline(n_neighbors=5), method="platt", random_state=0).fit(X, Y)
    path = tmp_path / "knn.npz"
    model.save(path)
    loaded = CalibratedClassifier.load(path)
    np.testing.assert_array_equal(loaded.predict_proba(X[:50]), model.predict_proba(X[:50]))


def test_same_seed_same_result_and_errors():
    X, Y = problem(n=300, seed=8)
    first = CalibratedClassifier(LogisticRegression(device="cpu"), random_state=4).fit(X, Y)
    again = CalibratedClassifier(LogisticRegression(device="cpu"), random_state=4).fit(X, Y)
    other = CalibratedClassifier(LogisticRegression(device="cpu"), random_state=5).fit(X, Y)
    np.testing.assert_array_equal(first.calibration_rows_, again.calibration_rows_)
    np.testing.assert_array_equal(first.predict_proba(X), again.predict_proba(X))
    assert not np.array_equal(first.calibration_rows_, other.calibration_rows_)
    for kwargs, message in (
        ({"estimator": None}, "bayesmlc estimator"),
        ({"method": "beta"}, "method must be"),
        ({"calibration_fraction": 1.0}, "calibration_fraction"),
        ({"calibration_fraction": 0.0001}, "no rows to calibrate on"),
        ({"top_k": 0}, "top_k"),
        ({"min_label_positives": 0}, "min_label_positives"),
    ):
        params = {"estimator": LogisticRegression(device="cpu"), **kwargs}
        with pytest.raises(ValidationError, match=message):
            CalibratedClassifier(**params).fit(X, Y)


def test_cross_fitting_pools_every_rows_held_out_pairs_and_keeps_the_full_model():
    # cv=3 by hand: three clones, each fitted without one fold (the folds: a seeded permutation dealt
    # round-robin), predict that fold; the global map is the pool-adjacent-violators fit of all the
    # pooled top-5 pairs, and estimator_ is the estimator fitted on every row
    X, Y = problem(n=900, n_labels=10, seed=9)
    noise = np.random.default_rng(9).random(Y.shape) < 0.15
    Y = sp.csr_matrix(np.logical_xor(Y.toarray() > 0, noise).astype(np.float32))
    model = CalibratedClassifier(Overconfident(device="cpu"), cv=3, min_label_positives=None, random_state=2).fit(X, Y)
    order = np.random.RandomState(2).permutation(900)
    p_all, y_all = [], []
    for fold in range(3):
        held = np.sort(order[fold::3])
        kept = np.setdiff1d(np.arange(900), held)
        clone_fit = Overconfident(device="cpu").fit(X[kept], Y[kept])
        top = np.argsort(-clone_fit.decision_function(X[held]), axis=1, kind="stable")[:, :5]
        p_all.append(np.take_along_axis(clone_fit.predict_proba(X[held]), top, axis=1).ravel().astype(np.float64))
        y_all.append(np.take_along_axis(Y[held].toarray(), top, axis=1).ravel())
    xs, fitted = pool_adjacent_violators(np.concatenate(p_all), np.concatenate(y_all))
    np.testing.assert_allclose(apply_isotonic(model.global_map_, xs), fitted, atol=1e-6)
    full = Overconfident(device="cpu").fit(X, Y)
    np.testing.assert_allclose(model.decision_function(X), full.decision_function(X), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(model.calibration_rows_, np.arange(900))
    # the map is monotone: each row's ranking is kept (up to ties)
    proba, scores = model.predict_proba(X), model.decision_function(X)
    ranked = np.take_along_axis(proba, np.argsort(-scores, axis=1, kind="stable"), axis=1)
    assert np.all(np.diff(ranked, axis=1) <= 1e-7)
    with pytest.raises(ValidationError, match="cv=1000 folds need at least 1000 rows, got n_samples=900"):
        CalibratedClassifier(Overconfident(device="cpu"), cv=1000).fit(X, Y)
    with pytest.raises(ValidationError, match="cv"):
        CalibratedClassifier(Overconfident(device="cpu"), cv=1).fit(X, Y)


def test_cross_fitted_model_round_trips(tmp_path):
    X, Y = problem(n=400, seed=10)
    model = CalibratedClassifier(LogisticRegression(device="cpu"), cv=4, min_label_positives=30, random_state=0).fit(X, Y)
    path = tmp_path / "cv.npz"
    model.save(path)
    loaded = CalibratedClassifier.load(path)
    assert loaded.cv == 4
    np.testing.assert_array_equal(loaded.predict_proba(X), model.predict_proba(X))
