"""The compiled metric kernels (bayesmlc.metrics._kernels) against independent computations: scikit-learn's
AUCs, brute-force pair counts, numpy's stable argsort and numpy's bincount, on data with many ties, with and
without a label mask, in the dtypes and layouts callers pass, and through every code path of the kernels
(a group of more than LINEAR_MAX positives, several tiles, rows and labels without a positive)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn import metrics as skm

from bayesmlc import metrics as M
from bayesmlc.exceptions import ValidationError
from bayesmlc.metrics import _kernels, auc
from bayesmlc.metrics.calibration import _bin_sums


def pair_count_auc(labels, scores):
    """Mann-Whitney AUC by counting every (positive, negative) pair, ties one half; NaN without both."""
    positives, negatives = scores[labels == 1], scores[labels == 0]
    if positives.size == 0 or negatives.size == 0:
        return np.nan
    greater = (positives[:, None] > negatives[None, :]).sum()
    tied = (positives[:, None] == negatives[None, :]).sum()
    return (greater + 0.5 * tied) / (positives.size * negatives.size)


def brute_aucs(dense_y, scores, observed, micro=True):
    """(micro, macro, instance) over the observed entries by pair counting, as docs/metrics.md defines them
    (micro None unless asked for)."""
    micro = pair_count_auc(dense_y[observed], scores[observed]) if micro else None
    per_label = [pair_count_auc(dense_y[observed[:, j], j], scores[observed[:, j], j]) for j in range(dense_y.shape[1])]
    per_row = [pair_count_auc(dense_y[i, observed[i]], scores[i, observed[i]]) for i in range(dense_y.shape[0])]
    return micro, np.nanmean(per_label), np.nanmean(per_row)


def tied_problem(seed, n=70, n_labels=30, density=0.2, levels=5, dtype=np.float64):
    """Labels with empty rows and labels, and scores drawn from a few levels (many ties), -0.0 among them."""
    rng = np.random.default_rng(seed)
    dense = rng.random((n, n_labels)) < density
    dense[:3] = False
    dense[:, :2] = False
    scores = (rng.integers(-levels // 2, levels // 2 + 1, size=(n, n_labels)) * 0.5).astype(dtype)
    scores[scores == 0] *= np.where(rng.random(int((scores == 0).sum())) < 0.5, -1, 1).astype(dtype)  # -0.0 ties +0.0
    return dense.astype(int), scores


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, np.int32, np.bool_])
def test_aucs_equal_scikit_learn_with_ties_in_every_dtype(seed, dtype):
    dense_y, scores = tied_problem(seed, levels=5 if dtype is not np.bool_ else 2)
    scores = (scores > 0) if dtype is np.bool_ else scores.astype(dtype)
    exact = scores.astype(np.float64)
    Y = sp.csr_matrix(dense_y)
    assert M.auc_micro(Y, scores) == pytest.approx(skm.roc_auc_score(dense_y.ravel(), exact.ravel()), abs=1e-12)
    labels = (dense_y.min(axis=0) == 0) & (dense_y.max(axis=0) == 1)
    assert M.auc_macro(Y, scores, return_count=True) == pytest.approx(
        (skm.roc_auc_score(dense_y[:, labels], exact[:, labels], average="macro"), labels.sum()), abs=1e-12)
    rows = (dense_y.min(axis=1) == 0) & (dense_y.max(axis=1) == 1)
    assert M.auc_instance(Y, scores, return_count=True) == pytest.approx(
        (skm.roc_auc_score(dense_y[rows], exact[rows], average="samples"), rows.sum()), abs=1e-12)


@pytest.mark.parametrize("layout", ["C", "F", "strided"])
def test_aucs_with_a_mask_equal_pair_counts_on_the_observed_entries(layout, monkeypatch):
    # tiles of 8 rows x 3 labels: several row and column tiles, masked cursors across them
    monkeypatch.setattr(auc, "_TILE_ROWS", 8)
    monkeypatch.setattr(auc, "_TILE_ENTRIES", 24)
    dense_y, scores = tied_problem(5, n=45, n_labels=13, density=0.3)
    rng = np.random.default_rng(5)
    observed = rng.random(scores.shape) < 0.7
    observed[:, 4] = False  # a label with nothing observed
    observed[7] = False  # a row with nothing observed
    if layout == "F":
        scores = np.asfortranarray(scores)
    elif layout == "strided":
        wide = np.zeros((45, 26))
        wide[:, ::2] = scores
        scores = wide[:, ::2]
    mask = sp.csr_matrix(observed.astype(np.float32))
    mask.indices = mask.indices.copy()
    micro, macro, instance = brute_aucs(dense_y, np.asarray(scores), observed)
    Y = sp.csr_matrix(dense_y)
    assert M.auc_micro(Y, scores, label_mask=mask) == pytest.approx(micro, abs=1e-12)
    assert M.auc_macro(Y, scores, label_mask=mask) == pytest.approx(macro, abs=1e-12)
    assert M.auc_instance(Y, scores, label_mask=mask) == pytest.approx(instance, abs=1e-12)
    unsorted = mask.copy()  # a mask whose rows list their columns out of order
    for row in range(unsorted.shape[0]):
        part = slice(unsorted.indptr[row], unsorted.indptr[row + 1])
        unsorted.indices[part] = unsorted.indices[part][::-1]
    unsorted.has_sorted_indices = False
    assert M.auc_macro(Y, scores, label_mask=unsorted) == pytest.approx(macro, abs=1e-12)


def test_groups_on_both_sides_of_the_linear_limit_give_the_pair_counts():
    # rows and labels with more than LINEAR_MAX positives are counted from a sorted copy, the others
    # by comparisons; a label mask puts observed and unobserved entries in both kinds of group
    rng = np.random.default_rng(9)
    ramp = np.linspace(0.02, 1, 600)
    scores = rng.integers(0, 7, size=(600, 600)).astype(np.float32)
    dense_y = (rng.random(scores.shape) < ramp[:, None] * ramp).astype(int)
    for axis in (0, 1):
        per_group = dense_y.sum(axis=axis)
        assert per_group.max() > _kernels.LINEAR_MAX >= per_group.min()
    Y = sp.csr_matrix(dense_y)
    for observed in (np.ones(scores.shape, dtype=bool), rng.random(scores.shape) < 0.8):
        _, macro, instance = brute_aucs(dense_y, scores, observed, micro=False)
        assert M.auc_micro(Y, scores, observed) == pytest.approx(
            skm.roc_auc_score(dense_y[observed], scores[observed]), abs=1e-12)
        assert M.auc_macro(Y, scores, observed) == pytest.approx(macro, abs=1e-12)
        assert M.auc_instance(Y, scores, observed) == pytest.approx(instance, abs=1e-12)


def test_streaming_evaluation_takes_the_three_functions_aucs():
    dense_y, scores = tied_problem(2, n=90, n_labels=40, dtype=np.float32)
    Y = sp.csr_matrix(dense_y)
    stream = M.StreamingEvaluation(40)
    for rows in np.array_split(np.arange(90), 3):
        stream.add(Y[rows], scores=scores[rows])
    result = stream.result()
    assert result["AUC_micro"] == M.auc_micro(Y, scores)
    assert result["AUC_macro"] == M.auc_macro(Y, scores)
    assert result["AUC_instance"] == M.auc_instance(Y, scores)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, np.int64, np.uint8])
def test_topk_equals_numpy_stable_argsort_in_every_dtype(dtype):
    rng = np.random.default_rng(4)
    scores = rng.integers(0, 5, size=(40, 23)).astype(dtype)
    scores[::3] = np.sort(scores[::3], axis=1)  # ascending rows: every score enters the heap
    for k in (1, 2, 5, 22, 23):
        indices, values = M.topk(scores, k)
        expected = np.argsort(-scores.astype(np.float64), axis=1, kind="stable")[:, :k]
        np.testing.assert_array_equal(indices, expected)
        np.testing.assert_array_equal(values, np.take_along_axis(scores, expected, axis=1))
        assert values.dtype == scores.dtype


def test_topk_ties_between_minus_and_plus_zero_go_to_the_lower_label():
    scores = np.array([[0.0, -0.0, -1.0, 0.0, -0.0]])
    np.testing.assert_array_equal(M.topk(scores, 4)[0], [[0, 1, 3, 4]])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_score_is_named_by_its_first_position(bad):
    scores = np.zeros((6, 9), dtype=np.float32)
    scores[4, 7] = bad
    scores[5, 0] = np.nan
    with pytest.raises(ValidationError, match=r"scores contains NaN or inf \(first at row 4, column 7\)"):
        M.topk(scores, 3)
    Y = sp.csr_matrix(np.eye(6, 9))
    with pytest.raises(ValidationError, match=r"first at row 4, column 7"):
        M.precision_at_k(Y, scores, 1)
    with pytest.raises(ValidationError, match=r"first at row 4, column 7"):
        M.auc_micro(Y, scores)


@pytest.mark.parametrize("block_entries", [64, 1 << 22])
def test_calibration_bins_equal_numpy_bincount_by_blocks(block_entries, monkeypatch):
    from bayesmlc.metrics import _checks

    monkeypatch.setattr(_checks, "_BLOCK_ENTRIES", block_entries)
    rng = np.random.default_rng(8)
    proba = rng.random((57, 11)) ** 3
    proba[0, :3] = (0.0, 1.0, 14 / 15)  # the edges: the first bin, the closed last bin, a bin boundary
    Y = sp.csr_matrix(rng.random((57, 11)) < 0.3)
    counts, sums, positives = _bin_sums(Y, proba, 15, None)
    expected_counts, expected_sums = np.zeros(15, dtype=np.int64), np.zeros(15)
    for rows in _checks._row_blocks(57, 11):  # numpy's sums, block by block
        block = proba[rows].ravel()
        which = np.minimum((block * 15).astype(np.int64), 14)
        expected_counts += np.bincount(which, minlength=15)
        expected_sums += np.bincount(which, weights=block, minlength=15)
    np.testing.assert_array_equal(counts, expected_counts)
    np.testing.assert_array_equal(sums, expected_sums)  # the same float64 additions in the same order
    assert positives.sum() == Y.nnz
    float32 = proba.astype(np.float32)
    np.testing.assert_array_equal(_bin_sums(Y, float32, 15, None)[1], _bin_sums(Y, float32.astype(np.float64), 15, None)[1])


@pytest.mark.parametrize("bad, message", [(np.nan, "NaN or inf"), (1.5, r"probabilities in \[0, 1\]"),
                                          (-0.25, r"probabilities in \[0, 1\]")])
def test_a_probability_outside_the_unit_interval_is_refused(bad, message):
    proba = np.full((4, 5), 0.5)
    proba[2, 3] = bad
    Y = sp.csr_matrix(np.eye(4, 5))
    with pytest.raises(ValidationError, match=f"proba.*{message}"):
        M.expected_calibration_error(Y, proba)
    with pytest.raises(ValidationError, match=f"proba.*{message}"):
        M.evaluate(Y, scores=np.zeros((4, 5)), proba=proba)


@pytest.mark.parametrize("masked", [False, True])
def test_rank_sums_on_helper_threads_equal_the_serial_ones_and_scikit_learn(masked, monkeypatch):
    """With two threads allowed, the macro sums and half of the micro sort run on helper threads (the
    micro rank sum then adds the counts of two separately sorted halves): the same integers as on one
    thread, and scikit-learn's micro AUC."""
    from bayesmlc.threads import use_threads

    dense_y, scores = tied_problem(4, n=70, n_labels=23, density=0.25)
    observed = np.random.default_rng(4).random(scores.shape) < (0.7 if masked else 1.1)
    Y, mask = sp.csr_matrix(dense_y), sp.csr_matrix(observed.astype(np.float32)) if masked else None
    serial = auc._rank_sums(Y, scores, mask)
    monkeypatch.setattr(auc, "PARALLEL_MIN_SCORES", 1)
    with use_threads(2):
        with auc._helper_threads(scores.size) as pool:
            assert pool is not None
        shared = auc._rank_sums(Y, scores, mask)
    assert shared.micro == serial.micro
    for kind in ("macro", "instance"):
        for ours, theirs in zip(getattr(shared, kind), getattr(serial, kind)):
            np.testing.assert_array_equal(ours, theirs)
    with use_threads(2):
        assert M.auc_micro(Y, scores, mask) == pytest.approx(
            skm.roc_auc_score(dense_y[observed], scores[observed]), abs=1e-12)


