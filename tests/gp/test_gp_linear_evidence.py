"""The evidence update of the linear term's prior variance (bayesmlc.gp.linear_term): the curvature
against autograd's Hessian of the logistic log-likelihood, and MacKay's fixed point against the
maximiser of the closed-form log marginal likelihood of a Gaussian linear model."""

import numpy as np
import scipy.sparse as sp
import torch
from scipy.optimize import minimize_scalar

from bayesmlc.gp.linear_term import evidence_prior_variance, utility_curvature


def test_curvature_is_the_diagonal_of_the_logistic_hessian_in_w():
    rng = np.random.default_rng(0)
    n, D, L = 9, 5, 3
    X = sp.random(n, D, density=0.5, random_state=np.random.RandomState(1), format="csr")
    X.data = rng.standard_normal(X.nnz)
    W = rng.standard_normal((L, D))
    Y = np.sign(rng.standard_normal((n, L)))
    mask = (rng.random((n, L)) < 0.7).astype(float)
    Xd = torch.as_tensor(X.toarray())

    def neg_log_lik(w_flat):
        f = Xd @ w_flat.reshape(L, D).T
        return -(torch.nn.functional.logsigmoid(torch.as_tensor(Y) * f) * torch.as_tensor(mask)).sum()

    hessian = torch.autograd.functional.hessian(neg_log_lik, torch.as_tensor(W).reshape(-1))
    expected = torch.diagonal(hessian).reshape(L, D).numpy()
    got = utility_curvature(X, X.toarray() @ W.T, sp.csr_matrix(mask))
    assert np.allclose(got, expected, rtol=1e-10, atol=1e-12)


def test_mackay_fixed_point_maximises_the_gaussian_evidence():
    # y = X w + noise (variance 1), w ~ N(0, s2 I), X with orthogonal columns: the curvature is
    # diagonal, the Laplace evidence exact, so the update's fixed point is the evidence's maximiser
    rng = np.random.default_rng(3)
    n, D = 40, 6
    Q, _ = np.linalg.qr(rng.standard_normal((n, D)))
    X = Q * rng.uniform(0.5, 3.0, D)  # columns orthogonal, norms d_j^(1/2)
    y = X @ (1.7 * rng.standard_normal(D)) + rng.standard_normal(n)
    d = (X**2).sum(0)

    def map_weight(s2):
        return (X.T @ y) / (d + 1.0 / s2)

    def log_evidence(log_s2):
        cov = np.exp(log_s2) * X @ X.T + np.eye(n)
        _, logdet = np.linalg.slogdet(cov)
        return -0.5 * (logdet + y @ np.linalg.solve(cov, y))

    s2 = 1.0
    for _ in range(500):
        s2, gamma = evidence_prior_variance(map_weight(s2)[None, :], d[None, :], s2)
    best = np.exp(minimize_scalar(lambda t: -log_evidence(t), bounds=(-8, 8), method="bounded",
                                  options={"xatol": 1e-10}).x)
    assert abs(np.log(s2 / best)) < 1e-5
    assert 0 < gamma < D


def test_fit_with_evidence_sets_s2_to_the_update_from_its_own_utilities():
    # linear_prior_variance="evidence": the trainer's update, recomputed by hand on all the rows
    # (dense curvature, gamma, |W|^2 / gamma), from the module the update saw
    from bayesmlc.gp import MLGPF
    from bayesmlc.gp.prediction import mean_utilities
    from bayesmlc.gp.training import TrainingRows, evidence_epochs

    assert evidence_epochs(100, 0.5) == {10, 20, 30, 40, 50}
    assert evidence_epochs(10, 1.0) == set()
    rng = np.random.default_rng(0)
    X = sp.random(150, 12, density=0.3, random_state=np.random.RandomState(0), format="csr", dtype=np.float64)
    X.data = np.abs(rng.standard_normal(X.nnz)) + 0.5
    Y = sp.csr_matrix((X[:, :5].toarray() > 0).astype(np.float64))
    model = MLGPF(n_latent=2, n_inducing=10, subspace_rank=6, batch_size=50, epochs=10, linear_term=True,
                  linear_prior_variance="evidence", idf_weighting=False, random_state=0, n_threads=1)
    model.fit(sp.csr_matrix(X, dtype=np.float32), Y)
    term = model._module.linear
    assert term.prior_variance != 16.0  # updated at epochs 1..5
    Xp = model.preprocessor_.transform(sp.csr_matrix(X, dtype=np.float32))
    trainer = model._trainer(model._module)
    f_mean, _ = mean_utilities(model._module, Xp, model.jitter_)
    s2 = term.prior_variance
    lam = 1.0 / (1.0 + np.exp(-f_mean.astype(np.float64)))
    d = (lam * (1.0 - lam)).T @ (Xp.toarray().astype(np.float64) ** 2)
    W = term.weight.double().numpy()
    expected = (W**2).sum() / (s2 * d / (1.0 + s2 * d)).sum()
    got = trainer.update_prior_variance(TrainingRows(Xp, Y))
    assert np.isclose(got, expected, rtol=1e-5)
