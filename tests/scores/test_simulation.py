"""Simulated observations (``numpyro_pvi/scores/simulation.py``): the law
of the registered samplers' draws (Gamma-based laws by Marsaglia and Tsang's
method, Student-t by Bailey's polar method), their reparameterisation
gradients, which laws they replace, and the CRPS of the likelihoods they
simulate against scoringrules' closed forms."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
import scipy.integrate as si
import scipy.special as sc
import scipy.stats as ss
from jax import random

from numpyro_pvi import PredictiveELBO
from numpyro_pvi._trace.site_laws import innermost
from numpyro_pvi.scores import CRPS
from numpyro_pvi.scores.simulation import (
    _SAMPLERS,
    _registered_draw,
    standard_gamma,
    standard_t,
)

sr = pytest.importorskip("scoringrules")

N = 20_000
#: Kolmogorov–Smirnov critical value at level 1e-3, for N draws.
KS_CRITICAL = math.sqrt(-0.5 * math.log(0.5e-3)) / math.sqrt(N)


def has_fast_draw(fn):
    """Whether a registered sampler draws ``fn``."""
    return type(innermost(fn)).sample in _SAMPLERS


def fast_draw(base, key, shape):
    """A registered sampler's draw of ``base`` broadcast to ``shape``."""
    batch = shape[: len(shape) - len(base.event_shape)]
    return _registered_draw(base.expand(batch), key)


#: One compiled draw for every shape parameter of the tests.
draw = jax.jit(standard_gamma, static_argnums=2)
draw_t = jax.jit(standard_t, static_argnums=2)


@pytest.mark.parametrize("alpha", [0.3, 1.0, 2.5, 40.0])
def test_draws_follow_the_gamma_law(alpha):
    x = np.asarray(draw(random.PRNGKey(0), jnp.float32(alpha), (N,)), np.float64)
    assert np.all(np.isfinite(x)) and np.all(x >= 0)
    assert ss.kstest(x, ss.gamma(alpha).cdf).statistic < KS_CRITICAL
    # power: a shape 5% off is rejected by the same test
    assert ss.kstest(x, ss.gamma(1.05 * alpha).cdf).statistic > KS_CRITICAL


