"""A likelihood whose distribution has a smaller batch shape than the values
it observes: ``numpyro.sample("y", dist.Normal(mu, sigma), obs=y)`` with
scalar parameters and a vector ``y``, in no plate (the first model of many
tutorials). NumPyro broadcasts the log density to the values; a simulation
of the site must draw one value per observed value too."""

import warnings

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax import random
from numpyro.infer import Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from numpyro_pvi import PredictiveELBO, Replications, predictive_score
from numpyro_pvi.diagnostics import (
    predictive_calibration,
    psis_resample,
    to_inference_data,
    vsbc,
)
from tests.arviz_generation import group

pytestmark = pytest.mark.py312

N = 40
Y = jnp.asarray(np.random.default_rng(0).normal(3.0, 2.0, size=N), jnp.float32)


def scalar_law(y=None):
    """As users write it: the parameters are scalars, the data a vector."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))
    numpyro.sample("obs", dist.Normal(mu, sigma), obs=y)


def expanded_law(y=None):
    """The same likelihood with its batch shape written out."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))
    numpyro.sample("obs", dist.Normal(mu, sigma).expand([N]), obs=y)


def guide(y=None):
    numpyro.sample("mu", dist.Normal(3.0, 0.3))
    numpyro.sample("sigma", dist.LogNormal(jnp.log(2.0), 0.1))


def test_posterior_predictive_draws_every_observed_value():
    """``to_inference_data`` raised KeyError 'obs_dim_0' (the simulation drew
    one value); now its draws equal those of the expanded likelihood, one
    independent value per observation."""
    key = random.PRNGKey(0)
    idata = to_inference_data(key, {}, scalar_law, guide, y=Y, num_draws=400)
    reference = to_inference_data(key, {}, expanded_law, guide, y=Y, num_draws=400)
    draws = np.asarray(group(idata, "posterior_predictive")["obs"])
    assert draws.shape == (1, 400, N)
    np.testing.assert_array_equal(
        draws, np.asarray(group(reference, "posterior_predictive")["obs"])
    )
    flat = draws.reshape(400, N)
    assert np.std(flat[:, 0] - flat[:, 1]) > 1.0  # not one value broadcast
    resampled = psis_resample(key, {}, scalar_law, guide, y=Y, num_draws=400)
    assert np.shape(group(resampled, "posterior_predictive")["obs"])[-1] == N


