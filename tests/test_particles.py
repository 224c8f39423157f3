"""The shared particle machinery: data plate, per-observation terms, scales."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from conftest import run_particles
from jax import random
from numpyro.infer.autoguide import AutoDelta, AutoNormal

from numpyro_pvi._trace.terms import FIELDS, LOG_Q_FIXED, OBS_WEIGHT
from numpyro_pvi.particles import (
    LIKELIHOOD,
    LOG_LIK,
    ParticleTerms,
    log_mean_exp,
    particle_logsumexp,
    particle_sum,
)
from numpyro_pvi.scores import simulations, support_pmf


def _vmap(f, keys):
    return jax.vmap(f)(keys)


def _terms(model, guide, *args, num_particles=4, requests=(LOG_LIK, OBS_WEIGHT), **kw):
    key = random.PRNGKey(0)
    params = guide_params(guide, model, *args)
    return run_particles(
        key,
        params,
        model,
        guide,
        args,
        {},
        num_particles=num_particles,
        vectorize_particles_fn=_vmap,
        requests=requests,
        **kw,
    )


def guide_params(guide, model, *args):
    from numpyro.infer import SVI, Trace_ELBO

    svi = SVI(model, guide, numpyro.optim.Adam(0.1), Trace_ELBO())
    state = svi.init(random.PRNGKey(1), *args)
    return svi.get_params(state)


def two_site_model(y1, y2):
    theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y1.shape[0]):
        numpyro.sample("y1", dist.Normal(theta, 1.0), obs=y1)
        numpyro.sample(
            "y2", dist.Normal(2 * theta, 0.5).expand([3]).to_event(1), obs=y2
        )


def test_several_sites_at_one_index_form_one_observation():
    y1 = jnp.arange(5.0)
    y2 = jnp.ones((5, 3))
    guide = AutoDelta(two_site_model)
    terms = _terms(two_site_model, guide, y1, y2)
    params = guide_params(guide, two_site_model, y1, y2)
    theta = params["theta_auto_loc"]
    expected = dist.Normal(theta, 1.0).log_prob(y1) + dist.Normal(
        2 * theta, 0.5
    ).log_prob(y2).sum(-1)
    assert terms.log_lik.shape == (4, 5)
    np.testing.assert_allclose(
        terms.log_lik, jnp.broadcast_to(expected, (4, 5)), rtol=1e-6
    )
    np.testing.assert_allclose(terms.weights.observation, jnp.ones(5))
    np.testing.assert_allclose(
        terms.log_prior, dist.Normal(0, 1).log_prob(theta) * jnp.ones(4), rtol=1e-6
    )


def nested_model(y):
    # observations are rows: the data plate is the outer plate
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("rows", y.shape[0], dim=-2):
        with numpyro.plate("cols", y.shape[1], dim=-1):
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def test_named_data_plate_sums_within_observation():
    y = random.normal(random.PRNGKey(3), (6, 2))
    guide = AutoDelta(nested_model)
    with pytest.raises(ValueError, match="several plates"):
        _terms(nested_model, guide, y)
    terms = _terms(nested_model, guide, y, data_plate="rows")
    mu = guide_params(guide, nested_model, y)["mu_auto_loc"]
    expected = dist.Normal(mu, 1.0).log_prob(y).sum(-1)
    np.testing.assert_allclose(terms.log_lik[0], expected, rtol=1e-6)
    terms = _terms(nested_model, guide, y, data_plate="cols")
    np.testing.assert_allclose(
        terms.log_lik[0], dist.Normal(mu, 1.0).log_prob(y).sum(0), rtol=1e-6
    )


def local_latent_model(y, subsample_size=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0], subsample_size=subsample_size) as idx:
        z = numpyro.sample("z", dist.Normal(mu, 1.0))
        numpyro.sample("y", dist.Normal(z, 0.5), obs=y[idx])


@pytest.mark.slow
def test_subsampling_local_latents_and_weights():
    y = jnp.arange(10.0)
    guide = AutoNormal(local_latent_model)
    params = guide_params(guide, local_latent_model, y, 4)
    terms = run_particles(
        random.PRNGKey(5),
        params,
        local_latent_model,
        guide,
        (y, 4),
        {},
        num_particles=3,
        vectorize_particles_fn=_vmap,
        requests=(LOG_LIK, OBS_WEIGHT),
    )
    assert terms.log_lik.shape == (3, 4)
    np.testing.assert_allclose(terms.weights.observation, 2.5 * jnp.ones(4))
    # the subsample scale N / b enters the scaled log-likelihood
    np.testing.assert_allclose(terms.log_lik_scaled, 2.5 * terms.log_lik, rtol=1e-6)
    assert terms.log_prior.shape == terms.log_q.shape == (3,)
    assert jnp.all(jnp.isfinite(terms.log_lik))


def test_handler_scale_enters_weight_and_latent_densities():
    y = jnp.arange(4.0)
    scaled = numpyro.handlers.scale(local_latent_model, 0.5)
    guide = AutoDelta(scaled)
    params = guide_params(guide, scaled, y)
    terms = run_particles(
        random.PRNGKey(0),
        params,
        scaled,
        guide,
        (y,),
        {},
        num_particles=2,
        vectorize_particles_fn=_vmap,
        requests=(LOG_LIK, OBS_WEIGHT),
    )
    np.testing.assert_allclose(terms.weights.observation, 0.5 * jnp.ones(4))
    mu, z = params["mu_auto_loc"], params["z_auto_loc"]
    expected = 0.5 * (
        dist.Normal(0, 1).log_prob(mu) + dist.Normal(mu, 1).log_prob(z).sum()
    )
    np.testing.assert_allclose(terms.log_prior[0], expected, rtol=1e-5)


def no_plate_model(y):
    theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
    numpyro.sample("y", dist.Normal(theta, 1.0).expand([3]).to_event(1), obs=y)


def test_no_plate_observations_are_the_batch_elements():
    """``obs=y`` on a vector without a plate: one observation per element
    (NumPyro's ``log_likelihood``); an event-shaped site is one observation."""

    def vector_model(y):
        theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)

    y = jnp.asarray([0.5, -1.0, 2.0])
    guide = AutoDelta(vector_model)
    terms = _terms(vector_model, guide, y)
    assert terms.log_lik.shape == (4, 3)
    theta = guide_params(guide, vector_model, y)["theta_auto_loc"]
    np.testing.assert_allclose(
        terms.log_lik[0], dist.Normal(theta, 1.0).log_prob(y), rtol=1e-6
    )
    # an event of 3 and no batch dimension: the data set is one observation
    terms = _terms(no_plate_model, AutoDelta(no_plate_model), y)
    assert terms.log_lik.shape == (4, 1)


