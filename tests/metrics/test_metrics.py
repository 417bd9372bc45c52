"""Tests of bayesmlc.metrics: hand-worked examples, scikit-learn, and brute-force loops."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn import metrics as skm
from sklearn.exceptions import UndefinedMetricWarning

from bayesmlc import metrics as M
from bayesmlc.exceptions import ValidationError

from conftest import shared_dataset_dir

LOG2_3 = math.log2(3)


# ---- helpers ----------------------------------------------------------------------------------------
def random_problem(seed, n=60, n_labels=25, density=0.12, empty_rows=3, tied=False):
    """Sparse labels with some empty rows, and dense scores (optionally with many ties)."""
    rng = np.random.default_rng(seed)
    dense = rng.random((n, n_labels)) < density
    dense[rng.choice(n, size=empty_rows, replace=False)] = False
    scores = rng.integers(0, 6, size=(n, n_labels)).astype(np.float64) if tied else rng.normal(size=(n, n_labels))
    return sp.csr_matrix(dense.astype(np.float32)), dense.astype(int), scores


def ranking_of(row_scores):
    """Labels by decreasing score, ties towards the lower index (the order bayesmlc.metrics.topk uses)."""
    return sorted(range(len(row_scores)), key=lambda j: (-row_scores[j], j))


def brute_ranking_metrics(dense_y, scores, k, weights):
    """Python loops straight from the definitions (docs/metrics.md)."""
    p, ndcg, psp_num, psp_best, psn_num, psn_best = [], [], [], [], [], []
    for y, s in zip(dense_y, scores):
        top = ranking_of(s)[:k]
        true = [j for j in range(len(y)) if y[j]]
        idcg = sum(1 / math.log2(r + 2) for r in range(min(k, len(true))))
        dcg = sum(y[j] / math.log2(r + 2) for r, j in enumerate(top))
        dcg_w = sum(weights[j] * y[j] / math.log2(r + 2) for r, j in enumerate(top))
        best_w = sorted((weights[j] for j in true), reverse=True)[:k]
        p.append(sum(y[j] for j in top) / k)
        ndcg.append(dcg / idcg if idcg > 0 else 0.0)
        psp_num.append(sum(weights[j] * y[j] for j in top) / k)
        psp_best.append(sum(best_w) / k)
        psn_num.append(dcg_w / idcg if idcg > 0 else 0.0)
        psn_best.append(sum(w / math.log2(r + 2) for r, w in enumerate(best_w)) / idcg if idcg > 0 else 0.0)
    return {
        "P": np.mean(p),
        "nDCG": np.mean(ndcg),
        "PSP": np.sum(psp_num) / np.sum(psp_best),
        "PSP_raw": np.mean(psp_num),
        "PSnDCG": np.sum(psn_num) / np.sum(psn_best),
        "PSnDCG_raw": np.mean(psn_num),
    }


def brute_auc(labels, scores):
    """Mann-Whitney by counting every (positive, negative) pair, ties one half."""
    pos = [s for y, s in zip(labels, scores) if y]
    neg = [s for y, s in zip(labels, scores) if not y]
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg)
    return wins / (len(pos) * len(neg))


# ---- hand-worked ranking example --------------------------------------------------------------------
# Y rows: {0, 2}, {1}, {} (empty). Rankings by score:
#   row 0 [0.9, 0.8, 0.1, 0.3] -> 0, 1, 3, 2
#   row 1 [0.2, 0.4, 0.6, 0.1] -> 2, 1, 0, 3
#   row 2 [0.5, 0.1, 0.2, 0.3] -> 0, 3, 2, 1
HAND_Y = sp.csr_matrix(np.array([[1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]], dtype=np.float32))
HAND_S = np.array([[0.9, 0.8, 0.1, 0.3], [0.2, 0.4, 0.6, 0.1], [0.5, 0.1, 0.2, 0.3]])
HAND_W = np.array([2.0, 3.0, 4.0, 1.5])


def test_precision_hand_example():
    # P@1: row0 label 0 is true (1), row1 label 2 is not (0), empty row 0 -> 1/3
    assert M.precision_at_k(HAND_Y, HAND_S, 1) == pytest.approx(1 / 3)
    # P@3: row0 {0,1,3} has 1 hit -> 1/3; row1 {2,1,0} has 1 hit -> 1/3; row2 0 -> (2/3)/3 = 2/9
    assert M.precision_at_k(HAND_Y, HAND_S, 3) == pytest.approx(2 / 9)


def test_ndcg_hand_example():
    # row0: DCG@3 = 1/log2(2) = 1, IDCG = 1 + 1/log2(3) (two true labels) -> 1 / (1 + 1/log2 3)
    # row1: label 1 at rank 2 -> DCG = 1/log2(3), IDCG = 1 (one true label) -> 1/log2 3
    # row2: no true label -> defined as 0, counted in the mean
    expected = (1 / (1 + 1 / LOG2_3) + 1 / LOG2_3) / 3
    assert M.ndcg_at_k(HAND_Y, HAND_S, 3) == pytest.approx(expected)
    # nDCG@1 = P@1 for binary relevance
    assert M.ndcg_at_k(HAND_Y, HAND_S, 1) == pytest.approx(1 / 3)


def test_psp_hand_example():
    # weights w = [2, 3, 4, 1.5].  k = 1:
    #   numerators: row0 w0 = 2, row1 0, row2 0 -> sum 2
    #   best: row0 true {0: 2, 2: 4} -> 4, row1 true {1: 3} -> 3, row2 0 -> sum 7
    assert M.psprecision_at_k(HAND_Y, HAND_S, 1, HAND_W) == pytest.approx(2 / 7)
    assert M.psprecision_at_k(HAND_Y, HAND_S, 1, HAND_W, normalize=False) == pytest.approx(2 / 3)
    # k = 3: numerators row0 w0/3 = 2/3, row1 w1/3 = 1 -> 5/3; best row0 (4 + 2)/3 = 2, row1 3/3 = 1 -> 3
    assert M.psprecision_at_k(HAND_Y, HAND_S, 3, HAND_W) == pytest.approx((5 / 3) / 3)
    assert M.psprecision_at_k(HAND_Y, HAND_S, 3, HAND_W, normalize=False) == pytest.approx((2 / 3 + 1) / 3)


def test_psndcg_hand_example():
    # k = 3, IDCG unweighted: row0 1 + 1/log2 3, row1 1.
    # numerators: row0 w0 * 1 / IDCG0 = 2 / (1 + 1/log2 3); row1 w1 / log2 3 / 1 = 3 / log2 3
    # best: row0 labels by weight 2 (4), 0 (2): (4 + 2/log2 3) / (1 + 1/log2 3); row1 3 / 1 = 3
    idcg0 = 1 + 1 / LOG2_3
    num = 2 / idcg0 + 3 / LOG2_3
    best = (4 + 2 / LOG2_3) / idcg0 + 3
    assert M.psndcg_at_k(HAND_Y, HAND_S, 3, HAND_W) == pytest.approx(num / best)
    assert M.psndcg_at_k(HAND_Y, HAND_S, 3, HAND_W, normalize=False) == pytest.approx(num / 3)


def test_inverse_propensity_formula():
    # N = 10 rows, label counts [0, 1, 10]; C = (ln 10 - 1) * 2.5^0.55; w = 1 + C (N_l + 1.5)^-0.55
    Y = np.zeros((10, 3))
    Y[:, 2] = 1
    Y[4, 1] = 1
    C = (math.log(10) - 1) * 2.5**0.55
    expected = [1 + C * 1.5**-0.55, 1 + C * 2.5**-0.55, 1 + C * 11.5**-0.55]
    np.testing.assert_allclose(M.inverse_propensity(sp.csr_matrix(Y)), expected, rtol=1e-12)
    np.testing.assert_allclose(M.inverse_propensity(Y, A=0.6, B=2.6)[0], 1 + (math.log(10) - 1) * 3.6**0.6 * 2.6**-0.6)
    # p_l = 1 / w_l lies in (0, 1]; frequent labels have propensity closer to 1
    w = M.inverse_propensity(sp.csr_matrix(Y))
    assert np.all(w >= 1) and w[0] > w[1] > w[2]


def test_ps_metrics_accept_training_labels():
    Y_train = sp.random(40, 4, density=0.3, format="csr", random_state=1)
    Y_train.data[:] = 1
    w = M.inverse_propensity(Y_train, A=0.5, B=0.4)
    assert M.psprecision_at_k(HAND_Y, HAND_S, 3, Y_train=Y_train, A=0.5, B=0.4) == pytest.approx(
        M.psprecision_at_k(HAND_Y, HAND_S, 3, w)
    )
    assert M.psndcg_at_k(HAND_Y, HAND_S, 3, Y_train=Y_train, A=0.5, B=0.4) == pytest.approx(
        M.psndcg_at_k(HAND_Y, HAND_S, 3, w)
    )


# ---- brute force and scikit-learn on random inputs --------------------------------------------------
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [1, 3, 5, 30])
def test_ranking_metrics_match_brute_force(seed, k):
    Y, dense_y, scores = random_problem(seed, tied=seed % 2 == 1)  # odd seeds: integer scores, many ties
    weights = 1 + 3 * np.random.default_rng(seed + 100).random(Y.shape[1])
    brute = brute_ranking_metrics(dense_y, scores, k, weights)
    assert M.precision_at_k(Y, scores, k) == pytest.approx(brute["P"], abs=1e-12)
    assert M.ndcg_at_k(Y, scores, k) == pytest.approx(brute["nDCG"], abs=1e-12)
    assert M.psprecision_at_k(Y, scores, k, weights) == pytest.approx(brute["PSP"], abs=1e-12)
    assert M.psprecision_at_k(Y, scores, k, weights, normalize=False) == pytest.approx(brute["PSP_raw"], abs=1e-12)
    assert M.psndcg_at_k(Y, scores, k, weights) == pytest.approx(brute["PSnDCG"], abs=1e-12)
    assert M.psndcg_at_k(Y, scores, k, weights, normalize=False) == pytest.approx(brute["PSnDCG_raw"], abs=1e-12)


@pytest.mark.parametrize("k", [1, 2, 5, 25])
def test_ndcg_matches_sklearn(k):
    # scikit-learn's ndcg_score normalises by the ideal DCG truncated at k, i.e. over min(k, |y|)
    # labels, and gives 0 to rows with no relevant label: the same definition (no ties here).
    Y, dense_y, scores = random_problem(7)
    assert M.ndcg_at_k(Y, scores, k) == pytest.approx(skm.ndcg_score(dense_y, scores, k=k), abs=1e-12)


def test_topk_equals_stable_argsort_with_ties():
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 4, size=(50, 17)).astype(np.float32)
    for k in (1, 4, 16, 17, 40):
        indices, values = M.topk(scores, k)
        expected = np.argsort(-scores, axis=1, kind="stable")[:, : min(k, 17)]
        np.testing.assert_array_equal(indices, expected)
        np.testing.assert_array_equal(values, np.take_along_axis(scores, expected, axis=1))
        assert indices.dtype == np.int64 and values.dtype == np.float32


def test_topk_tuple_equals_dense():
    Y, _, scores = random_problem(11, n=80, n_labels=40)
    weights = 1 + np.random.default_rng(0).random(40)
    top = M.topk(scores, 7)  # wider than needed: each metric uses the first k columns
    for k in (1, 3, 5, 7):
        assert M.precision_at_k(Y, top, k) == M.precision_at_k(Y, scores, k)
        assert M.ndcg_at_k(Y, top, k) == M.ndcg_at_k(Y, scores, k)
        assert M.psprecision_at_k(Y, top, k, weights) == M.psprecision_at_k(Y, scores, k, weights)
        assert M.psndcg_at_k(Y, top, k, weights) == M.psndcg_at_k(Y, scores, k, weights)
    dense = M.evaluate(Y, scores=scores, inv_propensity=weights)
    from_top = M.evaluate(Y, scores=top, inv_propensity=weights)
    assert from_top == {key: value for key, value in dense.items() if not key.startswith("AUC")}


def test_topk_from_an_estimator_predict_topk():
    # The (indices, values) pair of MultiLabelEstimator.predict_topk feeds the ranking metrics directly.
    from bayesmlc.base import MultiLabelEstimator

    class LinearScores(MultiLabelEstimator):
        def __init__(self, weights=None):
            self.weights = weights

        def _fit(self, X, Y, label_mask):
            self.coef_ = np.asarray(self.weights, dtype=np.float32)

        def _decision_function(self, X):
            return np.asarray(X @ self.coef_)

    rng = np.random.default_rng(5)
    X = sp.csr_matrix(rng.random((30, 6)).astype(np.float32))
    Y = sp.csr_matrix((rng.random((30, 9)) < 0.3).astype(np.float32))
    Y = sp.csr_matrix(np.vstack([np.ones((1, 9)), Y[1:].toarray()]))  # every label has a positive
    model = LinearScores(weights=rng.normal(size=(6, 9))).fit(X, Y)
    scores = model.decision_function(X)
    for k in (1, 3, 5):
        assert M.precision_at_k(Y, model.predict_topk(X, k), k) == M.precision_at_k(Y, scores, k)
        assert M.ndcg_at_k(Y, model.predict_topk(X, 5), k) == M.ndcg_at_k(Y, scores, k)


def test_k_larger_than_number_of_labels_divides_by_k():
    # 4 labels, k = 6: row0 has 2 hits -> 2/6, row1 1 hit -> 1/6, row2 0 -> mean 3/18
    assert M.precision_at_k(HAND_Y, HAND_S, 6) == pytest.approx(3 / 18)
    top = M.topk(HAND_S, 6)  # clipped to the 4 labels
    assert top[0].shape == (3, 4)
    assert M.precision_at_k(HAND_Y, top, 6) == pytest.approx(3 / 18)


def test_large_label_space_topk_input_is_not_densified(monkeypatch):
    # 13k labels, 20k rows: a dense (n, L) label matrix would need 1 GB as float32; the top-k path
    # only touches the CSR arrays and the (n, k) indices. Densifying is made to fail here.
    rng = np.random.default_rng(0)
    n, n_labels, k = 20_000, 13_000, 5
    ranked = (rng.integers(0, n_labels, size=n)[:, None] + np.arange(k)) % n_labels  # distinct per row
    keep_ranked = rng.random((n, k)) < 0.3  # some ranked labels are true ...
    extra = rng.integers(0, n_labels, size=(n, 2))  # ... plus two random labels per row
    rows = np.concatenate([np.nonzero(keep_ranked)[0], np.repeat(np.arange(n), 2)])
    cols = np.concatenate([ranked[keep_ranked], extra.ravel()])
    Y = sp.csr_matrix((np.ones(rows.size, np.float32), (rows, cols)), shape=(n, n_labels))
    Y.sum_duplicates()  # scipy 1.13 keeps the duplicates of a (data, (rows, cols)) construction
    Y.data[:] = 1  # duplicates were summed
    values = np.tile(np.arange(k, 0, -1, dtype=np.float32), (n, 1))
    true_sets = [set(Y.indices[Y.indptr[i]:Y.indptr[i + 1]].tolist()) for i in range(n)]
    expected = {
        kk: np.mean([sum(j in t for j in r[:kk]) / kk for t, r in zip(true_sets, ranked.tolist())]) for kk in (1, 5)
    }

    def refuse(*args, **kwargs):
        raise AssertionError("the label matrix was densified")

    monkeypatch.setattr(sp.csr_matrix, "toarray", refuse)
    monkeypatch.setattr(sp.csr_matrix, "todense", refuse)
    for kk in (1, 5):
        assert M.precision_at_k(Y, (ranked, values), kk) == pytest.approx(expected[kk], abs=1e-12)
    w = M.inverse_propensity(Y)
    assert 0 < M.psndcg_at_k(Y, (ranked, values), 5, w) <= 1


# ---- rows without labels ----------------------------------------------------------------------------
def test_empty_rows_conventions():
    Y, _, scores = random_problem(2, empty_rows=0)
    w = 1 + np.random.default_rng(1).random(Y.shape[1])
    n = Y.shape[0]
    Y_more = sp.vstack([Y, sp.csr_matrix((2, Y.shape[1]), dtype=np.float32)], format="csr")
    scores_more = np.vstack([scores, np.random.default_rng(9).normal(size=(2, Y.shape[1]))])
    for k in (1, 3):
        # P@k, nDCG@k and the unnormalised PS metrics count an empty row as 0 in their mean
        shrink = n / (n + 2)
        assert M.precision_at_k(Y_more, scores_more, k) == pytest.approx(M.precision_at_k(Y, scores, k) * shrink)
        assert M.ndcg_at_k(Y_more, scores_more, k) == pytest.approx(M.ndcg_at_k(Y, scores, k) * shrink)
        assert M.psprecision_at_k(Y_more, scores_more, k, w, normalize=False) == pytest.approx(
            M.psprecision_at_k(Y, scores, k, w, normalize=False) * shrink
        )
        # the normalised ones are ratios of means: empty rows add 0 to both and change nothing
        assert M.psprecision_at_k(Y_more, scores_more, k, w) == pytest.approx(M.psprecision_at_k(Y, scores, k, w))
        assert M.psndcg_at_k(Y_more, scores_more, k, w) == pytest.approx(M.psndcg_at_k(Y, scores, k, w))
    # instance AUC skips rows with one class only (an empty row has no positives)
    value, used = M.auc_instance(Y_more, scores_more, return_count=True)
    assert used == M.auc_instance(Y, scores, return_count=True)[1]
    assert value == pytest.approx(M.auc_instance(Y, scores))


def test_all_rows_empty():
    Y = sp.csr_matrix((3, 4), dtype=np.float32)
    assert M.precision_at_k(Y, HAND_S, 2) == 0.0
    assert M.ndcg_at_k(Y, HAND_S, 2) == 0.0
    assert M.psprecision_at_k(Y, HAND_S, 2, HAND_W) == 0.0  # 0/0 defined as 0
    assert M.psndcg_at_k(Y, HAND_S, 2, HAND_W) == 0.0
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(M.auc_micro(Y, HAND_S))
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(M.auc_instance(Y, HAND_S))
    # nothing true, nothing predicted: every row matches and example F1 is 1 by convention
    assert M.exact_match(Y, Y) == 1.0
    assert M.f1_example(Y, Y) == 1.0
    assert M.f1_micro(Y, Y) == 1.0


# ---- AUC ----------------------------------------------------------------------------------------------
# Y = [[1, 0, 1], [0, 1, 0]], S = [[0.8, 0.8, 0.1], [0.5, 0.9, 0.3]]
AUC_Y = sp.csr_matrix(np.array([[1, 0, 1], [0, 1, 0]], dtype=np.float32))
AUC_S = np.array([[0.8, 0.8, 0.1], [0.5, 0.9, 0.3]])


def test_auc_hand_example():
    # micro: positives 0.8, 0.1, 0.9; negatives 0.8, 0.5, 0.3
    #   0.8 beats 0.5 and 0.3 and ties 0.8 -> 2.5; 0.1 -> 0; 0.9 -> 3; U = 5.5 of 9 pairs
    assert M.auc_micro(AUC_Y, AUC_S) == pytest.approx(5.5 / 9)
    # macro: label0 (0.8+ vs 0.5-) 1, label1 (0.9+ vs 0.8-) 1, label2 (0.1+ vs 0.3-) 0 -> 2/3
    assert M.auc_macro(AUC_Y, AUC_S) == pytest.approx(2 / 3)
    # instance: row0 positives 0.8, 0.1 vs negative 0.8 -> (0.5 + 0) / 2 = 0.25; row1 0.9 vs 0.5, 0.3 -> 1
    assert M.auc_instance(AUC_Y, AUC_S) == pytest.approx(0.625)


def test_auc_macro_skips_one_class_labels_and_counts_them():
    Y = sp.csr_matrix(np.array([[1, 0, 1, 1], [0, 1, 0, 1]], dtype=np.float32))  # label 3 all positive
    S = np.hstack([AUC_S, [[0.1], [0.2]]])
    value, used = M.auc_macro(Y, S, return_count=True)
    assert used == 3 and value == pytest.approx(2 / 3)


@pytest.mark.parametrize("seed", range(3))
def test_auc_matches_sklearn_with_ties(seed):
    Y, dense_y, scores = random_problem(seed, n=70, n_labels=20, density=0.3, tied=True)
    assert M.auc_micro(Y, scores) == pytest.approx(skm.roc_auc_score(dense_y.ravel(), scores.ravel()), abs=1e-12)
    labels = (dense_y.min(axis=0) == 0) & (dense_y.max(axis=0) == 1)
    value, used = M.auc_macro(Y, scores, return_count=True)
    assert used == labels.sum()
    assert value == pytest.approx(skm.roc_auc_score(dense_y[:, labels], scores[:, labels], average="macro"), abs=1e-12)
    rows = (dense_y.min(axis=1) == 0) & (dense_y.max(axis=1) == 1)
    value, used = M.auc_instance(Y, scores, return_count=True)
    assert used == rows.sum()
    assert value == pytest.approx(skm.roc_auc_score(dense_y[rows], scores[rows], average="samples"), abs=1e-12)


def test_auc_float32_scores_and_blocks(monkeypatch):
    # Small blocks and tiles force the blocked code paths (several row blocks for the calibration bins,
    # several row and column tiles for the macro AUC).
    from bayesmlc.metrics import _checks, auc

    monkeypatch.setattr(_checks, "_BLOCK_ENTRIES", 64)
    monkeypatch.setattr(auc, "_TILE_ROWS", 16)
    monkeypatch.setattr(auc, "_TILE_ENTRIES", 64)
    assert len(list(_checks._row_blocks(50, 30))) > 1 and len(list(_checks._row_blocks(30, 50))) > 1
    Y, dense_y, scores = random_problem(4, n=50, n_labels=30, density=0.3)
    scores = scores.astype(np.float32)
    labels = dense_y.max(axis=0) == 1
    assert M.auc_macro(Y, scores) == pytest.approx(
        skm.roc_auc_score(dense_y[:, labels], scores[:, labels], average="macro"), abs=1e-12
    )
    rows = dense_y.max(axis=1) == 1
    assert M.auc_instance(Y, scores) == pytest.approx(
        skm.roc_auc_score(dense_y[rows], scores[rows], average="samples"), abs=1e-12
    )
    assert M.expected_calibration_error(Y, 1 / (1 + np.exp(-scores))) == pytest.approx(
        brute_ece(dense_y, 1 / (1 + np.exp(-scores.astype(np.float64))), 15), abs=1e-6
    )


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.integers(0, 4), st.booleans()), min_size=2, max_size=30),
)
def test_auc_micro_masked_is_mann_whitney(entries):
    # entries: (label, score with many ties, observed) for a 1-row problem; brute pair count on the
    # observed entries equals auc_micro with the mask.
    labels = np.array([[e[0] for e in entries]], dtype=np.float32)
    scores = np.array([[e[1] for e in entries]], dtype=np.float64)
    mask = np.array([[e[2] for e in entries]])
    observed = mask[0]
    kept_labels, kept_scores = labels[0][observed], scores[0][observed]
    if not observed.any():
        with pytest.raises(ValidationError, match="no entry as observed"):
            M.auc_micro(labels, scores, label_mask=mask)
        return
    if kept_labels.min() == kept_labels.max():
        with pytest.warns(UndefinedMetricWarning):
            assert math.isnan(M.auc_micro(labels, scores, label_mask=mask))
        return
    expected = brute_auc(kept_labels, kept_scores)
    assert M.auc_micro(labels, scores, label_mask=mask) == pytest.approx(expected, abs=1e-12)
    assert M.auc_instance(labels, scores, label_mask=mask) == pytest.approx(expected, abs=1e-12)


def test_auc_masked_matches_sklearn_on_observed_entries():
    Y, dense_y, scores = random_problem(21, n=60, n_labels=12, density=0.3, tied=True)
    mask = np.random.default_rng(21).random(Y.shape) < 0.7
    # unobserved positives must be ignored, not counted as negatives
    assert M.auc_micro(Y, scores, label_mask=mask) == pytest.approx(
        skm.roc_auc_score(dense_y[mask], scores[mask]), abs=1e-12
    )
    per_label = [brute_auc(dense_y[mask[:, j], j], scores[mask[:, j], j]) for j in range(12)
                 if 0 < dense_y[mask[:, j], j].sum() < mask[:, j].sum()]
    assert M.auc_macro(Y, scores, label_mask=sp.csr_matrix(mask)) == pytest.approx(np.mean(per_label), abs=1e-12)
    per_row = [brute_auc(dense_y[i, mask[i]], scores[i, mask[i]]) for i in range(60)
               if 0 < dense_y[i, mask[i]].sum() < mask[i].sum()]
    assert M.auc_instance(Y, scores, label_mask=mask) == pytest.approx(np.mean(per_row), abs=1e-12)
    before = scores.copy()
    M.auc_macro(Y, scores, label_mask=mask)
    M.auc_instance(Y, scores, label_mask=mask)
    np.testing.assert_array_equal(scores, before)  # the caller's scores are not overwritten


# ---- F1, exact match, Hamming -------------------------------------------------------------------------
# 4 rows, 5 labels. true: {0,1}, {2}, {}, {}   predicted: {0}, {1}, {}, {3}   (label 4 never appears)
F1_Y = sp.csr_matrix(np.array([[1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0] * 5, [0] * 5], dtype=np.float32))
F1_P = sp.csr_matrix(np.array([[1, 0, 0, 0, 0], [0, 1, 0, 0, 0], [0] * 5, [0, 0, 0, 1, 0]], dtype=np.float32))


def test_f1_hand_example():
    # example: row0 2*1/(2+1) = 2/3, row1 0/2 = 0, row2 both empty -> 1, row3 0/1 = 0 -> (5/3)/4
    assert M.f1_example(F1_Y, F1_P) == pytest.approx(5 / 12)
    assert M.f1_example(F1_Y, F1_P, zero_division=0) == pytest.approx(2 / 12)
    assert M.f1_example(F1_Y, F1_P, zero_division=np.nan) == pytest.approx((2 / 3) / 3)
    # micro: TP = 1, |Y| = 3, |Yhat| = 3 -> 2/6
    assert M.f1_micro(F1_Y, F1_P) == pytest.approx(1 / 3)
    # macro: label0 1, label1 0, label2 0, label3 0, label4 0/0 -> zero_division
    assert M.f1_macro(F1_Y, F1_P) == pytest.approx(2 / 5)
    assert M.f1_macro(F1_Y, F1_P, zero_division=0) == pytest.approx(1 / 5)
    assert M.f1_macro(F1_Y, F1_P, zero_division=np.nan) == pytest.approx(1 / 4)
    # exact match: only row2 (empty, nothing predicted) -> 1/4
    assert M.exact_match(F1_Y, F1_P) == pytest.approx(1 / 4)
    # Hamming: differing entries row0 {1}, row1 {1, 2}, row3 {3} -> 4 of 20
    assert M.hamming_loss(F1_Y, F1_P) == pytest.approx(4 / 20)


@pytest.mark.parametrize("zero_division", [0.0, 1.0, np.nan])
@pytest.mark.parametrize("seed", range(3))
def test_set_metrics_match_sklearn(seed, zero_division):
    Y, dense_y, scores = random_problem(seed, n=50, n_labels=15, density=0.15, empty_rows=6)
    dense_pred = (scores > 1.2).astype(int)
    dense_pred[:4] = 0  # some rows with nothing predicted (some of them also empty)
    dense_pred[:, 0] = 0
    dense_y[:, 0] = 0  # a label never true nor predicted
    Y = sp.csr_matrix(dense_y)
    P = sp.csr_matrix(dense_pred)
    for average, ours in (("samples", M.f1_example), ("micro", M.f1_micro), ("macro", M.f1_macro)):
        expected = skm.f1_score(dense_y, dense_pred, average=average, zero_division=zero_division)
        assert ours(Y, P, zero_division=zero_division) == pytest.approx(expected, abs=1e-12, nan_ok=True), average
    assert M.exact_match(Y, P) == pytest.approx(skm.accuracy_score(dense_y, dense_pred))
    assert M.hamming_loss(Y, P) == pytest.approx(skm.hamming_loss(dense_y, dense_pred))


def test_set_metrics_with_mask():
    Y, dense_y, scores = random_problem(8, n=40, n_labels=10, density=0.3)
    dense_pred = (scores > 0.5).astype(int)
    mask = np.random.default_rng(8).random(Y.shape) < 0.6
    # micro F1 and Hamming over the observed entries only = the flattened observed entries
    flat_y, flat_p = dense_y[mask], dense_pred[mask]  # micro F1 = binary F1 of the positive class here
    assert M.f1_micro(Y, dense_pred, label_mask=mask) == pytest.approx(skm.f1_score(flat_y, flat_p, average="binary"))
    assert M.hamming_loss(Y, dense_pred, label_mask=mask) == pytest.approx(np.mean(flat_y != flat_p))
    # example F1 / exact match: each row restricted to its observed entries (brute force)
    per_row, matches = [], []
    for y, p, m in zip(dense_y, dense_pred, mask):
        y, p = y[m], p[m]
        denominator = y.sum() + p.sum()
        per_row.append(2 * (y & p).sum() / denominator if denominator else 1.0)
        matches.append(np.array_equal(y, p))
    assert M.f1_example(Y, dense_pred, label_mask=mask) == pytest.approx(np.mean(per_row))
    assert M.exact_match(Y, dense_pred, label_mask=mask) == pytest.approx(np.mean(matches))
    per_label = []
    for j in range(10):
        y, p = dense_y[mask[:, j], j], dense_pred[mask[:, j], j]
        denominator = y.sum() + p.sum()
        per_label.append(2 * (y & p).sum() / denominator if denominator else 1.0)
    assert M.f1_macro(Y, dense_pred, label_mask=mask) == pytest.approx(np.mean(per_label))


# ---- calibration ----------------------------------------------------------------------------------------
def brute_ece(dense_y, proba, n_bins):
    total, n = 0.0, dense_y.size
    for b in range(n_bins):
        in_bin = [(y, p) for y, p in zip(dense_y.ravel(), proba.ravel()) if min(int(p * n_bins), n_bins - 1) == b]
        if in_bin:
            ys, ps = zip(*in_bin)
            total += len(in_bin) / n * abs(np.mean(ys) - np.mean(ps))
    return total


def test_ece_hand_example():
    # 2 bins [0, 0.5) and [0.5, 1]. Pairs (y, p): (1, 0.9), (0, 0.2), (0, 0.6), (0, 0.05)
    #   bin0: p 0.2, 0.05 -> conf 0.125, freq 0 -> |0 - 0.125| = 0.125, weight 2/4
    #   bin1: p 0.9, 0.6  -> conf 0.75,  freq 0.5 -> 0.25, weight 2/4     ECE = 0.0625 + 0.125
    Y = sp.csr_matrix(np.array([[1, 0], [0, 0]], dtype=np.float32))
    proba = np.array([[0.9, 0.2], [0.6, 0.05]])
    assert M.expected_calibration_error(Y, proba, n_bins=2) == pytest.approx(0.1875)
    curve = M.reliability_curve(Y, proba, n_bins=2)
    np.testing.assert_allclose(curve.bin_centers, [0.25, 0.75])
    np.testing.assert_allclose(curve.mean_predicted, [0.125, 0.75])
    np.testing.assert_allclose(curve.observed_frequency, [0.0, 0.5])
    np.testing.assert_array_equal(curve.counts, [2, 2])
    # mask out the pair (row 1, label 0), p = 0.6: bin1 keeps (1, 0.9) -> |1 - 0.9| = 0.1, weight 1/3;
    # bin0 unchanged, weight 2/3 -> ECE = (2 * 0.125 + 0.1) / 3
    mask = np.array([[1, 1], [0, 1]])
    assert M.expected_calibration_error(Y, proba, n_bins=2, label_mask=mask) == pytest.approx(0.35 / 3)


def test_ece_bin_edges_and_empty_bins():
    # p = 0 goes to the first bin, p = 0.5 to the upper bin of two, p = 1 to the last bin
    Y = sp.csr_matrix(np.array([[0, 1, 1]], dtype=np.float32))
    proba = np.array([[0.0, 0.5, 1.0]])
    curve = M.reliability_curve(Y, proba, n_bins=2)
    np.testing.assert_array_equal(curve.counts, [1, 2])
    # bin0 (0, p 0): 0; bin1 (1, 0.5), (1, 1.0): |1 - 0.75| * 2/3
    assert M.expected_calibration_error(Y, proba, n_bins=2) == pytest.approx(0.25 * 2 / 3)
    curve = M.reliability_curve(Y, proba, n_bins=4)
    np.testing.assert_array_equal(curve.counts, [1, 0, 1, 1])
    assert np.isnan(curve.mean_predicted[1]) and np.isnan(curve.observed_frequency[1])


@pytest.mark.parametrize("n_bins", [1, 5, 15])
def test_ece_matches_brute_force(n_bins):
    Y, dense_y, scores = random_problem(13, n=40, n_labels=9, density=0.3)
    proba = 1 / (1 + np.exp(-scores))
    assert M.expected_calibration_error(Y, proba, n_bins=n_bins) == pytest.approx(
        brute_ece(dense_y, proba, n_bins), abs=1e-12
    )
    # a perfectly calibrated predictor (within each bin, frequency = mean probability) has ECE 0
    constant = np.full(Y.shape, dense_y.mean())
    assert M.expected_calibration_error(Y, constant, n_bins=n_bins) == pytest.approx(0.0, abs=1e-12)


# ---- calibration of the top-k predictions ----------------------------------------------------------------
def topk_pairs_by_loop(dense_y, proba, k, mask=None):
    """(p, y) of each row's k most probable labels (ties to the lower index), unobserved pairs dropped."""
    pairs = []
    for i, (y, p) in enumerate(zip(dense_y, proba)):
        for j in ranking_of(p)[:k]:
            if mask is None or mask[i][j]:
                pairs.append((float(p[j]), int(y[j])))
    return pairs


