"""BMLS's support term (bayesmlc.bmls.support_term): the slots against brute force, the token split
against its multinomial law, the weights' conditionals by a replicated Geweke (1994) check, the
prediction's closed form against Monte Carlo, the on/off rule, a fit where tail labels live on rare
features, and the model file."""

import json
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import batch_standard_error
from scipy import stats
from sklearn.metrics import roc_auc_score

from bayesmlc import ModelFormatError, load_model
from bayesmlc.bmls import BMLS
from bayesmlc.bmls.gibbs import SweepData, gibbs_sweep, init_state, positive_rates, theta_from_log_h
from bayesmlc.bmls.samplers import zero_truncated_poisson
from bayesmlc.bmls.support_term import (
    SUPPORT_SHAPE,
    build_support,
    sample_support_weights,
    split_support_tokens,
    support_exponent,
    support_log_factors,
    support_rates,
    support_width,
)


def _binary(n, D, density, seed):
    X = sp.random(n, D, density=density, random_state=seed, format="csr")
    X.data[:] = 1.0
    return X


def test_each_positive_gets_the_slots_whose_column_is_on_in_its_row():
    rng = np.random.default_rng(0)
    X = _binary(40, 30, 0.3, seed=1)
    columns = np.stack([np.sort(rng.choice(30, 6, replace=False)) for _ in range(5)])
    columns[3, 4:] = -1  # a shorter support, padded
    columns[4] = -1  # a label with no support
    Y = (rng.random((40, 5)) < 0.4).astype(float)
    rows, cols = np.nonzero(Y)
    support = build_support(X, columns, rows, cols)
    dense = X.toarray()
    for e, (n, label) in enumerate(zip(rows, cols)):
        expected = sorted(label * 6 + j for j in range(6) if columns[label, j] >= 0 and dense[n, columns[label, j]])
        assert sorted(support.slots[support.slot_ptr[e]:support.slot_ptr[e + 1]]) == expected
    counts = dense.sum(axis=0)
    np.testing.assert_array_equal(support.exposure.reshape(5, 6), np.where(columns >= 0, counts[columns], 0.0))
    weights = rng.gamma(1.0, size=30)
    direct = support_rates(support, weights)
    for e, (n, label) in enumerate(zip(rows, cols)):
        on = [j for j in range(6) if columns[label, j] >= 0 and dense[n, columns[label, j]]]
        assert direct[e] == pytest.approx(sum(weights[label * 6 + j] for j in on))


def test_the_split_sends_each_token_to_a_slot_or_the_topics_in_proportion_to_their_rates():
    # 20,000 copies of one positive whose row carries three of its label's slots
    n_entries = 20_000
    X = sp.csr_matrix(np.ones((n_entries, 3)))
    columns = np.array([[0, 1, 2]])
    support = build_support(X, columns, np.arange(n_entries), np.zeros(n_entries, dtype=np.int64))
    weights = np.array([0.2, 0.5, 1.3])
    topic_rate = 0.8
    counts = np.full(n_entries, 3)
    rng = np.random.default_rng(5)
    topic_counts, tokens = split_support_tokens(support, weights, counts, np.full(n_entries, topic_rate),
                                                support_rates(support, weights), rng)
    observed = np.append(tokens, topic_counts.sum())
    expected = counts.sum() * np.append(weights, topic_rate) / (weights.sum() + topic_rate)
    assert observed.sum() == counts.sum()
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_the_weight_and_rate_conditionals_keep_the_prior_by_geweke_replicates():
    """Geweke (2004): draw (b, w) from the prior, labels y from the model, then run the term's Gibbs
    kernel (latent counts, split, w | T, b | w) given y; the result must again follow the prior:
    b ~ Gamma(1, 1) and b w_j ~ Gamma(a, 1) independent of b."""
    rng = np.random.default_rng(11)
    X = sp.csr_matrix(np.array([[1, 1, 0], [1, 0, 1], [0, 1, 1], [1, 1, 1], [0, 0, 1], [1, 0, 0]], dtype=float))
    columns = np.array([[0, 1, 2]])
    topic_rate = 0.3
    b_draws, scaled = [], []
    for _ in range(3000):
        b = rng.gamma(1.0)
        w = rng.gamma(SUPPORT_SHAPE, size=3) / b
        z = rng.poisson(topic_rate + X @ w)
        rows = np.flatnonzero(z > 0)
        support = build_support(X, columns, rows, np.zeros(rows.size, dtype=np.int64))
        rates = np.array([b])
        for _ in range(3):
            direct = support_rates(support, w)
            counts = zero_truncated_poisson(topic_rate + direct, rng)
            _, tokens = split_support_tokens(support, w, counts, np.full(rows.size, topic_rate), direct, rng)
            w, rates = sample_support_weights(support, tokens, rates, rng)
        b_draws.append(rates[0])
        scaled.append(rates[0] * w[0])
    assert stats.kstest(b_draws, stats.gamma(1.0).cdf).pvalue > 1e-3
    assert stats.kstest(scaled, stats.gamma(SUPPORT_SHAPE).cdf).pvalue > 1e-3


