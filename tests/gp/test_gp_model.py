"""The MLGPF estimator end to end on small synthetic problems: planted latent GPs are recovered,
checkpoints resume to the uninterrupted result, save/load round-trips, NaN stops training cleanly."""

import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from bayesmlc.exceptions import ValidationError
from bayesmlc.gp import MLGPF, TrainingDivergedError
from bayesmlc.gp.likelihoods import BernoulliLogit
from bayesmlc.gp.objective import latent_marginals
from bayesmlc.metrics import precision_at_k


def _planted(seed=0, n=700, D=20, L=15, P=3):
    """Rows x (unit norm, sparse), latent h = 3 x W (a linear GP draw), f = Phi h + b, y ~ Bern(sigmoid f)."""
    rng = np.random.default_rng(seed)
    X = sp.random(n, D, density=0.25, random_state=np.random.RandomState(seed), format="csr")
    X.data = rng.standard_normal(X.nnz)
    norms = np.sqrt(np.asarray(X.multiply(X).sum(1))).ravel()
    norms[norms == 0] = 1
    X = sp.csr_matrix(sp.diags(1 / norms) @ X, dtype=np.float32)
    h = 3.0 * (X @ rng.standard_normal((D, P)))
    f = h @ (1.5 * rng.standard_normal((L, P))).T - 1.5
    Y = sp.csr_matrix((rng.random(f.shape) < 1 / (1 + np.exp(-f))).astype(np.float32))
    return X, Y, f


SMALL = dict(n_latent=3, n_inducing=25, subspace_rank=20, batch_size=100, learning_rate=0.03, random_state=0, n_threads=1,
             device="cpu")


def test_planted_latent_gps_are_recovered_and_the_elbo_rises():
    X, Y, f = _planted()
    train, test = slice(0, 500), slice(500, None)
    model = MLGPF(epochs=40, **SMALL).fit(X[train], Y[train])
    scores = model.decision_function(X[test])
    Y_test = Y[test]
    chance = float(Y_test.sum()) / Y_test.shape[0] / Y_test.shape[1]
    oracle = precision_at_k(Y_test, f[test], 1)
    achieved = precision_at_k(Y_test, scores, 1)
    assert achieved > chance + 0.7 * (oracle - chance), (chance, achieved, oracle)
    elbo = model.history_["objective"]
    assert len(elbo) == 40 and np.mean(elbo[-5:]) > elbo[0] + 0.2 * abs(elbo[0])
    assert len(model.history_["wall_time"]) == 40
    assert model.step_history_["step"][-1] == 40 * 5
    # utilities correlate with the planted ones, probabilities are calibrated-ish and in [0, 1]
    proba = model.predict_proba(X[test])
    assert np.all((proba >= 0) & (proba <= 1))
    assert np.corrcoef(scores.ravel(), f[test].ravel())[0, 1] > 0.8
    assert abs(proba.mean() - Y_test.mean()) < 0.05


@pytest.mark.parametrize("variational,inducing,kernel", [
    ("cholesky", "free", "linear+se"), ("preconditioned", "fixed", "se"), ("whitened", "subspace-fixed", "linear"),
    ("shared", "subspace", "linear"),
])
def test_every_family_and_inducing_choice_learns(variational, inducing, kernel):
    X, Y, f = _planted(seed=1, n=400)
    params = dict(SMALL, variational=variational, inducing=inducing, kernel=kernel, epochs=25, ard=inducing == "free")
    model = MLGPF(**params).fit(X[:300], Y[:300])
    chance = float(Y[300:].sum()) / Y[300:].shape[0] / Y.shape[1]
    assert precision_at_k(Y[300:], model.decision_function(X[300:]), 1) > chance + 0.2
    assert model.history_["objective"][-1] > model.history_["objective"][0]


