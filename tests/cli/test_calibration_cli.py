"""``bayesmlc train --calibrate``: the wrapped model is trained, saved and scored with the top-k figures."""

from __future__ import annotations

import json

import numpy as np

from bayesmlc import metrics as M
from bayesmlc.base import MultiLabelEstimator
from bayesmlc.calibration import CalibratedClassifier
from bayesmlc.cli import main
from bayesmlc.data.io import read_dataset
from bayesmlc.data.synthetic import make_multilabel, split
from bayesmlc.data.io import write_dataset


def test_train_with_calibrate_saves_and_scores_the_calibrated_model(tmp_path, capsys):
    data = make_multilabel(300, 40, 6, random_state=0)
    train, test = split(data, 0.3, random_state=0)
    write_dataset(train, tmp_path / "train.txt")
    write_dataset(test, tmp_path / "test.txt")
    out = tmp_path / "run"
    code = main(["train", "--model", "logistic", "--train", str(tmp_path / "train.txt"), "--test",
                 str(tmp_path / "test.txt"), "--calibrate", "platt", "--set", "device='cpu'", "--out", str(out),
                 "--json", "--quiet", "--seed", "3"])
    assert code == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    model = MultiLabelEstimator.load(out / "model.npz")
    assert isinstance(model, CalibratedClassifier) and model.method == "platt" and model.random_state == 3
    test_data = read_dataset(tmp_path / "test.txt")
    proba, scores = model.predict_proba(test_data.X), model.decision_function(test_data.X)
    for key, value in (("ECE@1", M.ece_at_k(test_data.Y, proba, 1, scores=scores)),
                       ("ECE@5", M.ece_at_k(test_data.Y, proba, 5, scores=scores)),
                       ("Brier@3", M.brier_at_k(test_data.Y, proba, 3, scores=scores)),
                       ("AURC", M.aurc(test_data.Y, proba, scores=scores))):
        assert np.isclose(record["metrics"][key], value, atol=1e-9), key
    curves = json.loads((out / "reliability.json").read_text())
    assert sum(curves["top1"]["counts"]) == test_data.n_samples
    assert sum(curves["top5"]["counts"]) == 5 * test_data.n_samples
    assert curves["risk_coverage"]["coverage"][-1] == 1.0


def test_calibration_folds_cross_fit_the_maps_and_train_on_every_row(tmp_path, capsys):
    data = make_multilabel(300, 40, 6, random_state=0)
    write_dataset(data, tmp_path / "train.txt")
    out = tmp_path / "run"
    train = ["train", "--model", "logistic", "--train", str(tmp_path / "train.txt"), "--set", "device='cpu'",
             "--quiet", "--seed", "1"]
    assert main(train + ["--calibrate", "isotonic", "--calibration-folds", "3", "--out", str(out)]) == 0
    model = MultiLabelEstimator.load(out / "model.npz")
    assert isinstance(model, CalibratedClassifier) and model.cv == 3
    np.testing.assert_array_equal(model.calibration_rows_, np.arange(300))
    capsys.readouterr()
    for extra, message in ((["--calibration-folds", "3"], "--calibration-folds: only with --calibrate"),
                           (["--calibrate", "platt", "--calibration-folds", "1"], "needs at least 2 folds, got 1")):
        assert main(train + extra) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
