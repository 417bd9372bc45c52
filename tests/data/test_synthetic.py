"""Tests of the synthetic generator: shapes and statistics against their targets, power laws,
learnability against scikit-learn, determinism, missing-label masks, presets and splits."""

from __future__ import annotations

import time

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.stats import chisquare
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import normalize

from bayesmlc import datasets
from bayesmlc.data import synthetic
from bayesmlc.data.synthetic import make_multilabel, make_shape, make_train_test, split
from bayesmlc.exceptions import ValidationError


def _same_csr(a: sp.csr_matrix, b: sp.csr_matrix) -> bool:
    return (
        a.shape == b.shape
        and np.array_equal(a.indptr, b.indptr)
        and np.array_equal(a.indices, b.indices)
        and np.array_equal(a.data, b.data)
    )


def _rank_frequency_fit(frequencies: np.ndarray, first: int, last: int):
    """Slope and R^2 of log frequency against log rank over ranks first..last (1-based)."""
    freq = np.sort(frequencies)[::-1][first - 1 : last].astype(float)
    log_rank = np.log(np.arange(first, last + 1))
    log_freq = np.log(np.maximum(freq, 0.5))
    slope, intercept = np.polyfit(log_rank, log_freq, 1)
    residual = log_freq - (slope * log_rank + intercept)
    return slope, 1.0 - residual.var() / log_freq.var()


@pytest.fixture(scope="module")
def medium():
    return make_multilabel(4000, 600, 60, features_per_row=30, labels_per_row=3, random_state=7)


def test_public_module_reexports():
    assert datasets.make_multilabel is make_multilabel
    assert datasets.make_shape is make_shape
    assert datasets.split is split
    assert set(datasets.SHAPES) == {"bibtex", "delicious", "eurlex-4k", "amazoncat-13k"}


def test_the_earlier_names_of_the_shapes_still_work_with_a_future_warning():
    import bayesmlc.data.synthetic as synthetic

    for module in (synthetic, datasets):
        with pytest.warns(FutureWarning, match="PRESETS was renamed SHAPES"):
            assert module.PRESETS is synthetic.SHAPES
        with pytest.warns(FutureWarning, match="make_preset was renamed make_shape"):
            assert module.make_preset is make_shape
    with pytest.raises(AttributeError, match="no attribute 'MAKE'"):
        synthetic.MAKE


def test_types_shapes_and_sparsity(medium):
    ds = medium
    assert (ds.n_samples, ds.n_features, ds.n_labels) == (4000, 600, 60)
    assert sp.isspmatrix_csr(ds.X) and sp.isspmatrix_csr(ds.Y)
    assert ds.X.dtype == np.float32 and ds.Y.dtype == np.float32
    assert ds.X.data.min() >= 1 and np.all(ds.X.data == np.round(ds.X.data))  # counts
    assert np.all(ds.Y.data == 1)
    assert ds.label_mask is None
    assert ds.X.has_canonical_format and ds.Y.has_canonical_format
    assert np.diff(ds.X.indptr).min() >= 1 and np.diff(ds.Y.indptr).min() >= 1


def test_row_statistics_match_targets(medium):
    # labels per row: 1 + Poisson(2), sd sqrt(2), standard error of the mean 0.022 over 4000 rows.
    per_row = medium.labels_per_row()
    assert abs(per_row.mean() - 3.0) < 0.1
    assert abs(per_row.var() - 2.0) < 0.3  # Poisson part keeps its variance
    # features per row: 1 + Poisson(Gamma) with mean 30, sd about 21, standard error 0.33.
    features = np.diff(medium.X.indptr)
    assert abs(features.mean() - 30.0) < 1.5
    assert features.var() > 30.0  # over-dispersed, like document lengths


