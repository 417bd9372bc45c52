"""What a scikit-learn user reaches for: per-label thresholds in ``predict``, each row's top-k
probabilities as a sparse matrix from ``predict_proba(X, top_k=k)``, and ``label_names_`` from a
DataFrame ``Y``; each against a dense or brute-force computation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import linear_multilabel_problem

from bayesmlc import base
from bayesmlc.base import MultiLabelEstimator, check_threshold
from bayesmlc.exceptions import ModelFormatError, ValidationError
from bayesmlc.linear import LogisticRegression

# the fits are cut short on purpose: LogisticRegression's ConvergenceWarning says so, and is not under test
pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")

NAMES = ["sport", "politics", "science", "art", "music", "travel"]


@pytest.fixture(scope="module")
def problem():
    X, Y = linear_multilabel_problem(n=120, d=8, n_labels=6, seed=11, density=0.6)
    return X, sp.csr_matrix(Y)


@pytest.fixture(scope="module")
def fitted(problem):
    X, Y = problem
    return LogisticRegression(max_iter=20, device="cpu", random_state=0).fit(X, Y)


class Frame:
    """What the estimators read from a pandas DataFrame: ``columns`` and the values."""

    def __init__(self, values, columns):
        self.values, self.columns = np.asarray(values), list(columns)

    def __array__(self, dtype=None, copy=None):
        return self.values if dtype is None else self.values.astype(dtype)


# ---- per-label thresholds ------------------------------------------------------------------------
def test_a_per_label_threshold_selects_what_each_label_s_comparison_selects(problem, fitted):
    X, _ = problem
    proba = fitted.predict_proba(X)
    thresholds = np.array([0.1, 0.3, 0.5, 0.7, 0.9, 0.0])
    predicted = fitted.predict(X, threshold=thresholds).toarray()
    brute = np.array([[float(proba[i, l] >= np.float32(thresholds[l])) for l in range(6)] for i in range(X.shape[0])])
    np.testing.assert_array_equal(predicted, brute)
    assert predicted[:, 5].all()  # threshold 0 takes every row
    # an array of equal entries is the scalar threshold, exactly
    for value in (0.5, 0.3, 0.1):
        np.testing.assert_array_equal(fitted.predict(X, threshold=[value] * 6).toarray(),
                                      fitted.predict(X, threshold=value).toarray())


@pytest.mark.parametrize("threshold,message", [
    ([0.5] * 5, "threshold has 5 entries but the model has 6 labels"),
    ([0.5] * 7, "threshold has 7 entries"),
    ([[0.5] * 6], r"1-D array of 6 numbers .* got shape \(1, 6\)"),
    ("0.5", "threshold must be a number in \\[0, 1\\]"),
    ([0.5] * 5 + [1.5], r"threshold must be in \[0, 1\], got 1.5 at label 5"),
    (-0.1, r"threshold must be in \[0, 1\], got -0.1"),
    (float("nan"), r"got nan"),
])
def test_a_wrong_threshold_is_a_validation_error_naming_it(problem, fitted, threshold, message):
    with pytest.raises(ValidationError, match=message):
        fitted.predict(problem[0], threshold=threshold)


def test_bnmc_whose_predict_has_its_own_rules_takes_a_per_label_threshold_and_top_k(problem):
    from bayesmlc.bnmc import BNMC

    X, Y = problem
    model = BNMC(random_state=0).fit(X, Y)
    proba = model.predict_proba(X)
    thresholds = np.linspace(0.1, 0.9, 6)
    np.testing.assert_array_equal(model.predict(X, threshold=thresholds).toarray(),
                                  (proba >= thresholds.astype(np.float32)).astype(np.float32))
    np.testing.assert_array_equal(model.predict_proba(X, top_k=2).toarray(), _dense_top_k(proba, 2))
    with pytest.raises(ValidationError, match="threshold has 2 entries"):
        model.predict(X, threshold=[0.5, 0.5])


def test_check_threshold_returns_a_float_or_a_float32_array():
    assert check_threshold(1, 3) == 1.0 and isinstance(check_threshold(1, 3), float)
    values = check_threshold((0, 0.25, 1), 3)
    assert values.dtype == np.float32 and values.tolist() == [0.0, 0.25, 1.0]


# ---- top-k probabilities ------------------------------------------------------------------------------
def _dense_top_k(proba, k):
    """Brute force: each row's k largest entries, ties to the lower column (a stable sort)."""
    out = np.zeros_like(proba)
    for i, row in enumerate(proba):
        chosen = np.argsort(-row, kind="stable")[:k]
        out[i, chosen] = row[chosen]
    return out


