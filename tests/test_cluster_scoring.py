"""Scoring rows given as feature-index and value lists (bayesmlc.cluster): the form Ray Data and Spark
batches take. The CSR built from the lists is checked against scipy's own construction from the
dense rows; the scorer's labels and scores against the model's own top-k on the same rows."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from bayesmlc.cluster import SparseRowScorer, csr_from_rows
from bayesmlc.data.synthetic import make_multilabel
from bayesmlc.exceptions import ValidationError
from bayesmlc.linear import LogisticRegression


def _rows_as_lists(X: sp.csr_matrix):
    """Each row's feature indices and values, as a Ray Data numpy batch holds list columns: object
    arrays of per-row arrays (the rows have different lengths)."""
    indices = np.empty(X.shape[0], dtype=object)
    values = np.empty(X.shape[0], dtype=object)
    for i in range(X.shape[0]):
        row = X[i]
        indices[i], values[i] = row.indices.astype(np.int64), row.data.astype(np.float64)
    return indices, values


def test_csr_from_rows_equals_the_matrix_the_lists_came_from():
    rng = np.random.default_rng(0)
    dense = np.where(rng.random((9, 12)) < 0.3, rng.standard_normal((9, 12)), 0.0).astype(np.float32)
    dense[4] = 0.0  # a row without features
    indices, values = _rows_as_lists(sp.csr_matrix(dense))
    built = csr_from_rows(indices, values, 12)
    assert built.dtype == np.float32 and built.shape == (9, 12) and built.has_canonical_format
    np.testing.assert_array_equal(built.toarray(), dense)
    # lists in any order, with a repeated index: summed, as scipy's COO -> CSR does
    shuffled = csr_from_rows([[3, 1, 3], []], [[1.0, 2.0, 0.5], []], 5)
    np.testing.assert_array_equal(shuffled.toarray(), sp.coo_matrix(([1.0, 2.0, 0.5], ([0, 0, 0], [3, 1, 3])),
                                                                    shape=(2, 5)).toarray())
    assert csr_from_rows([], [], 5).shape == (0, 5)


def test_csr_from_rows_names_the_row_at_fault():
    with pytest.raises(ValidationError, match="row 1 has the feature index 7, outside \\[0, 5\\)"):
        csr_from_rows([[0], [1, 7]], [[1.0], [1.0, 1.0]], 5)
    with pytest.raises(ValidationError, match="row 0 has 2 indices but 1 values"):
        csr_from_rows([[0, 1]], [[1.0]], 5)
    with pytest.raises(ValidationError, match="3 rows of indices but 2 rows of values"):
        csr_from_rows([[0], [1], [2]], [[1.0], [1.0]], 5)


@pytest.fixture(scope="module")
def model_and_rows(tmp_path_factory):
    data = make_multilabel(300, 30, 7, features_per_row=6, labels_per_row=2, random_state=8)
    model = LogisticRegression(max_iter=200, device="cpu").fit(data.X[:200], data.Y[:200])
    path = tmp_path_factory.mktemp("scorer") / "model.npz"
    model.save(path)
    return model, path, data.X[200:]


def test_the_scorer_gives_the_models_top_k_from_a_file_or_an_object(model_and_rows):
    model, path, X = model_and_rows
    indices, values = _rows_as_lists(X)
    ids = np.arange(100, 100 + X.shape[0])
    expected_labels, expected_scores = model.predict_topk(X, 3)
    for source in (model, path, str(path)):
        out = SparseRowScorer(source, k=3)({"id": ids, "indices": indices, "values": values})
        assert sorted(out) == ["id", "labels", "scores"]
        np.testing.assert_array_equal(out["id"], ids)  # the other columns pass through
        np.testing.assert_array_equal(out["labels"], expected_labels)
        np.testing.assert_allclose(out["scores"], expected_scores, rtol=1e-6)


def test_the_scorer_ranks_by_probability_when_asked(model_and_rows):
    model, _, X = model_and_rows
    proba = model.predict_proba(X)
    best = np.argsort(-proba, axis=1, kind="stable")[:, :4]  # independent: a stable sort of all labels
    out = SparseRowScorer(model, k=4, proba=True).predict(*_rows_as_lists(X))
    np.testing.assert_array_equal(out["labels"], best)
    np.testing.assert_allclose(out["scores"], np.take_along_axis(proba, best, axis=1), rtol=1e-6)
    # k above the number of labels: every label, best first
    assert SparseRowScorer(model, k=50).predict(*_rows_as_lists(X[:2]))["labels"].shape == (2, 7)


def test_the_scorer_refuses_what_it_cannot_score(model_and_rows):
    model, _, X = model_and_rows
    with pytest.raises(ValidationError, match="k must be a positive integer, got 0"):
        SparseRowScorer(model, k=0)
    with pytest.raises(ValidationError, match="no column 'indices'.*set indices_column"):
        SparseRowScorer(model)({"features": np.zeros(2)})
    wide = sp.csr_matrix(([1.0], ([0], [30])), shape=(1, 31))
    with pytest.raises(ValidationError, match="feature index 30, outside \\[0, 30\\)"):
        SparseRowScorer(model).predict(*_rows_as_lists(wide))
