"""MLGPF's per-label linear term (bayesmlc.gp.linear_term): the penalty against its closed form, the
unbiasedness of the penalty's sparse gradient estimate (exact enumeration of the draws), the lazy
Adam step against torch's Adam, gradients by finite differences, predictions against a hand
computation, save/load and the refusals."""

import itertools
import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from scipy import integrate

from conftest import planted_linear_problem, shared_negative_targets
from bayesmlc.exceptions import ModelFormatError, ValidationError
from bayesmlc.gp import MLGPF
from bayesmlc.gp.linear_term import LinearTerm, column_inclusion_probability, sparse_times_block
from bayesmlc.gp.objective import minibatch_elbo
from bayesmlc.gp.likelihoods import BernoulliLogit
from bayesmlc.gp.prediction import mean_utilities, predictive_probabilities
from bayesmlc.gp.initialisation import feature_batch


def _rows(n=12, D=7, seed=0, density=0.4):
    X = sp.random(n, D, density=density, random_state=np.random.RandomState(seed), format="csr")
    X.data = np.random.default_rng(seed).standard_normal(X.nnz)
    return sp.csr_matrix(X, dtype=np.float64)


def _term(L=5, D=7, seed=0, dtype=torch.float64, prior_variance=2.0):
    term = LinearTerm(L, D, prior_variance).to(dtype)
    term.weight.copy_(torch.as_tensor(np.random.default_rng(seed).standard_normal((L, D))))
    return term


def test_column_inclusion_probability_is_the_hypergeometric_one():
    for n, b in ((12, 4), (30, 7), (9, 9)):
        df = np.arange(n + 1)
        expected = [1.0 - math.comb(n - d, b) / math.comb(n, b) for d in df]
        assert np.allclose(column_inclusion_probability(df, n, b), expected, rtol=1e-12, atol=1e-14)


def test_block_utilities_equal_the_dense_product():
    X, term = _rows(), _term()
    Y_rows = sp.csr_matrix(np.random.default_rng(1).random((4, 5)) < 0.3, dtype=np.float64)
    rows = np.array([0, 3, 5, 8])
    block = term.block(X[rows], shared_negative_targets(Y_rows, [1, 4]))
    dense = X[rows].toarray() @ term.weight.numpy().T
    assert np.allclose(block.sampled_utilities().detach().numpy(), dense[:, [1, 4]], atol=1e-12)
    pos_rows, pos_labels = np.nonzero(Y_rows.toarray())
    assert np.allclose(block.positive_utilities().detach().numpy(), dense[pos_rows, pos_labels], atol=1e-12)
    full = term.block(X[rows], ("full", None, None))
    assert np.allclose(full.sampled_utilities().detach().numpy(), dense, atol=1e-12)
    assert np.allclose(term.utilities(X).numpy(), X.toarray() @ term.weight.numpy().T, atol=1e-12)


def test_sparse_products_pass_gradcheck():
    X = sp.csr_matrix(_rows(n=5, D=6, seed=2))
    weight = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w: sparse_times_block(w, X), (weight,))
    term = _term(L=4, D=6, seed=3)
    Y_rows = sp.csr_matrix(np.array([[1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 1], [1, 1, 0, 0], [0, 0, 1, 0]]),
                           dtype=np.float64)
    block = term.block(X, shared_negative_targets(Y_rows, [0, 2]))
    start = block.weight.detach().clone()

    def both(w):
        block.weight = w
        return block.sampled_utilities(), block.positive_utilities()

    assert torch.autograd.gradcheck(both, (start.requires_grad_(),))


