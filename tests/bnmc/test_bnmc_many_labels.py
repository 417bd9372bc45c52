"""BNMC on many labels: the calibration's negative sample, absent labels, count features, the low-rank prior."""

import numpy as np
import pytest

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


def _count_problem(seed=0, n=240, D=80, L=6):
    """Word-count-like features (Poisson counts, most zero) and labels driven by a few of the columns."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    X = rng.poisson(0.4, size=(n, D)) * (rng.random((n, D)) < 0.3)
    X[:, 0] += 1  # no empty row
    W = rng.normal(size=(D, L)) * (rng.random((D, L)) < 0.2)
    Y = (X / (1.0 + X.sum(axis=1, keepdims=True))) @ W * 8.0 + rng.normal(scale=0.3, size=(n, L)) > 0.2
    Y[np.arange(n), rng.integers(0, L, n)] = True  # every row has a label
    return sp.csr_matrix(X.astype(np.float32)), sp.csr_matrix(Y.astype(np.float32))


def test_auto_weighting_takes_idf_for_counts_only():
    import scipy.sparse as sp

    from bayesmlc.bnmc.classifier_fitting import resolve_feature_weighting

    X, _ = _count_problem()
    assert resolve_feature_weighting("auto", X) == "idf"
    assert resolve_feature_weighting("auto", sp.csr_matrix((X > 0).astype(np.float32))) == "none"  # binary
    assert resolve_feature_weighting("auto", sp.csr_matrix(X * 0.37)) == "none"  # real-valued
    assert resolve_feature_weighting("l2", sp.csr_matrix(X * 0.37)) == "l2"
    # summed over processes: one process holding a count above 1 is enough
    assert resolve_feature_weighting("auto", sp.csr_matrix((X > 0).astype(np.float32)),
                                     reduce=lambda tallies: tallies + np.array([0.0, 1.0])) == "idf"


def test_idf_weighting_gives_the_classifiers_tfidf_rows_and_the_mixture_raw_counts(tmp_path):
    # the classifier features are scikit-learn's TfidfTransformer (smooth idf, raw tf, unit L2 rows);
    # the mixture still sees the counts (its feature statistics are those of the raw rows); a saved
    # model predicts the same after loading
    from sklearn.feature_extraction.text import TfidfTransformer

    from bayesmlc.bnmc import BNMC

    X, Y = _count_problem()
    model = BNMC(random_state=0, n_passes=1, n_sweeps=2, n_keep=1, n_mode_steps=2, device="cpu").fit(X, Y)
    assert model.feature_weighting_ == "idf"
    expected = TfidfTransformer().fit(X).transform(X).toarray()
    np.testing.assert_allclose(model._classifier_features(X).toarray(), expected, rtol=1e-5, atol=1e-7)
    raw = BNMC(random_state=0, feature_weighting="none", n_passes=1, n_sweeps=2, n_keep=1, n_mode_steps=2,
               device="cpu").fit(X, Y)
    np.testing.assert_allclose(model.pattern_weights_, raw.pattern_weights_, rtol=1e-10)
    model.save(tmp_path / "bnmc.npz")
    loaded = BNMC.load(tmp_path / "bnmc.npz")
    np.testing.assert_allclose(loaded.predict_proba(X), model.predict_proba(X), rtol=1e-6)


def test_auto_cross_fits_only_where_rows_times_labels_are_few():
    from bayesmlc.bnmc import BNMC
    from bayesmlc.bnmc.classifier_fitting import CROSS_FIT_MAX_ENTRIES, calibration_fold_count

    assert calibration_fold_count(BNMC(), 2000, n_labels=CROSS_FIT_MAX_ENTRIES // 2000) == 5
    assert calibration_fold_count(BNMC(), 2000, n_labels=CROSS_FIT_MAX_ENTRIES // 2000 + 1) == 1
    assert calibration_fold_count(BNMC(), 2473, n_labels=4125) == 1  # hmc_cellcycle_go: 10M entries
    assert calibration_fold_count(BNMC(calibration_folds=5), 2473, n_labels=4125) == 5  # asked for


def test_the_low_rank_prior_is_set_on_the_projected_rows():
    # weight_precision="auto" on the low-rank solver: mean_i |x_i V|^2 / 7 over the rows, by hand from
    # the stored basis V; below the exact solvers' mean |x_i|^2 / 7, as V keeps part of each row's norm
    from bayesmlc.bnmc import BNMC
    from test_bnmc_scale import FAST, _low_rank_problem

    X, Y = _low_rank_problem(n=300, L=12)
    model = BNMC(solver="lowrank", low_rank=4, random_state=0, **FAST).fit(X, Y)
    projected = X.toarray().astype(np.float64) @ model.classifier_basis_.astype(np.float64)
    expected = np.mean(np.sum(projected**2, axis=1)) / 7.0
    assert model.weight_precision_ == pytest.approx(expected, rel=1e-5)
    assert model.weight_precision_ < 0.99 * np.mean(np.asarray(X.multiply(X).sum(axis=1))) / 7.0


def test_scores_and_probability_logits_equal_the_two_computed_apart():
    """One z and one top_positions for both outputs give what the ranking score and the calibrated
    probability logits give apart, with every rank term set, a top-label map and tied scores (rounded
    evidence, so argmax's lower-index rule decides the lead)."""
    rng = np.random.default_rng(5)
    s_clf, s_pat = np.round(rng.normal(size=(2, 60, 9)), 1)
    theta, probability_theta = np.array([1.2, 0.4, -0.3]), np.array([0.9, 0.6, -0.5])
    terms = rank_calibration.RankTerms(0.7, 0.2, -0.3, 0.4, 0.1, 0.25, -0.05)
    top_map = np.array([0.8, 1.1, 0.2])
    scores, logits = rank_calibration.scores_and_probability_logits(s_clf, s_pat, theta, probability_theta,
                                                                    terms, top_map)
    z = theta[0] * s_clf + theta[1] * s_pat + theta[2]
    np.testing.assert_array_equal(scores, rank_calibration.rank_adjusted_logits(z.copy(), terms))
    np.testing.assert_array_equal(logits, rank_calibration.calibrated_probability_logits(
        s_clf, s_pat, theta, probability_theta, terms, top_map))
    lead = np.argmax(z, axis=1)  # ties to the lower index; the offset r lands on that label only
    np.testing.assert_allclose(scores[np.arange(60), lead] - z[np.arange(60), lead], terms.offset, atol=1e-12)
    assert np.count_nonzero(scores != z) == 60


def test_the_refit_is_skipped_when_the_capped_split_holds_under_5_percent_of_the_rows(monkeypatch):
    import bayesmlc.bnmc.classifier_fitting as classifier_fitting
    from bayesmlc.bnmc import BNMC
    from test_bnmc_scale import FAST, _low_rank_problem

    X, Y = _low_rank_problem(n=300, L=12)
    params = dict(solver="lowrank", low_rank=8, random_state=0, calibration_folds=1, **FAST)
    first_fit = FAST["n_mode_steps"] + FAST["n_sweeps"]
    refitted = BNMC(**params).fit(X, Y)  # 20% held out: the refit's mode step and sweeps follow
    assert refitted.classifier_trace_.size == first_fit + 1 + max(2, FAST["n_sweeps"] // 2)
    monkeypatch.setattr(classifier_fitting, "VALIDATION_ENTRIES", 12 * 10)  # 10 rows held out, under 5%
    capped = BNMC(**params).fit(X, Y)
    assert capped.classifier_trace_.size == first_fit
    assert classifier_fitting.classifier_steps(capped, 290, 12) == first_fit  # the progress bar's count


def test_top_positions_equal_a_stable_sort_with_ties_at_the_boundary():
    """Each row's m best columns, best first, ties to the lower index even where a tie straddles the
    m-th place (one value repeated across many columns)."""
    rng = np.random.default_rng(8)
    z = np.round(rng.normal(size=(200, 50)), 0)
    for m in (1, 2, 6, 50):
        np.testing.assert_array_equal(rank_calibration.top_positions(z, m),
                                      np.argsort(-z, axis=1, kind="stable")[:, :m])
