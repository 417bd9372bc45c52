"""The calibration procedures of bayesmlc.risk_control against independent computations: brute-force
dense risks at every threshold, hand-worked examples, scipy's binomial, and MAPIE's
MultiLabelClassificationController on small label counts."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.stats import binom

from bayesmlc.exceptions import ValidationError
from bayesmlc.risk_control import (DEFAULT_GRID, calibrate_threshold, candidates_from_topk, crc,
                                   hoeffding_bentkus_p_value, ltt, rcps, realised)


def simulated(n=300, n_labels=6, seed=0, empty_rows=True):
    """Probabilities of a known model and labels drawn from them: (proba (n, L), Y (n, L) 0/1)."""
    rng = np.random.default_rng(seed)
    proba = 1 / (1 + np.exp(-(rng.normal(-1.0, 1.6, size=(n, n_labels)) + rng.normal(0, 0.5, size=(n, 1)))))
    proba = np.round(proba, 6)  # ties and exact values, as float32 probabilities have
    Y = (rng.random((n, n_labels)) < proba).astype(np.float64)
    if not empty_rows:
        empty = Y.sum(axis=1) == 0
        Y[empty, np.argmax(proba[empty], axis=1)] = 1.0
    return proba, Y


def all_candidates(proba, Y, label_mask=None):
    n, n_labels = proba.shape
    labels = np.tile(np.arange(n_labels), (n, 1))
    return candidates_from_topk(labels, proba, sp.csr_matrix(Y), label_mask)


def dense_recall(proba, Y, t):
    in_set = proba >= t
    n_true = Y.sum(axis=1)
    missed = ((Y > 0) & ~in_set).sum(axis=1)
    return np.where(n_true > 0, missed / np.maximum(n_true, 1), 0.0)


def dense_fdp(proba, Y, t, empty=0.0):
    in_set = proba >= t
    size = in_set.sum(axis=1)
    false = (in_set & (Y == 0)).sum(axis=1)
    return np.where(size > 0, false / np.maximum(size, 1), empty)


def test_candidates_sorted_and_hits_from_sparse_labels():
    labels = np.array([[2, 0, 1], [1, 2, 0]])
    proba = np.array([[0.2, 0.7, 0.2], [0.1, 0.9, 0.5]])
    Y = sp.csr_matrix(np.array([[0, 0, 1, 1], [1, 0, 0, 0]]))
    mask = sp.csr_matrix(np.array([[1, 1, 0, 1], [1, 1, 1, 1]]))
    c = candidates_from_topk(labels, proba, Y, mask)
    np.testing.assert_array_equal(c.labels, [[0, 1, 2], [2, 0, 1]])  # ties to the lower label
    np.testing.assert_array_equal(c.hit, [[False, False, False], [False, True, False]])  # label 2 unobserved
    np.testing.assert_array_equal(c.observed, [[True, True, False], [True, True, True]])
    np.testing.assert_array_equal(c.n_true, [1, 1])  # row 0: label 3 only (2 is unobserved)
    # an explicit zero of Y is no label, and the caller's matrix is left as it was
    explicit = sp.csr_matrix((np.array([1.0, 0.0]), np.array([2, 1]), np.array([0, 1, 2])), shape=(2, 4))
    c = candidates_from_topk(np.array([[2, 1], [1, 0]]), np.array([[0.5, 0.4], [0.9, 0.1]]), explicit)
    np.testing.assert_array_equal(c.hit, [[True, False], [False, False]])
    assert explicit.nnz == 2 and explicit.data.tolist() == [1.0, 0.0]


def test_exact_crc_matches_brute_force_over_every_threshold():
    proba, Y = simulated(n=250, seed=1)
    c = all_candidates(proba, Y)
    alpha, n = 0.15, proba.shape[0]
    chosen = crc(c, alpha)
    grid = np.concatenate([[np.inf], np.unique(proba)[::-1]])
    passing = [t for t in grid if n / (n + 1) * dense_recall(proba, Y, t).mean() + 1 / (n + 1) <= alpha]
    assert chosen.feasible and chosen.threshold == pytest.approx(max(passing))
    assert chosen.empirical_risk == pytest.approx(dense_recall(proba, Y, chosen.threshold).mean())


def test_rcps_bounds_and_hb_p_value_by_hand():
    proba, Y = simulated(n=400, seed=2)
    c = all_candidates(proba, Y)
    n, alpha, delta = proba.shape[0], 0.2, 0.1
    grid = np.unique(proba)[::-1]
    risks = np.array([dense_recall(proba, Y, t).mean() for t in grid])
    variances = np.array([dense_recall(proba, Y, t).var(ddof=1) for t in grid])
    bounds = {
        "hoeffding": risks + np.sqrt(np.log(1 / delta) / (2 * n)),
        "bernstein": risks + np.sqrt(2 * variances * np.log(2 / delta) / n) + 7 * np.log(2 / delta) / (3 * (n - 1)),
    }
    for bound, upper in bounds.items():
        ok = upper < alpha  # the largest t with every smaller threshold passing
        suffix = np.flip(np.logical_and.accumulate(np.flip(ok)))
        expected = grid[np.flatnonzero(suffix)[0]]
        assert rcps(c, alpha, delta, bound).threshold == pytest.approx(expected), bound
    # Hoeffding-Bentkus: min of exp(-n h1) and e * binomial cdf, by hand at one point
    r, m = 0.13, 200
    h1 = r * np.log(r / 0.2) + (1 - r) * np.log((1 - r) / 0.8)
    expected = min(np.exp(-m * h1), np.e * binom.cdf(np.ceil(m * r), m, 0.2))
    assert hoeffding_bentkus_p_value(r, m, 0.2)[()] == pytest.approx(expected)
    assert hoeffding_bentkus_p_value(0.25, m, 0.2)[()] == pytest.approx(min(1.0, np.e * binom.cdf(50, m, 0.2)))


def test_ltt_fixed_sequence_by_hand():
    proba, Y = simulated(n=500, seed=3)
    c = all_candidates(proba, Y)
    alpha, delta, n = 0.2, 0.1, proba.shape[0]
    grid = DEFAULT_GRID[::-1]
    risks = np.array([dense_fdp(proba, Y, t).mean() for t in grid])
    p = np.array([hoeffding_bentkus_p_value(r, n, alpha)[()] for r in risks])
    run = np.logical_and.accumulate(p <= delta)
    chosen = ltt(c, "precision", alpha, delta)
    assert chosen.feasible and chosen.threshold == pytest.approx(grid[np.flatnonzero(run)[-1]])
    assert chosen.empirical_risk == pytest.approx(risks[np.flatnonzero(run)[-1]])
    # selective: binary p-values over the answered rows
    top = proba.max(axis=1)
    wrong = Y[np.arange(n), proba.argmax(axis=1)] == 0
    answered = np.array([(top >= t).sum() for t in grid])
    errors = np.array([(wrong & (top >= t)).sum() for t in grid])
    p = np.where(answered > 0, [min(1.0, binom.cdf(e, a, alpha)) if a else 1.0 for e, a in zip(errors, answered)], 1)
    hoeffding = np.array([hoeffding_bentkus_p_value(e / a if a else 0, a, alpha, binary=True)[()]
                          for e, a in zip(errors, answered)])
    assert np.all(hoeffding <= p + 1e-12)
    run = np.logical_and.accumulate(hoeffding <= delta)
    chosen = ltt(c, "selective", alpha, delta, n_starts=1)
    if run.any():
        assert chosen.threshold == pytest.approx(grid[np.flatnonzero(run)[-1]])
    else:
        assert not chosen.feasible and chosen.threshold == np.inf


def test_rows_without_labels_and_masks():
    proba = np.array([[0.9, 0.5, 0.1], [0.8, 0.3, 0.2]])
    Y = np.array([[0, 0, 0], [1, 0, 1]])
    c = all_candidates(proba, Y)
    # at t = 0.25 row 0 misses nothing (no label), row 1 misses label 2 of 2: recall loss 0.5
    assert realised(c, "recall", 0.25)["realised_risk"] == pytest.approx(0.25)
    # precision at 0.25: row 0 {0, 1} both false, row 1 {0, 1}: 1 of 2 false
    assert realised(c, "precision", 0.25)["realised_risk"] == pytest.approx(0.75)
    # a mask hiding (1, 1): row 1's set {0, 1} has one observed label, a hit
    mask = sp.csr_matrix(np.array([[1, 1, 1], [1, 0, 1]]))
    masked = all_candidates(proba, Y, mask)
    assert realised(masked, "precision", 0.25)["realised_risk"] == pytest.approx(0.5)
    # selective at 0.85: only row 0 answered, wrongly
    assert realised(c, "selective", 0.85) == {"realised_risk": 1.0, "mean_set_size": 0.5, "coverage": 0.5}
    with pytest.raises(ValidationError, match="alpha"):
        calibrate_threshold(c, "recall", 1.5)
    with pytest.raises(ValidationError, match="does not control"):
        calibrate_threshold(c, "precision", 0.1, method="crc")


# ---- agreement with MAPIE (test extra) ------------------------------------------------------
def _mapie_threshold(proba, Y, **kwargs):
    mapie = pytest.importorskip("mapie.risk_control")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        controller = mapie.MultiLabelClassificationController(predict_function=lambda X: proba[X[:, 0]], **kwargs)
        controller.calibrate(np.arange(len(proba))[:, None], Y.astype(int))
    return float(controller.best_predict_param[0])


def confident(n=150, n_labels=6, seed=0):
    """A known model with one likely label per row (so that high thresholds rarely leave a set empty)."""
    rng = np.random.default_rng(seed)
    proba = np.round(rng.uniform(0.0, 0.3, size=(n, n_labels)), 6)
    proba[np.arange(n), rng.integers(0, n_labels, n)] = np.round(rng.uniform(0.8, 1.0, n), 6)
    Y = (rng.random((n, n_labels)) < proba).astype(np.float64)
    empty = Y.sum(axis=1) == 0
    Y[empty, np.argmax(proba[empty], axis=1)] = 1.0
    return proba, Y


@pytest.mark.parametrize("seed", [0, 1])
def test_thresholds_agree_with_mapie(seed):
    """MAPIE puts a label in the set when p > lambda on the grid 0, 0.01, ..., 0.99; here p >= t,
    so its lambda is our t = nextafter(lambda, inf). MAPIE refuses rows without labels and counts an
    empty set's precision loss as 1."""
    grid = np.nextafter(DEFAULT_GRID, np.inf)
    delta = 0.1
    cases = [
        (0.85, dict(risk="recall", method="crc"), dict(risk="recall", method="crc")),
        (0.8, dict(risk="recall", method="rcps", rcps_bound="hoeffding", confidence_level=0.9),
         dict(risk="recall", method="rcps", bound="hoeffding", delta=delta)),
        (0.8, dict(risk="recall", method="rcps", rcps_bound="bernstein", confidence_level=0.9),
         dict(risk="recall", method="rcps", bound="bernstein", delta=delta)),
        (0.7, dict(risk="precision", method="ltt", confidence_level=0.9),
         dict(risk="precision", method="ltt", fwer="holm", empty_set_loss=1.0, delta=delta)),
    ]
    for target, theirs, ours in cases:
        proba, Y = (confident if theirs["risk"] == "precision" else simulated)(n=150, seed=seed, **(
            {} if theirs["risk"] == "precision" else {"empty_rows": False}))
        lam = _mapie_threshold(proba, Y, target_level=target, **theirs)
        chosen = calibrate_threshold(all_candidates(proba, Y), alpha=1 - target, thresholds=grid, **ours)
        assert not np.isnan(lam), theirs  # the cases are chosen so that MAPIE finds a threshold
        assert chosen.feasible and chosen.threshold == np.nextafter(lam, np.inf), (theirs, lam, chosen)
