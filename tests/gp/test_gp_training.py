"""MLGPF training schedule and warm starts: the learning-rate decay against its closed form, as a pure
function and as applied to Adam's rates during fit; resume with a decay keeps the uninterrupted
result; the factor warm start with P = L is the label matrix's full SVD basis."""

import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from bayesmlc.exceptions import ValidationError
import bayesmlc.gp.training as training_module
from bayesmlc.gp import MLGPF
from bayesmlc.gp.initialisation import initial_factors
from bayesmlc.gp.training import learning_rate_factor, step_progress

SMALL = dict(n_latent=2, n_inducing=10, subspace_rank=8, batch_size=50, learning_rate=0.05, random_state=0,
             n_threads=1, device="cpu")


def _data(seed=0, n=150, D=12, L=6):
    rng = np.random.default_rng(seed)
    X = sp.csr_matrix(rng.standard_normal((n, D)) * (rng.random((n, D)) < 0.4), dtype=np.float32)
    Y = sp.csr_matrix((rng.random((n, L)) < 0.3).astype(np.float32))
    return X, Y


def test_learning_rate_factor_is_constant_then_a_half_cosine():
    # hand-worked values: decay over the last half, so the cosine starts at progress 0.5
    assert learning_rate_factor(0.0, 0.5) == 1.0
    assert learning_rate_factor(0.5, 0.5) == 1.0
    assert learning_rate_factor(0.75, 0.5) == pytest.approx(0.5, abs=1e-15)  # cos(pi/2) = 0
    assert learning_rate_factor(0.625, 0.5) == pytest.approx((1 + math.sqrt(0.5)) / 2, abs=1e-15)
    assert learning_rate_factor(1.0, 0.5) == pytest.approx(0.0, abs=1e-15)
    # whole-run cosine; no decay keeps the rate; past the end it stays at zero
    for p in np.linspace(0, 1, 11):
        assert learning_rate_factor(p, 1.0) == pytest.approx(0.5 * (1 + math.cos(math.pi * p)), abs=1e-15)
        assert learning_rate_factor(p, 0.0) == 1.0
    assert learning_rate_factor(1.2, 0.3) == pytest.approx(0.0, abs=1e-15)
    assert step_progress(2, 1, 4, 10) == pytest.approx(0.225)


def test_fit_applies_the_decayed_rate_at_every_step(monkeypatch):
    X, Y = _data()
    seen = []
    original = torch.optim.Adam.step

    def recording_step(self, *args, **kwargs):
        seen.append([group["lr"] for group in self.param_groups])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", recording_step)
    epochs, steps_per_epoch = 4, 3  # 150 rows, batch 50
    MLGPF(epochs=epochs, lr_decay=0.5, variational_learning_rate=0.2, **SMALL).fit(X, Y)
    assert len(seen) == epochs * steps_per_epoch
    for step, rates in enumerate(seen):
        progress = step / (epochs * steps_per_epoch)  # equal-size batches: progress is step / total
        t = max(0.0, (progress - 0.5) / 0.5)
        expected = 0.5 * (1 + math.cos(math.pi * t))
        assert rates == pytest.approx([0.05 * expected, 0.2 * expected], rel=1e-12), step


def test_resume_with_decay_gives_the_uninterrupted_result_and_needs_the_same_epochs(tmp_path, monkeypatch):
    X, Y = _data(seed=1)
    params = dict(SMALL, lr_decay=0.6)
    straight = MLGPF(epochs=4, **params).fit(X, Y)
    path = tmp_path / "run.ckpt.npz"
    # interrupt a 4-epoch run after its second checkpoint (epoch 2)
    writes = {"n": 0}
    real_save = training_module.save_checkpoint

    def interrupting_save(*args, **kwargs):
        real_save(*args, **kwargs)
        writes["n"] += 1
        if writes["n"] == 2:
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(training_module, "save_checkpoint", interrupting_save)
        with pytest.raises(KeyboardInterrupt):
            MLGPF(epochs=4, checkpoint_every=1, checkpoint_path=str(path), **params).fit(X, Y)
    resumed = MLGPF(epochs=4, checkpoint_every=1, checkpoint_path=str(path), **params).fit(X, Y, resume=True)
    assert resumed.history_["epoch"] == [1, 2, 3, 4]
    for name, value in straight.parameters_.items():
        assert torch.equal(value, resumed.parameters_[name]), name
    with pytest.raises(ValidationError, match="epochs"):
        MLGPF(epochs=6, checkpoint_path=str(path), **params).fit(X, Y, resume=True)
    with pytest.raises(ValidationError, match="lr_decay must be"):
        MLGPF(epochs=2, **dict(SMALL, lr_decay=1.5)).fit(X, Y)