def brute_ece_at_k(dense_y, proba, k, n_bins, mask=None):
    """ECE@k from scikit-learn's calibration_curve (uniform bins) and the bin sizes from np.histogram."""
    from sklearn.calibration import calibration_curve

    pairs = topk_pairs_by_loop(dense_y, proba, k, mask)
    p = np.array([pair[0] for pair in pairs])
    y = np.array([pair[1] for pair in pairs])
    frequency, confidence = calibration_curve(y, p, n_bins=n_bins, strategy="uniform")
    counts, _ = np.histogram(p, bins=np.linspace(0, 1, n_bins + 1))
    return float(np.sum(counts[counts > 0] * np.abs(frequency - confidence)) / len(p))


def brute_aurc(dense_y, proba, mask=None):
    """AURC as the mean over every order of the tied rows, by enumerating the orders (small inputs)."""
    import itertools

    rows = []
    for i, (y, p) in enumerate(zip(dense_y, proba)):
        top = ranking_of(p)[0]
        if mask is None or mask[i][top]:
            rows.append((float(p[top]), 0 if y[top] else 1))
    groups = [[e for c, e in rows if c == value] for value in sorted({c for c, _ in rows}, reverse=True)]
    areas = []
    for orders in itertools.product(*(list(itertools.permutations(g)) for g in groups)):
        errors = [e for order in orders for e in order]
        areas.append(np.mean([sum(errors[:m]) / m for m in range(1, len(errors) + 1)]))
    return float(np.mean(areas))


