"""``bayesmlc train --risk RISK=TARGET`` and ``bayesmlc predict`` of the saved controller's label sets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bayesmlc.base import MultiLabelEstimator
from bayesmlc.cli import main
from bayesmlc.data.io import read_dataset, write_dataset
from bayesmlc.data.synthetic import make_multilabel, split
from bayesmlc.risk_control import RiskController


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_train_with_risk_saves_the_controller_and_predict_prints_its_sets(tmp_path, capsys):
    data = make_multilabel(400, 40, 8, random_state=0)
    train, test = split(data, 0.3, random_state=0)
    write_dataset(train, tmp_path / "train.txt")
    write_dataset(test, tmp_path / "test.txt")
    out = tmp_path / "run"
    code = main(["train", "--model", "logistic", "--train", str(tmp_path / "train.txt"), "--test",
                 str(tmp_path / "test.txt"), "--risk", "recall=0.8", "--risk-calibration-fraction", "0.25",
                 "--risk-top-k", "5", "--out", str(out), "--json", "--quiet", "--seed", "2"])
    assert code == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["risk_control"]
    model = MultiLabelEstimator.load(out / "model.npz")
    assert isinstance(model, RiskController) and model.random_state == 2 and model.top_k == 5
    assert record["calibration_rows"] == round(0.25 * train.n_samples) == model.calibration_rows_.size
    assert (record["risk"], record["method"], record["delta"]) == ("recall", "crc", 0.1)
    assert record["alpha"] == pytest.approx(0.2) and record["threshold"] == model.threshold_
    # the test figures, recomputed from the saved model's probabilities
    test_data = read_dataset(tmp_path / "test.txt")
    proba = model.predict_proba(test_data.X)
    top = np.argsort(-proba, axis=1, kind="stable")[:, :5]
    in_set = np.zeros(proba.shape, dtype=bool)
    in_set[np.arange(proba.shape[0])[:, None], top] = np.take_along_axis(proba, top, axis=1) >= model.threshold_
    truth = test_data.Y.toarray() > 0
    n_true = truth.sum(axis=1)
    missed = np.where(n_true > 0, (truth & ~in_set).sum(axis=1) / np.maximum(n_true, 1), 0.0)
    assert record["realised_risk"] == pytest.approx(missed.mean())
    assert record["mean_set_size"] == pytest.approx(in_set.sum(axis=1).mean())
    assert record["coverage"] == pytest.approx(in_set.any(axis=1).mean())
    # predict prints each row's set, best first
    assert main(["predict", "--model-dir", str(out), "--input", str(tmp_path / "test.txt"), "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == test_data.n_samples
    for row, line in enumerate(lines):
        shown = json.loads(line)
        assert sorted(shown["labels"]) == sorted(np.flatnonzero(in_set[row]).tolist())
        assert shown["probabilities"] == sorted(shown["probabilities"], reverse=True)


@pytest.mark.parametrize("value, message", [
    ("foo=0.9", "give RISK=TARGET with RISK one of recall, precision, selective"),
    ("recall", "give RISK=TARGET"),
    ("precision=x", "TARGET must be a number"),
    ("selective=1", "must lie strictly between 0 and 1"),
])
def test_bad_risk_values_are_one_line_errors(tmp_path, capsys, value, message):
    with pytest.raises(SystemExit) as exited:  # argparse's error: exit status 2
        main(["train", "--model", "logistic", "--train", str(tmp_path / "none.txt"), "--risk", value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "--risk" in err and len(err.strip().splitlines()) == 1
