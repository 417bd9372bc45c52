"""BNMC on many labels: the calibration's weighted negative sample."""

import numpy as np

from bayesmlc.bnmc import rank_calibration
from bayesmlc.bnmc.rank_calibration import fit_calibration, negative_sample_weights


def _sparse_label_evidence(rng, n, L):
    """Evidence and labels of many rare labels: logit z = 1.2 s_clf + 0.3 s_pat - 3 (about 7% positives)."""
    s_clf, s_pat = rng.normal(-0.5, 1.5, (n, L)), rng.normal(0.0, 1.0, (n, L))
    z = 1.2 * s_clf + 0.3 * s_pat - 3.0
    Y = (rng.random(z.shape) < 1.0 / (1.0 + np.exp(-z))).astype(float)
    return s_clf, s_pat, Y


def test_negative_sample_weights_keep_positives_and_reweight_negatives(monkeypatch):
    rng = np.random.default_rng(0)
    _, _, Y = _sparse_label_evidence(rng, 400, 100)
    observed = rng.random(Y.shape) < 0.95
    assert negative_sample_weights(Y, observed) is None  # 38,000 entries: under the threshold
    monkeypatch.setattr(rank_calibration, "CALIBRATION_FULL_ENTRIES", 10_000)
    monkeypatch.setattr(rank_calibration, "CALIBRATION_NEGATIVES", 5_000)
    weights = negative_sample_weights(Y, observed)
    negatives = observed & (Y == 0)
    assert np.all(weights[observed & (Y == 1)] == 1.0) and np.all(weights[~observed] == 0.0)
    rate = 5_000 / negatives.sum()
    kept = weights[negatives] > 0
    np.testing.assert_allclose(weights[negatives][kept], 1.0 / rate)
    # the kept count is Binomial(negatives, rate): within 4 standard deviations of its mean
    assert abs(kept.sum() - 5_000) < 4 * np.sqrt(5_000 * (1 - rate))


def test_the_sampled_calibration_matches_the_full_one(monkeypatch):
    # 3,000 rows x 200 labels (600,000 entries): the fit on all of them, then on 60,000 negatives
    # weighted by 1 / q; both near the generating (1.2, 0.3, -3) and the probabilities of each
    # row's top five within 0.01 of each other
    rng = np.random.default_rng(1)
    s_clf, s_pat, Y = _sparse_label_evidence(rng, 3000, 200)
    observed = np.ones(Y.shape, dtype=bool)
    full = fit_calibration(s_clf, s_pat, Y, observed)
    monkeypatch.setattr(rank_calibration, "CALIBRATION_FULL_ENTRIES", 100_000)
    monkeypatch.setattr(rank_calibration, "CALIBRATION_NEGATIVES", 60_000)
    sampled = fit_calibration(s_clf, s_pat, Y, observed)
    for fit in (full, sampled):
        np.testing.assert_allclose(fit[0], [1.2, 0.3, -3.0], atol=0.06)
    logits = [rank_calibration.calibrated_probability_logits(s_clf, s_pat, *fit) for fit in (full, sampled)]
    top = rank_calibration.top_positions(logits[0], 5)
    p_full, p_sampled = (np.take_along_axis(1.0 / (1.0 + np.exp(-value)), top, axis=1) for value in logits)
    assert np.abs(p_full - p_sampled).mean(axis=0).max() < 0.01


def test_labels_without_a_positive_get_the_rare_label_bias_and_leave_the_others_alone():
    # the low-rank fit with two empty label columns added: the other labels' classifiers are the fit
    # without them (to the CG tolerance), the empty ones have no weights and the bias
    # logit(1/2 / (m + 1)) = log(0.5 / (m + 0.5)), m the observed entries: the rows with a label
    # (rows without one are missing label vectors by default)
    import scipy.sparse as sp

    from bayesmlc.bnmc import BNMC
    from test_bnmc_scale import FAST, _low_rank_problem

    X, Y = _low_rank_problem(n=300, L=12)
    params = dict(solver="lowrank", low_rank=8, random_state=0, validation_fraction=0.0, **FAST)
    plain = BNMC(**params).fit(X, Y)
    padded_Y = sp.hstack([Y[:, :5], sp.csr_matrix((300, 1)), Y[:, 5:], sp.csr_matrix((300, 1))], format="csr")
    padded = BNMC(**params).fit(X, padded_Y)
    kept = np.r_[0:5, 6:13]
    np.testing.assert_allclose(padded.classifier_samples_[:, :, kept], plain.classifier_samples_, rtol=0, atol=2e-3)
    np.testing.assert_allclose(padded.classifier_variances_[:, kept], plain.classifier_variances_, rtol=0, atol=2e-3)
    for empty in (5, 13):
        assert np.all(padded.classifier_samples_[:, :-1, empty] == 0.0)
        m = int(np.sum(np.diff(Y.indptr) > 0))
        np.testing.assert_allclose(padded.classifier_samples_[:, -1, empty], np.log(0.5 / (m + 0.5)), rtol=1e-6)
        assert np.all(padded.classifier_variances_[:, empty] == 0.0)
