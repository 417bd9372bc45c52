"""benchmarks/probe_kernel_ridge.py: its arc-cosine kernel against a Monte Carlo ReLU network, its ridge
against scikit-learn's KernelRidge, and the script end to end on a small written data set."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "probe_kernel_ridge.py"


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("probe_kernel_ridge", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_arc_cosine_kernel_is_twice_the_mean_product_of_relu_units(probe):
    """Cho and Saul (2009): k1(x, y) = 2 E_w[max(0, w.x) max(0, w.y)], w ~ N(0, I)."""
    rng = np.random.default_rng(0)
    points = rng.standard_normal((4, 3))
    points[3] = -points[0]  # opposite directions: k1 = 0
    norms = np.linalg.norm(points, axis=1)
    exact = probe._arc_cosine(points @ points.T, norms, norms)
    draws = rng.standard_normal((400_000, 3))
    units = np.maximum(draws @ points.T, 0.0)
    estimate = 2.0 * units.T @ units / len(draws)
    standard_error = 2.0 * np.sqrt(np.var(units[:, :, None] * units[:, None, :], axis=0) / len(draws))
    assert np.all(np.abs(estimate - exact) <= 5 * standard_error + 1e-12)
    assert exact[0, 3] == pytest.approx(0.0, abs=1e-12)
    np.testing.assert_allclose(np.diag(exact), norms**2, rtol=1e-12)  # k1(x, x) = |x|^2


def test_ridge_weights_give_scikit_learn_kernel_ridge_predictions(probe):
    from sklearn.kernel_ridge import KernelRidge

    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((30, 5)), rng.standard_normal((7, 5))
    Y = (rng.random((30, 4)) < 0.3).astype(float)
    K, K_held = np.exp(-0.5 * ((A[:, None] - A[None]) ** 2).sum(-1)), np.exp(-0.5 * ((B[:, None] - A[None]) ** 2).sum(-1))
    reference = KernelRidge(alpha=0.7, kernel="precomputed").fit(K, Y - Y.mean(0)).predict(K_held) + Y.mean(0)
    scores = K_held @ probe.ridge_weights(K, Y, 0.7) + Y.mean(0)
    np.testing.assert_allclose(scores, reference, rtol=1e-8, atol=1e-10)


def test_script_end_to_end_on_a_written_set(probe, tmp_path, capsys):
    from bayesmlc.data.io import write_dataset
    from bayesmlc.data.synthetic import make_multilabel

    data = make_multilabel(120, 30, 6, random_state=0)
    write_dataset(data, tmp_path / "train.txt")
    probe.main(["--train", str(tmp_path / "train.txt"), "--nystroem", "8", "--rank", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines[:2]] == ["linear", "se"]
    assert any(line.startswith("nystroem se l=1 M=8") for line in lines)
    assert sum(line.strip().startswith("output rank 2") for line in lines) == 1
    assert len(lines) == 4 + 1 + 1  # four exact kernels, one rank, one Nystroem
