"""MLGPF's linear term on a per-label support (bayesmlc.gp.linear_support): the support against a
brute-force screening, the products and gradients against dense algebra and finite differences,
the penalty's estimate by exact enumeration of the label draws, the lazy Adam step against torch's
Adam, the evidence curvature against the dense one, and a fit, save/load and load-time refusal."""

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from conftest import planted_linear_problem, shared_negative_targets
from bayesmlc.exceptions import ModelFormatError, ValidationError
from bayesmlc.gp import MLGPF
from bayesmlc.gp.linear_support import SupportLinearTerm, gradient_support
from bayesmlc.gp.linear_term import curvature_weights, evidence_update, utility_curvature
from bayesmlc.metrics import precision_at_k


def _problem(n=30, D=40, L=12, seed=0):
    X = sp.random(n, D, density=0.2, random_state=np.random.RandomState(seed), format="csr", dtype=np.float64)
    X.data = np.random.default_rng(seed).standard_normal(X.nnz)
    Y = sp.random(n, L, density=0.2, random_state=np.random.RandomState(seed + 1), format="csr")
    Y.data[:] = 1.0
    return X, sp.csr_matrix(Y)


def _dense_weights(term: SupportLinearTerm, D: int) -> np.ndarray:
    support, weight = term.support.numpy(), term.weight.double().numpy()
    W = np.zeros((support.shape[0], D))
    for label, row in enumerate(support):
        W[label, row[row >= 0]] = weight[label, row >= 0]
    return W


def _term(X, Y, K=5, seed=0, prior_variance=2.0):
    term = SupportLinearTerm(gradient_support(X, Y, K), prior_variance).double()
    values = np.random.default_rng(seed).standard_normal(term.support.shape) * (term.support.numpy() >= 0)
    term.weight.copy_(torch.as_tensor(values))
    return term


def test_support_is_the_brute_force_standardised_screening():
    X, Y = _problem()
    K = 5
    got = gradient_support(X, Y, K)
    Xd, Yd = X.toarray(), Y.toarray()
    gradient = Yd.T @ Xd - Yd.sum(0)[:, None] * Xd.mean(0)[None, :]
    score = np.abs(gradient) / Xd.std(0)[None, :]
    in_positives = (Yd.T @ (Xd != 0)) > 0
    for label in range(Y.shape[1]):
        candidates = np.flatnonzero(in_positives[label])
        best = candidates[np.argsort(-score[label, candidates], kind="stable")[:K]]
        expected = np.full(K, -1)
        expected[: best.size] = np.sort(best)
        assert np.array_equal(got[label], expected), label
    assert (got[np.asarray(Y.sum(0)).ravel() == 0] == -1).all()


def test_support_blocks_of_labels_give_the_same_support(monkeypatch):
    X, Y = _problem(n=60, L=20, seed=3)
    whole = gradient_support(X, Y, 4)
    monkeypatch.setattr("bayesmlc.feature_support.SUPPORT_BLOCK_ENTRIES", 10)
    assert np.array_equal(gradient_support(X, Y, 4), whole)


@pytest.mark.parametrize("path", ["compiled passes", "dense product"])
def test_products_equal_the_dense_algebra_and_pass_gradcheck(path, monkeypatch):
    """Both ways of forming a block's utilities (the compiled passes over the support columns and the
    product with W scattered into a dense (T, D) matrix), including padded supports and column 0."""
    import bayesmlc.gp.linear_support as linear_support

    if path == "compiled passes":
        monkeypatch.setattr(linear_support, "DENSE_PRODUCT_MAX_ENTRIES", 0)
    else:
        monkeypatch.setattr(linear_support, "DENSE_PRODUCT_COST_RATIO", float("inf"))
    compiled_calls = []
    apply = linear_support._SupportTimes.apply
    monkeypatch.setattr(linear_support._SupportTimes, "apply", lambda *a: compiled_calls.append(1) or apply(*a))
    X, Y = _problem(seed=1)
    term = _term(X, Y, K=30, seed=2)
    support = term.support.numpy()
    assert (support == -1).any() and (support == 0).any()  # padding, and a label that uses column 0
    W = _dense_weights(term, X.shape[1])
    assert np.allclose(term.utilities(X).numpy(), X.toarray() @ W.T, atol=1e-12)
    rows, sampled = np.arange(8), np.array([0, 3, 5, 7])
    pair_rows, pair_labels = np.array([0, 1, 2, 5]), np.array([1, 3, 9, 11])
    from bayesmlc.gp.linear_support import SupportBlock

    block = SupportBlock(term, X[rows], sampled, pair_rows, pair_labels)
    Xr = X[rows].toarray()
    assert np.allclose(block.sampled_utilities().detach().numpy(), Xr @ W[sampled].T, atol=1e-12)
    assert np.allclose(block.positive_utilities().detach().numpy(), (Xr[pair_rows] * W[pair_labels]).sum(1),
                       atol=1e-12)

    def utilities(weight):
        block.weight = weight
        return torch.cat([block.sampled_utilities().reshape(-1), block.positive_utilities()])

    start = block.weight.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(utilities, (start,), eps=1e-6, atol=1e-7)
    assert bool(compiled_calls) == (path == "compiled passes")


