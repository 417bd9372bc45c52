"""BNMC: mixture recovery, ELBO, solvers, prediction rules, missing labels, online learning."""

import copy
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from sklearn.metrics import adjusted_rand_score

from bayesmlc.bnmc import BNMC
from bayesmlc.bnmc.classifiers import Design, _sample_cg, _sample_dense, _sample_woodbury
from bayesmlc.exceptions import NotFittedError, ValidationError
from bayesmlc.metrics import auc_micro, expected_calibration_error, f1_example


def make_pattern_data(n=600, n_patterns=4, n_features=40, n_labels=12, seed=0, gaussian=False):
    """Rows drawn from a mixture of ``n_patterns`` (feature, label) patterns.

    Features: Dirichlet-multinomial counts (60 draws per row) from a pattern-specific distribution
    concentrated on its own block of features, or Gaussian around pattern means (with negative
    values). Labels: 1-3 draws from the pattern's label distribution (each pattern owns 3 labels).
    Returns X (CSR), Y (CSR 0/1), z (true patterns).
    """
    rng = np.random.default_rng(seed)
    z = rng.integers(n_patterns, size=n)
    block = n_features // n_patterns
    if gaussian:
        means = rng.normal(0.0, 2.0, size=(n_patterns, n_features))
        X = means[z] + rng.normal(0.0, 1.0, size=(n, n_features))
    else:
        probs = np.full((n_patterns, n_features), 0.2)
        for k in range(n_patterns):
            probs[k, k * block:(k + 1) * block] = 5.0
        probs /= probs.sum(axis=1, keepdims=True)
        X = np.stack([rng.multinomial(60, probs[k]) for k in z]).astype(float)
    label_probs = np.full((n_patterns, n_labels), 0.02)
    for k in range(n_patterns):
        label_probs[k, 3 * k:3 * k + 3] = 1.0
    label_probs /= label_probs.sum(axis=1, keepdims=True)
    Y = np.zeros((n, n_labels))
    for i, k in enumerate(z):
        Y[i, rng.choice(n_labels, size=rng.integers(1, 4), replace=False, p=label_probs[k])] = 1.0
    return sp.csr_matrix(X), sp.csr_matrix(Y), z


