"""Polya-Gamma and inverse-Gaussian random variables for the augmented BNMC classifiers.

``PG(b, c)`` is the Polya-Gamma distribution of Polson, Scott and Windle (2013). For integer ``b`` a
draw is the sum of ``b`` independent ``PG(1, c)`` draws, each made by Devroye's exact alternating-series
sampler for the Jacobi distribution J*(1, c/2) (PG(1, c) = J*(1, c/2) / 4), as in Windle's thesis.
Non-integer ``b`` uses the truncated infinite sum of gammas (the paper's definition) with the mean of
the dropped tail added back.

The inverse-Gaussian sampler (Michael, Schucany and Haas 1976) serves the Polson-Scott (2011) SVM
augmentation, where 1/lambda_i ~ IG(|1 - y_i x_i^T w|^{-1}, 1).
"""

from __future__ import annotations

import math

import numba
import numpy as np

__all__ = [
    "pg_mean",
    "pg_variance",
    "sample_pg",
    "sample_inverse_gaussian",
]

_TRUNC = 0.64  # Devroye's switch point between the two series representations
_PI2 = math.pi * math.pi


def pg_mean(b, c):
    """E[PG(b, c)] = b / (2c) tanh(c / 2), with the limit b / 4 at c = 0. Broadcasts."""
    b = np.asarray(b, dtype=np.float64)
    c = np.abs(np.asarray(c, dtype=np.float64))
    small = c < 1e-4
    safe = np.where(small, 1.0, c)
    return np.where(small, b * (0.25 - c * c / 48.0), b / (2.0 * safe) * np.tanh(safe / 2.0))


def pg_variance(b, c):
    """Var[PG(b, c)] = b / (4 c^3) (sinh(c) - c) / cosh^2(c / 2), limit b / 24 at c = 0. Broadcasts."""
    b = np.asarray(b, dtype=np.float64)
    c = np.abs(np.asarray(c, dtype=np.float64))
    small = c < 1e-2
    safe = np.where(small, 1.0, c)
    # sinh(c)/cosh^2(c/2) = 2 tanh(c/2); write it that way so large c does not overflow
    exact = b / (4.0 * safe**3) * (2.0 * np.tanh(safe / 2.0) - safe / np.cosh(np.minimum(safe / 2.0, 350.0)) ** 2)
    return np.where(small, b * (1.0 / 24.0 - c * c / 240.0), exact)


@numba.njit(cache=True)
def _std_normal_cdf(x):
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


@numba.njit(cache=True)
def _ig_cdf_mu_unit_shape(t, mu):
    """P(X < t) for X ~ IG(mean mu, shape 1); mu may be inf (the Levy limit)."""
    root = math.sqrt(1.0 / t)
    if math.isinf(mu):
        return 2.0 * _std_normal_cdf(-root)
    a = _std_normal_cdf(root * (t / mu - 1.0))
    b = math.exp(2.0 / mu + math.log(_std_normal_cdf(-root * (t / mu + 1.0)) + 1e-300))
    return a + b


@numba.njit(cache=True)
def _series_coef(n, x):
    """a_n(x) of Devroye's alternating series for J*(1, 0), piecewise at _TRUNC."""
    k = n + 0.5
    if x > _TRUNC:
        return math.pi * k * math.exp(-k * k * _PI2 * x / 2.0)
    return (2.0 / (math.pi * x)) ** 1.5 * math.pi * k * math.exp(-2.0 * k * k / x)


@numba.njit(cache=True)
def _truncated_ig(z, t):
    """IG(mean 1/z, shape 1) restricted to (0, t)."""
    mu = 1.0 / z if z > 0 else math.inf
    if mu > t:
        while True:
            # proposal 1/X ~ 1/t + chi^2_1 truncated, by the exponential rejection of Devroye
            while True:
                e1 = np.random.exponential(1.0)
                e2 = np.random.exponential(1.0)
                if e1 * e1 <= 2.0 * e2 / t:
                    break
            x = t / ((1.0 + t * e1) ** 2)
            if np.random.random() <= math.exp(-0.5 * z * z * x):
                return x
    while True:
        y = np.random.normal() ** 2
        x = mu + 0.5 * mu * mu * y - 0.5 * mu * math.sqrt(4.0 * mu * y + (mu * y) ** 2)
        if np.random.random() > mu / (mu + x):
            x = mu * mu / x
        if x <= t:
            return x


