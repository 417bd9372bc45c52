"""``score_and_proba``: the scores, probabilities and predicted labels of one pass of the model, equal
(not close: equal) to what ``decision_function``, ``predict_proba`` and ``predict`` return one by one,
for every model; and the model's work done once per row."""

import importlib.util

import numpy as np
import pytest
import scipy.sparse as sp

import bayesmlc.base
from bayesmlc.base import MultiLabelEstimator
from bayesmlc.baselines import KNNBaseline, NapkinXCPLT, OmikujiParabel
from bayesmlc.bmls import BMLS
from bayesmlc.bnmc import BNMC
from bayesmlc.calibration import CalibratedClassifier
from bayesmlc.ensemble import AveragingEnsemble
from bayesmlc.gp import MLGPF
from bayesmlc.linear import LogisticRegression


def _small_mlgpf(**kw):
    return MLGPF(n_latent=3, n_inducing=10, subspace_rank=6, epochs=3, n_threads=1, random_state=0, **kw)


def _optional(package):
    return pytest.mark.skipif(importlib.util.find_spec(package) is None, reason=f"{package} is not installed")


MODELS = {
    "logistic": lambda: LogisticRegression(max_iter=50),
    "mlgpf": _small_mlgpf,
    "mlgpf-rank-by-proba": lambda: _small_mlgpf(rank_by="proba"),
    "mlgpf-at-least-one": lambda: _small_mlgpf(label_cardinality="at_least_one"),
    "bnmc": lambda: BNMC(truncation=4, n_passes=1, random_state=0),
    "bnmc-threshold": lambda: BNMC(truncation=4, n_passes=1, count_rule="threshold", random_state=0),
    "bmls": lambda: BMLS(n_topics=4, schedule="fixed", n_burnin=10, n_draws=5, thin=1, random_state=0),
    "knn": lambda: KNNBaseline(n_neighbors=5),
    "calibrated": lambda: CalibratedClassifier(LogisticRegression(max_iter=50), method="isotonic", random_state=0),
    "ensemble": lambda: AveragingEnsemble([("logistic", LogisticRegression(max_iter=50)),
                                         ("knn", KNNBaseline(n_neighbors=5))]),
    "napkinxc": pytest.param(lambda: NapkinXCPLT(n_threads=1, random_state=0), marks=_optional("napkinxc")),
    "omikuji": pytest.param(lambda: OmikujiParabel(n_threads=1), marks=_optional("omikuji")),
}


@pytest.fixture(scope="module")
def problem():
    """90 training rows, 40 test rows, 7 labels; label 6 has no training positive (its outputs are the
    prior's)."""
    rng = np.random.default_rng(3)
    X = sp.csr_matrix((rng.random((130, 15)) < 0.3) * rng.integers(1, 4, size=(130, 15)), dtype=np.float32)
    Y = (np.asarray(X @ rng.normal(size=(15, 7))) + rng.normal(size=(130, 7)) > 1.0).astype(np.float32)
    Y[~Y.any(axis=1), 0] = 1.0
    Y[:90, 6] = 0.0
    return X[:90], sp.csr_matrix(Y[:90]), X[90:]


@pytest.mark.filterwarnings("ignore::UserWarning")  # the label without a positive
@pytest.mark.parametrize("build", list(MODELS.values()), ids=list(MODELS))
def test_score_and_proba_equals_the_three_methods(build, problem, monkeypatch):
    X, Y, X_test = problem
    model = build().fit(X, Y)
    monkeypatch.setattr(bayesmlc.base, "PREDICT_BATCH_ROWS", 16)  # three batches of the 40 test rows
    scores, proba, labels = model.score_and_proba(X_test, return_labels=True)
    assert scores.dtype == proba.dtype == np.float32 and sp.issparse(labels)
    if isinstance(model, MLGPF):  # the mean comes with the variance: the same k(x, Z) alpha, summed in another order
        expected = model.decision_function(X_test)
        np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
    else:
        np.testing.assert_array_equal(scores, model.decision_function(X_test))
    np.testing.assert_array_equal(proba, model.predict_proba(X_test))
    assert (labels != model.predict(X_test)).nnz == 0
    if not model._conditions_on_a_label:
        np.testing.assert_array_equal(proba[:, 6], np.float32(model.label_prior_[6]))
    two = model.score_and_proba(X_test)
    assert len(two) == 2 and np.array_equal(two[0], scores) and np.array_equal(two[1], proba)