def test_topk_calibration_hand_example():
    # HAND_Y rows {0, 2}, {1}, {} with probabilities:
    #   row 0 [0.9, 0.8, 0.1, 0.3] -> top-2 (0.9, y=1), (0.8, y=0)
    #   row 1 [0.2, 0.4, 0.6, 0.1] -> top-2 (0.6, y=0), (0.4, y=1)
    #   row 2 [0.5, 0.1, 0.2, 0.3] -> top-2 (0.5, y=0), (0.3, y=0)
    P = np.array([[0.9, 0.8, 0.1, 0.3], [0.2, 0.4, 0.6, 0.1], [0.5, 0.1, 0.2, 0.3]])
    # ECE@1, 2 bins [0, .5) [.5, 1]: all three in bin 1, conf (0.9+0.6+0.5)/3 = 2/3, freq 1/3 -> 1/3
    assert M.ece_at_k(HAND_Y, P, 1, n_bins=2) == pytest.approx(1 / 3)
    # 15 bins: each pair alone: |1-0.9| + |0-0.6| + |0-0.5| = 1.2 over 3 pairs
    assert M.ece_at_k(HAND_Y, P, 1) == pytest.approx(0.4)
    # ECE@2, 2 bins: bin0 {0.4 (y=1), 0.3 (y=0)}: |1 - 0.7| = 0.3; bin1 {0.9 (1), 0.8, 0.6, 0.5 (0)}:
    # |1 - 2.8| = 1.8; (0.3 + 1.8) / 6
    assert M.ece_at_k(HAND_Y, P, 2, n_bins=2) == pytest.approx(2.1 / 6)
    assert M.brier_at_k(HAND_Y, P, 1) == pytest.approx((0.01 + 0.36 + 0.25) / 3)
    assert M.brier_at_k(HAND_Y, P, 2) == pytest.approx((0.01 + 0.64 + 0.36 + 0.36 + 0.25 + 0.09) / 6)
    curve = M.topk_reliability_curve(HAND_Y, P, 2, n_bins=2)
    np.testing.assert_array_equal(curve.counts, [2, 4])
    np.testing.assert_allclose(curve.mean_predicted, [0.35, 0.7])
    np.testing.assert_allclose(curve.observed_frequency, [0.5, 0.25])
    # risk-coverage: rows by top-1 probability 0.9 (right), 0.6 (wrong), 0.5 (wrong; empty row)
    rc = M.risk_coverage_curve(HAND_Y, P)
    np.testing.assert_allclose(rc.coverage, [1 / 3, 2 / 3, 1])
    np.testing.assert_allclose(rc.risk, [0, 0.5, 2 / 3])
    np.testing.assert_allclose(rc.threshold, [0.9, 0.6, 0.5])
    assert M.aurc(HAND_Y, P) == pytest.approx((0 + 0.5 + 2 / 3) / 3)
    assert rc.risk[-1] == pytest.approx(1 - M.precision_at_k(HAND_Y, P, 1))
    # a mask hiding row 1's top label (2): ECE@1 over rows 0 and 2 only, |1-0.9| + |0-0.5|
    mask = np.ones((3, 4), dtype=int)
    mask[1, 2] = 0
    assert M.ece_at_k(HAND_Y, P, 1, label_mask=mask) == pytest.approx(0.3)
    assert M.aurc(HAND_Y, P, label_mask=mask) == pytest.approx((0 + 0.5) / 2)
    # the top-k tuple gives the same numbers as the dense probabilities
    top = M.topk(P, 2)
    assert M.ece_at_k(HAND_Y, top, 2, n_bins=2) == pytest.approx(2.1 / 6)
    assert M.aurc(HAND_Y, top) == pytest.approx(M.aurc(HAND_Y, P))