def test_elbo_gradient_on_the_block_matches_finite_differences():
    """The bound's gradient with respect to the linear block, through the quadrature, against
    central differences (float64, a tiny module with subspace inducing inputs)."""
    X = _rows(n=20, D=8, seed=4, density=0.5)
    Y = sp.csr_matrix(np.random.default_rng(5).random((20, 6)) < 0.3, dtype=np.float64)
    model = MLGPF(n_latent=2, n_inducing=5, subspace_rank=4, epochs=1, batch_size=10, linear_term=True, **DENSE,
                  negative_samples=3, dtype="float64", random_state=0, n_threads=1).fit(X, Y)
    module = model._ensure_module()
    rows = np.arange(10)
    prepared = model.preprocessor_.transform(X)
    targets = shared_negative_targets(Y[rows], [0, 2, 5])
    block = module.linear.block(prepared[rows], targets)
    batch = feature_batch(module, prepared, rows)
    likelihood = BernoulliLogit(10)

    def elbo(w):
        block.weight = w
        return minibatch_elbo(module, likelihood, batch, targets, 20.0, 0.5, model.jitter_, linear=block).elbo

    start = block.weight.detach().clone() + 0.3 * torch.randn_like(block.weight)
    assert torch.autograd.gradcheck(elbo, (start.requires_grad_(),), eps=1e-6, atol=1e-5)


def test_penalty_is_the_gaussian_log_prior_and_follows_the_steps():
    term = _term(prior_variance=2.5)
    W = term.weight.numpy()
    log_prior = -0.5 * W.size * math.log(2 * math.pi * 2.5) - (W**2).sum() / (2 * 2.5)
    constant = -0.5 * W.size * math.log(2 * math.pi * 2.5)
    assert term.penalty() == pytest.approx(constant - log_prior, rel=1e-12)
    X = _rows()
    term.set_training_rows(X)
    block = term.block(X[[1, 2, 6]], ("full", None, None))
    term.adam_step(block, torch.randn_like(block.weight), 0.1)
    assert term.penalty() == pytest.approx(float((term.weight**2).sum()) / (2 * 2.5), rel=1e-10)


def test_prior_gradient_estimate_is_unbiased_over_every_draw():
    """Averaged over every batch of B rows and every sample of S labels (exact enumeration), the
    sparse estimate equals the penalty's full gradient W / (s2 N)."""
    n, D, L, B, S = 9, 6, 4, 3, 2
    X = _rows(n=n, D=D, seed=6, density=0.3)
    X = sp.csr_matrix((np.where(np.arange(X.nnz) == 0, 0.0, X.data), X.indices, X.indptr), shape=X.shape)  # a stored zero
    term = _term(L=L, D=D, seed=7)
    term.set_training_rows(X)
    Y = sp.csr_matrix((n, L))
    total = torch.zeros(L, D, dtype=torch.float64)
    draws = 0
    for rows in itertools.combinations(range(n), B):
        for sampled in itertools.combinations(range(L), S):
            block = term.block(X[list(rows)], shared_negative_targets(Y[list(rows)], list(sampled)))
            estimate = term.prior_gradient(block, n)
            total[np.ix_(block.labels, block.columns)] += estimate
            draws += 1
    assert torch.allclose(total / draws, term.weight / (term.prior_variance * n), rtol=1e-10, atol=1e-14)