def test_label_and_feature_frequencies_follow_power_laws():
    slopes = {}
    for power in (0.6, 1.0):
        ds = make_multilabel(20000, 2000, 1000, features_per_row=20, labels_per_row=3, label_power=power,
                             feature_power=power, random_state=1)
        label_slope, label_r2 = _rank_frequency_fit(ds.label_frequencies(), 10, 500)
        feature_slope, feature_r2 = _rank_frequency_fit(np.bincount(ds.X.indices, minlength=2000), 10, 1000)
        # Straight lines in log-log space (power laws) ...
        assert label_r2 > 0.95 and feature_r2 > 0.95, (power, label_r2, feature_r2)
        # ... whose slopes follow the exponents, flattened a little because a row holds an item once.
        assert 0.6 * power < -label_slope < 1.05 * power, (power, label_slope)
        assert 0.6 * power < -feature_slope < 1.05 * power, (power, feature_slope)
        slopes[power] = label_slope
    assert slopes[1.0] < slopes[0.6] - 0.2


def _logistic_scores(train, test):
    """Per-label scikit-learn logistic regression scores on ``test`` (labels absent in train: -inf),
    on rows scaled to unit L2 norm."""
    X_train, X_test = normalize(train.X), normalize(test.X)
    Y_train = train.Y.toarray()
    scores = np.full((test.n_samples, train.n_labels), -np.inf)
    for label in range(train.n_labels):
        if 0 < Y_train[:, label].sum() < train.n_samples:
            model = LogisticRegression(C=10.0, solver="liblinear").fit(X_train, Y_train[:, label])
            scores[:, label] = model.decision_function(X_test)
    return scores


def _precision_at_1(Y_test: np.ndarray, scores: np.ndarray) -> float:
    return float(Y_test[np.arange(Y_test.shape[0]), scores.argmax(axis=1)].mean())


def test_labels_are_learnable_from_features():
    train, test = make_train_test(3000, 500, 40, test_fraction=1 / 3, random_state=0)
    scores = _logistic_scores(train, test)
    Y_test = test.Y.toarray()
    p_at_1 = _precision_at_1(Y_test, scores)
    most_frequent = Y_test[:, np.asarray(train.Y.sum(axis=0)).ravel().argmax()].mean()
    finite = np.isfinite(scores)
    micro_auc = roc_auc_score(Y_test[finite], scores[finite])
    assert p_at_1 >= 2.0 * most_frequent, (p_at_1, most_frequent)
    assert micro_auc > 0.8, micro_auc

    # Negative control: the same model on labels shuffled across rows is no better than the baseline,
    # so the margin above really comes from labels depending on features.
    rng = np.random.default_rng(0)
    shuffled = train.subset(np.arange(train.n_samples))
    shuffled.Y = train.Y[rng.permutation(train.n_samples)]
    control = _precision_at_1(Y_test, _logistic_scores(shuffled, test))
    assert control < most_frequent + 0.1, (control, most_frequent)


def test_labels_are_correlated_through_a_low_rank_structure(medium):
    # Energy of the top singular values of Y, against Y with each column permuted on its own (same
    # label frequencies, no correlation between labels).
    Y = medium.Y.toarray()
    rng = np.random.default_rng(3)
    independent = np.column_stack([rng.permutation(Y[:, j]) for j in range(Y.shape[1])])
    k = medium.source["rank"]

    def top_energy(matrix):
        centred = matrix - matrix.mean(axis=0)
        singular = np.linalg.svd(centred, compute_uv=False)
        return (singular[:k] ** 2).sum() / (singular**2).sum()

    assert top_energy(Y) > top_energy(independent) + 0.1


def test_same_seed_same_data_different_seed_different_data():
    kwargs = dict(features_per_row=20, labels_per_row=3, missing_fraction=0.3)
    a = make_multilabel(500, 300, 30, random_state=11, **kwargs)
    b = make_multilabel(500, 300, 30, random_state=11, **kwargs)
    c = make_multilabel(500, 300, 30, random_state=12, **kwargs)
    assert _same_csr(a.X, b.X) and _same_csr(a.Y, b.Y) and _same_csr(a.label_mask, b.label_mask)
    assert not _same_csr(a.X, c.X) and not _same_csr(a.Y, c.Y) and not _same_csr(a.label_mask, c.label_mask)
    assert a.source["seed"] == 11 and a.source["generator"] == "bayesmlc.datasets.make_multilabel"
    assert a.source["missing_fraction"] == 0.3 and a.source["n_labels"] == 30


