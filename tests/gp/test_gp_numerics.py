"""MLGPF building blocks against independent computations: quadrature vs Monte Carlo, KL vs dense
torch.distributions, marginals vs the dense q(f) each family implies, subspace kernel matrices vs
the explicit Z = A X~, Cholesky jitter retries."""

import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from torch.distributions import MultivariateNormal, kl_divergence

from bayesmlc.gp.inducing import InputSpaceInducing, SubspaceInducing, truncated_svd
from bayesmlc.gp.kernels import make_kernel
from bayesmlc.gp.likelihoods import TAIL_RELATIVE_ERROR, BernoulliLogit, tail_entries
from bayesmlc.gp.variational import CholeskyError, make_variational, robust_cholesky
from bayesmlc.linalg import _gram, basis_gram, top_singular_vectors

DT = torch.float64


def _sparse_rows(rng, n, d, density=0.3):
    X = sp.random(n, d, density=density, random_state=np.random.RandomState(int(rng.integers(1 << 30))), format="csr")
    X.data = rng.standard_normal(X.nnz)
    return X.astype(np.float32)


def _perturb(family, rng):
    """Move every variational parameter away from its initial value."""
    with torch.no_grad():
        for p in family.parameters():
            p.add_(torch.as_tensor(0.3 * rng.standard_normal(tuple(p.shape)), dtype=p.dtype))


def _se_kernel_matrices(rng, M=6, B=5, D=4):
    Z = torch.as_tensor(rng.standard_normal((M, D)), dtype=DT)
    Xb = torch.as_tensor(rng.standard_normal((B, D)), dtype=DT)
    def k(a, b):
        return 1.3 * torch.exp(-0.5 * torch.cdist(a, b).pow(2) / 1.5**2)
    return k(Z, Z), k(Xb, Z), torch.full((B,), 1.3, dtype=DT), k(Xb, Xb)


# ---- likelihood ------------------------------------------------------------------------------
def test_quadrature_matches_monte_carlo():
    gen = torch.Generator().manual_seed(0)
    mean = torch.tensor([-3.0, -0.5, 0.0, 1.2, 4.0], dtype=DT)
    var = torch.tensor([0.05, 2.0, 1.0, 0.5, 6.0], dtype=DT)
    sign = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0], dtype=DT)
    lik = BernoulliLogit(20)
    f = mean + var.sqrt() * torch.randn(1_000_000, 5, generator=gen, dtype=DT)
    mc_loglik = torch.nn.functional.logsigmoid(sign * f)
    mc_proba = torch.sigmoid(f)
    quad = lik.expected_log_lik(mean, var, sign)
    tol = 4 * mc_loglik.std(0) / math.sqrt(f.shape[0])
    assert torch.all((quad - mc_loglik.mean(0)).abs() < tol + 1e-4)
    proba_tol = 4 * mc_proba.std(0) / math.sqrt(f.shape[0])
    assert torch.all((lik.predictive_mean(mean, var) - mc_proba.mean(0)).abs() < proba_tol + 1e-4)
    # ten nodes (the paper's choice) are already accurate to 1e-3 on these inputs
    assert torch.allclose(BernoulliLogit(10).expected_log_lik(mean, var, sign), quad, atol=2e-3)


def test_predictive_mean_in_blocks_matches_scipy_integration(monkeypatch):
    """The blocked grid (blocks of one to a few entries, ragged last block, a broadcast 2-D input)
    gives the per-entry E[sigmoid(f)] that scipy's adaptive quadrature gives."""
    from scipy.integrate import quad
    from scipy.special import expit

    import bayesmlc.gp.likelihoods as likelihoods

    rng = np.random.default_rng(3)
    mean = torch.as_tensor(rng.normal(0.0, 2.0, (7, 3)), dtype=DT)
    var = torch.as_tensor(rng.uniform(0.01, 3.0, (1, 3)), dtype=DT)
    def integral(m, v):
        sd = math.sqrt(v)
        return quad(lambda f: expit(f) * math.exp(-0.5 * ((f - m) / sd) ** 2) / (sd * math.sqrt(2 * math.pi)),
                    m - 12 * sd, m + 12 * sd, epsabs=1e-12)[0]
    expected = np.array([[integral(mean[i, j].item(), var[0, j].item()) for j in range(3)] for i in range(7)])
    lik = BernoulliLogit(30)
    for block in (1, 2 * 30, 4 * 30, 1 << 19):  # one entry, two, four (ragged: 21 = 5 x 4 + 1), one block
        monkeypatch.setattr(likelihoods, "GRID_BLOCK_ENTRIES", block)
        got = lik.predictive_mean(mean, var)
        assert got.shape == (7, 3)
        np.testing.assert_allclose(got.numpy(), expected, atol=1e-7)



