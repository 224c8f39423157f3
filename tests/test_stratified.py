"""The VI baseline of mixture guides: the stratified ELBO learns the weights,
and Trace_ELBO, whose gradient cannot reach them, stops with a clear error."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax import random
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoDelta, AutoNormal

from numpyro_pvi import Replications, StratifiedELBO, diagnostics
from numpyro_pvi.guides import AutoGaussianMixture

POST_LOC, POST_VAR = 1.0, 0.5
LOCS, SCALE = np.array([-1.0, 1.0]), 0.5


def target():
    """No data: the 'posterior' is the prior N(1, 1/2)."""
    numpyro.sample("t", dist.Normal(POST_LOC, math.sqrt(POST_VAR)))


def _mixture_params(logits=(0.0, 0.0)):
    guide = AutoGaussianMixture(target, 2)
    svi = SVI(target, guide, optax.sgd(0.0), StratifiedELBO())
    state = svi.init(random.PRNGKey(0))
    params = dict(svi.get_params(state))
    params["auto_locs"] = jnp.asarray(LOCS)[:, None]
    params["auto_scale_trils"] = jnp.full((2, 1, 1), SCALE)
    params["auto_weight_logits"] = jnp.asarray(logits)
    return guide, params


def _exact_elbo_gradient(logits):
    """d ELBO / d logits by quadrature: ω_k ∫ (N_k − q̄)(log p − log q̄)."""
    theta = np.linspace(-10.0, 10.0, 40_001)
    w = np.exp(logits) / np.exp(logits).sum()
    comp = np.exp(-0.5 * ((theta[None] - LOCS[:, None]) / SCALE) ** 2) / (
        SCALE * math.sqrt(2 * math.pi)
    )
    q = w @ comp
    log_p = -0.5 * (theta - POST_LOC) ** 2 / POST_VAR - 0.5 * math.log(
        2 * math.pi * POST_VAR
    )
    integrand = w[:, None] * (comp - q) * (log_p - np.log(q))
    return np.trapezoid(integrand, theta, axis=1)


@pytest.mark.slow
def test_weight_gradient_is_the_exact_elbo_gradient():
    logits = np.array([0.0, 0.0])
    guide, params = _mixture_params(logits)
    loss = StratifiedELBO(num_particles=1)

    def grad(key):
        return jax.grad(lambda p: loss.loss(key, p, target, guide))(params)[
            "auto_weight_logits"
        ]

    grads = -np.asarray(jax.jit(jax.vmap(grad))(random.split(random.PRNGKey(1), 4000)))
    exact = _exact_elbo_gradient(logits)
    assert exact[1] > 0.5  # the weight should move to the component at the target
    se = grads.std(axis=0, ddof=1) / math.sqrt(grads.shape[0])
    np.testing.assert_array_less(np.abs(grads.mean(axis=0) - exact), 4 * se + 1e-6)


def test_fit_from_equal_weights_moves_the_weight_to_the_posterior():
    guide, params = _mixture_params()
    svi = SVI(target, guide, optax.adam(0.05), StratifiedELBO(num_particles=4))
    state = svi.init(random.PRNGKey(2), init_params=params)
    state, _ = jax.lax.scan(lambda s, _: svi.update(s), state, None, length=400)
    fitted = svi.get_params(state)
    weights = jax.nn.softmax(fitted["auto_weight_logits"])
    near = int(np.argmin(np.abs(np.asarray(fitted["auto_locs"][:, 0]) - POST_LOC)))
    assert float(weights[near]) > 0.8, (weights, fitted["auto_locs"])


def test_trace_elbo_with_a_mixture_guide_stops_with_a_clear_error():
    guide = AutoGaussianMixture(target, 2)
    svi = SVI(target, guide, optax.adam(0.01), Trace_ELBO())
    with pytest.raises(ValueError, match="StratifiedELBO"):
        svi.run(random.PRNGKey(0), 2, progress_bar=False)


def test_vsbc_with_trace_elbo_and_a_mixture_guide_stops_with_a_clear_error():
    def model(y=None):
        t = numpyro.sample("t", dist.Normal(0.0, 1.0))
        with numpyro.plate("n", 3):
            numpyro.sample("y", dist.Normal(t, 1.0), obs=y)

    with pytest.raises(ValueError, match="StratifiedELBO"):
        diagnostics.vsbc(
            random.PRNGKey(0),
            model,
            AutoGaussianMixture(model, 2),
            optax.adam(0.01),
            Trace_ELBO(),
            replications=Replications(
                num_simulations=2, num_svi_steps=2, num_draws=5, progress_bar=False
            ),
            observed_sites=["y"],
        )


def test_drawing_without_gradient_still_works():
    guide, params = _mixture_params()
    draws = guide.sample_posterior(random.PRNGKey(0), params, sample_shape=(2000,))
    assert draws["t"].shape == (2000,)
    assert abs(float(draws["t"].mean())) < 0.1  # equal weights at -1 and 1


def test_one_component_trace_elbo_is_allowed():
    guide = AutoGaussianMixture(target, 1)
    svi = SVI(target, guide, optax.adam(0.01), Trace_ELBO())
    assert np.isfinite(svi.run(random.PRNGKey(0), 2, progress_bar=False).losses).all()


@pytest.mark.parametrize("guide_class", [AutoNormal, AutoDelta])
def test_equals_trace_elbo_without_components(guide_class):
    def model(y):
        t = numpyro.sample("t", dist.Normal(0.0, 1.0))
        with numpyro.plate("n", y.shape[0]):
            numpyro.sample("y", dist.Normal(t, 1.0), obs=y)

    y = jnp.array([0.5, -1.0, 2.0])
    guide = guide_class(model)
    svi = SVI(model, guide, optax.adam(0.1), Trace_ELBO())
    params = svi.run(random.PRNGKey(0), 20, y, progress_bar=False).params
    ours = StratifiedELBO(num_particles=20_000)
    expected = Trace_ELBO(num_particles=20_000).loss(
        random.PRNGKey(1), params, model, guide, y
    )
    got = ours.loss(random.PRNGKey(2), params, model, guide, y)
    # both are Monte Carlo estimates of the same -ELBO (exact for AutoDelta)
    np.testing.assert_allclose(got, expected, rtol=2e-3)


def test_bad_input():
    with pytest.raises(ValueError, match="num_particles"):
        StratifiedELBO(num_particles=0)
    assert repr(StratifiedELBO(3)) == "StratifiedELBO(num_particles=3)"