def test_unseeded_run_records_a_seed_that_reproduces_it():
    first = make_multilabel(300, 200, 20)
    again = make_multilabel(300, 200, 20, random_state=first.source["seed"])
    assert _same_csr(first.X, again.X) and _same_csr(first.Y, again.Y)


def test_generator_random_state_is_accepted():
    a = make_multilabel(200, 100, 10, random_state=np.random.default_rng(5))
    b = make_multilabel(200, 100, 10, random_state=np.random.default_rng(5))
    assert _same_csr(a.Y, b.Y)


def test_rows_are_generated_in_chunks(monkeypatch):
    monkeypatch.setattr(synthetic, "CHUNK_ROWS", 64)
    ds = make_multilabel(1000, 400, 30, labels_per_row=2.5, random_state=2)
    again = make_multilabel(1000, 400, 30, labels_per_row=2.5, random_state=2)
    assert _same_csr(ds.X, again.X) and _same_csr(ds.Y, again.Y)
    assert abs(ds.labels_per_row().mean() - 2.5) < 0.12  # se 0.039
    # Chunks use independent streams: the first 64 rows differ from the next 64.
    assert not _same_csr(ds.Y[:64], ds.Y[64:128])


def test_missing_label_mask():
    full = make_multilabel(3000, 300, 40, random_state=4)
    masked = make_multilabel(3000, 300, 40, random_state=4, missing_fraction=0.25)
    # The mask comes from its own random stream: X and Y are those of the unmasked run.
    assert _same_csr(full.X, masked.X) and _same_csr(full.Y, masked.Y)
    observed = masked.label_mask.toarray() > 0
    # 120,000 entries hidden independently w.p. 0.25: standard error 0.00125.
    assert abs(1.0 - observed.mean() - 0.25) < 0.006
    # Positives are hidden at the same rate (about 9000 positives: standard error 0.0046).
    positives = masked.Y.toarray() > 0
    assert abs(1.0 - observed[positives].mean() - 0.25) < 0.02
    # Uniformly over labels: hidden counts per label are homogeneous (chi-square, 39 d.o.f.) ...
    hidden_per_label = (~observed).sum(axis=0)
    assert chisquare(hidden_per_label).pvalue > 1e-3
    # ... and independently over entries: hidden counts per row are Binomial(40, 0.25), variance 7.5.
    assert abs((~observed).sum(axis=1).var() - 7.5) < 0.8
    assert masked.stats()["observed_label_fraction"] == pytest.approx(observed.mean())


def test_mask_that_would_be_too_large_is_refused():
    with pytest.raises(ValidationError, match="label_mask"):
        make_multilabel(1_000_000, 1000, 13330, missing_fraction=0.5)


@pytest.mark.parametrize("kind", ["binary", "real"])
def test_feature_kinds(kind):
    counts = make_multilabel(500, 400, 20, random_state=9)
    other = make_multilabel(500, 400, 20, random_state=9, feature_kind=kind)
    # Same words drawn (X pattern); only the values differ.
    assert np.array_equal(counts.X.indptr, other.X.indptr) and np.array_equal(counts.X.indices, other.X.indices)
    if kind == "binary":
        assert np.all(other.X.data == 1)
    else:
        norms = np.sqrt(np.asarray(other.X.multiply(other.X).sum(axis=1)).ravel())
        np.testing.assert_allclose(norms, 1.0, rtol=1e-5)
        assert other.X.data.min() > 0
        # tf-idf = (1 + log count) * idf(word) * c(row): the ratio of two rows' weights of a shared
        # word, divided by their tf ratio, is the same c-ratio for every shared word.
        shared = np.intersect1d(counts.X[0].indices, counts.X[1].indices)
        assert shared.size >= 2
        tf0 = 1 + np.log(counts.X[0, shared].toarray().ravel())
        tf1 = 1 + np.log(counts.X[1, shared].toarray().ravel())
        ratio = (other.X[0, shared].toarray().ravel() / tf0) / (other.X[1, shared].toarray().ravel() / tf1)
        np.testing.assert_allclose(ratio, ratio[0], rtol=1e-4)


