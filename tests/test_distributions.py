"""The likelihood-free ``Simulator`` distribution and fitting it with CRPS."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from conftest import run_particles
from jax import random
from jax.scipy.stats import norm
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from numpyro_pvi import PredictiveELBO
from numpyro_pvi.distributions import Simulator, setup_guide
from numpyro_pvi.scores import simulations

LIKELIHOOD_FREE = "this site is likelihood-free: use score='crps' or 'energy'"
NOISE = 0.1


def shifted_noise(key, loc):
    return loc + NOISE * random.normal(key, jnp.shape(loc))


def test_sample_shapes_broadcasting_and_independence():
    d = Simulator(shifted_noise, jnp.arange(3.0))
    assert d.batch_shape == (3,) and d.event_shape == () and d.has_rsample
    x = d.sample(random.PRNGKey(0), (4,))
    assert x.shape == (4, 3)
    assert np.all(np.asarray(jnp.std(x, axis=0)) > 0)  # independent draws
    # a wider batch_shape gets independent simulations, as expand() does
    wide = Simulator(shifted_noise, jnp.arange(3.0), batch_shape=(5, 3))
    y = wide.sample(random.PRNGKey(1), (2,))
    assert y.shape == (2, 5, 3)
    assert np.all(np.asarray(jnp.std(y[0], axis=0)) > 0)
    expanded = Simulator(shifted_noise, 1.0).expand([6])
    assert expanded.has_rsample and expanded.sample(random.PRNGKey(2)).shape == (6,)
    assert len(set(np.asarray(expanded.sample(random.PRNGKey(2))).tolist())) == 6


def test_vector_events_and_pytree_round_trip():
    def simulate_2d(key, loc):
        return loc[..., None] + random.normal(key, jnp.shape(loc) + (2,))

    d = Simulator(simulate_2d, jnp.zeros(4), event_shape=(2,))
    assert d.batch_shape == (4,) and d.event_shape == (2,)
    assert d.sample(random.PRNGKey(0), (3,)).shape == (3, 4, 2)
    leaves, treedef = jax.tree_util.tree_flatten(d)
    again = jax.tree_util.tree_unflatten(treedef, leaves)
    np.testing.assert_allclose(
        again.sample(random.PRNGKey(5)), d.sample(random.PRNGKey(5))
    )


def test_sample_is_reparameterised():
    grad = jax.grad(
        lambda loc: jnp.sum(
            Simulator(shifted_noise, loc).expand([5]).sample(random.PRNGKey(0), (3,))
        )
    )(0.7)
    assert float(grad) == pytest.approx(15.0)


def test_bad_arguments():
    with pytest.raises(TypeError, match="fn must be a function"):
        Simulator(3.0, 1.0)
    with pytest.raises(ValueError, match="does not end with event_shape=\\(2,\\)"):
        Simulator(shifted_noise, jnp.zeros(3), event_shape=(2,))
    with pytest.raises(ValueError, match="does not broadcast to batch_shape"):
        Simulator(shifted_noise, jnp.zeros(3), batch_shape=(4,))


def test_log_prob_raises_likelihood_free_error():
    d = Simulator(shifted_noise, 0.0)
    with pytest.raises(NotImplementedError, match=LIKELIHOOD_FREE):
        d.log_prob(0.3)


# --------------------------------------------------------------------------
# fitting a likelihood-free model
# --------------------------------------------------------------------------

N, TAU, CENTRE = 200, 1.5, 1.0


def lf_model(y):
    # the model has no population spread: y_i = mu + noise
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    with numpyro.plate("data", y.shape[0], subsample_size=50) as idx:
        numpyro.sample("y", Simulator(shifted_noise, mu), obs=y[idx])


@pytest.fixture(scope="module")
def population_data():
    # theta_i ~ N(CENTRE, TAU^2) (evenly spaced quantiles), y_i = theta_i + noise
    theta = CENTRE + TAU * norm.ppf((jnp.arange(N) + 0.5) / N)
    y = theta + NOISE * random.normal(random.PRNGKey(42), (N,))
    return random.permutation(random.PRNGKey(43), y)


def test_simulator_site_in_subsampled_plate_gives_per_particle_draws(population_data):
    y = population_data
    # an autoguide of a likelihood-free model is set up explicitly
    with pytest.raises(NotImplementedError, match="setup_guide"):
        SVI(lf_model, AutoNormal(lf_model), optax.adam(0.1), Trace_ELBO()).init(
            random.PRNGKey(0), y
        )
    guide = setup_guide(AutoNormal(lf_model), random.PRNGKey(1), y)
    assert guide.prototype_trace is not None
    svi = SVI(lf_model, guide, optax.adam(0.1), PredictiveELBO("crps"))
    params = svi.get_params(svi.init(random.PRNGKey(0), y))
    assert set(params) == {"mu_auto_loc", "mu_auto_scale"}
    params = {"mu_auto_loc": jnp.asarray(3.0), "mu_auto_scale": jnp.asarray(2.0)}
    terms = jax.jit(
        lambda key: run_particles(
            key,
            params,
            lf_model,
            guide,
            (y,),
            {},
            num_particles=6,
            vectorize_particles_fn=lambda f, k: jax.vmap(f)(k),
            requests=("likelihood", "weight"),
        )
    )(random.PRNGKey(0))
    y_sim, _ = simulations(terms)
    assert y_sim.shape == (6, 50, 1) and terms.y_obs.shape == (50, 1)
    np.testing.assert_allclose(
        terms.weights.observation, N / 50, rtol=1e-6
    )  # subsample scale
    # each particle's draws scatter by NOISE around that particle's mu, and the
    # observed values are a subsample of the data
    spread = jnp.std(y_sim[..., 0], axis=1)
    assert np.all(np.abs(np.asarray(spread) - NOISE) < 0.05)
    assert np.all(np.isin(np.asarray(terms.y_obs[:, 0]), np.asarray(y)))
    # and Trace_ELBO cannot run on it
    with pytest.raises(NotImplementedError, match=LIKELIHOOD_FREE):
        Trace_ELBO().loss(random.PRNGKey(0), params, lf_model, guide, y)


def test_crps_fit_of_likelihood_free_model_recovers_population_spread(population_data):
    # PVI: the predictive N(mu_q, s^2 + NOISE^2) matches the data, so the guide
    # must be as wide as the population, s -> TAU (VI's q would shrink to 0)
    steps = 500

    def guide(y):
        loc = numpyro.param("loc", 0.0)
        scale = numpyro.param("scale", 0.5, constraint=dist.constraints.positive)
        numpyro.sample("mu", dist.Normal(loc, scale))

    optim = optax.adam(optax.exponential_decay(0.05, steps, 0.05))
    loss = PredictiveELBO("crps", num_particles=16, regularizer=None)
    result = SVI(lf_model, guide, optim, loss).run(
        random.PRNGKey(0), steps, population_data, progress_bar=False
    )
    sd = float(result.params["scale"])
    expected = math.sqrt(float(jnp.var(population_data)) - NOISE**2)
    assert abs(sd - TAU) < 0.15 * TAU, sd
    assert abs(sd - expected) < 0.15 * expected, (sd, expected)
    assert abs(float(result.params["loc"]) - CENTRE) < 0.3


def vector_model(y_scalar, y_vec):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    with numpyro.plate("data", y_scalar.shape[0]):
        numpyro.sample("y_scalar", dist.Normal(mu, 1.0), obs=y_scalar)
        numpyro.sample(
            "y_vec",
            Simulator(
                lambda key, m: m + random.normal(key, (2,)), mu, event_shape=(2,)
            ),
            obs=y_vec,
        )


def test_energy_score_on_vector_simulator_and_second_site():
    y_scalar, y_vec = jnp.array([0.0, 1.0, 2.0]), jnp.ones((3, 2))

    def guide(y_scalar, y_vec):
        loc = numpyro.param("loc", 0.0)
        numpyro.sample("mu", dist.Normal(loc, 1.0))

    elbo = PredictiveELBO("energy", num_particles=8, regularizer="prior")

    @jax.jit
    def run(params):
        loss, grad = jax.value_and_grad(elbo.loss, argnums=1)(
            random.PRNGKey(0), params, vector_model, guide, y_scalar, y_vec
        )
        terms = elbo.particle_terms(
            random.PRNGKey(0), params, vector_model, guide, y_scalar, y_vec
        )
        return loss, grad, terms

    loss, grad, terms = run({"loc": jnp.asarray(0.5)})
    assert np.isfinite(loss) and np.isfinite(grad["loc"]) and grad["loc"] != 0
    assert simulations(terms)[0].shape == (8, 3, 3)
    np.testing.assert_allclose(terms.y_obs, jnp.c_[y_scalar, y_vec])
    # the posterior regularizer needs the likelihood, which the site lacks
    with pytest.raises(NotImplementedError, match=LIKELIHOOD_FREE):
        PredictiveELBO("energy", num_particles=2, regularizer="posterior").loss(
            random.PRNGKey(0), {"loc": 0.5}, vector_model, guide, y_scalar, y_vec
        )
