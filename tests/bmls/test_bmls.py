"""Tests of the BMLS estimator: Geweke check of the sweep, recovery of planted probabilities, missing
labels (flip test, calibration under a mask), co-occurrence, validation, persistence, topics."""

import json

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import batch_standard_error
from scipy import special
from sklearn.metrics import roc_auc_score

from bayesmlc.bmls import BMLS, cooccurrence_matrix, format_topics, remove_labels, subsample_instances
from bayesmlc.bmls.gibbs import SweepData, gibbs_sweep, init_state, positive_rates, theta_from_log_h
from bayesmlc.bmls.model import _pairs_from_matrix
from bayesmlc.exceptions import ValidationError


@pytest.mark.parametrize("masked", [False, True])
def test_geweke_h_and_phi_steps_keep_the_prior(masked):
    """Successive-conditional Geweke test (Geweke 2004): alternate 'draw labels from the model given
    (phi, h)' with one Gibbs sweep. The chain on (phi, h) must then have the prior as its stationary
    law. With ``masked`` only the observed entries are shown to the sweep, which checks the exposure
    of the h step and the augmentation of the phi step for missing labels."""
    rng = np.random.default_rng(2024)
    n, d, n_labels, n_topics = 12, 3, 4, 2
    mu0, nu0, beta0 = 3.0, 3.0, 0.7
    Xb = np.hstack([(rng.random((n, d)) < 0.5).astype(float), np.ones((n, 1))])
    mask = None
    observed = np.ones((n, n_labels), dtype=bool)
    if masked:
        observed = rng.random((n, n_labels)) < 0.5
        mask = sp.csr_matrix(observed.astype(float))
    data = SweepData.build(sp.csr_matrix(Xb), sp.csr_matrix((n, n_labels)), mask)
    state = init_state(data, n_topics, d + 1, beta0, rng)
    state.h = rng.gamma(mu0, 1.0 / nu0, size=(d + 1, n_topics))
    state.phi = rng.dirichlet(np.full(n_labels, beta0), size=n_topics).T
    h_draws, phi_draws = [], []
    for _ in range(5_000):
        theta = theta_from_log_h(data.x_csr, state.h)
        labels = (rng.poisson(theta @ state.phi.T) > 0) & observed
        data.pos_rows, data.pos_cols = (idx.astype(np.int64) for idx in np.nonzero(labels))
        state.theta = theta
        state.rates = positive_rates(data.pos_rows, data.pos_cols, state.phi, state.theta)
        gibbs_sweep(data, state, rng, mu0, nu0, sample_beta0_flag=False, recompute_theta=True)
        h_draws.append(state.h.copy())
        phi_draws.append(state.phi.copy())
    h_draws, phi_draws = np.array(h_draws), np.array(phi_draws)
    prior_phi_var = (1 / n_labels) * (1 - 1 / n_labels) / (n_labels * beta0 + 1)
    checks = {
        "E[h]": (h_draws.mean(axis=(1, 2)), mu0 / nu0),
        "E[h^2]": ((h_draws**2).mean(axis=(1, 2)), mu0 / nu0**2 + (mu0 / nu0) ** 2),
        "E[log h]": (np.log(h_draws).mean(axis=(1, 2)), special.digamma(mu0) - np.log(nu0)),
        "E[bias]": (h_draws[:, -1, :].mean(axis=1), mu0 / nu0),
        "E[phi^2]": ((phi_draws**2).mean(axis=(1, 2)), prior_phi_var + 1 / n_labels**2),
        "E[phi_0]": (phi_draws[:, 0, :].mean(axis=1), 1 / n_labels),
    }
    for name, (series, prior_value) in checks.items():
        z = (series.mean() - prior_value) / batch_standard_error(series)
        assert abs(z) < 4.0, f"{name}: chain {series.mean():.4f} vs prior {prior_value:.4f} (z = {z:.1f})"


