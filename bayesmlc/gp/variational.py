"""Variational families for q(u_p), p = 1..P, all batched over the P latent GPs.

Each family turns the kernel blocks of a minibatch into the marginals q(h_p(x_i)) = N(mean_ip, var_ip)
and gives KL[q(u_p) || p(u_p)] per GP. The shared M x M factorisations are done once per step in
:meth:`VariationalFamily.prepare` (in float64: O(M^3), cheap next to the O(P B M^2) batch work, and
the place where float32 loses the most), everything batched over B runs in the working dtype.

``whitened``       u_p = L_K v_p, q(v_p) = N(m_p, S_p S_p^T), S_p lower triangular with a positive
                   diagonal. Marginals: A = L_K^{-1} K_ZX, mean = A^T m_p,
                   var = k_xx - |A|^2 + |S_p^T A|^2. KL against N(0, I).
``cholesky``       q(u_p) = N(m_p, S_p S_p^T) directly (journal paper eqs. (9)-(10), (13)):
                   mean = K_XZ K_Z^{-1} m_p, var = k_xx - k K_Z^{-1} k + |S_p^T K_Z^{-1} k|^2.
``preconditioned`` the 2M family of the subspace paper eq. (8): m_p = K_Z mu_p,
                   S_p = (K_Z^{-1} + Sigma_p^{-1})^{-1}, Sigma_p diagonal. With the corrected
                   marginals (reference notes 1.11): mean = K_XZ mu_p, var = k_xx - k (K_Z+Sigma_p)^{-1} k,
                   and the KL of eq. (10); only K_Z + Sigma_p is ever factorised.
``shared``         whitened, with one covariance shared by the P GPs up to a scale per GP:
                   q(v_p) = N(m_p, c_p^2 S S^T), i.e. a matrix-normal q(V) = MN(M, diag(c^2), S S^T)
                   (Louizos and Welling 2016; the Kronecker-structured q(U) of Dai et al. 2017).
                   var = k_xx - |A|^2 + c_p^2 |S^T A|^2: the M^2 term is computed once per row, so
                   a row costs O(M^2 + P M) instead of O(P M^2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.functional import softplus

from ..linalg import CholeskyError, robust_cholesky
from .kernels import inverse_softplus

__all__ = [
    "CholeskyError",
    "robust_cholesky",
    "Prepared",
    "VariationalFamily",
    "Whitened",
    "Cholesky",
    "Preconditioned",
    "SharedWhitened",
    "make_variational",
    "VARIATIONAL_NAMES",
]

VARIATIONAL_NAMES = ("whitened", "cholesky", "preconditioned", "shared")

SIGMA_FLOOR = 1e-6  # lower bound on the 2M family's Sigma (subspace paper, end of sec. 2.3)


@dataclass
class Prepared:
    """Per-step factorisations shared by the marginals and the KL.

    chol : (M, M) L_K for whitened/cholesky, or (P, M, M) chol(K_Z + Sigma_p) for preconditioned
    K_zz : (M, M) the kernel matrix (no jitter)
    jitter : float, the relative jitter the factorisation needed
    scale : (P, M, M) the families' lower-triangular S_p, or (M, M) the one S of ``shared``, built
        once per step (None for 2M)
    """

    chol: torch.Tensor
    K_zz: torch.Tensor
    jitter: float
    scale: torch.Tensor | None = None


def _lower_scale(offdiag: torch.Tensor, raw_diag: torch.Tensor) -> torch.Tensor:
    """(P, M, M) lower-triangular factors with softplus-positive diagonals."""
    return torch.tril(offdiag, diagonal=-1) + torch.diag_embed(softplus(raw_diag))


def _solve_lower(L: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    return torch.linalg.solve_triangular(L, B, upper=False)


class VariationalFamily(nn.Module):
    """Base class; parameters have shapes (P, M) and (P, M, M) so every op runs over all P GPs."""

    def __init__(self, n_latent: int, n_inducing: int):
        super().__init__()
        self.n_latent = n_latent
        self.n_inducing = n_inducing

    def prepare(self, K_zz: torch.Tensor, jitter: float) -> Prepared:
        L, used = robust_cholesky(K_zz, jitter)
        return Prepared(chol=L, K_zz=K_zz, jitter=used, scale=self.scale())

    def scale(self) -> torch.Tensor | None:
        """(P, M, M) lower-triangular factors S_p of the family's covariance, or None."""
        return None

    def marginals(self, prep: Prepared, K_xz: torch.Tensor, k_xx: torch.Tensor):
        """Marginal means and variances of q(h_p(x_i)), each (B, P)."""
        raise NotImplementedError  # pragma: no cover

    def kl(self, prep: Prepared) -> torch.Tensor:
        """KL[q(u_p) || p(u_p)] for each GP, shape (P,)."""
        raise NotImplementedError  # pragma: no cover

    def mean_weights(self, prep: Prepared) -> torch.Tensor:
        """alpha (M, P) with E_q[h(x)] = k(x, Z) alpha, for fast mean predictions."""
        raise NotImplementedError  # pragma: no cover

    def dense_q_u(self, prep: Prepared):
        """Mean (P, M) and covariance (P, M, M) of q(u): for tests and diagnostics."""
        raise NotImplementedError  # pragma: no cover

    def set_mean(self, u_mean: torch.Tensor, L_K: torch.Tensor) -> None:
        """Set the parameters so that E_q[u_p] = ``u_mean[p]`` (P, M); ``L_K`` = chol(K_ZZ)."""
        raise NotImplementedError  # pragma: no cover