def test_unknown_data_plate_and_no_observed_site():
    y = jnp.ones(3)
    guide = AutoDelta(two_site_model)
    with pytest.raises(ValueError, match="data_plate='nope' is not a plate"):
        _terms(two_site_model, guide, y, jnp.ones((3, 3)), data_plate="nope")

    def prior_only():
        numpyro.sample("theta", dist.Normal(0.0, 1.0))

    guide = AutoDelta(prior_only)
    with pytest.raises(ValueError, match="no observed site"):
        _terms(prior_only, guide)


@pytest.mark.slow
def test_simulated_observations_and_pmf_shapes():
    y1 = jnp.arange(5.0)
    y2 = jnp.ones((5, 3))
    guide = AutoNormal(two_site_model)
    terms = _terms(two_site_model, guide, y1, y2, requests=(LOG_LIK, LIKELIHOOD))
    y_sim, y_obs = simulations(terms)
    assert y_sim.shape == (4, 5, 4)
    np.testing.assert_allclose(y_obs, terms.y_obs)
    np.testing.assert_allclose(terms.y_obs, jnp.concatenate([y1[:, None], y2], 1))

    def bern_model(y):
        p = numpyro.sample("p", dist.Beta(2.0, 2.0))
        with numpyro.plate("data", y.shape[0]):
            numpyro.sample("y", dist.Bernoulli(p), obs=y)

    y = jnp.array([0.0, 1.0, 1.0])
    guide = AutoDelta(bern_model)
    terms = _terms(bern_model, guide, y, requests=(LOG_LIK, LIKELIHOOD))
    pmf, support = support_pmf(terms)
    assert pmf.shape == (4, 2, 3, 1)  # (M, K, b, c)
    assert support.shape == (2, 3, 1)
    np.testing.assert_allclose(pmf.sum(1), 1.0, rtol=1e-6)
    # the pmf at the observed value is the likelihood
    picked = jnp.take_along_axis(pmf[..., 0], y.astype(int)[None, None, :], 1)
    np.testing.assert_allclose(jnp.log(picked[:, 0]), terms.log_lik, rtol=1e-6)


