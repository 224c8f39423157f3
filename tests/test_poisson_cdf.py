"""The Poisson cdf and pmf of the count CRPS
(``numpyro_pvi/scores/closed_forms/poisson_cdf.py``): Temme's coefficients against their
closed forms, and the cdf and pmf against SciPy's in every branch, at the
branches' edges and at counts in the millions, where a pmf from ``n log λ −
λ − log n!`` loses its precision in float32."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import X64
from jax.scipy.special import gammaincc, gammaln
from jax.scipy.special import xlogy as jxlogy
from scipy import optimize, stats
from scipy.special import xlogy

from numpyro_pvi.scores.closed_forms.counts import poisson_abs_mean
from numpyro_pvi.scores.closed_forms.poisson_cdf import (
    poisson_cdf_pmf,
    poisson_quantile,
    quantile_start,
    temme_table,
)

pytestmark = pytest.mark.numerics

#: absolute error of the cdf; relative error of the pmf where it exceeds 1e-8
CDF_ATOL, PMF_RTOL = (1e-13, 1e-10) if X64 else (5e-7, 2e-5)
#: rates of every branch: sums from 0 (counts below 24, 48 in float64),
#: Temme's expansion, the sums down and up from n, and their edges
RATES = [0.0, 1e-30, 1e-3, 0.5, 3.0, 9.9, 23.0, 24.5, 47.5, 60.0, 330.0, 3e3, 5e4]


def _lam_of_eta(eta: float) -> float:
    """x/a of Temme's variable η (η²/2 = λ − 1 − log λ, sign of λ − 1)."""
    f = lambda lam: lam - 1 - math.log(lam) - eta**2 / 2  # noqa: E731
    lo, hi = (1.0, 50.0) if eta > 0 else (1e-9, 1.0)
    return optimize.brentq(f, lo, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps)


@pytest.mark.parametrize("eta", [-0.9, -0.3, 0.2, 0.4, 0.9])
def test_temme_coefficients_are_dlmf_closed_forms(eta):
    # DLMF 8.12.8: c0 = 1/(λ-1) - 1/η, c1 = 1/η³ - 1/(λ-1)³ - 1/(λ-1)² - 1/(12(λ-1))
    mu = _lam_of_eta(eta) - 1.0
    c0 = 1 / mu - 1 / eta
    c1 = 1 / eta**3 - 1 / mu**3 - 1 / mu**2 - 1 / (12 * mu)
    d = temme_table(2, 30)
    powers = eta ** np.arange(30)
    # the closed forms cancel: their rounding grows like 1e-16/η (c0), /η³ (c1)
    np.testing.assert_allclose(d[0] @ powers, c0, rtol=1e-12 / abs(eta))
    np.testing.assert_allclose(d[1] @ powers, c1, rtol=1e-11 / abs(eta) ** 3)


def test_temme_table_starts_with_the_known_rationals():
    d = temme_table(3, 4)
    np.testing.assert_allclose(d[0], [-1 / 3, 1 / 12, -2 / 135, 1 / 864], rtol=1e-15)
    np.testing.assert_allclose(d[1, :2], [-1 / 540, -1 / 288], rtol=1e-15)
    np.testing.assert_allclose(d[2, 0], 25 / 6048, rtol=1e-15)


def _counts(rate: float) -> np.ndarray:
    """Counts from 0 to 60, ±12 standard deviations around the rate, and
    the rate's multiples that bound the branches."""
    sd = math.sqrt(max(rate, 1.0))
    ks = np.concatenate(
        [
            np.arange(61.0),
            np.round(rate + np.linspace(-12, 12, 97) * sd),
            np.round(rate / np.array([0.3, 0.449, 0.451, 0.5, 1.0, 2.19, 2.21, 3.0])),
        ]
    )
    return np.unique(ks[ks >= 0])


def _check(rate: float, counts: np.ndarray) -> None:
    dtype = jnp.result_type(float)
    cdf, pmf = jax.jit(poisson_cdf_pmf)(
        jnp.full(counts.shape, rate, dtype), jnp.asarray(counts, dtype)
    )
    want_cdf = stats.poisson.cdf(counts, rate) if rate > 0 else np.ones(counts.shape)
    want_pmf = stats.poisson.pmf(counts, rate) if rate > 0 else 1.0 * (counts == 0)
    np.testing.assert_allclose(cdf, want_cdf, rtol=0, atol=CDF_ATOL)
    seen = want_pmf > 1e-8
    # SciPy's pmf, exp(n log λ - λ - log n!), is itself rounded to about
    # eps (n log n + λ) relative
    rtol = PMF_RTOL + 4 * np.finfo(float).eps * (xlogy(counts, counts) + rate)
    error = np.abs(np.asarray(pmf) - want_pmf)
    assert np.all(error[seen] <= rtol[seen] * want_pmf[seen]), np.max(
        error[seen] / want_pmf[seen] / rtol[seen]
    )
    np.testing.assert_allclose(np.asarray(pmf)[~seen], want_pmf[~seen], atol=1e-8)


@pytest.mark.parametrize("rate", RATES)
def test_cdf_and_pmf_are_scipys_in_every_branch(rate):
    _check(rate, _counts(rate))