def test_the_prediction_exponent_is_the_gamma_laplace_transform_on_the_rows_slots():
    rng = np.random.default_rng(2)
    X = _binary(5, 12, 0.5, seed=3)
    columns = np.array([[1, 4, 7, -1], [0, 2, 9, 11]])
    shape = rng.uniform(0.2, 3.0, size=columns.shape)
    rate = rng.uniform(0.5, 4.0, size=columns.shape)
    exponent = support_exponent(X, columns, shape, rate)
    draws = rng.gamma(shape[None], 1.0 / rate[None], size=(200_000, *columns.shape))
    dense = X.toarray()
    for label in range(2):
        on = (columns[label] >= 0)[None, :] & (dense[:, np.maximum(columns[label], 0)] > 0)  # (n, S)
        monte_carlo = np.exp(-(draws[:, label] @ on.T.astype(float))).mean(axis=0)
        np.testing.assert_allclose(np.exp(-exponent[:, label]), monte_carlo, rtol=5e-3)
    assert support_log_factors(np.zeros(1), np.ones(1))[0] == 0.0


@pytest.mark.parametrize("setting, labels, topics, rows_per_feature, unavailable, expected", [
    ("auto", 3993, 287, 0.5, None, 128), ("auto", 13_330, 100, 0.6, None, 128),  # the EURLex, AmazonCat shapes
    ("auto", 159, 100, 2.7, None, 0), ("auto", 983, 100, 26.0, None, 0),  # bibtex, delicious
    ("auto", 1001, 100, 26.0, None, 0), (16, 5, 10, 26.0, None, 16), (0, 3993, 287, 0.5, None, 0),
    ("auto", 3993, 287, 0.5, "label_mask", 0)])
def test_the_term_is_on_where_labels_are_many_a_topic_and_features_rare(setting, labels, topics, rows_per_feature,
                                                                            unavailable, expected):
    assert support_width(setting, labels, topics, rows_per_feature, unavailable) == expected


def test_an_explicit_width_without_a_term_is_named_in_a_warning():
    with pytest.warns(UserWarning, match="support_features=8 is not used with label_mask"):
        assert support_width(8, 3993, 287, 0.5, "label_mask") == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert support_width("auto", 3993, 287, 0.5, "label_mask") == 0


def _tail_problem(seed=0, n=900):
    """Three head labels on common features (what two topics can hold) and twelve tail labels, each on
    in the rows that carry its own rare feature (2% of rows), with a little noise."""
    rng = np.random.default_rng(seed)
    common = (rng.random((n, 6)) < 0.4).astype(float)
    rare = (rng.random((n, 12)) < 0.02).astype(float)
    head = np.stack([common[:, 0] * common[:, 1], common[:, 2], common[:, 3] * common[:, 4]], axis=1)
    Y = np.hstack([head, rare]) * (rng.random((n, 15)) > 0.05)
    return sp.csr_matrix(np.hstack([common, rare])), sp.csr_matrix(Y)