class _MeanAndLowerScale(VariationalFamily):
    """Shared parameters of the free-form Gaussian families: a mean (P, M) and a lower-triangular
    scale S (P, M, M) with a softplus-positive diagonal; ``init_scale`` sets diag S at the start."""

    def __init__(self, n_latent: int, n_inducing: int, init_scale: float):
        super().__init__(n_latent, n_inducing)
        self.mean = nn.Parameter(torch.zeros(n_latent, n_inducing))
        self.scale_offdiag = nn.Parameter(torch.zeros(n_latent, n_inducing, n_inducing))
        self.raw_scale_diag = nn.Parameter(torch.full((n_latent, n_inducing), inverse_softplus(init_scale)))

    def scale(self) -> torch.Tensor:
        return _lower_scale(self.scale_offdiag, self.raw_scale_diag)


class _WhitenedMean:
    """The mean of a whitened family: q(v) has mean ``self.mean`` (P, M) with u = L_K v."""

    def mean_weights(self, prep):
        return torch.linalg.solve_triangular(prep.chol.T, self.mean.T, upper=True)

    def set_mean(self, u_mean, L_K):
        with torch.no_grad():
            self.mean.copy_(_solve_lower(L_K, u_mean.T).T)  # v = L_K^{-1} u


class Whitened(_WhitenedMean, _MeanAndLowerScale):
    """q(v_p) = N(m_p, S_p S_p^T) with u_p = L_K v_p. ``init_scale`` sets diag S at the start."""

    def __init__(self, n_latent: int, n_inducing: int, init_scale: float = 1.0):
        super().__init__(n_latent, n_inducing, init_scale)

    def marginals(self, prep, K_xz, k_xx):
        A = _solve_lower(prep.chol, K_xz.T)  # (M, B) = L_K^{-1} K_ZX
        mean = (self.mean @ A).T
        SA = prep.scale.transpose(-1, -2) @ A  # (P, M, B): the P B M^2 term
        var = k_xx[None, :] - A.pow(2).sum(0)[None, :] + SA.pow(2).sum(1)
        return mean, var.T

    def kl(self, prep):
        S = prep.scale
        log_det_S = torch.log(torch.diagonal(S, dim1=-2, dim2=-1)).sum(-1)
        return 0.5 * (S.pow(2).sum((-2, -1)) + self.mean.pow(2).sum(-1) - self.n_inducing - 2.0 * log_det_S)

    def dense_q_u(self, prep):
        S = prep.scale
        L = prep.chol
        mean = self.mean @ L.T
        LS = L @ S
        return mean, LS @ LS.transpose(-1, -2)


