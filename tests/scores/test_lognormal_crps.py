"""The CRPS of LogNormal likelihoods in closed form
(``numpyro_pvi/scores/closed_forms/lognormal.py``): its two expectations against
scoringrules and quadrature, the estimator against the simulated derangement
it averages (with and without a mixture guide's strata), and the particle
machinery's LogNormal parameters under a plate, a subsample and a mask."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from conftest import X64
from jax import random
from numpyro.infer import SVI
from numpyro.infer.autoguide import AutoNormal

from numpyro_pvi import PredictiveELBO
from numpyro_pvi.scores import CRPS, EnergyScore
from numpyro_pvi.scores.closed_forms.lognormal import (
    lognormal_abs_mean,
    lognormal_mean,
    lognormal_pair_abs_mean,
)
from tests.score_helpers import law_terms, with_simulations

sr = pytest.importorskip("scoringrules")

RTOL = 1e-9 if X64 else 3e-5


def _f64(x):
    return np.asarray(x, np.float64)


def _abs(mu, s, y):
    mu, s = jnp.asarray(mu), jnp.asarray(s)
    return lognormal_abs_mean(mu, s, lognormal_mean(mu, s), y)


def _pair(a, b):
    return lognormal_pair_abs_mean((*a, lognormal_mean(*a)), (*b, lognormal_mean(*b)))


def _textbook_abs(mu, s, y):
    # autodiff's reference: the same closed form without custom derivatives
    w = (jnp.log(jnp.where(y > 0, y, 1.0)) - mu) / s
    m = jnp.exp(mu + 0.5 * s**2)
    inside = y * jax.scipy.special.erf(w / math.sqrt(2)) - m * jax.scipy.special.erf(
        (w - s) / math.sqrt(2)
    )
    return jnp.where(y > 0, inside, m - y)


def _textbook_pair(mu_a, s_a, mu_b, s_b):
    tau = jnp.sqrt(s_a**2 + s_b**2)
    m_a, m_b = jnp.exp(mu_a + 0.5 * s_a**2), jnp.exp(mu_b + 0.5 * s_b**2)
    erf = jax.scipy.special.erf
    return -m_a * erf((mu_b - mu_a - s_a**2) / (tau * math.sqrt(2))) - m_b * erf(
        (mu_a - mu_b - s_b**2) / (tau * math.sqrt(2))
    )


@pytest.mark.numerics
def test_custom_derivatives_equal_autodiff_of_the_textbook_form():
    # the partial derivatives from the value's own error functions (the
    # density terms cancel) against autodiff, every argument, y <= 0 included
    key = random.PRNGKey(11)
    mu = random.normal(key, (30,))
    s = jnp.exp(random.normal(random.PRNGKey(12), (30,)) * 0.4 - 0.3)
    y = (
        jnp.exp(random.normal(random.PRNGKey(13), (30,)) * 1.5)
        .at[:3]
        .set(jnp.array([0.0, -1.0, 1e-6]))
    )
    cot = random.uniform(random.PRNGKey(14), (30,))
    for got, want in [
        (
            jax.grad(lambda *a: jnp.sum(cot * _abs(*a)), (0, 1, 2))(mu, s, y),
            jax.grad(lambda *a: jnp.sum(cot * _textbook_abs(*a)), (0, 1, 2))(mu, s, y),
        ),
        (
            jax.grad(
                lambda a, b, c, d: jnp.sum(cot * _pair((a, b), (c, d))), (0, 1, 2, 3)
            )(mu, s, mu[::-1] * 0.5, s[::-1]),
            jax.grad(lambda *a: jnp.sum(cot * _textbook_pair(*a)), (0, 1, 2, 3))(
                mu, s, mu[::-1] * 0.5, s[::-1]
            ),
        ),
    ]:
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=20 * RTOL, atol=20 * RTOL)
    np.testing.assert_allclose(_abs(mu, s, y), _textbook_abs(mu, s, y), rtol=RTOL)


@pytest.mark.numerics
def test_abs_mean_is_scoringrules_crps_lognormal_plus_half_pair():
    # E|X - y| = CRPS(LN(mu, s), y) + E|X - X'| / 2, and E|X - X'| of two
    # draws of one LogNormal is 2 m (2 Phi(s / sqrt 2) - 1)
    mu = random.normal(random.PRNGKey(0), (40,))
    s = jnp.exp(random.normal(random.PRNGKey(1), (40,)) * 0.5 - 0.5)
    y = jnp.exp(random.normal(random.PRNGKey(2), (40,)) * 2.0)  # tails included
    pair = _pair((mu, s), (mu, s))
    mean = np.exp(_f64(mu) + 0.5 * _f64(s) ** 2)
    same = 2 * mean * (2 * _phi(_f64(s) / math.sqrt(2)) - 1)
    np.testing.assert_allclose(pair, same, rtol=RTOL)
    want = sr.crps_lognormal(_f64(y), _f64(mu), _f64(s)) + 0.5 * same
    np.testing.assert_allclose(_abs(mu, s, y), want, rtol=RTOL)


def _phi(x):
    return 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


@pytest.mark.numerics
def test_pair_abs_mean_by_quadrature_and_its_limit():
    # E|X - X'| with different laws: E_{X'} of E|X - x'| by Gauss-Hermite
    # quadrature over log X' (float64), and sigma' -> 0 gives E|X - e^mu'|
    nodes, weights = np.polynomial.hermite_e.hermegauss(120)
    weights = weights / weights.sum()
    for mu_a, s_a, mu_b, s_b in [
        (0.0, 0.5, 0.3, 0.8),
        (1.0, 0.2, -1.0, 0.4),
        (0.0, 1.0, 0.0, 0.1),
    ]:
        x_b = np.exp(mu_b + s_b * nodes)
        inner = _f64(_abs(mu_a, s_a, jnp.asarray(x_b)))
        want = float(np.sum(weights * inner))
        got = float(
            _pair(
                (jnp.asarray(mu_a), jnp.asarray(s_a)),
                (jnp.asarray(mu_b), jnp.asarray(s_b)),
            )
        )
        assert got == pytest.approx(want, rel=10 * RTOL)
    limit = _pair(
        (jnp.asarray(0.2), jnp.asarray(0.7)), (jnp.asarray(0.5), jnp.asarray(1e-4))
    )
    assert float(limit) == pytest.approx(float(_abs(0.2, 0.7, math.exp(0.5))), rel=1e-3)


def test_abs_mean_outside_the_support_and_its_gradient():
    # y <= 0 (a masked observation's 0): E|X - y| = m - y, with a finite
    # gradient (no logarithm of 0 reaches it)
    mu, s = jnp.asarray(0.3), jnp.asarray(0.6)
    m = math.exp(0.3 + 0.5 * 0.36)
    for y in (0.0, -2.0):
        assert float(_abs(mu, s, y)) == pytest.approx(m - y, rel=1e-6)
        grad = jax.grad(lambda a, b, y=y: _abs(a, b, y), argnums=(0, 1))(mu, s)
        np.testing.assert_allclose(grad, (m, m * 0.6), rtol=1e-5)
    # inside, against autodiff of scoringrules' form by finite differences
    y = 1.7
    grad = jax.grad(lambda a: _abs(a, s, y))(mu)
    h = 1e-3
    fd = (float(_abs(mu + h, s, y)) - float(_abs(mu - h, s, y))) / (2 * h)
    assert float(grad) == pytest.approx(fd, rel=1e-3)


def _terms(log_loc, log_scale, y_obs, num_strata=1, omega=None, law=dist.LogNormal):
    return law_terms(
        law,
        log_loc[..., 0],
        log_scale[..., 0],
        y_obs=y_obs,
        num_strata=num_strata,
        omega=omega,
    )


@pytest.mark.parametrize("num_strata, m", [(1, 2), (1, 5), (2, 3)])
def test_closed_form_is_the_derangement_averaged_over_simulations(num_strata, m):
    # given the particles, the closed form is the expectation over the
    # simulations of the simulated derangement estimate: equal within the
    # Monte Carlo error, an observation far in the tail and strata included
    km, b = num_strata * m, 5
    log_loc = random.normal(random.PRNGKey(3), (km, b, 1)) * 0.7
    log_scale = jnp.exp(random.normal(random.PRNGKey(4), (km, b, 1)) * 0.3 - 1.0)
    y = jnp.array([[0.5], [1.0], [2.5], [40.0], [0.02]])
    omega = None
    if num_strata > 1:
        omega = jax.nn.softmax(
            random.normal(random.PRNGKey(5), (num_strata, b)), axis=0
        )
    terms = _terms(log_loc, log_scale, y, num_strata, omega)
    exact = CRPS(estimator="closed-form").estimate(terms)

    def simulated(key):
        x = jnp.exp(log_loc + log_scale * random.normal(key, log_loc.shape))
        return CRPS(estimator="derangement").estimate(with_simulations(terms, x))

    keys = random.split(random.PRNGKey(6), 20000)
    est = jax.jit(jax.vmap(simulated))(keys)
    se = est.std(0) / math.sqrt(keys.shape[0])
    assert jnp.max(jnp.abs(est.mean(0) - exact) / se) < 4.5, (est.mean(0), exact)
    # power: the Normal closed form of the logarithms is another number
    normal = CRPS(estimator="closed-form").estimate(
        _terms(log_loc, log_scale, jnp.log(y), num_strata, omega, law=dist.Normal)
    )
    assert jnp.max(jnp.abs(normal - exact) / se) > 10


def lognormal_model(x, y=None, mask=True):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0))
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.LogNormal(w * x, s).mask(mask), obs=y)


def masked_lognormal_model(x, y=None):
    lognormal_model(x, y, mask=y > 0)


X = jnp.linspace(-1.0, 1.0, 7)
Y = jnp.exp(0.5 * X + 0.3 * random.normal(random.PRNGKey(7), (7,)))


def _params(model):
    guide = AutoNormal(model)
    svi = SVI(model, guide, optax.sgd(0.0), loss=PredictiveELBO("crps"))
    return guide, svi.get_params(svi.init(random.PRNGKey(8), X, Y))


def test_auto_and_energy_take_the_lognormal_closed_form():
    # auto (CRPS and the energy score with beta = 1) is the closed form; the
    # particle terms carry the LogNormal's parameters of log y
    guide, params = _params(lognormal_model)
    key = random.PRNGKey(9)
    values = {
        str(score): PredictiveELBO(score, num_particles=4).loss(
            key, params, lognormal_model, guide, X, Y
        )
        for score in (CRPS(), CRPS(estimator="closed-form"), EnergyScore())
    }
    assert len({float(v) for v in values.values()}) == 1, values
    loss = PredictiveELBO("crps", num_particles=4)
    terms = loss.particle_terms(key, params, lognormal_model, guide, X, Y)
    # the likelihood holds each particle's LogNormal: w x at each
    # observation, one w per particle
    law = terms.likelihood.laws[0]
    loc = terms.likelihood.rows(0, law.base_dist.loc)[..., 0]
    assert loc.shape == (4, 7)
    ratio = loc[:, X != 0] / X[X != 0]
    np.testing.assert_allclose(ratio, ratio[:, :1] * jnp.ones_like(ratio), rtol=1e-5)
    assert float(jnp.std(ratio[:, 0])) > 0.01  # the particles differ
    # the simulations' estimate is another estimator of the same score
    sims = PredictiveELBO(CRPS(estimator="all-pairs"), num_particles=4)
    assert float(sims.loss(key, params, lognormal_model, guide, X, Y)) != float(
        values["CRPS()"]
    )


def test_masked_observation_is_left_out_with_a_finite_gradient():
    # a masked-out observation (its y 0, outside the support) contributes
    # nothing, and its log(0) does not reach the gradient
    guide, params = _params(lognormal_model)
    y = Y.at[2].set(0.0)
    loss = PredictiveELBO("crps", num_particles=4)
    key = random.PRNGKey(10)
    value, grads = jax.value_and_grad(
        lambda p: loss.loss(key, p, masked_lognormal_model, guide, X, y)
    )(params)
    assert np.isfinite(float(value))
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
    per_obs = loss.score.estimate(
        loss.particle_terms(key, params, masked_lognormal_model, guide, X, y)
    )
    full = loss.score.estimate(
        loss.particle_terms(key, params, lognormal_model, guide, X, Y)
    )
    keep = np.arange(7) != 2
    np.testing.assert_allclose(
        np.asarray(per_obs)[keep], np.asarray(full)[keep], rtol=1e-5
    )
