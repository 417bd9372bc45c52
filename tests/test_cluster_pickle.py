"""Shipping fitted models to scoring workers (issue 39): every fitted estimator pickles and
``joblib``-dumps to the predictions of its ``save``/``load`` copy, without training state, and
predicts on CSR blocks of any number of rows, one bounded batch of rows at a time.

The reference in every comparison is the model read back from its ``.npz`` file (``save``/``load``,
no pickle): a pickled copy must predict exactly what it predicts.
"""

from __future__ import annotations

import io
import pickle
import warnings

import joblib
import numpy as np
import pytest
import scipy.sparse as sp

import bayesmlc.base as base_module
from bayesmlc.base import MultiLabelEstimator
from bayesmlc.bmls import BMLS
from bayesmlc.bnmc import BNMC
from bayesmlc.calibration import CalibratedClassifier
from bayesmlc.data.synthetic import make_multilabel
from bayesmlc.ensemble import AveragingEnsemble
from bayesmlc.gp import MLGPF
from bayesmlc.linear import LogisticRegression
from bayesmlc.risk_control import RiskController

#: tiny settings: every model fits in about a second
MODELS = {
    "mlgpf": lambda: MLGPF(n_latent=3, n_inducing=8, subspace_rank=6, batch_size=64, epochs=2, random_state=0,
                           device="cpu"),
    "bnmc": lambda: BNMC(truncation=4, n_passes=2, random_state=0, device="cpu"),
    "bmls": lambda: BMLS(n_topics=4, schedule="fixed", n_burnin=10, n_draws=6, thin=1, random_state=0, device="cpu"),
    "logistic": lambda: LogisticRegression(max_iter=20, device="cpu"),
    "calibrated": lambda: CalibratedClassifier(LogisticRegression(max_iter=20, device="cpu"), method="platt",
                                               min_label_positives=None, random_state=0),
    "risk": lambda: RiskController(LogisticRegression(max_iter=20, device="cpu"), alpha=0.2, top_k=4, random_state=0),
    "ensemble": lambda: AveragingEnsemble([("logistic", LogisticRegression(max_iter=20, device="cpu")),
                                           ("mlgpf", MLGPF(n_latent=2, n_inducing=6, subspace_rank=4, epochs=1,
                                                           random_state=1, device="cpu"))]),
}


def _data():
    data = make_multilabel(300, 40, 8, features_per_row=8, labels_per_row=2, random_state=21)
    return data.X[:240], data.Y[:240], data.X[240:]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """name -> (fitted model, its save/load copy)."""
    X, Y, _ = _data()
    folder = tmp_path_factory.mktemp("models")
    models = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # small data: label columns without positives, etc.
        for name, make in MODELS.items():
            model = make().fit(X, Y)
            model.save(folder / f"{name}.npz")
            models[name] = (model, MultiLabelEstimator.load(folder / f"{name}.npz"))
    return models


def _joblib_copy(model):
    buffer = io.BytesIO()
    joblib.dump(model, buffer)
    buffer.seek(0)
    return joblib.load(buffer)


def _predictions(model, X) -> dict:
    indices, scores = model.predict_topk(X, 3)
    return {"proba": model.predict_proba(X), "scores": model.decision_function(X), "topk_labels": indices,
            "topk_scores": scores, "top_proba": model.predict_proba(X, top_k=3).toarray(),
            "sets": model.predict(X).toarray()}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("copy", ["pickle", "joblib"])
def test_a_pickled_model_predicts_what_its_saved_and_loaded_copy_predicts(fitted, name, copy):
    model, loaded = fitted[name]
    shipped = pickle.loads(pickle.dumps(model)) if copy == "pickle" else _joblib_copy(model)
    _, _, X_test = _data()
    expected = _predictions(loaded, X_test)
    for key, values in _predictions(shipped, X_test).items():
        np.testing.assert_array_equal(values, expected[key], err_msg=f"{name} {key}")
    # the comparison has content: the model ranks the rows' labels differently from its prior
    assert np.ptp(expected["proba"], axis=0).max() > 1e-3, name


def _private_objects(model) -> dict:
    """Every private attribute of a model and of its fitted members, by dotted name."""
    found = {k: v for k, v in vars(model).items() if k.startswith("_")}
    for field, member in model._fitted_members():
        found.update({f"{field}.{k}": v for k, v in _private_objects(member).items()})
    return found


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_pickle_carries_no_training_state_and_is_about_the_model_files_size(fitted, tmp_path, name):
    model, _ = fitted[name]
    model.predict_proba(_data()[2])  # predicting fills MLGPF's torch module and memo: not shipped either
    payload = pickle.dumps(model)
    shipped = pickle.loads(payload)
    kept = set(_private_objects(shipped))
    assert not {key for key in kept if key.rsplit(".", 1)[-1] in ("_module", "_stream", "_prediction_cache")}, kept
    model.save(tmp_path / "model.npz")
    file_bytes = (tmp_path / "model.npz").stat().st_size
    # the file holds the fitted state once (plus the zip's per-member headers): a pickle that also held
    # a copy of the parameters (MLGPF's torch module) or an optimiser would be about twice its size
    assert len(payload) < 1.3 * file_bytes + 4096, (len(payload), file_bytes)


