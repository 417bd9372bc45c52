"""Dense-by-sparse linear algebra shared by the models: the top singular vectors of a sparse matrix
whose rows may be split over processes (MLGPF's subspace basis and label SVD, BNMC's ``lowrank``
classifier basis)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp
import torch
from scipy.linalg import blas
from threadpoolctl import threadpool_limits

from .distributed import ParallelContext

__all__ = ["SUBSPACE_ITERATIONS", "basis_gram", "sparse_dense_product", "top_singular_vectors"]

#: Subspace iterations of :func:`top_singular_vectors` (scikit-learn's count for a large rank).
SUBSPACE_ITERATIONS = 4


class _ThreadedProducts:
    """X W and X^T (X W) for a sparse X, over row blocks of X on ``torch.get_num_threads()`` threads
    (SciPy's sparse products are single-threaded but release the GIL; 2.1x on two cores at EURLex-4K
    shape). The blocks are fixed by the thread count, so a given count gives the same sums every time.
    A dense X (NumPy's products are threaded already) is one block."""

    def __init__(self, X):
        workers = max(1, min(torch.get_num_threads(), X.shape[0] // 1024)) if sp.issparse(X) else 1
        bounds = np.linspace(0, X.shape[0], workers + 1).astype(np.int64)
        self.blocks = [X[start:end] for start, end in zip(bounds[:-1], bounds[1:])] if workers > 1 else [X]

    def _map(self, fn):
        if len(self.blocks) == 1:
            return [fn(self.blocks[0])]
        with ThreadPoolExecutor(len(self.blocks)) as pool:
            return list(pool.map(fn, self.blocks))

    def times(self, W):
        """X W."""
        parts = self._map(lambda block: np.asarray(block @ W))
        return parts[0] if len(parts) == 1 else np.vstack(parts)

    def gram_times(self, W, keep_product: bool = False):
        """X^T (X W), summed over the blocks in a fixed order; with ``keep_product`` also X W."""

        def block_products(block):
            product = np.asarray(block @ W)
            return np.asarray(block.T @ product), (product if keep_product else None)

        parts = self._map(block_products)
        total = parts[0][0]
        for part, _ in parts[1:]:
            total += part
        if not keep_product:
            return total
        return total, (parts[0][1] if len(parts) == 1 else np.vstack([product for _, product in parts]))


def _lu_basis(W: np.ndarray) -> np.ndarray:
    """P L of the pivoted LU factorisation W = P L U (n, w), in W's memory: the same column span as W
    (for W of full rank) with unit lower-triangular L (|entries| <= 1), so well conditioned. The
    renormalisation between subspace iterations: at (203,882, 1,010) float32, PyTorch's LU (MKL)
    takes 3 s, SciPy's 6.5 s and a QR 12 s."""
    packed, pivots, _ = torch.linalg.lu_factor_ex(torch.from_numpy(W))  # a zero pivot (rank < w) is fine
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
    """X W for a sparse (or dense) X (n, D) and a C-contiguous W (D, w), over row blocks of X on
    ``torch.get_num_threads()`` threads (:class:`_ThreadedProducts`)."""
    return _ThreadedProducts(X).times(W)


def top_singular_vectors(X, k: int, seed: int, context: ParallelContext | None = None,
                         n_iter: int = SUBSPACE_ITERATIONS, n_oversamples: int = 10, dtype=np.float64):
    """Top-``k`` right singular vectors and singular values of a row-sharded ``X`` (dense or sparse).

    Subspace iteration on X^T X (Halko et al. 2011, alg. 4.4) with a Rayleigh-Ritz step: from a
    seeded Gaussian (D, w) start (w = k + ``n_oversamples``), ``n_iter`` times W <- X^T (X W),
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
    W = np.random.default_rng(seed).standard_normal((n_features, width), dtype=dtype)
    products = _ThreadedProducts(X)
    for _ in range(n_iter - 1):
        W = _lu_basis(reduce(np.asarray(products.gram_times(W), dtype=dtype)))
    W, Y = products.gram_times(W, keep_product=True)
    W, Y = reduce(np.asarray(W, dtype=dtype)), np.asarray(Y, dtype=dtype)
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
    largest = np.abs(Vt).argmax(axis=1)
    Vt *= np.sign(Vt[np.arange(Vt.shape[0]), largest]).astype(dtype)[:, None]
    return Vt, s