# ---- labels_at_or_above: the compiled threshold against NumPy's comparison ---------------------------
def _numpy_labels(values, bounds, fill_empty):
    chosen = values >= bounds
    if fill_empty:
        empty = np.flatnonzero(~chosen.any(axis=1))
        chosen[empty, np.argmax(values[empty], axis=1)] = True
    return chosen


@pytest.mark.parametrize("dtype, bound_dtype", [(np.float32, np.float32), (np.float64, np.float64),
                                                (np.float64, np.float32), (np.float32, np.float64)])
@pytest.mark.parametrize("fill_empty", [False, True])
def test_labels_at_or_above_selects_what_numpy_s_comparison_selects(dtype, bound_dtype, fill_empty):
    rng = np.random.default_rng(4)
    values = rng.random((300, 37)).astype(dtype)
    values[::7] *= 0.2  # rows below every bound: empty unless filled
    values[5, [3, 9]] = values[5].max()  # a tied maximum: the first wins the fill
    values[11, 4] = np.nan  # never selected; np.argmax's first NaN when filling
    values[12, :] = np.nan
    bounds = rng.uniform(0.3, 0.9, size=37).astype(bound_dtype)
    values[20, 6] = bounds[6]  # exactly at its bound: selected
    got = M.labels_at_or_above(values, bounds, fill_empty=fill_empty)
    assert got.has_canonical_format and got.dtype == np.float32 and got.indices.dtype == np.int32
    np.testing.assert_array_equal(got.toarray() == 1, _numpy_labels(values, bounds, fill_empty))
    assert got.nnz == _numpy_labels(values, bounds, fill_empty).sum()


def test_labels_at_or_above_of_no_rows_and_a_wrong_bound_shape():
    assert M.labels_at_or_above(np.zeros((0, 4), np.float32), np.zeros(4, np.float32)).shape == (0, 4)
    with pytest.raises(ValidationError, match="bounds"):
        M.labels_at_or_above(np.zeros((2, 4), np.float32), np.zeros(3, np.float32))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_labels_at_or_above_compares_a_number_in_the_values_precision_as_numpy_does(dtype):
    values = np.random.default_rng(5).random((50, 9)).astype(dtype)
    bound = 0.3  # not a float32 or float16 number: NumPy compares float32(0.3) with a float32 array
    values[0, 2] = dtype(bound)
    got = M.labels_at_or_above(values, bound)
    np.testing.assert_array_equal(got.toarray() == 1, values >= bound)
