"""``bayesmlc bench --bands``: the label-frequency bands of real runs through the CLI (their sums are the
run's own metrics, each band checked against the saved model's scores by loops), and the report's
side-by-side table (medians over repeats, totals)."""

import numpy as np
import pytest
from conftest import write_dense_xc as _write_xc

from bayesmlc.bench.cli import main as bench_main
from bayesmlc.bench.report import render_report
from bayesmlc.bench.runner import read_results
from bayesmlc.bench.suites import SUITES, DatasetSpec, ModelConfig, Suite


def _cells(markdown: str, label: str) -> list[str]:
    line = next(line for line in markdown.splitlines() if line.startswith(f"| {label} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


@pytest.fixture
def skewed_toy(tmp_path, monkeypatch):
    """150 + 50 rows, 12 labels of very different frequencies, and a suite of two logistic configurations."""
    rng = np.random.default_rng(1)
    X = (rng.random((200, 15)) < 0.4) * rng.integers(1, 3, size=(200, 15))
    rates = np.linspace(0.6, 0.03, 12)
    Y = ((X @ rng.normal(size=(15, 12))) * 0.3 + rng.normal(size=(200, 12)) > np.quantile(
        rng.normal(size=10_000), 1 - rates)).astype(int)
    (tmp_path / "data" / "toy").mkdir(parents=True)
    _write_xc(tmp_path / "data" / "toy" / "train.txt", X[:150], Y[:150])
    _write_xc(tmp_path / "data" / "toy" / "test.txt", X[150:], Y[150:])
    suite = Suite("bands", "", (DatasetSpec("toy"),),
                  (ModelConfig("logistic", "c1", {"C": 1.0, "max_iter": 30}),
                   ModelConfig("logistic", "c01", {"C": 0.1, "max_iter": 30})), timeout_s=120)
    monkeypatch.setitem(SUITES, "bands", suite)
    return X, Y


def test_bands_of_real_runs_add_up_to_their_metrics_and_match_loops(tmp_path, skewed_toy):
    from bayesmlc.base import MultiLabelEstimator

    X, Y = skewed_toy
    out = tmp_path / "out"
    code = bench_main(["--suite", "bands", "--out", str(out), "--data-root", str(tmp_path / "data"),
                       "--threads", "1", "--quiet", "--no-plots", "--bands"])
    assert code == 0
    records = read_results(out / "results.jsonl")
    counts = Y[:150].sum(axis=0)
    band_of_label = np.empty(12, dtype=int)
    # ten bands of 12 labels, most frequent first (ties to the lower index): 2, 2, then 1 each
    band_of_label[sorted(range(12), key=lambda j: (-counts[j], j))] = [0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    for record in records:
        bands = record["bands"]
        assert bands["n_labels"] == [2, 2, 1, 1, 1, 1, 1, 1, 1, 1]
        for name in ("P@1", "P@5", "PSP@1", "PSP@5"):
            assert sum(bands["values"][name]) == pytest.approx(record["metrics"][name], rel=1e-9)
        scores = MultiLabelEstimator.load(out / record["run_dir"] / "model.npz").decision_function(X[150:].astype(float))
        p5, r5 = np.zeros(10), np.zeros(10)
        for y, s in zip(Y[150:], scores):
            for j in sorted(range(12), key=lambda j: (-s[j], j))[:5]:
                if y[j]:
                    p5[band_of_label[j]] += 1 / (5 * 50)
                    r5[band_of_label[j]] += 1 / (y.sum() * 50)
        np.testing.assert_allclose(bands["values"]["P@5"], p5, atol=1e-12)
        np.testing.assert_allclose(bands["values"]["R@5"], r5, atol=1e-12)
    report = (out / "report.md").read_text()
    assert "--bands" in report
    total = _cells(report, "all")
    # 4 fixed columns, then P@1 of c1 and c01 side by side
    assert total[4:6] == [f"{100 * r['metrics']['P@1']:.2f}" for r in records]
    assert _cells(report, "1")[1:3] == ["2", f"{sorted(counts)[-2]}-{counts.max()}"]


def test_band_table_shows_the_median_over_repeats_and_skips_runs_without_bands():
    def record(config, seed, p1_bands):
        bands = {"n_labels": [1, 1], "min_count": [9, 2], "max_count": [9, 2], "positive_share": [0.75, 0.25],
                 "values": {name: list(p1_bands) for name in ("P@1", "P@5", "PSP@1", "PSP@5", "R@5")}}
        return {"dataset": "toy", "model": "mlgpf", "config": config, "status": "ok", "repeat": seed, "seed": seed,
                "run_id": f"toy/mlgpf-{config}/r{seed}", "metrics": {"P@1": sum(p1_bands)}, "bands": bands}

    records = [record("a", 0, (0.5, 0.1)), record("a", 1, (0.7, 0.1)), record("a", 2, (0.6, 0.3)),
               record("b", 0, (0.2, 0.2))]
    records.append({**record("c", 0, (0.1, 0.1)), "bands": None, "bands_error": "ValueError: no model"})
    text = render_report(records, suite="tiny")
    header = _cells(text, "band")
    assert header[4:6] == ["P@1 mlgpf (a)", "P@1 mlgpf (b)"] and "P@1 mlgpf (c)" not in header
    assert _cells(text, "1")[:6] == ["1", "1", "9", "75.0", "60.00 ±10.00", "20.00"]
    assert _cells(text, "all")[4:6] == ["80.00 ±15.00", "40.00"]  # sums 0.6, 0.8, 0.9
