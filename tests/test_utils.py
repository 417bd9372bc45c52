"""Shared numerical helpers of bayesmlc.utils against NumPy and scikit-learn."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.preprocessing import normalize

from bayesmlc.exceptions import ValidationError
from bayesmlc.utils import column_mean_and_scale, logit, normalize_rows, resolve_standardize, sigmoid, softplus


def test_column_mean_and_scale_match_numpy_alone_and_summed_over_row_shards():
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((90, 6)) * [1.0, 0.1, 3.0, 1.0, 1.0, 1.0] + [0.0, 5.0, -2.0, 0.0, 0.0, 0.0]
    dense[:, 3] = 0.1  # constant and not exactly representable: rounding must not leave a spread
    dense[:, 4:] *= rng.random((90, 2)) < 0.5  # half-sparse columns 4 and 5
    X = sp.csr_matrix(dense)
    expected_std = dense.std(axis=0)
    expected_std[3] = 1.0  # a constant column keeps scale 1
    mean, std = column_mean_and_scale(X)
    np.testing.assert_allclose(mean, dense.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(std, expected_std, rtol=1e-9, atol=0)
    assert std[3] == 1.0
    # two "processes" holding rows 0-39 and 40-89: their sums added by the reduce give the same values
    parts = [column_mean_and_scale(X[:40], 90, lambda a: a + _sums(X[40:])),
             column_mean_and_scale(X[40:], 90, lambda a: a + _sums(X[:40]))]
    for part_mean, part_std in parts:
        np.testing.assert_allclose(part_mean, mean, rtol=1e-12)
        np.testing.assert_allclose(part_std, std, rtol=1e-9)


def _sums(X):
    X = sp.csr_matrix(X, dtype=np.float64)
    return np.concatenate([np.asarray(X.sum(0)).ravel(), np.asarray(X.multiply(X).sum(0)).ravel()])


def test_normalize_rows_matches_scikit_learn_and_keeps_zero_rows():
    X = sp.csr_matrix(np.array([[3.0, 4.0, 0.0], [0.0, 0.0, 0.0], [1.0, -1.0, 1.0]]))
    np.testing.assert_allclose(normalize_rows(X).toarray(), normalize(X).toarray(), rtol=1e-6)
    assert normalize_rows(X).dtype == np.float32


@pytest.mark.parametrize("setting, n_nonzero, n_entries, expected", [
    ("auto", 51, 100, True), ("auto", 50, 100, False), ("auto", 0, 0, False),
    (True, 0, 100, True), (False, 100, 100, False), (np.True_, 1, 100, True),
])
def test_resolve_standardize_switches_on_above_half_the_entries(setting, n_nonzero, n_entries, expected):
    assert resolve_standardize(setting, n_nonzero, n_entries) is expected


@pytest.mark.parametrize("setting", ["yes", 1, None])
def test_resolve_standardize_names_a_bad_setting(setting):
    with pytest.raises(ValidationError, match=f"standardize must be 'auto', True or False, got {setting!r}"):
        resolve_standardize(setting, 1, 2)


def test_sigmoid_logit_and_softplus_match_scipy_and_stay_finite():
    from scipy.special import expit, log_expit
    from scipy.special import logit as scipy_logit

    x = np.concatenate([np.linspace(-30.0, 30.0, 601), [-800.0, -50.0, 50.0, 800.0, 0.0]])
    # the tanh form is accurate to 1e-16 absolute (not relative: far left it rounds to 0 earlier than expit)
    np.testing.assert_allclose(sigmoid(x), expit(x), rtol=1e-14, atol=1e-16)
    np.testing.assert_array_equal(sigmoid(np.array([-800.0, 0.0, 800.0])), [0.0, 0.5, 1.0])
    # log(1 + e^x): numpy's logaddexp(0, x); -softplus(-x) is log sigmoid(x)
    np.testing.assert_allclose(softplus(x), np.logaddexp(0.0, x), rtol=1e-15, atol=0)
    np.testing.assert_allclose(-softplus(-x), log_expit(x), rtol=1e-14, atol=0)
    assert softplus(np.array([800.0]))[0] == 800.0 and softplus(np.array([-800.0]))[0] == 0.0
    p = np.linspace(0.001, 0.999, 999)
    np.testing.assert_allclose(logit(p), scipy_logit(p), rtol=1e-12)
    np.testing.assert_allclose(sigmoid(logit(p)), p, rtol=1e-12)
    # the floor keeps 0 and 1 finite: logit(floor) = log(floor / (1 - floor))
    np.testing.assert_allclose(logit(np.array([0.0, 1.0]), floor=1e-4), [np.log(1e-4 / 0.9999), np.log(0.9999 / 1e-4)],
                               rtol=1e-12)
    with np.errstate(divide="ignore"):
        assert np.isneginf(logit(np.array([0.0]), floor=0.0))[0]