@pytest.mark.parametrize("k", [1, 3, 6, 50])
def test_top_k_probabilities_are_the_dense_ones_cut_to_each_row_s_k_largest(problem, fitted, k, monkeypatch):
    X, _ = problem
    dense = fitted.predict_proba(X)
    monkeypatch.setattr(base, "PREDICT_BATCH_ROWS", 16)  # several batches, the last one short
    top = fitted.predict_proba(X, top_k=k)
    assert isinstance(top, sp.csr_matrix) and top.shape == dense.shape and top.dtype == np.float32
    assert np.all(np.diff(top.indptr) == min(k, 6)) and top.has_sorted_indices
    np.testing.assert_array_equal(top.toarray(), _dense_top_k(dense, k))


def test_top_k_breaks_ties_towards_the_lower_label_and_keeps_zero_probabilities():
    class Fixed(MultiLabelEstimator):
        """Fixed probabilities: 0.5 on labels 1, 3, 4, 0.2 on 0, zero elsewhere."""

        def _fit(self, X, Y, label_mask):
            return self

        def _decision_function(self, X):
            return np.zeros((X.shape[0], 6))

        def _predict_proba(self, X):
            return np.tile([0.2, 0.5, 0.0, 0.5, 0.5, 0.0], (X.shape[0], 1))

    X = np.eye(3)
    model = Fixed().fit(X, np.array([[1, 1, 1, 1, 1, 1], [0] * 6, [1] * 6]))
    assert model.predict_proba(X, top_k=2).toarray()[0].tolist() == [0, 0.5, 0, 0.5, 0, 0]
    assert model.predict_proba(X, top_k=4).toarray()[0].tolist() == pytest.approx([0.2, 0.5, 0, 0.5, 0.5, 0])
    five = model.predict_proba(X, top_k=5)  # the fifth is a zero, the lower of the two zero labels
    assert five.indices[:5].tolist() == [0, 1, 2, 3, 4] and five.nnz == 15


def test_top_k_never_holds_more_than_one_batch_of_dense_probabilities(problem, fitted, monkeypatch):
    X, _ = problem
    batch_rows = []
    original = type(fitted)._predict_proba

    def spy(self, X_block):
        batch_rows.append(X_block.shape[0])
        return original(self, X_block)

    monkeypatch.setattr(base, "PREDICT_BATCH_ROWS", 32)
    monkeypatch.setattr(type(fitted), "_predict_proba", spy)
    fitted.predict_proba(X, top_k=2)
    assert batch_rows == [32, 32, 32, 24]


def test_top_k_conditions_on_a_label_as_the_dense_probabilities_do(problem):
    X, Y = problem
    model = LogisticRegression(max_iter=5, device="cpu", random_state=0).fit(X, Y)
    model.label_cardinality = "at_least_one"  # the base class reads it; LogisticRegression has no parameter
    dense = model.predict_proba(X)
    np.testing.assert_array_equal(dense, base.at_least_one_label(model._batched(X, model._predict_proba,
                                                                                  model.label_prior_)))
    np.testing.assert_array_equal(model.predict_proba(X, top_k=2).toarray(), _dense_top_k(dense, 2))


