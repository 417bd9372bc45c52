"""``bench --risk-control``: the record of a model's test-set candidates against direct dense
computations, and the report's table."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from bayesmlc.bench.report import render_report
from bayesmlc.bench.risk import N_SPLITS, overview, risk_control_summary
from bayesmlc.metrics import ece_at_k
from bayesmlc.risk_control import crc


def simulated(n=400, n_labels=12, seed=0):
    rng = np.random.default_rng(seed)
    proba = 1 / (1 + np.exp(-(rng.normal(-1.5, 1.8, size=(n, n_labels)) + rng.normal(0, 0.8, size=(n, 1)))))
    Y = (rng.random((n, n_labels)) < proba).astype(np.float32)
    return proba, Y


def test_summary_matches_dense_recomputation():
    proba, Y = simulated()
    labels = np.argsort(-proba, axis=1, kind="stable")
    top = np.take_along_axis(proba, labels, axis=1)
    result = risk_control_summary(labels, top, sp.csr_matrix(Y), random_state=0)
    assert result["recall"]["n_splits"] == N_SPLITS
    # the recall splits again, by hand: same seeded halves, CRC on one half, dense recall loss on the other
    rng = np.random.default_rng(0)
    from bayesmlc.risk_control import candidates_from_topk

    candidates = candidates_from_topk(labels, top, sp.csr_matrix(Y))
    risks, sizes = [], []
    for _ in range(N_SPLITS):
        order = rng.permutation(len(proba))
        calibration, test = order[:200], order[200:]
        threshold = crc(candidates.take(calibration), 0.1).threshold
        in_set = proba[test] >= threshold
        truth = Y[test] > 0
        n_true = truth.sum(axis=1)
        risks.append(np.where(n_true > 0, (truth & ~in_set).sum(axis=1) / np.maximum(n_true, 1), 0).mean())
        sizes.append(in_set.sum(axis=1).mean())
    assert result["recall"]["realised_risk"] == pytest.approx(np.mean(risks))
    assert result["recall"]["mean_set_size"] == pytest.approx(np.mean(sizes))
    assert result["recall"]["violations"] == pytest.approx(np.mean(np.array(risks) > 0.1))
    assert result["ECE@1"]["measured"] == pytest.approx(ece_at_k(Y, proba, 1))
    low, middle, high = result["ECE@5"]["floor"]
    assert 0 <= low <= middle <= high < 0.2
    for risk in ("precision", "selective"):
        assert set(result[risk]) >= {"realised_risk", "mean_set_size", "coverage", "feasible", "violations"}


def test_report_shows_the_table_and_the_overview():
    proba, Y = simulated()
    rng = np.random.default_rng(1)
    records = []
    for model, noise in (("logistic", 0.0), ("knn", 0.6)):
        # knn: the truth's probabilities blurred, so its ranking is worse and its sets larger
        scores = np.clip(proba * np.exp(noise * rng.normal(size=proba.shape)), 0, 1)
        labels = np.argsort(-scores, axis=1, kind="stable")
        top = np.take_along_axis(scores, labels, axis=1)
        records.append({"suite": "quick", "run_id": f"d/{model}", "dataset": "d", "model": model, "config": "default",
                        "status": "ok", "metrics": {}, "risk_control": risk_control_summary(labels, top,
                                                                                            sp.csr_matrix(Y))})
    report = render_report(records, suite="quick")
    assert "Label sets with guarantees" in report and "| logistic (default) |" in report
    sizes = {r["model"]: r["risk_control"]["recall"]["mean_set_size"] for r in records}
    assert sizes["logistic"] < sizes["knn"]
    assert f"**{sizes['logistic']:.4f}**" in report
    table = overview(records)
    assert "Mean set size at recall >= 0.9" in table and "| d |" in table
