"""A model file is data: loading it never imports a module it names, and never writes outside a
private temporary folder (issue: hardening, point 1)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys

import numpy as np
import pytest

from bayesmlc import ModelFormatError, ValidationError
from bayesmlc.base import MultiLabelEstimator
from bayesmlc.baselines import KNNBaseline, _FileBackedModel, _is_plain_file_name
from bayesmlc.label_statistics import LabelStatistics
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
        MultiLabelEstimator.load(saved_knn, allow_native=True)
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


def _encoded(value, arrays, field):
    """``value`` as a model file's JSON holds it: an ndarray becomes a new entry of ``arrays``."""
    if isinstance(value, np.ndarray):
        key = f"model.state.{field}#crafted"
        arrays[key] = value
        return {"__array__": key}
    return value


def _refused_at_load(model, tmp_path, field, value, message):
    """``model`` fitted on a small problem (60 rows, 5 features, 3 labels) and saved loads and predicts
    as before saving; with its state's ``field`` (a key, or a path of keys into nested estimators'
    entries) set to ``value`` (JSON, or an ndarray stored as an entry) in the file, loading raises
    ModelFormatError, one line, naming the file and matching ``message``. Returns the file's path."""
    rng = np.random.default_rng(0)
    X, Y = rng.random((60, 5)), (rng.random((60, 3)) < 0.4).astype(np.int8)
    Y[:, 0] = 1
    path = tmp_path / "model.npz"
    model.fit(X, Y).save(path)
    X_new = rng.random((7, 5))
    loaded = MultiLabelEstimator.load(path, allow_native=True)  # the file as written loads, and predicts the same numbers
    np.testing.assert_allclose(loaded.predict_proba(X_new), model.predict_proba(X_new), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(loaded.decision_function(X_new), model.decision_function(X_new), rtol=1e-6, atol=1e-6)
    keys = (field,) if isinstance(field, str) else field

    def edit(meta, arrays):
        node = meta["state"]
        for key in keys[:-1]:
            node = node[key]
        assert keys[-1] in node, f"no field {keys[-1]!r} to craft in {sorted(node)}"
        node[keys[-1]] = _encoded(value, arrays, keys[-1])

    _rewrite_meta(path, edit)
    with pytest.raises(ModelFormatError, match=re.escape(f"{path}: ") + message) as refused:
        MultiLabelEstimator.load(path, allow_native=True)
    assert "\n" not in str(refused.value)
    return path


@pytest.mark.parametrize("field, value, message", [
    ("top_label_runner_up_", "x", "top_label_runner_up_ must be a finite number, got 'x'"),
    ("next_labels_slope_", [1, 2], "next_labels_slope_ must be a finite number"),
    ("second_label_offset_", None, "second_label_offset_ must be a finite number, got 'None'"),
    ("top_label_offset_", -1.0, "top_label_offset_ must be a finite number >= 0, got '-1.0'"),
    ("threshold_", "x", "threshold_ must be a finite number >= 0, got 'x'"),
    ("label_count_std_", -2.0, "label_count_std_ must be a finite number >= 0, got '-2.0'"),
    ("count_rule_", "evil", "count_rule_ must be one of threshold, count, expected, sample, got 'evil'"),
    ("classifier_", "auto", "classifier_ must be one of logistic, svm, got 'auto'"),
    ("top_label_map_", np.array([-1.0, 1.0, 0.0]), "top_label_map_ must be three finite numbers, the first two >= 0"),
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



def _needs(package):
    return pytest.mark.skipif(importlib.util.find_spec(package) is None,
                              reason=f"optional package {package} is not installed (the [compare] extra)")


def _build(class_path, **params):
    """An unfitted estimator of ``class_path`` small enough for a 60-row fit."""
    from bayesmlc.persistence import estimator_class

    cls = estimator_class(class_path)
    if class_path == "bayesmlc.calibration:CalibratedClassifier":
        return cls(estimator=_build("bayesmlc.linear:LogisticRegression"), min_label_positives=5, random_state=0, **params)
    if class_path == "bayesmlc.risk_control.controller:RiskController":
        return cls(estimator=_build("bayesmlc.linear:LogisticRegression"), top_k=2, random_state=0, **params)
    if class_path == "bayesmlc.ensemble:AveragingEnsemble":
        return cls([("lr", _build("bayesmlc.linear:LogisticRegression")), ("knn", _build("bayesmlc.baselines:KNNBaseline"))],
                   **params)
    small = {
        "bayesmlc.bmls.model:BMLS": dict(n_topics=4, max_sweeps=40, random_state=0, device="cpu"),
        "bayesmlc.bnmc.model:BNMC": dict(n_passes=1, random_state=0, device="cpu"),
        "bayesmlc.gp.model:MLGPF": dict(n_inducing=8, subspace_rank=5, epochs=1, random_state=0, device="cpu"),
        "bayesmlc.baselines:NapkinXCPLT": dict(n_threads=1, random_state=0),
        "bayesmlc.baselines:OmikujiParabel": dict(n_threads=1),
        "bayesmlc.baselines:OmikujiBonsai": dict(n_threads=1),
    }
    return cls(**{**small.get(class_path, {}), **params})


_F32 = np.float32
#: (class, scalar or array, field or path of keys, crafted value, the refusal's message): every class a
#: model file may name, each with a crafted scalar field and a crafted array
_CRAFTED = [
    ("bayesmlc.linear:LogisticRegression", "scalar", "n_iter_", "x", "n_iter_ must be an integer >= 0, got 'x'"),
    ("bayesmlc.linear:LogisticRegression", "array", "coef_", np.zeros((5, 2), _F32),
     "coef_ must be a float array of shape (5, 3), got a float32 array of shape (5, 2)"),
    ("bayesmlc.linear:LogisticRegression", "array", "intercept_", np.zeros(3, np.int64),
     "intercept_ must be a float array of shape (3,), got a int64 array"),
    ("bayesmlc.baselines:KNNBaseline", "scalar", "n_labels_", "3", "n_labels_ must be an integer >= 1, got '3'"),
    ("bayesmlc.baselines:KNNBaseline", "array", "label_prior_", np.full(2, 0.5), "label_prior_ must be a float array of shape (3,)"),
    ("bayesmlc.baselines:KNNBaseline", "array", "empty_labels_", np.array([7]), "empty_labels_ must lie in [0, 2]"),
    ("bayesmlc.baselines:KNNBaseline", "scalar", ("preprocessor_", "state", "n_features_in_"), 7,
     "FeaturePreprocessor mean_ must be a float array of shape (7,), got a float64 array of shape (5,)"),
    ("bayesmlc.baselines:KNNBaseline", "array", ("preprocessor_", "state", "scale_"), np.ones(4),
     "FeaturePreprocessor scale_ must be a float array of shape (5,), got a float64 array of shape (4,)"),
    ("bayesmlc.baselines:NapkinXCPLT", "scalar", "n_features_in_", 2.5, "n_features_in_ must be an integer >= 0, got '2.5'"),
    ("bayesmlc.baselines:NapkinXCPLT", "array", "label_frequencies_", np.zeros((3, 1), np.int64),
     "label_frequencies_ must be a integer array of shape (3,)"),
    ("bayesmlc.baselines:OmikujiParabel", "scalar", "n_labels_", 0, "n_labels_ must be an integer >= 1, got '0'"),
    ("bayesmlc.baselines:OmikujiParabel", "array", "label_prior_", np.full(3, 1.5), "label_prior_ must lie strictly between 0 and 1"),
    ("bayesmlc.baselines:OmikujiBonsai", "scalar", "model_files_", {}, "model_files_ must hold the library's model files"),
    ("bayesmlc.baselines:OmikujiBonsai", "array", "empty_labels_", np.zeros(1), "empty_labels_ must be a integer array"),
    ("bayesmlc.bmls.model:BMLS", "scalar", "predictor_", "evil", "predictor_ must be one of moments, draws, got 'evil'"),
    ("bayesmlc.bmls.model:BMLS", "scalar", "beta0_", "x", "beta0_ must be a finite number >= 0, got 'x'"),
    ("bayesmlc.bmls.model:BMLS", "scalar", "n_topics_", 7, "n_topics_ is 7 but phi_ holds 4 topics"),
    ("bayesmlc.bmls.model:BMLS", "array", "log_h_", np.zeros((5, 4)), "log_h_ must be a float array of shape (6, 4)"),
    ("bayesmlc.bmls.model:BMLS", "array", "feature_thresholds_", np.zeros(2), "feature_thresholds_ must be a float array of shape (5,)"),
    ("bayesmlc.bnmc.model:BNMC", "scalar", "n_features_in_", -1, "n_features_in_ must be an integer >= 0, got '-1'"),
    # fields every table declares (issue 32, point 6): each refused by name
    ("bayesmlc.bnmc.model:BNMC", "array", "classifier_samples_", np.zeros((2, 6, 2), _F32),
     "classifier_samples_ must be a float array of shape (*, *, 3), got a float32 array of shape (2, 6, 2)"),
    ("bayesmlc.gp.model:MLGPF", "scalar", "n_latent_", 4, "parameters_['Phi'] must be a float tensor of shape (3, 4), got shape (3, 3)"),
    ("bayesmlc.gp.model:MLGPF", "array", ("parameters_", "bias"), np.zeros(4, _F32),
     "parameters_['bias'] must be a float tensor of shape (3,), got shape (4,)"),
    ("bayesmlc.gp.model:MLGPF", "array", ("parameters_", "bias"), np.full(3, np.nan, _F32),
     "parameters_['bias'] must hold finite numbers (it holds NaN or infinity)"),
    ("bayesmlc.calibration:CalibratedClassifier", "scalar", "calibrated_labels_", [7], "calibrated_labels_ must lie in [0, 2]"),
    ("bayesmlc.calibration:CalibratedClassifier", "array", "global_map_", np.zeros((3, 4)),
     "global_map_ must be a float array of shape (2, *)"),
    ("bayesmlc.calibration:CalibratedClassifier", "array", ("estimator_", "state", "coef_"), np.zeros((4, 3), _F32),
     "estimator_: coef_ must be a float array of shape (5, 3)"),
    ("bayesmlc.ensemble:AveragingEnsemble", "scalar", ("estimators_", 0, "state", "n_iter_"), 1.5,
     "estimators_[0]: n_iter_ must be an integer >= 0, got '1.5'"),
    ("bayesmlc.ensemble:AveragingEnsemble", "array", "weights_", np.ones(3), "weights_ must be a float array of shape (2,)"),
    ("bayesmlc.risk_control.controller:RiskController", "scalar", "threshold_", 1.5,
     "threshold_ must be a number in [0, 1] or inf, got '1.5'"),
    ("bayesmlc.risk_control.controller:RiskController", "array", "calibration_rows_", np.zeros(2, _F32),
     "calibration_rows_ must be a integer array of shape (*,)"),
]
_OPTIONAL = {"bayesmlc.baselines:NapkinXCPLT": "napkinxc", "bayesmlc.baselines:OmikujiParabel": "omikuji",
             "bayesmlc.baselines:OmikujiBonsai": "omikuji"}


@pytest.mark.parametrize("class_path, kind, field, value, message", [
    pytest.param(*case, marks=[_needs(_OPTIONAL[case[0]])] if case[0] in _OPTIONAL else [],
                 id=f"{case[0].rpartition(':')[2]}-{case[2] if isinstance(case[2], str) else '.'.join(map(str, case[2]))}")
    for case in _CRAFTED])
@pytest.mark.filterwarnings("ignore:BMLS models binary features")
def test_a_crafted_field_of_every_model_is_refused_at_load(tmp_path, class_path, kind, field, value, message):
    _refused_at_load(_build(class_path), tmp_path, field, value, re.escape(message))


def test_every_loadable_class_has_a_crafted_scalar_and_array_case():
    covered = {(class_path, kind) for class_path, kind, *_ in _CRAFTED}
    covered |= {("bayesmlc.preprocessing:FeaturePreprocessor", kind) for kind in ("scalar", "array")}  # below
    assert {(path, kind) for path in set(LOADABLE_CLASSES.values()) for kind in ("scalar", "array")} <= covered


@pytest.mark.parametrize("field, value, message", [
    ("n_features_in_", "x", "FeaturePreprocessor n_features_in_ must be an integer >= 0, got 'x'"),
    ("scale_", np.ones((5, 1)), "FeaturePreprocessor scale_ must be a float array of shape (5,), got a float64 array of shape (5, 1)"),
])
def test_a_crafted_feature_preprocessor_file_is_refused_at_load(tmp_path, field, value, message):
    from bayesmlc.persistence import load_model, save_model
    from bayesmlc.preprocessing import FeaturePreprocessor

    X = np.random.default_rng(0).random((20, 5))
    path = tmp_path / "preprocessor.npz"
    save_model(path, FeaturePreprocessor(standardize=True).fit(X), "test")
    np.testing.assert_allclose(load_model(path).transform(X).toarray(),
                               FeaturePreprocessor(standardize=True).fit(X).transform(X).toarray(), rtol=1e-6)
    _rewrite_meta(path, lambda meta, arrays: meta["state"].__setitem__(field, _encoded(value, arrays, field)))
    with pytest.raises(ModelFormatError, match=re.escape(f"{path}: {message}")):
        load_model(path)


def test_the_cli_refuses_a_crafted_model_file_in_one_line_with_exit_two(tmp_path, capsys):
    from bayesmlc.cli import main

    rng = np.random.default_rng(0)
    lines = ["40 6 3"] + [f"{rng.integers(0, 3)} " + " ".join(f"{j}:1" for j in sorted(set(rng.integers(0, 6, 3).tolist())))
                          for _ in range(40)]
    data = tmp_path / "train.txt"
    data.write_text("\n".join(lines) + "\n")
    run = tmp_path / "run"
    assert main(["train", "--model", "logistic", "--train", str(data), "--out", str(run), "--quiet"]) == 0
    assert main(["predict", "--model-dir", str(run), "--input", str(data), "--quiet"]) == 0
    capsys.readouterr()
    for field, value, message in [("n_iter_", "x", "n_iter_ must be an integer >= 0, got 'x'"),
                                  ("coef_", np.zeros((6, 2), _F32), "coef_ must be a float array of shape (6, 3)")]:
        original = (run / "model.npz").read_bytes()
        _rewrite_meta(run / "model.npz", lambda meta, arrays: meta["state"].__setitem__(field, _encoded(value, arrays, field)))
        code = main(["predict", "--model-dir", str(run), "--input", str(data), "--quiet"])
        err = capsys.readouterr().err
        assert code == 2, err
        assert err.count("\n") == 1 and err.startswith(f"bayesmlc: error: {run / 'model.npz'}: {message}"), err
        (run / "model.npz").write_bytes(original)


class _Stub(MultiLabelEstimator):
    """Predicts whatever ``out`` says (the probe's output checks)."""

    def __init__(self, out=None):
        self.out = out

    def _decision_function(self, X):
        return np.zeros((X.shape[0], self.n_labels_), dtype=np.float32)

    def _predict_proba(self, X):
        out = np.asarray(self.out)
        return out[np.arange(X.shape[0]) % len(out)]  # its rows again and again: one per probe row


@pytest.mark.parametrize("out, message", [
    ([[0.5, 1.5], [0.1, 0.2]], r"probabilities in \[0.1, 1.5\], outside \[0, 1\]"),
    ([[0.5, np.nan], [0.1, 0.2]], "its probabilities are not all finite numbers"),
    ([[0.5, 0.1, 0.2], [0.1, 0.2, 0.3]], r"does not predict \(ValueError: _Stub computed an array of shape \(5, 3\) for 5 rows"),
    ([[0.5], [0.1]], r"does not predict \(ValueError: _Stub computed an array of shape \(5, 1\) for 5 rows"),  # not broadcast
])
def test_the_probe_refuses_probabilities_outside_zero_one_or_of_the_wrong_shape(out, message):
    from bayesmlc.fitted_state import probe_predictions

    model = _Stub(out)
    model.n_features_in_, model.n_labels_ = 3, 2
    model._set_label_statistics(LabelStatistics(np.array([1, 1]), np.array([3, 3])))
    with pytest.raises(ModelFormatError, match=message):
        model._check_loaded()
    model.out = [[0.5, 1.0], [0.0, 0.2]]
    model._check_loaded()  # in range: accepted


def test_the_probe_refuses_infinite_scores_of_every_row_but_the_row_of_ones():
    class InfiniteScores(_Stub):
        rows = slice(None)

        def _decision_function(self, X):
            scores = np.zeros((X.shape[0], self.n_labels_), dtype=np.float32)
            scores[self.rows] = np.inf
            return scores

    model = InfiniteScores([[0.5, 0.5], [0.5, 0.5]])
    model.n_features_in_, model.n_labels_ = 3, 2
    model._set_label_statistics(LabelStatistics(np.array([1, 1]), np.array([3, 3])))
    with pytest.raises(ModelFormatError, match="its scores are not all finite numbers"):
        model._check_loaded()
    model.rows = slice(1, 2)  # an overflow on the row of ones (unlike any training row) is accepted
    model._check_loaded()
    model.rows = slice(3, 4)  # one on a row like the training rows is not (issue 32, point 6)
    with pytest.raises(ModelFormatError, match="its scores are not all finite numbers"):
        model._check_loaded()


def test_the_probe_row_sets_every_feature_up_to_its_bound():
    from bayesmlc.fitted_state import PROBE_FEATURES, probe_rows

    narrow = probe_rows(7)
    assert narrow.shape == (5, 7) and narrow[0].nnz == 0 and narrow[1].toarray().tolist() == [[1.0] * 7]
    wide = probe_rows(10**6)
    assert wide.shape == (5, 10**6) and wide[0].nnz == 0 and wide[1].nnz == PROBE_FEATURES
    assert wide[1].indices[0] == 0 and wide[1].indices[-1] == 10**6 - 1


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_a_model_saved_for_a_device_this_machine_lacks_still_loads(tmp_path):
    rng = np.random.default_rng(0)
    X, Y = (rng.random((60, 5)) < 0.5).astype(float), (rng.random((60, 3)) < 0.4).astype(np.int8)
    Y[:, 0] = 1
    model = _build("bayesmlc.bmls.model:BMLS").fit(X, Y)
    expected = model.predict_proba(X)
    model.set_params(device="cuda").save(tmp_path / "model.npz")
    loaded = MultiLabelEstimator.load(tmp_path / "model.npz")
    with pytest.raises(ValidationError, match="CUDA is not available"):
        loaded.predict_proba(X)
    np.testing.assert_allclose(loaded.set_params(device="cpu").predict_proba(X), expected, rtol=1e-6)


@pytest.mark.parametrize("class_path", [
    "bayesmlc.linear:LogisticRegression", "bayesmlc.baselines:KNNBaseline", "bayesmlc.gp.model:MLGPF",
    "bayesmlc.bmls.model:BMLS", "bayesmlc.bnmc.model:BNMC", "bayesmlc.calibration:CalibratedClassifier",
    "bayesmlc.ensemble:AveragingEnsemble",
])
@pytest.mark.parametrize("entry", ["_check_loaded", "_check_fitted_state", "predict_proba", "Evil_", "n_labels"])
def test_a_state_entry_that_is_not_a_fitted_attribute_is_refused_at_load(tmp_path, class_path, entry):
    """Issue 32, point 5: a state entry named after a method (``"_check_loaded": null`` shadowed the
    load checks, and a BMLS covering 3 of 6 labels then predicted for all six) or any name that is
    not a fitted attribute is refused before anything is checked or predicted."""
    rng = np.random.default_rng(0)
    X, Y = rng.random((60, 5)), (rng.random((60, 3)) < 0.4).astype(np.int8)
    Y[:, 0] = 1
    path = tmp_path / "model.npz"
    _build(class_path).fit(X, Y).save(path)

    def edit(meta, arrays):
        meta["state"][entry] = None

    _rewrite_meta(path, edit)
    with pytest.raises(ModelFormatError, match=re.escape(f"{path}: the fitted state has an entry {entry!r} that is "
                                                         "not a fitted attribute")):
        MultiLabelEstimator.load(path)