def _expected_log_sigmoid_by_integration(mean, var, sign):
    """E[log sigmoid(sign f)], f ~ N(mean, var), by the trapezoid rule on a fine grid of +-12 sd."""
    out = []
    for m, v, s in zip(mean.tolist(), var.tolist(), sign.tolist()):
        sd = math.sqrt(v)
        f = np.linspace(m - 12 * sd, m + 12 * sd, 200_001)
        density = np.exp(-0.5 * ((f - m) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))
        out.append(np.trapezoid(-np.logaddexp(0.0, -s * f) * density, f))
    return torch.tensor(out, dtype=DT)


def test_tail_series_matches_numerical_integration():
    # deep-tail entries (the series), entries near the boundary, and entries outside the tail (quadrature)
    mean = torch.tensor([-7.0, -5.2, -3.2, 9.0, -12.0, -4.0, -1.0, 2.0, -6.0], dtype=DT)
    var = torch.tensor([0.5, 0.6, 0.01, 1.5, 2.5, 0.4, 1.0, 0.3, 2.5], dtype=DT)
    sign = torch.tensor([-1.0, -1.0, -1.0, 1.0, -1.0, -1.0, -1.0, 1.0, -1.0], dtype=DT)
    lik = BernoulliLogit(10)
    tail = tail_entries(-sign * mean, var)
    assert tail[:5].all() and not tail[5:].any()
    exact = _expected_log_sigmoid_by_integration(mean, var, sign)
    value = lik.expected_log_lik(mean, var, sign)
    # the series: relative error at most TAIL_RELATIVE_ERROR (its first omitted term) plus rounding
    assert torch.all(((value - exact).abs() / exact.abs())[tail] < 2 * TAIL_RELATIVE_ERROR)
    # quadrature everywhere agrees as well, and the two rules agree where both apply
    quadrature_only = BernoulliLogit(10, tail_series=False).expected_log_lik(mean, var, sign)
    assert torch.allclose(quadrature_only[~tail], value[~tail], rtol=0, atol=0)
    assert torch.allclose(quadrature_only, exact, rtol=1e-4, atol=1e-6)


def test_a_variance_rounded_below_zero_takes_the_quadrature_at_the_floor():
    """A deep-tail mean with a variance a rounding step below zero is left to the quadrature, which
    floors the variance: the value is log sigmoid(sign mean), the closed form at zero variance."""
    mean, var, sign = (torch.tensor([v], dtype=DT) for v in (-8.0, -1e-12, -1.0))
    assert not tail_entries(-sign * mean, var).any()
    value = BernoulliLogit(10).expected_log_lik(mean, var, sign)
    assert torch.allclose(value, torch.nn.functional.logsigmoid(sign * mean), rtol=1e-9, atol=0)


