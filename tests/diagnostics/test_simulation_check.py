"""The procedures on simulated data sets refuse a model whose distributions
read the data argument: each data set is simulated by the model given the
original data, and each fit is given the simulated data set.

Before, VSBC ran on such models and reported an exact fit miscalibrated: a
prior ``Normal(y.mean(), 0.1 * y.std())`` with ``AutoNormal`` (exact for
the Normal posterior), 40 replications of 500 steps, gave a spread ratio of
3.27 and 19 of 40 ranks extreme.
"""

import warnings

import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax import random
from numpyro.contrib.control_flow import scan
from numpyro.infer import Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from numpyro_pvi import Replications, diagnostics

Y = jnp.asarray([0.3, -1.2, 0.8, 2.1, -0.4, 1.1, 0.2, -0.7])
PROCEDURES = [diagnostics.vsbc, diagnostics.predictive_calibration]


def centred_on_the_data(y):
    mu = numpyro.sample("mu", dist.Normal(jnp.mean(y), 0.1 * jnp.std(y)))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def constants_as_arguments(y, prior_loc, prior_scale):
    """The remedy: the prior's constants computed once, arguments of their own."""
    mu = numpyro.sample("mu", dist.Normal(prior_loc, prior_scale))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def lagged(y):
    """An AR(1) likelihood of the lagged data argument."""
    phi = numpyro.sample("phi", dist.Normal(0.0, 0.5))
    previous = jnp.concatenate([jnp.zeros(1), y[:-1]])
    with numpyro.plate("time", y.shape[0]):
        numpyro.sample("y", dist.Normal(phi * previous, 1.0), obs=y)


def lagged_by_scan(y):
    """The remedy: the lag carried through the sampled values."""
    phi = numpyro.sample("phi", dist.Normal(0.0, 0.5))

    def step(previous, y_t):
        return numpyro.sample("y", dist.Normal(phi * previous, 1.0), obs=y_t), None

    scan(step, jnp.zeros(()), y)


def run(function, model, *args, **options):
    replications = Replications(
        num_simulations=2, num_svi_steps=2, num_draws=10, progress_bar=False,
        **options,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # few draws
        return function(
            random.PRNGKey(0), model, AutoNormal(model), optax.adam(0.01),
            Trace_ELBO(), *args, replications=replications,
        )  # fmt: skip


@pytest.mark.parametrize("function", PROCEDURES)
@pytest.mark.parametrize(
    "model, site, remedy, remedy_args",
    [
        (
            centred_on_the_data,
            "mu",
            constants_as_arguments,
            (Y, Y.mean(), 0.1 * Y.std()),
        ),
        (lagged, "y", lagged_by_scan, (Y,)),
    ],
)
def test_a_distribution_that_reads_the_data_argument_is_refused(
    function, model, site, remedy, remedy_args
):
    with pytest.raises(ValueError, match=f"the site '{site}' reads the data") as err:
        run(function, model, Y)
    message = str(err.value)
    assert message.startswith(function.__name__)
    assert "an exact fit would look miscalibrated" in message
    assert ("data_generator" in message) == (function is not diagnostics.vsbc)
    # the remedies it names run: the model rewritten ...
    assert run(function, remedy, *remedy_args) is not None
    # ... or each fit given the arguments its data set was simulated with
    same = lambda data, *args, **kwargs: (args, kwargs)  # noqa: E731
    assert run(function, model, Y, simulated_data_to_args=same) is not None
    if function is diagnostics.predictive_calibration:  # ... or data of one's own
        own = lambda key: {"y": random.normal(key, Y.shape)}  # noqa: E731
        assert run(function, model, Y, data_generator=own) is not None


def invalid_at_every_draw(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(jnp.log(-jnp.abs(mu) - 1.0), 1.0), obs=y)


@pytest.mark.parametrize("function", PROCEDURES)
def test_a_guide_whose_set_up_fails_is_named_with_the_stage(function):
    """NumPyro's autoguide set-up runs the model with its argument checks on:
    a model whose numerics fail at the prior draws raised NumPyro's bare
    "Normal distribution got invalid loc parameter." from inside it."""
    with pytest.raises(ValueError, match="set-up on the first simulated") as err:
        run(function, invalid_at_every_draw, Y)
    assert "invalid loc parameter" in str(err.value)
    assert str(err.value).startswith(function.__name__)


def dropout(x, y=None):
    """A network's dropout: a key of the model's own (numpyro.prng_key)."""
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    keep = random.bernoulli(numpyro.prng_key(), 0.8, (x.shape[0], 3))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(jnp.sum(x[:, None] * w * keep, -1), 1.0), obs=y)


@pytest.mark.parametrize("function", PROCEDURES)
def test_a_model_that_draws_its_own_keys_is_compared_at_the_same_keys(function):
    """The comparison runs the model twice with every sample site given, so
    the same keys reach numpyro.prng_key: a dropout mask drawn with other
    keys made the likelihood differ, and the model was refused."""
    x = jnp.linspace(-1.0, 1.0, 8)
    replications = Replications(
        num_simulations=2, num_svi_steps=2, num_draws=10, progress_bar=False
    )
    result = function(
        random.PRNGKey(0), dropout, AutoNormal(dropout), optax.adam(0.01),
        Trace_ELBO(), x, y=2.0 * x, replications=replications,
    )  # fmt: skip
    assert result is not None
