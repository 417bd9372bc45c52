"""benchmarks/bench_mlgpf_epoch.py and bench_mlgpf_scale.py end to end at a tiny shape on the CPU: the
``--device`` option, the device helpers of bench_mlgpf.py, and the scale benchmark without omikuji."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from bayesmlc import baselines

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def scripts():
    """The two scripts (and bench_mlgpf, which they import) loaded as modules."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        loaded = {}
        for name in ("bench_mlgpf", "bench_mlgpf_epoch", "bench_mlgpf_scale"):
            spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            loaded[name] = module
        yield loaded
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_device_helpers_on_the_cpu(scripts):
    bench = scripts["bench_mlgpf"]
    assert bench.device_label("cpu") == "cpu"
    assert bench.peak_memory_rows("cpu") == []
    bench.synchronize("cpu")
    bench.reset_peak_memory(torch.device("cpu"))  # nothing to wait for or reset on the CPU


def test_epoch_benchmark_with_device_option(scripts, tmp_path, capsys):
    scripts["bench_mlgpf_epoch"].main(["--shape", "eurlex-4k:0.01", "--epochs", "2", "--threads", "1",
                                       "--device", "cpu", "--cache-dir", str(tmp_path), "--set", "n_inducing=16",
                                       "--set", "subspace_rank=20", "--set", "n_latent=8"])
    out = capsys.readouterr().out
    assert "device cpu" in out and "| epoch 2 s (wall) |" in out
    assert "GPU memory" not in out  # only on a CUDA device


def test_epoch_benchmark_split_path_with_device_option(scripts, tmp_path, capsys):
    device = "cpu" if torch.cuda.is_available() else "auto"  # "auto" resolves to the CPU without CUDA
    scripts["bench_mlgpf_epoch"].main(["--shape", "eurlex-4k:0.01", "--epochs", "1", "--threads", "1", "--split",
                                       "--device", device,
                                       "--cache-dir", str(tmp_path), "--set", "n_inducing=16",
                                       "--set", "subspace_rank=20", "--set", "n_latent=8"])
    out = capsys.readouterr().out
    assert "device cpu" in out and "| epoch 1 s (wall) |" in out and "| backward (all epochs) |" in out


def test_scale_benchmark_full_fit_without_omikuji(scripts, tmp_path, capsys, monkeypatch):
    real_find_spec = baselines.importlib.util.find_spec
    monkeypatch.setattr(baselines.importlib.util, "find_spec",
                        lambda name, *a: None if name == "omikuji" else real_find_spec(name, *a))
    scripts["bench_mlgpf_scale"].main(["--shapes", "eurlex-4k:0.01", "--families", "shared", "--steps", "1",
                                       "--full-fit", "--device", "cpu", "--cache-dir", str(tmp_path),
                                       "--set", "epochs=2", "--set", "n_inducing=16", "--set", "subspace_rank=20",
                                       "--set", "n_latent=8"])
    out = capsys.readouterr().out
    assert "no Parabel baseline: optional package 'omikuji' is not installed" in out
    assert "omikuji Parabel |" not in out
    rows = [line for line in out.splitlines() if line.startswith("| MLGPF default (shared, 2 epochs, cpu) |")]
    assert len(rows) == 1 and rows[0].split("|")[4].strip() == "-"  # no ratio to Parabel's time


def test_evaluation_benchmark_pools_blocks_into_the_dense_figures(capsys):
    """bench_evaluation's two parts on a small shape: the streamed figures equal the dense ones."""
    spec = importlib.util.spec_from_file_location("bench_evaluation", BENCHMARKS / "bench_evaluation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["compare", "--rows", "300", "--labels", "40", "--block", "70"])
    lines = capsys.readouterr().out.splitlines()
    dense, streamed = lines[-2].split(), lines[-1].split()
    assert dense[-4:-1] == streamed[-4:-1]  # P@1, ECE@1, AURC
    assert float(streamed[-1]) < 1e-12  # the largest difference of any figure
    module.main(["stream", "--rows", "300", "--labels", "40", "--block", "70"])
    assert "AUC_micro" in capsys.readouterr().out