def test_aurc_ties_are_averaged_over_orders():
    # four rows with the same top-1 probability: two right, two wrong. Any order is as good as another,
    # so AURC is the mean over orders: (1/4) sum_m E[errors among first m] / m = error rate 0.5
    Y = sp.csr_matrix(np.array([[1, 0], [1, 0], [0, 1], [0, 1]], dtype=np.float32))
    P = np.array([[0.7, 0.2]] * 4)
    assert M.aurc(Y, P) == pytest.approx(0.5)
    np.testing.assert_allclose(M.risk_coverage_curve(Y, P).risk, 0.5)
    # confidence that orders the errors perfectly: right rows first -> risks 0, 0, 1/3, 1/2
    P2 = np.array([[0.9, 0.1], [0.8, 0.1], [0.6, 0.1], [0.55, 0.1]])
    assert M.aurc(Y, P2) == pytest.approx((0 + 0 + 1 / 3 + 1 / 2) / 4)
    # the worst order: errors first -> 1, 1, 2/3, 1/2
    P3 = np.array([[0.55, 0.1], [0.6, 0.1], [0.8, 0.1], [0.9, 0.1]])
    assert M.aurc(Y, P3) == pytest.approx((1 + 1 + 2 / 3 + 1 / 2) / 4)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_ece_at_k_matches_sklearn_calibration_curve(seed, k):
    Y, dense_y, scores = random_problem(seed, n=50, n_labels=11, density=0.25)
    proba = 1 / (1 + np.exp(-1.5 * scores))
    assert M.ece_at_k(Y, proba, k) == pytest.approx(brute_ece_at_k(dense_y, proba, k, 15), abs=1e-12)
    pairs = topk_pairs_by_loop(dense_y, proba, k)
    assert M.brier_at_k(Y, proba, k) == pytest.approx(np.mean([(p - y) ** 2 for p, y in pairs]), abs=1e-12)
    # with a mask: unobserved top-k pairs are dropped, the ranking still uses every label
    rng = np.random.default_rng(seed + 100)
    mask = (rng.random(Y.shape) < 0.7).astype(int)
    assert M.ece_at_k(Y, proba, k, label_mask=mask) == pytest.approx(
        brute_ece_at_k(dense_y, proba, k, 15, mask=mask), abs=1e-12)
    pairs = topk_pairs_by_loop(dense_y, proba, k, mask)
    assert M.brier_at_k(Y, proba, k, label_mask=mask) == pytest.approx(
        np.mean([(p - y) ** 2 for p, y in pairs]), abs=1e-12)
    # a masked-out value of Y changes nothing
    flipped = dense_y.copy()
    flipped[mask == 0] = 1 - flipped[mask == 0]
    assert M.ece_at_k(sp.csr_matrix(flipped), proba, k, label_mask=mask) == pytest.approx(
        M.ece_at_k(Y, proba, k, label_mask=mask), abs=1e-12)


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_aurc_matches_enumeration_of_tie_orders(seed):
    # few distinct probabilities, so rows tie at the top-1; 9 rows keep the enumeration small
    rng = np.random.default_rng(seed)
    dense_y = (rng.random((9, 4)) < 0.4).astype(int)
    proba = rng.choice([0.2, 0.5, 0.8], size=(9, 4)) + np.array([0.0, 0.01, 0.02, 0.03]) * (rng.random((9, 1)) < 0.3)
    mask = (rng.random((9, 4)) < 0.8).astype(int)
    Y = sp.csr_matrix(dense_y.astype(np.float32))
    assert M.aurc(Y, proba) == pytest.approx(brute_aurc(dense_y, proba), abs=1e-12)
    assert M.aurc(Y, proba, label_mask=mask) == pytest.approx(brute_aurc(dense_y, proba, mask), abs=1e-12)