@pytest.mark.parametrize("shape", [(50, 72, 6), (20, 3, 2), (10, 1, 1)])
def test_tiny_shapes_work_with_default_arguments(shape):
    ds = make_multilabel(*shape, random_state=0)
    assert (ds.n_samples, ds.n_features, ds.n_labels) == shape
    assert ds.labels_per_row().min() >= 1 and np.diff(ds.X.indptr).min() >= 1


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(n_samples=0), "n_samples"),
        (dict(n_features=2.5), "n_features"),
        (dict(labels_per_row=0.5), "labels_per_row"),
        (dict(labels_per_row=50), "labels_per_row"),
        (dict(features_per_row=1000), "features_per_row"),
        (dict(rank=31), "rank"),
        (dict(missing_fraction=1.0), "missing_fraction"),
        (dict(feature_kind="dense"), "feature_kind"),
        (dict(random_state="seed"), "random_state"),
        (dict(label_noise=-0.1), "label_noise"),
    ],
)
def test_bad_arguments_are_named(kwargs, argument):
    args = dict(n_samples=100, n_features=300, n_labels=30)
    args.update(kwargs)
    with pytest.raises(ValidationError, match=argument):
        make_multilabel(args.pop("n_samples"), args.pop("n_features"), args.pop("n_labels"), **args)


def test_presets_have_the_published_shapes():
    bibtex = make_shape("bibtex", scale=0.5, random_state=0)
    assert (bibtex.n_samples, bibtex.n_features, bibtex.n_labels) == (2440, 1836, 159)
    stats = bibtex.stats()
    assert stats["binary_features"]
    assert abs(stats["labels_per_row"] - 2.40) < 0.1
    assert abs(stats["features_per_row"] - 68.7) < 5
    assert bibtex.source["preset"] == "bibtex" and bibtex.source["scale"] == 0.5

    amazon = make_shape("amazoncat-13k", scale=0.002, random_state=0)
    assert (amazon.n_samples, amazon.n_features, amazon.n_labels) == (2372, 203882, 13330)
    assert abs(amazon.stats()["labels_per_row"] - 5.04) < 0.2
    assert abs(amazon.stats()["features_per_row"] - 71.0) < 6


def test_preset_overrides_and_errors():
    ds = make_shape("delicious", scale=0.05, random_state=1, missing_fraction=0.5)
    assert ds.n_samples == 646 and ds.label_mask is not None
    with pytest.raises(ValidationError, match="unknown shape"):
        make_shape("rcv1")


def test_split_partitions_rows():
    ds = make_multilabel(1000, 200, 20, random_state=3, missing_fraction=0.1)
    train, test = split(ds, test_fraction=0.2, random_state=5)
    assert (train.n_samples, test.n_samples) == (800, 200)
    # Rows are the original rows, each in exactly one part (compare as multisets of label rows + X).
    combined = sp.vstack([train.X, test.X]).tocsr()
    assert combined.nnz == ds.X.nnz and abs(combined.sum() - ds.X.sum()) < 1e-3
    assert train.label_mask.shape == (800, 20) and test.label_mask.shape == (200, 20)
    assert train.source["split"] == "train" and test.source["seed"] == ds.source["seed"]
    again_train, _ = split(ds, test_fraction=0.2, random_state=5)
    assert _same_csr(train.X, again_train.X)
    with pytest.raises(ValidationError, match="test_fraction"):
        split(ds, test_fraction=1.0)


@pytest.mark.slow
def test_amazoncat_tenth_generates_quickly():
    start = time.perf_counter()
    ds = make_shape("amazoncat-13k", scale=0.1, random_state=0)
    seconds = time.perf_counter() - start
    assert ds.n_samples == 118624
    assert abs(ds.stats()["features_per_row"] - 71.0) < 2
    assert seconds < 60, seconds
