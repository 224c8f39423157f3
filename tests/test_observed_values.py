"""Observed values computed from the latent draws: a residual written as
``numpyro.sample("y", dist.Normal(0, sigma), obs=y - mu)``, or NumPyro's
Bayesian CUPED notebook, whose second likelihood observes ``y_post - theta
* (y_pre - mean)``. Under ``Trace_ELBO`` they are terms of the joint
density; a predictive score would compare each draw's predictive with its
own observations. The predictive functions refuse them in the data plate;
the objectives of the joint density take them."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax import random
from numpyro.handlers import condition
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from numpyro_pvi import PredictiveELBO, SoftCVIELBO, diagnostics, predictive_score
from numpyro_pvi._trace.structure import latent_dependent_observations

pytestmark = pytest.mark.py312

Y = jnp.asarray(np.random.default_rng(0).normal(1.0, 1.0, 10), jnp.float32)
PARAMS = {"mu_auto_loc": jnp.array(0.5), "mu_auto_scale": jnp.array(1.0)}


def direct(y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("n", 10):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def residual(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("n", 10):
        numpyro.sample("y", dist.Normal(0.0, 1.0), obs=y - mu)


def cuped(y_post, treatment, y_pre):
    theta = numpyro.sample("theta", dist.Normal(0.0, 3.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 3.0))
    with numpyro.plate("target", y_post.shape[0]):
        numpyro.sample("y_post", dist.Normal(theta * y_pre, sigma), obs=y_post)
    y_cuped = y_post - theta * (y_pre - jnp.mean(y_pre))
    with numpyro.plate("cuped", y_post.shape[0]):
        numpyro.sample("y_cuped", dist.Normal(beta * treatment, sigma), obs=y_cuped)


def test_the_dependence_is_found_abstractly_under_jit_and_vmap():
    """Found from the batching of the observed values under a vmap over the
    latents: data are not (also when the caller's own jit or vmap traces
    them, as a cross-validation grid does), residuals are."""

    def count(model, y):
        return jnp.float32(len(latent_dependent_observations(model, (y,), {})))

    assert latent_dependent_observations(direct, (Y,), {}) == []
    assert latent_dependent_observations(residual, (Y,), {}) == ["y"]
    stacked = jnp.stack([Y, Y])
    np.testing.assert_array_equal(jax.vmap(lambda y: count(direct, y))(stacked), 0)
    np.testing.assert_array_equal(jax.vmap(lambda y: count(residual, y))(stacked), 1)
    closed = jax.vmap(
        lambda y: jnp.float32(
            len(latent_dependent_observations(condition(direct, {"y": y}), (), {}))
        )
    )(stacked)
    np.testing.assert_array_equal(closed, 0)
    assert jax.jit(lambda y: count(residual, y))(Y) == 1


@pytest.mark.parametrize("score", ["log", "crps"])
def test_predictive_functions_refuse_a_residual_and_name_the_remedy(score):
    """The CRPS of the residual form is not the direct form's (the pairs of
    draws would be compared without their locations): refused, with the
    direct form as remedy, whose score is computed."""
    guide = AutoNormal(residual)
    with pytest.raises(ValueError, match=r"site 'y' observes a value computed.*obs=y"):
        predictive_score(random.PRNGKey(0), PARAMS, residual, guide, Y, score=score)
    with pytest.raises(ValueError, match="PredictiveELBO: the observed site 'y'"):
        SVI(residual, guide, optax.adam(0.01), PredictiveELBO(score)).run(
            random.PRNGKey(0), 2, Y, progress_bar=False
        )
    with pytest.raises(ValueError, match="to_inference_data: the observed site"):
        diagnostics.to_inference_data(random.PRNGKey(0), PARAMS, residual, guide, Y)
    fixed = predictive_score(
        random.PRNGKey(0), PARAMS, direct, AutoNormal(direct), Y, score=score
    )
    assert np.all(np.isfinite(np.asarray(fixed.score)))


def test_the_joint_density_objectives_take_it_as_it_is():
    """SoftCVI and PSIS read the joint density: the residual form's equals
    the direct form's, draw for draw."""
    key = random.PRNGKey(1)
    losses = [
        SoftCVIELBO(num_particles=8).loss(key, PARAMS, model, AutoNormal(model), Y)
        for model in (residual, direct)
    ]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    k_hats = [
        float(
            diagnostics.psis(key, PARAMS, m, AutoNormal(m), Y, num_draws=200)
            .psis["pareto_k"]
            .values
        )
        for m in (residual, direct)
    ]
    np.testing.assert_allclose(k_hats[0], k_hats[1], rtol=1e-5)


def test_a_data_plate_outside_the_dependent_site_works():
    """CUPED: the second likelihood depends on theta. Scoring the first
    plate (the second is then a term of the joint density) works; scoring
    the second is refused."""
    rng = np.random.default_rng(1)
    pre = jnp.asarray(rng.normal(size=30), jnp.float32)
    treatment = jnp.asarray(rng.integers(0, 2, 30), jnp.float32)
    post = 0.8 * pre + 0.3 * treatment + 0.3 * jnp.asarray(rng.normal(size=30))
    guide = AutoNormal(cuped)
    args = (post, treatment, pre)
    svi = SVI(cuped, guide, optax.adam(0.01), Trace_ELBO())
    params = svi.get_params(svi.init(random.PRNGKey(0), *args))
    score = predictive_score(
        random.PRNGKey(0), params, cuped, guide, *args, data_plate="target"
    )
    assert np.asarray(score.score).shape == (30,)
    with pytest.raises(ValueError, match="site 'y_cuped' observes a value computed"):
        predictive_score(
            random.PRNGKey(0), params, cuped, guide, *args, data_plate="cuped"
        )
