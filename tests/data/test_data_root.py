"""One data root: bayesmlc.data.registry.data_home resolves it for the registry and the benchmark
harness, from the argument, $BAYESMLC_DATA, the harness's former $BAYESMLC_SHARED_DATASETS (with a
DeprecationWarning), or ~/.cache/bayesmlc, in that order."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from bayesmlc.bench.runner import plan_runs
from bayesmlc.bench.suites import DatasetSpec, ModelConfig, Suite
from bayesmlc.data.registry import data_home


@pytest.fixture
def no_variables(monkeypatch):
    monkeypatch.delenv("BAYESMLC_DATA", raising=False)
    monkeypatch.delenv("BAYESMLC_SHARED_DATASETS", raising=False)
    return monkeypatch


def test_the_data_root_precedence(no_variables, tmp_path):
    monkeypatch = no_variables
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert data_home() == tmp_path / "home" / ".cache" / "bayesmlc"
        monkeypatch.setenv("BAYESMLC_DATA", str(tmp_path / "data"))
        monkeypatch.setenv("BAYESMLC_SHARED_DATASETS", str(tmp_path / "former"))
        assert data_home() == tmp_path / "data"  # the documented variable wins, silently
        assert data_home(tmp_path / "given") == tmp_path / "given"
    monkeypatch.delenv("BAYESMLC_DATA")
    with pytest.warns(DeprecationWarning, match=r"BAYESMLC_SHARED_DATASETS is deprecated: set \$BAYESMLC_DATA"):
        assert data_home() == tmp_path / "former"


def test_the_harness_reads_real_sets_from_the_data_root(no_variables, tmp_path):
    suite = Suite("one", "one set", (DatasetSpec("alpha"),), (ModelConfig("logistic", "default", {}),))
    no_variables.setenv("BAYESMLC_DATA", str(tmp_path / "data"))
    (run,) = plan_runs(suite, tmp_path / "out")
    assert Path(run.train_path).parent == tmp_path / "data" / "alpha"
    (run,) = plan_runs(suite, tmp_path / "out", data_root=tmp_path / "elsewhere")
    assert Path(run.train_path).parent == tmp_path / "elsewhere" / "alpha"
