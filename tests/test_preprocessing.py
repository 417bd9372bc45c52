"""FeaturePreprocessor and its column statistics against scikit-learn's StandardScaler,
TfidfTransformer and normalize and against NumPy, and model files of the form written before it
(``feature_mean_`` / ``feature_scale_``)."""

import os

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.feature_extraction.text import TfidfTransformer
from sklearn.preprocessing import StandardScaler, normalize

from bayesmlc.base import MultiLabelEstimator
from bayesmlc.bmls import BMLS
from bayesmlc.exceptions import ModelFormatError, NotFittedError, ValidationError
from bayesmlc.linear import LogisticRegression
from bayesmlc.persistence import load_model, read_npz
from bayesmlc.preprocessing import (
    IDF_MIN_ROWS, FeaturePreprocessor, column_mean_and_scale, normalize_rows, resolve_standardize, row_square_sums,
)

LEGACY_DIR = os.path.join(os.path.dirname(__file__), "fixtures", "legacy_models")


def _dense(seed=0, n=40):
    rng = np.random.default_rng(seed)
    X = rng.gamma(2.0, 1.0, (n, 5)) * np.array([1.0, 10.0, 0.01, 1000.0, 3.0])
    X[:, 4] = 7.0  # a constant column keeps scale 1
    return X


def _counts(seed=0, n=50, d=30):
    rng = np.random.default_rng(seed)
    X = sp.random(n, d, density=0.15, random_state=seed, data_rvs=lambda k: rng.integers(1, 6, k).astype(float))
    return sp.csr_matrix(X)


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