def test_pair_values_read_each_pair_from_its_row_in_any_row_order():
    from bayesmlc.gp.linear_support import _pair_values

    X, _ = _problem(n=20, D=15, seed=4)
    rng = np.random.default_rng(5)
    support = np.sort(rng.choice(15, size=(6, 5)), axis=1)  # repeated columns allowed
    support[2, 3:] = -1
    pair_rows = np.array([3, 3, 0, 7, 3, 19, 19, 0])  # runs of a row, and a row met again later
    pair_labels = np.array([0, 2, 1, 5, 4, 2, 3, 0])
    out = np.full((pair_rows.size, 5), np.nan)
    _pair_values(X.indptr, X.indices, X.data, X.shape[1], pair_rows, pair_labels, support, out)
    dense = X.toarray()
    expected = np.where(support[pair_labels] >= 0, dense[pair_rows[:, None], support[pair_labels]], 0.0)
    assert np.array_equal(out, expected)


def test_prior_gradient_estimate_is_unbiased_over_every_label_draw():
    X, Y = _problem(n=9, L=5, seed=4)
    term = _term(X, Y, K=4, seed=5)
    term.set_training_rows(X)
    rows = [0, 3, 6]
    total, draws = torch.zeros_like(term.weight), 0
    for sampled in itertools.combinations(range(5), 2):
        block = term.block(X[rows], shared_negative_targets(Y[rows], list(sampled)))
        total[block.labels] += term.prior_gradient(block, 9)
        draws += 1
    assert torch.allclose(total / draws, term.weight / (term.prior_variance * 9), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("tensor_steps", [False, True], ids=["compiled", "tensor ops (other devices)"])
def test_lazy_adam_step_is_torch_adam_on_the_block_rows(tensor_steps):
    X, Y = _problem(seed=6)
    term = _term(X, Y, seed=7)
    term._tensor_steps = tensor_steps
    before = term.weight.clone()
    block = term.block(X[[0, 4]], shared_negative_targets(Y[[0, 4]], [1, 3]))
    reference = block.weight.detach().clone().requires_grad_()
    adam = torch.optim.Adam([reference], lr=0.05)
    for seed in range(3):
        gradient = torch.randn(block.weight.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        reference.grad = gradient.clone()
        adam.step()
        term.adam_step(block, gradient, 0.05)
    assert torch.allclose(term.weight[block.labels], reference.detach(), rtol=1e-12, atol=1e-14)
    untouched = np.setdiff1d(np.arange(Y.shape[1]), block.labels)
    assert torch.equal(term.weight[untouched], before[untouched])
    assert term.penalty() == pytest.approx(float((term.weight**2).sum()) / (2 * term.prior_variance), rel=1e-10)


def test_evidence_curvature_is_the_dense_curvature_on_the_support():
    X, Y = _problem(seed=8)
    term = _term(X, Y, seed=9)
    f_mean = np.random.default_rng(10).standard_normal(Y.shape)
    support = term.support.numpy()
    dense = utility_curvature(X, f_mean)
    got = term.curvature(X, curvature_weights(f_mean), slice(0, Y.shape[1]))
    expected = np.where(support >= 0, np.take_along_axis(dense, np.maximum(support, 0), axis=1), 0.0)
    assert np.allclose(got, expected, rtol=1e-12, atol=1e-14)
    s2, gamma = evidence_update(term, X, f_mean, None, 1.0)
    d = expected
    gamma_by_hand = float(np.sum(2.0 * d / (1.0 + 2.0 * d)))
    assert gamma == pytest.approx(gamma_by_hand, rel=1e-12)
    assert s2 == pytest.approx(float((term.weight**2).sum()) / gamma_by_hand, rel=1e-12)


TINY = dict(n_latent=2, n_inducing=20, subspace_rank=10, batch_size=100, epochs=30, random_state=0, n_threads=1,
            linear_term=False)


def test_support_term_learns_the_planted_features_and_round_trips(tmp_path):
    X, Y = planted_linear_problem(D=60)
    train, test = slice(0, 300), slice(300, None)
    plain = MLGPF(**TINY).fit(X[train], Y[train])
    model = MLGPF(**dict(TINY, linear_term=True, linear_features=4, linear_prior_variance=16.0)).fit(X[train], Y[train])
    support = model.parameters_["linear.support"].numpy()
    assert all(label in support[label] for label in range(Y.shape[1]))  # each label's own feature is screened in
    assert precision_at_k(Y[test], model.decision_function(X[test]), 1) > \
        precision_at_k(Y[test], plain.decision_function(X[test]), 1) + 0.1
    path = tmp_path / "support.npz"
    model.save(path)
    loaded = MLGPF.load(path)
    assert np.array_equal(loaded.decision_function(X[test]), model.decision_function(X[test]))
    assert torch.equal(loaded.parameters_["linear.support"], model.parameters_["linear.support"])


def test_damaged_support_is_refused_at_load():
    X, Y = planted_linear_problem(D=60, n=120)
    model = MLGPF(**dict(TINY, linear_term=True, linear_features=3, epochs=1)).fit(X, Y)
    support = model.parameters_["linear.support"]
    for damage, message in ((support.double(), "integer"), (support + X.shape[1], r"\[0, 60\)"),
                            (support[:, :-1], "shape")):
        broken = MLGPF(**dict(TINY, linear_term=True, linear_features=3, epochs=1)).fit(X, Y)
        broken.parameters_ = dict(broken.parameters_, **{"linear.support": damage})
        broken._module = None
        with pytest.raises(ModelFormatError, match=message):
            broken._check_fitted_state()


def test_support_size_counts_against_the_entry_limit():
    X, Y = planted_linear_problem(D=60, n=120)
    with pytest.raises(ValidationError, match="linear_max_entries"):
        MLGPF(**dict(TINY, linear_term=True, linear_features=20, linear_max_entries=100)).fit(X, Y)
    MLGPF(**dict(TINY, linear_term=True, linear_features=8, linear_max_entries=100, epochs=1)).fit(X, Y)


@pytest.mark.parametrize("n_latent, linear_term, linear_on, epochs_run",
                         [(2, "auto", True, 40), (2, False, False, 40), (12, "auto", False, 100)])
def test_auto_epochs_follow_the_labels_beyond_the_latent_gps(n_latent, linear_term, linear_on, epochs_run):
    """epochs="auto" on 60 rows: 40 where L = 12 > P = 2 (with the linear term or without), 100 where
    L = P; an int is kept."""
    X, Y = planted_linear_problem(n=60)
    model = MLGPF(n_latent=n_latent, linear_term=linear_term, n_inducing=5, subspace_rank=5, batch_size=60,
                  random_state=0, n_threads=1, device="cpu").fit(X, Y)
    assert model.linear_term_ is linear_on
    assert model.history_["epoch"] == list(range(1, epochs_run + 1))
    assert len(model.step_history_["step"]) == epochs_run
    assert model.epochs == "auto"
    fixed = MLGPF(n_latent=n_latent, n_inducing=5, subspace_rank=5, epochs=3, random_state=0, n_threads=1).fit(X, Y)
    assert len(fixed.history_["epoch"]) == 3