def test_the_term_recovers_tail_labels_on_rare_features(tmp_path):
    X, Y = _tail_problem()
    X_test, Y_test = _tail_problem(seed=1, n=600)
    settings = dict(n_topics=2, max_sweeps=200, random_state=0, device="cpu")
    aucs = {}
    for width in (0, 4):
        model = BMLS(support_features=width, **settings).fit(X, Y)
        P = model.predict_proba(X_test)
        aucs[width] = [roc_auc_score(Y_test[:, l].toarray().ravel(), P[:, l]) for l in range(15)]
    assert np.mean(aucs[0][3:]) < 0.8
    assert np.mean(aucs[4][3:]) > 0.95
    assert np.mean(aucs[4][:3]) > np.mean(aucs[0][:3]) - 0.02
    path = tmp_path / "bmls.npz"
    model.save(path)
    np.testing.assert_array_equal(load_model(path).predict_proba(X_test), P)
    assert model.support_columns_.shape == (15, 4) and model.support_shape_.min() >= 0


def test_a_model_file_with_one_support_array_of_another_shape_is_refused(tmp_path):
    X, Y = _tail_problem(n=300)
    BMLS(n_topics=2, max_sweeps=60, support_features=4, random_state=0, device="cpu").fit(X, Y).save(tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz") as data:
        arrays = {key: data[key] for key in data.files}
    key = json.loads(arrays["__meta__"].tobytes())["state"]["support_rate_"]["__array__"]
    arrays[key] = arrays[key][:, :3].copy()
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ModelFormatError, match="support_columns_, support_shape_ and support_rate_"):
        load_model(tmp_path / "bad.npz")


def test_a_label_mask_fits_without_the_term_and_says_so_for_an_explicit_width():
    X, Y = _tail_problem(n=300)
    mask = sp.csr_matrix(np.ones(Y.shape))
    mask[0, 0] = 0
    with pytest.warns(UserWarning, match="support_features=4 is not used with label_mask"):
        model = BMLS(n_topics=2, max_sweeps=60, support_features=4, random_state=0, device="cpu").fit(
            X, Y, label_mask=mask)
    assert model.support_columns_ is None


def test_geweke_whole_sweep_with_the_term_keeps_the_prior():
    """Successive-conditional Geweke test (Geweke 2004) of the whole sweep with the term: alternate
    'draw labels from the model given (phi, h, w, b)' with one Gibbs sweep; the chain on (phi, h, b, w)
    must keep the prior: E[h], E[phi], b ~ Gamma(1, 1), b w ~ Gamma(a, 1)."""
    rng = np.random.default_rng(7)
    n, d, n_labels, n_topics = 12, 3, 4, 2
    mu0, nu0, beta0 = 3.0, 3.0, 0.7
    Xb = sp.csr_matrix(np.hstack([(rng.random((n, d)) < 0.5).astype(float), np.ones((n, 1))]))
    columns = np.array([[0, 1], [1, 2], [0, 2], [2, -1]])
    data = SweepData.build(Xb, sp.csr_matrix((n, n_labels)), None)
    data.support = build_support(Xb, columns, data.pos_rows, data.pos_cols)
    state = init_state(data, n_topics, d + 1, beta0, rng)
    state.h = rng.gamma(mu0, 1.0 / nu0, size=(d + 1, n_topics))
    state.phi = rng.dirichlet(np.full(n_labels, beta0), size=n_topics).T
    state.support_rate = rng.gamma(1.0, size=n_labels)
    valid = columns.ravel() >= 0
    state.support_weights = np.where(valid, rng.gamma(SUPPORT_SHAPE, size=valid.size)
                                     / np.repeat(state.support_rate, 2), 0.0)
    dense = Xb.toarray()
    slot_on = np.stack([np.where(columns[l][:, None] >= 0, dense[:, np.maximum(columns[l], 0)].T, 0.0)
                        for l in range(n_labels)])  # (L, S, n): slot (l, j) on in row n
    h_draws, phi_draws, rates, scaled = [], [], [], []
    for _ in range(5_000):
        theta = theta_from_log_h(data.x_csr, state.h)
        direct = np.einsum("lsn,ls->nl", slot_on, state.support_weights.reshape(n_labels, 2))
        labels = rng.poisson(theta @ state.phi.T + direct) > 0
        data.pos_rows, data.pos_cols = (idx.astype(np.int64) for idx in np.nonzero(labels))
        data.support = build_support(Xb, columns, data.pos_rows, data.pos_cols)
        state.theta = theta
        state.rates = positive_rates(data.pos_rows, data.pos_cols, state.phi, state.theta)
        state.direct_rates = support_rates(data.support, state.support_weights)
        gibbs_sweep(data, state, rng, mu0, nu0, sample_beta0_flag=False, recompute_theta=True)
        h_draws.append(state.h.mean())
        phi_draws.append(state.phi[0].mean())
        rates.append(state.support_rate[0])
        scaled.append(state.support_rate[1] * state.support_weights[2])
    checks = {"E[h]": (h_draws, mu0 / nu0), "E[phi_0]": (phi_draws, 1 / n_labels), "E[b]": (rates, 1.0),
              "E[b w]": (scaled, SUPPORT_SHAPE), "E[log b]": (np.log(rates), -np.euler_gamma)}
    for name, (series, prior_value) in checks.items():
        z = (np.mean(series) - prior_value) / batch_standard_error(series)
        assert abs(z) < 4.0, f"{name}: chain {np.mean(series):.4f} vs prior {prior_value:.4f} (z = {z:.1f})"


