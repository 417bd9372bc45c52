"""Tests of bayesmlc.metrics.bands: band assignment by hand, band contributions against Python loops
straight from the definitions, and their sums against the library's overall metrics and pyxclib's
recall@k formula."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from bayesmlc import metrics as M
from bayesmlc.exceptions import ValidationError


def _problem(seed, n_test=50, n_train=80, n_labels=23, density=0.15, empty_rows=4):
    """Sparse test and training labels (some empty test rows, some labels absent from training) and
    dense scores with ties."""
    rng = np.random.default_rng(seed)
    label_rates = density * rng.random(n_labels) ** 2 * 3  # skewed: a head and a tail
    train = rng.random((n_train, n_labels)) < label_rates
    train[:, rng.choice(n_labels, 2, replace=False)] = False  # never seen in training
    test = rng.random((n_test, n_labels)) < label_rates
    test[rng.choice(n_test, empty_rows, replace=False)] = False
    scores = rng.integers(0, 8, size=(n_test, n_labels)).astype(np.float64)
    return sp.csr_matrix(test.astype(np.float32)), test, sp.csr_matrix(train.astype(np.float32)), train, scores


def _brute_bands(counts, n_bands):
    """Labels by decreasing count (ties by index), cut into n_bands near-equal consecutive pieces."""
    order = sorted(range(len(counts)), key=lambda j: (-counts[j], j))
    sizes = [len(order) // n_bands + (1 if b < len(order) % n_bands else 0) for b in range(n_bands)]
    band, start = {}, 0
    for b, size in enumerate(sizes):
        for j in order[start:start + size]:
            band[j] = b
        start += size
    return [band[j] for j in range(len(counts))]


def _brute_band_metrics(test, scores, band, weights, k, n_bands):
    """P@k_b, PSP@k_b and R@k_b by loops over rows and ranks."""
    n = len(test)
    p, psp, recall = np.zeros(n_bands), np.zeros(n_bands), np.zeros(n_bands)
    best_total = 0.0
    for y, s in zip(test, scores):
        top = sorted(range(len(s)), key=lambda j: (-s[j], j))[:k]
        true = [j for j in range(len(y)) if y[j]]
        best_total += sum(sorted((weights[j] for j in true), reverse=True)[:k]) / k
        for j in top:
            if y[j]:
                p[band[j]] += 1 / (k * n)
                psp[band[j]] += weights[j] / k
                recall[band[j]] += 1 / (len(true) * n)
    return p, psp / best_total, recall


def test_frequency_bands_by_hand():
    counts = [5, 0, 9, 5, 1, 7, 2]  # sorted: 2(9) 5(7) 0(5) 3(5) 6(2) 4(1) 1(0)
    bands = M.frequency_bands(counts, n_bands=3)  # pieces of 3, 2, 2 labels
    assert bands.band_of_label.tolist() == [0, 2, 0, 1, 2, 0, 1]
    assert bands.n_labels.tolist() == [3, 2, 2]
    assert bands.min_count.tolist() == [5, 2, 0]
    assert bands.max_count.tolist() == [9, 5, 1]
    assert M.frequency_bands(counts).n_bands == 7  # fewer than ten labels: one band each
    assert M.frequency_bands(np.arange(100)).n_bands == 10


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n_bands", [1, 4, 10])
def test_frequency_bands_match_brute_force(seed, n_bands):
    counts = np.random.default_rng(seed).integers(0, 6, size=37)  # many ties
    assert M.frequency_bands(counts, n_bands).band_of_label.tolist() == _brute_bands(counts.tolist(), n_bands)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("k", [1, 3, 5])
def test_band_contributions_match_brute_force(seed, k):
    Y_test, test, Y_train, train, scores = _problem(seed)
    n_bands = 5
    result = M.metrics_by_band(Y_test, scores, Y_train, ks=(k,), n_bands=n_bands)
    band = _brute_bands(train.sum(axis=0).tolist(), n_bands)
    weights = M.inverse_propensity(Y_train)
    p, psp, recall = _brute_band_metrics(test, scores, band, weights, k, n_bands)
    np.testing.assert_allclose(result.values[f"P@{k}"], p, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(result.values[f"PSP@{k}"], psp, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(result.values[f"R@{k}"], recall, rtol=1e-12, atol=1e-15)
    share = np.bincount(np.asarray(band)[np.nonzero(test)[1]], minlength=n_bands) / test.sum()
    np.testing.assert_allclose(result.positive_share, share, rtol=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_bands_add_up_to_the_overall_metrics(seed):
    Y_test, test, Y_train, _, scores = _problem(seed, n_labels=31)
    result = M.metrics_by_band(Y_test, scores, Y_train)  # default: ten bands
    assert result.bands.n_bands == 10
    for k in (1, 3, 5):
        assert result.overall(f"P@{k}") == pytest.approx(M.precision_at_k(Y_test, scores, k), rel=1e-12)
        assert result.overall(f"PSP@{k}") == pytest.approx(
            M.psprecision_at_k(Y_test, scores, k, Y_train=Y_train), rel=1e-12)
        # pyxclib's recall@k: mean over all rows of hits / max(|y_i|, 1)
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        hits = np.take_along_axis(test, top, axis=1).sum(axis=1)
        expected = np.mean(hits / np.maximum(test.sum(axis=1), 1))
        assert result.overall(f"R@{k}") == pytest.approx(expected, rel=1e-12)


def test_topk_input_and_given_bands_and_propensities_agree_with_dense():
    Y_test, _, Y_train, train, scores = _problem(7)
    dense = M.metrics_by_band(Y_test, scores, Y_train, ks=(1, 5), n_bands=3)
    bands = M.frequency_bands(train.sum(axis=0), 3)
    weights = M.inverse_propensity(Y_train)
    from_topk = M.metrics_by_band(Y_test, M.topk(scores, 5), ks=(1, 5), bands=bands, propensities=weights)
    for name, values in dense.values.items():
        np.testing.assert_allclose(from_topk.values[name], values, rtol=1e-12)
    record = dense.to_json()
    assert record["n_labels"] == dense.bands.n_labels.tolist() and set(record["values"]) == set(dense.values)


def test_a_perfect_ranking_puts_every_top1_hit_in_its_band():
    # three rows, one label each, labels 0 (head, 3 training rows), 1 (2 rows), 2 (1 row)
    Y_train = sp.csr_matrix(np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=np.float32))
    Y_test = sp.csr_matrix(np.eye(3, dtype=np.float32))
    result = M.metrics_by_band(Y_test, np.eye(3), Y_train, ks=(1,))
    np.testing.assert_allclose(result.values["P@1"], [1 / 3, 1 / 3, 1 / 3])
    np.testing.assert_allclose(result.values["R@1"], [1 / 3, 1 / 3, 1 / 3])
    weights = M.inverse_propensity(Y_train)
    np.testing.assert_allclose(result.values["PSP@1"], weights / weights.sum())


def test_refusals_name_the_argument():
    Y_test, _, Y_train, _, scores = _problem(0)
    with pytest.raises(ValidationError, match="Y_train"):
        M.metrics_by_band(Y_test, scores)
    with pytest.raises(ValidationError, match="n_bands"):
        M.metrics_by_band(Y_test, scores, Y_train, n_bands=99)
    with pytest.raises(ValidationError, match="label columns"):
        M.metrics_by_band(Y_test, scores, Y_train[:, :5])
    with pytest.raises(ValidationError, match="label_counts"):
        M.frequency_bands([1, -2, 3])