class Cholesky(_MeanAndLowerScale):
    """q(u_p) = N(m_p, S_p S_p^T), not whitened (journal paper; the authors' code)."""

    def __init__(self, n_latent: int, n_inducing: int, init_scale: float = 0.2):
        super().__init__(n_latent, n_inducing, init_scale)

    def marginals(self, prep, K_xz, k_xx):
        L_K = prep.chol
        A = _solve_lower(L_K, K_xz.T)  # L_K^{-1} K_ZX
        W = torch.linalg.solve_triangular(L_K.T, A, upper=True)  # K_Z^{-1} K_ZX, (M, B)
        mean = (self.mean @ W).T
        SW = prep.scale.transpose(-1, -2) @ W
        var = k_xx[None, :] - A.pow(2).sum(0)[None, :] + SW.pow(2).sum(1)
        return mean, var.T

    def kl(self, prep):
        # eq. (13), journal paper: 0.5[log|K| - log|S S^T| - M + tr(K^{-1} S S^T) + m^T K^{-1} m]
        L_K = prep.chol
        S = prep.scale
        log_det_K = 2.0 * torch.log(torch.diagonal(L_K)).sum()
        log_det_S = 2.0 * torch.log(torch.diagonal(S, dim1=-2, dim2=-1)).sum(-1)
        trace = _solve_lower(L_K, S).pow(2).sum((-2, -1))
        maha = _solve_lower(L_K, self.mean.T).pow(2).sum(0)
        return 0.5 * (log_det_K - log_det_S - self.n_inducing + trace + maha)

    def mean_weights(self, prep):
        return torch.cholesky_solve(self.mean.T, prep.chol)

    def set_mean(self, u_mean, L_K):
        with torch.no_grad():
            self.mean.copy_(u_mean)

    def dense_q_u(self, prep):
        S = prep.scale
        return self.mean, S @ S.transpose(-1, -2)


class Preconditioned(VariationalFamily):
    """The 2M family (subspace paper eq. (8)): m_p = K_Z mu_p, S_p = (K_Z^{-1} + Sigma_p^{-1})^{-1}."""

    def __init__(self, n_latent: int, n_inducing: int, init_sigma: float = 1.0):
        super().__init__(n_latent, n_inducing)
        self.mu = nn.Parameter(torch.zeros(n_latent, n_inducing))
        self.raw_sigma = nn.Parameter(torch.full((n_latent, n_inducing), inverse_softplus(init_sigma)))

    def sigma(self) -> torch.Tensor:
        return softplus(self.raw_sigma) + SIGMA_FLOOR

    def prepare(self, K_zz, jitter):
        # only K_Z + Sigma_p is factorised; it is already inflated by Sigma >= 1e-6, so the first try
        # adds no jitter (``jitter`` is unused here) and growing jitter only follows a failure
        B = K_zz[None, :, :] + torch.diag_embed(self.sigma())
        L, used = robust_cholesky(B, 0.0)
        return Prepared(chol=L, K_zz=K_zz, jitter=used)

    def marginals(self, prep, K_xz, k_xx):
        mean = K_xz @ self.mu.T  # m_f = K_XZ mu (corrected eq. (9))
        V = _solve_lower(prep.chol, K_xz.T.expand(self.n_latent, -1, -1))  # (P, M, B)
        var = k_xx[None, :] - V.pow(2).sum(1)  # S_f = K_X - K_XZ (K_Z + Sigma)^{-1} K_ZX
        return mean, var.T

    def kl(self, prep):
        # eq. (10): 0.5 mu^T K mu - 0.5 tr((K+Sigma)^{-1} K) + 0.5 log|K+Sigma| - 0.5 log|Sigma|
        L, K = prep.chol, prep.K_zz
        sigma = self.sigma()
        quad = ((self.mu @ K) * self.mu).sum(-1)
        eye = torch.eye(self.n_inducing, dtype=K.dtype, device=K.device).expand_as(L)
        L_inv = _solve_lower(L, eye)
        diag_B_inv = L_inv.pow(2).sum(-2)  # [B^{-1}]_mm = sum_i (L^{-1})_im^2
        trace = self.n_inducing - (sigma * diag_B_inv).sum(-1)  # tr(B^{-1} K) = M - tr(B^{-1} Sigma)
        log_det_B = 2.0 * torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
        return 0.5 * quad - 0.5 * trace + 0.5 * log_det_B - 0.5 * torch.log(sigma).sum(-1)

    def mean_weights(self, prep):
        return self.mu.T

    def set_mean(self, u_mean, L_K):
        with torch.no_grad():
            self.mu.copy_(torch.cholesky_solve(u_mean.T, L_K).T)  # m = K_Z mu

    def dense_q_u(self, prep):
        K = prep.K_zz
        mean = self.mu @ K
        # S = K - K (K + Sigma)^{-1} K
        KB = torch.cholesky_solve(K.expand(self.n_latent, -1, -1), prep.chol)
        return mean, K - K @ KB