def test_log_q_fixed_has_value_of_log_q_and_score_function_gradient():
    y = jnp.arange(3.0)

    def guide(y):
        loc = numpyro.param("loc", 0.5)
        scale = numpyro.param("scale", 0.7, constraint=dist.constraints.positive)
        numpyro.sample("theta", dist.Normal(loc, scale))

    def model(y):
        theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", 3):
            numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)

    def f(params):
        t = run_particles(
            random.PRNGKey(0),
            params,
            model,
            guide,
            (y,),
            {},
            num_particles=5,
            vectorize_particles_fn=_vmap,
            requests=(LOG_Q_FIXED,),
        )
        return t.log_q_fixed, t.log_q

    params = {"loc": 0.5, "scale": 0.7}
    fixed, log_q = f(params)
    np.testing.assert_allclose(fixed, log_q, rtol=1e-6)
    # d/dloc of log N(theta; loc, s) at fixed theta is (theta - loc) / s^2, and the
    # draws theta are recovered from log q: mean of jac over particles checks it
    jac = jax.jacobian(lambda p: f(p)[0])(params)["loc"]
    theta_minus_loc_sq = (
        -2 * 0.7**2 * (log_q + jnp.log(0.7) + 0.5 * jnp.log(2 * jnp.pi))
    )
    np.testing.assert_allclose(
        jnp.abs(jac) * 0.7**2, jnp.sqrt(theta_minus_loc_sq), rtol=1e-4
    )


@pytest.mark.numerics
def test_log_mean_exp_is_stable():
    x = jnp.array([[-jnp.inf, 0.0], [-jnp.inf, 1000.0], [-jnp.inf, -1000.0]])
    out = log_mean_exp(x, axis=0)
    assert out[0] == -jnp.inf
    np.testing.assert_allclose(out[1], 1000.0 - jnp.log(3.0), rtol=1e-6)


@pytest.mark.parametrize("m", [1, 2, 7, 8, 9, 64])
def test_particle_reductions_match_jax_reductions(m):
    # particle_sum is a contraction and particle_logsumexp shifts by a
    # maximum over the particles; both must equal the plain reductions, with
    # gradients, including weights and +-inf entries.
    x = random.normal(random.PRNGKey(m), (m, 3, 5)) * 30.0
    w = random.uniform(random.PRNGKey(m + 1), (m,))
    np.testing.assert_allclose(particle_sum(x), x.sum(0), rtol=1e-6, atol=1e-4)
    np.testing.assert_allclose(
        particle_sum(x, w), jnp.tensordot(w, x, 1), rtol=1e-6, atol=1e-4
    )
    np.testing.assert_allclose(particle_sum(x, x), (x * x).sum(0), rtol=1e-6, atol=1e-3)
    want, want_grad = jax.value_and_grad(lambda x: jax.nn.logsumexp(x, axis=0).sum())(x)
    got, grad = jax.value_and_grad(lambda x: particle_logsumexp(x).sum())(x)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-7)
    edge = x.at[:, 0, 0].set(-jnp.inf).at[-1, 1, 1].set(jnp.inf)
    np.testing.assert_allclose(
        particle_logsumexp(edge), jax.nn.logsumexp(edge, axis=0), rtol=1e-6
    )