@pytest.mark.parametrize("diagonal", [False, True])
def test_geweke_cooccurrence_sweep_with_exact_phi_step(diagonal):
    """Geweke successive-conditional test of the whole BMLS-co sweep with ``phi_step="metropolis"``:
    alternate 'draw Y and C from the model given (phi, h, lambda)' with one sweep (beta0 fixed). The
    chain must keep the priors of phi, h, gamma0 and f0. (The paper's plain Dirichlet step fails this
    check on E[phi^2]: z = -5.6 without and +3.9 with the diagonal at 10,000 iterations, see docs/bmls.md.)"""
    rng = np.random.default_rng(7)
    n, d, n_labels, n_topics = 10, 2, 4, 2
    mu0, nu0, beta0 = 3.0, 3.0, 0.7
    Xb = np.hstack([(rng.random((n, d)) < 0.5).astype(float), np.ones((n, 1))])
    first, second = np.triu_indices(n_labels, 0 if diagonal else 1)
    pairs = (first, second, np.zeros(first.size))
    data = SweepData.build(sp.csr_matrix(Xb), sp.csr_matrix((n, n_labels)), None, pairs, pair_diagonal=diagonal)
    state = init_state(data, n_topics, d + 1, beta0, rng)
    state.h = rng.gamma(mu0, 1.0 / nu0, size=(d + 1, n_topics))
    state.phi = rng.dirichlet(np.full(n_labels, beta0), size=n_topics).T
    state.gamma0, state.c0 = rng.gamma(1.0), rng.gamma(1.0)
    state.r = rng.gamma(state.gamma0 / n_topics, size=n_topics) / state.c0
    series = {"E[phi^2]": [], "E[phi_0]": [], "E[h]": [], "P(f0 < 1/2)": [], "P(gamma0 < 1/2)": []}
    for _ in range(6_000):
        theta = theta_from_log_h(data.x_csr, state.h)
        labels = rng.poisson(theta @ state.phi.T) > 0
        data.pos_rows, data.pos_cols = (idx.astype(np.int64) for idx in np.nonzero(labels))
        pair_rates = np.einsum("ik,k,ik->i", state.phi[first], state.r, state.phi[second])  # eqs. (10)-(11)
        data.pair_counts = rng.poisson(pair_rates).astype(np.int64)
        state.theta = theta
        state.rates = positive_rates(data.pos_rows, data.pos_cols, state.phi, state.theta)
        gibbs_sweep(data, state, rng, mu0, nu0, sample_beta0_flag=False, recompute_theta=True, phi_step="metropolis")
        series["E[phi^2]"].append(np.mean(state.phi**2))
        series["E[phi_0]"].append(state.phi[0].mean())
        series["E[h]"].append(state.h.mean())
        series["P(f0 < 1/2)"].append(float(state.c0 < 0.5))
        series["P(gamma0 < 1/2)"].append(float(state.gamma0 < 0.5))
    prior_phi_var = (1 / n_labels) * (1 - 1 / n_labels) / (n_labels * beta0 + 1)
    prior = {
        "E[phi^2]": prior_phi_var + 1 / n_labels**2,
        "E[phi_0]": 1 / n_labels,
        "E[h]": mu0 / nu0,
        "P(f0 < 1/2)": 1 - np.exp(-0.5),  # f0 ~ Gamma(1, 1)
        "P(gamma0 < 1/2)": 1 - np.exp(-0.5),  # gamma0 ~ Gamma(1, 1)
    }
    for name, prior_value in prior.items():
        chain = np.asarray(series[name])
        z = (chain.mean() - prior_value) / batch_standard_error(chain)
        assert abs(z) < 4.0, f"{name}: chain {chain.mean():.4f} vs prior {prior_value:.4f} (z = {z:.1f})"


def _planted_problem(rng, n, d=25, n_labels=15, n_topics=4, mu0=1.5, beta0=0.3, density=0.2):
    h = rng.gamma(mu0, 1.0 / mu0, size=(d + 1, n_topics))
    phi = rng.dirichlet(np.full(n_labels, beta0), size=n_topics).T

    def draw(m):
        X = (rng.random((m, d)) < density).astype(float)
        theta = np.exp(np.hstack([X, np.ones((m, 1))]) @ np.log(h))
        proba = -np.expm1(-theta @ phi.T)
        return X, (rng.random(proba.shape) < proba).astype(float), proba

    return draw


def test_recovers_planted_probabilities():
    """Data drawn from the model itself: held-out AUC close to the oracle's (true probabilities)."""
    rng = np.random.default_rng(0)
    draw = _planted_problem(rng, 0)
    X, Y, _ = draw(600)
    X_test, Y_test, proba_test = draw(600)
    model = BMLS(n_topics=4, mu0=1.5, nu0=1.5, beta0=0.3, sample_beta0=False, schedule="fixed", n_burnin=150, n_draws=40,
                 thin=3, random_state=0).fit(X, Y)
    predicted = model.predict_proba(X_test)
    oracle = roc_auc_score(Y_test.ravel(), proba_test.ravel())
    achieved = roc_auc_score(Y_test.ravel(), predicted.ravel())
    assert achieved > oracle - 0.02, (achieved, oracle)
    assert np.corrcoef(predicted.ravel(), proba_test.ravel())[0, 1] > 0.9
    assert len(model.history_["objective"]) == len(model.history_["wall_time"]) == 150 + 40 * 3
    assert model.history_["objective"][-1] > model.history_["objective"][0]


def test_missing_labels_are_integrated_out_not_negatives():
    """Half of the entries hidden: with the mask the predicted probabilities stay calibrated, while
    treating the hidden positives as zeros (the authors' shortcut) shrinks them."""
    rng = np.random.default_rng(1)
    draw = _planted_problem(rng, 0)
    X, Y, _ = draw(800)
    X_test, _, proba_test = draw(400)
    Y_obs, mask = remove_labels(Y, fraction=0.5, random_state=3)
    params = dict(n_topics=4, mu0=1.5, nu0=1.5, beta0=0.3, sample_beta0=False, schedule="fixed", n_burnin=150, n_draws=30,
                  thin=3, random_state=0)
    masked = BMLS(**params).fit(X, Y_obs, label_mask=mask).predict_proba(X_test)
    as_zeros = BMLS(**params).fit(X, Y_obs).predict_proba(X_test)
    truth = proba_test.mean()
    assert abs(masked.mean() / truth - 1) < 0.1, (masked.mean(), truth)
    assert as_zeros.mean() / truth < 0.75  # about half the positives look like negatives
    assert np.corrcoef(masked.ravel(), proba_test.ravel())[0, 1] > 0.85


def test_flipping_masked_entries_changes_nothing():
    rng = np.random.default_rng(2)
    draw = _planted_problem(rng, 0, n_labels=8)
    X, Y, _ = draw(150)
    mask = (rng.random(Y.shape) < 0.6).astype(float)
    flipped = np.where(mask == 1, Y, 1 - Y)
    params = dict(n_topics=3, schedule="fixed", n_burnin=20, n_draws=5, thin=2, random_state=5)
    first = BMLS(**params).fit(X, Y, label_mask=mask)
    second = BMLS(**params).fit(X, flipped, label_mask=mask)
    np.testing.assert_array_equal(first.predict_proba(X), second.predict_proba(X))
    np.testing.assert_array_equal(first.history_["objective"], second.history_["objective"])
    # and the mask is really used: without it the flipped labels give another fit
    third = BMLS(**params).fit(X, flipped)
    assert not np.array_equal(first.predict_proba(X), third.predict_proba(X))


