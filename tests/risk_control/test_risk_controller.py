"""RiskController with a real fitted estimator, end to end: fit (clone fitted on 80% of the rows,
threshold calibrated on the rest), save, load, predict; its sets against a direct computation from
predict_proba."""

from __future__ import annotations

import numpy as np
import pytest

from bayesmlc import LogisticRegression
from bayesmlc.base import MultiLabelEstimator
from bayesmlc.data.synthetic import make_multilabel
from bayesmlc.exceptions import ValidationError
from bayesmlc.risk_control import RiskController, calibrate_threshold, candidates_from_model


@pytest.fixture(scope="module")
def data():
    d = make_multilabel(n_samples=1600, n_features=120, n_labels=25, random_state=3)
    return d.X[:1000], d.Y[:1000], d.X[1000:], d.Y[1000:]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_fit_save_load_predict_end_to_end(data, tmp_path):
    X, Y, X_test, Y_test = data
    controller = RiskController(LogisticRegression(max_iter=50), risk="recall", alpha=0.2, top_k=10,
                                random_state=0).fit(X, Y)
    assert controller.calibration_rows_.size == 200 and controller.n_calibration_rows_ == 200
    # the threshold is CRC's on the held-out rows, recomputed independently of the controller
    held = controller.calibration_rows_
    again = calibrate_threshold(candidates_from_model(controller.estimator_, X[held], Y[held], 10), "recall", 0.2)
    assert controller.threshold_ == again.threshold and controller.feasible_
    # the sets: labels among the top 10 by probability at or above the threshold
    proba = controller.predict_proba(X_test)
    top = np.argsort(-proba, axis=1, kind="stable")[:, :10]
    expected = np.zeros_like(proba, dtype=bool)
    rows = np.arange(proba.shape[0])[:, None]
    expected[rows, top] = np.take_along_axis(proba, top, axis=1) >= controller.threshold_
    sets = controller.predict(X_test)
    np.testing.assert_array_equal(sets.toarray() > 0, expected)
    # the realised recall loss on the test rows is near alpha (one split: a loose band)
    report = controller.evaluate(X_test, Y_test)
    truth = Y_test.toarray() > 0
    missed = np.where(truth.sum(1) > 0, (truth & ~expected).sum(1) / np.maximum(truth.sum(1), 1), 0).mean()
    assert report["realised_risk"] == pytest.approx(missed)
    assert report["mean_set_size"] == pytest.approx(expected.sum(1).mean())
    assert 0.1 < report["realised_risk"] < 0.3
    controller.save(tmp_path / "model.npz")
    loaded = MultiLabelEstimator.load(tmp_path / "model.npz")
    assert isinstance(loaded, RiskController) and loaded.threshold_ == controller.threshold_
    assert (loaded.predict(X_test) != sets).nnz == 0
    # score_and_proba's labels are the sets too (what bayesmlc train --test scores)
    assert (controller.score_and_proba(X_test, return_labels=True)[2] != sets).nnz == 0


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_calibrate_a_prefit_model_and_selective_sets(data):
    X, Y, X_test, Y_test = data
    model = LogisticRegression(max_iter=50).fit(X[:700], Y[:700])
    controller = RiskController(model, risk="selective", alpha=0.5, delta=0.2).calibrate(X[700:], Y[700:])
    assert controller.estimator_ is model and controller.calibration_rows_.size == 0
    sets = controller.predict(X_test).toarray()
    proba = model.predict_proba(X_test)
    answered = proba.max(axis=1) >= controller.threshold_
    np.testing.assert_array_equal(sets.sum(axis=1), answered.astype(float))
    np.testing.assert_array_equal(sets[answered].argmax(axis=1), proba[answered].argmax(axis=1))
    assert controller.evaluate(X_test, Y_test)["coverage"] == pytest.approx(answered.mean())
    with pytest.raises(ValidationError, match="does not control"):
        RiskController(model, risk="precision", method="crc").calibrate(X[700:], Y[700:])
    with pytest.raises(ValidationError, match="fitted estimator"):
        RiskController(LogisticRegression()).calibrate(X[700:], Y[700:])
