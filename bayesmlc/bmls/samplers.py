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

__all__ = [
    "zero_truncated_poisson",
    "crt",
    "standard_gamma_draw",
    "log_gamma_variates",
    "dirichlet_columns",
    "allocate_label_tokens",
    "allocate_pair_tokens",
]


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
def allocate_label_tokens(rows, cols, counts, phi, theta, uniforms, n_rows):
    """Multinomial allocation of latent label counts to topics (paper eq. (16)).

    Entry e = (rows[e], cols[e]) of Y (instance n, label l) carries ``counts[e]`` tokens; each token
    picks topic k with probability proportional to phi[l, k] * theta[n, k] (inverse CDF on the
    cumulative weights, one uniform per token, consumed in order from ``uniforms``).

    Parameters: rows, cols (E,) int; counts (E,) int64; phi (L, K); theta (N, K) = Theta^T;
    uniforms (sum(counts),) in [0, 1); n_rows = N.
    Returns (A, B): A (N, K) int64 tokens per instance and topic, B (L, K) int64 per label and topic.
    """
    n_topics = phi.shape[1]
    a_counts = np.zeros((n_rows, n_topics), dtype=np.int64)
    b_counts = np.zeros((phi.shape[0], n_topics), dtype=np.int64)
    cumulative = np.empty(n_topics)
    pos = 0
    for e in range(rows.shape[0]):
        n = rows[e]
        l = cols[e]
        acc = 0.0
        for k in range(n_topics):
            acc += phi[l, k] * theta[n, k]
            cumulative[k] = acc
        for _ in range(counts[e]):
            target = uniforms[pos] * acc
            pos += 1
            lo = _first_above(cumulative, target)
            a_counts[n, lo] += 1
            b_counts[l, lo] += 1
    return a_counts, b_counts


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
