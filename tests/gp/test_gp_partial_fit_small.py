"""MLGPF.partial_fit on batches smaller than n_inducing: the set-up takes every row of the first batch
as an inducing input and pads the rest (bayesmlc.gp.inducing.padding_centres)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from test_gp_model import SMALL, _planted

from bayesmlc.exceptions import ValidationError
from bayesmlc.gp import MLGPF
from bayesmlc.gp.inducing import kmeans_centres, padding_centres
from bayesmlc.metrics import precision_at_k

SETTINGS = {**{k: v for k, v in SMALL.items() if k != "subspace_rank"}, "lr_decay": 0.0}  # n_inducing=25


@pytest.mark.parametrize("sparse", [False, True])
def test_k_means_with_fewer_rows_than_centres_keeps_every_row_and_pads_distinct_points(sparse):
    rng = np.random.default_rng(0)
    rows = np.zeros((6, 8))
    rows[:, :5] = rng.standard_normal((6, 5))  # columns 5..7 unused by every row
    centres = kmeans_centres(sp.csr_matrix(rows) if sparse else rows, 20, seed=3)
    assert centres.shape == (20, 8) and centres.dtype == np.float32
    # each row is its own nearest centre (distance 0), so Lloyd's steps leave the rows where they are
    assert sorted(map(tuple, centres[:6].round(5))) == sorted(map(tuple, rows.astype(np.float32).round(5)))
    padded = centres[6:]
    assert np.all(padded[:, 5:] == 0)  # no spread where no row has any
    distances = np.linalg.norm(padded[:, None, :] - centres[None, :, :], axis=2)
    distances[np.arange(14), np.arange(6, 20)] = np.inf
    assert distances.min() > 1e-3  # distinct from the rows and from each other
    # their noise has the rows' per-column spread: standardised, the offsets from the nearest row are N(0, 1)
    spread = rows[:, :5].std(axis=0)
    offsets = [(p[:5] - rows[np.argmin(np.linalg.norm(rows - p, axis=1)), :5]) / spread for p in padded]
    assert 0.3 < np.std(offsets) < 2.0


def test_padding_of_one_row_or_copies_of_one_uses_the_entries_magnitude():
    row = np.array([[2.0, 0.0, -1.0]])
    padded = padding_centres(np.repeat(row, 3, axis=0), 50, np.random.default_rng(1))
    assert np.all(padded[:, 1] == 0) and np.std(padded[:, 0]) > 0.5 and np.std(padded[:, 2]) > 0.2


def test_a_stream_of_batches_smaller_than_n_inducing_learns_as_fit_does():
    X, Y, _ = _planted(seed=5, n=500, L=12)
    fitted = MLGPF(epochs=10, inducing="free", **SETTINGS).fit(X[:400], Y[:400])
    stream = MLGPF(inducing="free", **SETTINGS)
    for _ in range(5):  # five passes over the training rows, 20 (< n_inducing = 25) arriving at a time
        for start in range(0, 400, 20):
            stream.partial_fit(X[start : start + 20], Y[start : start + 20])
    assert stream.parameters_["inducing.Z"].shape == (25, 20) and stream.n_rows_seen_ == 2000
    chance = float(Y[400:].sum()) / Y[400:].shape[0] / Y.shape[1]
    p_fit = precision_at_k(Y[400:], fitted.decision_function(X[400:]), 1)
    p_stream = precision_at_k(Y[400:], stream.decision_function(X[400:]), 1)
    assert p_stream > chance + 0.2 and p_stream > p_fit - 0.05, (chance, p_fit, p_stream)


@pytest.mark.parametrize("inducing", ["subspace", "subspace-fixed"])
def test_subspace_inducing_inputs_start_from_a_small_first_batch(inducing):
    X, Y, _ = _planted(seed=7, n=300, L=8)
    model = MLGPF(inducing=inducing, **SETTINGS).partial_fit(X[:10], Y[:10])
    assert model.parameters_["inducing.A"].shape == (25, 10)  # 25 inducing inputs in the batch's rank-10 basis
    model.partial_fit(X[10:200], Y[10:200])
    proba = model.predict_proba(X[200:])
    assert proba.shape == (100, 8) and np.all(np.isfinite(proba))
    chance = float(Y[200:].sum()) / Y[200:].shape[0] / Y.shape[1]
    assert precision_at_k(Y[200:], model.decision_function(X[200:]), 1) > chance + 0.1


def test_fixed_inducing_inputs_need_n_inducing_rows_and_a_refused_batch_leaves_the_model_unfitted():
    X, Y, _ = _planted(seed=8, n=60, L=5)
    model = MLGPF(inducing="fixed", **SETTINGS)
    with pytest.raises(ValidationError, match="inducing='fixed' keeps n_inducing=25 .* it has 10"):
        model.partial_fit(X[:10], Y[:10])
    assert not hasattr(model, "n_labels_")
    model.partial_fit(X[:30], Y[:30])  # a large enough first batch sets it up
    assert model.parameters_["inducing.Z"].shape == (25, 20)
    with pytest.raises(ValidationError, match="n_inducing=25 exceeds the n_samples=10"):
        MLGPF(inducing="free", **SETTINGS).fit(X[:10], Y[:10])  # fit keeps its rule


def test_partial_fit_takes_label_names_on_its_first_call_and_refuses_others_later():
    class Frame:
        def __init__(self, values, columns):
            self.values, self.columns = np.asarray(values), list(columns)

        def __array__(self, dtype=None, copy=None):
            return self.values if dtype is None else self.values.astype(dtype)

    X, Y, _ = _planted(seed=9, n=60, L=3)
    names = ["a", "b", "c"]
    model = MLGPF(inducing="free", **SETTINGS).partial_fit(X[:20], Frame(Y[:20].toarray(), names))
    assert model.label_names_.tolist() == names
    model.partial_fit(X[20:40], Y[20:40])  # unnamed later batches are fine
    with pytest.raises(ValidationError, match="differ from the label names of the first call"):
        model.partial_fit(X[40:], Frame(Y[40:].toarray(), ["a", "c", "b"]))
    assert model.label_names_.tolist() == names
