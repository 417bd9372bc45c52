"""Random-variate samplers used by the BMLS Gibbs sweep.

Every sampler takes a ``numpy.random.Generator`` so that one ``random_state`` drives the whole chain.
The numba kernels either consume uniforms drawn by NumPy beforehand (token allocation) or take the
``Generator`` itself and draw from its bit generator inside the kernel (gamma variates; numba shares
the generator's state, so the Python object advances too). None uses numba's own global random state.

References: the zero-truncated Poisson, Chinese-restaurant-table (CRT) and multinomial allocation
schemes are the data-augmentation tools of Zhou et al. (2012) used in Sec. 4 of the BMLS paper
(Zhao et al., AISTATS 2018).
"""

from __future__ import annotations

import numba
import numpy as np
from scipy.special import logsumexp

from ..utils import run_blocks, thread_bounds

__all__ = [
    "zero_truncated_poisson",
    "crt",
    "standard_gamma_draw",
    "log_gamma_variates",
    "dirichlet_columns",
    "allocate_label_tokens",
    "positive_rates",
    "allocate_pair_tokens",
]

#: entries of Y below which the positives' passes stay on one thread (a thread's start costs more)
MIN_ENTRIES_PER_THREAD = 16_384
#: up to this many tokens an entry's topics are found in one pass over its cumulative weights
_FEW_TOKENS = 8