@pytest.mark.parametrize("block", [1, 3, 7, 1 << 22])
def test_row_square_sums_match_float64_numpy_over_any_block_size(block):
    """Blocks of 1 or 3 entries split every row of up to 9 entries over block boundaries, start inside
    runs of empty rows and end on the last (empty) row; the sums must not depend on the blocking."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 10, 60)
    lengths[[0, 1, 30, 31, 58, 59]] = 0  # empty rows first, in the middle and last
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    data = (rng.standard_normal(indptr[-1]) * 1e3).astype(np.float32)
    expected = [np.sum(data[a:b].astype(np.float64) ** 2) for a, b in zip(indptr[:-1], indptr[1:])]
    np.testing.assert_allclose(row_square_sums(data, indptr, block=block), expected, rtol=1e-14, atol=0)
    assert row_square_sums(np.zeros(0, np.float32), np.zeros(1, np.int64)).shape == (0,)


@pytest.mark.parametrize("setting, n_nonzero, n_entries, expected", [
    ("auto", 51, 100, True), ("auto", 50, 100, False), ("auto", 0, 0, False),
    (True, 0, 100, True), (False, 100, 100, False), (np.True_, 1, 100, True),
])
def test_resolve_standardize_switches_on_above_half_the_entries(setting, n_nonzero, n_entries, expected):
    assert resolve_standardize(setting, n_nonzero, n_entries) is expected


def test_standardise_dense_matches_standard_scaler():
    X = _dense()
    scaler = StandardScaler().fit(X)
    pre = FeaturePreprocessor(standardize=True, dtype="float64").fit(X)
    np.testing.assert_allclose(pre.mean_, scaler.mean_, rtol=1e-12)
    np.testing.assert_allclose(pre.scale_, scaler.scale_, rtol=1e-9)
    assert pre.scale_[4] == 1.0
    np.testing.assert_allclose(pre.transform(X).toarray(), scaler.transform(X), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(pre.transform_dense(X), scaler.transform(X), rtol=1e-9, atol=1e-12)
    # float32 output: the same numbers to float32 rounding
    pre32 = FeaturePreprocessor(standardize=True).fit(X)
    out = pre32.transform(X)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.toarray(), scaler.transform(X), rtol=1e-5, atol=1e-5)


def test_standardise_sparse_without_centring_matches_standard_scaler_and_keeps_sparsity():
    X = _counts()
    scaler = StandardScaler(with_mean=False).fit(X)
    pre = FeaturePreprocessor(standardize=True, with_mean=False, dtype="float64").fit(X)
    assert pre.mean_ is None
    np.testing.assert_allclose(pre.scale_, scaler.scale_, rtol=1e-9)
    out = pre.transform(X)
    assert sp.issparse(out) and out.nnz == X.nnz
    np.testing.assert_allclose(out.toarray(), scaler.transform(X).toarray(), rtol=1e-9)
    np.testing.assert_allclose(pre.inverse_transform(out).toarray(), X.toarray(), rtol=1e-9)


def test_idf_and_row_normalisation_match_tfidf_transformer():
    X = _counts(1).tolil()
    X[:, 3] = 0  # a feature in no row: idf log(N + 1) + 1
    X = X.tocsr()
    X.eliminate_zeros()
    for norm, unit_rows in ((None, False), ("l2", True)):
        tfidf = TfidfTransformer(norm=norm, smooth_idf=True, sublinear_tf=False).fit(X)
        pre = FeaturePreprocessor(idf=True, normalize=unit_rows, dtype="float64").fit(X)
        np.testing.assert_allclose(pre.idf_, tfidf.idf_, rtol=1e-12)
        np.testing.assert_allclose(pre.transform(X).toarray(), tfidf.transform(X).toarray(), rtol=1e-9, atol=1e-15)
    assert pre.scale_ is None and pre.mean_ is None


def test_idf_auto_weights_from_idf_min_rows_on():
    """idf="auto": scikit-learn's smoothed idf from IDF_MIN_ROWS training rows on, none below; the
    rows counted are all processes' (``n_rows``), not this process's."""
    X = sp.random(IDF_MIN_ROWS, 30, density=0.1, format="csr", random_state=np.random.RandomState(0))
    X.data[:] = 1.0
    expected = TfidfTransformer(norm=None, smooth_idf=True).fit(X).idf_
    np.testing.assert_allclose(FeaturePreprocessor(idf="auto", dtype="float64").fit(X).idf_, expected, rtol=1e-12)
    assert FeaturePreprocessor(idf="auto").fit(X[1:]).idf_ is None
    shard = FeaturePreprocessor(idf="auto").fit(X[:100], n_rows=IDF_MIN_ROWS)  # 100 rows here of 2,500 in all
    assert shard.idf_ is not None


def test_idf_auto_skips_real_valued_features_even_when_one_shard_holds_counts():
    """idf="auto" weights counts only: tf-idf values (whole numbers nowhere) are left as they are, and
    the decision is the same on every process (a shard of whole numbers whose peers hold real
    values does not weight)."""
    X = sp.random(IDF_MIN_ROWS, 30, density=0.1, format="csr", random_state=np.random.RandomState(0))
    X.data = np.round(X.data * 5) + 1.0  # term counts 1..6
    assert FeaturePreprocessor(idf="auto").fit(X).idf_ is not None
    X.data[7] += 0.25  # one real value
    assert FeaturePreprocessor(idf="auto").fit(X).idf_ is None
    assert FeaturePreprocessor(idf=True).fit(X).idf_ is not None  # an explicit True still weights
    counts_here = X[:100].copy()
    counts_here.data = np.ceil(counts_here.data)
    peers_real = FeaturePreprocessor(idf="auto").fit(counts_here, n_rows=IDF_MIN_ROWS, reduce=lambda a: a + 1)
    assert peers_real.idf_ is None


def test_normalize_matches_sklearn_and_keeps_zero_rows():
    X = _counts(2).tolil()
    X[5] = 0
    X = X.tocsr()
    X.eliminate_zeros()
    pre = FeaturePreprocessor(normalize=True, dtype="float64").fit(X)
    np.testing.assert_allclose(pre.transform(X).toarray(), normalize(X).toarray(), rtol=1e-12)
    assert pre.transform(X)[5].nnz == 0


def test_standardise_then_normalise_is_both_in_order():
    X = _dense(3)
    pre = FeaturePreprocessor(standardize=True, normalize=True, dtype="float64").fit(X)
    expected = normalize(StandardScaler().fit_transform(X))
    np.testing.assert_allclose(pre.transform(X).toarray(), expected, rtol=1e-9, atol=1e-12)


def test_auto_standardises_dense_features_only():
    assert FeaturePreprocessor(standardize="auto").fit(_dense()).standardized_
    pre = FeaturePreprocessor(standardize="auto").fit(_counts())
    assert not pre.standardized_ and pre.scale_ is None and pre.mean_ is None
    X = _counts()
    np.testing.assert_array_equal(pre.transform(X).toarray(), X.toarray())


def test_statistics_summed_over_processes_equal_one_process():
    """Two "processes" each see half the rows; ``reduce`` adds the other half's sums."""
    X = _dense(4)
    X[::3, 1] = 0
    X = sp.csr_matrix(X)
    halves = X[:17], X[17:]
    sent_by_second = []

    def record(array):
        sent_by_second.append(np.array(array, copy=True))
        return array

    settings = dict(standardize="auto", idf=True, dtype="float64")
    FeaturePreprocessor(**settings).fit(halves[1], n_rows=X.shape[0], reduce=record)
    first = FeaturePreprocessor(**settings).fit(halves[0], n_rows=X.shape[0],
                                                reduce=lambda array: array + sent_by_second.pop(0))
    whole = FeaturePreprocessor(**settings).fit(X)
    assert not sent_by_second
    for name in ("mean_", "scale_", "idf_"):
        np.testing.assert_allclose(getattr(first, name), getattr(whole, name), rtol=1e-12)


def test_checks_settings_fit_and_width():
    with pytest.raises(ValidationError, match=r"^standardize must be 'auto', True or False, got 'yes'$"):
        FeaturePreprocessor(standardize="yes").fit(_dense())
    with pytest.raises(NotFittedError):
        FeaturePreprocessor().transform(_dense())
    with pytest.raises(ValidationError, match="X has 3 features but the preprocessor was fitted with 5"):
        FeaturePreprocessor().fit(_dense()).transform(np.ones((2, 3)))