@numba.njit(cache=True)
def _pg1_one(c):
    """One exact PG(1, c) draw (Devroye's J*(1, |c|/2) sampler, divided by 4)."""
    z = abs(c) * 0.5
    fz = _PI2 / 8.0 + z * z / 2.0
    p = math.pi / (2.0 * fz) * math.exp(-fz * _TRUNC)
    if z > 0:
        q = 2.0 * math.exp(-z) * _ig_cdf_mu_unit_shape(_TRUNC, 1.0 / z)
    else:
        q = 2.0 * _ig_cdf_mu_unit_shape(_TRUNC, math.inf)
    while True:
        if np.random.random() < p / (p + q):
            x = _TRUNC + np.random.exponential(1.0) / fz
        else:
            x = _truncated_ig(z, _TRUNC)
        s = _series_coef(0, x)
        y = np.random.random() * s
        n = 0
        while True:
            n += 1
            if n % 2 == 1:
                s -= _series_coef(n, x)
                if y <= s:
                    return 0.25 * x
            else:
                s += _series_coef(n, x)
                if y > s:
                    break


@numba.njit(cache=True)
def _seed(seed):
    np.random.seed(seed)


@numba.njit(cache=True, parallel=False)
def _pg_integer(b, c, out):
    for i in range(c.size):
        total = 0.0
        for _ in range(b[i]):
            total += _pg1_one(c[i])
        out[i] = total


@numba.njit(cache=True)
def _pg_series(b, c, n_terms, out):
    """Truncated sum (1 / 2 pi^2) sum_k g_k / ((k - 1/2)^2 + c^2 / (4 pi^2)), g_k ~ Gamma(b, 1),
    plus the mean of the dropped terms (so the mean is exact up to the tail's float error)."""
    for i in range(c.size):
        cc = c[i] * c[i] / (4.0 * _PI2)
        total = 0.0
        for k in range(1, n_terms + 1):
            total += np.random.gamma(b[i], 1.0) / ((k - 0.5) ** 2 + cc)
        # tail sum_{k > n} 1 / ((k-1/2)^2 + cc) ~ 1 / (n + 0.5 - ... ) ; use the integral bound
        tail = 1.0 / math.sqrt(cc) * (math.pi / 2.0 - math.atan(n_terms / math.sqrt(cc))) if cc > 0 else 1.0 / n_terms
        out[i] = (total + b[i] * tail) / (2.0 * _PI2)


def sample_pg(b, c, rng: np.random.Generator, n_terms: int = 200) -> np.ndarray:
    """Draws of PG(b, c), elementwise over broadcast ``b`` and ``c``.

    Parameters
    ----------
    b : float or ndarray, > 0. Integer values use the exact sampler; others the truncated series.
    c : float or ndarray, tilting parameter (any real; PG(b, c) = PG(b, -c)).
    rng : numpy Generator seeding numba's generator (so one ``random_state`` fixes the draws).
    n_terms : terms of the truncated series for non-integer ``b``.

    Returns
    -------
    ndarray of float64 with the broadcast shape of ``b`` and ``c``.
    """
    b_arr, c_arr = np.broadcast_arrays(np.asarray(b, dtype=np.float64), np.asarray(c, dtype=np.float64))
    if np.any(b_arr <= 0):
        raise ValueError("sample_pg: b must be positive")
    shape = b_arr.shape
    b_flat = np.ascontiguousarray(b_arr).ravel()
    c_flat = np.ascontiguousarray(c_arr).ravel()
    out = np.empty(b_flat.size, dtype=np.float64)
    _seed(int(rng.integers(0, 2**31 - 1)))
    integer = b_flat == np.round(b_flat)
    if integer.all():
        _pg_integer(b_flat.astype(np.int64), c_flat, out)
    else:
        ints = np.flatnonzero(integer)
        rest = np.flatnonzero(~integer)
        part = np.empty(ints.size)
        _pg_integer(b_flat[ints].astype(np.int64), c_flat[ints], part)
        out[ints] = part
        part = np.empty(rest.size)
        _pg_series(b_flat[rest], c_flat[rest], int(n_terms), part)
        out[rest] = part
    return out.reshape(shape)


@numba.njit(cache=True)
def _ig_unit_shape(mu, out):
    for i in range(mu.size):
        m = mu[i]
        y = np.random.normal() ** 2
        x = m + 0.5 * m * m * y - 0.5 * m * math.sqrt(4.0 * m * y + (m * y) ** 2)
        if np.random.random() <= m / (m + x):
            out[i] = x
        else:
            out[i] = m * m / x


def sample_inverse_gaussian(mean, rng: np.random.Generator) -> np.ndarray:
    """Draws of IG(mean, shape 1) (Michael-Schucany-Haas), elementwise over ``mean`` (> 0, finite).

    Mean ``mean``, variance ``mean**3``.
    """
    mean = np.ascontiguousarray(np.asarray(mean, dtype=np.float64))
    out = np.empty(mean.size, dtype=np.float64)
    _seed(int(rng.integers(0, 2**31 - 1)))
    _ig_unit_shape(mean.ravel(), out)
    return out.reshape(mean.shape)
