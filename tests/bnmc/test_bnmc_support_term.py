"""BNMC's support term (bayesmlc.bnmc.support_term): the mode and Laplace variances against an independent
optimiser, the prediction products against dense algebra, the rule that turns it on, and a fit where the
evidence of tail labels lies outside the low-rank basis."""

import json

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from scipy.optimize import minimize
from scipy.special import expit, logit
from sklearn.metrics import roc_auc_score

from bayesmlc import ModelFormatError, load_model
from bayesmlc.bnmc import BNMC
from bayesmlc.bnmc.classifiers import classifier_evidence
from bayesmlc.bnmc.support_term import SupportTerm, fit_support_block, resolve_support_features

FAST = dict(n_passes=2, n_mode_steps=4, n_sweeps=2, n_keep=1, device="cpu")


def _block_problem(seed=0, n=300, D=40, C=3, K=6):
    rng = np.random.default_rng(seed)
    X = sp.random(n, D, density=0.15, random_state=seed, format="csc", dtype=np.float64)
    X.data = rng.gamma(2.0, 0.5, X.data.size)
    columns = np.stack([np.sort(rng.choice(D, K, replace=False)) for _ in range(C)]).astype(np.int32)
    columns[2, -2:] = -1  # a label with a shorter support
    margins = rng.normal(-1.5, 1.0, size=(n, C))
    Y = (rng.random((n, C)) < 0.3).astype(np.float64)
    weights = np.ones((n, C))
    weights[rng.random(n) < 0.2, 1] = 0.0  # missing entries of one label
    return X, columns, Y, weights, margins


def _negative_log_posterior(v, x, y, w, offset, precision):
    m = offset + x @ v
    p = expit(m)
    value = -np.sum(w * (y * m - np.logaddexp(0.0, m))) + 0.5 * precision * v @ v
    return value, -(x.T @ (w * (y - p))) + precision * v


def test_the_coordinate_newton_passes_reach_the_penalised_mode_and_its_laplace_variances():
    X, columns, Y, weights, margins = _block_problem()
    precision = 0.7
    means, variances = fit_support_block(
        X.astype(np.float32), columns, torch.as_tensor(Y, dtype=torch.float32),
        torch.as_tensor(weights, dtype=torch.float32), torch.as_tensor(margins, dtype=torch.float32),
        precision, n_passes=60)
    dense = X.toarray()
    for label in range(columns.shape[0]):
        cols = columns[label][columns[label] >= 0]
        x, y, w = dense[:, cols], Y[:, label], weights[:, label]
        mode = minimize(_negative_log_posterior, np.zeros(cols.size), jac=True, method="L-BFGS-B",
                        args=(x, y, w, margins[:, label], precision), options={"gtol": 1e-10, "ftol": 1e-14}).x
        p = expit(margins[:, label] + x @ mode)
        laplace = 1.0 / (precision + (w * p * (1 - p)) @ (x * x))
        np.testing.assert_allclose(means[label, :cols.size], mode, atol=2e-4, rtol=1e-3)
        np.testing.assert_allclose(variances[label, :cols.size], laplace, rtol=1e-3)
        assert np.all(means[label, cols.size:] == 0.0)


def test_a_step_is_capped_where_one_newton_step_would_overshoot():
    # one positive row with a large feature value: the first step's margin change is capped at 2
    X = sp.csc_matrix(np.array([[10.0], [0.0], [0.0]]))
    Y = torch.tensor([[1.0], [0.0], [0.0]])
    means, _ = fit_support_block(X, np.array([[0]], np.int32), Y, None, torch.full((3, 1), -8.0), 1e-3, n_passes=1)
    assert means[0, 0] == pytest.approx(0.2, rel=1e-5)