@pytest.mark.parametrize("tail_series", [True, False])
def test_expected_log_lik_gradients_match_finite_differences(tail_series):
    gen = torch.Generator().manual_seed(3)
    mean = (torch.randn(60, generator=gen, dtype=DT) * 4 - 3).requires_grad_()
    var = (torch.rand(60, generator=gen, dtype=DT) * 2 + 1e-3).requires_grad_()
    sign = torch.where(torch.rand(60, generator=gen) < 0.5, -1.0, 1.0).to(DT)
    lik = BernoulliLogit(10, tail_series=tail_series)
    if tail_series:  # both rules are exercised
        tail = tail_entries(-sign * mean.detach(), var.detach())
        assert 0 < int(tail.sum()) < 60
    assert torch.autograd.gradcheck(lambda m, v: lik.expected_log_lik(m, v, sign), (mean, var))
    # broadcasting: a scalar sign against (B, S) moments, as the shared negatives use it
    m2, v2 = mean.detach().reshape(6, 10).requires_grad_(), var.detach().reshape(6, 10).requires_grad_()
    minus = -torch.ones((), dtype=DT)
    assert torch.autograd.gradcheck(lambda m, v: lik.expected_log_lik(m, v, minus), (m2, v2))
    # a (1, S) variance broadcast over the rows, and a gradient for one argument only
    v_row = var.detach()[:10].reshape(1, 10).requires_grad_()
    assert torch.autograd.gradcheck(lambda m, v: lik.expected_log_lik(m, v, minus), (m2, v_row))
    assert torch.autograd.gradcheck(lambda m: lik.expected_log_lik(m, var.detach()[:10], minus), (m2,))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_threaded_sparse_products_equal_scipy_and_do_not_depend_on_the_thread_count(dtype):
    from bayesmlc.linalg import _ThreadedProducts

    rng = np.random.default_rng(5)
    X = _sparse_rows(rng, 6000, 40, density=0.25).astype(np.float64)  # 60,000 entries: 3 threads' worth
    X[7] = 0.0  # an empty row, and an empty feature column below
    X = sp.csr_matrix(X)
    X.eliminate_zeros()
    X[:, 3] = 0.0
    X.eliminate_zeros()
    W = rng.standard_normal((40, 7))
    Y = rng.standard_normal((6000, 7))
    eps = np.finfo(dtype).eps

    def assert_within_summation_bound(result, exact, magnitudes, terms):
        # |computed - exact| <= terms * eps * sum |x_k y_k|: the error bound of a recursive sum
        assert np.all(np.abs(result - exact) <= terms * eps * magnitudes + 1e-300)

    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            products = _ThreadedProducts(X, dtype)
            assert products.workers == threads
            times, transpose_times = products.times(W), products.transpose_times(Y)
            assert times.dtype == dtype and transpose_times.dtype == dtype
            row_terms, column_terms = np.diff(X.indptr).max(), np.bincount(X.indices).max()
            assert_within_summation_bound(times, X @ W, abs(X) @ np.abs(W), row_terms + 2)
            assert_within_summation_bound(transpose_times, X.T @ Y, abs(X).T @ np.abs(Y), column_terms + 2)
            out = np.full((40, 7), np.nan, dtype=dtype)  # written whole, in place
            assert products.transpose_times(Y, out=out) is out
            np.testing.assert_array_equal(out, transpose_times)
            results.append((times, transpose_times))
    finally:
        torch.set_num_threads(before)
    for times, transpose_times in results[1:]:  # the same bits at every thread count
        np.testing.assert_array_equal(times, results[0][0])
        np.testing.assert_array_equal(transpose_times, results[0][1])


def test_sign_of_largest_entry_matches_argmax_of_the_absolute_values():
    from bayesmlc.linalg import _sign_of_largest

    rng = np.random.default_rng(3)
    Vt = rng.integers(-3, 4, size=(400, 9)).astype(np.float32)  # many ties between +a and -a
    Vt[0] = 0.0
    Vt[0, 2], Vt[0, 5] = -2.0, 2.0  # tie: the first one (negative) decides
    Vt[1] = 0.0
    Vt[1, 1], Vt[1, 4] = 2.0, -2.0
    expected = np.sign(Vt[np.arange(400), np.abs(Vt).argmax(axis=1)])
    expected[expected == 0] = 1.0  # an all-zero row gets +1
    np.testing.assert_array_equal(_sign_of_largest(Vt), expected)
    assert _sign_of_largest(Vt)[0] == -1.0 and _sign_of_largest(Vt)[1] == 1.0