def test_all_observed_mask_equals_no_mask():
    rng = np.random.default_rng(3)
    X, Y, _ = _planted_problem(rng, 0, n_labels=6)(80)
    params = dict(n_topics=3, schedule="fixed", n_burnin=10, n_draws=3, thin=2, random_state=1)
    a = BMLS(**params).fit(X, Y).predict_proba(X)
    b = BMLS(**params).fit(X, Y, label_mask=np.ones_like(Y)).predict_proba(X)
    np.testing.assert_array_equal(a, b)


@pytest.mark.filterwarnings("ignore:.*no positive training example")
def test_log_likelihood_history_matches_direct_computation():
    """The recorded objective of the last sweep equals log p(observed Y | last phi, theta), computed densely."""
    rng = np.random.default_rng(4)
    X, Y, _ = _planted_problem(rng, 0, n_labels=6)(60)
    mask = (rng.random(Y.shape) < 0.7).astype(float)
    model = BMLS(n_topics=3, schedule="fixed", n_burnin=5, n_draws=1, thin=1, recompute_theta_every=1, random_state=2)
    model.fit(X, Y, label_mask=mask)
    phi, log_h = model.phi_samples_[0].astype(float), model.log_h_samples_[0].astype(float)
    rate = np.exp(np.hstack([X, np.ones((60, 1))]) @ log_h) @ phi.T
    y = Y * mask
    expected = np.sum(mask * np.where(y == 1, np.log(-np.expm1(-rate)), -rate))
    assert model.history_["objective"][-1] == pytest.approx(expected, rel=1e-4)


def test_same_seed_same_result_and_save_load(tmp_path):
    rng = np.random.default_rng(5)
    X, Y, _ = _planted_problem(rng, 0, n_labels=6)(70)
    params = dict(n_topics=3, schedule="fixed", n_burnin=10, n_draws=4, thin=2, random_state=11, cooccurrence=True)
    a = BMLS(**params).fit(X, Y)
    b = BMLS(**params).fit(X, Y)
    np.testing.assert_array_equal(a.predict_proba(X), b.predict_proba(X))
    path = tmp_path / "model.npz"
    a.save(path)
    loaded = BMLS.load(path)
    np.testing.assert_array_equal(loaded.predict_proba(X), a.predict_proba(X))
    assert loaded.topics(3) == a.topics(3)
    # a user co-occurrence matrix as a parameter survives the round trip too
    C = cooccurrence_matrix(Y)
    c_model = BMLS(n_topics=3, schedule="fixed", n_burnin=4, n_draws=2, thin=1, random_state=0, cooccurrence=C).fit(X, Y)
    c_model.save(tmp_path / "c.npz")
    np.testing.assert_array_equal(BMLS.load(tmp_path / "c.npz").predict_proba(X), c_model.predict_proba(X))


def test_float16_samples_halve_the_file_and_keep_the_predictions(tmp_path):
    rng = np.random.default_rng(8)
    X, Y, _ = _planted_problem(rng, 0, d=60, n_labels=6)(80)
    params = dict(n_topics=5, schedule="fixed", n_burnin=10, n_draws=20, thin=1, random_state=3)
    full = BMLS(sample_dtype="float32", **params).fit(X, Y)
    half = BMLS(**params).fit(X, Y)  # the default
    assert half.log_h_samples_.dtype == np.float16 and half.phi_samples_.dtype == np.float16
    np.testing.assert_array_equal(half.log_h_, full.log_h_)  # means taken before rounding
    # the same chain; only the stored samples are rounded (relative 2^-11, i.e. < 5e-4 per entry)
    np.testing.assert_allclose(half.log_h_samples_.astype(np.float32), full.log_h_samples_, rtol=5e-4, atol=1e-7)
    assert np.abs(half.predict_proba(X) - full.predict_proba(X)).max() < 2e-3
    full.save(tmp_path / "f32.npz")
    half.save(tmp_path / "f16.npz")
    saved = (tmp_path / "f32.npz").stat().st_size - (tmp_path / "f16.npz").stat().st_size
    sample_bytes = full.log_h_samples_.nbytes + full.phi_samples_.nbytes
    assert abs(saved - sample_bytes / 2) < 0.02 * sample_bytes  # the samples take half the space
    np.testing.assert_array_equal(BMLS.load(tmp_path / "f16.npz").predict_proba(X), half.predict_proba(X))


def test_user_matrix_equal_to_default_gives_same_chain():
    rng = np.random.default_rng(6)
    X, Y, _ = _planted_problem(rng, 0, n_labels=6)(70)
    params = dict(n_topics=3, schedule="fixed", n_burnin=10, n_draws=3, thin=2, random_state=4)
    a = BMLS(cooccurrence=True, **params).fit(X, Y).predict_proba(X)
    full = cooccurrence_matrix(Y).toarray()
    b = BMLS(cooccurrence=full + full.T, **params).fit(X, Y).predict_proba(X)  # symmetric form
    np.testing.assert_array_equal(a, b)
    # with the diagonal: True builds triu(Y^T Y) with c_ii; the symmetric Y^T Y gives the same chain
    c = BMLS(cooccurrence=True, cooccurrence_diagonal=True, **params).fit(X, Y).predict_proba(X)
    gram = Y.T @ Y
    d = BMLS(cooccurrence=gram, cooccurrence_diagonal=True, **params).fit(X, Y).predict_proba(X)
    np.testing.assert_array_equal(c, d)
    assert np.abs(c - a).max() > 1e-3  # the diagonal changes the model
    with pytest.raises(ValidationError, match="diagonal"):
        BMLS(cooccurrence=full, cooccurrence_diagonal=True, **params).fit(X, Y)


