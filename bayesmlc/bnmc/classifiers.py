"""Per-label Bayesian linear classifiers of BNMC, fitted for all labels at once.

Batch (section 3.3, eq. 6): a Gibbs sampler on the augmented posterior of each w_c (bias included),
prior w ~ N(0, diag(prior_precision)^-1):

* logistic (Polson, Scott and Windle 2013): omega_ic ~ PG(1, z_i^T w_c) for every observed entry (both
  classes), then w_c ~ N(P_c^-1 Z^T kappa_c, P_c^-1) with P_c = Sigma0^-1 + Z^T diag(omega_c) Z and
  kappa_ic = y_ic - 1/2;
* SVM (Polson and Scott 2011): 1 / lambda_ic ~ IG(|1 - s_ic z_i^T w_c|^-1, 1) with s = 2y - 1, then
  w_c ~ N(P_c^-1 Z^T (s_c (1 + 1/lambda_c)), P_c^-1) with P_c = Sigma0^-1 + Z^T diag(1/lambda_c) Z.

Both are "precision weights omega, targets beta" Gaussian draws. Three exact samplers share them:

* ``dense``: batched Cholesky of the (C, D+1, D+1) precisions (small D);
* ``woodbury``: N < D, the sampler of Bhattacharya, Chakraborty and Mallick (2016), which only factors
  (C, N, N) matrices I + diag(sqrt omega_c) Z Sigma0 Z^T diag(sqrt omega_c);
* ``cg``: large sparse problems; "perturb then solve": P_c w = Z^T beta_c + Z^T (sqrt(omega_c) e1) +
  Sigma0^-1/2 e2 has solution ~ N(P_c^-1 Z^T beta_c, P_c^-1), solved by conjugate gradients batched
  over labels, preconditioned by one Cholesky factor shared by all labels and warm-started from the
  previous draw (the solve is to a relative residual ``cg_tol``; the draw is exact up to that).

Before the sweeps, ``n_mode_steps`` damped Newton (logistic) or EM (svm) steps move the chain to the
posterior mode. ``inference="variational"`` swaps the draws for the mean-field variational updates
(q(omega) = PG(1, xi), factorised Gaussian q(w)) with the same solvers.

Online (eq. 7): averaged stochastic gradient descent on the L2-regularised loss, step 1 / (lambda (t + t0)).
Masked (unobserved) label entries get omega = beta = 0: they drop out of the likelihood.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse as sp
import torch

from ..linalg import robust_cholesky
from ..utils import logit, sigmoid, softplus
from .polya_gamma import sample_inverse_gaussian, sample_pg

__all__ = ["Design", "LowRankDesign", "choose_auto_solver", "choose_low_rank", "choose_solver", "solver_costs",
           "gibbs_classifier", "SGDClassifier", "classifier_evidence"]

#: Estimated floating-point operations per sweep above which ``solver="auto"`` leaves the exact
#: samplers for the shared low-rank representation (``lowrank``).
EXACT_BUDGET_FLOPS = 3e10


def _no_reduce(array):
    return array


class Design:
    """The classifier design matrix Z = [X, 1] kept as sparse (or dense) X plus an implicit bias column.

    Attributes
    ----------
    X : torch tensor (n, D), sparse CSR or dense, float32
    n, D1 : rows and columns of Z (D1 = D + 1)
    """

    def __init__(self, X: sp.csr_matrix, device: torch.device, dense: bool, reduce=_no_reduce):
        self.reduce = reduce  # sums a numpy array over processes (identity in one process)
        self.n, D = X.shape
        self.D1 = D + 1
        self.device = device
        if dense:
            self.X = torch.from_numpy(X.toarray()).to(device)
            self.XT = self.X.T
        else:
            self.X = _csr(X, device)
            self.XT = _csr(X.T.tocsr(), device)
        self.dense = dense
        self.Z_scipy = sp.hstack([X, np.ones((self.n, 1), dtype=np.float32)], format="csr")
        Z_sq = self.Z_scipy.multiply(self.Z_scipy).tocsr()
        self.Z_sq = _csr(Z_sq, device)
        self.Z_sq_T = _csr(Z_sq.T.tocsr(), device)

    def matmul(self, W: torch.Tensor) -> torch.Tensor:
        """Z @ W for W (D1, C) -> (n, C)."""
        return self.X @ W[:-1] + W[-1:]

    def rmatmul(self, U: torch.Tensor) -> torch.Tensor:
        """Z^T @ U for U (n, C) -> (D1, C), summed over processes."""
        return self.reduce_tensor(torch.cat([self.XT @ U, U.sum(dim=0, keepdim=True)], dim=0))

    def precision_diagonal(self, omega: torch.Tensor, prior_prec: torch.Tensor) -> torch.Tensor:
        """diag(P_c) = prior + diag(Z^T diag(omega_c) Z) for every label, (D1, C)."""
        return prior_prec[:, None] + self.reduce_tensor(self.Z_sq_T @ omega)

    def shared_precision(self, row_weights: np.ndarray, prior_prec: np.ndarray) -> torch.Tensor:
        """diag(prior) + Z^T diag(row_weights) Z as a dense (D1, D1) tensor (one sparse product)."""
        gram = self.reduce((self.Z_scipy.T @ sp.diags(row_weights) @ self.Z_scipy).toarray())
        gram[np.diag_indices_from(gram)] += prior_prec
        return torch.as_tensor(gram, dtype=torch.float32, device=self.device)

    def reduce_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.reduce is _no_reduce:
            return tensor
        return torch.as_tensor(self.reduce(tensor.cpu().numpy()), device=tensor.device)

    def dense_z(self) -> torch.Tensor:
        Xd = self.X if self.dense else self.X.to_dense()
        return torch.cat([Xd, torch.ones(self.n, 1, dtype=Xd.dtype, device=self.device)], dim=1)


def _csr(matrix: sp.csr_matrix, device) -> torch.Tensor:
    matrix = sp.csr_matrix(matrix, dtype=np.float32)
    with warnings.catch_warnings():  # torch's "sparse CSR support is in beta" notice, once per tensor
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(
            torch.from_numpy(matrix.indptr.astype(np.int64)),
            torch.from_numpy(matrix.indices.astype(np.int64)),
            torch.from_numpy(matrix.data),
            size=matrix.shape,
        ).to(device)


class LowRankDesign(Design):
    """Z = [X V, 1]: the rows projected on a shared orthonormal basis V (D, r), plus the bias column.

    With w_c = V u_c, the model of eq. (6) restricted to span(V) is the same logistic (or SVM) model
    on the r projected features, and the prior N(0, I / lambda) on w restricted to span(V) is
    N(0, I / lambda) on u. Every product is a dense (n, r) by (r, C) one.

    Attributes
    ----------
    Z : torch tensor (n, r + 1) float32, the projected rows X V and the bias column of ones, so that
        Z W and Z^T U are one matrix product each
    X : the view Z[:, :r], the projected rows X V
    """

    def __init__(self, projected: np.ndarray, device: torch.device, reduce=_no_reduce):
        self.reduce = reduce
        self.device = device
        self.dense = True
        self.n, rank = projected.shape
        self.D1 = rank + 1
        self.Z = torch.ones(self.n, rank + 1, dtype=torch.float32, device=device)
        self.Z[:, :rank] = torch.as_tensor(np.asarray(projected, dtype=np.float32), device=device)
        self.X = self.Z[:, :rank]
        self.XT = self.X.T
        self.Z_sq = self.Z * self.Z
        self.Z_sq_T = self.Z_sq.T

    def matmul(self, W: torch.Tensor) -> torch.Tensor:
        """Z @ W for W (D1, C) -> (n, C)."""
        return self.Z @ W

    def rmatmul(self, U: torch.Tensor) -> torch.Tensor:
        """Z^T @ U for U (n, C) -> (D1, C), summed over processes."""
        return self.reduce_tensor(self.Z.T @ U)

    def shared_precision(self, row_weights: np.ndarray, prior_prec: np.ndarray) -> torch.Tensor:
        """diag(prior) + A^T A, A = diag(sqrt(row_weights)) Z, in float32 (it preconditions the CG
        solves, which run to their own tolerance; float64 took twice as long at r = 1024)."""
        weights = torch.as_tensor(row_weights, dtype=torch.float32, device=self.device)
        scaled = self.Z * weights.clamp_min(0.0).sqrt()[:, None]
        gram = self.reduce_tensor(scaled.T @ scaled)
        gram.diagonal().add_(torch.as_tensor(prior_prec, dtype=torch.float32, device=self.device))
        return gram

    def dense_z(self) -> torch.Tensor:
        return self.Z


#: CG iterations per solve that :func:`solver_costs` counts the shared preconditioner's triangular
#: solves for (13.5 measured on 1,200 rows, 3,000 count features and 1,000 labels).
CG_ITERATIONS = 10


def solver_costs(n: int, n_features: int, n_labels: int, nnz: int) -> dict:
    """Rough floating-point operations of one sweep of each exact sampler (n rows, nnz stored entries
    of X): ``woodbury`` L n^3 / 3 + n^2 D (n < D + 1 only), ``dense`` n D^2 L + L D^3 / 3, ``cg`` one
    (D+1)^2 Gram and Cholesky, about 15 sparse products with (n, L) blocks (Z and Z^T in five CG
    iterations, margins, variances) and, in each of :data:`CG_ITERATIONS` iterations, the two
    triangular solves of the preconditioner, 2 (D+1)^2 L (on 1,200 rows x 3,000 features x 1,000
    labels they were 55% of the fit, which took 577 s against omikuji's 1 s)."""
    D1 = n_features + 1
    nnz_z = nnz + n
    cg = D1**3 / 3 + nnz_z**2 / max(n, 1) + 15 * nnz_z * n_labels + CG_ITERATIONS * 2 * D1 * D1 * n_labels
    return {
        "woodbury": n_labels * n**3 / 3 + n * n * D1 if n < D1 else float("inf"),
        "dense": n * D1 * D1 * n_labels + n_labels * D1**3 / 3 if n_labels * D1 * D1 <= 2e8 else float("inf"),
        "cg": cg if D1 <= 12000 else float("inf"),
    }


def choose_solver(n: int, n_features: int, n_labels: int, nnz: int, budget: float = EXACT_BUDGET_FLOPS) -> str:
    """The small-problem rule (``woodbury`` when n < D + 1, n <= 3000 and its estimated sweep is no
    dearer than ``cg``'s, else ``dense`` when D + 1 <= 600 and L (D+1)^2 <= 5e7, else ``cg``) when
    that sampler's estimated sweep (:func:`solver_costs`) is within ``budget``; else the cheapest
    exact sampler within it; else ``lowrank``, the classifiers on a shared rank-r representation.
    (Woodbury's L n^3 / 3 grows fast as n nears D: 80% of enron's rows, 898 x 1,001 with 53 labels,
    took 41 s with it against 5 s with cg.)"""
    D1 = n_features + 1
    costs = solver_costs(n, n_features, n_labels, nnz)
    if n < D1 and n <= 3000 and costs["woodbury"] <= costs["cg"]:
        small = "woodbury"
    elif D1 <= 600 and n_labels * D1 * D1 <= 5e7:
        small = "dense"
    else:
        small = "cg"
    if costs[small] <= budget:
        return small
    cheapest = min(costs, key=costs.get)
    return cheapest if costs[cheapest] <= budget else "lowrank"


#: The ranks ``BNMC(low_rank="auto")`` chooses among for the shared basis of the ``lowrank`` solver;
#: with the support term beside it, also SUPPORT_LOW_RANK where no wider rank is affordable (the term
#: carries the tail labels: on amazoncat-13k:0.01 validation P@1 73.55 at r = 128 against 73.76 at 256,
#: on the 8,000-label word counts at 5,000 rows 56.88 against 58.75; docs/experiments.md, "BNMC: the
#: support term").
LOW_RANKS = (1024, 768, 512, 256)
SUPPORT_LOW_RANK = 128

#: How many passes over the stored entries of X one (n x (r + 1)) by ((r + 1) x L) product of the
#: low-rank classifiers may cost, (r + 1) L <= this x the mean stored entries per row, for
#: ``low_rank="auto"`` to take rank r (docs/experiments.md, "BNMC: the rank of the shared basis").
LOW_RANK_PASSES = 2.0**14


def choose_auto_solver(n: int, n_features: int, n_labels: int, nnz: int) -> tuple[str, int | None]:
    """``solver="auto"``'s (solver, basis rank or None): :func:`choose_solver`'s choice, except that its
    ``cg`` runs as ``lowrank`` on all D right singular vectors where D <= ``LOW_RANKS[0]``: the same prior
    and likelihood (q(w) factorised in that basis) by the batched low-rank fit, which took delicious
    from 36.6 to 13.6 s and enron from 10.3 to 6.6 s with P@k within noise (docs/experiments.md, "The
    exact solver's sets on the full-rank basis"). The rank None leaves it to ``low_rank``."""
    solver = choose_solver(n, n_features, n_labels, nnz)
    if solver == "cg" and n_features <= LOW_RANKS[0]:
        return "lowrank", n_features
    return solver, None


def choose_low_rank(n: int, n_features: int, n_labels: int, budget: float = EXACT_BUDGET_FLOPS,
                    nnz_per_row: float | None = None, ranks: tuple = LOW_RANKS) -> int:
    """The rank r of the ``lowrank`` solver's shared basis: the largest of ``ranks`` whose sweep,
    about 15 n (r + 1) L floating-point operations for the batched CG products (as :func:`solver_costs`
    counts ``cg``'s), is within ``budget``, or whose products cost at most :data:`LOW_RANK_PASSES`
    passes over the sparse features, (r + 1) L <= LOW_RANK_PASSES x ``nnz_per_row`` (the mean stored
    entries of a row of X); the smallest when none is; never above D.

    A rank-256 basis underfits text with a flat spectrum (goemotions: test P@1 52.4 against 57.4 at
    r = 1024, where the exact ``cg`` solver also gives 57.4). The second condition ties the classifiers'
    cost, n (r + 1) L a product, to the cost of a linear model or label tree over the sparse rows, which
    grows with nnz(X): the EURLex-4K shape (236 entries a row, 3,993 labels) takes r = 768, where its
    fit stayed within about 2.5x omikuji Parabel's time, while sets with many labels for few entries a
    row (8,000 labels over 100 word counts) keep 256 (docs/experiments.md, "BNMC: the rank of the
    shared basis")."""
    for rank in ranks:
        within_budget = 15.0 * n * (rank + 1) * n_labels <= budget
        within_passes = nnz_per_row is not None and (rank + 1) * n_labels <= LOW_RANK_PASSES * nnz_per_row
        if within_budget or within_passes:
            return int(min(rank, n_features))
    return int(min(ranks[-1], n_features))


def _system_dtype(kind: str) -> torch.dtype:
    """The dtype the dense and Woodbury samplers form and factor their systems in: float64 for the SVM,
    whose weights 1/lambda reach their cap of 1e6 at the hinge (two copies of a document, both at the
    hinge, made a float32 Woodbury system indefinite; float32 dense precisions lost most of the
    margins' digits), float32 for the logistic model, whose weights are at most 1/4."""
    return torch.float64 if kind == "svm" else torch.float32


def _sample_dense(Z: torch.Tensor, omega, beta, prior_prec, gen, noise: float = 1.0) -> torch.Tensor:
    """Exact draw for every label from N(P^-1 Z^T beta, P^-1); P = diag(prior) + Z^T diag(omega) Z,
    formed and factored in Z's dtype; the draw is returned in omega's. ``noise=0`` returns the mean
    P^-1 Z^T beta."""
    C = omega.shape[1]
    out_dtype = omega.dtype
    omega, beta, prior_prec = omega.to(Z.dtype), beta.to(Z.dtype), prior_prec.to(Z.dtype)
    prec = torch.einsum("nd,nc,ne->cde", Z, omega, Z)
    prec.diagonal(dim1=1, dim2=2).add_(prior_prec[None, :])
    chol = torch.linalg.cholesky(prec)  # (C, D1, D1)
    rhs = (Z.T @ beta).T.unsqueeze(-1)  # (C, D1, 1)
    mean = torch.cholesky_solve(rhs, chol)
    if not noise:
        return mean.squeeze(-1).T.to(out_dtype)
    eps = torch.randn(C, Z.shape[1], 1, generator=gen, dtype=Z.dtype, device=Z.device)
    # P = L L^T; L^T u = e gives u ~ N(0, P^-1)
    draw = mean + torch.linalg.solve_triangular(chol.transpose(1, 2), eps, upper=True)
    return draw.squeeze(-1).T.to(out_dtype)


def _sample_woodbury(Z: torch.Tensor, gram: torch.Tensor, omega, beta, prior_var, gen, chunk: int,
                     noise: float = 1.0) -> torch.Tensor:
    """Bhattacharya et al. (2016): u ~ N(0, Sigma0), d ~ N(0, I), v = Phi u + d,
    (Phi Sigma0 Phi^T + I) w = alpha - v, theta = u + Sigma0 Phi^T w, with Phi = diag(sqrt omega) Z and
    alpha = beta / sqrt(omega) (0 where omega = 0). ``gram`` = Z Sigma0 Z^T (n, n). ``noise=0`` gives
    the mean (u = d = 0).

    The (n, n) systems are formed, factored and solved in ``gram``'s dtype (float64 for the SVM, see
    :func:`gibbs_classifier`); Z and the products with it stay in its own."""
    n, D1 = Z.shape
    C = omega.shape[1]
    root = omega.sqrt()
    alpha = torch.where(omega > 0, beta / root.clamp_min(1e-30), torch.zeros_like(beta))
    u = noise * torch.randn(D1, C, generator=gen, dtype=Z.dtype, device=Z.device) * prior_var.sqrt()[:, None]
    d = noise * torch.randn(n, C, generator=gen, dtype=Z.dtype, device=Z.device)
    v = root * (Z @ u) + d
    out = torch.empty(D1, C, dtype=Z.dtype, device=Z.device)
    eye = torch.eye(n, dtype=gram.dtype, device=Z.device)
    for start in range(0, C, chunk):
        sl = slice(start, min(C, start + chunk))
        r = root[:, sl].T.to(gram.dtype)  # (c, n)
        system = r[:, :, None] * gram[None] * r[:, None, :] + eye
        chol = torch.linalg.cholesky(system)
        target = (alpha[:, sl] - v[:, sl]).T.to(gram.dtype).unsqueeze(-1)
        w = torch.cholesky_solve(target, chol).squeeze(-1).T.to(Z.dtype)  # (n, c)
        out[:, sl] = u[:, sl] + prior_var[:, None] * (Z.T @ (root[:, sl] * w))
    return out


def preconditioner_factor(shared: torch.Tensor) -> torch.Tensor:
    """The Cholesky factor of the CG solves' shared preconditioner ``shared``, in its dtype; where rounding
    leaves it indefinite (a float32 Gram over a full-rank ``lowrank`` basis, whose last directions the
    rows barely span), a relative jitter is added (:func:`~bayesmlc.linalg.robust_cholesky`): the CG
    still solves the exact system, only its iterations depend on the preconditioner."""
    return robust_cholesky(shared, 0.0, factor_dtype=shared.dtype)[0]


def shared_preconditioner(design: Design, omega: torch.Tensor, prior_prec: torch.Tensor) -> torch.Tensor:
    """The Cholesky factor (:func:`preconditioner_factor`) of diag(prior) + Z^T diag(omega_bar) Z, omega_bar
    the mean of ``omega`` (n, C) over labels: the preconditioner that the CG solves of every label share."""
    return preconditioner_factor(design.shared_precision(omega.mean(dim=1).double().cpu().numpy(),
                                                         prior_prec.double().cpu().numpy()))


def _sample_cg(design: Design, omega, beta, prior_prec, start, gen, tol: float, max_iter: int, noise: float = 1.0):
    """Perturb-then-solve draw (``noise=0``: the mean) for all labels by batched preconditioned CG.

    The preconditioner is shared by every label: the Cholesky factor of diag(prior) + Z^T diag(w) Z,
    with w_i the mean over labels of omega_ic. Per-label systems differ from it only through the
    spread of omega across labels, so a handful of iterations reach ``tol``.
    Returns (draw (D1, C), iterations).
    """
    n, D1, C = design.n, design.D1, omega.shape[1]
    dtype, device = omega.dtype, omega.device
    if noise:
        e1 = noise * torch.randn(n, C, generator=gen, dtype=dtype, device=device)
        e2 = noise * torch.randn(D1, C, generator=gen, dtype=dtype, device=device)
        rhs = design.rmatmul(beta + omega.sqrt() * e1) + prior_prec.sqrt()[:, None] * e2
    else:  # the mean: the same numbers without drawing (and scaling by 0) two noise blocks
        rhs = design.rmatmul(beta)

    def apply(V):
        return prior_prec[:, None] * V + design.rmatmul(omega * design.matmul(V))

    chol = shared_preconditioner(design, omega, prior_prec)
    x = start.clone()
    r = rhs - apply(x)
    z = torch.cholesky_solve(r, chol)
    p = z.clone()
    rz = (r * z).sum(dim=0)
    rhs_norm = rhs.norm(dim=0).clamp_min(1e-30)
    iterations = 0
    for iterations in range(1, max_iter + 1):
        Ap = apply(p)
        step = rz / (p * Ap).sum(dim=0).clamp_min(1e-30)
        x += step * p
        r -= step * Ap
        if bool(torch.all(r.norm(dim=0) <= tol * rhs_norm)):
            break
        z = torch.cholesky_solve(r, chol)
        rz_new = (r * z).sum(dim=0)
        p = z + (rz_new / rz.clamp_min(1e-30)) * p
        rz = rz_new
    return x, iterations


def _augmentation(kind: str, margins: np.ndarray, Y: np.ndarray, mask: np.ndarray, rng):
    """Precision weights omega and targets beta for one Gibbs sweep (both (n, C), float64).
    ``rng=None``: a step to the posterior mode instead of a draw: for logistic the Newton step
    (IRLS weights p(1 - p), working response; damped by the caller), for svm the Polson-Scott EM step
    with omega replaced by E[1/lambda] = 1/|1 - s m| (a minorise-maximise step)."""
    if rng is None:
        if kind == "logistic":
            p = sigmoid(margins)
            omega = np.maximum(p * (1.0 - p), 1e-8) * mask
            return omega, (omega * margins + Y - p) * mask
        signs = 2.0 * Y - 1.0
        inv_lambda = np.minimum(1.0 / np.clip(np.abs(1.0 - signs * margins), 1e-6, None), 1e6) * mask
        return inv_lambda, signs * (1.0 + inv_lambda) * mask
    if kind == "logistic":
        omega = np.zeros_like(margins)
        observed = mask > 0
        omega[observed] = sample_pg(1.0, margins[observed], rng)
        beta = (Y - 0.5) * mask
        return omega, beta
    signs = 2.0 * Y - 1.0
    gap = np.abs(1.0 - signs * margins)
    inv_lambda = np.zeros_like(margins)
    observed = mask > 0
    inv_lambda[observed] = sample_inverse_gaussian(1.0 / np.clip(gap[observed], 1e-6, None), rng)
    inv_lambda = np.minimum(inv_lambda, 1e6)
    return inv_lambda, signs * (1.0 + inv_lambda) * mask


def gibbs_classifier(
    design: Design,
    Y: np.ndarray,
    mask: np.ndarray,
    kind: str,
    prior_precision: np.ndarray,
    n_iter: int,
    n_keep: int,
    rng: np.random.Generator,
    solver: str,
    init: np.ndarray | None = None,
    cg_tol: float = 1e-3,
    cg_max_iter: int = 200,
    progress=None,
    n_mode_steps: int = 0,
    inference: str = "gibbs",
):
    """Gibbs sampler of eq. (6) for all labels at once, or its mean-field variational counterpart.

    ``inference="variational"`` replaces each draw by a coordinate-ascent update of
    q(w_c) q(omega_c): q(omega_ic) = PG(1, xi_ic) with xi_ic^2 = E_q[(z_i^T w_c)^2], E[omega] =
    tanh(xi/2) / (2 xi), and q(w_c) the fully factorised Gaussian with mean P_c^-1 Z^T kappa_c (the
    exact mean of the Gaussian conditional) and variances 1 / diag(P_c). The returned ``variances``
    then hold 1 / diag(P_c) for the moderated predictive.

    Parameters
    ----------
    design : Design of Z = [X, 1] (n, D1)
    Y : ndarray (n, C) of 0/1 labels; mask : ndarray (n, C), 1 where observed
    kind : "logistic" or "svm"
    prior_precision : ndarray (D1,), diagonal prior precision (last entry: the bias)
    n_iter : sweeps; the last ``n_keep`` are kept
    init : ndarray (D1, C) starting weights, or None for zeros
    n_mode_steps : steps to the posterior mode before the sweeps (damped Newton for logistic, EM
        for svm), so the chain starts at the mode instead of burning in from ``init``

    Returns
    -------
    variances : ndarray (D1, C) float32 of mean-field variances (variational) or None (gibbs)
    means : ndarray (n_keep, D1, C) float32, the Rao-Blackwellised conditional posterior means
        E[w | omega^(s), y] of the last ``n_keep`` sweeps; their average estimates E[w | y] with far
        less Monte Carlo noise than the draws themselves
    trace : list of per-sweep log-likelihoods of the observed entries (logistic) or hinge sums (svm)
    """
    device, dtype = design.device, torch.float32
    gen = torch.Generator(device=device)
    gen.manual_seed(int(rng.integers(0, 2**62)))
    C = Y.shape[1]
    prior_prec_t = torch.as_tensor(prior_precision, dtype=dtype, device=device)
    W = torch.zeros(design.D1, C, dtype=dtype, device=device) if init is None else torch.as_tensor(init, dtype=dtype, device=device)
    Z = gram = None
    system_dtype = _system_dtype(kind)
    if solver == "dense":
        Z = design.dense_z().to(system_dtype)
    elif solver == "woodbury":
        Z = design.dense_z()
        gram = (Z.to(system_dtype) / prior_prec_t.to(system_dtype)) @ Z.T.to(system_dtype)
    chunk = max(1, int(2e8 // (torch.finfo(system_dtype).bits // 8 * design.n * design.n)))

    def solve(omega, beta, start, noise):
        if solver == "dense":
            return _sample_dense(Z, omega, beta, prior_prec_t, gen, noise)
        if solver == "woodbury":
            return _sample_woodbury(Z, gram, omega, beta, 1.0 / prior_prec_t, gen, chunk, noise)
        return _sample_cg(design, omega, beta, prior_prec_t, start, gen, cg_tol, cg_max_iter, noise)[0]

    means, trace = [], []
    variances = None
    margins = None  # Z W, carried over from the damped step when it computed them
    for sweep in range(n_mode_steps + n_iter):
        sampling = sweep >= n_mode_steps
        if margins is None:
            margins = design.matmul(W).double().cpu().numpy()
        trace.append(float(design.reduce(np.array([_fit_measure(kind, margins, Y, mask)]))[0]))
        if sampling and inference == "variational":
            if variances is None:  # first update from the mode: the curvature there
                omega_np, _ = _augmentation(kind, margins, Y, mask, None)
                variances = 1.0 / design.precision_diagonal(torch.as_tensor(omega_np, dtype=dtype, device=device), prior_prec_t)
            spread = _margin_variance(design, variances)
            omega_np, beta_np = _expected_augmentation(kind, margins, spread, Y, mask)
        else:
            omega_np, beta_np = _augmentation(kind, margins, Y, mask, rng if sampling else None)
        omega = torch.as_tensor(omega_np, dtype=dtype, device=device)
        beta = torch.as_tensor(beta_np, dtype=dtype, device=device)
        if sampling and inference == "variational":
            variances = 1.0 / design.precision_diagonal(omega, prior_prec_t)
        W_new = solve(omega, beta, W, 1.0 if sampling and inference == "gibbs" else 0.0)
        next_margins = None
        if not sampling and kind == "logistic":
            W_new, next_margins = _damped(design, W, W_new, Y, mask, prior_prec_t, margins)
        if sweep >= n_mode_steps + n_iter - n_keep:
            # Rao-Blackwellised: the conditional mean E[w | omega, y] of this sweep
            mean = W_new if inference == "variational" else solve(omega, beta, W_new, 0.0)
            means.append(mean.cpu().numpy().copy())
        W, margins = W_new, next_margins
        if progress is not None:
            progress.update(1)
    if variances is not None:
        variances = variances.cpu().numpy().astype(np.float32)
    return np.stack(means).astype(np.float32), variances, trace


def _margin_variance(design: Design, variances: torch.Tensor) -> np.ndarray:
    """sum_d z_id^2 s_dc^2: the variance of each margin under the factorised q(w), (n, C)."""
    return (design.Z_sq @ variances).double().cpu().numpy()


def _expected_augmentation(kind: str, margins, spread, Y, mask):
    """Variational omega and beta: E[omega] under q(omega) given E[m] and Var[m] of each margin."""
    if kind == "logistic":
        xi = torch.from_numpy(margins).square_().add_(torch.from_numpy(spread)).sqrt_()
        return _pg_mean_one(xi).numpy() * mask, (Y - 0.5) * mask
    signs = 2.0 * Y - 1.0
    # E[1/lambda] = 1 / sqrt(E[(1 - s m)^2]) for the Polson-Scott GIG update
    gap = np.sqrt((1.0 - signs * margins) ** 2 + spread)
    inv_lambda = np.minimum(1.0 / np.clip(gap, 1e-6, None), 1e6) * mask
    return inv_lambda, signs * (1.0 + inv_lambda) * mask


def _log_posterior(design: Design, W: torch.Tensor, Y, mask, prior_prec, margins=None) -> np.ndarray:
    """Per-label logistic log posterior (up to constants), (C,), summed over processes; ``margins``:
    Z W when known."""
    margins = design.matmul(W).double().cpu().numpy() if margins is None else margins
    loglik = -design.reduce((softplus(-(2.0 * Y - 1.0) * margins) * mask).sum(axis=0))
    return loglik - 0.5 * (prior_prec[:, None] * W * W).sum(dim=0).double().cpu().numpy()


def _damped(design: Design, W, W_newton, Y, mask, prior_prec, margins, max_halvings: int = 8):
    """Per label, the first of W + 2^-j (W_newton - W), j = 0, 1, ..., that does not lower the log
    posterior (W itself when none does). ``margins`` = Z W (n, C) float64. Returns the chosen
    weights and their margins Z W_chosen (so the next sweep need not recompute them)."""
    current = _log_posterior(design, W, Y, mask, prior_prec, margins)
    direction = W_newton - W
    out, out_margins = W.clone(), margins.copy()
    pending = np.ones(W.shape[1], dtype=bool)
    scale = 1.0
    for _ in range(max_halvings):
        trial = W + scale * direction
        trial_margins = design.matmul(trial).double().cpu().numpy()
        better = (_log_posterior(design, trial, Y, mask, prior_prec, trial_margins) >= current) & pending
        if better.any():
            chosen = np.flatnonzero(better)
            out[:, torch.as_tensor(chosen, device=W.device)] = trial[:, torch.as_tensor(chosen, device=W.device)]
            out_margins[:, chosen] = trial_margins[:, chosen]
            pending &= ~better
        if not pending.any():
            break
        scale *= 0.5
    return out, out_margins


def _fit_measure(kind: str, margins: np.ndarray, Y: np.ndarray, mask: np.ndarray) -> float:
    signs = 2.0 * Y - 1.0
    if kind == "logistic":
        return float(-np.sum(softplus(-signs * margins) * mask))
    return float(-np.sum(np.maximum(0.0, 1.0 - signs * margins) * mask))


def _pg_mean_one(xi: torch.Tensor) -> torch.Tensor:
    """E[PG(1, xi)] = tanh(xi / 2) / (2 xi) (limit 1/4 - xi^2 / 48 below 1e-4), float64 tensor, in place."""
    small = xi < 1e-4
    series = 0.25 - xi * xi / 48.0
    out = torch.tanh(xi / 2.0).div_(xi.clamp_min(1e-4) * 2.0)
    return torch.where(small, series, out)


def classifier_evidence(inputs, weights, variances, kind: str, offset=None) -> np.ndarray:
    """BNMC's classifier evidence of the rows ``inputs`` (n, d) (eq. 8), (n, L): the margins z^T w + b of
    each weight matrix of ``weights`` (S, d + 1, L; the bias last: kept draws, a variational mean, or
    the SGD average), plus ``offset`` = (mean, variance) (n, L) of a term beside them when given (the
    support term, :mod:`bayesmlc.bnmc.support_term`), moderated by the factorised Gaussian q(w) of
    ``variances`` (d + 1, L) when given (MacKay's probit approximation, m / sqrt(1 + pi v / 8)); then,
    for ``kind`` "logistic", the logit of the probability averaged over the weights, for "svm" the mean
    margin."""
    margins = np.stack([np.asarray(inputs @ w[:-1]) + w[-1] for w in weights])
    if offset is not None:
        margins += offset[0][None]
    if variances is not None:
        squares = inputs.multiply(inputs).tocsr() if sp.issparse(inputs) else inputs * inputs
        spread = np.asarray(squares @ variances[:-1]) + variances[-1]
        if offset is not None:
            spread += offset[1]
        margins = margins / np.sqrt(1.0 + np.pi * spread / 8.0)[None]
    if kind == "logistic":
        return logit(sigmoid(margins).mean(axis=0))
    return margins.mean(axis=0)


class SGDClassifier:
    """Averaged SGD for all labels (eq. 7): minimise lambda/2 |w|^2 + mean_i loss(s_ic z_i^T w_c) with
    step 1 / (lambda (t + t0)), t counting minibatch steps, t0 = 1 / (lambda eta0) (so the first step
    is eta0); the bias is not
    regularised. ``loss`` is the logistic loss or the hinge loss. The iterate average starts after
    ``average_start`` steps.
    """

    def __init__(self, n_features: int, n_labels: int, kind: str, alpha: float, eta0: float, average_start: int = 10):
        self.kind = kind
        self.alpha = float(alpha)
        self.eta0 = float(eta0)
        self.average_start = int(average_start)
        self.W = np.zeros((n_features + 1, n_labels))
        self.W_avg = np.zeros_like(self.W)
        self.steps = 0
        self.n_averaged = 0

    def step(self, X: sp.csr_matrix, Y: np.ndarray, mask: np.ndarray) -> None:
        """One step on a minibatch: X (b, D) CSR, Y and mask (b, C)."""
        t0 = 1.0 / (self.alpha * self.eta0)
        eta = 1.0 / (self.alpha * (self.steps + t0))
        margins = np.asarray(X @ self.W[:-1]) + self.W[-1]
        signs = 2.0 * Y - 1.0
        if self.kind == "logistic":
            # d/dm log(1 + exp(-s m)) = -s sigma(-s m)
            grad_m = -signs * sigmoid(-signs * margins)
        else:
            grad_m = -signs * (signs * margins < 1.0)
        grad_m *= mask
        b = X.shape[0]
        grad = np.vstack([np.asarray(X.T @ grad_m), grad_m.sum(axis=0, keepdims=True)]) / b
        grad[:-1] += self.alpha * self.W[:-1]
        self.W -= eta * grad
        self.steps += 1
        if self.steps > self.average_start:
            self.n_averaged += 1
            self.W_avg += (self.W - self.W_avg) / self.n_averaged
        else:
            self.W_avg[...] = self.W

    def state(self) -> dict:
        return {"W": self.W, "W_avg": self.W_avg, "steps": self.steps, "n_averaged": self.n_averaged, "alpha": self.alpha}

    def set_state(self, state: dict) -> None:
        # no coercion: BNMC's state table (bnmc/state_checks.py) refuses what is not float or int
        self.W = np.asarray(state["W"])
        self.W_avg = np.asarray(state["W_avg"])
        self.steps, self.n_averaged, self.alpha = state["steps"], state["n_averaged"], state["alpha"]