def make_linear_data(n=800, n_features=20, n_labels=6, seed=0):
    """Labels from independent logistic models of Gaussian features (a linear-classifier problem)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, n_features))
    W = rng.normal(scale=1.5, size=(n_features, n_labels))
    P = 1.0 / (1.0 + np.exp(-(X @ W - 1.0)))
    Y = (rng.random(P.shape) < P).astype(float)
    return X, Y


FAST = dict(n_passes=3, n_mode_steps=4, n_sweeps=2, n_keep=1, device="cpu")


@pytest.fixture(scope="module")
def pattern_data():
    return make_pattern_data()


@pytest.fixture(scope="module")
def fitted(pattern_data):
    X, Y, _ = pattern_data
    return BNMC(truncation=12, random_state=0, **FAST).fit(X, Y)


# ---- the mixture ---------------------------------------------------------------------------
def test_mixture_uses_and_recovers_the_true_patterns(pattern_data, fitted):
    X, Y, z = pattern_data
    assert fitted.emission_ == "dirichlet"
    assert 4 <= fitted.n_patterns_ <= 5
    resp = fitted._mixture.responsibilities(fitted._mixture_features(X), Y)
    assert adjusted_rand_score(z, resp.argmax(axis=1)) > 0.95
    # each true label block is the top of one fitted label pattern with a large weight
    means = fitted._mixture.label_means()
    heavy = np.flatnonzero(fitted.pattern_weights_ > 0.1)
    owners = {int(np.argmax(means[k]) // 3) for k in heavy}
    assert owners == {0, 1, 2, 3}


def test_gaussian_emission_recovers_patterns_of_real_valued_features():
    X, Y, z = make_pattern_data(n=500, n_patterns=3, gaussian=True, seed=1)
    assert X.toarray().min() < 0
    model = BNMC(truncation=10, random_state=1, **FAST).fit(X, Y)
    assert model.emission_ == "gaussian"
    assert model.n_patterns_ == 3
    resp = model._mixture.responsibilities(model._mixture_features(X))
    assert adjusted_rand_score(z, resp.argmax(axis=1)) > 0.95


def test_dirichlet_emission_refuses_negative_features():
    X, Y, _ = make_pattern_data(n=60, gaussian=True)
    with pytest.raises(ValidationError, match="non-negative"):
        BNMC(emission="dirichlet", **FAST).fit(X, Y)


def test_full_batch_elbo_never_decreases(pattern_data):
    X, Y, _ = pattern_data
    model = BNMC(truncation=12, n_passes=8, batch_size=10_000, random_state=3, **{k: v for k, v in FAST.items() if k != "n_passes"})
    model.fit(X, Y)
    elbo = np.array(model.history_["objective"])
    assert len(elbo) == 9 == len(model.history_["wall_time"])  # initialisation + 8 passes
    assert np.all(np.diff(elbo) >= -1e-6 * np.abs(elbo[:-1]))


def test_minibatch_svi_elbo_increases_up_to_noise(pattern_data):
    X, Y, _ = pattern_data
    model = BNMC(truncation=12, n_passes=6, batch_size=50, merge_trials=0, random_state=4,
                 **{k: v for k, v in FAST.items() if k != "n_passes"})
    model.fit(X, Y)
    elbo = np.array(model.history_["objective"])
    gain = elbo[-1] - elbo[0]
    assert gain > 0
    # any decrease between passes is small next to the total improvement
    assert np.all(np.diff(elbo) >= -0.1 * gain)


# ---- the classifier samplers ---------------------------------------------------------------
def _small_problem(n, D, C, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D)).astype(np.float32)
    omega = torch.as_tensor(rng.gamma(2.0, 0.2, size=(n, C)), dtype=torch.float32)
    beta = torch.as_tensor(rng.normal(size=(n, C)), dtype=torch.float32)
    prior = torch.full((D + 1,), 2.0)
    prior[-1] = 0.01
    return X, omega, beta, prior


def _exact_mean_and_cov(X, omega, beta, prior, c):
    Z = np.hstack([X, np.ones((X.shape[0], 1))]).astype(np.float64)
    P = np.diag(prior.numpy().astype(np.float64)) + Z.T @ (omega[:, c].numpy()[:, None] * Z)
    cov = np.linalg.inv(P)
    return cov @ (Z.T @ beta[:, c].numpy()), cov


@pytest.mark.parametrize("n, D", [(40, 8), (10, 30)])
def test_all_three_solvers_give_the_exact_conditional_mean(n, D):
    X, omega, beta, prior = _small_problem(n, D, 3)
    design = Design(sp.csr_matrix(X), torch.device("cpu"), dense=True)
    Z = design.dense_z()
    gen = torch.Generator().manual_seed(0)
    dense = _sample_dense(Z, omega, beta, prior, gen, noise=0.0)
    wood = _sample_woodbury(Z, (Z / prior) @ Z.T, omega, beta, 1.0 / prior, gen, chunk=2, noise=0.0)
    sparse_design = Design(sp.csr_matrix(X), torch.device("cpu"), dense=False)
    cg, _ = _sample_cg(sparse_design, omega, beta, prior, torch.zeros(D + 1, 3), gen, 1e-6, 500, noise=0.0)
    for c in range(3):
        mean, _ = _exact_mean_and_cov(X, omega, beta, prior, c)
        for got in (dense, wood, cg):
            np.testing.assert_allclose(got[:, c].numpy(), mean, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("solver", ["dense", "woodbury", "cg"])
def test_solver_draws_have_the_conditional_covariance(solver):
    n, D = (30, 5) if solver != "woodbury" else (6, 10)
    X, omega, beta, prior = _small_problem(n, D, 1, seed=2)
    design = Design(sp.csr_matrix(X), torch.device("cpu"), dense=solver != "cg")
    Z = design.dense_z()
    gen = torch.Generator().manual_seed(5)
    n_draws = 3000
    omega_rep, beta_rep = omega.repeat(1, n_draws), beta.repeat(1, n_draws)  # one label column per draw
    if solver == "dense":
        draws = _sample_dense(Z, omega_rep, beta_rep, prior, gen)
    elif solver == "woodbury":
        draws = _sample_woodbury(Z, (Z / prior) @ Z.T, omega_rep, beta_rep, 1.0 / prior, gen, chunk=n_draws)
    else:
        draws, _ = _sample_cg(design, omega_rep, beta_rep, prior, torch.zeros(D + 1, n_draws), gen, 1e-7, 500)
    draws = draws.numpy().astype(np.float64)
    mean, cov = _exact_mean_and_cov(X, omega, beta, prior, 0)
    sd = np.sqrt(np.diag(cov))
    assert np.all(np.abs(draws.mean(axis=1) - mean) < 4.5 * sd / np.sqrt(n_draws))
    np.testing.assert_allclose(np.cov(draws), cov, atol=0.12 * sd.max() ** 2)


# ---- prediction ------------------------------------------------------------------------------
def test_predictions_beat_chance_and_probabilities_are_calibrated():
    X, Y = make_linear_data()
    Xtr, Ytr, Xte, Yte = X[:600], Y[:600], X[600:], Y[600:]
    model = BNMC(random_state=0, **FAST).fit(Xtr, Ytr)
    proba = model.predict_proba(Xte)
    assert proba.shape == Yte.shape and np.all((proba >= 0) & (proba <= 1))
    assert auc_micro(Yte, proba) > 0.85
    assert expected_calibration_error(Yte, proba) < 0.06


def test_prediction_rules(fitted, pattern_data):
    X, Y, _ = pattern_data
    expected = fitted.predict(X, rule="expected")
    k = int(round(fitted.label_count_mean_))
    assert np.all(np.diff(expected.indptr) == k)
    counted = fitted.predict(X, rule="count")
    proba = fitted.predict_proba(X)
    np.testing.assert_array_equal(np.diff(counted.indptr), np.clip(np.rint(proba.sum(axis=1)), 1, None))
    thresholded = fitted.predict(X, rule="threshold").toarray()
    assert np.all(thresholded.sum(axis=1) >= 1)
    assert np.all(proba[thresholded == 1] >= np.minimum(fitted.threshold_, proba.max(axis=1).repeat(Y.shape[1]).reshape(Y.shape)[thresholded == 1]) - 1e-6)
    # eq. (9) sampling is random but seeded
    first = fitted.predict(X, rule="sample", random_state=1)
    again = fitted.predict(X, rule="sample", random_state=1)
    assert (first != again).nnz == 0
    assert abs(np.diff(first.indptr).mean() - fitted.label_count_mean_) < 0.5
    # the base class's explicit threshold and top-k still work
    np.testing.assert_array_equal(fitted.predict(X, threshold=0.3).toarray(), (proba >= 0.3).astype(np.float32))
    assert np.all(np.diff(fitted.predict(X, top_k=2).indptr) == 2)
    assert fitted.count_rule_ in ("threshold", "count", "expected")
    assert f1_example(Y, fitted.predict(X)) > 0.5
    with pytest.raises(ValidationError, match="rule"):
        fitted.predict(X, rule="bogus")


def test_same_seed_same_model_and_save_load(tmp_path, pattern_data):
    X, Y, _ = pattern_data
    first = BNMC(truncation=8, random_state=5, **FAST).fit(X, Y)
    second = BNMC(truncation=8, random_state=5, **FAST).fit(X, Y)
    np.testing.assert_array_equal(first.predict_proba(X), second.predict_proba(X))
    path = tmp_path / "bnmc.npz"
    first.save(path)
    loaded = BNMC.load(path)
    np.testing.assert_array_equal(loaded.predict_proba(X), first.predict_proba(X))
    assert (loaded.predict(X) != first.predict(X)).nnz == 0


def test_svm_classifier_gibbs_inference_and_online_fit_work():
    X, Y = make_linear_data(n=500, seed=2)
    for params in (dict(classifier="svm"), dict(inference="gibbs", n_sweeps=6, n_keep=4),
                   dict(online=True), dict(online=True, classifier="svm")):
        model = BNMC(random_state=0, **{**FAST, **params}).fit(X[:400], Y[:400])
        assert auc_micro(Y[400:], model.predict_proba(X[400:])) > 0.85
        if not params.get("online"):
            assert model.classifier_trace_[-1] > model.classifier_trace_[0]


# ---- missing labels ----------------------------------------------------------------------------
def test_masked_rows_inform_only_the_feature_patterns(pattern_data):
    X, Y, _ = pattern_data
    rng = np.random.default_rng(0)
    hidden = rng.random(X.shape[0]) < 0.5
    mask = np.ones(Y.shape)
    mask[hidden] = 0.0
    garbage = Y.toarray().copy()
    garbage[hidden] = rng.integers(0, 2, size=garbage[hidden].shape)
    params = dict(truncation=8, random_state=2, **FAST)
    with_mask = BNMC(**params).fit(X, garbage, label_mask=mask)
    zeroed = Y.toarray().copy()
    zeroed[hidden] = 0.0
    as_unlabelled = BNMC(**params).fit(X, zeroed)  # empty label rows are missing by default
    np.testing.assert_allclose(with_mask.predict_proba(X), as_unlabelled.predict_proba(X), rtol=1e-5, atol=1e-6)
    # the unlabelled rows still shaped the feature patterns: compare with dropping them
    dropped = BNMC(**params).fit(X[~hidden], zeroed[~hidden])
    assert not np.allclose(dropped._mixture.emission.conc.sum(), with_mask._mixture.emission.conc.sum())
    assert with_mask.label_count_mean_ == pytest.approx(np.asarray(Y[~hidden].sum(axis=1)).mean())


# ---- online ----------------------------------------------------------------------------------
def test_partial_fit_stream_is_close_to_batch_fit():
    X, Y = make_linear_data(n=1600, seed=3)
    Xtr, Ytr, Xte, Yte = X[:1200], Y[:1200], X[1200:], Y[1200:]
    batch = BNMC(random_state=0, **FAST).fit(Xtr, Ytr)
    stream = BNMC(random_state=0, **FAST)
    for start in range(0, 1200, 100):
        stream.partial_fit(Xtr[start:start + 100], Ytr[start:start + 100])
    assert stream.n_seen_ == 1200
    assert len(stream.history_["objective"]) == 12
    np.testing.assert_array_equal(stream.label_frequencies_, Ytr.sum(axis=0))
    auc_batch = auc_micro(Yte, batch.predict_proba(Xte))
    auc_stream = auc_micro(Yte, stream.predict_proba(Xte))
    assert auc_stream > auc_batch - 0.04
    f1_batch = f1_example(Yte, batch.predict(Xte, threshold=0.5))
    f1_stream = f1_example(Yte, stream.predict(Xte, threshold=0.5))
    assert f1_stream > f1_batch - 0.06


def test_partial_fit_rejects_unknown_labels_and_features():
    X, Y = make_linear_data(n=200, n_labels=4)
    model = BNMC(random_state=0, **FAST).partial_fit(X[:100], Y[:100])
    wider = np.hstack([Y[100:], np.zeros((100, 1))])
    wider[3, 4] = 1.0
    with pytest.raises(ValidationError, match="label index 4"):
        model.partial_fit(X[100:], wider)
    with pytest.raises(ValidationError, match="features"):
        model.partial_fit(np.hstack([X[100:], X[100:, :1]]), Y[100:])
    # a batch-fitted model continues online
    fitted = BNMC(random_state=0, **FAST).fit(X[:100], Y[:100])
    fitted.partial_fit(X[100:], Y[100:])
    assert fitted.n_seen_ == 200


# ---- errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "params, message",
    [
        (dict(truncation=1), "truncation"),
        (dict(emission="poisson"), "emission"),
        (dict(classifier="tree"), "classifier"),
        (dict(kappa=0.4), "kappa"),
        (dict(n_keep=5, n_sweeps=2), "n_keep"),
        (dict(online="yes"), "online"),
        (dict(weight_precision=-1.0), "weight_precision"),
        (dict(validation_fraction=1.0), "validation_fraction"),
    ],
)
def test_bad_parameters_are_named(params, message):
    X, Y = make_linear_data(n=50)
    with pytest.raises(ValidationError, match=message):
        BNMC(**params).fit(X, Y)


def test_not_fitted_and_no_labelled_rows():
    X, Y = make_linear_data(n=50)
    with pytest.raises(NotFittedError):
        BNMC().predict(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValidationError, match="no labelled row"):
            BNMC(**FAST).fit(X, np.zeros_like(Y))


# ---- real data (slow) ----------------------------------------------------------------------------
@pytest.mark.slow
def test_scene_reaches_the_papers_best_bnmc_row():
    from conftest import shared_dataset_dir

    from bayesmlc.data.io import read_dataset
    from bayesmlc.metrics import exact_match

    folder = shared_dataset_dir("scene")
    train = read_dataset(folder / "train.txt")
    test = read_dataset(folder / "test.txt").with_features_width(train.n_features)
    model = BNMC(random_state=0, device="cpu").fit(train.X, train.Y)
    pred = model.predict(test.X)
    assert f1_example(test.Y, pred) >= 0.715  # paper Table 2, BNMC-L 71.5
    assert exact_match(test.Y, pred) >= 0.662  # paper Table 3, BNMC-S 66.2


def _rank_term_data(rng, n, L, terms, theta=(1.3, 0.4, -0.8)):
    """Validation entries drawn from BNMC's calibrated model itself: z = a s_clf + b s_pat + d ranks the
    labels, p = sigmoid(z + the rank terms of ``terms``), written out by hand (independent of
    ``rank_adjusted_logits``): the leader z + r + c z + e z_2, the runner-up z + g2 + h2 z, ranks 3-5
    z + g + h z."""
    s_clf, s_pat = rng.normal(-1.0, 1.5, (n, L)), rng.normal(0.0, 1.0, (n, L))
    z = theta[0] * s_clf + theta[1] * s_pat + theta[2]
    r, c, e, g2, h2, g, h = terms
    order = np.argsort(-z, axis=1)
    logits = z.copy()
    for i in range(n):
        first, second, rest = order[i, 0], order[i, 1], order[i, 2:5]
        logits[i, first] += r + c * z[i, first] + e * z[i, second]
        logits[i, second] += g2 + h2 * z[i, second]
        logits[i, rest] += g + h * z[i, rest]
    Y = (rng.random(z.shape) < 1.0 / (1.0 + np.exp(-logits))).astype(float)
    return s_clf, s_pat, z, logits, Y


def test_fit_calibration_recovers_the_rank_terms_of_its_own_model():
    # maximum a posteriori on 8,000 rows x 12 labels drawn from the model recovers the calibrated
    # probability of each of the top five ranks, and of the leader over the runner-up's range. (The
    # terms themselves are not compared: they multiply the fitted ranking logit, an affine map of the
    # generating z, so the offsets absorb part of the slopes.)
    from bayesmlc.bnmc.rank_calibration import calibrated_probability_logits, fit_calibration

    rng = np.random.default_rng(0)
    truth = (0.9, -0.4, -0.5, 0.4, -0.2, 0.3, 0.1)
    s_clf, s_pat, z, logits, Y = _rank_term_data(rng, 8000, 12, truth)
    observed = rng.random(Y.shape) < 0.9
    theta, probability_theta, terms = fit_calibration(s_clf, s_pat, Y, observed)
    # the ranking logit is the plain fit: it ranks as z does
    assert np.mean(np.argmax(theta[0] * s_clf + theta[1] * s_pat, axis=1) == np.argmax(z, axis=1)) > 0.99
    fitted_p = 1.0 / (1.0 + np.exp(-calibrated_probability_logits(s_clf, s_pat, theta, probability_theta, terms)))
    true_p = 1.0 / (1.0 + np.exp(-logits))
    top = np.argsort(-z, axis=1)[:, :5]
    error = np.abs(np.take_along_axis(fitted_p - true_p, top, axis=1))
    assert np.all(error.mean(axis=0) < 0.015)
    # the leader's probability where the runner-up is weak and where it is strong (e < 0 in the data)
    runner_up = np.take_along_axis(z, top[:, 1:2], axis=1)[:, 0]
    for rows in (runner_up < np.quantile(runner_up, 0.2), runner_up > np.quantile(runner_up, 0.8)):
        assert abs(np.mean(fitted_p[rows, top[rows, 0]] - true_p[rows, top[rows, 0]])) < 0.02
    # and the model's terms differ from no terms at all: the plain probabilities are off by more
    plain_p = 1.0 / (1.0 + np.exp(-(theta[0] * s_clf + theta[1] * s_pat + theta[2])))
    assert np.abs(np.take_along_axis(plain_p - true_p, top, axis=1)).mean(axis=0)[0] > 0.05
    # with no rank effect in the data the terms are near zero, and the offset is never negative
    Y0 = (rng.random(z.shape) < 1.0 / (1.0 + np.exp(-z))).astype(float)
    _, _, terms0 = fit_calibration(s_clf, s_pat, Y0, observed)
    assert terms0.offset >= 0.0 and np.abs(terms0).max() < 0.15


def test_the_rank_terms_keep_the_ranking_and_order_the_probabilities_with_it(pattern_data, fitted):
    from bayesmlc.bnmc.rank_calibration import RankTerms

    X = pattern_data[0]
    model = copy.deepcopy(fitted)
    model._set_rank_terms(RankTerms())
    model.probability_evidence_weights_ = model.evidence_weights_
    plain = model.decision_function(X[:50])
    np.testing.assert_allclose(model.predict_proba(X[:50]), 1.0 / (1.0 + np.exp(-plain)), rtol=1e-5)
    # the offset moves only each row's first label in the ranking score
    terms = RankTerms(0.7, -0.3, -0.5, 0.6, 0.2, 0.4, -0.1)
    model._set_rank_terms(terms)
    shifted = model.decision_function(X[:50])
    rows, first = np.arange(50), plain.argmax(axis=1)
    expected = plain.copy()
    expected[rows, first] += 0.7
    np.testing.assert_allclose(shifted, expected, rtol=1e-6, atol=1e-6)
    # the probabilities: the rank terms by hand on ranks 1-5, then capped along the ranking
    proba = model.predict_proba(X[:50]).astype(np.float64)
    order = np.argsort(-plain, axis=1, kind="stable")
    ranked = np.take_along_axis(plain.astype(np.float64), order, axis=1)
    by_hand = ranked.copy()
    by_hand[:, 0] += 0.7 - 0.3 * ranked[:, 0] - 0.5 * ranked[:, 1]
    by_hand[:, 1] += 0.6 + 0.2 * ranked[:, 1]
    by_hand[:, 2:5] += 0.4 - 0.1 * ranked[:, 2:5]
    by_hand = np.minimum.accumulate(by_hand, axis=1)
    np.testing.assert_allclose(np.take_along_axis(proba, order, axis=1), 1.0 / (1.0 + np.exp(-by_hand)), rtol=1e-4,
                               atol=1e-6)
    assert np.all(np.diff(np.take_along_axis(proba, order, axis=1), axis=1) <= 1e-7)


def test_ranked_entries_are_the_observed_top_entries_with_their_rank_columns():
    """The rank-term fit's entries and columns, from each row's top positions, against dense masks built
    from a brute-force ranking (argsort): the same entries in the same (row-major) order."""
    from bayesmlc.bnmc.rank_calibration import NEXT_RANKS, _ranked_entries

    rng = np.random.default_rng(4)
    for n, L in ((30, 12), (10, 2), (8, 1)):
        z = rng.normal(size=(n, L))
        observed = rng.random((n, L)) < 0.8
        sampled = observed & (rng.random((n, L)) < 0.7)
        rest, (rows, columns), rank_columns = _ranked_entries(z, observed, sampled)
        order = np.argsort(-z, axis=1, kind="stable")
        rank = np.empty((n, L), dtype=int)
        rank[np.arange(n)[:, None], order] = np.arange(L)
        ranked = rank <= NEXT_RANKS
        top = observed & ranked
        np.testing.assert_array_equal(rest, sampled & ~ranked)
        np.testing.assert_array_equal(np.stack([rows, columns]), np.stack(np.nonzero(top)))
        lead, second, following = (rank == 0), (rank == 1), (rank >= 2) & ranked
        runner_up = z[np.arange(n), order[:, 1]][:, None] * lead if L > 1 else np.zeros((n, L))
        expected = np.stack([c[top] for c in (lead, lead * z, runner_up, second, second * z, following,
                                               following * z)], axis=1)
        np.testing.assert_array_equal(rank_columns, expected)


def test_cross_validation_shrinks_the_rank_terms_on_small_validation_splits():
    # 30 small validation splits (40 rows x 6 labels) with no rank effect in the data: the fit at the
    # weakest prior finds spurious terms, the cross-validated prior pulls them towards 0
    from bayesmlc.bnmc.rank_calibration import RANK_TERM_PRECISIONS, _fit_rank_terms, fit_calibration

    rng = np.random.default_rng(1)
    free, shrunk = [], []
    for _ in range(30):
        s_clf, s_pat = rng.normal(-0.5, 1.5, (40, 6)), rng.normal(0.0, 1.0, (40, 6))
        z = 1.2 * s_clf + 0.3 * s_pat - 0.5
        Y = (rng.random(z.shape) < 1.0 / (1.0 + np.exp(-z))).astype(float)
        observed = np.ones(Y.shape, dtype=bool)
        free.append(np.linalg.norm(_fit_rank_terms(s_clf, s_pat, Y, observed, [RANK_TERM_PRECISIONS[0]])[0][2]))
        shrunk.append(np.linalg.norm(fit_calibration(s_clf, s_pat, Y, observed)[2]))
    assert np.mean(shrunk) < 0.6 * np.mean(free)


def test_cross_fitted_calibration_sees_every_labelled_row_once(monkeypatch):
    """calibration_folds=K: the calibration is fitted on one held-out evidence row per labelled
    training row (each exactly once, in some order), and only on observed entries."""
    import bayesmlc.bnmc.classifier_fitting as classifier_fitting

    X, Y = make_linear_data(n=240)
    mask = np.ones_like(Y)
    mask[:10] = 0.0  # rows with no observed entry: not calibrated on
    Y[:10] = 0.0
    mask[20:30, 0] = Y[20:30, 0] = 0.0  # entries not observed
    seen = []
    original = classifier_fitting.fit_calibration

    def capture(s_clf, s_pat, Y_val, observed, *args, **kwargs):
        seen.append((np.asarray(Y_val).copy(), np.asarray(observed).copy()))
        return original(s_clf, s_pat, Y_val, observed, *args, **kwargs)

    monkeypatch.setattr(classifier_fitting, "fit_calibration", capture)
    model = BNMC(truncation=6, calibration_folds=4, classifier="logistic", random_state=0,
                 **FAST).fit(X, sp.csr_matrix(Y), label_mask=mask)
    assert model.calibration_folds_ == 4 and len(seen) == 1
    Y_val, observed = seen[0]
    labelled = mask.any(axis=1)
    assert Y_val.shape == (labelled.sum(), Y.shape[1])
    expected = sorted(map(tuple, np.hstack([Y, mask])[labelled]))
    assert sorted(map(tuple, np.hstack([Y_val, observed]))) == expected
    assert observed.sum() == mask[labelled].sum()


def make_keyword_data(n=240, n_features=300, n_labels=8, seed=0):
    """Sparse binary "words" (3% of entries); label l is present exactly when word l is: rare labels,
    each decided by one feature without noise (the kind of text set where a hinge loss does well)."""
    rng = np.random.default_rng(seed)
    X = (rng.random((n, n_features)) < 0.03).astype(float)
    return sp.csr_matrix(X), X[:, :n_labels].copy()


@pytest.mark.parametrize("data, expected", [(make_linear_data(n=240), "logistic"), (make_keyword_data(), "svm")],
                         ids=["logistic-labels", "keyword-labels"])
def test_classifier_auto_keeps_the_likelihood_whose_held_out_probabilities_fit_best(monkeypatch, data, expected):
    """classifier="auto" with cross-fitted calibration: both likelihoods' folds are scored, the one
    whose calibrated held-out probabilities give the labels the higher Bernoulli log-likelihood
    (recomputed here from the captured evidence with NumPy) is kept, and the model is the one that
    likelihood gives when named: logistic labels keep logistic, keyword labels the SVM."""
    import bayesmlc.bnmc.classifier_fitting as classifier_fitting
    from bayesmlc.bnmc.rank_calibration import calibrated_probability_logits

    X, Y = data
    seen = []
    original = classifier_fitting.fit_calibration

    def capture(s_clf, s_pat, Y_val, observed, *args, **kwargs):
        seen.append(tuple(np.array(part, dtype=np.float64) for part in (s_clf, s_pat, Y_val, observed)))
        return original(s_clf, s_pat, Y_val, observed, *args, **kwargs)

    monkeypatch.setattr(classifier_fitting, "fit_calibration", capture)
    params = dict(truncation=6, calibration_folds=4, random_state=0, **FAST)
    model = BNMC(**params).fit(X, sp.csr_matrix(Y))
    assert len(seen) == (3 if model.classifier_ == "logistic" else 2)  # the kept maps are fitted again
    scores = []
    for s_clf, s_pat, Y_val, observed in seen[:2]:
        theta, probability_theta, terms = original(s_clf, s_pat, Y_val, observed > 0)
        p = 1.0 / (1.0 + np.exp(-calibrated_probability_logits(s_clf, s_pat, theta, probability_theta, terms)))
        scores.append(np.sum((Y_val * np.log(p) + (1.0 - Y_val) * np.log1p(-p))[observed > 0]))
    assert model.classifier_ == ("logistic", "svm")[int(np.argmax(scores))] == expected
    named = BNMC(**{**params, "classifier": expected}).fit(X, sp.csr_matrix(Y))
    assert named.classifier_ == expected
    np.testing.assert_allclose(model.predict_proba(X[:50]), named.predict_proba(X[:50]), rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(model.evidence_weights_, named.evidence_weights_)


def test_classifier_auto_is_logistic_without_cross_fitting_or_above_the_entry_budget(monkeypatch):
    """A single validation split, online fits and cross-fits over more than
    CLASSIFIER_CHOICE_MAX_ENTRIES labelled rows x labels keep the logistic likelihood without comparing,
    on data where the comparison picks the SVM (the test above)."""
    import bayesmlc.bnmc.classifier_fitting as classifier_fitting

    X, Y = make_keyword_data()
    labelled = int((Y.sum(axis=1) > 0).sum())
    split = BNMC(truncation=6, calibration_folds=1, random_state=0, **FAST).fit(X, sp.csr_matrix(Y))
    online = BNMC(truncation=6, online=True, n_passes=1, random_state=0, device="cpu").fit(X, sp.csr_matrix(Y))
    monkeypatch.setattr(classifier_fitting, "CLASSIFIER_CHOICE_MAX_ENTRIES", labelled * Y.shape[1] - 1)
    over_budget = BNMC(truncation=6, calibration_folds=4, random_state=0, **FAST).fit(X, sp.csr_matrix(Y))
    assert split.classifier_ == online.classifier_ == over_budget.classifier_ == "logistic"
    for model, folds in ((split, 1), (over_budget, 4)):
        named = BNMC(truncation=6, calibration_folds=folds, classifier="logistic", random_state=0,
                     **FAST).fit(X, sp.csr_matrix(Y))
        np.testing.assert_array_equal(model.predict_proba(X[:20]), named.predict_proba(X[:20]))
    monkeypatch.setattr(classifier_fitting, "CLASSIFIER_CHOICE_MAX_ENTRIES", labelled * Y.shape[1])
    at_budget = BNMC(truncation=6, calibration_folds=4, random_state=0, **FAST).fit(X, sp.csr_matrix(Y))
    assert at_budget.classifier_ == "svm"


def test_svm_samplers_solve_exactly_with_a_duplicated_document_at_the_hinge():
    """The SVM's EM weights 1/lambda reach their cap of 1e6 at the hinge. With a document present
    twice and both copies there (as on medical), I + Phi Sigma0 Phi^T has an eigenvalue 1 beside
    ones of 1e7: in float32 the Woodbury Cholesky failed. In the dtype the samplers use for the SVM
    both exact samplers' means equal P^-1 Z^T beta (P = diag(prior) + Z^T diag(omega) Z), solved here
    in float64 with NumPy."""
    from bayesmlc.bnmc.classifiers import _system_dtype

    rng = np.random.default_rng(0)
    n, D1, C = 80, 200, 2
    Z = (rng.random((n, D1)) < 0.04).astype(np.float32)
    Z[:, -1] = 1.0
    Z[1] = Z[0]  # the same document twice
    omega = rng.uniform(0.5, 3.0, size=(n, C))
    omega[:2, 0] = 1e6  # both copies at the hinge for the first label
    beta = np.where(rng.random((n, C)) < 0.5, -1.0, 1.0) * (1.0 + omega)
    prior = np.full(D1, 0.5)
    prior[-1] = 1e-2
    dtype = _system_dtype("svm")
    Zt, prior_t = torch.from_numpy(Z), torch.tensor(prior, dtype=torch.float32)
    omega_t, beta_t = torch.tensor(omega, dtype=torch.float32), torch.tensor(beta, dtype=torch.float32)
    gram = (Zt.to(dtype) / prior_t.to(dtype)) @ Zt.T.to(dtype)
    means = {
        "woodbury": _sample_woodbury(Zt, gram, omega_t, beta_t, 1.0 / prior_t, torch.Generator(), C, noise=0.0),
        "dense": _sample_dense(Zt.to(dtype), omega_t, beta_t, prior_t, torch.Generator(), noise=0.0),
    }
    Z64 = Z.astype(np.float64)
    for c in range(C):
        exact = np.linalg.solve(Z64.T @ (omega[:, c, None] * Z64) + np.diag(prior), Z64.T @ beta[:, c])
        for solver, mean in means.items():
            np.testing.assert_allclose(Z64 @ mean[:, c].numpy(), Z64 @ exact, rtol=0, atol=1e-4, err_msg=solver)


def test_top_label_map_is_the_beta_calibration_map():
    """apply_top_label_map on logits equals the beta calibration map on probabilities, logit p' =
    alpha log p - beta log(1 - p) + gamma (computed here with NumPy logs), is the identity at (1, 1, 0)
    and increases for alpha, beta >= 0."""
    from bayesmlc.bnmc.rank_calibration import TOP_LABEL_IDENTITY, apply_top_label_map

    logits = np.linspace(-8.0, 8.0, 161)
    p = 1.0 / (1.0 + np.exp(-logits))
    params = (2.3, 0.35, 1.35)
    expected = params[0] * np.log(p) - params[1] * np.log1p(-p) + params[2]
    np.testing.assert_allclose(apply_top_label_map(logits, params), expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(apply_top_label_map(logits, TOP_LABEL_IDENTITY), logits, rtol=0, atol=1e-12)
    assert np.all(np.diff(apply_top_label_map(logits, (0.0, 0.7, -1.0))) > 0)


def test_top_label_map_recovers_a_distortion_and_keeps_calibrated_probabilities_as_they_are():
    """Leading labels whose true probability is a beta-map distortion of the model's (the S shape of
    goemotions) get a map that undoes it (probabilities within 0.03 of the truth over the logits
    seen); outcomes drawn from the model's own probabilities keep the identity in at least 17 of 20
    data sets (the rule keeps a map only above two standard errors of held-out gain: about 2% of
    calibrated sets by chance)."""
    from bayesmlc.bnmc.rank_calibration import TOP_LABEL_IDENTITY, apply_top_label_map, fit_top_label_map

    rng = np.random.default_rng(0)
    truth = np.array([2.3, 0.35, 1.35])
    logits = rng.normal(0.3, 1.5, size=8000)
    y = (rng.random(logits.size) < 1.0 / (1.0 + np.exp(-apply_top_label_map(logits, truth)))).astype(float)
    fitted = fit_top_label_map(logits, y)
    grid = np.linspace(np.quantile(logits, 0.02), np.quantile(logits, 0.98), 50)
    np.testing.assert_allclose(1.0 / (1.0 + np.exp(-apply_top_label_map(grid, fitted))),
                               1.0 / (1.0 + np.exp(-apply_top_label_map(grid, truth))), rtol=0, atol=0.03)
    kept = 0
    for seed in range(20):
        rng = np.random.default_rng(100 + seed)
        logits = rng.normal(0.3, 1.5, size=2000)
        y = (rng.random(logits.size) < 1.0 / (1.0 + np.exp(-logits))).astype(float)
        kept += np.array_equal(fit_top_label_map(logits, y), TOP_LABEL_IDENTITY)
    assert kept >= 17


def test_top_label_map_moves_only_the_leading_probability_and_keeps_the_top_five_order():
    """With a top-label map set, decision_function is unchanged, each row's leading probability is the
    map of its logit without it, and predict_proba's top five still follow decision_function's order."""
    from bayesmlc.bnmc.rank_calibration import apply_top_label_map

    X, Y = make_linear_data(n=400)
    model = BNMC(truncation=6, random_state=0, **FAST).fit(X, sp.csr_matrix(Y))
    assert np.array_equal(model.top_label_map_, [1.0, 1.0, 0.0])  # calibrated synthetic labels: no map
    scores, before = model.decision_function(X), model.predict_proba(X)
    model.top_label_map_ = np.array([0.4, 1.6, -0.8])  # lowers the leading probabilities
    after = model.predict_proba(X)
    np.testing.assert_array_equal(model.decision_function(X), scores)
    rows, lead = np.arange(X.shape[0]), scores.argmax(axis=1)
    inside = (before[rows, lead] > 1e-9) & (before[rows, lead] < 1.0 - 1e-9)  # logits that float64 keeps
    assert inside.mean() > 0.5
    rows, lead = rows[inside], lead[inside]
    leading_logit = np.log(before[rows, lead]) - np.log1p(-before[rows, lead])
    expected = 1.0 / (1.0 + np.exp(-apply_top_label_map(leading_logit, model.top_label_map_)))
    np.testing.assert_allclose(after[rows, lead], expected, rtol=1e-5)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :5]
    assert np.all(np.diff(np.take_along_axis(after, order, axis=1), axis=1) <= 1e-12)


def test_calibration_folds_auto_cross_fits_small_sets_only():
    from bayesmlc.bnmc.classifier_fitting import CROSS_FIT_FOLDS, CROSS_FIT_MAX_ROWS, calibration_fold_count

    auto = BNMC()
    assert calibration_fold_count(auto, CROSS_FIT_MAX_ROWS - 1) == CROSS_FIT_FOLDS == 5
    assert calibration_fold_count(auto, CROSS_FIT_MAX_ROWS) == 1
    assert calibration_fold_count(auto, 100, world_size=2) == 1  # the data-parallel fit keeps the split
    assert calibration_fold_count(BNMC(online=True), 100) == 1
    assert calibration_fold_count(BNMC(validation_fraction=0.0), 100) == 1  # no calibration at all
    assert calibration_fold_count(BNMC(calibration_folds=3), 10_000) == 3
    assert calibration_fold_count(BNMC(calibration_folds=1), 100) == 1
    X, Y = make_linear_data(n=120)
    assert BNMC(truncation=4, random_state=0, **FAST).fit(X, Y).calibration_folds_ == 5


def test_label_set_tuning_matches_a_brute_force_search_with_scikit_learn():
    """choose_threshold: among the 37 grid thresholds within 0.01 of the best example-F1 on the observed
    entries, the highest of those with the best exact match; choose_count_rule: the rule with the best
    example-F1 + exact match. Recomputed here with scikit-learn's f1_score(average="samples") and
    accuracy_score (subset accuracy) on the observed entries only."""
    from sklearn.metrics import accuracy_score, f1_score

    from bayesmlc.bnmc.label_sets import choose_count_rule, choose_threshold, rule_predictions, threshold_rows

    rng = np.random.default_rng(3)
    proba = rng.random((80, 7)) ** 2
    Y = (rng.random(proba.shape) < proba).astype(np.float64)
    observed = (rng.random(proba.shape) < 0.8).astype(np.float64)
    observed[:5] = 1.0

    def by_sklearn(pred):
        """(example F1, exact match) on the observed entries: unobserved ones set to 0 in both."""
        true, guess = (Y * observed).astype(int), (pred.toarray() * observed).astype(int)
        return f1_score(true, guess, average="samples", zero_division=1.0), accuracy_score(true, guess)

    grid = np.linspace(0.05, 0.95, 37)
    scores = np.array([by_sklearn(threshold_rows(proba, t)) for t in grid])
    near = scores[:, 0] >= scores[:, 0].max() - 0.01
    best_exact = scores[near, 1].max()
    expected = grid[near & (scores[:, 1] == best_exact)].max()
    assert choose_threshold(proba, Y, observed) == pytest.approx(expected, abs=1e-12)
    quality = {rule: sum(by_sklearn(rule_predictions(proba, rule, 0.3, 2.0, 0.0, None)))
               for rule in ("threshold", "count", "expected")}
    assert choose_count_rule(proba, Y, observed, 0.3, 2.0) == max(quality, key=quality.get)
    # the rules themselves: "expected" keeps round(mean) labels, "count" round(sum p) (at least 1)
    assert np.all(rule_predictions(proba, "expected", 0.3, 2.4, 0.0, None).getnnz(axis=1) == 2)
    counts = rule_predictions(proba, "count", 0.3, 2.0, 0.0, None).getnnz(axis=1)
    np.testing.assert_array_equal(counts, np.clip(np.rint(proba.sum(axis=1)), 1, 7))


def test_label_set_rules_match_a_full_stable_sort_and_float64_thresholds():
    """``top_counts`` (a partition, then a sort of the entries at the boundary and above) sets the same
    labels as a stable argsort of -scores, ties included; ``threshold_rows`` on float32 probabilities
    sets the same labels as on their float64 values, thresholds that float32 cannot hold included."""
    from bayesmlc.bnmc.label_sets import threshold_rows, top_counts

    rng = np.random.default_rng(11)
    scores = np.round(rng.random((300, 40)), 1).astype(np.float32)  # many ties, some at every boundary
    counts = rng.integers(1, 41, size=300)
    order = np.argsort(-scores, axis=1, kind="stable")
    expected = np.zeros(scores.shape, dtype=np.float32)
    for i in range(300):
        expected[i, order[i, :counts[i]]] = 1.0
    np.testing.assert_array_equal(top_counts(scores, counts).toarray(), expected)
    proba = rng.random((200, 30)).astype(np.float32) ** 3
    proba[:, 0] = np.float32(0.3)  # just above 0.3 in float64: kept at 0.3, not at nextafter(0.3)
    proba[:, 1] = np.float32(0.95)  # just below 0.95 in float64: dropped at 0.95 (unless the row's best)
    for threshold in (0.3, float(np.nextafter(np.float32(0.3), np.float32(1))), 0.95, 0.6, 0.99999):
        by_float64 = proba.astype(np.float64) >= threshold
        empty = ~by_float64.any(axis=1)
        by_float64[np.flatnonzero(empty), np.argmax(proba[empty], axis=1)] = True
        np.testing.assert_array_equal(threshold_rows(proba, threshold).toarray(), by_float64)
