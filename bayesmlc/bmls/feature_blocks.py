"""The h step of BMLS over blocks of features: the form of eqs. (21)-(23) that a data-parallel sweep
can run with one all-reduce per block instead of one per feature.

The sequential scan (:func:`bayesmlc.bmls.gibbs.sweep_feature_weights`) draws h_d for d = 0 .. D'-1,
each from the rate sum S_dk = sum_{n: x_nd = 1} e_nk theta_nk of the theta its predecessors left.
:func:`sweep_feature_blocks` visits the features in ``blocks`` (a partition of 0 .. D'-1, each block in
increasing order): for one block it computes every S_dk of the block from the current theta
(:func:`block_rate_sums`; over row shards these are the sums that one all-reduce adds), draws all of
the block's h_dk from them (:func:`draw_block_ratios`) and then applies the block's ratios to theta
(:func:`scale_theta_by_block`).

Exact and approximate. Given the label tokens, the conditional of h factorises over topics, and in
topic k h_dk and h_d'k interact only through the rows that carry both d and d'. So a block whose
features never share a row is drawn from its exact joint conditional (a valid block Gibbs step), and
with one feature per block the scan is the sequential scan itself (the same gamma draws, in the same
order, and the same floating-point operations). For two features of one block that share rows, each
is drawn given the other's value from the start of the block: the statistics are stale within the
block, as the word-topic counts are within a sweep in approximate distributed LDA (Newman, Asuncion,
Smyth and Welling, "Distributed Algorithms for Topic Models", JMLR 2009). The chain is then not the
Gibbs sampler of the posterior; how far its predictions move is measured in docs/scaling.md
("BMLS on several processes").
"""

from __future__ import annotations

import numba
import numpy as np

from .samplers import standard_gamma_draw

__all__ = ["block_rate_sums", "draw_block_ratios", "mass_blocks", "scale_theta_by_block", "sweep_feature_blocks"]


@numba.njit(cache=True, nogil=True)
def block_rate_sums(csc_indptr, csc_indices, block, theta, exposure, use_exposure):
    """S (|block|, K): S[i, k] = sum over the rows n with x_n,block[i] = 1 of e_nk theta_nk (e = 1
    without ``use_exposure``), in the order of the CSC pattern of X' (the sequential scan's order)."""
    n_topics = theta.shape[1]
    sums = np.zeros((block.shape[0], n_topics))
    for i in range(block.shape[0]):
        d = block[i]
        for p in range(csc_indptr[d], csc_indptr[d + 1]):
            n = csc_indices[p]
            if use_exposure:
                for k in range(n_topics):
                    sums[i, k] += theta[n, k] * exposure[n, k]
            else:
                for k in range(n_topics):
                    sums[i, k] += theta[n, k]
    return sums


@numba.njit(cache=True, nogil=True)
def draw_block_ratios(block, shape_counts, h, rate_sums, mu0, nu0, rng):
    """Draw h'_dk ~ Gamma(mu0 + c_dk, rate nu0 + S_dk / h_dk) for every feature d of ``block`` (in
    order) and topic k, as h'_dk = h_dk G / (nu0 h_dk + S_dk) with G ~ Gamma(mu0 + c_dk, 1) (eq. (22));
    ``h`` is updated in place, ``shape_counts`` (c) reset to 0 as it is read. Returns the ratios
    h'_dk / h_dk, (|block|, K)."""
    n_topics = h.shape[1]
    ratios = np.empty((block.shape[0], n_topics))
    for i in range(block.shape[0]):
        d = block[i]
        for k in range(n_topics):
            ratio = standard_gamma_draw(rng, mu0 + shape_counts[d, k]) / (nu0 * h[d, k] + rate_sums[i, k])
            shape_counts[d, k] = 0
            h[d, k] *= ratio
            ratios[i, k] = ratio
    return ratios


@numba.njit(cache=True, nogil=True)
def scale_theta_by_block(csc_indptr, csc_indices, block, ratios, theta):
    """theta_nk *= h'_dk / h_dk for every feature d of ``block`` and row n with x_nd = 1 (eq. (23))."""
    n_topics = theta.shape[1]
    for i in range(block.shape[0]):
        d = block[i]
        for p in range(csc_indptr[d], csc_indptr[d + 1]):
            n = csc_indices[p]
            for k in range(n_topics):
                theta[n, k] *= ratios[i, k]


def sweep_feature_blocks(data, state, exposure, blocks, mu0: float, nu0: float, rng, reduce=None) -> None:
    """The h step over ``blocks`` (module docstring), in place on ``state.h``, ``state.theta`` and
    ``state.shape_counts`` (c, which must already hold the counts of all rows).

    ``reduce``: None in one process, else the element-wise sum over processes of an array (each
    process holds its rows' theta and computes their part of S); ``rng`` must then be the stream that
    every process shares, so that all draw the same h. ``exposure`` (N, K) or None (e = 1)."""
    use_exposure = exposure is not None
    exposure_array = exposure if use_exposure else state.theta  # unused when e = 1
    for block in blocks:
        sums = block_rate_sums(data.x_csc_indptr, data.x_csc_indices, block, state.theta, exposure_array, use_exposure)
        if reduce is not None:
            sums = reduce(sums)
        ratios = draw_block_ratios(block, state.shape_counts, state.h, sums, mu0, nu0, rng)
        scale_theta_by_block(data.x_csc_indptr, data.x_csc_indices, block, ratios, state.theta)


def mass_blocks(feature_counts: np.ndarray, n_rows: int, max_share: float) -> list:
    """Blocks of consecutive features 0 .. D'-2 whose counts of rows (``feature_counts`` (D',), rows
    where each feature is on, over all processes) add up to at most ``max_share`` x ``n_rows``, then
    the bias feature D'-1 alone; a feature on in more rows than that is a block of its own. int64 arrays.

    Why the row mass: within a block, feature d's draw is stale in the other block features that its
    rows carry; were features independent, a row carrying d would carry sum_{d' in block} N_d' / N of
    them, so the mass bound keeps that expected number at most ``max_share`` (a Jacobi step over
    the block overshoots by about this factor). A sweep then makes about nnz(X) / (``max_share`` N)
    + 1 blocks: the mean features per row over ``max_share``, whatever D is."""
    budget = float(max_share) * max(int(n_rows), 1)
    counts = np.asarray(feature_counts, dtype=np.float64)[:-1]
    blocks, start, mass = [], 0, 0.0
    for d, count in enumerate(counts):
        if d > start and mass + count > budget:
            blocks.append(np.arange(start, d, dtype=np.int64))
            start, mass = d, 0.0
        mass += count
    if counts.size:
        blocks.append(np.arange(start, counts.size, dtype=np.int64))
    return blocks + [np.array([counts.size], dtype=np.int64)]