def column_law(y=None):
    """Two means, a (12, 2) matrix of values in no plate: the observations
    are the columns (the rightmost batch dimension), each of 12 values."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def column_law_expanded(y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    numpyro.sample("y", dist.Normal(mu, 1.0).expand([12, 2]), obs=y)


def column_guide(y=None):
    numpyro.sample("mu", dist.Normal(jnp.array([0.2, -0.1]), 0.3).to_event(1))


YM = jnp.asarray(np.random.default_rng(1).normal(size=(12, 2)), jnp.float32)


def test_energy_score_of_an_observation_of_independent_values():
    """Each column's 12 values are independent given ``mu``: the energy
    score drew one value per column and broadcast it (-2.46 against the
    right -2.18 at column 0, 4000 draws, standard error 0.01); now it,
    and the objective, equal those of the expanded likelihood."""
    key = random.PRNGKey(1)
    scores = [
        predictive_score(
            key, {}, m, column_guide, y=YM, score="energy", num_draws=500, data_plate=-1
        ).score
        for m in (column_law, column_law_expanded)
    ]
    np.testing.assert_array_equal(scores[0], scores[1])
    losses = [
        PredictiveELBO("energy", num_particles=8, data_plate=-1).loss(
            key, {}, m, column_guide, y=YM
        )
        for m in (column_law, column_law_expanded)
    ]
    np.testing.assert_array_equal(losses[0], losses[1])


def test_a_matrix_in_no_plate_says_which_dimension_it_takes():
    key = random.PRNGKey(2)
    with pytest.warns(
        UserWarning, match=r"'y' \(batch shape \(12, 2\)\).*data_plate=-2"
    ):
        predictive_score(key, {}, column_law, column_guide, y=YM)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert predictive_score(
            key, {}, column_law, column_guide, y=YM, data_plate=-1
        ).score.shape == (2,)
    rows = predictive_score(key, {}, column_law, column_guide, y=YM, data_plate=-2)
    assert rows.score.shape == (12,)
    # a vector of values in no plate is the usual case: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        predictive_score(key, {}, scalar_law, guide, y=Y)


@pytest.mark.parametrize("procedure", [vsbc, predictive_calibration])
def test_simulated_data_sets_have_the_observed_shape(procedure):
    """The procedures that fit simulated data sets drew one value each (a
    scalar ``obs``): every replication fitted one observation, not N."""
    shapes = []

    def to_args(data, y=None):
        shapes.append(np.shape(data["obs"]))
        return (), {"y": data["obs"]}

    replications = Replications(
        num_simulations=2, num_svi_steps=5, num_draws=10, simulated_data_to_args=to_args
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # few draws and steps
        procedure(
            random.PRNGKey(3),
            scalar_law,
            AutoNormal(scalar_law),
            optax.adam(0.01),
            Trace_ELBO(),
            y=Y,
            replications=replications,
        )
    assert shapes and all(shape == (N,) for shape in shapes)


def _two_lengths(categories, words):
    """NumPyro's semi-supervised HMM example in small: two observed sites of
    different lengths in no plate (transitions and emissions) and a factor."""
    transition = numpyro.sample("transition", dist.Dirichlet(jnp.ones((3, 3))))
    emission = numpyro.sample("emission", dist.Dirichlet(jnp.ones((3, 4))))
    numpyro.sample(
        "next", dist.Categorical(transition[categories[:-1]]), obs=categories[1:]
    )
    numpyro.sample("words", dist.Categorical(emission[categories]), obs=words)
    numpyro.factor("unsupervised", jnp.log(emission[0, 1]))


def _point(categories, words):
    """A point mass at fixed transition and emission probabilities."""
    transition = jnp.array([[0.5, 0.3, 0.2], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]])
    numpyro.sample("transition", dist.Delta(transition, event_dim=1))
    numpyro.sample("emission", dist.Delta(jnp.full((3, 4), 0.25), event_dim=1))


def test_sites_of_different_lengths_in_no_plate_take_the_whole_data():
    """No batch dimension indexes observations of both sites: refused, with
    data_plate=WHOLE_DATA as remedy, which scores the data as one
    observation (with a point mass, the total log-likelihood)."""
    from numpyro.infer.util import log_likelihood

    from numpyro_pvi.particles import WHOLE_DATA

    data = jnp.array([0, 1, 2, 2, 1]), jnp.array([3, 0, 1, 1, 2])
    key = random.PRNGKey(1)
    with pytest.raises(ValueError, match="differ in the size.*WHOLE_DATA"):
        predictive_score(key, {}, _two_lengths, _point, *data)
    out = predictive_score(
        key, {}, _two_lengths, _point, *data, data_plate=WHOLE_DATA, num_draws=8
    )
    draws = numpyro.infer.util.Predictive(_point, num_samples=1)(key, *data)
    terms = log_likelihood(_two_lengths, draws, *data)
    total = sum(float(jnp.sum(v)) for v in terms.values())
    np.testing.assert_allclose(np.asarray(out.score), [total], rtol=1e-5)


def delta_observed(x):
    """NumPyro's autoguide test of an observed Delta: its sampler returns
    the Python float it was given."""
    numpyro.sample("x", dist.Delta(3.0), obs=x)
    numpyro.sample("y", dist.Normal())


@pytest.mark.parametrize("score", ["crps", "energy"])
def test_an_observed_delta_of_a_python_float_is_simulated(score):
    """Known answer: the point mass at the observed value scores 0 in every
    score, so the loss is the regularizer alone, the log score's."""
    guide = AutoNormal(delta_observed)
    params = {"y_auto_loc": jnp.asarray(0.5), "y_auto_scale": jnp.asarray(0.8)}
    key = random.PRNGKey(0)
    log = PredictiveELBO("log").loss(key, params, delta_observed, guide, 3.0)
    got = PredictiveELBO(score).loss(key, params, delta_observed, guide, 3.0)
    np.testing.assert_allclose(got, log, rtol=1e-6)
    scores = predictive_score(key, params, delta_observed, guide, 3.0, score=score)
    np.testing.assert_array_equal(scores.score, 0.0)