@pytest.mark.parametrize("name, value", [("support_shape_", -1.0), ("support_rate_", np.nan),
                                         ("support_columns_", 10**6)])
def test_a_model_file_with_a_bad_support_entry_is_refused_by_name(tmp_path, name, value):
    X, Y = _tail_problem(n=300)
    BMLS(n_topics=2, max_sweeps=60, support_features=4, random_state=0, device="cpu").fit(X, Y).save(tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz") as data:
        arrays = {key: data[key] for key in data.files}
    key = json.loads(arrays["__meta__"].tobytes())["state"][name]["__array__"]
    arrays[key] = arrays[key].copy()
    arrays[key][0, 0] = value
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ModelFormatError, match=name):
        load_model(tmp_path / "bad.npz")


def test_the_held_out_log_likelihood_adds_the_term_as_a_dense_computation_does():
    from bayesmlc.bmls.gibbs import heldout_log_likelihood

    rng = np.random.default_rng(4)
    n, d, n_labels, n_topics = 30, 6, 4, 3
    Xb = sp.csr_matrix(np.hstack([(rng.random((n, d)) < 0.4).astype(float), np.ones((n, 1))]))
    Y = (rng.random((n, n_labels)) < 0.3).astype(float)
    rows, cols = (idx.astype(np.int64) for idx in np.nonzero(Y))
    columns = np.array([[0, 2, -1], [1, 3, 5], [4, -1, -1], [0, 5, -1]])
    support = build_support(Xb, columns, rows, cols)
    weights = np.where(columns.ravel() >= 0, rng.gamma(1.0, size=columns.size), 0.0)
    phi = rng.dirichlet(np.ones(n_labels), size=n_topics).T
    h = rng.gamma(3.0, 1 / 3.0, size=(d + 1, n_topics))
    dense = Xb.toarray()
    direct = np.stack([sum(weights[l * 3 + j] * dense[:, columns[l, j]] for j in range(3) if columns[l, j] >= 0)
                       for l in range(n_labels)], axis=1)
    rates = np.exp(dense @ np.log(h)) @ phi.T + direct
    expected = np.sum(np.where(Y > 0, np.log(-np.expm1(-rates)), -rates))
    assert heldout_log_likelihood(Xb, rows, cols, phi, h, support, weights) == pytest.approx(expected, rel=1e-10)
