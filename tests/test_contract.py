"""The estimator contract shared by every model, checked on the logistic baseline."""

import json
import warnings
import zipfile

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.linear_model import LogisticRegression as SkLogisticRegression
from sklearn.utils.estimator_checks import (
    check_get_params_invariance,
    check_no_attributes_set_in_init,
    check_parameters_default_constructible,
    check_set_params,
)

from conftest import linear_multilabel_problem

from bayesmlc import Dataset, ModelFormatError, NotFittedError, ValidationError
from bayesmlc.base import MultiLabelEstimator
from bayesmlc.linear import LogisticRegression
from bayesmlc.persistence import FORMAT_VERSION


@pytest.fixture(scope="module")
def fitted():
    X, Y = linear_multilabel_problem()
    return LogisticRegression(C=1.0, max_iter=300, tol=1e-9, device="cpu").fit(X, Y), X, Y


def test_logistic_matches_scikit_learn_per_label(fitted):
    model, X, Y = fitted
    proba = model.predict_proba(X)
    for label in range(Y.shape[1]):
        reference = SkLogisticRegression(C=1.0, tol=1e-10, max_iter=2000).fit(X, Y[:, label])
        np.testing.assert_allclose(model.coef_[:, label], reference.coef_.ravel(), atol=5e-3)
        np.testing.assert_allclose(proba[:, label], reference.predict_proba(X)[:, 1], atol=2e-3)


def test_logistic_label_blocks_match_scikit_learn_and_history_is_the_whole_objective(monkeypatch):
    """Labels solved in blocks of 4 (then 2): each label still matches scikit-learn, and the history
    holds the objective of all labels (the others at their current values), first and last."""
    import bayesmlc.linear

    monkeypatch.setattr(bayesmlc.linear, "_LABEL_BLOCK", 4)
    X, Y = linear_multilabel_problem(n_labels=6, seed=3)
    model = LogisticRegression(C=1.0, max_iter=300, tol=1e-9, device="cpu").fit(X, Y)

    def log_posterior(coef, intercept):
        logits = np.asarray(X @ coef) + intercept
        loss = np.logaddexp(0.0, logits) - Y * logits  # per entry, -log p(y | logit)
        return -(loss.sum() + 0.5 * (coef.astype(np.float64) ** 2).sum())  # C = 1

    for label in range(Y.shape[1]):
        reference = SkLogisticRegression(C=1.0, tol=1e-10, max_iter=2000).fit(X, Y[:, label])
        np.testing.assert_allclose(model.coef_[:, label], reference.coef_.ravel(), atol=5e-3)
    start = log_posterior(np.zeros_like(model.coef_), np.log(model.label_prior_ / (1 - model.label_prior_)))
    assert model.history_["objective"][0] == pytest.approx(start, rel=1e-5)
    assert model.history_["objective"][-1] == pytest.approx(log_posterior(model.coef_, model.intercept_), rel=1e-5)


def test_predict_threshold_and_topk_agree_with_brute_force(fitted):
    model, X, _ = fitted
    proba = model.predict_proba(X)
    predicted = model.predict(X, threshold=0.3)
    assert sp.issparse(predicted)
    np.testing.assert_array_equal(predicted.toarray(), (proba >= 0.3).astype(np.float32))
    indices, scores = model.predict_topk(X, 3, batch_size=17)
    scores_full = model.decision_function(X)
    expected = np.argsort(-scores_full, axis=1, kind="stable")[:, :3]
    np.testing.assert_allclose(scores, np.take_along_axis(scores_full, expected, axis=1), rtol=1e-6)
    np.testing.assert_array_equal(model.predict(X, top_k=2).sum(axis=1).A1, 2)


def test_score_is_precision_at_one(fitted):
    model, X, Y = fitted
    top = np.argmax(model.decision_function(X), axis=1)
    assert model.score(X, Y) == pytest.approx(Y[np.arange(len(top)), top].mean())


def test_save_load_round_trip(fitted, tmp_path):
    model, X, _ = fitted
    path = tmp_path / "model.npz"
    model.save(path)
    loaded = MultiLabelEstimator.load(path)
    assert isinstance(loaded, LogisticRegression)
    assert loaded.get_params() == model.get_params()
    np.testing.assert_array_equal(loaded.decision_function(X), model.decision_function(X))
    with pytest.raises(ModelFormatError, match="holds a LogisticRegression, not a _OtherModel"):
        _OtherModel.load(path)


class _OtherModel(MultiLabelEstimator):
    pass


def test_newer_format_version_is_refused(fitted, tmp_path):
    model, _, _ = fitted
    path = tmp_path / "model.npz"
    model.save(path)
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(arrays["__meta__"].tobytes())
    meta["format_version"] = FORMAT_VERSION + 1
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(path, **arrays)
    with pytest.raises(ModelFormatError, match=f"format version {FORMAT_VERSION + 1}.*Upgrade"):
        MultiLabelEstimator.load(path)


