"""Names given to one concept each (BMLS's ``n_draws``, BNMC's ``evidence_weights_``): model files
written under the earlier names load with the same predictions, and BMLS's earlier parameter name
is still accepted, with a FutureWarning."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from bayesmlc import BMLS, BNMC
from bayesmlc.base import MultiLabelEstimator
from bayesmlc.data.synthetic import make_multilabel
from bayesmlc.persistence import current_names


@pytest.fixture(scope="module")
def data():
    dataset = make_multilabel(80, 30, 6, random_state=2)
    return dataset.X, dataset.Y


def _rewrite_meta(path, change) -> None:
    """Apply ``change`` to the JSON record of the model file ``path``, as an older bayesmlc wrote it."""
    with np.load(path) as archive:
        arrays = {key: archive[key] for key in archive.files}
    meta = json.loads(arrays["__meta__"].tobytes().decode("utf-8"))
    change(meta)
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    np.savez(path, **arrays)


def test_current_names_renames_only_what_the_file_lacks():
    renamed = {"n_samples": "n_draws"}
    assert current_names({"n_samples": 5, "thin": 2}, renamed) == {"n_draws": 5, "thin": 2}
    # a file of the current version holds both (the deprecated parameter keeps its value)
    assert current_names({"n_samples": "deprecated", "n_draws": 5}, renamed) == {"n_samples": "deprecated",
                                                                                 "n_draws": 5}
    assert current_names({"a": 1}, {}) == {"a": 1}


def test_bmls_n_samples_is_the_deprecated_name_of_n_draws(data):
    X, Y = data
    params = dict(n_topics=3, schedule="fixed", n_burnin=4, thin=2, random_state=0)
    with pytest.warns(FutureWarning, match="n_samples was renamed n_draws"):
        old = BMLS(n_samples=3, **params).fit(X, Y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        new = BMLS(n_draws=3, **params).fit(X, Y)
    assert old.phi_samples_.shape[0] == new.phi_samples_.shape[0] == 3
    np.testing.assert_array_equal(old.predict_proba(X), new.predict_proba(X))
    assert new.n_samples == "deprecated" and BMLS().n_draws == 250


def test_a_bmls_file_naming_n_samples_loads_with_it_as_n_draws(data, tmp_path):
    X, Y = data
    model = BMLS(n_topics=3, schedule="fixed", n_burnin=4, n_draws=3, thin=2, random_state=0).fit(X, Y)
    path = tmp_path / "bmls.npz"
    model.save(path)

    def as_written_before_the_rename(meta):
        params = meta["params"]
        del params["n_samples"]  # the deprecated entry the current version writes
        params["n_samples"] = params.pop("n_draws")

    _rewrite_meta(path, as_written_before_the_rename)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        loaded = MultiLabelEstimator.load(path)
    assert loaded.n_draws == 3 and loaded.n_samples == "deprecated"
    np.testing.assert_array_equal(loaded.predict_proba(X), model.predict_proba(X))


def test_a_bnmc_file_naming_calibration_loads_it_as_evidence_weights(data, tmp_path):
    X, Y = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = BNMC(truncation=3, n_passes=1, random_state=0).fit(X, Y)
    path = tmp_path / "bnmc.npz"
    model.save(path)

    def as_written_before_the_rename(meta):
        state = meta["state"]
        state["calibration_"] = state.pop("evidence_weights_")
        state["probability_calibration_"] = state.pop("probability_evidence_weights_")

    _rewrite_meta(path, as_written_before_the_rename)
    loaded = MultiLabelEstimator.load(path)
    np.testing.assert_array_equal(loaded.evidence_weights_, model.evidence_weights_)
    np.testing.assert_array_equal(loaded.probability_evidence_weights_, model.probability_evidence_weights_)
    assert not hasattr(loaded, "calibration_")
    np.testing.assert_array_equal(loaded.predict_proba(X), model.predict_proba(X))
    np.testing.assert_array_equal(loaded.decision_function(X), model.decision_function(X))