@pytest.mark.parametrize("top_k", [0, -1, 2.0, True, "3"])
def test_a_wrong_top_k_is_refused(problem, fitted, top_k):
    with pytest.raises(ValidationError, match="top_k must be a positive integer"):
        fitted.predict_proba(problem[0], top_k=top_k)


# ---- label names ---------------------------------------------------------------------------------------
def test_label_names_from_a_dataframe_y_are_kept_saved_and_checked(problem, tmp_path):
    X, Y = problem
    model = LogisticRegression(max_iter=5, device="cpu", random_state=0)
    fitted = model.fit(X, Frame(Y.toarray(), NAMES))
    assert fitted.label_names_.dtype == object and fitted.label_names_.tolist() == NAMES
    plain = LogisticRegression(max_iter=5, device="cpu", random_state=0).fit(X, Y)
    np.testing.assert_array_equal(fitted.predict_proba(X), plain.predict_proba(X))  # names change nothing else
    fitted.save(tmp_path / "named.npz")
    loaded = LogisticRegression.load(tmp_path / "named.npz")
    assert loaded.label_names_.dtype == object and loaded.label_names_.tolist() == NAMES
    assert not hasattr(fitted.fit(X, Y), "label_names_")  # a refit without names forgets them
    assert not hasattr(LogisticRegression(max_iter=2).fit(X, Frame(Y.toarray(), range(6))), "label_names_")
    with pytest.raises(ValidationError, match="column names \\(the label names\\) must all be strings"):
        LogisticRegression(max_iter=2).fit(X, Frame(Y.toarray(), ["a", 1, "c", "d", "e", "f"]))


@pytest.mark.parametrize("names,message", [
    (NAMES[:5], "label_names_ must be 6 strings"),
    (NAMES[:5] + [6], "label_names_ must be 6 strings"),
    ([NAMES], "label_names_ must be 6 strings"),
])
def test_loading_refuses_label_names_that_are_not_one_string_per_label(problem, tmp_path, names, message):
    X, Y = problem
    path = tmp_path / "named.npz"
    LogisticRegression(max_iter=2, device="cpu").fit(X, Frame(Y.toarray(), NAMES)).save(path)
    with np.load(path) as data:
        arrays = {key: data[key] for key in data.files}
    meta = json.loads(arrays["__meta__"].tobytes())
    meta["state"]["label_names_"] = names
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(path, **arrays)
    with pytest.raises(ModelFormatError, match=message):
        LogisticRegression.load(path)


def test_pandas_dataframes_dense_and_sparse(problem):
    pd = pytest.importorskip("pandas")
    X, Y = problem
    dense = LogisticRegression(max_iter=5, device="cpu", random_state=0).fit(X, pd.DataFrame(Y.toarray(), columns=NAMES))
    assert dense.label_names_.tolist() == NAMES
    frame = pd.DataFrame.sparse.from_spmatrix(Y, columns=NAMES)
    model = LogisticRegression(max_iter=5, device="cpu", random_state=0)
    sparse = model.fit(X, frame)
    assert sparse.label_names_.tolist() == NAMES
    np.testing.assert_array_equal(sparse.predict_proba(X), dense.predict_proba(X))


@pytest.mark.parametrize("name", ["logistic", "mlgpf", "bmls", "bnmc", "knn", "ensemble", "calibration"])
def test_every_model_keeps_label_names_through_save_and_load_and_cuts_its_own_probabilities(problem, tmp_path,
                                                                                            name):
    from test_sklearn_checks import FAST

    X, Y = problem
    model = FAST[name]().set_params(random_state=0).fit(X, Frame(Y.toarray(), NAMES))
    assert model.label_names_.tolist() == NAMES
    model.save(tmp_path / "model.npz")
    loaded = MultiLabelEstimator.load(tmp_path / "model.npz")
    assert loaded.label_names_.tolist() == NAMES
    dense = loaded.predict_proba(X)
    np.testing.assert_array_equal(loaded.predict_proba(X, top_k=3).toarray(), _dense_top_k(dense, 3))