def test_calibration_curves_payload():
    Y, dense_y, scores = random_problem(7, n=300, n_labels=10, density=0.2)
    proba = 1 / (1 + np.exp(-scores))
    payload = M.calibration_curves(Y, proba, max_points=50)
    assert payload["counts"] == M.reliability_curve(Y, proba).counts.tolist()
    assert payload["top5"]["counts"] == M.topk_reliability_curve(Y, proba, 5).counts.tolist()
    assert sum(payload["top1"]["counts"]) == 300
    rc = payload["risk_coverage"]
    assert len(rc["coverage"]) == 50 and rc["coverage"][-1] == 1.0
    assert rc["risk"][-1] == pytest.approx(1 - M.precision_at_k(Y, proba, 1))


def test_topk_calibration_errors():
    Y, _, scores = random_problem(8, n=10, n_labels=5)
    proba = 1 / (1 + np.exp(-scores))
    with pytest.raises(ValidationError, match="k must be"):
        M.ece_at_k(Y, proba, 0)
    with pytest.raises(ValidationError, match=r"\[0, 1\]"):
        M.ece_at_k(Y, scores, 1)
    with pytest.raises(ValidationError, match="n_bins"):
        M.ece_at_k(Y, proba, 1, n_bins=0)
    only_last = np.zeros(Y.shape, dtype=int)
    only_last[:, -1] = 1
    with pytest.raises(ValidationError, match="none of the top-1"):
        M.aurc(Y, np.tile(np.linspace(0.9, 0.1, 5), (10, 1)), label_mask=only_last)