def test_centring_refuses_to_densify_a_large_sparse_block(monkeypatch):
    import bayesmlc.preprocessing as preprocessing

    X = _counts()  # 50 x 30, 15% non-zero
    pre = FeaturePreprocessor(standardize=True).fit(X)
    monkeypatch.setattr(preprocessing, "MAX_CENTRED_ENTRIES", 1000)
    with pytest.raises(ValidationError, match="50 x 30 = 1500 entries is above MAX_CENTRED_ENTRIES = 1000"):
        pre.transform(X)
    assert pre.transform(X[:20]).shape == (20, 30)  # fewer rows per call pass
    assert FeaturePreprocessor(standardize=True).fit(_dense(n=300)).transform(_dense(n=300)).shape == (300, 5)


def test_model_keeps_its_preprocessor_through_save_and_load(tmp_path):
    X = _dense(5)
    Y = (X[:, :3] > np.median(X[:, :3], axis=0)).astype(float)
    model = LogisticRegression(standardize=True).fit(X, Y)
    assert model.preprocessor_.mean_ is None  # LogisticRegression scales without centring
    np.testing.assert_allclose(model.preprocessor_.scale_, X.std(0) + (X.std(0) == 0), rtol=1e-6)  # fit sees float32 X
    path = tmp_path / "model.npz"
    model.save(path)
    loaded = LogisticRegression.load(path)
    np.testing.assert_array_equal(loaded.predict_proba(X), model.predict_proba(X))
    np.testing.assert_array_equal(loaded.preprocessor_.scale_, model.preprocessor_.scale_)


def test_a_file_gets_the_lowest_format_version_that_holds_it(tmp_path):
    X = (_dense(6)[:, :4] > np.median(_dense(6)[:, :4], axis=0)).astype(float)
    Y = X[:, :3]
    BMLS(n_topics=2, schedule="fixed", n_burnin=1, n_draws=1, random_state=0).fit(X, Y).save(tmp_path / "bmls.npz")
    LogisticRegression().fit(X, Y).save(tmp_path / "lr.npz")
    versions = {}
    for name in ("bmls", "lr"):
        meta, arrays = read_npz(tmp_path / f"{name}.npz")
        arrays.close()
        versions[name] = meta["format_version"]
    assert versions == {"bmls": 1, "lr": 3}  # BMLS keeps no preprocessor: older readers still read it


# ---- model files of the old form --------------------------------------------------------------
# tests/fixtures/legacy_models holds tiny synthetic models written by bayesmlc before FeaturePreprocessor
# (``feature_scale_`` was 1 / std in MLGPF and LogisticRegression files, the std in BNMC and KNN
# files), with their predictions then: expected.npz holds X_<name> and proba_<name>.
LEGACY_NAMES = ("logistic_standardized", "bnmc_dense", "bnmc_sparse", "knn_dense", "mlgpf_dense", "mlgpf_sparse")


@pytest.mark.parametrize("name", LEGACY_NAMES)
def test_old_model_files_load_to_the_same_predictions(name):
    expected = np.load(os.path.join(LEGACY_DIR, "expected.npz"))
    model = MultiLabelEstimator.load(os.path.join(LEGACY_DIR, name + ".npz"))
    X = expected["X_" + name]
    X = sp.csr_matrix(X) if "sparse" in name else X
    np.testing.assert_allclose(model.predict_proba(X), expected["proba_" + name], rtol=1e-6, atol=1e-7)
    assert isinstance(model.preprocessor_, FeaturePreprocessor)


def _rewrite_state(source, target, **changes):
    """Copy a model file with some arrays of its state replaced."""
    meta, arrays = read_npz(source)
    with arrays:
        members = {key: arrays[key] for key in arrays.files}
    for key, value in changes.items():
        members[key] = value
    np.savez(target, **members)


def test_old_model_file_with_a_bad_feature_scale_is_refused_naming_the_file(tmp_path):
    source = os.path.join(LEGACY_DIR, "knn_dense.npz")
    meta, arrays = read_npz(source)
    with arrays:
        key = next(k for k in arrays.files if "feature_scale_" in k)
        scale = arrays[key]
    target = tmp_path / "old.npz"
    _rewrite_state(source, target, **{key: -scale})
    with pytest.raises(ModelFormatError) as info:
        load_model(target)
    message = str(info.value)
    assert message.startswith(str(target)) and "\n" not in message
    assert "feature_scale_" in message


def test_persistence_and_preprocessing_import_no_estimator_module():
    """persistence sits below the estimators (they import it, never the other way round)."""
    import subprocess
    import sys

    code = ("import sys, bayesmlc.persistence, bayesmlc.preprocessing, bayesmlc.parameters; "
            "print(sorted(m for m in sys.modules if m.split('.')[:2] in "
            "(['bayesmlc', 'base'], ['bayesmlc', 'linear'], ['bayesmlc', 'gp'], ['bayesmlc', 'bnmc'])))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert result.stdout.strip() == "[]"
