"""Cases that used to pass in silence: logistic regression stopping at ``max_iter``, ``train``
without ``--out``, and the order of labels tied by an isotonic calibration map."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest
from conftest import linear_multilabel_problem
from sklearn.exceptions import ConvergenceWarning

from bayesmlc.calibration import CalibratedClassifier
from bayesmlc.cli import main
from bayesmlc.linear import LogisticRegression


def _fit_recording_warnings(model, X, Y):
    """The ConvergenceWarnings of ``model.fit(X, Y)``; each must point at the line of that call."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        model.fit(X, Y)
    caught = [w for w in caught if issubclass(w.category, ConvergenceWarning)]
    assert all((w.filename, w.lineno) == (__file__, line) for w in caught)
    return caught


def test_logistic_regression_warns_when_it_stops_at_max_iter():
    X, Y = linear_multilabel_problem(n=200, d=20, n_labels=4, seed=1)
    stopped = LogisticRegression(C=100.0, max_iter=3)
    (warning,) = _fit_recording_warnings(stopped, X, Y)  # one warning for the fit, not one per label
    assert stopped.n_iter_ == 3
    assert "max_iter=3" in str(warning.message) and "4 of 4 labels" in str(warning.message)
    # a solver given room converges before max_iter (its own count says so) and is silent
    converged = LogisticRegression(C=1.0, max_iter=500, tol=1e-4)
    assert _fit_recording_warnings(converged, X, Y) == [] and converged.n_iter_ < 500


@pytest.fixture
def train_file(tmp_path):
    X, Y = linear_multilabel_problem(n=60, d=8, n_labels=3, seed=2)
    X = X.toarray()
    lines = [f"{X.shape[0]} {X.shape[1]} {Y.shape[1]}"]
    for x, y in zip(X, Y):
        lines.append(",".join(map(str, np.flatnonzero(y))) + " "
                     + " ".join(f"{j}:{x[j]:.4f}" for j in np.flatnonzero(x)))
    path = tmp_path / "train.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_train_without_out_says_the_model_is_not_kept(train_file, tmp_path, capsys):
    train = ["train", "--model", "logistic", "--train", str(train_file), "--set", "max_iter=500", "--set", "tol=1e-4"]
    assert main(train) == 0
    captured = capsys.readouterr()
    notes = [line for line in captured.err.splitlines() if "not kept" in line]
    assert notes == ["the model is not kept: give --out DIR to save it"]
    assert captured.out.startswith("trained in")
    assert main(train + ["--out", str(tmp_path / "run")]) == 0
    assert "not kept" not in capsys.readouterr().err and (tmp_path / "run" / "model.npz").exists()
    assert main(train + ["--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_labels_tied_by_the_isotonic_map_keep_the_raw_score_order():
    """The documented tie order (bayesmlc.calibration, "Ties"): predict_topk lists labels that share a
    calibrated probability in the order of the wrapped estimator's scores; predict_proba(top_k=)
    ranks by the calibrated value, ties to the lower label index."""
    X, Y = linear_multilabel_problem(n=400, d=15, n_labels=12, seed=3)
    model = CalibratedClassifier(LogisticRegression(max_iter=500, tol=1e-4), method="isotonic", random_state=0)
    model.fit(X, Y)
    raw = model.decision_function(X)
    calibrated = model.predict_proba(X)
    indices, _ = model.predict_topk(X, 12)
    ties = 0
    for row in range(X.shape[0]):
        order = indices[row]
        # the listed order is the raw scores' (descending; equal scores to the lower index)
        assert np.all(np.diff(raw[row, order]) <= 0)
        ties += int(np.sum(np.diff(calibrated[row, order]) == 0))
    assert ties > 100  # the map ties many neighbours, so the check above is not vacuous
    # predict_proba(top_k=k) keeps the k highest calibrated values, ties to the lower label index
    top = model.predict_proba(X, top_k=3)
    for row in range(X.shape[0]):
        expected = sorted(range(12), key=lambda label: (-calibrated[row, label], label))[:3]
        kept = top.indices[top.indptr[row]:top.indptr[row + 1]]
        assert sorted(kept) == sorted(expected)