# ---- evaluate --------------------------------------------------------------------------------------------
def test_evaluate_keys_and_values():
    Y, dense_y, scores = random_problem(5, n=40, n_labels=12, density=0.3)
    proba = 1 / (1 + np.exp(-scores))
    pred = sp.csr_matrix((proba >= 0.5).astype(np.float32))
    w = M.inverse_propensity(Y)
    result = M.evaluate(Y, scores=scores, proba=proba, Y_pred=pred, inv_propensity=w)
    expected_keys = (
        [f"{name}@{k}" for name in ("P", "nDCG", "PSP", "PSnDCG") for k in (1, 3, 5)]
        + ["AUC_micro", "AUC_macro", "AUC_instance", "F1_example", "F1_micro", "F1_macro"]
        + ["exact_match", "hamming_loss", "ECE", "ECE@1", "ECE@3", "ECE@5", "Brier@1", "Brier@3", "Brier@5", "AURC"]
    )
    assert list(result) == expected_keys
    assert all(type(value) is float and 0 <= value <= 1 for value in result.values())
    assert result["P@3"] == M.precision_at_k(Y, scores, 3)
    assert result["nDCG@5"] == M.ndcg_at_k(Y, scores, 5)
    assert result["PSP@5"] == pytest.approx(M.psprecision_at_k(Y, scores, 5, w))
    assert result["PSnDCG@3"] == pytest.approx(M.psndcg_at_k(Y, scores, 3, w))
    assert result["AUC_micro"] == pytest.approx(skm.roc_auc_score(dense_y.ravel(), scores.ravel()))
    assert result["F1_micro"] == pytest.approx(skm.f1_score(dense_y, pred.toarray(), average="micro"))
    assert result["ECE"] == pytest.approx(brute_ece(dense_y, proba, 15))
    # partial inputs give only the metrics they allow
    assert list(M.evaluate(Y, Y_pred=pred)) == ["F1_example", "F1_micro", "F1_macro", "exact_match", "hamming_loss"]
    only_proba = M.evaluate(Y, proba=proba, ks=(2,))
    assert list(only_proba) == ["P@2", "nDCG@2", "AUC_micro", "AUC_macro", "AUC_instance", "ECE", "ECE@2", "Brier@2",
                                "AURC"]
    assert result["ECE@3"] == pytest.approx(brute_ece_at_k(dense_y, proba, 3, 15), abs=1e-12)
    assert result["Brier@5"] == pytest.approx(M.brier_at_k(Y, proba, 5))
    assert result["AURC"] == pytest.approx(M.aurc(Y, proba))
    # the top-k pairs follow the ranking P@k uses: by scores when they are given, with proba's values
    other = np.random.default_rng(6).random(Y.shape)
    with_scores = M.evaluate(Y, scores=other, proba=proba)
    assert with_scores["ECE@1"] == pytest.approx(M.ece_at_k(Y, proba, 1, scores=other))
    assert with_scores["ECE@1"] != pytest.approx(M.ece_at_k(Y, proba, 1))
    assert with_scores["AURC"] == pytest.approx(M.aurc(Y, proba, scores=other))
    top_by_scores = [ranking_of(s)[0] for s in other]
    pairs = [(proba[i, j], dense_y[i, j]) for i, j in enumerate(top_by_scores)]
    assert with_scores["Brier@1"] == pytest.approx(np.mean([(p - y) ** 2 for p, y in pairs]))
    assert only_proba["P@2"] == M.precision_at_k(Y, proba, 2)


