"""benchmarks/bench_bnmc.py ``scale`` end to end at a tiny shape on the CPU: the ``--device`` option reaches
BNMC in the forked child, and the table gains a GPU memory column only when a CUDA device was used."""

import importlib.util
from pathlib import Path

import pytest

from bayesmlc.data.synthetic import make_train_test

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_bnmc.py"
FAST = ["--set", "n_passes=1", "--set", "n_mode_steps=2", "--set", "n_sweeps=1", "--set", "n_keep=1"]


@pytest.fixture
def bench(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_bnmc", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # a tiny synthetic set in place of the preset shapes (the child is forked: the patch reaches it)
    monkeypatch.setattr(module, "_scale_data",
                        lambda name: make_train_test(160, 40, 8, random_state=0, test_fraction=0.25))
    return module


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_scale_with_device_option(bench, device, capsys):
    bench.main(["scale", "--sets", "tiny", "--no-parabel", "--threads", "1", "--device", device, *FAST])
    out = capsys.readouterr().out
    assert f"BNMC at scale, BNMC device {device}" in out
    rows = [line for line in out.splitlines() if line.startswith("| tiny |")]
    assert len(rows) == 1 and rows[0].split("|")[3].strip() == "bnmc"
    if "'device': 'cpu'" in out:  # "auto" on a machine without CUDA: the CPU, and no GPU column
        assert "peak GPU" not in out and len(rows[0].split("|")) == 14
    else:
        assert "peak GPU GB (allocated, reserved)" in out and len(rows[0].split("|")) == 15


def test_device_default_is_the_cpu_and_set_overrides_it(bench, monkeypatch):
    seen = []
    monkeypatch.setattr(bench, "cmd_scale", lambda args, params: seen.append(params["device"]))
    bench.main(["scale"])
    bench.main(["scale", "--device", "auto", "--set", "device=cpu"])
    assert seen == ["cpu", "cpu"]