def test_predict_proba_matches_monte_carlo_under_q_f():
    X, Y, _ = _planted(seed=2, n=300)
    model = MLGPF(epochs=3, linear_term=False, **SMALL).fit(X, Y)  # q(f) of the factor model alone
    module = model._ensure_module()
    with torch.no_grad():
        batch = module.inducing.make_batch(model.preprocessor_.transform(X[:4]))
        mean_h, var_h, _ = latent_marginals(module, batch, model.jitter_)
        f_mean = (mean_h @ module.Phi.T + module.bias).double()
        f_var = (var_h @ module.Phi.pow(2).T).double()
    gen = torch.Generator().manual_seed(0)
    draws = torch.sigmoid(f_mean + f_var.sqrt() * torch.randn((200_000,) + f_mean.shape, generator=gen, dtype=torch.float64))
    assert np.allclose(model.predict_proba(X[:4]), draws.mean(0).numpy(), atol=3e-3)
    # the variance matters: E[sigmoid(f)] is pulled towards 1/2 relative to sigmoid(E f)
    plug_in = torch.sigmoid(f_mean).numpy()
    assert np.all(np.abs(model.predict_proba(X[:4]) - 0.5) <= np.abs(plug_in - 0.5) + 1e-6)


def test_negative_sampling_and_label_mask_train(tmp_path):
    X, Y, _ = _planted(seed=3, n=400, L=30)
    rng = np.random.default_rng(0)
    mask = sp.csr_matrix((rng.random(Y.shape) < 0.7).astype(np.float32))
    model = MLGPF(epochs=15, negative_samples=5, **SMALL).fit(X[:300], Y[:300], label_mask=mask[:300])
    chance = float(Y[300:].sum()) / Y[300:].shape[0] / Y.shape[1]
    assert precision_at_k(Y[300:], model.decision_function(X[300:]), 1) > chance + 0.2


@pytest.mark.filterwarnings("ignore:.*no positive training example")
@pytest.mark.parametrize("n_labels, expected", [(30, None), (1000, None), (1001, 500)])
def test_auto_negative_samples_sample_only_above_a_thousand_labels(monkeypatch, n_labels, expected):
    import bayesmlc.gp.training as training_module

    drawn = []
    per_row, per_batch = training_module.sample_label_entries, training_module.sample_shared_negatives

    def recording(real, mode):
        def record(Y, mask, negative_samples, rng):
            drawn.append((mode, negative_samples))
            return real(Y, mask, negative_samples, rng)
        return record

    monkeypatch.setattr(training_module, "sample_label_entries", recording(per_row, "row"))
    monkeypatch.setattr(training_module, "sample_shared_negatives", recording(per_batch, "batch"))
    rng = np.random.default_rng(0)
    X = sp.csr_matrix(rng.standard_normal((60, 8)).astype(np.float32))
    Y = sp.csr_matrix((rng.random((60, n_labels)) < 0.01).astype(np.float32))
    for mode in ("batch", "row"):  # "batch" is the default
        drawn.clear()
        params = {} if mode == "batch" else {"negative_sampling": "row"}
        model = MLGPF(n_latent=2, n_inducing=5, subspace_rank=4, batch_size=30, epochs=1, random_state=0, n_threads=1,
                      **params)
        model.fit(X, Y)  # negative_samples="auto" is the default
        assert drawn == ([] if expected is None else [(mode, expected)] * 2)  # two batches of 30 rows
    # a sampled entry set holds each row's positives and min(500, its negatives) sampled negatives;
    # a shared one, the batch's positives and one block of 500 labels for all its rows
    if expected is not None:
        entries = per_row(Y[:30], None, expected, np.random.default_rng(1))
        assert len(entries.rows) == Y[:30].nnz + 30 * expected
        shared = per_batch(Y[:30], None, expected, np.random.default_rng(1))
        assert shared.weights.shape == (30, expected) and len(shared.positives.rows) == Y[:30].nnz


def test_predict_topk_never_scores_more_than_a_batch_of_rows(monkeypatch):
    X, Y, _ = _planted(seed=4, n=300, L=12)
    model = MLGPF(epochs=2, **SMALL).fit(X[:200], Y[:200])
    full = model.decision_function(X)
    seen = []
    real = model._decision_function
    monkeypatch.setattr(model, "_decision_function", lambda rows: seen.append(rows.shape[0]) or real(rows))
    indices, scores = model.predict_topk(X, k=3, batch_size=64)
    assert max(seen) <= 64 and sum(seen) == X.shape[0]
    order = np.argsort(-full, axis=1, kind="stable")[:, :3]  # ties to the lower index
    assert np.array_equal(indices, order)
    assert np.allclose(scores, np.take_along_axis(full, order, axis=1))


