"""The h step of BMLS over blocks of features: the form of eqs. (21)-(23) that a data-parallel sweep
can run with one all-reduce per block instead of one per feature.

The sequential scan (:func:`bayesmlc.bmls.gibbs.sweep_feature_weights`) draws h_d for d = 0 .. D'-1,
each from the rate sum S_dk = sum_{n: x_nd = 1} e_nk theta_nk of the theta its predecessors left.
:func:`sweep_feature_blocks` visits the features in ``blocks`` (a partition of 0 .. D'-1, each block in
increasing order): for one block it computes every S_dk of the block from the current theta
(:func:`block_rate_sums`; over row shards these are the sums that one all-reduce adds), draws all of
the block's h_dk from them (:func:`draw_block_ratios`) and applies the block's ratios to theta
(:func:`scale_theta_by_block`).

Exact, by a Metropolis-Hastings correction. Given the label tokens, the conditional of h factorises
over topics, and in topic k h_dk and h_d'k interact only through the rows that carry both d and d'.
A block of one feature is the Gibbs step, and one feature per block is the sequential scan itself
(the same gamma draws, in the same order, and the same floating-point operations). For a block of
several features the draws are stale within the block (each given the others' values from the start
of the block, as the word-topic counts are within a sweep in approximate distributed LDA: Newman,
Asuncion, Smyth and Welling, "Distributed Algorithms for Topic Models", JMLR 2009), and such a Jacobi
step alone does not leave the conditional invariant (it overshoots together the features that share
rows). So the block's draws are a joint proposal, accepted or rejected per topic with the
Metropolis-Hastings ratio of the block's exact conditional (:func:`block_log_acceptance`; Tierney,
"Markov chains for exploring posterior distributions", Ann. Statist. 1994, for MH steps within Gibbs):
a rejected topic keeps its h and its theta. The ratio needs sums over rows only (the proposal's rate
sums and the change of sum_n e_nk theta_nk), and topic k's next rate sums depend only on topic k's
decision, so over row shards a block's one all-reduce carries them together with the next block's
rate sums under both outcomes: one all-reduce per block, as the uncorrected step needs.
"""

from __future__ import annotations

import numba
import numpy as np

from .samplers import standard_gamma_draw

__all__ = ["block_log_acceptance", "block_rate_sums", "block_rows", "draw_block_ratios", "mass_blocks",
           "scale_theta_by_block", "sweep_feature_blocks", "topic_mass_change"]


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


@numba.njit(cache=True, nogil=True)
def topic_mass_change(rows, theta, theta_before, exposure, use_exposure):
    """(K,): sum over ``rows`` of e_nk (theta_nk - theta_before_nk), ``theta_before`` (|rows|, K) holding
    those rows' earlier values (e = 1 without ``use_exposure``): the change of the Poisson exposure
    sum_n e_nk theta_nk that a block's proposal makes (only rows carrying a block feature change)."""
    n_topics = theta.shape[1]
    change = np.zeros(n_topics)
    for i in range(rows.shape[0]):
        n = rows[i]
        for k in range(n_topics):
            delta = theta[n, k] - theta_before[i, k]
            change[k] += delta * exposure[n, k] if use_exposure else delta
    return change


def block_rows(csc_indptr, csc_indices, blocks) -> list:
    """For each block of several features, the sorted rows that carry at least one of them (int64
    arrays; empty for a block of one feature, whose step needs none)."""
    return [np.unique(np.concatenate([csc_indices[csc_indptr[d]: csc_indptr[d + 1]] for d in block]))
            if block.size > 1 else np.empty(0, dtype=np.int64) for block in blocks]


def block_log_acceptance(shapes, rate_sums, proposed_sums, ratios, h_proposed, mass_change, nu0: float) -> np.ndarray:
    """log of the Metropolis-Hastings acceptance ratio of a block's proposal, per topic, (K,).

    Target, topic k (eqs. (21)-(22), the tokens and the other features fixed): p(h_B) oc prod_{d in B}
    h_d^{a_d - 1} exp(-nu0 h_d) exp(-T(h_B)), a_d = mu0 + c_dk, T = sum_n e_nk theta_nk. Proposal: the
    features drawn independently, h'_d ~ Gamma(a_d, rate b_d(h)), b_d(h) = nu0 + S_d(h) / h_d, S_d(h)
    = sum_{n: x_nd = 1} e_nk theta_nk(h) (``rate_sums``; ``proposed_sums`` = S_d(h') after the move).
    In p(h') q(h | h') / (p(h) q(h' | h)) the powers of h cancel, leaving, with r_d = h'_d / h_d
    (``ratios``) and the change T(h') - T(h) (``mass_change``):

        log alpha = sum_d [a_d log(b_d(h') / b_d(h)) + S_d(h) r_d - S_d(h') / r_d] - (T(h') - T(h)).

    For a block whose features share no row, S_d(h') = r_d S_d(h) and T(h') - T(h) = sum_d S_d(h)
    (r_d - 1), so log alpha = 0: the Gibbs step. ``shapes`` (|B|, K) = a; ``h_proposed`` (|B|, K)."""
    rates_before = nu0 + rate_sums * ratios / h_proposed  # S_d(h) / h_d, with h_d = h'_d / r_d
    rates_after = nu0 + proposed_sums / h_proposed
    terms = shapes * np.log(rates_after / rates_before) + rate_sums * ratios - proposed_sums / ratios
    return terms.sum(axis=0) - mass_change


