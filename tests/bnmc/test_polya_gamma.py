"""Polya-Gamma and inverse-Gaussian samplers of BNMC against closed forms and series."""

import numpy as np
import pytest

from bayesmlc.bnmc.polya_gamma import pg_mean, pg_variance, sample_inverse_gaussian, sample_pg


def _series_moments(b, c, n_terms=200000):
    """Mean and variance of PG(b, c) from its infinite-sum representation
    PG = (1 / 2 pi^2) sum_k g_k / ((k - 1/2)^2 + c^2 / 4 pi^2), g_k ~ Gamma(b, 1)."""
    k = np.arange(1, n_terms + 1, dtype=np.float64)
    denom = (k - 0.5) ** 2 + c * c / (4 * np.pi**2)
    mean = b / (2 * np.pi**2) * np.sum(1.0 / denom)
    var = b / (4 * np.pi**4) * np.sum(1.0 / denom**2)
    return mean, var


@pytest.mark.parametrize("b, c", [(1.0, 0.0), (1.0, 0.5), (1.0, 3.0), (2.0, 1.0), (0.7, 2.0), (5.0, 10.0)])
def test_closed_forms_match_series(b, c):
    mean, var = _series_moments(b, c)
    assert pg_mean(b, c) == pytest.approx(mean, rel=1e-4)
    assert pg_variance(b, c) == pytest.approx(var, rel=1e-6)


def test_closed_forms_are_even_in_c_and_continuous_at_zero():
    c = np.array([-2.0, 2.0])
    assert pg_mean(1.0, c)[0] == pg_mean(1.0, c)[1]
    assert pg_mean(1.0, 1e-6) == pytest.approx(0.25, rel=1e-9)
    assert pg_variance(1.0, 1e-3) == pytest.approx(1.0 / 24.0, rel=1e-6)
    assert pg_variance(1.0, 0.0099) == pytest.approx(pg_variance(1.0, 0.0101), rel=1e-4)


@pytest.mark.parametrize(
    "b, c, n",
    [(1.0, 0.0, 40000), (1.0, 1.5, 40000), (1.0, 8.0, 40000), (3.0, 2.0, 40000), (2.5, 1.0, 8000), (0.5, 0.2, 8000)],
)
def test_sampler_moments(b, c, n):
    rng = np.random.default_rng(12345)
    draws = sample_pg(np.full(n, b), c, rng)
    assert np.all(draws > 0)
    mean, var = pg_mean(b, c), pg_variance(b, c)
    # the mean within 4 standard errors; the variance within 4 of its standard errors
    assert abs(draws.mean() - mean) < 4 * np.sqrt(var / n)
    fourth = np.mean((draws - draws.mean()) ** 4)
    assert abs(draws.var() - var) < 4 * np.sqrt((fourth - var**2) / n)


def test_sampler_is_seeded_and_broadcasts():
    c = np.linspace(-3, 3, 12).reshape(3, 4)
    first = sample_pg(1.0, c, np.random.default_rng(7))
    second = sample_pg(1.0, c, np.random.default_rng(7))
    assert first.shape == (3, 4)
    np.testing.assert_array_equal(first, second)
    with pytest.raises(ValueError, match="b must be positive"):
        sample_pg(0.0, 1.0, np.random.default_rng(0))


@pytest.mark.parametrize("mu", [0.3, 1.0, 4.0])
def test_inverse_gaussian_moments(mu):
    n = 60000
    draws = sample_inverse_gaussian(np.full(n, mu), np.random.default_rng(3))
    # IG(mu, shape 1): mean mu, variance mu^3
    assert abs(draws.mean() - mu) < 4 * np.sqrt(mu**3 / n)
    assert draws.var() == pytest.approx(mu**3, rel=0.1)
