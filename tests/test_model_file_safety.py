"""A model file is data: loading it never imports a module it names, and never writes outside a
private temporary folder (issue: hardening, point 1)."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest

from bayesmlc import ModelFormatError
from bayesmlc.base import MultiLabelEstimator
from bayesmlc.baselines import KNNBaseline, _FileBackedModel, _is_plain_file_name
from bayesmlc.models import LOADABLE_CLASSES, MODEL_CLASSES, get_model_class


def _rewrite_meta(path, edit):
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(arrays["__meta__"].tobytes())
    edit(meta, arrays)
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(path, **arrays)


@pytest.fixture
def saved_knn(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.random((20, 4))
    Y = (rng.random((20, 3)) < 0.4).astype(np.int8)
    Y[0] = 1
    path = tmp_path / "model.npz"
    KNNBaseline().fit(X, Y).save(path)
    return path


def test_a_module_named_by_the_file_is_never_imported(saved_knn, tmp_path, monkeypatch):
    # a module beside the working directory that records its import
    marker = tmp_path / "imported.txt"
    (tmp_path / "evilmod_for_test.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\nclass Model: pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)

    def edit(meta, arrays):
        meta["class"] = "evilmod_for_test:Model"

    _rewrite_meta(saved_knn, edit)
    with pytest.raises(ModelFormatError, match="evilmod_for_test:Model is not a bayesmlc estimator class"):
        MultiLabelEstimator.load(saved_knn)
    assert not marker.exists()
    assert "evilmod_for_test" not in sys.modules


def test_a_nested_estimator_naming_a_foreign_module_is_refused_before_import(saved_knn, monkeypatch):
    def edit(meta, arrays):
        meta["class"] = "bayesmlc.ensemble:AveragingEnsemble"
        meta["format_version"] = 2
        meta["params"] = {
            "estimators": [["a", {"__estimator__": "json:JSONDecoder", "params": {}, "state": None}]],
            "weights": None,
            "random_state": None,
        }
        meta["state"] = None

    _rewrite_meta(saved_knn, edit)
    import importlib

    calls = []
    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: calls.append(name) or real(name, *a))
    with pytest.raises(ModelFormatError, match="json:JSONDecoder is not a bayesmlc estimator class"):
        MultiLabelEstimator.load(saved_knn)
    assert "json" not in calls


@pytest.mark.parametrize("name", ["../escape.txt", "/tmp/abs.txt", "a/b", "..", ".", "", "x\0y", "a\\b"])
def test_file_backed_model_refuses_names_that_leave_its_folder(name, tmp_path):
    assert not _is_plain_file_name(name)

    class Probe(_FileBackedModel):
        def _load_from(self, folder):  # pragma: no cover - never reached
            raise AssertionError("must not unpack")

    model = Probe()
    with pytest.raises(ModelFormatError, match="not a plain file name"):
        model._set_state({"n_labels_": 2, "model_files_": {name: np.zeros(3, dtype=np.uint8)}})


def test_crafted_baseline_file_is_refused_at_load_and_writes_nothing(saved_knn, tmp_path):
    target = tmp_path / "outside" / "pwned.pth"

    def edit(meta, arrays):
        meta["class"] = "bayesmlc.baselines:OmikujiParabel"
        arrays["model.state.model_files_.x#99"] = np.frombuffer(b"import os", dtype=np.uint8)
        meta["state"] = {"n_labels_": 3, "n_features_in_": 4,
                         "model_files_": {str(target): {"__array__": "model.state.model_files_.x#99"}}}
        meta["params"] = {}

    _rewrite_meta(saved_knn, edit)
    with pytest.raises(ModelFormatError, match="not a plain file name"):
        MultiLabelEstimator.load(saved_knn)
    assert not target.exists()
    assert not target.parent.exists()


def test_plain_names_are_accepted():
    for name in ["model.bin", "tree_0.txt", ".hidden", "a..b"]:
        assert _is_plain_file_name(name)


def test_every_registered_model_class_is_loadable_and_nothing_else():
    for name in MODEL_CLASSES:
        try:
            cls = get_model_class(name)
        except Exception:  # optional extra not installed: its class path is still on the list
            continue
        assert f"{cls.__module__}:{cls.__name__}" in LOADABLE_CLASSES
    from bayesmlc.ensemble import AveragingEnsemble

    assert f"{AveragingEnsemble.__module__}:AveragingEnsemble" in LOADABLE_CLASSES
    assert all(path.startswith("bayesmlc.") for path in LOADABLE_CLASSES)


def test_a_file_naming_the_baselines_old_module_loads_as_the_moved_class(saved_knn, tmp_path):
    # files saved while the baselines lived in bayesmlc.bench name them "bayesmlc.bench.baselines:X"
    def edit(meta, arrays):
        assert meta["class"] == "bayesmlc.baselines:KNNBaseline"
        meta["class"] = "bayesmlc.bench.baselines:KNNBaseline"

    X = np.random.default_rng(1).random((6, 4))
    expected = KNNBaseline.load(saved_knn).decision_function(X)
    _rewrite_meta(saved_knn, edit)
    model = MultiLabelEstimator.load(saved_knn)
    assert type(model) is KNNBaseline
    np.testing.assert_array_equal(model.decision_function(X), expected)
    # saved again, it names the class where it lives now
    model.save(tmp_path / "again.npz")
    with np.load(tmp_path / "again.npz") as data:
        assert json.loads(data["__meta__"].tobytes())["class"] == "bayesmlc.baselines:KNNBaseline"


def _refused_at_load(model, tmp_path, field, value, message):
    """``model`` fitted on a small problem and saved loads; with its state's ``field`` set to ``value``
    in the file, loading raises ModelFormatError naming the file and ``message``."""
    rng = np.random.default_rng(0)
    X, Y = rng.random((60, 5)), (rng.random((60, 3)) < 0.4).astype(np.int8)
    Y[:, 0] = 1
    path = tmp_path / "model.npz"
    model.fit(X, Y).save(path)
    MultiLabelEstimator.load(path)  # the file as written loads

    def edit(meta, arrays):
        meta["state"][field] = value

    _rewrite_meta(path, edit)
    with pytest.raises(ModelFormatError, match=re.escape(f"{path}: ") + message):
        MultiLabelEstimator.load(path)


@pytest.mark.parametrize("field, value, message", [
    ("top_label_runner_up_", "x", "top_label_runner_up_ must be a finite number, got 'x'"),
    ("next_labels_slope_", [1, 2], "next_labels_slope_ must be a finite number"),
    ("second_label_offset_", None, "second_label_offset_ must be a finite number, got 'None'"),
    ("top_label_offset_", -1.0, "top_label_offset_ must be >= 0"),
    ("threshold_", "x", "threshold_ must be a finite number >= 0, got 'x'"),
    ("label_count_std_", -2.0, "label_count_std_ must be a finite number >= 0, got '-2.0'"),
    ("count_rule_", "evil", "count_rule_ must be one of threshold, count, expected, sample, got 'evil'"),
])
def test_bnmc_calibration_and_label_set_fields_of_a_crafted_file_are_refused_at_load(tmp_path, field, value, message):
    from bayesmlc.bnmc import BNMC

    _refused_at_load(BNMC(n_passes=1, random_state=0, device="cpu"), tmp_path, field, value, message)


@pytest.mark.parametrize("field, value, message", [
    ("kernel_", "evil", "kernel_ must be one of linear, se, linear\\+se, got 'evil'"),
    ("n_latent_", 0, "n_latent_ must be an integer >= 1, got '0'"),
    ("n_latent_", "3", "n_latent_ must be an integer >= 1, got '3'"),
    ("jitter_", "x", "jitter_ must be a finite number >= 0, got 'x'"),
])
def test_mlgpf_structure_of_a_crafted_file_is_refused_at_load(tmp_path, field, value, message):
    from bayesmlc.gp import MLGPF

    model = MLGPF(n_inducing=8, subspace_rank=5, epochs=1, random_state=0, device="cpu")
    _refused_at_load(model, tmp_path, field, value, message)