def test_shapes_broadcast_and_each_value_has_its_own_law():
    alpha = jnp.array([0.5, 3.0, 12.0])
    x = np.asarray(draw(random.PRNGKey(1), alpha, (N // 4, 3)))
    assert x.shape == (N // 4, 3)
    for j, a in enumerate(np.asarray(alpha)):
        stat = ss.kstest(x[:, j].astype(np.float64), ss.gamma(a).cdf).statistic
        assert stat < math.sqrt(-0.5 * math.log(0.5e-3)) / math.sqrt(N // 4)
    assert standard_gamma(random.PRNGKey(1), 2.0, (0, 3)).shape == (0, 3)


def test_a_shape_that_is_not_positive_and_finite_gives_nan():
    alpha = jnp.array([jnp.nan, -1.0, 0.0, jnp.inf, 2.0])
    x = draw(random.PRNGKey(2), alpha, (5,))
    assert np.all(np.isnan(np.asarray(x[:4]))) and np.isfinite(float(x[4]))


@pytest.mark.py312  # JAX's implicit gradient: also in the JAX 0.12 leg
@pytest.mark.parametrize("alpha", [0.4, 3.0])
def test_gradient_is_the_implicit_reparameterisation(alpha):
    # d x / d alpha of each draw at fixed u = F(x; alpha), against finite
    # differences of scipy's inverse of the regularised incomplete gamma
    # function; and unbiased for the derivative of the mean (E x = alpha)
    x, grad = jax.jvp(
        lambda a: draw(random.PRNGKey(3), a, (N,)),
        (jnp.float32(alpha),),
        (jnp.float32(1.0),),
    )
    x, grad = np.asarray(x, np.float64), np.asarray(grad, np.float64)
    u, h = sc.gammainc(alpha, x[:50]), 1e-6
    numeric = (sc.gammaincinv(alpha + h, u) - sc.gammaincinv(alpha - h, u)) / (2 * h)
    np.testing.assert_allclose(grad[:50], numeric, rtol=2e-3, atol=1e-5)
    assert abs(grad.mean() - 1.0) < 4.5 * grad.std() / math.sqrt(N)


@pytest.mark.parametrize("a, b", [(0.2, 0.3), (2.0, 5.0)])
def test_beta_and_dirichlet_draws_follow_their_laws(a, b):
    # shapes far below 1 included: the log-gammas do not underflow
    beta = jax.jit(lambda k: fast_draw(dist.Beta(a, b), k, (N,)))(random.PRNGKey(7))
    x = np.asarray(beta, np.float64)
    assert np.all((x > 0) & (x < 1))
    assert ss.kstest(x, ss.beta(a, b).cdf).statistic < KS_CRITICAL
    assert ss.kstest(x, ss.beta(1.1 * a, b).cdf).statistic > KS_CRITICAL  # power
    # a Dirichlet's component is Beta(alpha_j, sum(alpha) - alpha_j)
    alpha = jnp.array([a, b, 1.5])
    d = jax.jit(lambda k: fast_draw(dist.Dirichlet(alpha), k, (N, 3)))(
        random.PRNGKey(8)
    )
    np.testing.assert_allclose(np.asarray(d.sum(-1)), 1.0, rtol=1e-5)
    rest = a + b + 1.5
    for j, aj in enumerate((a, b, 1.5)):
        stat = ss.kstest(np.asarray(d[:, j], np.float64), ss.beta(aj, rest - aj).cdf)
        assert stat.statistic < KS_CRITICAL


def test_multivariate_t_components_follow_their_laws():
    # component j of loc + L T: a Student-t at loc_j with scale |row j of L|
    scale_tril = jnp.array([[1.0, 0.0], [0.6, 0.8]]) * 2.0
    fn = dist.MultivariateStudentT(3.0, jnp.array([1.0, -2.0]), scale_tril)
    x = jax.jit(lambda k: fast_draw(fn, k, (N, 2)))(random.PRNGKey(9))
    for j, scale in enumerate((2.0, 2.0)):  # |(0.6, 0.8)| = 1
        law = ss.t(3.0, loc=float(fn.loc[j]), scale=scale)
        assert ss.kstest(np.asarray(x[:, j], np.float64), law.cdf).statistic < (
            KS_CRITICAL
        )
    law = ss.t(3.0, loc=1.0, scale=2.2)  # power
    assert ss.kstest(np.asarray(x[:, 0], np.float64), law.cdf).statistic > (KS_CRITICAL)


class _ZeroT(dist.StudentT):
    def sample(self, key, sample_shape=()):
        return jnp.zeros(sample_shape + self.batch_shape)


def test_only_numpyro_own_samplers_are_replaced():
    assert has_fast_draw(dist.StudentT(3.0))
    assert has_fast_draw(dist.Gamma(2.0, 1.0)) and has_fast_draw(dist.Chi2(3.0))
    assert has_fast_draw(dist.Beta(2.0, 1.0))
    assert has_fast_draw(dist.Dirichlet(jnp.ones(3)))
    assert has_fast_draw(dist.BetaProportion(0.3, 10.0))  # Beta's sampler
    assert has_fast_draw(dist.MultivariateStudentT(3.0, jnp.zeros(2), jnp.eye(2)))
    assert not has_fast_draw(dist.Laplace(0.0, 1.0))
    assert not has_fast_draw(_ZeroT(3.0))  # its own sampler is kept
    # a wrapped site's shape, from its batch shape broadcast
    base = dist.StudentT(5.0, jnp.zeros(3), 2.0)
    x = jax.jit(lambda k: fast_draw(base, k, (4, 3)))(random.PRNGKey(5))
    assert x.shape == (4, 3) and np.all(np.isfinite(np.asarray(x)))


MU0 = 0.4
Y = jnp.array([-9.0, -0.7, 0.2, 1.3, 6.0])  # outliers far from the predictive


def _likelihoods():
    # the likelihood at mu, its CRPS at MU0 in closed form, that of another
    # law near it (for the test's power), the observations
    return {
        "student-t": (
            lambda mu: dist.StudentT(3.0, mu, 1.5),
            lambda y: sr.crps_t(y, 3.0, MU0, 1.5),
            lambda y: sr.crps_normal(y, MU0, 1.5),  # Normal tails
            Y,
        ),
        "gamma": (
            lambda mu: dist.Gamma(2.5, 2.5 / jnp.exp(mu)),
            lambda y: sr.crps_gamma(y, 2.5, scale=math.exp(MU0) / 2.5),
            lambda y: sr.crps_gamma(y, 2.0, scale=math.exp(MU0) / 2.0),  # same mean
            jnp.abs(Y) + 0.1,
        ),
        "beta": (
            lambda mu: dist.Beta(2.0 * jnp.exp(mu), 3.0),
            lambda y: sr.crps_beta(y, 2.0 * math.exp(MU0), 3.0),
            lambda y: sr.crps_beta(y, 2.4 * math.exp(MU0), 3.0),
            jnp.array([0.01, 0.2, 0.45, 0.7, 0.99]),
        ),
        "inverse gamma (a transformed Gamma), expanded": (
            lambda mu: dist.InverseGamma(3.0, 2.0 * jnp.exp(mu)).expand([5]),
            lambda y: _crps_quad(ss.invgamma(3.0, scale=2.0 * math.exp(MU0)), y),
            lambda y: _crps_quad(
                ss.invgamma(5.0, scale=4.0 * math.exp(MU0)), y
            ),  # same mean
            jnp.abs(Y) + 0.1,
        ),
        "chi2, expanded and masked": (
            lambda mu: dist.Chi2(jnp.exp(mu) * 3.0).expand([5]).mask(True),
            lambda y: sr.crps_gamma(y, 1.5 * math.exp(MU0), scale=2.0),
            lambda y: sr.crps_gamma(y, 1.8 * math.exp(MU0), scale=2.0),
            jnp.abs(Y) + 0.1,
        ),
    }


def _crps_quad(law: ss.rv_continuous, y: np.ndarray) -> np.ndarray:
    """The CRPS by quadrature, int F^2 below y and (1 - F)^2 above."""
    lo, hi = law.support()

    def one(v: float) -> float:
        below = si.quad(lambda x: law.cdf(x) ** 2, lo, v)[0]
        above = si.quad(lambda x: law.sf(x) ** 2, v, hi)[0]
        return below + above

    return np.array([one(float(v)) for v in y])


@pytest.mark.parametrize("name", list(_likelihoods()))
def test_crps_of_gamma_based_likelihoods_is_unbiased(name):
    # a point-mass guide: the predictive is the likelihood at MU0, whose
    # CRPS scoringrules has in closed form; the fair all-pairs estimate
    # from the simulations is unbiased for it (Monte Carlo tolerance)
    likelihood, closed_form, other, y = _likelihoods()[name]

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", y.shape[0]):
            numpyro.sample("y", likelihood(mu), obs=y)

    def guide(y):
        numpyro.sample("mu", dist.Delta(numpyro.param("mu0", MU0)))

    loss = PredictiveELBO(CRPS(), num_particles=4, regularizer=None)
    params = {"mu0": jnp.asarray(MU0)}
    # drawn by the vectorised sampler, not jax.random.gamma's loop per value
    program = str(
        jax.make_jaxpr(loss.loss, static_argnums=(2, 3))(
            random.PRNGKey(0), params, model, guide, y
        )
    )
    assert "random_gamma" not in program
    # the Gamma-based draws by Marsaglia and Tsang's method (its rejection
    # rounds); the Student-t by Bailey's polar method, without rejection
    assert ("while" in program) == (name != "student-t")
    keys = random.split(random.PRNGKey(6), 4000)
    losses = jax.jit(
        jax.vmap(lambda k: loss.loss(k, {"mu0": jnp.asarray(MU0)}, model, guide, y))
    )(keys)
    y64 = np.asarray(y, np.float64)
    exact = float(np.sum(closed_form(y64)))
    se = float(jnp.std(losses)) / math.sqrt(keys.shape[0])
    assert abs(float(jnp.mean(losses)) - exact) < 4.5 * se, (losses.mean(), exact, se)
    assert abs(float(np.sum(other(y64))) - exact) > 6 * se  # power


@pytest.mark.parametrize("df", [0.3, 1.0, 4.0, 30.0, 1e6])
def test_draws_follow_the_student_t_law(df):
    # heavy tails (0.3: values beyond 1e30 without overflow) to the Normal
    x = np.asarray(draw_t(random.PRNGKey(0), jnp.float32(df), (N,)), np.float64)
    assert np.all(np.isfinite(x))
    assert ss.kstest(x, ss.t(df).cdf).statistic < KS_CRITICAL
    # power: a law with 25% more degrees of freedom, 10% wider, is rejected
    assert ss.kstest(x, ss.t(1.25 * df, scale=1.1).cdf).statistic > KS_CRITICAL


def test_degrees_of_freedom_broadcast_and_each_value_has_its_own_law():
    df = jnp.array([0.7, 3.0, 50.0])
    x = np.asarray(draw_t(random.PRNGKey(1), df, (N // 4, 3)), np.float64)
    assert x.shape == (N // 4, 3)
    critical = math.sqrt(-0.5 * math.log(0.5e-3)) / math.sqrt(N // 4)
    for j, nu in enumerate(np.asarray(df)):
        assert ss.kstest(x[:, j], ss.t(nu).cdf).statistic < critical
    assert standard_t(random.PRNGKey(1), 2.0, (0, 3)).shape == (0, 3)


def test_degrees_of_freedom_that_are_not_positive_give_nan():
    x = draw_t(random.PRNGKey(2), jnp.array([jnp.nan, -1.0, 0.0, 2.0]), (4,))
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
        return jax.jvp(lambda d: draw_t(key, d, (n,)), (nu,), (jnp.ones_like(nu),))

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


class _ShiftedNormal(dist.Normal):
    def sample(self, key, sample_shape=()):
        return super().sample(key, sample_shape) + 1.0


def test_a_subclass_with_its_own_sampler_keeps_it():
    assert not has_fast_draw(_ShiftedNormal(0.0, 1.0))
    assert not has_fast_draw(dist.Normal(0.0, 1.0))  # NumPyro's own sampler
