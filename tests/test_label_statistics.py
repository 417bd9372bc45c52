"""LabelStatistics: the label counts and smoothed prior every model keeps, against hand-worked
counts, and additive over partial_fit batches and over data-parallel ranks."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from test_distributed import _run_as_ranks, _uneven_shards

from bayesmlc import BNMC, MLGPF
from bayesmlc.label_statistics import LabelStatistics
from bayesmlc.linear import LogisticRegression
from bayesmlc.metrics import inverse_propensity_from_counts, training_inverse_propensity

# 5 rows x 4 labels; label 3 never on
Y_HAND = sp.csr_matrix(np.array([[1, 0, 1, 0],
                                 [1, 1, 0, 0],
                                 [0, 0, 1, 0],
                                 [1, 0, 0, 0],
                                 [0, 0, 0, 0]], dtype=np.float32))
# observed entries: label 0 in rows 0-2, label 1 in rows 1 and 4, label 2 everywhere, label 3 in row 4
MASK_HAND = sp.csr_matrix(np.array([[1, 0, 1, 0],
                                    [1, 1, 1, 0],
                                    [1, 0, 1, 0],
                                    [0, 0, 1, 0],
                                    [0, 1, 1, 1]], dtype=np.float32))


def test_counts_and_prior_equal_a_hand_computation():
    counts = LabelStatistics.of_labels(Y_HAND)
    np.testing.assert_array_equal(counts.positives, [3, 1, 2, 0])
    np.testing.assert_array_equal(counts.observed, [5, 5, 5, 5])
    # (N + 1/2) / (O + 1): 3.5/6, 1.5/6, 2.5/6, 0.5/6
    np.testing.assert_allclose(counts.prior, [7 / 12, 1 / 4, 5 / 12, 1 / 12], rtol=1e-15)
    np.testing.assert_array_equal(counts.empty_labels, [3])
    assert counts.n_rows == 5 and counts.n_labels == 4
    # with the mask, the positives stay (masked-out entries of Y are zeroed before counting) and the
    # observed entries are the mask's: label 0 has 2 positives among 3 observed, label 3 none in 1
    masked_Y = Y_HAND.multiply(MASK_HAND).tocsr()
    masked_Y.eliminate_zeros()
    masked = LabelStatistics.of_labels(masked_Y, MASK_HAND)
    np.testing.assert_array_equal(masked.positives, [2, 1, 2, 0])
    np.testing.assert_array_equal(masked.observed, [3, 2, 5, 1])
    np.testing.assert_allclose(masked.prior, [2.5 / 4, 1.5 / 3, 2.5 / 6, 0.5 / 2], rtol=1e-15)


def test_the_prior_is_the_jeffreys_posterior_mean():
    """(N + 1/2) / (O + 1) is the mean of Beta(N + 1/2, O - N + 1/2), the posterior of a Beta(1/2, 1/2)
    prior after N positives among O trials: checked by quadrature of the posterior density."""
    from scipy import integrate, stats

    counts = LabelStatistics(np.array([0, 3, 7]), np.array([4, 9, 7]))
    for n_pos, n_obs, prior in zip(counts.positives, counts.observed, counts.prior):
        posterior = stats.beta(n_pos + 0.5, n_obs - n_pos + 0.5)
        mean, _ = integrate.quad(lambda p: p * posterior.pdf(p), 0, 1, limit=200)
        assert prior == pytest.approx(mean, rel=1e-7)


def test_counts_add_over_batches_and_read_back_from_a_fitted_model():
    first, second = LabelStatistics.of_labels(Y_HAND[:2]), LabelStatistics.of_labels(Y_HAND[2:])
    assert first + second == LabelStatistics.of_labels(Y_HAND)
    assert LabelStatistics.zeros(4) + first == first
    # a model keeps N and the prior; O comes back exactly, here at a count far beyond any data set
    big = LabelStatistics(np.array([0, 1, 2**40 - 1]), np.array([2**45 + 3, 7, 2**40 + 5]))

    class Fitted:
        label_frequencies_ = big.fitted_attributes()["label_frequencies_"]
        label_prior_ = big.fitted_attributes()["label_prior_"]

    assert LabelStatistics.of_fitted(Fitted()) == big


def test_summed_over_ranks_equals_the_counts_of_all_rows():
    rng = np.random.default_rng(4)
    Y = sp.csr_matrix((rng.random((40, 6)) < 0.3).astype(np.float32))
    mask = sp.csr_matrix((rng.random((40, 6)) < 0.7).astype(np.float32))
    Y = Y.multiply(mask).tocsr()
    shards = _uneven_shards(40)

    def on_rank(rank, reduce):
        rows = slice(shards[rank].start, shards[rank].stop)
        return LabelStatistics.of_labels(Y[rows], mask[rows]).summed(reduce)

    whole = LabelStatistics.of_labels(Y, mask)
    np.testing.assert_array_equal(whole.positives, np.asarray(Y.sum(axis=0)).ravel())
    np.testing.assert_array_equal(whole.observed, np.asarray(mask.sum(axis=0)).ravel())
    for result in _run_as_ranks(3, on_rank):
        assert result == whole


@pytest.mark.parametrize("make", [
    lambda: MLGPF(n_inducing=6, n_latent=2, epochs=1, batch_size=20, random_state=0, n_threads=1),
    lambda: BNMC(truncation=3, online=True, random_state=0),
], ids=["mlgpf", "bnmc"])
def test_two_partial_fit_batches_keep_the_counts_of_one_fit(make):
    rng = np.random.default_rng(1)
    X = sp.csr_matrix(rng.random((60, 8)).astype(np.float32))
    dense = (rng.random((60, 5)) < 0.3).astype(np.float32)
    dense[:, 4] = 0  # one label never on
    Y = sp.csr_matrix(dense)
    mask = sp.csr_matrix((rng.random((60, 5)) < 0.8).astype(np.float32))
    expected = LabelStatistics.of_labels(Y.multiply(mask).tocsr(), mask)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        streamed = make().partial_fit(X[:25], Y[:25], label_mask=mask[:25]).partial_fit(X[25:], Y[25:],
                                                                                       label_mask=mask[25:])
        fitted = make().fit(X, Y, label_mask=mask)
    for model in (streamed, fitted):
        np.testing.assert_array_equal(model.label_frequencies_, expected.positives)
        np.testing.assert_array_equal(model.label_prior_, expected.prior)
        np.testing.assert_array_equal(model.empty_labels_, [4])
        assert LabelStatistics.of_fitted(model) == expected


def test_bnmc_counts_only_labelled_rows_as_observed_when_empty_rows_are_missing():
    rng = np.random.default_rng(2)
    X = sp.csr_matrix(rng.random((30, 6)).astype(np.float32))
    dense = (rng.random((30, 4)) < 0.4).astype(np.float32)
    dense[[3, 7, 8], :] = 0
    Y = sp.csr_matrix(dense)
    labelled = int(np.count_nonzero(np.diff(Y.indptr)))
    assert labelled < 30
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = BNMC(truncation=3, n_passes=1, unlabeled_rows="missing", random_state=0).fit(X, Y)
    positives = dense.sum(axis=0).astype(np.int64)
    np.testing.assert_allclose(model.label_prior_, (positives + 0.5) / (labelled + 1.0), rtol=1e-15)
    np.testing.assert_array_equal(model.observed_counts_, np.full(4, labelled))


def test_training_inverse_propensity_uses_the_row_count_read_back():
    rng = np.random.default_rng(3)
    X = rng.random((50, 5)).astype(np.float32)
    Y = (rng.random((50, 4)) < 0.3).astype(np.float32)
    model = LogisticRegression(random_state=0).fit(X, Y)
    np.testing.assert_allclose(training_inverse_propensity(model),
                               inverse_propensity_from_counts(Y.sum(axis=0), 50), rtol=1e-12)