def test_lazy_adam_step_is_torch_adam_on_the_block_and_leaves_the_rest():
    term = _term(seed=8)
    before = term.weight.clone()
    X = _rows(seed=9)
    block = term.block(X[[0, 4]], shared_negative_targets(sp.csr_matrix((2, 5)), [1, 3]))
    reference = block.weight.detach().clone().requires_grad_()
    adam = torch.optim.Adam([reference], lr=0.05)
    for seed in range(3):
        gradient = torch.randn(block.weight.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        reference.grad = gradient.clone()
        adam.step()
        term.adam_step(block, gradient, 0.05)
        block.weight = term.weight[np.ix_(block.labels, block.columns)].clone()
    assert torch.allclose(term.weight[np.ix_(block.labels, block.columns)], reference.detach(), rtol=1e-12, atol=1e-14)
    untouched = torch.ones_like(before, dtype=torch.bool)
    untouched[np.ix_(block.labels, block.columns)] = False
    assert torch.equal(term.weight[untouched], before[untouched])


TINY = dict(n_latent=2, n_inducing=20, subspace_rank=10, batch_size=100, epochs=30, random_state=0, n_threads=1,
            linear_term=False)
#: the dense W of this file's tests, at a fixed s2
DENSE = dict(linear_features=None, linear_prior_variance=16.0)


def test_linear_term_learns_what_the_factors_cannot_and_predicts_by_hand(tmp_path):
    X, Y = planted_linear_problem()
    train, test = slice(0, 300), slice(300, None)
    plain = MLGPF(**TINY).fit(X[train], Y[train])
    model = MLGPF(**dict(TINY, linear_term=True, linear_learning_rate=0.1, **DENSE)).fit(X[train], Y[train])
    from bayesmlc.metrics import precision_at_k

    assert precision_at_k(Y[test], model.decision_function(X[test]), 1) > \
        precision_at_k(Y[test], plain.decision_function(X[test]), 1) + 0.1
    # by hand: the factor model's mean utilities plus X W^T, and E[sigmoid] by quadrature of scipy
    module = model._ensure_module()
    prepared = model.preprocessor_.transform(X[test][:4])
    W = model.parameters_["linear.weight"].double().numpy()
    linear = module.linear
    module.linear = None
    try:
        factors, _ = mean_utilities(module, prepared, model.jitter_)
        from bayesmlc.gp.objective import latent_marginals, utility_moments

        batch = module.inducing.make_batch(prepared)
        mean_h, var_h, _ = latent_marginals(module, batch, model.jitter_)
        f_mean, f_var = (t.detach().double().numpy() for t in utility_moments(mean_h, var_h, module.Phi, module.bias))
    finally:
        module.linear = linear
    by_hand = prepared.toarray() @ W.T
    assert np.allclose(model._mean_utilities(prepared), factors + by_hand, atol=1e-4)
    proba = predictive_probabilities(module, prepared, model.jitter_, 30)
    for i, l in ((0, 0), (1, 3), (3, 7)):
        m, v = f_mean[i, l] + by_hand[i, l], f_var[i, l]
        expected = integrate.quad(lambda z: math.exp(-z * z / 2) / math.sqrt(2 * math.pi) / (1 + math.exp(-m - math.sqrt(v) * z)),
                                  -12, 12)[0]
        assert proba[i, l] == pytest.approx(expected, abs=1e-5)
    path = tmp_path / "linear.npz"
    model.save(path)
    loaded = MLGPF.load(path)
    assert np.array_equal(loaded.decision_function(X[test]), model.decision_function(X[test]))
    assert not any(k.startswith("linear.exp") for k in loaded.parameters_)  # the Adam state stays out of models


def test_damaged_linear_weight_is_refused_at_load(tmp_path):
    X, Y = planted_linear_problem(n=120)
    model = MLGPF(**dict(TINY, linear_term=True, epochs=1, **DENSE)).fit(X, Y)
    for damage, message in ((lambda w: w[:, :-1], "shape"), (lambda w: w * float("nan"), "finite")):
        broken = MLGPF(**dict(TINY, linear_term=True, epochs=1, **DENSE)).fit(X, Y)
        broken.parameters_ = dict(broken.parameters_, **{"linear.weight": damage(model.parameters_["linear.weight"])})
        broken._module = None
        with pytest.raises(ModelFormatError, match=message):
            broken._check_fitted_state()


def test_linear_term_refusals_name_the_setting():
    X, Y = planted_linear_problem(n=120)
    with pytest.raises(ValidationError, match="linear_max_entries"):
        MLGPF(**dict(TINY, linear_term=True, linear_max_entries=100, **DENSE)).fit(X, Y)
    with pytest.raises(ValidationError, match="negative_sampling"):
        MLGPF(**dict(TINY, linear_term=True, negative_samples=3, negative_sampling="row")).fit(X, Y)


def test_checkpoint_resume_with_the_linear_term_gives_the_uninterrupted_result(tmp_path):
    X, Y = planted_linear_problem(seed=3, n=200)
    params = dict(TINY, linear_term=True, **DENSE, negative_samples=4, lr_decay=0.0, checkpoint_every=1)
    path = tmp_path / "run.ckpt.npz"
    straight = MLGPF(**dict(params, epochs=4, checkpoint_path=str(tmp_path / "other.npz"))).fit(X, Y)
    MLGPF(**dict(params, epochs=2, checkpoint_path=str(path))).fit(X, Y)
    resumed = MLGPF(**dict(params, epochs=4, checkpoint_path=str(path))).fit(X, Y, resume=True)
    for name, value in straight.parameters_.items():
        assert torch.equal(value, resumed.parameters_[name]), name