@pytest.mark.parametrize("dtype", ["float32", "float64"])  # float64: the checkpoint must not pass through float32
def test_checkpoint_resume_gives_the_uninterrupted_result(tmp_path, dtype):
    X, Y, _ = _planted(seed=4, n=300)
    # constant rates, so that a 2-epoch run is the first half of the 4-epoch one (a decayed run's
    # resume is tested in test_gp_training.py)
    params = dict(SMALL, negative_samples=4, validation_fraction=0.2, batch_size_growth=20, batch_size_every=1,
                  lr_decay=0.0, dtype=dtype)
    straight = MLGPF(epochs=4, **params).fit(X, Y)
    path = tmp_path / "run.ckpt.npz"
    MLGPF(epochs=2, checkpoint_every=1, checkpoint_path=str(path), **params).fit(X, Y)  # "interrupted" after 2
    resumed = MLGPF(epochs=4, checkpoint_every=1, checkpoint_path=str(path), **params).fit(X, Y, resume=True)
    for name, value in straight.parameters_.items():
        assert torch.equal(value, resumed.parameters_[name]), name
    assert straight.history_["objective"] == resumed.history_["objective"]
    assert straight.history_["batch_size"] == resumed.history_["batch_size"] == [100, 120, 140, 160]
    assert np.array_equal(straight.decision_function(X), resumed.decision_function(X))
    with pytest.raises(ValidationError, match="different parameters.*n_latent"):
        MLGPF(epochs=4, checkpoint_path=str(path), **dict(params, n_latent=2)).fit(X, Y, resume=True)
    assert not list(tmp_path.glob("*bayesmlc-tmp*"))  # atomic writes leave no temporary files


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_save_load_round_trip(tmp_path, dtype):
    X, Y, _ = _planted(seed=5, n=300)
    model = MLGPF(epochs=2, dtype=dtype, **dict(SMALL, kernel="linear+se", ard=True)).fit(X, Y)
    path = tmp_path / "model.npz"
    model.save(path)
    loaded = MLGPF.load(path)
    assert np.array_equal(model.decision_function(X), loaded.decision_function(X))
    assert np.array_equal(model.predict_proba(X), loaded.predict_proba(X))
    assert loaded.history_["objective"] == model.history_["objective"]
    assert np.array_equal(model.predict_topk(X, 3)[0], loaded.predict_topk(X, 3)[0])


def test_nan_stops_training_with_a_clear_error_and_keeps_good_parameters(monkeypatch):
    X, Y, _ = _planted(seed=6, n=300)
    calls = {"n": 0}
    original = BernoulliLogit.expected_log_lik

    def poisoned(self, mean, var, sign):
        calls["n"] += 1
        out = original(self, mean, var, sign)
        return out * float("nan") if calls["n"] == 4 else out

    monkeypatch.setattr(BernoulliLogit, "expected_log_lik", poisoned)
    model = MLGPF(epochs=3, init_mean="zero", **SMALL)  # no warm start: every call is a training step
    with pytest.raises(TrainingDivergedError, match="NaN/inf at epoch 2, step 4"):
        model.fit(X, Y)
    assert all(torch.isfinite(v).all() for v in model.parameters_.values())
    assert np.all(np.isfinite(model.decision_function(X)))


def test_same_seed_same_model_and_bad_parameters_are_named():
    X, Y, _ = _planted(seed=7, n=200)
    a = MLGPF(epochs=2, **SMALL).fit(X, Y).decision_function(X)
    b = MLGPF(epochs=2, **SMALL).fit(X, Y).decision_function(X)
    assert np.array_equal(a, b)
    for bad, match in (
        (dict(kernel="rbf"), "kernel must be one of"),
        (dict(n_inducing=0), "n_inducing must be"),
        (dict(n_inducing=1000), "n_inducing=1000 exceeds"),
        (dict(variational="full"), "variational must be"),
        (dict(checkpoint_every=1), "checkpoint_path"),
        (dict(early_stopping_patience=2), "validation_fraction"),
    ):
        with pytest.raises(ValidationError, match=match):
            MLGPF(**dict(SMALL, **bad)).fit(X, Y)