class _CountingModel(MultiLabelEstimator):
    """Scores x @ w; probabilities the logistic of scores / 2 (not the default logistic of the
    scores, so the base class calls both hooks); counts the rows each hook sees."""

    def __init__(self, share_work=False):
        self.share_work = share_work

    def _fit(self, X, Y, label_mask):
        self.weights_ = np.linspace(-1.0, 1.0, X.shape[1] * Y.shape[1]).reshape(X.shape[1], Y.shape[1])
        self.rows_scored_ = {"scores": 0, "proba": 0}

    def _decision_function(self, X):
        self.rows_scored_["scores"] += X.shape[0]
        return np.asarray(X @ self.weights_)

    def _predict_proba(self, X):
        self.rows_scored_["proba"] += X.shape[0]
        return 1.0 / (1.0 + np.exp(-np.asarray(X @ self.weights_) / 2.0))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_default_hook_scores_each_row_once_per_output(problem):
    X, Y, X_test = problem
    model = _CountingModel().fit(X, Y)
    scores, proba, labels = model.score_and_proba(X_test, return_labels=True)
    assert model.rows_scored_ == {"scores": 40, "proba": 40}  # predict's labels come from proba: no third pass
    expected = np.asarray(X_test @ model.weights_)[:, :6]  # label 6 has the prior's outputs
    np.testing.assert_allclose(scores[:, :6], expected, rtol=1e-6)
    np.testing.assert_allclose(proba[:, :6], 1.0 / (1.0 + np.exp(-expected / 2.0)), rtol=1e-6)
    np.testing.assert_array_equal(labels.toarray(), (proba >= 0.5).astype(np.float32))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_model_with_its_own_predict_rule_and_no_labels_hook_gets_predict_itself(problem):
    X, Y, X_test = problem

    class TopOne(_CountingModel):
        def predict(self, X, threshold=0.5, top_k=None):
            return super().predict(X, top_k=1)

    model = TopOne().fit(X, Y)
    _, _, labels = model.score_and_proba(X_test, return_labels=True)
    np.testing.assert_array_equal(labels.sum(axis=1).A1, 1)  # predict's rule, not the 0.5 threshold
    assert (labels != model.predict(X_test)).nnz == 0


#: the method that does a model's costly work, which score_and_proba must call once per row
COSTLY_WORK = {
    "mlgpf": (_small_mlgpf, MLGPF, "_predictive_probabilities"),
    "bmls": (MODELS["bmls"], BMLS, "_mean_probability"),
    "bnmc": (MODELS["bnmc"], BNMC, "_evidence"),
}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", sorted(COSTLY_WORK))
def test_the_costly_work_is_done_once_per_row(name, problem, monkeypatch):
    build, cls, method = COSTLY_WORK[name]
    X, Y, X_test = problem
    model = build().fit(X, Y)
    seen = []
    real = getattr(cls, method)
    monkeypatch.setattr(cls, method, lambda self, rows, *rest, **kw: seen.append(rows.shape[0]) or real(self, rows, *rest, **kw))
    model.score_and_proba(X_test, return_labels=True)
    assert sum(seen) == X_test.shape[0]


@pytest.mark.filterwarnings("ignore::UserWarning")  # the label without a positive
@pytest.mark.parametrize("entries, rows", [(21, 3), (13, 1), (1, 1)])
def test_bnmc_predicts_the_same_in_blocks_of_few_entries(problem, monkeypatch, entries, rows):
    """BNMC's prediction blocks hold at most ``_prediction_block_entries`` (rows x labels), at least one
    row; the outputs are those of one block of every row, bit for bit."""
    X, Y, X_test = problem
    model = BNMC(truncation=4, n_passes=1, random_state=0).fit(X, Y)
    monkeypatch.setattr(model, "_prediction_block_entries", None)
    whole = model.score_and_proba(X_test, return_labels=True)
    seen = []
    hook = model._scores_and_proba
    monkeypatch.setattr(model, "_scores_and_proba", lambda block: seen.append(block.shape[0]) or hook(block))
    monkeypatch.setattr(model, "_prediction_block_entries", entries)  # 7 labels
    blocked = model.score_and_proba(X_test, return_labels=True)
    assert max(seen) == rows and sum(seen) == X_test.shape[0]
    np.testing.assert_array_equal(blocked[0], whole[0])
    np.testing.assert_array_equal(blocked[1], whole[1])
    assert (blocked[2] != whole[2]).nnz == 0
    np.testing.assert_array_equal(model.predict_proba(X_test), whole[1])