class SharedWhitened(_WhitenedMean, VariationalFamily):
    """q(v_p) = N(m_p, c_p^2 S S^T) with u_p = L_K v_p: one lower-triangular S (M, M) shared by the
    P latent GPs and a positive scale c_p per GP.

    The covariance of vec(V) (V = [v_1 .. v_P]) is the Kronecker product diag(c^2) (x) S S^T: a
    matrix-normal variational posterior (Louizos and Welling, "Structured and efficient variational
    deep learning with matrix Gaussian posteriors", ICML 2016; a Kronecker-structured q(U) over
    outputs is also used by Dai, Alvarez and Lawrence, "Efficient modeling of latent information in
    supervised learning using Gaussian processes", NeurIPS 2017). With A = L_K^{-1} K_ZX (M, B)

        mean_ip = m_p^T a_i,   var_ip = k_xx,i - |a_i|^2 + c_p^2 |S^T a_i|^2,

    so |S^T a_i|^2, the only O(M^2) term, is shared by the P GPs: O(M^2 + P M) per row against the
    O(P M^2) of ``whitened``. KL against N(0, I) per GP:
    0.5 (c_p^2 |S|_F^2 + |m_p|^2 - M - 2 M log c_p - 2 log|S|). ``init_scale`` sets diag S at
    the start (c_p = 1): S = I, the prior's covariance, as for ``whitened``.
    """

    def __init__(self, n_latent: int, n_inducing: int, init_scale: float = 1.0):
        super().__init__(n_latent, n_inducing)
        self.mean = nn.Parameter(torch.zeros(n_latent, n_inducing))
        self.scale_offdiag = nn.Parameter(torch.zeros(n_inducing, n_inducing))
        self.raw_scale_diag = nn.Parameter(torch.full((n_inducing,), inverse_softplus(init_scale)))
        self.raw_gp_scale = nn.Parameter(torch.full((n_latent,), inverse_softplus(1.0)))

    def scale(self) -> torch.Tensor:
        """(M, M) the shared lower-triangular S."""
        return _lower_scale(self.scale_offdiag, self.raw_scale_diag)

    def gp_scale(self) -> torch.Tensor:
        """(P,) the positive scales c_p."""
        return softplus(self.raw_gp_scale)

    def marginals(self, prep, K_xz, k_xx):
        A = _solve_lower(prep.chol, K_xz.T)  # (M, B) = L_K^{-1} K_ZX
        mean = (self.mean @ A).T
        shared = (prep.scale.T @ A).pow(2).sum(0)  # (B,) |S^T a_i|^2: the one B M^2 term
        var = (k_xx - A.pow(2).sum(0))[:, None] + shared[:, None] * self.gp_scale().pow(2)[None, :]
        return mean, var

    def kl(self, prep):
        S, c = prep.scale, self.gp_scale()
        log_det_S = torch.log(torch.diagonal(S)).sum()
        M = self.n_inducing
        return 0.5 * (c.pow(2) * S.pow(2).sum() + self.mean.pow(2).sum(-1) - M - 2.0 * M * torch.log(c) - 2.0 * log_det_S)

    def dense_q_u(self, prep):
        L = prep.chol
        LS = L @ prep.scale
        return self.mean @ L.T, self.gp_scale().pow(2)[:, None, None] * (LS @ LS.T)[None, :, :]


def make_variational(name: str, n_latent: int, n_inducing: int) -> VariationalFamily:
    """Build the family called ``name`` (one of ``VARIATIONAL_NAMES``)."""
    if name == "whitened":
        return Whitened(n_latent, n_inducing)
    if name == "cholesky":
        return Cholesky(n_latent, n_inducing)
    if name == "preconditioned":
        return Preconditioned(n_latent, n_inducing)
    if name == "shared":
        return SharedWhitened(n_latent, n_inducing)
    raise ValueError(f"variational must be one of {', '.join(VARIATIONAL_NAMES)}; got {name!r}")
