"""Bailey's polar sampler of Student-t likelihoods' simulated observations
(``numpyro_pvi/_core/student_draws.py``): the law of its draws at every
degree of freedom, and its pathwise gradient in the degrees of freedom
against the derivatives of closed-form moments."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
import scipy.special as sc
import scipy.stats as ss
from jax import random

from numpyro_pvi._core import fast_draw, has_fast_draw, standard_t

N = 20_000
#: Kolmogorov–Smirnov critical value at level 1e-3, for N draws.
KS_CRITICAL = math.sqrt(-0.5 * math.log(0.5e-3)) / math.sqrt(N)

draw = jax.jit(standard_t, static_argnums=2)


@pytest.mark.parametrize("df", [0.3, 1.0, 4.0, 30.0, 1e6])
def test_draws_follow_the_student_t_law(df):
    # heavy tails (0.3: values beyond 1e30 without overflow) to the Normal
    x = np.asarray(draw(random.PRNGKey(0), jnp.float32(df), (N,)), np.float64)
    assert np.all(np.isfinite(x))
    assert ss.kstest(x, ss.t(df).cdf).statistic < KS_CRITICAL
    # power: a law with 25% more degrees of freedom, 10% wider, is rejected
    assert ss.kstest(x, ss.t(1.25 * df, scale=1.1).cdf).statistic > KS_CRITICAL


def test_degrees_of_freedom_broadcast_and_each_value_has_its_own_law():
    df = jnp.array([0.7, 3.0, 50.0])
    x = np.asarray(draw(random.PRNGKey(1), df, (N // 4, 3)), np.float64)
    assert x.shape == (N // 4, 3)
    critical = math.sqrt(-0.5 * math.log(0.5e-3)) / math.sqrt(N // 4)
    for j, nu in enumerate(np.asarray(df)):
        assert ss.kstest(x[:, j], ss.t(nu).cdf).statistic < critical
    assert standard_t(random.PRNGKey(1), 2.0, (0, 3)).shape == (0, 3)


def test_degrees_of_freedom_that_are_not_positive_give_nan():
    x = draw(random.PRNGKey(2), jnp.array([jnp.nan, -1.0, 0.0, 2.0]), (4,))
    assert np.all(np.isnan(np.asarray(x[:3]))) and np.isfinite(float(x[3]))


def _abs_mean(df: float) -> float:
    """E|T| of the standard Student-t (df > 1)."""
    log = sc.gammaln((df + 1) / 2) - sc.gammaln(df / 2)
    return 2 * math.sqrt(df) * math.exp(log) / (math.sqrt(math.pi) * (df - 1))


@pytest.mark.py312
@pytest.mark.parametrize("df", [2.5, 3.0, 12.0])
def test_gradient_in_the_degrees_of_freedom_is_unbiased(df):
    # the pathwise derivative of |T| (df > 2: it grows as |T| log|T|, of
    # finite variance only then; at df = 1.5 the standard error is no
    # measure of the error) and of T^2 (df > 4), against the derivatives of
    # E|T| and of E T^2 = df / (df - 2), within Monte Carlo error
    n = 200_000
    key = random.PRNGKey(3)

    def grads(nu):
        return jax.jvp(lambda d: draw(key, d, (n,)), (nu,), (jnp.ones_like(nu),))

    x, dx = (np.asarray(a, np.float64) for a in grads(jnp.float32(df)))
    d_abs = np.sign(x) * dx
    h = 1e-5
    exact = (_abs_mean(df + h) - _abs_mean(df - h)) / (2 * h)
    assert abs(d_abs.mean() - exact) < 4.5 * d_abs.std() / math.sqrt(n), exact
    if df > 4:
        d_sq = 2 * x * dx
        exact_sq = -2 / (df - 2) ** 2
        assert abs(d_sq.mean() - exact_sq) < 4.5 * d_sq.std() / math.sqrt(n)
    # power: the derivative at another df is told apart
    other = (_abs_mean(1.3 * df + h) - _abs_mean(1.3 * df - h)) / (2 * h)
    assert abs(d_abs.mean() - other) > 6 * d_abs.std() / math.sqrt(n)


def test_student_t_sites_are_drawn_by_the_polar_method():
    base = dist.StudentT(jnp.array([2.0, 5.0, 9.0]), jnp.zeros(3), 2.0)
    assert has_fast_draw(base)
    program = str(
        jax.make_jaxpr(lambda k: fast_draw(base, k, (4, 3)))(random.PRNGKey(5))
    )
    assert "random_gamma" not in program and "while" not in program
    x = jax.jit(lambda k: fast_draw(base, k, (N, 3)))(random.PRNGKey(5))
    for j, nu in enumerate((2.0, 5.0, 9.0)):
        law = ss.t(nu, scale=2.0)
        assert ss.kstest(np.asarray(x[:, j], np.float64), law.cdf).statistic < (
            KS_CRITICAL
        )
