"""Linear algebra shared by the models: the top singular vectors of a sparse matrix whose rows may be
split over processes (MLGPF's subspace basis and label SVD, BNMC's ``lowrank`` classifier basis), and a
Cholesky factorisation that retries with jitter (MLGPF's kernel matrices, BNMC's CG preconditioners)."""

from __future__ import annotations

import numba
import numpy as np
import scipy.sparse as sp
import torch
from scipy.linalg import blas
from threadpoolctl import threadpool_limits

from .distributed import ParallelContext
from .utils import run_blocks

__all__ = ["SUBSPACE_ITERATIONS", "CholeskyError", "basis_gram", "robust_cholesky", "sparse_dense_product",
           "top_singular_vectors"]

#: Subspace iterations of :func:`top_singular_vectors` (scikit-learn's count for a large rank).
SUBSPACE_ITERATIONS = 4


class CholeskyError(RuntimeError):
    """A matrix stayed non-positive-definite after every jitter retry."""


def robust_cholesky(K: torch.Tensor, jitter: float, max_tries: int = 6, factor_dtype=torch.float64):
    """Lower Cholesky factor of ``K`` (..., M, M), retrying with growing jitter.

    The jitter added is ``jitter * mean(diag K) * I`` (relative, so it does not depend on the
    kernel's scale), multiplied by 10 on each failure (a first try with ``jitter=0`` is followed by
    1e-7). The factorisation runs in ``factor_dtype``
    and the factor is returned in ``K``'s dtype.

    Returns
    -------
    L : (..., M, M) tensor
    jitter_used : float, the relative jitter that succeeded
    """
    K64 = K.to(factor_dtype)
    scale = torch.diagonal(K64, dim1=-2, dim2=-1).mean(-1).detach().clamp_min(1e-12)
    eye = torch.eye(K.shape[-1], dtype=factor_dtype, device=K.device)
    current = jitter
    for _ in range(max_tries):
        shifted = K64 + (current * scale)[..., None, None] * eye
        L, info = torch.linalg.cholesky_ex(shifted)
        if not torch.any(info) and torch.isfinite(L).all():
            return L.to(K.dtype), current
        last, current = current, (current * 10.0 if current > 0 else 1e-7)
    raise CholeskyError(
        f"Cholesky factorisation failed even with relative jitter {last:.1e} "
        f"(started at {jitter:.1e}, {max_tries} tries): the matrix is not positive definite"
    )


@numba.njit(cache=True, nogil=True)
def _csr_rows_times_dense(indptr, indices, data, dense, out, start, stop):
    """out[r] = sum_k data[k] dense[indices[k]] over the stored entries k of CSR row r, for the rows
    r in [start, stop): a gather of ``dense``'s rows written into ``out`` (no allocation). The entries
    are taken four at a time, added as (e1 + e2) + (e3 + e4) into the output row, so each pass over
    the row loads and stores it once for four rows of ``dense`` (1.7x faster than one at a time at
    the AmazonCat-13K and EURLex-4K shapes); the inner loop over columns is contiguous and vectorises.
    The order of the sums depends only on the row's stored entries."""
    width = dense.shape[1]
    for r in range(start, stop):
        row = out[r]
        for c in range(width):
            row[c] = 0.0
        k, end = indptr[r], indptr[r + 1]
        while k + 4 <= end:
            v0, v1, v2, v3 = data[k], data[k + 1], data[k + 2], data[k + 3]
            s0, s1 = dense[indices[k]], dense[indices[k + 1]]
            s2, s3 = dense[indices[k + 2]], dense[indices[k + 3]]
            for c in range(width):
                row[c] += (v0 * s0[c] + v1 * s1[c]) + (v2 * s2[c] + v3 * s3[c])
            k += 4
        while k < end:
            value, source = data[k], dense[indices[k]]
            for c in range(width):
                row[c] += value * source[c]
            k += 1


