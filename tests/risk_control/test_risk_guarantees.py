"""The guarantees of bayesmlc.risk_control, by simulation: many random calibration sets drawn from a
known (calibrated) model, the chosen threshold's true risk measured on a large reference sample from
the same model. CRC: the mean risk <= alpha within Monte Carlo error; RCPS, LTT (precision) and the
selective top-1 controller: the share of calibration sets whose threshold violates alpha <= delta
within Monte Carlo error."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from bayesmlc.risk_control import calibrate_threshold, candidates_from_topk
from bayesmlc.risk_control.procedures import precision_risk_curve, recall_risk_curve, selective_risk_curve

N_TRIALS = 200
N_LABELS = 20


def draw(n, seed, K=N_LABELS):
    """n rows of a known model: probabilities from a logistic of Gaussian label and row effects,
    labels drawn from them (rows without labels included), the K most probable as candidates."""
    rng = np.random.default_rng(seed)
    proba = 1 / (1 + np.exp(-(rng.normal(-2.0, 1.8, size=(n, N_LABELS)) + rng.normal(0, 1.0, size=(n, 1)))))
    Y = sp.csr_matrix((rng.random((n, N_LABELS)) < proba).astype(np.float32))
    labels = np.argsort(-proba, axis=1)[:, :K]
    return candidates_from_topk(labels, np.take_along_axis(proba, labels, axis=1), Y)


@pytest.fixture(scope="module")
def reference():
    """The 'population': 100,000 rows on which a threshold's true risk is measured (standard error
    about 0.001, small beside the Monte Carlo error of N_TRIALS calibration sets)."""
    return draw(100_000, seed=10_000)


def thresholds(risk, n, alpha, delta, K=N_LABELS, **options):
    return np.array([calibrate_threshold(draw(n, seed, K), risk, alpha, delta, **options).threshold
                     for seed in range(N_TRIALS)])


def test_crc_mean_recall_risk_at_most_alpha(reference):
    alpha = 0.1
    chosen = thresholds("recall", 100, alpha, 0.1, method="crc")
    risks, _ = recall_risk_curve(reference, chosen)
    error = 3 * risks.std(ddof=1) / np.sqrt(N_TRIALS)
    assert risks.mean() <= alpha + error + 0.002
    # and not trivially conservative: CRC's risk is at least alpha - 1 / (n + 1) up to ties
    assert risks.mean() >= alpha - 1 / 101 - error - 0.01


def test_crc_with_few_candidates_is_infeasible_not_wrong(reference):
    """With K = 2 candidates recall 0.9 is out of reach: every candidate is taken and flagged."""
    c = draw(200, seed=1, K=2)
    chosen = calibrate_threshold(c, "recall", 0.1)
    assert not chosen.feasible and chosen.threshold == c.proba.min()


def violation_share(true_risks, alpha):
    return float(np.mean(true_risks > alpha))


def test_rcps_violations_at_most_delta(reference):
    alpha, delta = 0.15, 0.1
    for bound in ("hb", "hoeffding", "bernstein"):
        chosen = thresholds("recall", 200, alpha, delta, method="rcps", bound=bound)
        risks, _ = recall_risk_curve(reference, chosen)
        share = violation_share(risks, alpha)
        assert share <= delta + 3 * np.sqrt(delta * (1 - delta) / N_TRIALS), bound
        assert risks.max() < alpha + 0.1  # a sanity bound: thresholds are not far off


def test_ltt_precision_violations_at_most_delta(reference):
    alpha, delta = 0.3, 0.1
    chosen = thresholds("precision", 200, alpha, delta)
    assert np.isfinite(chosen).mean() > 0.9  # the simulation is one where LTT finds thresholds
    risks = precision_risk_curve(reference, np.unique(chosen))[np.searchsorted(np.unique(chosen), chosen)]
    assert violation_share(risks, alpha) <= delta + 3 * np.sqrt(delta * (1 - delta) / N_TRIALS)


def test_selective_violations_at_most_delta_and_coverage(reference):
    alpha, delta = 0.2, 0.1
    chosen = thresholds("selective", 400, alpha, delta)
    feasible = np.isfinite(chosen)
    assert feasible.mean() > 0.9
    errors, answered = selective_risk_curve(reference, chosen[feasible])
    risks = np.zeros(N_TRIALS)  # an infeasible threshold answers nothing: no error
    risks[feasible] = errors / answered
    assert violation_share(risks, alpha) <= delta + 3 * np.sqrt(delta * (1 - delta) / N_TRIALS)
    assert (answered / reference.n_rows).mean() > 0.1  # it does answer rows