def test_spec_protocol_and_iid_terms():
    from numpyro_pvi._trace.particles import ParticleSpec
    from numpyro_pvi.guides import AutoGaussianMixture
    from numpyro_pvi.particles import StratifiedGuide, require_iid

    with pytest.raises(ValueError, match="Unknown particle requests"):
        ParticleSpec(4, ("log_likelihood",))
    assert isinstance(AutoGaussianMixture(lambda: None, 3), StratifiedGuide)
    assert not isinstance(AutoNormal(lambda: None), StratifiedGuide)

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", y.shape[0]):
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    y = jnp.arange(5.0)
    guide = AutoNormal(model)
    params = guide_params(guide, model, y)
    t = run_particles(
        random.PRNGKey(0), params, model, guide, (y,), {}, num_particles=4
    )
    # i.i.d. draws: one stratum, weight 1/M in every predictive and expectation
    assert t.num_strata == 1
    np.testing.assert_allclose(
        np.exp(t.weights.log_predictive), np.full((4, 5), 0.25), rtol=1e-6
    )
    np.testing.assert_allclose(t.weights.particle, np.full(4, 0.25), rtol=1e-6)
    require_iid(t, "test")  # does not raise
    with pytest.raises(NotImplementedError, match="2 strata"):
        require_iid(t._replace(num_strata=2), "test")


# -- the request table: each request fills exactly its fields ---------------


def _normal_model(y):
    theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)


def _lognormal_model(y):
    theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.LogNormal(theta, 1.0), obs=y + 0.5)


def _normal_mixture_model(y):
    theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        comp = dist.Normal(jnp.stack([theta, -theta]), 1.0)
        numpyro.sample(
            "y",
            dist.MixtureSameFamily(dist.Categorical(jnp.array([0.3, 0.7])), comp),
            obs=y,
        )


def _zero_inflated_poisson_model(y):
    # (a Poisson site leaves y_gate None)
    theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.ZeroInflatedPoisson(0.2, jnp.exp(theta)), obs=y)


def _bernoulli_model(y):
    theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=theta), obs=y)


def _binomial_model(y):
    theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Binomial(3, logits=theta), obs=y)


@pytest.mark.parametrize("request_name", sorted(FIELDS))
def test_each_request_fills_exactly_the_fields_of_the_table(request_name):
    """``FIELDS`` is the protocol: a request fills its fields and no other
    optional field (``mask``, ``entropy`` and ``observation_sites`` are
    every call's)."""
    y = jnp.array([0.0, 1.0, 1.0, 0.0])
    model = _normal_model
    terms = _terms(
        model, AutoNormal(model), y, num_particles=2, requests=(request_name,)
    )
    optional = set(ParticleTerms._field_defaults) - {
        "mask",
        "entropy",
        "observation_sites",
    }
    filled = {f for f in optional if getattr(terms, f) is not None}
    if terms.weights.observation is not None:
        filled.add("weights.observation")
    assert filled == set(FIELDS[request_name])


@pytest.mark.parametrize(
    "model",
    [
        _normal_model,
        _lognormal_model,
        _normal_mixture_model,
        _zero_inflated_poisson_model,
        _bernoulli_model,
        _binomial_model,
    ],
)
def test_the_likelihood_holds_each_particles_distribution(model):
    """The ``likelihood`` request is family-free: each particle's observed
    distribution, whose log density at the observations is ``log_lik``."""
    y = jnp.array([0.0, 1.0, 1.0, 0.0])
    terms = _terms(
        model, AutoNormal(model), y, num_particles=2, requests=(LOG_LIK, LIKELIHOOD)
    )
    (site,) = terms.likelihood.sites()
    law = terms.likelihood.laws[0]
    log_lik = jax.vmap(lambda d, v: d.log_prob(v))(
        law, site["value"][None].repeat(2, 0)
    )
    np.testing.assert_allclose(log_lik, terms.log_lik, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "model, filled",
    [
        (_normal_model, False),  # no finite support
        (_zero_inflated_poisson_model, False),  # an infinite one
        (_bernoulli_model, True),
        (_binomial_model, True),
    ],
)
def test_the_pmf_covers_only_a_finite_support(model, filled):
    """The pmf over a finite support sums to one; other likelihoods are
    refused, naming the support."""
    y = jnp.array([0.0, 1.0, 1.0, 0.0])
    terms = _terms(model, AutoNormal(model), y, num_particles=2, requests=(LIKELIHOOD,))
    if filled:  # (M, V, b, c): each value at each observation
        pmf, _ = support_pmf(terms)
        assert pmf.shape[0] == 2 and pmf.shape[2:] == (4, 1)
        np.testing.assert_allclose(pmf.sum(1), 1.0, rtol=1e-6)
    else:
        with pytest.raises(ValueError, match="no finite support to enumerate"):
            support_pmf(terms)