def test_validation_and_early_stopping_keep_the_best_parameters():
    X, Y, _ = _planted(seed=8, n=400)
    model = MLGPF(epochs=30, validation_fraction=0.25, early_stopping_patience=2, **dict(SMALL, learning_rate=0.3)).fit(X, Y)
    history = model.history_
    val = history["val_P@1"]
    assert all(not math.isnan(v) for v in val)
    assert len(val) <= 30
    assert len(val) < 30  # stopped early: the best is at least `patience` evaluations old
    assert len(val) - 1 - int(np.argmax(val)) >= 2
    assert len({len(v) for v in history.values()}) == 1  # equal-length lists
    # the parameters kept are the best ones: they reproduce the best validation P@1
    val_rows = np.sort(np.random.default_rng(0).permutation(400)[:100])
    assert precision_at_k(Y[val_rows], model.decision_function(X[val_rows]), 1) == max(val)


def test_plot_history_writes_an_image(tmp_path):
    from bayesmlc.gp.plotting import plot_history

    history = {"epoch": [1, 2, 3], "wall_time": [0.5, 1.0, 1.5], "objective": [-10.0, -8.0, -7.5],
               "train_P@1": [0.3, 0.4, 0.5], "val_P@1": [float("nan"), 0.4, float("nan")]}
    plot_history(history, tmp_path / "h.png")
    with open(tmp_path / "h.png", "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="wall_time"):
        plot_history({"wall_time": [1.0], "objective": []}, tmp_path / "bad.png")


def test_float64_training_agrees_with_float32():
    X, Y, _ = _planted(seed=9, n=300)
    single = MLGPF(epochs=3, **SMALL).fit(X, Y)
    double = MLGPF(epochs=3, dtype="float64", **SMALL).fit(X, Y)
    assert double.parameters_["Phi"].dtype == torch.float64
    a, b = single.decision_function(X), double.decision_function(X)
    assert np.abs(a - b).max() < 1e-2 * np.abs(b).max()


def test_idf_weighting_equals_scikit_learns_tfidf_and_survives_save_load(tmp_path):
    from sklearn.feature_extraction.text import TfidfTransformer

    X, Y, _ = _planted(seed=4, n=200)
    X = X.copy()
    X.data = np.abs(X.data)  # term-frequency-like counts
    model = MLGPF(epochs=1, idf_weighting=True, **SMALL).fit(X, Y)
    expected = TfidfTransformer(norm="l2", smooth_idf=True).fit(X).transform(X).toarray()
    np.testing.assert_allclose(model.preprocessor_.transform(X).toarray(), expected, rtol=1e-5, atol=1e-6)
    path = tmp_path / "idf.npz"
    model.save(path)
    loaded = MLGPF.load(path)
    np.testing.assert_array_equal(loaded.preprocessor_.idf_, model.preprocessor_.idf_)
    np.testing.assert_allclose(loaded.decision_function(X), model.decision_function(X), rtol=1e-6)
    # without the option the kernel sees unit rows of the raw features, and nothing is stored
    plain = MLGPF(epochs=1, idf_weighting=False, **SMALL).fit(X, Y)
    assert plain.preprocessor_.idf_ is None
    # "auto" (the default) leaves 200 rows unweighted: the same fit as False
    auto = MLGPF(epochs=1, **SMALL).fit(X, Y)
    assert auto.preprocessor_.idf_ is None
    np.testing.assert_allclose(auto.decision_function(X), plain.decision_function(X), rtol=1e-6)
    assert not np.allclose(plain.decision_function(X), model.decision_function(X), atol=1e-3)


def test_standardize_equals_scikit_learns_scalers_and_survives_save_load(tmp_path):
    from sklearn.preprocessing import StandardScaler, normalize

    X, Y, _ = _planted(seed=5, n=200)
    X = sp.csr_matrix(X.toarray() + np.linspace(1.0, 3.0, X.shape[1]), dtype=np.float32)  # dense, offset columns
    X[:, 3] = 2.0  # a constant column keeps scale 1 (and becomes 0)
    model = MLGPF(epochs=1, standardize=True, idf_weighting=False, **SMALL).fit(X, Y)
    expected = normalize(StandardScaler().fit_transform(X.toarray()))
    np.testing.assert_allclose(model.preprocessor_.transform(X).toarray(), expected, rtol=1e-4, atol=1e-5)
    assert model.preprocessor_.scale_[3] == 1.0
    path = tmp_path / "standardized.npz"
    model.save(path)
    loaded = MLGPF.load(path)
    np.testing.assert_array_equal(loaded.preprocessor_.mean_, model.preprocessor_.mean_)
    np.testing.assert_allclose(loaded.predict_proba(X), model.predict_proba(X), rtol=1e-6)
    assert MLGPF(epochs=1, standardize=False, **SMALL).fit(X, Y).preprocessor_.mean_ is None


def test_standardize_auto_follows_the_density_of_the_training_features():
    """"auto" standardises dense features (the same model as ``standardize=True``) and leaves
    sparse ones alone (the same model as ``standardize=False``)."""
    X, Y, _ = _planted(seed=5, n=120)
    assert X.nnz < 0.5 * X.shape[0] * X.shape[1]
    dense = sp.csr_matrix(X.toarray() + 1.0, dtype=np.float32)
    for features, same_as in ((X, False), (dense, True)):
        auto = MLGPF(epochs=2, **SMALL).fit(features, Y)
        explicit = MLGPF(epochs=2, standardize=same_as, **SMALL).fit(features, Y)
        assert (auto.preprocessor_.mean_ is not None) == same_as
        np.testing.assert_array_equal(auto.decision_function(features), explicit.decision_function(features))
    with pytest.raises(ValidationError, match="standardize must be 'auto', True or False, got 'yes'"):
        MLGPF(standardize="yes", **SMALL).fit(X, Y)


def test_standardize_recovers_labels_that_uncentred_dense_features_hide():
    """Dense features with a large common offset: unit-normalised uncentred rows are nearly parallel,
    so the linear kernel sees almost no signal; centring and scaling the columns restores it."""
    X, Y, f = _planted(seed=6, n=700)
    X_dense = sp.csr_matrix(X.toarray() * 0.2 + 5.0, dtype=np.float32)
    train, test = slice(0, 500), slice(500, None)
    settings = dict(SMALL, epochs=30, idf_weighting=False)
    plain = MLGPF(standardize=False, **settings).fit(X_dense[train], Y[train])
    scaled = MLGPF(standardize=True, **settings).fit(X_dense[train], Y[train])
    oracle = precision_at_k(Y[test], f[test], 1)
    p_plain = precision_at_k(Y[test], plain.decision_function(X_dense[test]), 1)
    p_scaled = precision_at_k(Y[test], scaled.decision_function(X_dense[test]), 1)
    assert p_plain < 0.6  # 0.35 at this seed
    assert p_scaled > 0.9 * oracle  # 0.975 against 0.98


def test_standardize_refuses_to_densify_too_much(monkeypatch):
    import bayesmlc.preprocessing as preprocessing

    X, Y, _ = _planted(seed=7, n=120)
    model = MLGPF(epochs=1, standardize=True, **SMALL).fit(X, Y)
    monkeypatch.setattr(preprocessing, "MAX_CENTRED_ENTRIES", 100)
    with pytest.raises(ValidationError, match=r"standardize=True\) centres .* 120 x 20 = 2400 entries"):
        model.predict_proba(X)
    # dense features are stored in full already: centring them at most doubles the entries, allowed
    dense = sp.csr_matrix(X.toarray() + 1.0, dtype=np.float32)
    expected = MLGPF(epochs=1, standardize=True, **SMALL).fit(dense, Y)
    monkeypatch.undo()
    reference = expected.predict_proba(dense)
    monkeypatch.setattr(preprocessing, "MAX_CENTRED_ENTRIES", 100)
    np.testing.assert_array_equal(expected.predict_proba(dense), reference)


@pytest.mark.parametrize("n_rows, expected", [(4880, 500), (3000, 375), (333, 42), (100, 32), (20, 32), (10**6, 500)])
def test_auto_batch_size_gives_small_sets_eight_steps_an_epoch(n_rows, expected):
    from bayesmlc.gp.training import resolve_batch_size

    assert resolve_batch_size("auto", n_rows) == expected
    assert resolve_batch_size(128, n_rows) == 128


def test_default_batch_size_is_resolved_per_training_set():
    X, Y, _ = _planted(seed=8, n=300)
    settings = {k: v for k, v in SMALL.items() if k != "batch_size"}
    model = MLGPF(epochs=2, **settings).fit(X, Y)
    assert model.history_["batch_size"] == [38, 38]  # ceil(300 / 8)
    assert len(model.step_history_["step"]) == 2 * 8
    with pytest.raises(ValidationError, match="batch_size must be an integer"):
        MLGPF(batch_size="big", **settings).fit(X, Y)


def test_auto_subspace_rank_is_capped_silently_and_an_explicit_one_with_a_warning():
    import warnings

    X, Y, _ = _planted(seed=9, n=100)  # 20 features
    settings = {k: v for k, v in SMALL.items() if k != "subspace_rank"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = MLGPF(epochs=1, **settings).fit(X, Y)
    assert model.parameters_["inducing.basis_t"].shape == (20, 20)  # min(1000, 100 rows, 20 features)
    with pytest.warns(UserWarning, match="subspace_rank=50 exceeds min"):
        MLGPF(epochs=1, subspace_rank=50, **settings).fit(X, Y)
    with pytest.raises(ValidationError, match="subspace_rank must be an integer"):
        MLGPF(subspace_rank="full", **settings).fit(X, Y)


def test_partial_fit_on_a_stream_learns_as_fit_does_and_keeps_the_label_set():
    X, Y, _ = _planted(seed=5, n=500, L=12)
    settings = dict(SMALL, lr_decay=0.0)
    fitted = MLGPF(epochs=10, **settings).fit(X[:400], Y[:400])
    stream = MLGPF(**settings)
    for _ in range(10):  # ten passes over the training rows, 100 arriving at a time
        for start in range(0, 400, 100):
            stream.partial_fit(X[start : start + 100], Y[start : start + 100])
    assert stream.n_rows_seen_ == 4000
    # the label counts accumulate over calls: ten times the training rows' counts
    assert np.array_equal(stream.label_frequencies_, 10 * np.asarray(Y[:400].sum(0)).ravel())
    chance = float(Y[400:].sum()) / Y[400:].shape[0] / Y.shape[1]
    p_fit = precision_at_k(Y[400:], fitted.decision_function(X[400:]), 1)
    p_stream = precision_at_k(Y[400:], stream.decision_function(X[400:]), 1)
    assert p_stream > chance + 0.2 and p_stream > p_fit - 0.05
    with pytest.raises(ValidationError, match="12 labels"):
        stream.partial_fit(X[:10], Y[:10, :11])


def test_partial_fit_after_fit_continues_from_the_fitted_parameters():
    X, Y, _ = _planted(seed=6, n=300, L=10)
    model = MLGPF(epochs=3, **SMALL).fit(X[:200], Y[:200])
    before = {k: v.clone() for k, v in model.parameters_.items()}
    scores = model.decision_function(X[200:])
    model.set_params(learning_rate=1e-7, linear_learning_rate=1e-7)  # tiny steps: the parameters stay where fit left them
    model.partial_fit(X[200:], Y[200:])
    assert model.n_rows_seen_ == 300
    for key, value in before.items():
        assert torch.allclose(model.parameters_[key], value, atol=1e-4), key
    assert np.allclose(model.decision_function(X[200:]), scores, atol=5e-3)  # float32 factorisations amplify 1e-7 moves


def test_batch_negative_sampling_fits_reproducibly_and_checks_its_setting():
    from bayesmlc.exceptions import ValidationError

    rng = np.random.default_rng(0)
    n, d, L = 120, 20, 30
    X = sp.random(n, d, density=0.3, random_state=np.random.RandomState(0), format="csr")
    Y = sp.csr_matrix((rng.random((n, L)) < 0.1).astype(np.float64))
    params = dict(n_latent=3, n_inducing=10, epochs=2, batch_size=40, negative_samples=8,
                  negative_sampling="batch", random_state=0)
    first = MLGPF(**params).fit(X, Y).decision_function(X)
    second = MLGPF(**params).fit(X, Y).decision_function(X)
    assert np.array_equal(first, second)
    row = MLGPF(**dict(params, negative_sampling="row")).fit(X, Y).decision_function(X)
    assert not np.allclose(first, row)  # the setting changes the draws, so the fit
    with pytest.raises(ValidationError, match="negative_sampling"):
        MLGPF(**dict(params, negative_sampling="rows")).fit(X, Y)


def test_kernel_auto_is_the_squared_exponential_for_dense_features_and_linear_for_sparse(tmp_path):
    """"auto" gives the same model as ``kernel="se"`` on dense features and as ``kernel="linear"`` on
    sparse ones; the choice (``kernel_``) is kept by save/load."""
    from bayesmlc.gp.kernels import Linear, SquaredExponential

    X, Y, _ = _planted(seed=5, n=120)
    dense = sp.csr_matrix(X.toarray() + 1.0, dtype=np.float32)
    for features, same_as, kind in ((X, "linear", Linear), (dense, "se", SquaredExponential)):
        auto = MLGPF(epochs=2, **SMALL).fit(features, Y)
        explicit = MLGPF(epochs=2, kernel=same_as, **SMALL).fit(features, Y)
        assert auto.kernel_ == same_as and isinstance(auto._ensure_module().kernel, kind)
        np.testing.assert_array_equal(auto.decision_function(features), explicit.decision_function(features))
        path = tmp_path / f"{same_as}.npz"
        auto.save(path)
        loaded = MLGPF.load(path)
        assert loaded.kernel_ == same_as and loaded.kernel == "auto"
        np.testing.assert_allclose(loaded.predict_proba(features), auto.predict_proba(features), rtol=1e-6)


def test_kernel_auto_takes_the_squared_exponential_from_ten_rows_a_feature():
    """Sparse features: "linear" below SE_ROWS_PER_FEATURE (10) rows a column, "se" from it on (the
    rows of every process when ``n_rows`` is given); dense features always "se"; a name is kept."""
    from bayesmlc.gp.kernels import SE_ROWS_PER_FEATURE, resolve_kernel

    assert SE_ROWS_PER_FEATURE == 10
    D = 8
    sparse = sp.random(10 * D, D, density=0.2, random_state=np.random.RandomState(0), format="csr")
    assert resolve_kernel("auto", sparse) == "se"
    assert resolve_kernel("auto", sparse[:-1]) == "linear"
    assert resolve_kernel("auto", sparse[:40], n_rows=80, reduce=lambda a: 2 * a) == "se"  # one of two shards
    assert resolve_kernel("auto", sparse[:40], n_rows=79, reduce=lambda a: 2 * a) == "linear"
    dense = sp.csr_matrix(np.ones((3, D)))
    assert resolve_kernel("auto", dense) == "se" and resolve_kernel("linear", sparse) == "linear"


@pytest.mark.parametrize("kernel, labels, term", [("linear", 12, True), ("se", 12, False), ("linear+se", 12, False),
                                                  ("linear", 3, False)])
def test_linear_term_auto_needs_more_labels_than_latent_gps_and_the_linear_kernel(kernel, labels, term):
    from bayesmlc.gp.initialisation import resolve_linear_term

    params = MLGPF().get_params()
    assert resolve_linear_term(params, labels, 3, kernel) is term
    assert resolve_linear_term(params, 12, 3, kernel, world_size=2) is False
    assert resolve_linear_term({**params, "linear_term": True}, 3, 3, "se") is True


def test_epochs_auto_is_40_with_more_labels_than_latent_gps_or_ten_thousand_rows():
    from bayesmlc.gp.initialisation import resolve_epochs

    assert resolve_epochs("auto", True) == resolve_epochs("auto", True, 50) == 40
    assert resolve_epochs("auto", False) == resolve_epochs("auto", False, 9_999) == 100
    assert resolve_epochs("auto", False, 10_000) == resolve_epochs("auto", False, 50, True) == 40
    assert resolve_epochs("auto", "auto", 10_000) == "auto" and resolve_epochs(7, False, 10_000) == 7


def test_auto_fit_on_many_rows_a_feature_uses_se_latent_gps_without_the_linear_term():
    """End to end: 35 rows a sparse feature column and L = 15 > P = 3 give kernel_ "se" and no linear
    term, the same model as asking for them."""
    X, Y, _ = _planted(seed=2, n=700, D=20)
    auto = MLGPF(epochs=2, **SMALL).fit(X, Y)
    explicit = MLGPF(epochs=2, kernel="se", linear_term=False, **SMALL).fit(X, Y)
    assert auto.kernel_ == "se" and auto.linear_term_ is False
    np.testing.assert_array_equal(auto.decision_function(X), explicit.decision_function(X))


def test_n_latent_auto_is_at_most_the_number_of_labels(tmp_path):
    """"auto" gives min(100, L) latent GPs, the same model as that number given explicitly, and the
    choice (``n_latent_``) is kept by save/load."""
    X, Y, _ = _planted(seed=5, n=120)
    assert Y.shape[1] < 100
    auto = MLGPF(epochs=2, **{**SMALL, "n_latent": "auto"}).fit(X, Y)
    explicit = MLGPF(epochs=2, **{**SMALL, "n_latent": Y.shape[1]}).fit(X, Y)
    assert auto.n_latent_ == Y.shape[1] and auto.parameters_["Phi"].shape == (Y.shape[1], Y.shape[1])
    np.testing.assert_array_equal(auto.decision_function(X), explicit.decision_function(X))
    path = tmp_path / "auto.npz"
    auto.save(path)
    loaded = MLGPF.load(path)
    assert loaded.n_latent_ == Y.shape[1] and loaded.n_latent == "auto"
    np.testing.assert_allclose(loaded.predict_proba(X), auto.predict_proba(X), rtol=1e-6)


def test_warm_start_is_not_thrown_by_a_near_null_loading_direction():
    """With P = L the label SVD's trailing directions hold only the 0.1 x noise, so Phi^T Phi can be
    nearly singular. The warm start's latent targets are posterior means under h ~ N(0, I) with the
    labels' mean variance as noise (a ridge), so shrinking one column of Phi to 1e-5 of its size
    leaves that GP's whitened mean near zero and the others' as they were; least squares divided
    that column's targets by 1e-10 and started the KL in the millions (enron, seed 1)."""
    from bayesmlc.gp.initialisation import build_module, initial_arrays, warm_start_mean

    X, Y, _ = _planted(L=6, P=3)
    settings = MLGPF(kernel="linear", n_latent=6, n_inducing=25, subspace_rank=20, random_state=0)
    arrays = initial_arrays(settings, X, Y, np.random.default_rng(0))
    means = []
    for shrink in (1.0, 1e-5):
        shrunk = dict(arrays, Phi=arrays["Phi"] * np.r_[np.ones(5), shrink].astype(np.float32))
        module = build_module(settings, shrunk)
        warm_start_mean(settings, module, X, Y, np.random.default_rng(1))
        means.append(module.variational.mean.detach().double().numpy())
    well, shrunk = means
    scale = np.linalg.norm(well[:5])
    assert np.linalg.norm(shrunk[5]) < 1e-3 * scale  # the near-null GP gets (almost) no target
    np.testing.assert_allclose(shrunk[:5], well[:5], atol=0.2 * scale / np.sqrt(well[:5].size))