class _ThreadedProducts:
    """X W and X^T Y for a sparse (or dense) X (n, D), with thin dense W (D, w) and Y (n, w).

    A sparse X's products are one compiled gather (:func:`_csr_rows_times_dense`) over the rows of X,
    for X W, or of a CSR copy of X^T (made on first use), for X^T Y, on ``torch.get_num_threads()``
    threads over blocks of output rows holding equal numbers of stored entries, written into a
    caller's buffer when given. Each output row is summed over its stored entries in order, so the
    result does not depend on the thread count. At (100,000 x 203,882) with 71 entries a row and
    w = 1,010 in float32, two threads: X W and X^T Y 0.7-0.8 s each, against 1.6 s and 3.5-4.6 s for
    SciPy's products over row blocks (X^T Y scattered into per-thread (D, w) sums, and every
    product into newly allocated memory). The products read a row of W or Y per stored entry, so
    they are bound by memory traffic. A dense X uses NumPy's (threaded) products.

    ``dtype`` is that of the products (X's values are cast to it once).
    """

    def __init__(self, X, dtype=np.float64):
        self.dtype = np.dtype(dtype)
        self.sparse = sp.issparse(X)
        self.workers = max(1, min(torch.get_num_threads(), (X.nnz if self.sparse else X.size) // 16384))
        if self.sparse:
            X = sp.csr_matrix(X)
            X = sp.csr_matrix((X.data.astype(self.dtype, copy=False), X.indices, X.indptr), shape=X.shape)
        self.X = X
        self._transposed = None

    def _gather(self, matrix, dense, out):
        dense = np.ascontiguousarray(dense, dtype=self.dtype)
        if out is None:
            out = np.empty((matrix.shape[0], dense.shape[1]), dtype=self.dtype)
        cuts = np.searchsorted(matrix.indptr, np.linspace(0, matrix.nnz, self.workers + 1)[1:-1])
        bounds = [0, *cuts.tolist(), matrix.shape[0]]
        run_blocks(bounds, lambda start, stop: _csr_rows_times_dense(matrix.indptr, matrix.indices, matrix.data, dense,
                                                                      out, start, stop))
        return out

    def times(self, W, out=None):
        """X W (n, w), into ``out`` when given (C-contiguous, of ``dtype``)."""
        if not self.sparse:
            return np.asarray(self.X @ W, dtype=self.dtype)
        return self._gather(self.X, W, out)

    def transpose_times(self, Y, out=None):
        """X^T Y (D, w), into ``out`` when given (C-contiguous, of ``dtype``; it may be the W of the
        X W that gave Y)."""
        if not self.sparse:
            return np.asarray(self.X.T @ Y, dtype=self.dtype)
        if self._transposed is None:
            self._transposed = sp.csr_matrix(self.X.T)
        return self._gather(self._transposed, Y, out)


def _lu_basis(W: np.ndarray, work: np.ndarray | None = None) -> np.ndarray:
    """P L of the pivoted LU factorisation W = P L U (n, w), in W's memory: the same column span as W
    (for W of full rank) with unit lower-triangular L (|entries| <= 1), so well conditioned. The
    renormalisation between subspace iterations: at (203,882, 1,010) float32, PyTorch's LU (MKL)
    takes 3 s, SciPy's 6.5 s and a QR 12 s. ``work``: an array of W's shape and dtype for the packed
    factors (reused across calls: no new memory to fault in)."""
    packed = torch.from_numpy(np.empty_like(W) if work is None else work)
    pivots = torch.empty(min(W.shape), dtype=torch.int32)
    torch.linalg.lu_factor_ex(torch.from_numpy(W), out=(packed, pivots, torch.empty((), dtype=torch.int32)))
    # a zero pivot (rank < w) is fine
    packed.tril_(-1).diagonal().fill_(1.0)
    order = np.arange(W.shape[0])  # P^T W = L U: row i of L U is row order[i] of W (LAPACK's swaps)
    for row, swap in enumerate(pivots.numpy().astype(np.int64) - 1):
        order[row], order[swap] = order[swap], order[row]
    torch.from_numpy(W)[torch.from_numpy(order)] = packed
    return W


def _tolerance(dtype) -> float:
    """Eigenvalue of a float64 Gram matrix of ``dtype`` data, relative to the largest, below which a
    direction is rounding: the data's own (eps^2) or the Gram's (float64 eps), with a margin of 1000."""
    return 1e3 * max(float(np.finfo(dtype).eps) ** 2, float(np.finfo(np.float64).eps))


def _gram(M: np.ndarray, rows: int = 32768) -> np.ndarray:
    """M^T M in float64 for a float32 or float64 M (n, w), accumulated over row chunks (no float64 copy
    of M) by BLAS ``dsyrk``, which forms one triangle: half the multiply-adds of a general product
    (2.7 s against 5.1 s for torch's ``addmm`` at (203,882 x 1,010) on two cores)."""
    G = np.zeros((M.shape[1], M.shape[1]), order="F")
    for start in range(0, M.shape[0], rows):
        chunk = M[start : start + rows].astype(np.float64, copy=False)  # C-order (r, w): its .T is Fortran (w, r)
        G = blas.dsyrk(1.0, chunk.T, beta=1.0, c=G, trans=0, lower=0, overwrite_c=1)
    return np.triu(G) + np.triu(G, 1).T


def basis_gram(basis: np.ndarray) -> np.ndarray:
    """X~ X~^T (R, R) float32 of a float32 (R, D) ``basis`` by BLAS ``ssyrk`` (half a general product:
    1.3 s against 2.1 s at R = 1000, D = 203,882), on ``torch.get_num_threads()`` BLAS threads."""
    basis = np.ascontiguousarray(basis, dtype=np.float32)
    with threadpool_limits(limits=torch.get_num_threads(), user_api="blas"):
        upper = blas.ssyrk(1.0, basis.T, trans=1, lower=0)  # basis.T is Fortran (D, R): no copy
    return np.triu(upper) + np.triu(upper, 1).T


def _orthonormal_complement(Vt: np.ndarray, n_rows: int, seed: int) -> np.ndarray:
    """``n_rows`` (n_rows, D) orthonormal rows orthogonal to the orthonormal rows of ``Vt``: the basis
    directions beyond the rank of X (seeded Gaussian rows, projected off ``Vt`` twice, then a QR)."""
    extra = np.random.default_rng(seed + 1).standard_normal((n_rows, Vt.shape[1])).astype(Vt.dtype)
    for _ in range(2):
        extra -= (extra @ Vt.T) @ Vt
    return np.linalg.qr(extra.T)[0].T.astype(Vt.dtype)


def sparse_dense_product(X, W: np.ndarray) -> np.ndarray:
    """X W for a sparse (or dense) X (n, D) and a W (D, w), in the result type of X's and W's dtypes,
    on ``torch.get_num_threads()`` threads (:class:`_ThreadedProducts`)."""
    return _ThreadedProducts(X, np.result_type(X.dtype, W.dtype, np.float32)).times(W)


def top_singular_vectors(X, k: int, seed: int, context: ParallelContext | None = None,
                         n_iter: int = SUBSPACE_ITERATIONS, n_oversamples: int = 10, dtype=np.float64):
    """Top-``k`` right singular vectors and singular values of a row-sharded ``X`` (dense or sparse).

    Subspace iteration on X^T X (Halko et al. 2011, alg. 4.4) with a Rayleigh-Ritz step: from a
    seeded Gaussian (D, w) start (w = k + ``n_oversamples``; :func:`_gaussian_start`), ``n_iter`` times W <- X^T (X W),
    renormalised between steps by the P L factor of a pivoted LU (the same columns, well conditioned:
    :func:`_lu_basis`). The last step keeps Y = X W' as well as W = X^T Y, and the
    Rayleigh-Ritz step takes the SVD of Q^T X for an orthonormal basis Q = Y C of Y's columns
    (C from the eigendecomposition of Y^T Y): Q^T X = C^T W^T, whose Gram matrix
    C^T (W^T W) C (w, w) gives its singular values S and left vectors U, and its right singular vectors
    are Vt = S^-1 U^T C^T W^T. No (D, w) orthogonalisation is needed (a float32 QR of the AmazonCat-13K
    shape took 12 s), and the rows of Vt are orthonormal to rounding (2.4e-5 there in float32, against
    8e-5 after the QR). ``n_iter=4`` is scikit-learn's ``randomized_svd`` count for a large rank; at the
    AmazonCat-13K shape its basis keeps 99.1% of the held-out energy that 7 iterations keep
    (docs/experiments.md, "The subspace SVD at scale"). X enters only through X W and X^T (X W), sums
    over rows: with X split by rows over processes, ``context.reduce_sum`` (an all-reduce SUM) adds
    the per-process (D, w) and (w, w) products, and every process computes the same basis as one
    process holding every row (``context`` None; only its ``reduce_sum`` is used, so a distribution
    strategy serves too, as for BNMC's ``lowrank`` classifiers). ``dtype`` is that of the (D, w) work
    arrays (three of them live at once; float32 halves that memory). Where X has rank below ``k``, the
    rows beyond it are orthonormal directions with singular value 0.

    Returns
    -------
    Vt : ndarray (k, D) of ``dtype``, orthonormal rows, signs fixed so that each row's entry of largest
        magnitude is positive (a convention independent of the summation order)
    s : ndarray (k,) float64, the singular values, decreasing (from float64 Gram matrices)
    """
    with threadpool_limits(limits=torch.get_num_threads(), user_api="blas"):  # NumPy's and SciPy's BLAS as torch
        return _subspace_iteration(X, k, seed, context, n_iter, n_oversamples, dtype)


def _subspace_iteration(X, k, seed, context, n_iter, n_oversamples, dtype):
    """:func:`top_singular_vectors` without the thread limit."""
    reduce = (context or ParallelContext.whole(X.shape[0])).reduce_sum
    n_features = X.shape[1]
    width = min(k + n_oversamples, n_features)
    W = _gaussian_start(n_features, width, seed, dtype)
    products = _ThreadedProducts(X, dtype)
    Y = np.empty((X.shape[0], width), dtype=dtype)  # X W, one buffer for every iteration
    work = np.empty_like(W) if n_iter > 1 else None  # the LU's packed factors, one buffer
    for _ in range(n_iter - 1):
        W = _lu_basis(reduce(products.transpose_times(products.times(W, out=Y), out=W)), work)
    del work
    W = reduce(products.transpose_times(products.times(W, out=Y), out=W))
    tolerance = _tolerance(dtype)
    # Q = Y C with C = V diag(lambda)^-1/2 over Y^T Y's eigenpairs above rounding (all-reduced Gram)
    eigenvalues, eigenvectors = np.linalg.eigh(reduce(_gram(Y)))
    del Y
    kept = eigenvalues > eigenvalues[-1] * tolerance
    C = eigenvectors[:, kept] / np.sqrt(eigenvalues[kept])
    # (Q^T X)(Q^T X)^T = C^T (W^T W) C: its eigenvectors U and eigenvalues S^2
    qtx_gram = C.T @ _gram(W) @ C
    squares, U = np.linalg.eigh((qtx_gram + qtx_gram.T) / 2)
    top = np.argsort(squares)[::-1][:k]
    top = top[squares[top] > squares.max(initial=0.0) * tolerance]
    s = np.sqrt(squares[top])
    rotation = ((C @ U[:, top]) / s).astype(dtype)  # (w, k'): Vt^T = W rotation
    Vt = rotation.T @ W.T  # (k', D), formed row-major
    if len(top) < k:  # X has rank below k
        Vt = np.vstack([Vt, _orthonormal_complement(Vt, k - len(top), seed)])
        s = np.concatenate([s, np.zeros(k - len(top))])
    Vt *= _sign_of_largest(Vt).astype(dtype)[:, None]
    return Vt, s


def _gaussian_start(n_rows: int, n_columns: int, seed: int, dtype) -> np.ndarray:
    """A seeded standard-normal (n_rows, n_columns) start in ``dtype``, drawn by PyTorch's CPU generator:
    the same numbers at any thread count, and 4x faster than NumPy's (0.8 s against 3.1 s at
    (203,882 x 1,010) float32)."""
    start = np.empty((n_rows, n_columns), dtype=dtype)  # NumPy's memory: huge pages where the system allows
    torch.randn((n_rows, n_columns), generator=torch.Generator().manual_seed(int(seed)), out=torch.from_numpy(start))
    return start


def _sign_of_largest(Vt: np.ndarray) -> np.ndarray:
    """(k,) the sign of each row's entry of largest magnitude (the first such entry on a tie), from
    each row's maximum and minimum: no |Vt| temporary (2.0 s -> 0.3 s at (1000 x 203,882))."""
    rows = np.arange(Vt.shape[0])
    highest, lowest = Vt.argmax(axis=1), Vt.argmin(axis=1)
    high, low = Vt[rows, highest], -Vt[rows, lowest]
    positive = (high > low) | ((high == low) & (highest <= lowest))
    return np.where(positive, 1.0, -1.0)