def test_the_term_margins_are_the_dense_products_on_each_support():
    X, columns, _, _, _ = _block_problem(seed=3)
    rng = np.random.default_rng(3)
    term = SupportTerm(columns, rng.normal(size=columns.shape).astype(np.float32),
                       rng.gamma(1.0, 0.3, size=columns.shape).astype(np.float32))
    mean, variance = term.margins(X.tocsr())
    dense = X.toarray()
    for label in range(columns.shape[0]):
        keep = columns[label] >= 0
        cols = columns[label][keep]
        np.testing.assert_allclose(mean[:, label], dense[:, cols] @ term.means[label][keep], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(variance[:, label], dense[:, cols] ** 2 @ term.variances[label][keep], rtol=1e-5,
                                   atol=1e-6)


def test_the_term_enters_the_evidence_before_the_probit_moderation():
    rng = np.random.default_rng(0)
    inputs = rng.normal(size=(5, 3))
    weights = rng.normal(size=(1, 4, 2))
    variances = rng.gamma(1.0, 0.2, size=(4, 2))
    offset = (rng.normal(size=(5, 2)), rng.gamma(1.0, 0.5, size=(5, 2)))
    margin = inputs @ weights[0, :-1] + weights[0, -1] + offset[0]
    spread = inputs**2 @ variances[:-1] + variances[-1] + offset[1]
    expected = logit(expit(margin / np.sqrt(1 + np.pi * spread / 8)))
    np.testing.assert_allclose(classifier_evidence(inputs, weights, variances, "logistic", offset), expected, rtol=1e-6)


@pytest.mark.parametrize("case, expected", [
    (dict(), 128),
    (dict(setting=16), 16),
    (dict(setting=500, n_features=300), 300),
    (dict(setting=0), 0),
    (dict(rank=300), 0),  # the full-rank basis already holds every feature
    (dict(solver="cg"), 0),
    (dict(world_size=2), 0),
    (dict(classifier="svm"), 0),
    (dict(inference="gibbs"), 0),
])
def test_the_term_is_on_only_beside_a_basis_narrower_than_the_features(case, expected):
    arguments = dict(setting="auto", solver="lowrank", rank=64, n_features=300, world_size=1, classifier="logistic",
                     inference="variational") | case
    assert resolve_support_features(**arguments) == expected


def _tail_in_rare_features(n=1500, D=400, L=30, seed=0):
    """Head labels from a dense low-rank signal; tail labels each marked by a rare feature of its own,
    whose column carries little of the features' variance (outside a small basis)."""
    rng = np.random.default_rng(seed)
    U = rng.gamma(1.0, 1.0, size=(n, 4))
    common = (U @ rng.random((4, 40))) * (rng.random((n, 40)) < 0.7)
    noise = (rng.random((n, D - 40 - L)) < 0.02) * rng.gamma(2.0, 1.0, size=(n, D - 40 - L))
    rare = (rng.random((n, L)) < 0.03).astype(float)
    X = sp.csr_matrix(np.hstack([common, noise, rare]))
    head = rng.random((n, 10)) < expit((U - U.mean(axis=0)) @ rng.normal(scale=1.5, size=(4, 10)) - 1.0)
    tail = (rare[:, 10:] > 0) & (rng.random((n, L - 10)) < 0.9)
    return X, sp.csr_matrix(np.hstack([head, tail]).astype(np.float32))


def test_the_term_recovers_tail_labels_whose_features_the_basis_leaves_out(tmp_path):
    X, Y = _tail_in_rare_features()
    train, test = slice(0, 1100), slice(1100, None)
    settings = dict(solver="lowrank", low_rank=8, random_state=0, **FAST)
    without = BNMC(support_features=0, **settings).fit(X[train], Y[train])
    model = BNMC(support_features=4, **settings).fit(X[train], Y[train])
    assert without.support_columns_ is None and model.support_columns_.shape == (30, 4)
    # the tail labels' own columns are in their supports
    assert np.mean([370 + label in model.support_columns_[label] for label in range(10, 30)]) >= 0.9
    Yt = Y[test].toarray()
    scores, base = model.decision_function(X[test]), without.decision_function(X[test])

    def mean_auc(S, labels):  # each label's ranking of the test rows (scikit-learn's AUC)
        return np.mean([roc_auc_score(Yt[:, label], S[:, label]) for label in labels if Yt[:, label].any()])
    # the basis alone cannot tell a tail label's rows (chance level); the term finds them
    assert mean_auc(base, range(10, 30)) < 0.65 and mean_auc(scores, range(10, 30)) > 0.95
    assert mean_auc(scores, range(10)) > mean_auc(base, range(10)) - 0.02
    path = tmp_path / "bnmc.npz"
    model.save(path)
    np.testing.assert_array_equal(load_model(path).decision_function(X[test]), scores)


def test_a_model_file_with_a_support_column_out_of_range_is_refused(tmp_path):
    X, Y = _tail_in_rare_features(n=400)
    BNMC(solver="lowrank", low_rank=8, support_features=4, random_state=0, **FAST).fit(X, Y).save(tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz") as data:
        arrays = {key: data[key] for key in data.files}
    meta = json.loads(arrays["__meta__"].tobytes())
    key = meta["state"]["support_columns_"]["__array__"]
    arrays[key] = arrays[key].copy()
    arrays[key][0, 0] = X.shape[1]
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ModelFormatError, match="support_columns_ must lie in"):
        load_model(tmp_path / "bad.npz")


def test_an_explicit_k_that_gives_no_term_is_named_in_a_warning():
    X, Y = _tail_in_rare_features(n=300)
    with pytest.warns(UserWarning, match="support_features=4 is not used"):
        model = BNMC(solver="cg", support_features=4, random_state=0, **FAST).fit(X, Y)
    assert model.support_columns_ is None
