"""The MLGPF bound: negative sampling is unbiased and respects the label mask; gradients pass a
float64 finite-difference check."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from torch.func import functional_call

from bayesmlc.gp import MLGPF
from bayesmlc.gp.likelihoods import BernoulliLogit
from bayesmlc.gp.initialisation import build_module, initial_arrays
from bayesmlc.gp.objective import minibatch_elbo
from bayesmlc.gp.objective import data_term_full, data_term_sampled, sample_label_entries

DT = torch.float64


def _labels(rng, n, L, density):
    Y = sp.random(n, L, density=density, random_state=np.random.RandomState(int(rng.integers(1 << 30))), format="csr")
    Y.data[:] = 1.0
    Y.sort_indices()
    return Y


def test_sampled_entries_hold_every_positive_and_only_observed_negatives():
    rng = np.random.default_rng(0)
    Y = _labels(rng, 30, 40, 0.1)
    mask = _labels(rng, 30, 40, 0.6)
    mask = ((mask + Y) > 0).astype(np.float32).tocsr()
    for label_mask in (None, mask):
        e = sample_label_entries(Y, label_mask, 5, rng)
        Yd = Y.toarray()
        observed = np.ones_like(Yd) if label_mask is None else label_mask.toarray()
        assert np.all(Yd[e.rows, e.labels][e.signs > 0] == 1)
        assert np.all(Yd[e.rows, e.labels][e.signs < 0] == 0)
        assert np.all(observed[e.rows, e.labels] == 1)
        for i in range(30):
            neg = e.labels[(e.rows == i) & (e.signs < 0)]
            assert len(set(neg)) == len(neg) == min(5, int(observed[i].sum() - Yd[i].sum()))
            assert set(e.labels[(e.rows == i) & (e.signs > 0)]) == set(np.flatnonzero(Yd[i]))
            # the weights restore the negative count: sum of weights = |N_i|
            assert np.isclose(e.weights[(e.rows == i) & (e.signs < 0)].sum(), observed[i].sum() - Yd[i].sum())


def _sampling_problem(rng, B, L, P, masked):
    """Labels (with a mask of observed entries when ``masked``), latent moments, label factors, the
    likelihood and the full data term: the setting of the negative-sampling tests."""
    Y = _labels(rng, B, L, 0.1)
    mask = None
    if masked:
        mask = ((_labels(rng, B, L, 0.7) + Y) > 0).astype(np.float32).tocsr()
    mean_h = torch.as_tensor(rng.standard_normal((B, P)), dtype=DT)
    var_h = torch.as_tensor(rng.uniform(0.1, 1.0, (B, P)), dtype=DT)
    Phi = torch.as_tensor(rng.standard_normal((L, P)), dtype=DT)
    bias = torch.as_tensor(rng.standard_normal(L), dtype=DT)
    lik = BernoulliLogit(10)
    Yd = torch.as_tensor(Y.toarray(), dtype=DT)
    mask_d = None if mask is None else torch.as_tensor(mask.toarray(), dtype=DT)
    full = float(data_term_full(lik, mean_h, var_h, Phi, bias, Yd, mask_d))
    return Y, mask, Yd, mask_d, mean_h, var_h, Phi, bias, lik, full


@pytest.mark.parametrize("masked", [False, True])
def test_negative_sampling_estimate_is_unbiased(masked):
    rng = np.random.default_rng(1)
    B, L, P = 8, 30, 3
    Y, mask, Yd, mask_d, mean_h, var_h, Phi, bias, lik, full = _sampling_problem(rng, B, L, P, masked)
    # with every negative kept the sampled form is the full bound exactly
    everything = sample_label_entries(Y, mask, L, rng)
    assert np.isclose(float(data_term_sampled(lik, mean_h, var_h, Phi, bias, everything)), full, rtol=1e-12)
    # the random estimate: per-entry expectations tabulated once, then many draws of the sampler
    f_mean, f_var = mean_h @ Phi.T + bias, var_h @ Phi.pow(2).T
    table = lik.expected_log_lik(f_mean, f_var, 2 * Yd - 1).numpy()
    draws = []
    for _ in range(3000):
        e = sample_label_entries(Y, mask, 4, rng)
        draws.append(float((table[e.rows, e.labels] * e.weights).sum()))
    draws = np.array(draws)
    standard_error = draws.std() / np.sqrt(draws.size)
    assert draws.std() > 0  # the estimate really is random
    assert abs(draws.mean() - full) < 4 * standard_error


def test_sampled_term_is_the_same_whether_moments_are_dense_or_gathered(monkeypatch):
    import bayesmlc.gp.objective as objective

    rng = np.random.default_rng(5)
    B, L, P = 6, 40, 4
    Y = _labels(rng, B, L, 0.1)
    mean_h = torch.as_tensor(rng.standard_normal((B, P)), dtype=DT, device="cpu").requires_grad_(True)
    var_h = torch.as_tensor(rng.uniform(0.1, 1.0, (B, P)), dtype=DT).requires_grad_(True)
    Phi = torch.as_tensor(rng.standard_normal((L, P)), dtype=DT).requires_grad_(True)
    bias = torch.as_tensor(rng.standard_normal(L), dtype=DT).requires_grad_(True)
    entries = sample_label_entries(Y, None, 7, rng)
    lik = BernoulliLogit(10)
    results = []
    for limit in (B * L, B * L - 1):  # dense moments, then the gathered rows
        monkeypatch.setattr(objective, "DENSE_MOMENT_ENTRIES", limit)
        value = data_term_sampled(lik, mean_h, var_h, Phi, bias, entries)
        results.append((value.detach(), *torch.autograd.grad(value, (mean_h, var_h, Phi, bias))))
    for dense, gathered in zip(*results):
        assert torch.allclose(dense, gathered, rtol=1e-12, atol=1e-12)


def test_label_mask_removes_entries_from_the_full_bound():
    rng = np.random.default_rng(2)
    B, L, P = 5, 7, 2
    mean_h, var_h = torch.randn(B, P, dtype=DT), torch.rand(B, P, dtype=DT)
    Phi, bias = torch.randn(L, P, dtype=DT), torch.randn(L, dtype=DT)
    Y = torch.as_tensor(rng.integers(0, 2, (B, L)), dtype=DT)
    mask = torch.as_tensor(rng.integers(0, 2, (B, L)), dtype=DT)
    lik = BernoulliLogit(10)
    masked = data_term_full(lik, mean_h, var_h, Phi, bias, Y, mask)
    # brute force: sum over the observed entries only, one scalar at a time
    f_mean, f_var = mean_h @ Phi.T + bias, var_h @ Phi.pow(2).T
    total = sum(
        float(lik.expected_log_lik(f_mean[i, k], f_var[i, k], 2 * Y[i, k] - 1))
        for i in range(B) for k in range(L) if mask[i, k] == 1
    )
    assert np.isclose(float(masked), total, rtol=1e-10)


class _Bound(torch.nn.Module):
    def __init__(self, module, likelihood, batch, targets, n_total):
        super().__init__()
        self.module = module
        self.likelihood, self.batch, self.targets, self.n_total = likelihood, batch, targets, n_total

    def forward(self):
        return minibatch_elbo(self.module, self.likelihood, self.batch, self.targets, self.n_total, 1.0, 0.0)[0]


@pytest.mark.parametrize(
    "kernel,inducing,variational",
    [("linear+se", "subspace", "whitened"), ("se", "free", "cholesky"), ("linear", "subspace", "preconditioned"),
     ("se", "subspace", "shared")],
)
def test_gradients_pass_finite_difference_check(kernel, inducing, variational):
    rng = np.random.default_rng(3)
    X = sp.random(12, 6, density=0.5, random_state=np.random.RandomState(3), format="csr").astype(np.float32)
    Y = _labels(rng, 12, 4, 0.4)
    model = MLGPF(n_latent=2, n_inducing=3, kernel=kernel, ard=True, inducing=inducing, subspace_rank=3,
                  variational=variational, init_factors="random", random_state=0)
    module = build_module(model, initial_arrays(model, X, Y, np.random.default_rng(0))).to(DT)
    with torch.no_grad():  # move away from the symmetric initial values
        for p in module.parameters():
            p.add_(0.1 * torch.as_tensor(rng.standard_normal(tuple(p.shape)), dtype=DT))
    batch = module.inducing.make_batch(X[:5])
    targets = ("full", torch.as_tensor(Y[:5].toarray(), dtype=DT), None)
    bound = _Bound(module, BernoulliLogit(10), batch, targets, 12)
    names = [n for n, p in bound.named_parameters() if p.requires_grad]
    values = tuple(dict(bound.named_parameters())[n].detach().clone().requires_grad_(True) for n in names)

    def f(*params):
        return functional_call(bound, dict(zip(names, params)), ())

    assert torch.autograd.gradcheck(f, values, eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("masked", [False, True])
def test_batch_shared_negatives_estimate_is_unbiased(masked):
    """negative_sampling="batch": one sample of labels for all rows, negatives weighted L / S. The Monte
    Carlo mean over many draws matches the full data term within 4 standard errors."""
    from bayesmlc.gp.objective import data_term_shared, sample_shared_negatives

    rng = np.random.default_rng(11)
    B, L, P, S = 8, 30, 3, 6
    Y, mask, Yd, mask_d, mean_h, var_h, Phi, bias, lik, full = _sampling_problem(rng, B, L, P, masked)
    # S >= L takes every label with weight 1: the full term exactly, and no draw is made
    state = rng.bit_generator.state
    everything = sample_shared_negatives(Y, mask, L, rng)
    assert rng.bit_generator.state == state
    assert np.isclose(float(data_term_shared(lik, mean_h, var_h, Phi, bias, everything)), full, rtol=1e-12)
    # the estimator itself (data_term_shared) over many draws of the shared sample
    draws = np.array([
        float(data_term_shared(lik, mean_h, var_h, Phi, bias, sample_shared_negatives(Y, mask, S, rng)))
        for _ in range(3000)
    ])
    standard_error = draws.std() / np.sqrt(draws.size)
    assert draws.std() > 0
    assert abs(draws.mean() - full) < 4 * standard_error
    # and one draw by hand: positives + (L / S) * the sampled labels that are observed negatives
    e = sample_shared_negatives(Y, mask, S, rng)
    table = lik.expected_log_lik(mean_h @ Phi.T + bias, var_h @ Phi.pow(2).T, 2 * Yd - 1).numpy()
    observed = np.ones((B, L)) if mask is None else mask.toarray()
    negative = (Yd.numpy() == 0) & (observed != 0)
    by_hand = (table * Yd.numpy()).sum() + (L / S) * (table[:, e.labels] * negative[:, e.labels]).sum()
    assert np.isclose(float(data_term_shared(lik, mean_h, var_h, Phi, bias, e)), by_hand, rtol=1e-12)
    assert len(set(e.labels)) == S
