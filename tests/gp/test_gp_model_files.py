"""MLGPF model files round-trip for every kind of inducing input, with D, R and M all different (a
shape declared on the wrong axis passes only when they coincide)."""

import numpy as np
import pytest

import bayesmlc
from bayesmlc.data.synthetic import make_multilabel
from bayesmlc.gp import MLGPF


@pytest.fixture(scope="module")
def data():
    return make_multilabel(200, 60, 8, random_state=0)


@pytest.mark.parametrize("settings", [
    {"inducing": "subspace", "subspace_rank": 6},
    {"inducing": "subspace-fixed", "subspace_rank": 14},
    {"inducing": "free"},
    {"inducing": "fixed"},
], ids=lambda s: s["inducing"])
def test_a_saved_model_loads_and_predicts_the_same(settings, data, tmp_path):
    model = MLGPF(n_latent=3, n_inducing=10, epochs=2, n_threads=1, random_state=0, **settings).fit(data.X, data.Y)
    path = tmp_path / "model.npz"
    model.save(path)
    loaded = bayesmlc.load_model(path)
    for name, value in model.parameters_.items():
        np.testing.assert_array_equal(np.asarray(loaded.parameters_[name]), np.asarray(value))
    np.testing.assert_array_equal(loaded.predict_proba(data.X[:20]), model.predict_proba(data.X[:20]))
    np.testing.assert_array_equal(loaded.decision_function(data.X[:20]), model.decision_function(data.X[:20]))
    if "inducing.basis_t" in model.parameters_:  # the loaded module reuses the saved X~ X~^T: equal to a recomputed one
        basis = np.asarray(loaded.parameters_["inducing.basis_t"]).T
        np.testing.assert_allclose(loaded._module.inducing.basis_gram.numpy(), basis @ basis.T, atol=1e-5)