def test_cdf_and_pmf_at_a_million():
    # within 4.5 standard deviations SciPy uses Temme's expansion too; beyond
    # it stops its series after 2000 terms, short of convergence at this rate
    rate = 1e6
    _check(rate, np.round(rate + np.linspace(-4.4, 4.4, 45) * 1e3))


def test_negative_counts_have_no_mass():
    cdf, pmf = poisson_cdf_pmf(jnp.asarray([2.0, 2.0]), jnp.asarray([-1.0, -3.0]))
    np.testing.assert_array_equal(cdf, 0.0)
    np.testing.assert_array_equal(pmf, 0.0)
    # E|Y - y| for y < 0 is then λ - y
    np.testing.assert_allclose(poisson_abs_mean(jnp.asarray(2.0), -1.5), 3.5)


@pytest.mark.skipif(X64, reason="the float32 precision the change is about")
@pytest.mark.parametrize("rate", [300.0, 3e3, 5e4])
def test_abs_mean_at_large_counts_keeps_float32_precision(rate):
    # (y - λ)(2F - 1) + 2λp in float32 against float64 SciPy; the cdf and pmf
    # from XLA's incomplete gamma function and n log λ - λ - log n! are off by
    # 1e-4 (λ = 300) to 5e-2 (λ = 5e4) relative
    ys = np.round(rate + np.array([-3.0, -1.0, 0.0, 1.0, 3.0]) * math.sqrt(rate))
    f, p = stats.poisson.cdf(ys, rate), stats.poisson.pmf(ys, rate)
    want = (ys - rate) * (2 * f - 1) + 2 * rate * p
    got = poisson_abs_mean(jnp.full(5, rate, jnp.float32), jnp.asarray(ys, jnp.float32))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    naive_cdf = gammaincc(jnp.float32(ys[2] + 1), jnp.float32(rate))
    naive_pmf = jnp.exp(jxlogy(ys[2], rate) - rate - gammaln(ys[2] + 1.0))
    naive = 2 * rate * naive_pmf + (ys[2] - rate) * (2 * naive_cdf - 1)
    assert abs(float(naive) / want[2] - 1) > 50e-6  # the check has power


@pytest.mark.parametrize("rate", [0.0, 0.01, 0.7, 5.0, 23.5, 50.0, 3e3, 1e6])
def test_quantile_is_scipys(rate):
    # at u from 1e-6 to 1 - 1e-6, from below the median, at it and above;
    # u = 0 gives 0 (scipy's -1 is below the support)
    u = np.concatenate([[1e-6, 1e-3], np.linspace(0.01, 0.99, 99), [1 - 1e-5]])
    dtype = jnp.result_type(float)
    got = poisson_quantile(jnp.asarray(u, dtype), jnp.full(u.shape, rate, dtype))
    # the cdf's own rounding may put a u within CDF_ATOL of a step on its
    # other side: compare with the quantiles of u ± CDF_ATOL
    lo, hi = (stats.poisson.ppf(u + s * CDF_ATOL, rate) for s in (-1, 1))
    assert np.all((lo <= got) & (got <= hi)), (u, got, lo, hi)
    assert float(poisson_quantile(jnp.asarray(0.0), jnp.asarray(rate))) == 0.0


def test_quantile_of_a_nan_rate_is_nan():
    got = poisson_quantile(jnp.asarray([0.0, 0.5]), jnp.asarray([np.nan, np.nan]))
    assert np.all(np.isnan(got))


def test_the_quantile_search_starts_within_one_count():
    # why the search takes a step or two: 20 000 uniforms at Gamma-spread
    # rates of each mean from 0.1 to 1e5
    rng = np.random.default_rng(0)
    for mean in [0.1, 1.0, 10.0, 100.0, 1e3, 1e5]:
        rate = rng.gamma(2.0, mean / 2.0, 20_000)
        u = rng.uniform(size=rate.size)
        u, rate = (np.asarray(jnp.asarray(x), float) for x in (u, rate))  # as used
        start = np.asarray(quantile_start(jnp.asarray(u), jnp.asarray(rate)))
        gap = np.abs(start - stats.poisson.ppf(u, rate))
        # two counts at most below a mean rate of 1, where (z² - 1)/6 overshoots
        bound = 1 if mean >= 1 else 2
        assert np.max(gap) <= bound, (u[gap > bound], rate[gap > bound])


@pytest.mark.parametrize("shape", [(3, 4097), (10_003,)])
def test_blocks_end_at_the_last_value(shape):
    """More values than a block, not a multiple of it: the last block,
    overlapping the one before it, gives every value (against one pass over
    all of them), and the last values are not left at the loop's zeros."""
    from numpyro_pvi.scores.closed_forms import poisson_cdf

    assert math.prod(shape) > poisson_cdf.BLOCK
    keys = jax.random.split(jax.random.PRNGKey(5), 2)
    rate = jnp.exp(3.0 * jax.random.normal(keys[0], shape))
    n = jnp.floor(2.0 * rate * jax.random.uniform(keys[1], shape))
    got = poisson_cdf_pmf(rate, n)
    want = jax.jit(poisson_cdf._cdf_pmf)(rate, n)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=PMF_RTOL, atol=CDF_ATOL)
        assert np.mean(np.asarray(w).reshape(-1)[-100:] > 1e-3) > 0.5  # not vacuous
