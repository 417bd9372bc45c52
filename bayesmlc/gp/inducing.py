"""Inducing inputs Z shared by the P latent GPs, and the inner products the kernels need.

Two representations, four choices of the ``inducing`` parameter:

``fixed`` / ``free``
    Z is an (M, D) matrix in input space: a random subset of training rows kept fixed (the SE-F /
    f-LINEAR baselines of the subspace paper), or optimised from a k-means initialisation (the
    journal paper). Cross inner products X_b Z^T are sparse-dense products, Z Z^T costs O(D M^2).
``subspace`` / ``subspace-fixed``
    Z = A X~ (subspace paper eq. (4)) with X~ (R, D) the top-R right singular vectors of the sparse
    X (a randomized subspace iteration that multiplies X by thin dense matrices and never densifies
    it; it also runs on rows split over processes, :func:`bayesmlc.linalg.top_singular_vectors`) and A (M, R)
    initialised by k-means on the projections X X~^T (U S) of a row sample and optimised (or kept
    fixed). Then
    Z Z^T = A K_X~ A^T (eq. (5)) and X_b Z^T = (X_b X~^T) A^T (eq. (6)), with K_X~ = X~ X~^T and the
    projections X_b X~^T either precomputed (they are the rows of U S) or formed per batch by a
    sparse product. The SE kernel reuses the same products through appendix A.6.

ARD. In input space the weights are one per feature (D). In the subspace a weight per feature does
not commute with the precomputed basis (reference notes, sec. 1.11), so ARD acts inside the subspace:
R weights on the basis coordinates plus one weight w_0 for the orthogonal complement,
<x, x'>_w = (x X~^T) diag(w) (X~ x'^T) + w_0 (<x, x'> - (x X~^T)(X~ x'^T)),
a valid inner product (X~ has orthonormal rows); for z in the span of X~ the complement term of
<x, z> vanishes, so the cross products stay O(B R M).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

from ..distributed import ParallelContext
from ..linalg import basis_gram, sparse_dense_product, top_singular_vectors
from ..utils import csr_to_torch
from .kernels import InnerProducts

__all__ = [
    "FeatureBatch",
    "InducingInputs",
    "InputSpaceInducing",
    "SubspaceInducing",
    "truncated_svd",
    "kmeans_centres",
    "subspace_kmeans_centres",
    "INDUCING_NAMES",
]

INDUCING_NAMES = ("fixed", "free", "subspace", "subspace-fixed")
#: Rows k-means sees (Lloyd's algorithm on a random sample; see :func:`kmeans_centres`).
KMEANS_MAX_ROWS = 20_000
#: a subspace basis whose Gram matrix is within this of I_R (entry-wise) is treated as orthonormal
ORTHONORMAL_TOLERANCE = 1e-4


@dataclass
class FeatureBatch:
    """A minibatch of inputs in the form the inducing object needs.

    sparse : torch sparse CSR (B, D) or None  -- the raw rows (input-space inducing inputs)
    sparse_sq : torch sparse CSR (B, D) or None -- their element-wise squares (input-space ARD)
    projected : (B, R) tensor or None          -- X_b X~^T (subspace inducing inputs)
    sq_norm : (B,) tensor                      -- |x_i|^2
    """

    sparse: torch.Tensor | None
    sparse_sq: torch.Tensor | None
    projected: torch.Tensor | None
    sq_norm: torch.Tensor


def _row_sq_norms(X: sp.csr_matrix) -> np.ndarray:
    return np.asarray(X.multiply(X).sum(axis=1), dtype=np.float64).ravel()


class InducingInputs(nn.Module):
    """Base class. ``n_weights`` is the number of ARD weights a kernel on these inputs takes."""

    n_inducing: int
    n_weights: int

    def make_batch(self, X: sp.csr_matrix, projected: np.ndarray | None = None) -> FeatureBatch:
        raise NotImplementedError  # pragma: no cover

    def inner_products(self, batch: FeatureBatch, weights: torch.Tensor | None) -> InnerProducts:
        raise NotImplementedError  # pragma: no cover


class InputSpaceInducing(InducingInputs):
    """Z (M, D) in input space; ``trainable=False`` gives the ``fixed`` choice.

    Parameters
    ----------
    Z : ndarray (M, D), initial inducing inputs.
    trainable : bool
    """

    def __init__(self, Z: np.ndarray, trainable: bool):
        super().__init__()
        Z = torch.as_tensor(np.asarray(Z, dtype=np.float32))
        if trainable:
            self.Z = nn.Parameter(Z)
        else:
            self.register_buffer("Z", Z)
        self.n_inducing, self.n_weights = Z.shape

    def make_batch(self, X: sp.csr_matrix, projected: np.ndarray | None = None) -> FeatureBatch:
        device, dtype = self.Z.device, self.Z.dtype
        squared = X.multiply(X).tocsr()
        return FeatureBatch(
            sparse=csr_to_torch(X, device=device, dtype=dtype),
            sparse_sq=csr_to_torch(squared, device=device, dtype=dtype),
            projected=None,
            sq_norm=torch.as_tensor(np.asarray(squared.sum(axis=1)).ravel(), dtype=dtype, device=device),
        )

    def inner_products(self, batch: FeatureBatch, weights: torch.Tensor | None) -> InnerProducts:
        Z = self.Z
        Zw = Z if weights is None else Z * weights  # (M, D)
        zz = Zw @ Z.T
        xz = batch.sparse @ Zw.T  # sparse (B, D) x dense (D, M)
        if weights is None:
            xx = batch.sq_norm
        else:
            xx = (batch.sparse_sq @ weights[:, None]).squeeze(1)
        return InnerProducts(zz=zz, xz=xz, xx=xx)


class SubspaceInducing(InducingInputs):
    """Z = A X~ (subspace paper eq. (4)); ``trainable=False`` gives ``subspace-fixed``.

    Parameters
    ----------
    basis : ndarray (R, D), X~ with orthonormal rows (right singular vectors of X).
    A : ndarray (M, R), initial weights.
    trainable : bool
    gram : ndarray (R, R) or None, X~ X~^T when it is already known (a saved model's), else computed.
    """

    def __init__(self, basis: np.ndarray, A: np.ndarray, trainable: bool, gram: np.ndarray | None = None):
        super().__init__()
        basis = torch.as_tensor(np.asarray(basis, dtype=np.float32))
        # stored as X~^T (D, R), contiguous: a sparse (B, D) product with a transposed view of an
        # (R, D) array was 25x slower at D = 200k
        self.register_buffer("basis_t", basis.T.contiguous())
        # K_X~ = X~ X~^T, precomputed once (eq. (5)); I_R up to rounding for an SVD basis, and then
        # dropped from Z Z^T = A K_X~ A^T, which saves an (M, R) x (R, R) product (M R^2, twice that
        # backward) per step: at M = 200, R = 1000, B = 500 about 400k multiply-adds per row.
        gram = torch.from_numpy(basis_gram(basis.numpy()) if gram is None else np.asarray(gram, dtype=np.float32))
        self.register_buffer("basis_gram", gram)
        eye = torch.eye(gram.shape[0], dtype=gram.dtype)
        self.orthonormal_basis = bool(torch.allclose(gram, eye, rtol=0.0, atol=ORTHONORMAL_TOLERANCE))
        A = torch.as_tensor(np.asarray(A, dtype=np.float32))
        if trainable:
            self.A = nn.Parameter(A)
        else:
            self.register_buffer("A", A)
        self.n_inducing = A.shape[0]
        self.rank = basis.shape[0]
        self.n_weights = self.rank + 1

    def project(self, X: sp.csr_matrix) -> torch.Tensor:
        """X X~^T (B, R) by a sparse-dense product."""
        sparse = csr_to_torch(X, device=self.basis_t.device, dtype=self.basis_t.dtype)
        return sparse @ self.basis_t

    def make_batch(self, X: sp.csr_matrix, projected: np.ndarray | None = None) -> FeatureBatch:
        device, dtype = self.basis_t.device, self.basis_t.dtype
        if projected is None:
            proj = self.project(X)
        else:
            proj = torch.as_tensor(projected, device=device, dtype=dtype)
        return FeatureBatch(
            sparse=None,
            sparse_sq=None,
            projected=proj,
            sq_norm=torch.as_tensor(_row_sq_norms(X), dtype=dtype, device=device),
        )

    def inner_products(self, batch: FeatureBatch, weights: torch.Tensor | None) -> InnerProducts:
        A, proj = self.A, batch.projected
        if weights is None:
            zz = _RowGram.apply(A) if self.orthonormal_basis else A @ self.basis_gram @ A.T  # eq. (5)
            xz = proj @ A.T  # eq. (6)
            xx = batch.sq_norm
        else:
            w_sub, w_rest = weights[:-1], weights[-1]
            Aw = A * w_sub
            zz = Aw @ A.T
            xz = proj @ Aw.T
            proj_sq = proj.pow(2).sum(1)
            xx = (proj.pow(2) * w_sub).sum(1) + w_rest * (batch.sq_norm - proj_sq).clamp_min(0.0)
        return InnerProducts(zz=zz, xz=xz, xx=xx)


class _RowGram(torch.autograd.Function):
    """A A^T (M, M) of A (M, R), whose backward is the one product (G + G^T) A: autograd's ``A @ A.T``
    takes two (G A and G^T A, an (M, M) x (M, R) product each: 0.86 ms apiece at M = 200, R = 1000 on
    one thread, 3% of a default step at the EURLex-4K shape)."""

    @staticmethod
    def forward(ctx, A):
        ctx.save_for_backward(A)
        return A @ A.T

    @staticmethod
    def backward(ctx, grad):
        (A,) = ctx.saved_tensors
        return (grad + grad.T) @ A


def sample_rows(X, context: ParallelContext, max_rows: int | None, seed: int):
    """This process's rows of ``X`` among at most ``max_rows`` of ``context``'s rows drawn with ``seed``
    (a sorted choice of global ids, the same on every process), and the draw's ParallelContext:
    (X, None) when every row is kept."""
    if max_rows is None or context.n_total <= max_rows:
        return X, None
    chosen = np.sort(np.random.default_rng(seed).choice(context.n_total, max_rows, replace=False))
    local, used = context.select(chosen)
    return X[local], used


def truncated_svd(X: sp.csr_matrix, rank: int, seed: int, max_rows: int | None = None,
                  context: ParallelContext | None = None, dtype=np.float64) -> np.ndarray:
    """Top-``rank`` right singular vectors X~ (rank, D) of sparse ``X``, float32 with orthonormal rows,
    without densifying it (:func:`~bayesmlc.linalg.top_singular_vectors`, which only multiplies X and
    X^T by thin dense matrices). When ``max_rows`` is smaller than N the basis is that of that many
    random rows (the row space of a large sample), which bounds the work. With ``X`` split by rows
    over processes, ``context`` (a :class:`~bayesmlc.distributed.ParallelContext`; None = one
    process) places the local rows in the global order and sums over processes; the result equals
    the one-process result. ``dtype``: of the work arrays (see
    :func:`~bayesmlc.linalg.top_singular_vectors`)."""
    context = ParallelContext.whole(X.shape[0]) if context is None else context
    X, used = sample_rows(X, context, max_rows, seed)
    Vt, _ = top_singular_vectors(X, rank, seed, context if used is None else used, dtype=dtype)
    return Vt.astype(np.float32, copy=False)


def subspace_kmeans_centres(X: sp.csr_matrix, basis: np.ndarray, n_clusters: int, seed: int,
                            max_rows: int = KMEANS_MAX_ROWS, context: ParallelContext | None = None) -> np.ndarray:
    """A (n_clusters, R): k-means centres (:func:`kmeans_centres`) of the projections X X~^T (the rows
    of U S, subspace paper sec. 2.2) of at most ``max_rows`` random rows of ``X``, so Z = A X~ starts
    at cluster centres of the data within the subspace. Only the sampled rows are projected (at the
    AmazonCat-13K shape 20,000 rows take 1.1 s, against 3.4 s for the SVD's 100,000). The rows are
    drawn as :func:`kmeans_centres` draws its own, so with at most ``max_rows`` rows every row is used
    and the centres are those of :func:`kmeans_centres` on all projections. ``context`` as in
    :func:`truncated_svd`."""
    context = ParallelContext.whole(X.shape[0]) if context is None else context
    rows, used = sample_rows(X, context, max_rows, seed)
    projected = sparse_dense_product(rows, np.ascontiguousarray(basis.T))  # (n_rows, R)
    return kmeans_centres(projected, n_clusters, seed, max_rows, context if used is None else used)


def padding_centres(rows: np.ndarray, n_centres: int, rng: np.random.Generator) -> np.ndarray:
    """``n_centres`` starting points beside the dense ``rows`` (all the rows there are): each a
    random row plus Gaussian noise with the rows' per-column standard deviations (the absolute
    values of the rows' entries when they are all alike), so the points are distinct, lie where the
    rows spread, and keep the columns no row uses at zero."""
    spread = rows.std(axis=0)
    if not np.any(spread):  # one row, or copies of one
        spread = np.abs(rows).max(axis=0)
    return rows[rng.integers(rows.shape[0], size=n_centres)] + spread * rng.standard_normal((n_centres, rows.shape[1]))


def kmeans_centres(points, n_clusters: int, seed: int, max_rows: int = KMEANS_MAX_ROWS, context: ParallelContext | None = None,
                   n_iter: int = 5) -> np.ndarray:
    """``n_clusters`` k-means centres of the rows of ``points`` (dense or sparse).

    Lloyd's algorithm on at most ``max_rows`` random rows, from distinct random rows as initial
    centres (k-means++ seeding took 10 s of the 11 s on Bibtex with M=500, R=1000 and gave an
    objective within 1.5%), ``n_iter`` iterations; a centre that loses all its points stays put.
    With fewer rows than centres (the first batch of ``MLGPF.partial_fit``), every row is a centre
    and the others start at :func:`padding_centres`.
    Every iteration needs only the per-centre sums and counts of the points assigned to it, sums
    over rows: with the rows split over processes (``context``, see :func:`truncated_svd`), they
    are summed over processes, as the initial rows are, and every process gets the one-process
    centres. Returns a dense float32 (n_clusters, n_columns) array.
    """
    rng = np.random.default_rng(seed)
    context = ParallelContext.whole(points.shape[0]) if context is None else context
    if context.n_total > max_rows:
        local, context = context.select(np.sort(rng.choice(context.n_total, max_rows, replace=False)))
        points = points[local]
    centres = context.gather(points, rng.choice(context.n_total, min(n_clusters, context.n_total), replace=False))
    if centres.shape[0] < n_clusters:
        centres = np.vstack([centres, padding_centres(centres, n_clusters - centres.shape[0], rng)])
    sq_norms = np.asarray(points.multiply(points).sum(axis=1)).ravel() if sp.issparse(points) else (points**2).sum(1)
    for _ in range(n_iter):
        distances = sq_norms[:, None] - 2.0 * np.asarray(points @ centres.T) + (centres**2).sum(1)[None, :]
        nearest = distances.argmin(axis=1) if points.shape[0] else np.zeros(0, dtype=np.int64)
        assignment = sp.csr_matrix(
            (np.ones(nearest.size), (nearest, np.arange(nearest.size))), shape=(n_clusters, points.shape[0])
        )
        sums = assignment @ points
        sums = sums.toarray() if sp.issparse(sums) else np.asarray(sums)
        totals = context.reduce_sum(np.hstack([sums, np.asarray(assignment.sum(axis=1))]))
        counts = totals[:, -1]
        filled = counts > 0
        centres[filled] = totals[filled, :-1] / counts[filled, None]
    return centres.astype(np.float32)