def sweep_feature_blocks(data, state, exposure, blocks, mu0: float, nu0: float, rng, reduce=None,
                         rows=None) -> tuple:
    """The h step over ``blocks`` (module docstring), in place on ``state.h``, ``state.theta`` and
    ``state.shape_counts`` (c, which must already hold the counts of all rows). Returns (accepted,
    proposed): the topics' proposals of blocks of several features accepted and made.

    ``reduce``: None in one process, else the element-wise sum over processes of an array (each
    process holds its rows' theta and computes their part of every sum); ``rng`` must then be the
    stream that every process shares, so that all draw the same h and make the same decisions.
    ``exposure`` (N, K) or None (e = 1). ``rows``: :func:`block_rows` of this process's rows (computed
    here when None). One ``reduce`` per block: a block's message carries the next block's rate sums."""
    use_exposure = exposure is not None
    exposure_array = exposure if use_exposure else state.theta  # unused when e = 1
    reduce = reduce if reduce is not None else _unchanged
    rows = rows if rows is not None else block_rows(data.x_csc_indptr, data.x_csc_indices, blocks)

    def rate_sums(block):
        if block is None:
            return np.empty((0, state.h.shape[1]))
        return block_rate_sums(data.x_csc_indptr, data.x_csc_indices, block, state.theta, exposure_array,
                               use_exposure)

    sums = reduce(rate_sums(blocks[0])) if blocks else None
    accepted = proposed = 0
    for i, block in enumerate(blocks):
        following = blocks[i + 1] if i + 1 < len(blocks) else None
        if block.size == 1:  # the exact Gibbs step of one feature: the sequential scan's operations
            ratios = draw_block_ratios(block, state.shape_counts, state.h, sums, mu0, nu0, rng)
            scale_theta_by_block(data.x_csc_indptr, data.x_csc_indices, block, ratios, state.theta)
            if following is not None:
                sums = reduce(rate_sums(following))
            continue
        shapes = mu0 + state.shape_counts[block].astype(np.float64)
        h_before, theta_before = state.h[block], state.theta[rows[i]]
        next_if_rejected = rate_sums(following)
        ratios = draw_block_ratios(block, state.shape_counts, state.h, sums, mu0, nu0, rng)
        scale_theta_by_block(data.x_csc_indptr, data.x_csc_indices, block, ratios, state.theta)
        parts = [rate_sums(block), topic_mass_change(rows[i], state.theta, theta_before, exposure_array,
                                                     use_exposure), rate_sums(following), next_if_rejected]
        total = np.split(reduce(np.concatenate([part.ravel() for part in parts])),
                         np.cumsum([part.size for part in parts])[:-1])
        log_alpha = block_log_acceptance(shapes, sums, total[0].reshape(sums.shape), ratios, state.h[block],
                                         total[1], nu0)
        accept = np.log(rng.random(log_alpha.size)) < log_alpha
        rejected = np.flatnonzero(~accept)
        if rejected.size:  # the rejected topics keep their h, and theta its values
            state.h[np.ix_(block, rejected)] = h_before[:, rejected]
            state.theta[np.ix_(rows[i], rejected)] = theta_before[:, rejected]
        accepted, proposed = accepted + int(accept.sum()), proposed + accept.size
        if following is not None:
            sums = np.where(accept, total[2].reshape(-1, accept.size), total[3].reshape(-1, accept.size))
    return accepted, proposed


def _unchanged(array):
    return array


def mass_blocks(feature_counts: np.ndarray, n_rows: int, max_share: float) -> list:
    """Blocks of consecutive features 0 .. D'-2 whose counts of rows (``feature_counts`` (D',), rows
    where each feature is on, over all processes) add up to at most ``max_share`` x ``n_rows``, then
    the bias feature D'-1 alone; a feature on in more rows than that is a block of its own. int64 arrays.

    Why the row mass: within a block, feature d's proposal is stale in the other block features that
    its rows carry; were features independent, a row carrying d would carry sum_{d' in block} N_d' / N
    of them, so the mass bound keeps that expected number at most ``max_share`` (the Jacobi proposal
    overshoots by about this factor, and the more it does the more proposals are rejected). A sweep
    then makes about nnz(X) / (``max_share`` N) + 1 blocks: the mean features per row over
    ``max_share``, whatever D is."""
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