# ---- variational families ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["whitened", "cholesky", "preconditioned", "shared"])
def test_kl_matches_dense_gaussian_kl(name):
    rng = np.random.default_rng(1)
    K_zz, _, _, _ = _se_kernel_matrices(rng)
    family = make_variational(name, n_latent=3, n_inducing=K_zz.shape[0]).to(DT)
    _perturb(family, rng)
    prep = family.prepare(K_zz, jitter=0.0)
    assert prep.jitter == 0.0
    mean_u, cov_u = family.dense_q_u(prep)
    prior = MultivariateNormal(torch.zeros(K_zz.shape[0], dtype=DT), covariance_matrix=K_zz)
    expected = torch.stack([
        kl_divergence(MultivariateNormal(mean_u[p], covariance_matrix=0.5 * (cov_u[p] + cov_u[p].T)), prior)
        for p in range(3)
    ])
    assert torch.allclose(family.kl(prep), expected, rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("name", ["whitened", "cholesky", "preconditioned", "shared"])
def test_marginals_match_dense_q_f(name):
    rng = np.random.default_rng(2)
    K_zz, K_xz, k_xx, K_xx = _se_kernel_matrices(rng)
    family = make_variational(name, n_latent=3, n_inducing=K_zz.shape[0]).to(DT)
    _perturb(family, rng)
    prep = family.prepare(K_zz, jitter=0.0)
    mean, var = family.marginals(prep, K_xz, k_xx)
    mean_u, cov_u = family.dense_q_u(prep)
    # q(f) = N(K_xz K^-1 m, K_xx - K_xz K^-1 K_zx + K_xz K^-1 S K^-1 K_zx), computed densely
    W = torch.linalg.solve(K_zz, K_xz.T)  # K^-1 K_zx
    for p in range(3):
        cov_f = K_xx - K_xz @ W + W.T @ cov_u[p] @ W
        assert torch.allclose(mean[:, p], W.T @ mean_u[p], rtol=1e-6, atol=1e-8)
        assert torch.allclose(var[:, p], torch.diagonal(cov_f), rtol=1e-6, atol=1e-8)
    weights = family.mean_weights(prep)
    assert torch.allclose(K_xz @ weights, mean, rtol=1e-6, atol=1e-8)


def test_shared_family_equals_whitened_with_scaled_copies_of_one_scale():
    # the shared family is the whitened one with S_p = c_p S: marginals and KL must agree
    rng = np.random.default_rng(4)
    K_zz, K_xz, k_xx, _ = _se_kernel_matrices(rng)
    shared = make_variational("shared", n_latent=3, n_inducing=K_zz.shape[0]).to(DT)
    _perturb(shared, rng)
    whitened = make_variational("whitened", n_latent=3, n_inducing=K_zz.shape[0]).to(DT)
    S = shared.scale().detach()
    S_p = shared.gp_scale().detach()[:, None, None] * S  # (P, M, M), diagonal still positive
    with torch.no_grad():
        whitened.mean.copy_(shared.mean)
        whitened.scale_offdiag.copy_(torch.tril(S_p, diagonal=-1))
        diag = torch.diagonal(S_p, dim1=-2, dim2=-1)
        whitened.raw_scale_diag.copy_(diag + torch.log(-torch.expm1(-diag)))  # inverse softplus
    prep_s, prep_w = shared.prepare(K_zz, 0.0), whitened.prepare(K_zz, 0.0)
    for got, want in zip(shared.marginals(prep_s, K_xz, k_xx), whitened.marginals(prep_w, K_xz, k_xx)):
        assert torch.allclose(got, want, rtol=1e-9, atol=1e-10)
    assert torch.allclose(shared.kl(prep_s), whitened.kl(prep_w), rtol=1e-9, atol=1e-10)


def test_preconditioned_marginals_are_the_papers_corrected_formulas():
    # m_f = K_XZ mu (not K_X mu) and S_f = K_X - K_XZ (K_Z + Sigma)^-1 K_ZX (reference notes 1.11)
    rng = np.random.default_rng(3)
    K_zz, K_xz, k_xx, K_xx = _se_kernel_matrices(rng)
    family = make_variational("preconditioned", n_latent=2, n_inducing=K_zz.shape[0]).to(DT)
    _perturb(family, rng)
    mean, var = family.marginals(family.prepare(K_zz, 0.0), K_xz, k_xx)
    for p in range(2):
        B = K_zz + torch.diag(family.sigma()[p])
        assert torch.allclose(mean[:, p], K_xz @ family.mu[p])
        assert torch.allclose(var[:, p], torch.diagonal(K_xx - K_xz @ torch.linalg.solve(B, K_xz.T)))


def test_robust_cholesky_retries_with_growing_jitter():
    v = torch.tensor([[1.0], [2.0], [3.0]], dtype=DT)
    singular = v @ v.T - 1e-9 * torch.eye(3, dtype=DT)  # smallest eigenvalue -1e-9
    L, used = robust_cholesky(singular, jitter=1e-12)
    assert used >= 1e-9 / singular.diagonal().mean()  # retried until the shift beat -1e-9
    assert torch.allclose(L @ L.T, singular + used * singular.diagonal().mean() * torch.eye(3, dtype=DT), atol=1e-10)
    with pytest.raises(CholeskyError, match="not positive definite"):
        robust_cholesky(-torch.eye(3, dtype=DT), jitter=1e-6, max_tries=2)


# ---- kernels and inducing inputs ---------------------------------------------------------------
def _explicit_kernel(name, X, Z, weights=None, variance_lin=1.0, variance_se=1.0, lengthscale=1.0):
    Xw = X if weights is None else X * weights.sqrt()
    Zw = Z if weights is None else Z * weights.sqrt()
    lin = lambda a, b: a @ b.T
    se = lambda a, b: torch.exp(-0.5 * torch.cdist(a, b).pow(2) / lengthscale**2)
    if name == "linear":
        f = lambda a, b: variance_lin * lin(a, b)
    elif name == "se":
        f = lambda a, b: variance_se * se(a, b)
    else:
        f = lambda a, b: variance_lin * lin(a, b) + variance_se * se(a, b)
    return f(Zw, Zw), f(Xw, Zw), torch.diagonal(f(Xw, Xw))


@pytest.mark.parametrize("name", ["linear", "se", "linear+se"])
def test_subspace_kernel_matrices_equal_explicit_ones(name):
    rng = np.random.default_rng(4)
    X = _sparse_rows(rng, 40, 15)
    basis = truncated_svd(X, 6, seed=0)
    A = rng.standard_normal((5, 6)).astype(np.float32)
    inducing = SubspaceInducing(basis, A, trainable=True).to(DT)
    kernel = make_kernel(name, None).to(DT)
    batch = inducing.make_batch(X[:7])
    blocks = kernel(inducing.inner_products(batch, None))
    # explicit: Z = A X~ in input space, dense X
    Z = torch.as_tensor(A, dtype=DT) @ torch.as_tensor(basis, dtype=DT)
    Xd = torch.as_tensor(X[:7].toarray(), dtype=DT)
    var_lin = 0.5 if name == "linear+se" else 1.0
    zz, xz, xx = _explicit_kernel(name, Xd, Z, variance_lin=var_lin, variance_se=var_lin)
    assert torch.allclose(blocks.zz, zz, atol=2e-5)
    assert torch.allclose(blocks.xz, xz, atol=2e-5)
    assert torch.allclose(blocks.xx, xx, atol=2e-5)
    # precomputed projections X X~^T (U S) give the same cross products as the sparse product
    batch_cached = inducing.make_batch(X[:7], projected=np.asarray(X[:7] @ basis.T))
    assert torch.allclose(kernel(inducing.inner_products(batch_cached, None)).xz, xz, atol=2e-5)


def test_subspace_gram_is_dropped_only_for_an_orthonormal_basis():
    rng = np.random.default_rng(9)
    X = _sparse_rows(rng, 30, 12)
    A = rng.standard_normal((4, 5)).astype(np.float32)
    svd_basis = truncated_svd(X, 5, seed=0)
    skewed = svd_basis + 0.3 * rng.standard_normal(svd_basis.shape).astype(np.float32)  # not orthonormal
    for basis, orthonormal in ((svd_basis, True), (skewed, False)):
        inducing = SubspaceInducing(basis, A, trainable=False)
        assert inducing.orthonormal_basis is orthonormal
        inner = inducing.inner_products(inducing.make_batch(X[:3]), None)
        Z = torch.as_tensor(A @ basis, dtype=torch.float64)  # Z = A X~ (eq. (4))
        assert torch.allclose(inner.zz.double(), Z @ Z.T, rtol=1e-4, atol=1e-4)
        assert torch.allclose(inner.xz.double(), torch.as_tensor(X[:3].toarray(), dtype=torch.float64) @ Z.T,
                              rtol=1e-4, atol=1e-4)


def test_row_gram_gradient_is_that_of_the_dense_product():
    from bayesmlc.gp.inducing import _RowGram

    rng = np.random.default_rng(4)
    A = torch.tensor(rng.standard_normal((6, 9)), dtype=DT, requires_grad=True)
    assert torch.autograd.gradcheck(_RowGram.apply, (A,))
    G = torch.as_tensor(rng.standard_normal((6, 6)), dtype=DT)  # not symmetric
    (grad_custom,) = torch.autograd.grad((_RowGram.apply(A) * G).sum(), A)
    (grad_dense,) = torch.autograd.grad(((A @ A.T) * G).sum(), A)
    torch.testing.assert_close(grad_custom, grad_dense, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(_RowGram.apply(A), A @ A.T, rtol=0.0, atol=0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_subspace_projection_equals_the_dense_product_and_each_row_its_own(dtype):
    rng = np.random.default_rng(12)
    X = sp.random(3000, 60, density=0.2, format="csr", random_state=7, dtype=np.float64)  # 36,000 entries
    basis = np.linalg.qr(rng.standard_normal((60, 9)))[0].T
    inducing = SubspaceInducing(basis, rng.standard_normal((4, 9)), trainable=False).to(dtype)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        projected = inducing.project(X)
        assert projected.dtype == dtype and projected.shape == (3000, 9)
        exact = X @ inducing.basis_t.double().numpy()  # float64 SciPy product of the stored basis
        tolerance = 1e-5 if dtype == torch.float32 else 1e-12
        np.testing.assert_allclose(projected.double().numpy(), exact, rtol=tolerance, atol=tolerance)
        rows = np.array([5, 2999, 17, 1200])  # a row's projection: the same bits in any batch
        np.testing.assert_array_equal(inducing.project(X[rows]).numpy(), projected.numpy()[rows])
    finally:
        torch.set_num_threads(before)


def test_subspace_ard_is_the_inner_product_of_the_stated_metric():
    # <x, x'>_w = (x X~^T) diag(w) (X~ x'^T) + w0 (<x, x'> - (x X~^T)(X~ x'^T))
    rng = np.random.default_rng(5)
    X = _sparse_rows(rng, 30, 12)
    basis = truncated_svd(X, 4, seed=0)
    A = rng.standard_normal((3, 4)).astype(np.float32)
    inducing = SubspaceInducing(basis, A, trainable=True).to(DT)
    weights = torch.as_tensor(rng.uniform(0.5, 2.0, 5), dtype=DT)
    V = torch.as_tensor(basis, dtype=DT)
    metric = V.T @ torch.diag(weights[:-1]) @ V + weights[-1] * (torch.eye(12, dtype=DT) - V.T @ V)
    Z = torch.as_tensor(A, dtype=DT) @ V
    Xd = torch.as_tensor(X[:6].toarray(), dtype=DT)
    inner = inducing.inner_products(inducing.make_batch(X[:6]), weights)
    assert torch.allclose(inner.zz, Z @ metric @ Z.T, atol=1e-5)
    assert torch.allclose(inner.xz, Xd @ metric @ Z.T, atol=1e-5)
    assert torch.allclose(inner.xx, torch.diagonal(Xd @ metric @ Xd.T), atol=1e-5)


@pytest.mark.parametrize("name", ["linear", "se", "linear+se"])
def test_input_space_kernels_with_ard_equal_explicit_ones(name):
    rng = np.random.default_rng(6)
    X = _sparse_rows(rng, 9, 8)
    Z = rng.standard_normal((4, 8)).astype(np.float32)
    inducing = InputSpaceInducing(Z, trainable=True).to(DT)
    kernel = make_kernel(name, inducing.n_weights).to(DT)
    with torch.no_grad():
        kernel.raw_weights.copy_(torch.as_tensor(rng.standard_normal(8)))
    weights = kernel.input_weights()
    blocks = kernel(inducing.inner_products(inducing.make_batch(X), weights))
    var = 0.5 if name == "linear+se" else 1.0
    zz, xz, xx = _explicit_kernel(
        name, torch.as_tensor(X.toarray(), dtype=DT), torch.as_tensor(Z, dtype=DT), weights, var, var
    )
    assert torch.allclose(blocks.zz, zz, atol=1e-5)
    assert torch.allclose(blocks.xz, xz, atol=1e-5)
    assert torch.allclose(blocks.xx, xx, atol=1e-5)


def test_truncated_svd_matches_dense_svd_and_never_needs_dense_input():
    rng = np.random.default_rng(7)
    X = _sparse_rows(rng, 60, 25)
    basis = truncated_svd(X, 5, seed=0)
    _, s, Vt = np.linalg.svd(X.toarray(), full_matrices=False)
    # orthonormal rows, and the energy the best rank-5 subspace keeps (sum of the top
    # five squared singular values): this spectrum is flat (s5 / s6 = 1.065), so four subspace
    # iterations leave the projector 7e-3 from the dense one but keep all but 1.1e-4 of the energy
    assert basis.dtype == np.float32
    assert np.allclose(basis @ basis.T, np.eye(5), atol=1e-5)
    captured = float((np.asarray(X @ basis.T) ** 2).sum())
    assert 0.0 <= 1.0 - captured / float((s[:5] ** 2).sum()) < 2e-4


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gram_matrices_by_syrk_equal_float64_products(dtype):
    # row chunks of 7 over 50 rows: the accumulation crosses chunk boundaries and ends on a short one
    M = (np.random.default_rng(0).standard_normal((50, 9)) * np.logspace(0, 3, 9)).astype(dtype)
    exact = M.astype(np.float64).T @ M.astype(np.float64)
    G = _gram(M, rows=7)
    np.testing.assert_allclose(G, exact, rtol=1e-13, atol=1e-13 * np.abs(exact).max())
    np.testing.assert_array_equal(G, G.T)
    basis = M.T.astype(np.float32)  # (9, 50)
    K = basis_gram(basis)
    assert K.dtype == np.float32
    np.testing.assert_array_equal(K, K.T)
    np.testing.assert_allclose(K, basis.astype(np.float64) @ basis.T.astype(np.float64), rtol=1e-5,
                               atol=1e-6 * np.abs(exact).max())


def test_the_svds_blas_calls_run_on_torchs_thread_count(monkeypatch):
    """SciPy's and NumPy's BLAS (OpenBLAS, its own pool) inside the iteration use torch's thread count,
    as its sparse products do: a one-thread fit stays on one thread."""
    from threadpoolctl import threadpool_info

    import bayesmlc.linalg as linalg

    seen = []

    def recording(name):
        original = getattr(linalg.blas, name)

        def call(*args, **kwargs):
            seen.extend(pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas")
            return original(*args, **kwargs)
        return call

    monkeypatch.setattr(linalg.blas, "dsyrk", recording("dsyrk"))
    monkeypatch.setattr(linalg.blas, "ssyrk", recording("ssyrk"))
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        X = _sparse_rows(np.random.default_rng(2), 40, 12)
        basis_gram(truncated_svd(X, 4, seed=0))
    finally:
        torch.set_num_threads(previous)
    assert seen and set(seen) == {1}


@pytest.mark.parametrize("dtype, atol", [(np.float64, 1e-12), (np.float32, 2e-6)])
def test_top_singular_vectors_of_a_matrix_of_lower_rank_than_asked(dtype, atol):
    # rank 3, 12 rows (fewer than the 15 columns of the iteration), 5 vectors asked: the top 3 are the
    # dense SVD's, the other 2 orthonormal directions with singular value 0, and X X~^T is exact
    rng = np.random.default_rng(0)
    X = sp.csr_matrix(rng.standard_normal((12, 3)) @ rng.standard_normal((3, 30))).astype(dtype)
    Vt, s = top_singular_vectors(X, 5, seed=0, dtype=dtype)
    _, s_dense, Vt_dense = np.linalg.svd(X.toarray().astype(np.float64))
    np.testing.assert_allclose(s[:3], s_dense[:3], rtol=10 * atol)
    np.testing.assert_array_equal(s[3:], 0.0)
    np.testing.assert_allclose(Vt @ Vt.T, np.eye(5), atol=atol)
    np.testing.assert_allclose(np.abs(Vt[:3] @ Vt_dense[:3].T), np.eye(3), atol=atol)


@pytest.mark.parametrize("name", ["whitened", "cholesky", "preconditioned", "shared"])
def test_set_mean_gives_the_requested_mean_of_q_u(name):
    rng = np.random.default_rng(8)
    K_zz, _, _, _ = _se_kernel_matrices(rng)
    family = make_variational(name, n_latent=2, n_inducing=K_zz.shape[0]).to(DT)
    target = torch.as_tensor(rng.standard_normal((2, K_zz.shape[0])), dtype=DT)
    family.set_mean(target, torch.linalg.cholesky(K_zz))
    mean_u, _ = family.dense_q_u(family.prepare(K_zz, 0.0))
    assert torch.allclose(mean_u, target, atol=1e-8)


def test_the_lu_renormalisation_is_scipys_permuted_lower_factor():
    # P L of W = P L U, computed with PyTorch's LU in W's memory, against SciPy's permute_l factor
    import scipy.linalg

    from bayesmlc.linalg import _lu_basis

    rng = np.random.default_rng(11)
    W = rng.standard_normal((40, 6))
    expected = scipy.linalg.lu(W, permute_l=True)[0]
    np.testing.assert_allclose(_lu_basis(W.copy()), expected, rtol=1e-12, atol=1e-12)
