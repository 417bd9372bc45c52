"""AveragingEnsemble: the weighted mean of members fitted on their own, nested save/load, seeds, errors."""

import json

import numpy as np
import pytest
from conftest import linear_multilabel_problem
from sklearn.base import clone

from bayesmlc import MLGPF, ModelFormatError, ValidationError
from bayesmlc.base import MultiLabelEstimator
from bayesmlc.baselines import KNNBaseline
from bayesmlc.ensemble import AveragingEnsemble
from bayesmlc.linear import LogisticRegression
from bayesmlc.persistence import FORMAT_VERSION


def _small_gp(seed=None):
    return MLGPF(n_latent=3, n_inducing=8, epochs=2, batch_size=50, device="cpu", random_state=seed)


def _members():
    return [("lr", LogisticRegression(C=1.0, max_iter=200, device="cpu")), ("knn", KNNBaseline(n_neighbors=5))]


@pytest.fixture(scope="module")
def problem():
    return linear_multilabel_problem(n=200, d=25, n_labels=5, density=0.3)


def _meta(path) -> dict:
    with np.load(path) as data:
        return json.loads(data["__meta__"].tobytes())


def test_probabilities_are_the_weighted_mean_of_members_fitted_alone(problem):
    X, Y = problem
    ensemble = AveragingEnsemble(_members(), weights=[3.0, 1.0]).fit(X, Y)
    alone = [member.fit(X, Y) for _, member in _members()]
    expected = 0.75 * alone[0].predict_proba(X) + 0.25 * alone[1].predict_proba(X)
    np.testing.assert_allclose(ensemble.predict_proba(X), expected, atol=1e-6)
    np.testing.assert_allclose(ensemble.weights_, [0.75, 0.25])
    # the scores are the logit of the mean, so ranking by either agrees
    np.testing.assert_allclose(ensemble.decision_function(X), np.log(expected) - np.log1p(-expected), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(ensemble.predict_topk(X, 2)[0],
                                  np.argsort(-expected.astype(np.float64), axis=1, kind="stable")[:, :2])


def test_label_mask_reaches_every_member(problem):
    X, Y = problem
    rng = np.random.default_rng(4)
    mask = (rng.random(Y.shape) > 0.3).astype(np.float32)
    ensemble = AveragingEnsemble(_members()[:1]).fit(X, Y, label_mask=mask)
    alone = LogisticRegression(C=1.0, max_iter=200, device="cpu").fit(X, Y, label_mask=mask)
    np.testing.assert_allclose(ensemble.predict_proba(X), alone.predict_proba(X), atol=1e-6)


def test_fit_leaves_the_given_estimators_unfitted_and_clone_works(problem):
    X, Y = problem
    members = _members()
    ensemble = AveragingEnsemble(members).fit(X, Y)
    assert not hasattr(members[0][1], "n_labels_")
    assert ensemble.estimators_[0] is not members[0][1]
    assert list(ensemble.named_estimators_) == ["lr", "knn"]
    copy = clone(ensemble)
    assert not hasattr(copy, "estimators_")
    assert copy.get_params()["weights"] is None


def test_one_seed_fixes_every_member(problem):
    X, Y = problem
    members = [("a", _small_gp(seed=123)), ("b", _small_gp(seed=123))]
    first = AveragingEnsemble(members, random_state=7).fit(X, Y)
    again = AveragingEnsemble(members, random_state=7).fit(X, Y)
    other = AveragingEnsemble(members, random_state=8).fit(X, Y)
    seeds = [m.random_state for m in first.estimators_]
    assert seeds[0] != seeds[1] and 123 not in seeds
    np.testing.assert_array_equal(first.predict_proba(X), again.predict_proba(X))
    assert [m.random_state for m in other.estimators_] != seeds
    # random_state=None keeps the members' own seeds
    kept = AveragingEnsemble(members).fit(X, Y)
    assert [m.random_state for m in kept.estimators_] == [123, 123]
    np.testing.assert_array_equal(kept.estimators_[0].predict_proba(X), _small_gp(seed=123).fit(X, Y).predict_proba(X))


def test_save_and_load_keep_every_member(problem, tmp_path):
    X, Y = problem
    ensemble = AveragingEnsemble([("gp", _small_gp(seed=1))] + _members(), weights=[1, 2, 1]).fit(X, Y)
    path = tmp_path / "ensemble.npz"
    ensemble.save(path)
    loaded = MultiLabelEstimator.load(path)
    assert isinstance(loaded, AveragingEnsemble)
    assert [type(m) for m in loaded.estimators_] == [MLGPF, LogisticRegression, KNNBaseline]
    assert loaded.named_estimators_["gp"] is loaded.estimators_[0]
    assert not hasattr(loaded.estimators[0][1], "n_labels_")  # the unfitted parameters stay unfitted
    assert loaded.estimators[0][1].get_params() == ensemble.estimators[0][1].get_params()
    np.testing.assert_array_equal(loaded.predict_proba(X), ensemble.predict_proba(X))
    np.testing.assert_array_equal(loaded.decision_function(X), ensemble.decision_function(X))
    # the members nest their FeaturePreprocessor (version 3), and so does a member's own file
    assert _meta(path)["format_version"] == FORMAT_VERSION == 3
    ensemble.estimators_[1].save(tmp_path / "lr.npz")
    assert _meta(tmp_path / "lr.npz")["format_version"] == 3


def test_a_file_naming_a_class_that_is_not_an_estimator_is_refused(problem, tmp_path):
    X, Y = problem
    path = tmp_path / "ensemble.npz"
    AveragingEnsemble(_members()[:1]).fit(X, Y).save(path)
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    text = arrays["__meta__"].tobytes().decode().replace("bayesmlc.linear:LogisticRegression", "os:system")
    arrays["__meta__"] = np.frombuffer(text.encode(), dtype=np.uint8)
    np.savez(path, **arrays)
    with pytest.raises(ModelFormatError, match="os:system is not a bayesmlc estimator class"):
        MultiLabelEstimator.load(path)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(estimators=[]), "non-empty list"),
        (dict(estimators=[LogisticRegression()]), r"estimators\[0\] must be a \(name, estimator\) pair"),
        (dict(estimators=[("a", object())]), r"estimators\[0\] \('a'\) is a object, not a bayesmlc estimator"),
        (dict(estimators=[("a", LogisticRegression()), ("a", KNNBaseline())]), "repeated: a"),
        (dict(estimators=_members(), weights=[1.0]), "one number per estimator"),
        (dict(estimators=_members(), weights=[1.0, -1.0]), "non-negative"),
        (dict(estimators=_members(), random_state=1.5), "random_state must be None or an int"),
    ],
)
def test_invalid_parameters_are_named(problem, kwargs, message):
    X, Y = problem
    with pytest.raises(ValidationError, match=message):
        AveragingEnsemble(**kwargs).fit(X, Y)