def zero_truncated_poisson(rate: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Draws from Poisson(rate) conditioned on being >= 1 (paper eq. (13)), int64, same shape as ``rate``.

    Two exact rejection schemes, each accepting with probability >= 1 - 1/e:

    * rate > 1: draw Poisson(rate) and redraw the zeros;
    * rate <= 1: propose ``1 + Poisson(rate)`` and accept with probability 1/k (the ratio of the
      target lambda^k / k! to the proposal lambda^(k-1) / (k-1)! is proportional to 1/k).

    ``rate == 0`` returns 1 (the limit of the truncated distribution).
    """
    rate = np.asarray(rate, dtype=np.float64)
    out = np.zeros(rate.shape, dtype=np.int64)
    flat_rate = rate.ravel()
    flat_out = out.ravel()
    pending = np.arange(flat_rate.size)
    while pending.size:
        lam = flat_rate[pending]
        large = lam > 1.0
        draw = np.empty(pending.size, dtype=np.int64)
        draw[large] = rng.poisson(lam[large])
        small_draw = 1 + rng.poisson(lam[~large])
        accept_small = rng.random(small_draw.size) * small_draw < 1.0
        draw[~large] = np.where(accept_small, small_draw, 0)
        accepted = draw > 0
        flat_out[pending[accepted]] = draw[accepted]
        pending = pending[~accepted]
    return out


def crt(counts: np.ndarray, concentration, rng: np.random.Generator) -> np.ndarray:
    """Chinese-restaurant-table draws: for each entry, sum_{j < counts} Bernoulli(r / (r + j)).

    ``counts`` non-negative ints, ``concentration`` (r) a positive scalar or an array broadcastable to
    ``counts``. Returns int64 of ``counts``'s shape. E[CRT(x, r)] = sum_{j<x} r / (r + j).
    """
    counts = np.asarray(counts, dtype=np.int64)
    r = np.broadcast_to(np.asarray(concentration, dtype=np.float64), counts.shape).ravel()
    flat = counts.ravel()
    total = int(flat.sum())
    if total == 0:
        return np.zeros(counts.shape, dtype=np.int64)
    owner = np.repeat(np.arange(flat.size), flat)
    starts = np.cumsum(flat) - flat
    seat = np.arange(total) - np.repeat(starts, flat)  # j = 0 .. x-1 within each entry
    r_tok = r[owner]
    new_table = rng.random(total) * (r_tok + seat) < r_tok
    return np.bincount(owner, weights=new_table, minlength=flat.size).astype(np.int64).reshape(counts.shape)


@numba.njit(cache=True, nogil=True, inline="always")  # inlined: about twice as fast in a loop
def standard_gamma_draw(rng, shape):
    """One Gamma(shape, 1) variate from the NumPy ``Generator`` ``rng`` (usable inside numba kernels).

    shape >= 1: Marsaglia & Tsang's (2000) squeeze and rejection method (exact), on the generator's
    standard normals and uniforms drawn one at a time; shape < 1: ``rng.standard_gamma`` (NumPy's
    algorithm, as numba implements it on the same bit generator).
    """
    if shape < 1.0:
        return rng.standard_gamma(shape)
    d = shape - 1.0 / 3.0
    c = 1.0 / np.sqrt(9.0 * d)
    while True:
        x = rng.standard_normal()
        v = 1.0 + c * x
        if v <= 0.0:
            continue
        v = v * v * v
        u = rng.random()
        x2 = x * x
        if u < 1.0 - 0.0331 * x2 * x2 or np.log(u) < 0.5 * x2 + d * (1.0 - v + np.log(v)):
            return d * v


@numba.njit(cache=True, nogil=True)
def _log_gamma_fill(shape, out, rng):
    for i in range(shape.shape[0]):
        a = shape[i]
        out[i] = np.log(standard_gamma_draw(rng, a + 1.0)) + np.log(rng.random()) / a


def log_gamma_variates(shape: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """log of Gamma(shape, 1) draws, exact and underflow-free for tiny shapes; float64, ``shape``'s shape.

    Uses G(a) = G(a + 1) * U^(1/a) (Marsaglia & Tsang), i.e. log G(a) = log G(a + 1) + log(U) / a, with
    G(a + 1) from :func:`standard_gamma_draw` (numba, no temporaries beyond the output).
    """
    shape = np.asarray(shape, dtype=np.float64)
    out = np.empty(shape.size)
    _log_gamma_fill(np.ascontiguousarray(shape.ravel()), out, rng)
    return out.reshape(shape.shape)


def dirichlet_columns(alpha: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Independent Dirichlet draws, one per column of ``alpha`` (L, K): returns (L, K), columns sum to 1.

    Drawn in log space (normalised with logsumexp) so columns with tiny concentrations never give 0/0.
    """
    log_g = log_gamma_variates(alpha, rng)
    return np.exp(log_g - logsumexp(log_g, axis=0, keepdims=True))


@numba.njit(cache=True, nogil=True)
def _first_above(cumulative, target):
    """First index k with cumulative[k] > target (binary search over non-decreasing sums); never a
    zero-weight category, since its cumulative sum equals the previous one."""
    lo = 0
    hi = cumulative.shape[0] - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if cumulative[mid] > target:
            hi = mid
        else:
            lo = mid + 1
    return lo


@numba.njit(cache=True, nogil=True)
def _positive_rates_block(rows, cols, phi, theta, out, begin, end):
    """``out[e]`` = sum_k phi[cols[e], k] theta[rows[e], k] for e in [begin, end)."""
    n_topics = phi.shape[1]
    for e in range(begin, end):
        n = rows[e]
        l = cols[e]
        acc = 0.0
        for k in range(n_topics):
            acc += phi[l, k] * theta[n, k]
        out[e] = acc


def positive_rates(rows, cols, phi, theta):
    """rho_e = sum_k phi[cols[e], k] * theta[rows[e], k] for every positive entry e (eq. (6)), on
    ``torch.get_num_threads()`` threads over blocks of entries (each entry's sum in topic order, so
    the result does not depend on the thread count)."""
    out = np.empty(rows.shape[0])
    run_blocks(thread_bounds(rows.shape[0], MIN_ENTRIES_PER_THREAD),
               lambda begin, end: _positive_rates_block(rows, cols, phi, theta, out, begin, end))
    return out


@numba.njit(cache=True, nogil=True)
def _allocate_block(rows, cols, counts, first_uniform, rates, phi, theta, uniforms, begin, end, a_counts, b_counts):
    """:func:`allocate_label_tokens` for the entries [begin, end), added into ``a_counts`` and ``b_counts``.

    Entry e's tokens take the uniforms from ``first_uniform[e]`` on; token j goes to the first topic
    whose cumulative weight sum_{k' <= k} phi[l, k'] theta[n, k'] exceeds uniforms[j] * rates[e]
    (rates[e] is that sum over every topic, summed in the same order). A few tokens are sorted and
    found in one pass over the topics that stops at the largest; many, by binary search on the
    cumulative weights. A target no cumulative weight exceeds (rounding) takes the last topic.
    """
    n_topics = phi.shape[1]
    cumulative = np.empty(n_topics)
    targets = np.empty(_FEW_TOKENS)
    for e in range(begin, end):
        n = rows[e]
        l = cols[e]
        c = counts[e]
        u0 = first_uniform[e]
        if c == 1:  # most entries: the few-token pass without its sort (the kernel 22 against 25 ms on delicious)
            target = uniforms[u0] * rates[e]
            acc = 0.0
            k = 0
            while k < n_topics - 1:
                acc += phi[l, k] * theta[n, k]
                if acc > target:
                    break
                k += 1
            a_counts[n, k] += 1
            b_counts[l, k] += 1
        elif c <= _FEW_TOKENS:
            for j in range(c):  # insertion sort of the targets
                t = uniforms[u0 + j] * rates[e]
                i = j
                while i > 0 and targets[i - 1] > t:
                    targets[i] = targets[i - 1]
                    i -= 1
                targets[i] = t
            j = 0
            acc = 0.0
            k = 0
            while j < c and k < n_topics:
                acc += phi[l, k] * theta[n, k]
                while j < c and acc > targets[j]:
                    a_counts[n, k] += 1
                    b_counts[l, k] += 1
                    j += 1
                k += 1
            a_counts[n, n_topics - 1] += c - j
            b_counts[l, n_topics - 1] += c - j
        else:
            acc = 0.0
            for k in range(n_topics):
                acc += phi[l, k] * theta[n, k]
                cumulative[k] = acc
            for j in range(c):
                k = _first_above(cumulative, uniforms[u0 + j] * rates[e])
                a_counts[n, k] += 1
                b_counts[l, k] += 1


def allocate_label_tokens(rows, cols, counts, phi, theta, uniforms, n_rows, rates=None):
    """Multinomial allocation of latent label counts to topics (paper eq. (16)).

    Entry e = (rows[e], cols[e]) of Y (instance n, label l) carries ``counts[e]`` tokens; each token
    picks topic k with probability proportional to phi[l, k] * theta[n, k] (inverse CDF on the
    cumulative weights, one uniform per token, consumed in order from ``uniforms``).

    Parameters: rows, cols (E,) int; counts (E,) int64; phi (L, K); theta (N, K) = Theta^T;
    uniforms (sum(counts),) in [0, 1); n_rows = N; rates (E,) the entries' total weights
    (:func:`positive_rates` of the same phi and theta, which the sweep keeps; computed when None).
    Returns (A, B): A (N, K) int64 tokens per instance and topic, B (L, K) int64 per label and topic.

    With ``rows`` non-decreasing (Y's CSR order) the entries are split at row boundaries over
    ``torch.get_num_threads()`` threads, each adding into its own B; every token's topic depends on
    its own uniform only, so the counts do not depend on the thread count.
    """
    rows, cols, counts = (np.asarray(a, dtype=np.int64) for a in (rows, cols, counts))
    if rates is None:
        rates = positive_rates(rows, cols, phi, theta)
    first_uniform = np.cumsum(counts) - counts
    a_counts = np.zeros((n_rows, phi.shape[1]), dtype=np.int64)
    bounds = thread_bounds(rows.shape[0], MIN_ENTRIES_PER_THREAD)
    if len(bounds) > 2:
        if np.any(rows[1:] < rows[:-1]):
            bounds = [0, rows.shape[0]]  # blocks could share a row of A
        else:  # move each cut to the start of its row
            bounds = sorted(set([0, *np.searchsorted(rows, rows[bounds[1:-1]]).tolist(), rows.shape[0]]))
    b_parts = [np.zeros((phi.shape[0], phi.shape[1]), dtype=np.int64) for _ in range(len(bounds) - 1)]

    def work(begin, end):
        _allocate_block(rows, cols, counts, first_uniform, rates, phi, theta, uniforms, begin, end, a_counts,
                        b_parts[bounds.index(begin)])

    run_blocks(bounds, work)
    return a_counts, sum(b_parts[1:], b_parts[0])


@numba.njit(cache=True, nogil=True)
def allocate_pair_tokens(first, second, counts, phi, weights, uniforms):
    """Allocation of co-occurrence counts c_ij (i < j) to topics (paper eqs. (17)-(18)).

    Each of the ``counts[e]`` tokens of pair (first[e], second[e]) picks topic k with probability
    proportional to phi[i, k] * weights[k] * phi[j, k] and adds 1 to both endpoints.
    Returns (L, K) int64 endpoint counts (each token counted at both of its labels).
    """
    n_labels, n_topics = phi.shape
    endpoint = np.zeros((n_labels, n_topics), dtype=np.int64)
    cumulative = np.empty(n_topics)
    pos = 0
    for e in range(first.shape[0]):
        i = first[e]
        j = second[e]
        acc = 0.0
        for k in range(n_topics):
            acc += phi[i, k] * weights[k] * phi[j, k]
            cumulative[k] = acc
        for _ in range(counts[e]):
            target = uniforms[pos] * acc
            pos += 1
            lo = _first_above(cumulative, target)
            endpoint[i, lo] += 1
            endpoint[j, lo] += 1
    return endpoint