def test_garbage_model_file_is_refused(tmp_path):
    path = tmp_path / "junk.npz"
    path.write_bytes(b"not a zip file")
    with pytest.raises(ModelFormatError, match="not a bayesmlc model file"):
        MultiLabelEstimator.load(path)
    with zipfile.ZipFile(tmp_path / "empty.npz", "w"):
        pass
    with pytest.raises(ModelFormatError):
        MultiLabelEstimator.load(tmp_path / "empty.npz")


@pytest.mark.parametrize(
    "X, Y, mask, message",
    [
        (np.ones((3, 2)), np.ones((4, 2)), None, "X has 3 rows but Y has 4"),
        (np.array([[np.nan, 1.0], [0, 1]]), np.ones((2, 2)), None, "NaN or inf.*row 0, column 0"),
        (np.array([[np.inf, 1.0], [0, 1]]), np.ones((2, 2)), None, "NaN or inf"),
        (np.ones((2, 2)), np.array([[0, 2], [1, 0]]), None, "only 0 and 1.*2"),
        (np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 3)), "label_mask has shape"),
        (np.ones(3), np.ones((3, 2)), None, "must be 2-D"),
    ],
)
def test_fit_validation_errors(X, Y, mask, message):
    with pytest.raises(ValidationError, match=message):
        LogisticRegression().fit(X, Y, label_mask=mask)


def test_predict_errors(fitted):
    model, X, _ = fitted
    with pytest.raises(NotFittedError, match="not fitted yet"):
        LogisticRegression().predict_proba(X)
    wider = sp.hstack([X, sp.csr_matrix((X.shape[0], 2))]).tocsr()
    with pytest.raises(ValidationError, match="X has 32 features, but LogisticRegression is expecting 30 features"):
        model.predict(wider)
    narrower = X[:, :20]
    assert model.decision_function(narrower).shape == (X.shape[0], 6)  # padded with empty columns
    with pytest.raises(ValidationError, match="k must be a positive integer"):
        model.predict_topk(X, 0)


def test_empty_label_columns_warn_once_and_predict_prior():
    X, Y = linear_multilabel_problem()
    Y[:, 2] = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = LogisticRegression(device="cpu").fit(X, Y)
    relevant = [w for w in caught if "no positive training example" in str(w.message)]
    assert len(relevant) == 1 and "(2)" in str(relevant[0].message)
    expected_prior = 0.5 / (X.shape[0] + 1)
    np.testing.assert_allclose(model.predict_proba(X)[:, 2], expected_prior, rtol=1e-5)
    np.testing.assert_allclose(model.decision_function(X)[:, 2], np.log(expected_prior / (1 - expected_prior)), rtol=1e-5)


def test_masked_entries_do_not_change_the_fit():
    X, Y = linear_multilabel_problem(seed=3)
    rng = np.random.default_rng(1)
    mask = (rng.random(Y.shape) > 0.4).astype(np.float32)
    flipped = np.where(mask == 1, Y, 1 - Y)
    a = LogisticRegression(device="cpu").fit(X, Y, label_mask=mask)
    b = LogisticRegression(device="cpu").fit(X, flipped, label_mask=mask)
    np.testing.assert_array_equal(a.coef_, b.coef_)
    # and masking really removes the entries: it differs from treating them as negatives
    c = LogisticRegression(device="cpu").fit(X, Y * mask)
    assert np.abs(a.coef_ - c.coef_).max() > 1e-2


def test_same_seed_same_result():
    X, Y = linear_multilabel_problem(seed=5)
    a = LogisticRegression(random_state=7, device="cpu").fit(X, Y).decision_function(X)
    b = LogisticRegression(random_state=7, device="cpu").fit(X, Y).decision_function(X)
    np.testing.assert_array_equal(a, b)


def test_scikit_learn_parameter_conventions():
    name = "LogisticRegression"
    check_no_attributes_set_in_init(name, LogisticRegression())
    check_parameters_default_constructible(name, LogisticRegression())
    check_get_params_invariance(name, LogisticRegression())
    check_set_params(name, LogisticRegression())
    assert clone(LogisticRegression(C=3.0)).get_params()["C"] == 3.0


def test_dataset_statistics_hand_example():
    X = sp.csr_matrix(np.array([[1, 0, 2], [0, 0, 1], [0, 0, 0], [3, 1, 0]], dtype=np.float32))
    Y = sp.csr_matrix(np.array([[1, 0], [1, 1], [0, 0], [1, 0]], dtype=np.float32))
    stats = Dataset(X, Y).stats()
    assert stats["n_samples"] == 4 and stats["n_features"] == 3 and stats["n_labels"] == 2
    assert stats["labels_per_row"] == pytest.approx(4 / 4)
    assert stats["label_density"] == pytest.approx(4 / 8)
    assert stats["feature_density"] == pytest.approx(5 / 12)
    assert stats["rows_without_labels"] == 1
    assert stats["label_frequency_max"] == 3 and stats["label_frequency_min"] == 1
    assert not stats["binary_features"]
    with pytest.raises(ValidationError, match="X has 4 rows but Y has 3"):
        Dataset(X, Y[:3])