def test_the_per_particle_fields_are_the_tables_less_the_shared_ones():
    """Held-out subsampling and mixtures of two fits' draws
    (``evaluation.held_out``) concatenate or take every field with a
    particle axis: the request table's fields less those read once for all
    particles (a field missing there was silently left out of a mixture's
    strata); the likelihood takes its own particles."""
    from numpyro_pvi.evaluation import held_out

    shared = {"y_obs", "weights.observation", "observed", "likelihood"}
    per_particle = {f for fields in FIELDS.values() for f in fields} - shared
    assert set(held_out._PER_PARTICLE) == per_particle | {"log_prior", "log_q"}


def _factor_guide(y):
    loc = numpyro.param("loc", 0.3)
    numpyro.sample("theta", dist.Delta(loc))
    numpyro.factor("correction", 2.0 * loc - 0.7)


def _one_site_model(y):
    theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)


def test_a_factor_of_the_guide_is_part_of_its_log_density():
    """A guide's factor (``numpyro.factor``, an observed site of the guide)
    is a term of its log density, as ``Trace_ELBO`` counts it: with a
    deterministic guide and one particle the log score's objective is the
    negative ELBO exactly, factor included."""
    from numpyro.infer import Trace_ELBO

    from numpyro_pvi import PredictiveELBO

    y = jnp.array([0.5, -1.0, 2.0])
    params = {"loc": jnp.array(0.3)}
    key = random.PRNGKey(0)
    elbo = Trace_ELBO().loss(key, params, _one_site_model, _factor_guide, y)
    pvi = PredictiveELBO("log", num_particles=1).loss(
        key, params, _one_site_model, _factor_guide, y
    )
    np.testing.assert_allclose(pvi, elbo, rtol=1e-6)
    terms = _terms(_one_site_model, _factor_guide, y, num_particles=2)
    np.testing.assert_allclose(terms.log_q, [2.0 * 0.3 - 0.7] * 2, rtol=1e-6)


def test_the_log_density_of_autodais_includes_its_kinetic_energy_factor():
    """``AutoDAIS`` draws through a factor (its kinetic-energy term): each
    particle's ``log_q`` is NumPyro's log density of the guide at that draw,
    every site summed."""
    from numpyro.infer.autoguide import AutoDAIS
    from numpyro.infer.util import log_density

    from numpyro_pvi._trace.particles import _particle_keys, split_particle_key

    y = jnp.array([0.5, -1.0, 2.0, 1.5])
    guide = AutoDAIS(_one_site_model, K=3, eta_init=0.05)
    params = guide_params(guide, _one_site_model, y)
    params = {**params, "auto_eta0": jnp.array(0.2)}  # a transport that moves
    key = random.PRNGKey(0)
    terms = run_particles(
        key, params, _one_site_model, guide, (y,), {}, num_particles=3
    )
    _, draws_key = split_particle_key(key)
    expected, factors = [], []
    for k in random.split(draws_key, 3):
        seeded = numpyro.handlers.seed(guide, _particle_keys(k)[1])
        total, tr = log_density(seeded, (y,), {}, params)
        expected.append(total)
        factors.append(tr["auto_factor"]["fn"].log_factor)
    assert np.min(np.abs(factors)) > 1e-4  # the factor is not zero here
    np.testing.assert_allclose(terms.log_q, expected, rtol=1e-5, atol=1e-6)