def test_factor_warm_start_uses_the_full_svd_basis_when_p_equals_the_label_count():
    # P = L used to fall back to random loadings; it must give the scaled right singular vectors of Y
    rng = np.random.default_rng(3)
    Y = sp.csr_matrix((rng.random((300, 6)) < [0.5, 0.4, 0.3, 0.2, 0.1, 0.05]).astype(np.float32))
    P = L = Y.shape[1]
    Phi = initial_factors(Y, P, "svd", np.random.default_rng(0))
    _, s, Vt = np.linalg.svd(Y.toarray().astype(np.float64), full_matrices=False)
    expected = Vt.T * np.sqrt(s / s.mean())
    expected *= math.sqrt(L) / np.linalg.norm(expected)
    # singular vectors are defined up to sign: align each column, then only the 0.1 x N(0, 1/P) draw remains
    signs = np.sign((expected * Phi).sum(0))
    residual = Phi - expected * signs
    noise = np.random.default_rng(0).standard_normal((L, P)) / math.sqrt(P)  # the method's first draw
    np.testing.assert_allclose(residual, 0.1 * noise, atol=1e-5)


def test_rank_by_proba_ranks_by_the_predictive_probability():
    X, Y = _data(seed=2)
    mean_model = MLGPF(epochs=2, **SMALL).fit(X, Y)
    proba_model = MLGPF(epochs=2, rank_by="proba", **SMALL).fit(X, Y)
    np.testing.assert_array_equal(proba_model.decision_function(X), mean_model.predict_proba(X))
    np.testing.assert_array_equal(mean_model.decision_function(X), proba_model._mean_utilities(proba_model.preprocessor_.transform(X)))
    order = np.argsort(-mean_model.predict_proba(X), axis=1, kind="stable")[:, :2]
    assert np.array_equal(np.sort(proba_model.predict_topk(X, 2)[0], axis=1), np.sort(order, axis=1))
    with pytest.raises(ValidationError, match="rank_by must be 'mean' or 'proba', got 'median'"):
        MLGPF(epochs=1, rank_by="median", **SMALL).fit(X, Y)


@pytest.mark.slow
def test_a_stream_of_bibtex_comes_within_one_point_of_fit():
    from bayesmlc.data.io import read_dataset
    from bayesmlc.gp.training import learning_rate_factor
    from bayesmlc.metrics import precision_at_k
    from conftest import shared_dataset_dir

    folder = shared_dataset_dir("bibtex_xc")
    train, test = read_dataset(folder / "train.txt"), read_dataset(folder / "test.txt")
    passes, chunk, first = 30, 500, 2000
    fitted = MLGPF(epochs=passes, random_state=0, n_threads=1).fit(train.X, train.Y)
    stream = MLGPF(random_state=0, n_threads=1, batch_size=chunk)
    # the set-up (subspace basis, k-means, Phi) comes from the first call: it gets the first 2000 rows
    bounds = [0] + list(range(first, train.X.shape[0], chunk)) + [train.X.shape[0]]
    for done in range(passes):  # the training rows arrive in order, then 500 at a time, once per pass
        # the fit's schedule (constant, then a half cosine over the second half), applied per pass
        stream.set_params(learning_rate=0.03 * learning_rate_factor(done / passes, 0.5))
        for start, stop in zip(bounds[:-1], bounds[1:]):
            stream.partial_fit(train.X[start:stop], train.Y[start:stop], n_total=train.X.shape[0])
    p_fit = precision_at_k(test.Y, fitted.decision_function(test.X), 1)
    p_stream = precision_at_k(test.Y, stream.decision_function(test.X), 1)
    assert p_stream > p_fit - 0.01, (p_stream, p_fit)


class _RecordingBar:
    """Stands in for tqdm: keeps every ``set_postfix`` figure set."""

    def __init__(self, *args, **kwargs):
        self.postfixes = []

    def update(self, n=1):
        pass

    def set_postfix(self, figures):
        self.postfixes.append(dict(figures))

    def close(self):
        pass


def _bar_of_fit(monkeypatch, **params):
    import tqdm.auto

    bars = []
    monkeypatch.setattr(tqdm.auto, "tqdm", lambda *args, **kwargs: bars.append(_RecordingBar()) or bars[-1])
    X, Y = _data()
    model = MLGPF(verbose=True, **{**SMALL, **params}).fit(X, Y)
    assert len(bars) == 1
    return bars[0].postfixes, model.history_