def test_cooccurrence_matrix_and_pairs():
    Y = np.array([[1, 1, 0, 1], [1, 1, 0, 0], [0, 1, 1, 0]])
    C = cooccurrence_matrix(Y).toarray()
    expected = np.triu(Y.T @ Y, k=1)
    np.testing.assert_array_equal(C, expected)
    first, second, counts = _pairs_from_matrix(expected + expected.T, 4)
    assert sorted(zip(first, second, counts)) == [(0, 1, 2), (0, 3, 1), (1, 2, 1), (1, 3, 1)]
    lower_only = np.tril(expected.T, k=-1)
    assert sorted(zip(*_pairs_from_matrix(lower_only, 4))) == sorted(zip(first, second, counts))
    with pytest.raises(ValidationError, match="n_labels"):
        _pairs_from_matrix(np.zeros((3, 3)), 4)
    with pytest.raises(ValidationError, match="integer"):
        _pairs_from_matrix(np.full((4, 4), 0.5), 4)
    # with the diagonal (the paper's C = Y^T Y): c_ii = number of rows carrying label i
    gram = Y.T @ Y
    np.testing.assert_array_equal(cooccurrence_matrix(Y, diagonal=True).toarray(), np.triu(gram))
    with_diagonal = sorted(zip(*_pairs_from_matrix(gram, 4, diagonal=True)))
    off_diagonal = [(0, 1, 2), (0, 3, 1), (1, 2, 1), (1, 3, 1)]
    assert with_diagonal == sorted(off_diagonal + [(0, 0, 2), (1, 1, 3), (2, 2, 1), (3, 3, 1)])
    with pytest.raises(ValidationError, match="all-zero diagonal"):
        _pairs_from_matrix(expected, 4, diagonal=True)
    X_bias, Y_csr = sp.csr_matrix(np.ones((3, 1))), sp.csr_matrix(Y)
    with pytest.raises(ValueError, match="first < second"):
        SweepData.build(X_bias, Y_csr, None, ([1], [1], [2]))  # a diagonal pair without pair_diagonal
    with pytest.raises(ValueError, match="first < second"):
        SweepData.build(X_bias, Y_csr, None, ([2], [1], [2]), pair_diagonal=True)


def test_non_binary_features_are_binarised_at_zero_by_default():
    rng = np.random.default_rng(7)
    X = rng.random((40, 5)) - 0.3  # real values, some negative
    X[:, :3] = 0.0  # sparse (40% of the entries non-zero): "auto" is x > 0
    Y = (rng.random((40, 3)) < 0.3).astype(float)
    Y[0] = 1
    params = dict(n_topics=2, schedule="fixed", n_burnin=5, n_draws=2, thin=1, random_state=0)
    with pytest.warns(UserWarning, match="x > 0") as caught:
        auto = BMLS(**params).fit(X, Y)
    assert sum("x > 0" in str(w.message) for w in caught) == 1  # one warning line
    explicit = BMLS(**params).fit((X > 0).astype(float), Y)
    np.testing.assert_array_equal(auto.predict_proba(X), explicit.predict_proba((X > 0).astype(float)))
    with pytest.raises(ValidationError, match="binarize_threshold"):
        BMLS(binarize_threshold=None, **params).fit(X, Y)
    thresholded = BMLS(binarize_threshold=0.5, **params).fit(X, Y)
    explicit = BMLS(binarize_threshold=None, **params).fit((X > 0.5).astype(float), Y)
    np.testing.assert_array_equal(thresholded.predict_proba(X), explicit.predict_proba((X > 0.5).astype(float)))
    with pytest.raises(ValidationError, match="binarize_threshold"):
        explicit.predict_proba(X)


def test_dense_features_are_binarised_at_their_training_medians(tmp_path):
    """binarize_threshold="auto" on dense features (over half the entries non-zero): a feature is on
    where it exceeds its median over the training rows, for the training rows and for new ones."""
    rng = np.random.default_rng(8)
    scale, offset = np.array([1.0, 10.0, 0.1, 3.0, 1.0]), np.array([0.0, 5.0, -2.0, 1.0, 0.3])
    X = (rng.normal(size=(41, 5)) * scale + offset).astype(np.float32)  # every entry non-zero, own offsets
    Y = (rng.random((41, 3)) < 0.3).astype(float)
    Y[0] = 1
    params = dict(n_topics=2, schedule="fixed", n_burnin=5, n_draws=2, thin=1, random_state=0)
    with pytest.warns(UserWarning, match="median"):
        auto = BMLS(**params).fit(X, Y)
    medians = np.median(X, axis=0)
    np.testing.assert_array_equal(auto.feature_thresholds_, medians)
    explicit = BMLS(binarize_threshold=None, **params).fit((X > medians).astype(float), Y)
    assert explicit.feature_thresholds_ is None
    X_new = (rng.normal(size=(7, 5)) * scale + offset).astype(np.float32)
    np.testing.assert_array_equal(auto.predict_proba(X_new), explicit.predict_proba((X_new > medians).astype(float)))
    auto.save(tmp_path / "bmls.npz")
    loaded = BMLS.load(tmp_path / "bmls.npz")
    np.testing.assert_array_equal(loaded.feature_thresholds_, medians)
    np.testing.assert_array_equal(loaded.predict_proba(X_new), auto.predict_proba(X_new))