def test_mlgpf_pickle_drops_the_module_and_the_partial_fit_stream(tmp_path):
    """After ``partial_fit`` the model held a trainer with Adam's state and the torch module (a second
    copy of the parameters): the pickle keeps the parameters only, and a pickled model continues its
    stream exactly as a saved and loaded one does (a fresh optimiser: ``save``'s documented rule)."""
    X, Y, _ = _data()
    model = MODELS["mlgpf"]().partial_fit(X[:120], Y[:120])
    assert model._stream is not None and model._module is not None
    parameter_bytes = sum(value.numpy().nbytes for value in model.parameters_.values())
    with_state = len(pickle.dumps(dict(vars(model))))  # every attribute, as a pickle held them before
    payload = pickle.dumps(model)
    assert with_state > 3 * parameter_bytes
    assert len(payload) < 1.2 * parameter_bytes + 8192
    shipped = pickle.loads(payload)
    assert getattr(shipped, "_stream", None) is None and getattr(shipped, "_module", None) is None
    model.save(tmp_path / "stream.npz")
    loaded = MLGPF.load(tmp_path / "stream.npz")
    shipped.partial_fit(X[120:], Y[120:])
    loaded.partial_fit(X[120:], Y[120:])
    for key, value in loaded.parameters_.items():
        np.testing.assert_array_equal(shipped.parameters_[key].numpy(), value.numpy(), err_msg=key)


# ---- blocks of any size ---------------------------------------------------------------------------
class _RowCounter:
    """Wraps a model's ``_decision_function`` and ``_predict_proba`` hooks, recording the rows of each call."""

    def __init__(self, model, monkeypatch):
        self.rows = []
        for hook in ("_decision_function", "_predict_proba"):
            original = getattr(model, hook)

            def counted(X, original=original):
                self.rows.append(X.shape[0])
                return original(X)

            monkeypatch.setattr(model, hook, counted)


@pytest.mark.parametrize("name", ["mlgpf", "bnmc", "logistic"])
def test_predictions_on_blocks_of_any_size_go_through_bounded_batches(fitted, monkeypatch, name):
    model, _ = fitted[name]
    _, _, X_test = _data()
    whole = {"proba": model.predict_proba(X_test), "scores": model.decision_function(X_test)}
    batch = 7  # float32 products over batches of another size round differently: tolerances of ~1e-5
    monkeypatch.setattr(base_module, "PREDICT_BATCH_ROWS", batch)
    counter = _RowCounter(model, monkeypatch)
    for block_rows in (0, 1, batch, 3 * batch + 2, X_test.shape[0]):
        block = X_test[:block_rows]
        proba = model.predict_proba(block)
        labels, scores = model.predict_topk(block, 3, batch_size=batch)
        top = model.predict_proba(block, top_k=3)
        assert proba.shape == (block_rows, model.n_labels_) and labels.shape == scores.shape == (block_rows, 3)
        np.testing.assert_allclose(proba, whole["proba"][:block_rows], rtol=2e-5, atol=1e-6)
        # top-k by an independent sort of the whole block's scores (stable: ties to the lower label)
        order = np.argsort(-whole["scores"][:block_rows], axis=1, kind="stable")[:, :3]
        np.testing.assert_array_equal(labels, order)
        np.testing.assert_allclose(scores, np.take_along_axis(whole["scores"][:block_rows], order, axis=1),
                                   rtol=2e-5, atol=1e-5)
        best = np.argsort(-whole["proba"][:block_rows], axis=1, kind="stable")[:, :3]
        np.testing.assert_allclose(top.toarray()[np.arange(block_rows)[:, None], best],
                                   np.take_along_axis(whole["proba"][:block_rows], best, axis=1), rtol=2e-5, atol=1e-6)
        assert all(np.diff(top.indptr) == 3)
    assert counter.rows and max(counter.rows) <= batch  # no call of the model saw more than one batch


def test_top_k_probabilities_of_many_rows_hold_one_batch_at_a_time():
    """``predict_proba(X, top_k=5)`` over 16 batches of rows and 200 labels allocates the sparse output
    and about one batch of dense probabilities, not the (n, L) matrix (numpy's allocations, traced)."""
    import tracemalloc

    data = make_multilabel(400, 30, 200, features_per_row=6, labels_per_row=4, random_state=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        model = LogisticRegression(max_iter=5, device="cpu").fit(data.X, data.Y)
    rows = 16 * base_module.PREDICT_BATCH_ROWS
    wide = sp.csr_matrix(data.X[np.arange(rows) % data.X.shape[0]])
    dense_bytes = rows * model.n_labels_ * 4
    expected = model.predict_proba(wide[:3000])
    tracemalloc.start()
    try:
        top = model.predict_proba(wide, top_k=5)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert top.shape == (rows, model.n_labels_) and top.nnz == 5 * rows
    best = np.argsort(-expected, axis=1, kind="stable")[:, :5]
    np.testing.assert_allclose(top[:3000].toarray()[np.arange(3000)[:, None], best],
                               np.take_along_axis(expected, best, axis=1), rtol=1e-6)
    output_bytes = top.data.nbytes + top.indices.nbytes + top.indptr.nbytes
    # the output, its int64 index and value arrays before the CSR is built, and a few batches' work
    assert peak < 4 * output_bytes + 0.25 * dense_bytes, (peak, output_bytes, dense_bytes)
