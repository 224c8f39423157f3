"""What running the model and guide can raise: an exception without a
message (a bare ``assert``) is re-raised saying where it was raised, and
``AutoSemiDAIS`` (NumPyro's guide for local latents under subsampling, which
keeps the subsample's size) is evaluated on the full data as the subsampled
plate's refusal says: built again with ``subsample_plate=`` and given the
fitted parameters."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax import random
from numpyro import handlers
from numpyro.infer import SVI
from numpyro.infer.autoguide import AutoNormal, AutoSemiDAIS

from numpyro_pvi import PredictiveELBO, diagnostics, predictive_score

pytestmark = pytest.mark.py312

Y = jnp.asarray(np.random.default_rng(0).normal(0.5, 1.5, 8), jnp.float32)


def model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def asserting_guide(y):
    loc = numpyro.param("loc", 0.0)
    if jnp.ndim(y) != 2:  # a bare assert (pytest would give an assert one)
        raise AssertionError
    numpyro.sample("mu", dist.Normal(loc, 1.0))


@pytest.mark.parametrize("where", ["PredictiveELBO", "psis", "predictive_score"])
def test_an_exception_without_a_message_says_where_it_was_raised(where):
    key, params = random.PRNGKey(0), {"loc": jnp.asarray(0.0)}
    run = {
        "PredictiveELBO": lambda: PredictiveELBO("log").loss(
            key, params, model, asserting_guide, Y
        ),
        "psis": lambda: diagnostics.psis(key, params, model, asserting_guide, Y),
        "predictive_score": lambda: predictive_score(
            key, params, model, asserting_guide, Y
        ),
    }[where]
    with pytest.raises(
        ValueError,
        match=rf"{where}: running the guide raised AssertionError with no message, "
        r"at .*test_trace_failures.py:\d+: 'raise AssertionError'",
    ) as info:
        run()
    assert isinstance(info.value.__cause__, AssertionError)


def test_an_exception_with_a_message_is_unchanged():
    def guide(y):
        raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        PredictiveELBO("log").loss(random.PRNGKey(0), {}, model, guide, Y)


def global_model(y, subsample_size=None):
    return numpyro.sample("theta", dist.Normal(0.0, 1.0)), y, subsample_size


def local_model(outputs):
    theta, y, subsample_size = outputs
    with numpyro.plate("data", 8, subsample_size=subsample_size):
        y_batch = numpyro.subsample(y, event_dim=0)
        tau = numpyro.sample("tau", dist.Gamma(5.0, 5.0))
        numpyro.sample("obs", dist.Normal(theta, tau), obs=y_batch)


def semi_model(y, subsample_size=None):
    local_model(global_model(y, subsample_size))


def semi_dais(**kwargs):
    return AutoSemiDAIS(
        semi_model, local_model, AutoNormal(global_model), K=2, **kwargs
    )


def test_auto_semi_dais_on_the_full_data_built_again_with_subsample_plate():
    guide = semi_dais()
    fit = SVI(semi_model, guide, optax.adam(0.01), PredictiveELBO("log")).run(
        random.PRNGKey(0), 100, Y, subsample_size=4, progress_bar=False
    )
    key = random.PRNGKey(1)
    with pytest.raises(ValueError, match="subsample_plate='data'"):
        diagnostics.psis(key, fit.params, semi_model, guide, Y, subsample_size=4)
    # the other remedy of the message, every index substituted, is what this
    # guide cannot take: it keeps the subsample's size
    full = handlers.substitute(semi_model, data={"data": jnp.arange(8)})
    every = handlers.substitute(guide, data={"data": jnp.arange(8)})
    with pytest.raises(ValueError, match="running the guide raised AssertionError"):
        diagnostics.psis(key, fit.params, full, every, Y, subsample_size=4)
    rebuilt = semi_dais(subsample_plate="data")
    k_hat = diagnostics.psis(key, fit.params, semi_model, rebuilt, Y, num_draws=500)
    assert np.isfinite(float(k_hat.psis["pareto_k"]))
    scores = predictive_score(key, fit.params, semi_model, rebuilt, Y).score
    assert scores.shape == (8,) and np.isfinite(scores).all()