def test_progress_bar_labels_training_and_validation_precision(monkeypatch):
    postfixes, history = _bar_of_fit(monkeypatch, epochs=3)
    assert [set(p) for p in postfixes] == [{"ELBO", "train P@1"}] * 3  # no "P@1" that could pass for a test score
    assert [p["train P@1"] for p in postfixes] == [f"{v:.3f}" for v in history["train_P@1"]]
    assert [p["ELBO"] for p in postfixes] == [f"{v:.4g}" for v in history["objective"]]
    # validation every second epoch: none shown before the first evaluation, then the latest one
    postfixes, history = _bar_of_fit(monkeypatch, epochs=4, validation_fraction=0.2, validation_every=2)
    assert [set(p) for p in postfixes] == [{"ELBO", "train P@1"}] + [{"ELBO", "train P@1", "val P@1"}] * 3
    assert math.isnan(history["val_P@1"][0]) and math.isnan(history["val_P@1"][2])
    expected = [history["val_P@1"][1]] * 2 + [history["val_P@1"][3]]
    assert [p["val P@1"] for p in postfixes[1:]] == [f"{v:.3f}" for v in expected]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, None])
def test_all_finite_flags_any_non_finite_gradient_or_loss(bad):
    params = [torch.zeros(3, 4, requires_grad=True), torch.zeros(5, requires_grad=True), torch.zeros(2, requires_grad=True)]
    for p in params[:2]:
        p.grad = torch.ones_like(p)
    loss = torch.tensor(-3.5)
    assert training_module.all_finite(loss, params)  # the third parameter has no gradient: skipped
    if bad is None:  # a non-finite loss
        assert not training_module.all_finite(torch.tensor(math.nan), params)
        return
    params[1].grad[3] = bad
    assert not training_module.all_finite(loss, params)
    params[1].grad[3] = 0.0
    params[0].grad[2, 1] = bad
    params[0].grad[0, 0] = -bad if not math.isnan(bad) else 0.0  # +inf and -inf in one gradient: a NaN sum
    assert not training_module.all_finite(loss, params)


def test_projection_cache_forms_each_row_once_with_the_bits_of_the_per_batch_product(monkeypatch):
    from bayesmlc.gp.inducing import SubspaceInducing
    from bayesmlc.gp.initialisation import ProjectionCache

    rng = np.random.default_rng(5)
    X = sp.random(400, 300, density=0.05, format="csr", random_state=6, dtype=np.float32)
    basis = np.linalg.qr(rng.standard_normal((300, 20)))[0].T
    inducing = SubspaceInducing(basis, rng.standard_normal((7, 20)), trainable=False)
    cache = ProjectionCache(inducing, X)
    formed = []
    project = inducing.project
    monkeypatch.setattr(inducing, "project", lambda rows: formed.append(rows.shape[0]) or project(rows))
    first, second = np.sort(rng.choice(400, 150, replace=False)), np.sort(rng.choice(400, 150, replace=False))
    for rows in (first, second, first):
        np.testing.assert_array_equal(cache[rows], project(X[rows]).numpy())  # the same bits as a batch's own product
    new_in_second = np.setdiff1d(second, first).size
    assert formed == [150, new_in_second]  # each row formed once; the third call formed nothing
    assert cache.known.sum() == np.union1d(first, second).size


def test_fit_with_and_without_the_projection_cache_is_identical(monkeypatch):
    import bayesmlc.gp.initialisation as initialisation

    X, Y = _data(1, n=200, D=30, L=5)
    made = []
    original = initialisation.training_projection
    monkeypatch.setattr(initialisation, "training_projection", lambda *a: made.append(original(*a)) or made[-1])
    cached = MLGPF(epochs=3, **SMALL).fit(X, Y)
    monkeypatch.setattr(initialisation, "PROJECTION_CACHE_MEMORY_SHARE", 0.0)  # every batch forms its projections
    uncached = MLGPF(epochs=3, **SMALL).fit(X, Y)
    assert made[0].known.all() and made[1] is None
    np.testing.assert_array_equal(cached.decision_function(X), uncached.decision_function(X))


def test_projection_cache_is_kept_only_within_its_share_of_memory(monkeypatch):
    import bayesmlc.gp.initialisation as initialisation
    from bayesmlc.gp.inducing import SubspaceInducing

    rng = np.random.default_rng(9)
    X = sp.random(1000, 50, density=0.1, format="csr", random_state=9, dtype=np.float32)
    inducing = SubspaceInducing(np.linalg.qr(rng.standard_normal((50, 8)))[0].T, rng.standard_normal((4, 8)), False)
    module = type("Module", (), {"inducing": inducing})()
    size = 1000 * 8 * 4  # rows x rank x float32 bytes
    for memory, kept in ((4 * size, True), (4 * size - 1, False), (None, True)):  # None: the 1 GiB fallback
        monkeypatch.setattr(initialisation, "physical_memory_bytes", lambda: memory)
        assert isinstance(initialisation.training_projection(module, X), initialisation.ProjectionCache) is kept
    monkeypatch.setattr(initialisation, "physical_memory_bytes", lambda: None)
    tall = type("Rows", (), {"shape": (2**30 // (8 * 4) + 1, 50)})()  # just over 1 GiB of projections
    assert initialisation.training_projection(module, tall) is None