# ---- errors ----------------------------------------------------------------------------------------------
def test_errors_name_the_problem():
    with pytest.raises(ValidationError, match="shape"):
        M.precision_at_k(HAND_Y, HAND_S[:, :3], 1)
    bad = HAND_S.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValidationError, match="row 1, column 2"):
        M.precision_at_k(HAND_Y, bad, 1)
    with pytest.raises(ValidationError, match="k must be a positive integer"):
        M.precision_at_k(HAND_Y, HAND_S, 0)
    with pytest.raises(ValidationError, match="only 0 and 1"):
        M.precision_at_k(HAND_Y * 2, HAND_S, 1)
    indices, values = M.topk(HAND_S, 2)
    with pytest.raises(ValidationError, match="k >= 3"):
        M.precision_at_k(HAND_Y, (indices, values), 3)
    with pytest.raises(ValidationError, match="sorted best first"):
        M.precision_at_k(HAND_Y, (indices, values[:, ::-1]), 2)
    with pytest.raises(ValidationError, match="repeat"):
        M.precision_at_k(HAND_Y, (np.zeros_like(indices), np.zeros_like(values)), 2)
    with pytest.raises(ValidationError, match=r"\[0, 4\)"):
        M.precision_at_k(HAND_Y, (indices + 3, values), 2)
    with pytest.raises(ValidationError, match="1/p_l"):
        M.psprecision_at_k(HAND_Y, HAND_S, 1, 1 / HAND_W)  # propensities instead of their inverse
    with pytest.raises(ValidationError, match="exactly one"):
        M.psprecision_at_k(HAND_Y, HAND_S, 1)
    with pytest.raises(ValidationError, match="4 labels"):
        M.psndcg_at_k(HAND_Y, HAND_S, 1, HAND_W[:3])
    with pytest.raises(ValidationError, match="top-k"):
        M.auc_micro(HAND_Y, (indices, values))
    with pytest.raises(ValidationError, match=r"\[0, 1\]"):
        M.expected_calibration_error(HAND_Y, HAND_S * 2)
    with pytest.raises(ValidationError, match="no entry as observed"):
        M.expected_calibration_error(HAND_Y, HAND_S, label_mask=np.zeros((3, 4)))
    with pytest.raises(ValidationError, match="zero_division"):
        M.f1_macro(F1_Y, F1_P, zero_division="warn")
    with pytest.raises(ValidationError, match="Y_pred has shape"):
        M.f1_micro(F1_Y, F1_P[:, :3])
    with pytest.raises(ValidationError, match="label_mask has shape"):
        M.auc_micro(HAND_Y, HAND_S, label_mask=np.ones((3, 3)))
    with pytest.raises(ValidationError, match="sparse"):
        M.ndcg_at_k(HAND_Y, sp.csr_matrix(HAND_S), 1)
    with pytest.raises(ValidationError, match="at least 3 training rows"):
        M.inverse_propensity(np.ones((2, 3)))


# ---- real data --------------------------------------------------------------------------------------------
def _read_xc(path):
    """Minimal reader of the XC text format for this test (the package's reader lives elsewhere)."""
    with open(path) as handle:
        n, d, n_labels = map(int, handle.readline().split())
        rows, cols, vals, label_rows, label_cols = [], [], [], [], []
        for i, line in enumerate(handle):
            head, _, rest = line.rstrip("\n").partition(" ")
            if head:
                for label in head.split(","):
                    label_rows.append(i)
                    label_cols.append(int(label))
            for item in rest.split():
                j, v = item.split(":")
                rows.append(i)
                cols.append(int(j))
                vals.append(float(v))
    X = sp.csr_matrix((vals, (rows, cols)), shape=(n, d), dtype=np.float64)
    Y = sp.csr_matrix((np.ones(len(label_rows), np.float32), (label_rows, label_cols)), shape=(n, n_labels))
    return X, Y


def test_bibtex_ridge_scores_match_sklearn_and_brute_force():
    folder = shared_dataset_dir("bibtex_xc")
    X_train, Y_train = _read_xc(folder / "train.txt")
    X_test, Y_test = _read_xc(folder / "test.txt")
    # a quick ridge regression scorer: W = (X'X + I)^-1 X'Y
    gram = (X_train.T @ X_train).toarray() + np.eye(X_train.shape[1])
    W = np.linalg.solve(gram, (X_train.T @ Y_train).toarray())
    scores = np.asarray(X_test @ W)
    dense_y = Y_test.toarray().astype(int)
    w = M.inverse_propensity(Y_train)
    # reference brief section 1.10: w ranges from about 1.34 to 2.89 on Bibtex (A = 0.55, B = 1.5)
    assert w.min() == pytest.approx(1.34, abs=0.005) and w.max() == pytest.approx(2.89, abs=0.005)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing undefined on real data
        result = M.evaluate(Y_test, scores=scores, Y_pred=sp.csr_matrix(scores > 0.3), inv_propensity=w)
    assert 0.5 < result["P@1"] < 0.7  # a linear scorer on Bibtex lands near the published 0.6
    brute = brute_ranking_metrics(dense_y, scores, 5, w)
    assert result["P@5"] == pytest.approx(brute["P"], abs=1e-12)
    assert result["PSP@5"] == pytest.approx(brute["PSP"], abs=1e-12)
    assert result["PSnDCG@5"] == pytest.approx(brute["PSnDCG"], abs=1e-12)
    for k in (1, 3, 5):
        assert result[f"nDCG@{k}"] == pytest.approx(skm.ndcg_score(dense_y, scores, k=k), abs=1e-9)
    assert result["AUC_micro"] == pytest.approx(skm.roc_auc_score(dense_y.ravel(), scores.ravel()), abs=1e-12)
    labels = dense_y.max(axis=0) == 1
    assert result["AUC_macro"] == pytest.approx(
        skm.roc_auc_score(dense_y[:, labels], scores[:, labels], average="macro"), abs=1e-12
    )
    rows = dense_y.max(axis=1) == 1
    assert result["AUC_instance"] == pytest.approx(
        skm.roc_auc_score(dense_y[rows], scores[rows], average="samples"), abs=1e-12
    )
    pred = (scores > 0.3).astype(int)
    assert result["F1_example"] == pytest.approx(skm.f1_score(dense_y, pred, average="samples", zero_division=1.0))
    assert result["F1_micro"] == pytest.approx(skm.f1_score(dense_y, pred, average="micro"))
    assert result["F1_macro"] == pytest.approx(skm.f1_score(dense_y, pred, average="macro", zero_division=1.0))
    assert result["exact_match"] == pytest.approx(skm.accuracy_score(dense_y, pred))
    assert result["hamming_loss"] == pytest.approx(skm.hamming_loss(dense_y, pred))


# ---- the package layout ------------------------------------------------------------------------------
def test_every_public_metric_is_importable_from_the_package_and_lives_in_its_family():
    import importlib

    families = {
        "ranking": ["topk", "labels_at_or_above", "inverse_propensity", "inverse_propensity_from_counts", "precision_at_k", "ndcg_at_k",
                    "psprecision_at_k", "psndcg_at_k"],
        "auc": ["auc_micro", "auc_macro", "auc_instance"],
        "set_based": ["f1_example", "f1_micro", "f1_macro", "exact_match", "hamming_loss"],
        "calibration": ["ReliabilityCurve", "reliability_curve", "expected_calibration_error",
                        "topk_reliability_curve", "ece_at_k", "ece_at_k_if_calibrated", "brier_at_k", "RiskCoverage", "risk_coverage_curve",
                        "aurc", "calibration_curves"],
        "evaluation": ["evaluate", "StreamingEvaluation"],
        "bands": ["FrequencyBands", "frequency_bands", "BandMetrics", "metrics_by_band"],
        "scorers": ["TopKScorer", "make_topk_scorer", "get_topk_scorer", "training_inverse_propensity"],
    }
    assert sorted(M.__all__) == sorted(name for names in families.values() for name in names)
    for family, names in families.items():
        module = importlib.import_module(f"bayesmlc.metrics.{family}")
        # a family module may also name its constants (DEFAULT_N_BANDS), which the package does not re-export
        assert set(names) <= set(module.__all__) and all(name.isupper() for name in set(module.__all__) - set(names))
        for name in names:
            assert getattr(M, name) is getattr(module, name)
            assert callable(getattr(M, name))