def _count_features_problem():
    """A synthetic bag of words with counts (values 1, 2, 3, ...), split 160 / 40."""
    from bayesmlc.data.synthetic import make_multilabel

    data = make_multilabel(200, 60, 6, feature_kind="count", random_state=3)
    assert data.X.max() > 1  # counts, not 0/1
    return data


def test_count_features_equal_their_pattern_with_one_warning():
    """Counts (the default input of a bag-of-words file) fit as their pattern x > 0: same draws, same
    predictions as fitting on (X > 0) explicitly, which gives no warning; the warning comes once per fit."""
    import warnings

    data = _count_features_problem()
    X, Y = sp.csr_matrix(data.X), data.Y
    pattern = X.copy()
    pattern.data = (pattern.data > 0).astype(np.float64)
    params = dict(n_topics=3, max_sweeps=60, random_state=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        counts = BMLS(**params).fit(X, Y)
    assert [str(w.message).count("x > 0") for w in caught] == [1]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        binary = BMLS(**params).fit(pattern, Y)
    assert caught == []
    np.testing.assert_array_equal(counts.log_h_, binary.log_h_)
    np.testing.assert_array_equal(counts.predict_proba(X), binary.predict_proba(pattern))
    np.testing.assert_array_equal(counts.predict_proba(X), counts.predict_proba(pattern))


def test_cli_trains_bmls_on_a_count_feature_file(tmp_path, capsys):
    """``bayesmlc train --model bmls`` on a file of counts: exit 0, one binarisation warning, test metrics,
    and the saved model equals BMLS fitted in Python on the 0/1 pattern with the CLI's seed."""
    import warnings

    from bayesmlc.cli import main
    from bayesmlc.data.io import read_dataset, write_dataset
    from bayesmlc.persistence import load_model

    data = _count_features_problem()
    write_dataset(data.subset(np.arange(160)), tmp_path / "train.txt")
    write_dataset(data.subset(np.arange(160, 200)), tmp_path / "test.txt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(["train", "--model", "bmls", "--train", str(tmp_path / "train.txt"), "--test",
                     str(tmp_path / "test.txt"), "--set", "n_topics=3", "--set", "max_sweeps=60", "--seed", "2",
                     "--out", str(tmp_path / "run"), "--json", "--quiet"])
    assert code == 0
    assert sum("x > 0" in str(w.message) for w in caught) == 1
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.0 <= record["metrics"]["AUC_micro"] <= 1.0 and record["params"]["binarize_threshold"] == "auto"
    train = read_dataset(tmp_path / "train.txt")
    pattern = sp.csr_matrix(train.X, dtype=np.float64, copy=True)
    pattern.data = (pattern.data > 0).astype(np.float64)
    expected = BMLS(n_topics=3, max_sweeps=60, random_state=2).fit(pattern, train.Y)
    saved = load_model(tmp_path / "run" / "model.npz")
    np.testing.assert_allclose(saved.predict_proba(pattern), expected.predict_proba(pattern), rtol=1e-6)


@pytest.mark.parametrize(
    "params,match",
    [
        (dict(n_topics=0), "n_topics"),
        (dict(mu0=-1.0), "mu0"),
        (dict(thin=1.5), "thin"),
        (dict(cooccurrence="yes"), "cooccurrence"),
        (dict(sample_beta0="no"), "sample_beta0"),
        (dict(cooccurrence_diagonal="yes"), "cooccurrence_diagonal"),
        (dict(phi_step="exact"), "phi_step"),
        (dict(sample_dtype="float64"), "sample_dtype"),
        (dict(device="tpu"), "device"),
    ],
)
def test_invalid_parameters_are_named(params, match):
    X = np.eye(4)
    Y = np.array([[1, 0], [0, 1], [1, 1], [0, 1]])
    with pytest.raises(ValidationError, match=match):
        BMLS(schedule="fixed", n_burnin=1, n_draws=1, **params).fit(X, Y)


