"""The CRPS of Normal-mixture likelihoods in closed form
(``numpyro_pvi/scores/closed_forms/mixture.py``): its two expectations against
scoringrules, the estimator against the simulated derangement it averages
(with and without a mixture guide's strata), the particle machinery's
components under ``MixtureSameFamily`` and ``MixtureGeneral``, a plate, a
mask and an outlier, and the estimators that need simulations refused."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from conftest import X64
from jax import random

from numpyro_pvi import PredictiveELBO, predictive_score
from numpyro_pvi._trace.site_laws import innermost
from numpyro_pvi.scores import CRPS, EnergyScore
from numpyro_pvi.scores.closed_forms.mixture import (
    mixture_abs_mean,
    mixture_pair_abs_mean,
)
from numpyro_pvi.selection import stacking_weights
from tests.score_helpers import (
    crps_against_log,
    initial_params,
    law_terms,
    with_simulations,
)

sr = pytest.importorskip("scoringrules")

RTOL = 1e-9 if X64 else 3e-5


@pytest.mark.numerics
def test_expectations_are_scoringrules_crps_mixnorm():
    # CRPS(F, y) = E|Y - y| - E|Y - Y'| / 2 for F a mixture of Normals, at
    # observations inside and far outside the components (an outlier at 40)
    w = jnp.array([[0.2, 0.5, 0.3], [0.9, 0.05, 0.05]])
    loc = jnp.array([[-2.0, 0.0, 3.0], [1.0, 1.5, -4.0]])
    scale = jnp.array([[0.5, 1.0, 2.0], [0.1, 3.0, 0.7]])
    mixture = (w, loc, scale)
    for y in (-1.0, 0.3, 2.5, 40.0):
        ys = jnp.full((2,), y)
        ours = mixture_abs_mean(mixture, ys) - 0.5 * mixture_pair_abs_mean(
            mixture, mixture
        )
        want = sr.crps_mixnorm(
            np.float64(y),
            np.asarray(loc, np.float64),
            np.asarray(scale, np.float64),
            np.asarray(w, np.float64),
            backend="numpy",
        )
        np.testing.assert_allclose(ours, want, rtol=RTOL * 10, atol=1e-6)


@pytest.mark.numerics
def test_one_component_is_the_normal_closed_form():
    # a mixture of one Normal is that Normal: the same numbers as the Normal
    # closed form, value and gradient
    key = random.PRNGKey(0)
    loc = random.normal(key, (4, 6))
    scale = jnp.exp(random.normal(random.PRNGKey(1), (4, 6)) * 0.3)
    y = random.normal(random.PRNGKey(2), (6,)) * 2.0
    crps = CRPS(estimator="closed-form")

    def mixture(loc):
        w = jnp.ones((4, 6, 1))
        return crps.estimate(_terms((w, loc[..., None], scale[..., None]), y[:, None]))

    def normal(loc):
        return crps.estimate(law_terms(dist.Normal, loc, scale, y_obs=y[:, None]))

    v1, g1 = jax.value_and_grad(lambda m: mixture(m).sum())(loc)
    v2, g2 = jax.value_and_grad(lambda m: normal(m).sum())(loc)
    np.testing.assert_allclose(v1, v2, rtol=RTOL)
    np.testing.assert_allclose(g1, g2, rtol=RTOL * 10, atol=1e-7)


def _mixture(w, loc, scale):
    return dist.MixtureSameFamily(dist.Categorical(probs=w), dist.Normal(loc, scale))


def _terms(mixture, y_obs, num_strata=1, omega=None):
    w, loc, scale = (jnp.broadcast_to(x, mixture[1].shape) for x in mixture)
    return law_terms(
        _mixture, w, loc, scale, y_obs=y_obs, num_strata=num_strata, omega=omega
    )


@pytest.mark.parametrize("num_strata, m", [(1, 2), (1, 5), (2, 3)])
def test_closed_form_is_the_derangement_averaged_over_simulations(num_strata, m):
    # given the particles, the closed form is the expectation over the
    # simulations (component, then Normal) of the simulated derangement
    # estimate: equal within the Monte Carlo error, an outlier included
    km, b, c = num_strata * m, 5, 3
    w = jax.nn.softmax(random.normal(random.PRNGKey(3), (km, b, c)), axis=-1)
    loc = random.normal(random.PRNGKey(4), (km, b, c)) * 2.0
    scale = jnp.exp(random.normal(random.PRNGKey(5), (km, 1, c)) * 0.3 - 0.5)
    y = jnp.array([[0.5], [-1.0], [2.5], [30.0], [0.0]])
    omega = None
    if num_strata > 1:
        omega = jax.nn.softmax(random.normal(random.PRNGKey(6), (num_strata, b)), 0)
    terms = _terms((w, loc, scale), y, num_strata, omega)
    exact = CRPS(estimator="closed-form").estimate(terms)

    def simulated(key):
        k1, k2 = random.split(key)
        comp = random.categorical(k1, jnp.log(w))  # (km, b)
        pick = lambda a: jnp.take_along_axis(  # noqa: E731
            jnp.broadcast_to(a, w.shape), comp[..., None], axis=-1
        )
        x = pick(loc) + pick(scale) * random.normal(k2, (km, b, 1))
        return CRPS(estimator="derangement").estimate(with_simulations(terms, x))

    keys = random.split(random.PRNGKey(7), 20000)
    est = jax.jit(jax.vmap(simulated))(keys)
    se = est.std(0) / math.sqrt(keys.shape[0])
    assert jnp.max(jnp.abs(est.mean(0) - exact) / se) < 4.5, (est.mean(0), exact)
    # power: the components' mean as a Normal is another number
    mean = jnp.sum(w * loc, axis=-1, keepdims=True)
    normal = CRPS(estimator="closed-form").estimate(
        law_terms(
            dist.Normal,
            mean[..., 0],
            jnp.ones_like(mean[..., 0]),
            y_obs=y,
            num_strata=num_strata,
            omega=omega,
        )
    )
    assert jnp.max(jnp.abs(normal - exact) / se) > 10


X = jnp.linspace(-1.0, 1.0, 9)
Y = jnp.concatenate([-2.0 + 0.3 * X[:4], 2.0 + 0.3 * X[4:8], jnp.array([25.0])])


def same_family(x, y=None, mask=True):
    w = numpyro.sample("w", dist.Dirichlet(jnp.ones(2)))
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0).expand([2]).to_event(1))
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    with numpyro.plate("data", x.shape[0]):
        comp = dist.Normal(mu + 0.3 * x[:, None], s)
        numpyro.sample(
            "y", dist.MixtureSameFamily(dist.Categorical(w), comp).mask(mask), obs=y
        )


def general(x, y=None):
    w = numpyro.sample("w", dist.Dirichlet(jnp.ones(2)))
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0).expand([2]).to_event(1))
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    with numpyro.plate("data", x.shape[0]):
        comps = [dist.Normal(mu[k] + 0.3 * x, s) for k in range(2)]
        numpyro.sample("y", dist.MixtureGeneral(dist.Categorical(w), comps), obs=y)


def _params():
    return initial_params(same_family, X, Y)


def test_both_mixture_forms_give_the_closed_form_with_gradients_in_the_weights():
    guide, params = _params()
    key = random.PRNGKey(9)
    loss = PredictiveELBO("crps", num_particles=4)
    values = {}
    for model in (same_family, general):
        value, grads = jax.value_and_grad(
            lambda p, model=model: loss.loss(key, p, model, guide, X, Y)
        )(params)
        values[model.__name__] = float(value)
        assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
        # the mixture weights (Dirichlet's unconstrained location) get one
        assert float(jnp.abs(grads["w_auto_loc"]).sum()) > 0
    np.testing.assert_allclose(values["same_family"], values["general"], rtol=RTOL)
    terms = loss.particle_terms(key, params, same_family, guide, X, Y)
    # the likelihood holds each particle's mixture: 2 components' weights
    law = innermost(terms.likelihood.laws[0])
    assert isinstance(law, dist.MixtureSameFamily)
    probs = law.mixing_distribution.probs
    assert probs.shape[0] == 4 and probs.shape[-1] == 2
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)
    # the energy score with beta = 1 takes the same closed form
    energy = PredictiveELBO(EnergyScore(), num_particles=4)
    np.testing.assert_allclose(
        energy.loss(key, params, same_family, guide, X, Y),
        values["same_family"],
        rtol=RTOL,
    )


def test_masked_observation_is_left_out():
    guide, params = _params()
    loss = PredictiveELBO("crps", num_particles=4)
    key = random.PRNGKey(10)
    keep = np.arange(9) != 8  # the outlier masked out
    masked = loss.score.estimate(
        loss.particle_terms(key, params, same_family, guide, X, Y, mask=keep)
    )
    full = loss.score.estimate(
        loss.particle_terms(key, params, same_family, guide, X, Y)
    )
    np.testing.assert_allclose(
        np.asarray(masked)[keep], np.asarray(full)[keep], rtol=1e-5
    )


@pytest.mark.parametrize(
    "score",
    [CRPS(estimator="all-pairs"), CRPS(estimator="derangement"), EnergyScore(0.5)],
)
def test_simulations_are_refused_with_the_closed_form_as_remedy(score):
    guide, params = _params()
    loss = PredictiveELBO(score, num_particles=4)
    with pytest.raises(ValueError, match="Normal mixture.*site.*'y'.*closed form"):
        loss.loss(random.PRNGKey(11), params, same_family, guide, X, Y)


def test_a_refusal_advises_the_crps_and_the_advice_works():
    # the quadratic score has no pmf to read; the CRPS it advises fits
    guide, params = _params()
    key = random.PRNGKey(14)
    with pytest.raises(ValueError, match="Use score='log' or 'crps' for this"):
        PredictiveELBO("quadratic", num_particles=4).loss(
            key, params, same_family, guide, X, Y
        )
    crps = PredictiveELBO("crps", num_particles=4)
    assert np.isfinite(float(crps.loss(key, params, same_family, guide, X, Y)))


def test_held_out_score_by_simulations_agrees_with_the_closed_form():
    # without gradients the mixture's sampler serves: the simulated all-pairs
    # estimate and the closed form estimate the same score
    guide, params = _params()
    key = random.PRNGKey(12)
    exact = predictive_score(key, params, same_family, guide, X, Y, score="crps")
    sims = predictive_score(
        key, params, same_family, guide, X, Y, score=CRPS(estimator="all-pairs")
    )
    se = np.hypot(np.asarray(exact.se), np.asarray(sims.se))
    z = np.abs(np.asarray(exact.score) - np.asarray(sims.score)) / se
    assert np.max(z) < 4.5, z
    assert np.all(np.isfinite(exact.score)) and float(exact.score[-1]) < -10


def test_cross_validation_scores_the_folds_by_the_closed_form():
    # every observation's held-out CRPS is finite, the outlier's far below
    cv = crps_against_log(13, same_family, X, Y)
    scores = np.asarray(cv.scores["pointwise"].sel(candidate="crps"))
    assert scores.shape == (9,) and np.all(np.isfinite(scores))
    assert scores[-1] < -10  # the outlier at 25, far from both components
    # stacking the two fits scores their mixture: the pair gains of two
    # fits' draws, each fit's components in closed form
    gains = np.asarray(cv.scores["pair_gain"])
    assert gains.shape == (2, 2, 9) and np.all(np.isfinite(gains))
    weights = stacking_weights(cv).weights
    np.testing.assert_allclose(np.sum(weights), 1.0, rtol=1e-6)
