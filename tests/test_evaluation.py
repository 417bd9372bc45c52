"""``bayesmlc.evaluation``: a fitted model scored on a test set block by block, once per row, with the
figures of ``metrics.evaluate`` on the whole arrays; the propensity constants of a data set; the
label-frequency baseline; the metrics table."""

import numpy as np
import pytest
import scipy.sparse as sp

from bayesmlc import Dataset, metrics
from bayesmlc.evaluation import (auc_row_subset, evaluate_model, format_metrics_table, label_frequency_baseline,
                                 propensity_constants)
from bayesmlc.exceptions import ValidationError
from bayesmlc.linear import LogisticRegression


@pytest.fixture(scope="module")
def fitted():
    rng = np.random.default_rng(4)
    X = (rng.random((200, 12)) < 0.4) * rng.integers(1, 3, size=(200, 12))
    Y = (X @ rng.normal(size=(12, 6)) + rng.normal(size=(200, 6)) > 0.8).astype(np.float32)
    Y[np.arange(200), rng.integers(0, 6, 200)] = 1.0
    mask = (rng.random((50, 6)) < 0.85).astype(np.float32)
    train = Dataset.from_arrays(X[:150], Y[:150])
    test = Dataset.from_arrays(X[150:], Y[150:] * mask, label_mask=mask)
    return LogisticRegression(max_iter=100).fit(train.X, train.Y), train, test


def test_blocks_give_the_figures_of_the_whole_arrays_and_each_row_is_scored_once(fitted, monkeypatch):
    model, train, test = fitted
    inv = metrics.inverse_propensity(train.Y)
    seen = []  # the rows the model's scoring hook sees (its probabilities are the scores' logistic)
    real = LogisticRegression._decision_function
    monkeypatch.setattr(LogisticRegression, "_decision_function", lambda self, X: seen.append(X.shape[0]) or real(self, X))
    result = evaluate_model(model, test, inv, auc_rows=None, max_entries=6 * 16)  # blocks of 16 rows
    assert seen == [16, 16, 16, 2] and result.auc_rows == 50 and result.predict_seconds > 0
    monkeypatch.setattr(LogisticRegression, "_decision_function", real)
    scores, proba = model.decision_function(test.X), model.predict_proba(test.X)
    expected = metrics.evaluate(test.Y, scores=scores, proba=proba, Y_pred=sp.csr_matrix(proba >= 0.5),
                                inv_propensity=inv, label_mask=test.label_mask)
    assert result.metrics.keys() == expected.keys()
    for key, value in expected.items():
        assert result.metrics[key] == pytest.approx(value, abs=1e-12), key
    curves = metrics.calibration_curves(test.Y, proba, scores=scores, label_mask=test.label_mask)
    assert result.reliability["top1"]["counts"] == curves["top1"]["counts"]


def test_above_the_limit_the_aucs_rank_a_seeded_subset_of_rows(fitted):
    model, _, test = fitted
    assert auc_row_subset(50, 6, max_entries=300) is None
    rows = auc_row_subset(50, 6, seed=0, max_entries=6 * 20)
    np.testing.assert_array_equal(rows, np.sort(np.random.default_rng(0).choice(50, 20, replace=False)))
    result = evaluate_model(model, test, max_entries=6 * 20)
    assert result.auc_rows == 20
    scores = model.decision_function(test.X)
    Y, mask = test.Y[rows], test.label_mask[rows]
    assert result.metrics["AUC_micro"] == pytest.approx(metrics.auc_micro(Y, scores[rows], mask), abs=1e-12)
    assert result.metrics["AUC_macro"] == pytest.approx(metrics.auc_macro(Y, scores[rows], mask), abs=1e-12)
    every = metrics.evaluate(test.Y, scores=scores, label_mask=test.label_mask)
    assert result.metrics["P@3"] == pytest.approx(every["P@3"], abs=1e-12)  # the rest over every row
    with pytest.raises(ValidationError, match="auc_rows"):
        evaluate_model(model, test, auc_rows="some")


def test_propensity_constants_come_from_the_registry_entry():
    assert propensity_constants() == (0.55, 1.5)
    assert propensity_constants("WikiLSHTC") == (0.5, 0.4)  # Jain et al.: Wikipedia-LSHTC
    named = Dataset.from_arrays(np.eye(3), np.eye(3), source={"dataset": "amazon-670k"})
    assert propensity_constants(named) == (0.6, 2.6)
    assert propensity_constants(Dataset.from_arrays(np.eye(3), np.eye(3), source={"path": "x/wikilshtc/train.txt"})) \
        == (0.55, 1.5)  # a path names nothing
    with pytest.raises(ValidationError, match="unknown dataset"):
        propensity_constants("wikilshtk")


def test_the_label_frequency_baseline_ranks_every_row_by_training_frequency(fitted):
    _, train, test = fitted
    frequency = np.asarray(train.Y.sum(axis=0)).ravel()
    top = int(np.argmax(frequency))
    values = label_frequency_baseline(train.Y, test)
    assert values["P@1"] == pytest.approx(test.Y[:, top].toarray().mean(), abs=1e-12)
    assert "PSP@1" not in values  # no inverse propensities given
    assert values["AUC_macro"] == 0.5  # a label scores every row alike: all ties


def test_the_metrics_table_has_one_line_per_metric():
    assert format_metrics_table({"P@1": 0.5, "AUC_macro": None}) == "P@1          0.5000\nAUC_macro  undefined"
    table = format_metrics_table({"P@1": 0.5}, {"P@1": 0.25}, ("model", "baseline")).splitlines()
    assert table[0].split() == ["model", "baseline"] and table[1].split() == ["P@1", "0.5000", "0.2500"]