def test_predict_interval_brackets_the_mean():
    rng = np.random.default_rng(8)
    X, Y, _ = _planted_problem(rng, 0, n_labels=6)(80)
    # the topics alone (support_features=0): the reference below is the topics' per-draw probabilities
    model = BMLS(n_topics=3, schedule="fixed", n_burnin=20, n_draws=20, thin=2, support_features=0,
                 random_state=0).fit(X, Y)
    lower, upper = model.predict_interval(X[:10], coverage=0.8)
    mean = model.predict_proba(X[:10])
    assert np.all(lower <= mean + 1e-6) and np.all(mean <= upper + 1e-6)
    assert np.all(upper - lower > 0)
    # the interval is the 10% / 90% quantile of the per-sample probabilities
    theta = np.exp(np.hstack([X[:10], np.ones((10, 1))]) @ model.log_h_samples_.astype(float))  # (S, 10, K)
    per_sample = -np.expm1(-np.einsum("snk,slk->snl", theta, model.phi_samples_.astype(float)))
    np.testing.assert_allclose(lower, np.quantile(per_sample, 0.1, axis=0), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(mean, per_sample.mean(axis=0), rtol=1e-4, atol=1e-6)


def test_topics_and_format_topics():
    rng = np.random.default_rng(9)
    X, Y, _ = _planted_problem(rng, 0, n_labels=6, d=5)(80)
    model = BMLS(n_topics=3, schedule="fixed", n_burnin=10, n_draws=4, thin=2, random_state=0).fit(X, Y)
    topics = model.topics(2)
    assert [t["topic"] for t in topics] == list(np.argsort(-model.topic_usage_, kind="stable"))
    first = topics[0]
    k = first["topic"]
    assert [l for l, _ in first["labels"]] == list(np.argsort(-model.phi_[:, k])[:2])
    assert first["features"][0][1] == pytest.approx(model.log_h_[:-1, k].max())
    text = format_topics(model, 2, label_names=[f"tag{i}" for i in range(6)], feature_names=list("abcde"))
    assert text.count("topic ") == 3 and "tag" in text
    assert format_topics(model, 1).count("label") >= 3
    json.dumps(topics)  # plain Python numbers, printable as JSON


def test_protocol_helpers():
    rng = np.random.default_rng(10)
    Y = sp.csr_matrix((rng.random((50, 20)) < 0.2).astype(float))
    Y_obs, mask = remove_labels(Y, 0.8, random_state=0)
    assert mask.nnz == 200  # 20% of 1000 entries observed
    assert (Y_obs - Y.multiply(mask)).nnz == 0
    again, mask_again = remove_labels(Y, 0.8, random_state=0)
    assert (mask != mask_again).nnz == 0
    kept, no_mask = remove_labels(Y, 0.8, mode="positives", random_state=1)
    assert no_mask is None and kept.nnz == Y.nnz - round(0.8 * Y.nnz)
    assert (kept - kept.multiply(Y)).nnz == 0  # a subset of the positives
    rows = subsample_instances(4880, 0.2, random_state=0)
    assert rows.size == 976 and np.unique(rows).size == 976
    with pytest.raises(ValidationError, match="fraction"):
        remove_labels(Y, 1.5)
    with pytest.raises(ValidationError, match="mode"):
        remove_labels(Y, 0.5, mode="rows")


@pytest.mark.slow
def test_bibtex_full_labels_auc():
    from conftest import shared_dataset_dir

    folder = shared_dataset_dir("bibtex")
    from bayesmlc.data.io import read_dataset

    train = read_dataset(folder / "train.txt")
    test = read_dataset(folder / "test.txt").with_features_width(train.n_features)
    model = BMLS(n_topics=100, mu0=10, nu0=10, random_state=0).fit(train.X, train.Y)
    proba = model.predict_proba(test.X)
    assert roc_auc_score(test.Y.toarray().ravel(), proba.ravel()) >= 0.937


def test_verbose_shows_a_progress_bar(capsys):
    rng = np.random.default_rng(11)
    X, Y, _ = _planted_problem(rng, 0, n_labels=4)(30)
    model = BMLS(n_topics=2, schedule="fixed", n_burnin=3, n_draws=2, thin=1, random_state=0, verbose=True).fit(X, Y)
    err = capsys.readouterr().err
    assert "BMLS Gibbs" in err and "5/5" in err
    assert model.history_["sweep"] == [1, 2, 3, 4, 5]


def test_auto_schedule_follows_its_documented_rules():
    """The burn-in ends at the first window of 20 sweeps whose mean log-likelihood gained at most
    plateau_tol (relative) over the window before, recomputed here from the history; collection ends
    at the first window (after 3) where the posterior-mean rates moved by less than predictive_tol."""
    rng = np.random.default_rng(12)
    X, Y, _ = _planted_problem(rng, 0, n_labels=6)(150)
    model = BMLS(n_topics=3, max_sweeps=400, plateau_tol=5e-3, predictive_tol=0.05, random_state=0).fit(X, Y)
    objective = np.asarray(model.history_["objective"])
    window = 20
    expected_burnin = None
    for end in range(2 * window, 200 + 1, window):
        last, previous = objective[end - window:end].mean(), objective[end - 2 * window:end - window].mean()
        if (last - previous) / abs(last) <= 5e-3 or end >= 200:
            expected_burnin = end
            break
    assert model.n_burnin_ == expected_burnin
    assert model.n_collected_ == model.n_sweeps_ - model.n_burnin_
    changes = model.schedule_trace_["predictive_change"]
    collection = changes[~np.isnan(changes)]
    if model.n_sweeps_ < 400:  # stopped by the rule: the last move is below the tolerance, earlier ones not
        assert collection[-1] < 0.05 and model.n_collected_ >= 3 * window
        windows_before = collection[: max(0, model.n_collected_ // window - 3)]
        assert np.all(windows_before[1:] >= 0.05) or model.n_collected_ == 3 * window
    assert len(objective) == model.n_sweeps_


def test_auto_moments_and_both_predictors_match_numpy():
    """With room for every draw, the stored moments are the mean and variance of the collected draws and
    predict_proba is the mean over them of 1 - exp(-phi exp(x' log h)); without kept draws (the same
    chain: the draw store uses no random numbers) it is 1 - exp(-E[phi] exp(x'(E[log h] + Var[log h] / 2))).
    Both computed here with NumPy; features never on in training keep log h = log(mu0 / nu0) with
    variance 0."""
    rng = np.random.default_rng(13)
    X, Y, _ = _planted_problem(rng, 0, n_labels=5, d=6)(90)
    X[:, 2] = 0  # never on in training
    settings = dict(n_topics=3, max_sweeps=120, mu0=4.0, nu0=2.0, sample_dtype="float32", random_state=1)
    model = BMLS(max_kept_draws=10_000, **settings).fit(X, Y)
    assert model.log_h_samples_.shape[0] == model.n_collected_ >= 16 and model.predictor_ == "draws"
    log_h = model.log_h_samples_.astype(np.float64)
    np.testing.assert_allclose(model.log_h_, log_h.mean(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.log_h_var_, log_h.var(axis=0), rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(model.phi_, model.phi_samples_.astype(np.float64).mean(axis=0), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(model.log_h_[2], np.log(2.0))
    np.testing.assert_array_equal(model.log_h_var_[2], 0.0)
    X_test = (rng.random((30, 6)) < 0.5).astype(float)
    X_bias = np.hstack([X_test, np.ones((30, 1))])
    per_draw = [-np.expm1(-np.exp(X_bias @ lh) @ ph.T) for ph, lh in zip(model.phi_samples_.astype(np.float64), log_h)]
    np.testing.assert_allclose(model.predict_proba(X_test), np.mean(per_draw, axis=0), rtol=1e-4, atol=1e-6)

    no_draws = BMLS(max_kept_draws=0, **settings).fit(X, Y)
    assert no_draws.predictor_ == "moments" and no_draws.phi_samples_.shape[0] == 0
    np.testing.assert_allclose(no_draws.log_h_, model.log_h_, rtol=1e-12)
    theta = np.exp(X_bias @ (model.log_h_ + 0.5 * model.log_h_var_))
    expected = -np.expm1(-theta @ model.phi_.T)
    np.testing.assert_allclose(no_draws.predict_proba(X_test), expected, rtol=1e-4, atol=1e-6)


def test_auto_predicts_from_the_moments_below_the_least_number_of_draws():
    """The "auto" schedule predicts with the kept draws from AUTO_MIN_PREDICTIVE_DRAWS of them on, and
    with the moments below that."""
    from bayesmlc.bmls.schedule import AUTO_MIN_PREDICTIVE_DRAWS

    rng = np.random.default_rng(15)
    X, Y, _ = _planted_problem(rng, 0, n_labels=4)(60)
    few = BMLS(n_topics=2, max_sweeps=200, max_kept_draws=AUTO_MIN_PREDICTIVE_DRAWS - 1, random_state=0).fit(X, Y)
    enough = BMLS(n_topics=2, max_sweeps=200, max_kept_draws=2 * AUTO_MIN_PREDICTIVE_DRAWS, random_state=0).fit(X, Y)
    assert few.predictor_ == "moments" and few.phi_samples_.shape[0] < AUTO_MIN_PREDICTIVE_DRAWS
    assert enough.predictor_ == "draws" and enough.phi_samples_.shape[0] >= AUTO_MIN_PREDICTIVE_DRAWS
    fixed = BMLS(n_topics=2, schedule="fixed", n_burnin=5, n_draws=3, thin=1, random_state=0).fit(X, Y)
    assert fixed.predictor_ == "draws"  # the paper's protocol: always its draws


def test_auto_keeps_a_bounded_spread_set_of_draws():
    from bayesmlc.bmls.chain import DrawStore

    class State:
        def __init__(self, value):
            self.phi = np.full((2, 1), float(value))
            self.h = np.full((1, 1), np.exp(value))

    store = DrawStore(capacity=8, thin=1)
    for sweep in range(100):
        store.offer(State(sweep))
    phi, log_h = store.arrays()
    kept = phi[:, 0, 0]
    assert 4 <= kept.size <= 8
    np.testing.assert_allclose(log_h[:, 0, 0], kept, atol=1e-4)
    steps = np.diff(kept)
    assert np.all(steps == steps[0]) and kept[0] < 100 / 8 and kept[-1] >= 100 - steps[0]  # evenly spread
    rng = np.random.default_rng(14)
    X, Y, _ = _planted_problem(rng, 0, n_labels=4)(60)
    model = BMLS(n_topics=2, max_sweeps=200, max_kept_draws=6, random_state=0).fit(X, Y)
    assert 3 <= model.phi_samples_.shape[0] <= 6
    none = BMLS(n_topics=2, max_sweeps=100, max_kept_draws=0, random_state=0).fit(X, Y)
    assert none.phi_samples_.shape[0] == 0 and none.predict_proba(X).shape == (60, 4)
    with pytest.raises(ValidationError, match="max_kept_draws"):
        none.predict_interval(X)


def test_heldout_log_likelihood_and_validation_fraction():
    from bayesmlc.bmls.gibbs import heldout_log_likelihood

    rng = np.random.default_rng(15)
    X, Y, _ = _planted_problem(rng, 0, n_labels=5)(40)
    phi = rng.dirichlet(np.ones(5), size=3).T
    h = rng.gamma(2.0, 0.5, size=(X.shape[1] + 1, 3))
    Xb = np.hstack([X, np.ones((40, 1))])
    rate = np.exp(Xb @ np.log(h)) @ phi.T
    expected = np.sum(np.where(Y == 1, np.log(-np.expm1(-rate)), -rate))
    rows, cols = (a.astype(np.int64) for a in np.nonzero(Y))
    assert heldout_log_likelihood(sp.csr_matrix(Xb), rows, cols, phi, h) == pytest.approx(expected, rel=1e-10)
    X, Y, _ = _planted_problem(rng, 0, n_labels=5)(120)
    model = BMLS(n_topics=3, max_sweeps=100, validation_fraction=0.25, random_state=0).fit(X, Y)
    heldout = np.asarray(model.history_["heldout"])
    assert heldout.size == model.n_sweeps_ and np.all(np.isfinite(heldout)) and np.std(heldout) > 0
    with pytest.raises(ValidationError, match="label_mask"):
        BMLS(validation_fraction=0.2).fit(X, Y, label_mask=np.ones_like(Y))


def test_auto_sweep_budget_follows_the_cost_model(monkeypatch):
    """max_sweeps='auto' = 60 s / (K (7e-10 nnz(X') + 5.5e-8 D' + 7e-10 L + 3e-9 nnz(Y))) sweeps, within
    [100, 2000], where X' is the binary training pattern restricted to the features that occur, plus the
    bias column; a fit passes its labels and observed positives."""
    from bayesmlc.bmls.schedule import auto_sweeps

    rng = np.random.default_rng(16)
    model = BMLS(n_topics=50)
    for n_rows, n_features, density in [(200, 30, 0.3), (3000, 200_000, 0.0005), (20_000, 2000, 0.2)]:
        X = sp.random(n_rows, n_features, density=density, format="csr", random_state=rng)
        X.data[:] = 1.0
        occurring = np.unique(X.indices).size
        X_bias = model._with_bias(X[:, np.unique(X.indices)])
        seconds = 50 * (7e-10 * (X.nnz + n_rows) + 5.5e-8 * (occurring + 1))
        assert auto_sweeps(model.max_sweeps, X_bias, 50) == int(np.clip(60.0 // seconds, 100, 2000))
        seconds += 50 * (7e-10 * 4000 + 3e-9 * 300_000)
        assert auto_sweeps(model.max_sweeps, X_bias, 50, 4000, 300_000) == int(np.clip(60.0 // seconds, 100, 2000))
    assert auto_sweeps(300, X_bias, 50) == 300
    # delicious' shape (12,920 rows, 18 of 500 features a row, 983 labels, 245,937 positives, K = 100): the
    # label terms are 80% of the sweep (measured: 0.07 of 0.12 s), so the budget falls from 2000 to 640
    X = sp.random(12_920, 500, density=18 / 500, format="csr", random_state=rng)
    X.data[:] = 1.0
    X_bias = model._with_bias(X)
    assert auto_sweeps("auto", X_bias, 100) == 2000
    assert 600 <= auto_sweeps("auto", X_bias, 100, 983, 245_937) <= 680
    # a fit counts its labels and positives: at 1/121 s a positive-topic a sweep of K = 1 over Y's 60
    # positives takes just under 0.5 s, so 60 s buy 120 sweeps, which near-zero tolerances run to the end
    from bayesmlc.bmls import schedule

    monkeypatch.setattr(schedule, "SECONDS_PER_POSITIVE", 1.0 / 121)
    Y_fit = sp.csr_matrix((np.arange(300)[:, None] % 5 == np.arange(5)[None, :])[:, :5].astype(float))[:60]
    fitted = BMLS(n_topics=1, plateau_tol=1e-12, predictive_tol=1e-12, random_state=0).fit(X[:60], Y_fit)
    assert Y_fit.nnz == 60 and fitted.n_sweeps_ == 120


def test_cli_says_the_binarisation_in_one_line_on_stderr(tmp_path):
    """From the command line the automatic binarisation is one stderr line, ``bayesmlc: warning: ...``
    (Python's default warning format would add the source file and line)."""
    import subprocess
    import sys

    from bayesmlc.data.io import write_dataset

    data = _count_features_problem()
    write_dataset(data.subset(np.arange(160)), tmp_path / "train.txt")
    result = subprocess.run(
        [sys.executable, "-m", "bayesmlc", "train", "--model", "bmls", "--train", str(tmp_path / "train.txt"),
         "--set", "n_topics=3", "--set", "max_sweeps=40", "--quiet"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    binarise = [line for line in lines if "x > 0" in line]
    assert len(binarise) == 1 and binarise[0].startswith("bayesmlc: warning: ")
    assert not any(".py:" in line for line in lines), lines


def test_auto_topics_grow_with_the_square_root_of_the_positive_label_entries():
    """n_topics="auto": round(sqrt(positives)) within [10, 100], counted over the observed training
    entries (a label mask hides the rest, a validation split holds its rows out); on large label spaces
    the cap rises to L / 10 while a draw's (L + D + 1) K entries stay within 2^22."""
    from bayesmlc.bmls.topics import auto_topic_cap, auto_topics

    assert [auto_topics(n) for n in (0, 99, 418, 2346, 11729)] == [10, 10, 20, 48, 100]
    assert auto_topics(11729, 159, 1837) == 100  # bibtex
    assert auto_topics(245_937, 983, 501) == 100  # delicious: L / 10 = 98 < 100
    assert auto_topics(82_500, 3993, 5001) == 287  # EURLex-4K shape: sqrt(82,500), under L / 10 = 399
    assert auto_topics(10**6, 3993, 5001) == 399
    assert auto_topic_cap(3993, 20_000) == 4_194_304 // 23_993 == 174
    assert auto_topics(598_000, 13_330, 203_883) == 100  # AmazonCat-13K shape: the draw's size keeps K = 100
    rng = np.random.default_rng(16)
    X, Y, _ = _planted_problem(rng, 0, n_labels=30, d=20)(300)
    Y = sp.csr_matrix(Y)
    model = BMLS(max_sweeps=100, random_state=0).fit(X, Y)
    assert model.n_topics_ == round(np.sqrt(Y.nnz)) == model.phi_.shape[1] and Y.nnz > 100
    mask = sp.csr_matrix((rng.random(Y.shape) < 0.3).astype(np.float32))
    masked = BMLS(max_sweeps=100, random_state=0).fit(X, Y, label_mask=mask)
    assert masked.n_topics_ == auto_topics(Y.multiply(mask).nnz) < model.n_topics_
    held = BMLS(max_sweeps=100, validation_fraction=0.5, random_state=0).fit(X, Y)
    assert held.n_topics_ < model.n_topics_
    assert BMLS(n_topics=7, max_sweeps=100, random_state=0).fit(X, Y).n_topics_ == 7