# ---- StreamingEvaluation: the metrics of evaluate, pooled over blocks of rows --------------------------
def _stream_problem(seed, n=60, L=9, with_mask=False):
    rng = np.random.default_rng(seed)
    dense = (rng.random((n, L)) < 0.25).astype(np.float32)
    dense[3] = 0  # a row without labels
    Y = sp.csr_matrix(dense)
    proba = rng.random((n, L))
    scores = proba + 0.3 * rng.standard_normal((n, L))  # ranks differently from proba
    Y_pred = sp.csr_matrix(proba > 0.6)
    mask = sp.csr_matrix((rng.random((n, L)) < 0.8).astype(np.float32)) if with_mask else None
    return Y, scores, proba, Y_pred, mask


@pytest.mark.parametrize("with_mask", [False, True])
def test_streaming_evaluation_pools_blocks_into_the_figures_of_evaluate(with_mask):
    """Uneven blocks (one of them empty of labels) give every key of evaluate on all rows, to 1e-12,
    and the curves of calibration_curves."""
    Y, scores, proba, Y_pred, mask = _stream_problem(0, with_mask=with_mask)
    inv = M.inverse_propensity(Y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        expected = M.evaluate(Y, scores=scores, proba=proba, Y_pred=Y_pred, inv_propensity=inv, label_mask=mask)
        stream = M.StreamingEvaluation(Y.shape[1], inv_propensity=inv)
        for rows in np.split(np.arange(60), [7, 8, 31]):
            stream.add(Y[rows], scores=scores[rows], proba=proba[rows], Y_pred=Y_pred[rows],
                       label_mask=None if mask is None else mask[rows])
        got = stream.result()
    assert list(got) == list(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-12, nan_ok=True), key
    curves = M.calibration_curves(Y, proba, label_mask=mask, scores=scores)
    pooled = stream.curves()
    for key in ("counts", "mean_predicted"):
        np.testing.assert_allclose(np.array(pooled[key], dtype=float), np.array(curves[key], dtype=float))
    for k in ("top1", "top5"):
        assert pooled[k]["counts"] == curves[k]["counts"]
    np.testing.assert_allclose(pooled["risk_coverage"]["risk"], curves["risk_coverage"]["risk"])


def test_streaming_evaluation_takes_the_aucs_on_the_chosen_rows_and_top_k_scores():
    Y, scores, proba, Y_pred, _ = _stream_problem(1)
    chosen = np.zeros(60, dtype=bool)
    chosen[::3] = True
    stream = M.StreamingEvaluation(Y.shape[1])
    for rows in np.array_split(np.arange(60), 4):
        stream.add(Y[rows], scores=scores[rows], proba=proba[rows], auc_rows=chosen[rows])
    got = stream.result()
    assert got["AUC_micro"] == pytest.approx(M.auc_micro(Y[chosen], scores[chosen]), abs=1e-12)
    assert got["AUC_macro"] == pytest.approx(M.auc_macro(Y[chosen], scores[chosen]), abs=1e-12)
    assert got["P@3"] == pytest.approx(M.precision_at_k(Y, scores, 3), abs=1e-12)  # every row
    # a top-k pair as the ranking: the ranking metrics as evaluate gives them
    top = M.topk(scores, 5)
    stream = M.StreamingEvaluation(Y.shape[1], curve_ranks=0)
    for rows in np.array_split(np.arange(60), 3):
        stream.add(Y[rows], scores=(top[0][rows], top[1][rows]))
    expected = M.evaluate(Y, scores=top)
    assert stream.result() == pytest.approx(expected, abs=1e-12)


def test_streaming_evaluation_refuses_mixed_blocks_and_wrong_widths():
    Y, scores, proba, _, _ = _stream_problem(2)
    stream = M.StreamingEvaluation(Y.shape[1])
    with pytest.raises(ValidationError, match="no rows were added"):
        stream.result()
    stream.add(Y[:10], scores=scores[:10], proba=proba[:10])
    with pytest.raises(ValidationError, match="every block must give the same outputs"):
        stream.add(Y[10:20], scores=scores[10:20])
    with pytest.raises(ValidationError, match="set up for 9"):
        stream.add(Y[10:20, :5], scores=scores[10:20, :5], proba=proba[10:20, :5])
    with pytest.raises(ValidationError, match="curve_ranks >= 5"):
        M.StreamingEvaluation(Y.shape[1], ks=(1,), curve_ranks=0).add(Y, proba=proba).curves()
    top3 = M.topk(scores, 3)
    with pytest.raises(ValidationError, match="the blocks ranked 3"):
        M.StreamingEvaluation(Y.shape[1], ks=(1, 3)).add(Y, scores=top3, proba=proba).curves()


# ---- ece_at_k_if_calibrated: the ECE@k of a calibrated model on a finite test set ------------------
def test_ece_if_calibrated_matches_the_binomial_law_in_one_bin():
    """Every top-1 probability 0.5 (one bin): the ECE@1 of a calibrated model is |B - n/2| / n with
    B ~ Binomial(n, 1/2). The simulated 5%, 50% and 95% quantiles sit within one step (1/n) of the
    exact quantiles of that law (scipy.stats)."""
    from scipy import stats

    from bayesmlc.metrics import ece_at_k_if_calibrated

    n = 200
    proba = np.full((n, 3), 0.5)
    proba[:, 1:] = 0.2  # the top label is the first, at 0.5
    simulated = ece_at_k_if_calibrated(proba, 1, n_draws=20000, random_state=0)
    deviations = np.arange(n // 2 + 1)
    law = stats.binom(n, 0.5)
    cdf = np.cumsum([law.pmf(n // 2) if d == 0 else 2 * law.pmf(n // 2 + d) for d in deviations])
    for level, value in zip((0.05, 0.5, 0.95), simulated):
        exact = deviations[np.searchsorted(cdf, level)] / n
        assert abs(value - exact) <= 1.0 / n + 1e-12


def test_ece_if_calibrated_agrees_with_ece_at_k_on_test_sets_drawn_from_the_probabilities():
    """Brute force: draw whole label matrices Y ~ Bernoulli(proba) and take ece_at_k(Y, proba, 2); its
    quantiles over 4,000 draws agree with the function's (another seed) to Monte Carlo precision. The
    same holds for a top-k pair input and with a mask."""
    from bayesmlc.metrics import ece_at_k_if_calibrated, topk

    rng = np.random.default_rng(1)
    proba = rng.beta(2, 2, size=(50, 4))
    brute = [M.ece_at_k(sp.csr_matrix((rng.random(proba.shape) < proba).astype(float)), proba, 2) for _ in range(4000)]
    expected = np.quantile(brute, (0.05, 0.5, 0.95))
    np.testing.assert_allclose(ece_at_k_if_calibrated(proba, 2, n_draws=4000, random_state=3), expected, atol=0.006)
    np.testing.assert_array_equal(ece_at_k_if_calibrated(topk(proba, 2), 2, n_draws=500, random_state=4),
                                  ece_at_k_if_calibrated(proba, 2, n_draws=500, random_state=4))
    mask = np.ones(proba.shape)
    mask[:10] = 0.0  # ten rows unobserved: their pairs drop out
    np.testing.assert_array_equal(ece_at_k_if_calibrated(proba, 2, label_mask=mask, n_draws=500, random_state=4),
                                  ece_at_k_if_calibrated(proba[10:], 2, n_draws=500, random_state=4))


def test_ece_if_calibrated_is_zero_for_certain_predictions_and_checks_its_arguments():
    from bayesmlc.metrics import ece_at_k_if_calibrated

    certain = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    np.testing.assert_array_equal(ece_at_k_if_calibrated(certain, 2, n_draws=50), [0.0, 0.0, 0.0])
    with pytest.raises(ValidationError, match="n_draws must be a positive integer, got 0"):
        ece_at_k_if_calibrated(certain, 1, n_draws=0)
    with pytest.raises(ValidationError, match=r"quantiles must be levels in \[0, 1\]"):
        ece_at_k_if_calibrated(certain, 1, quantiles=(0.5, 1.5))
