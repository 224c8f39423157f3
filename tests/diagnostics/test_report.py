"""diagnostics.report: one container and text that agree with the individual
diagnostics on the same key, read for the objective."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from numpyro_pvi import PACmELBO, PredictiveELBO, diagnostics
from numpyro_pvi.diagnostics.report import BINARY_SPREAD
from tests.arviz_generation import CONTAINER, elpd, group, group_names

# ArviZ containers: also run in the Python 3.12 leg (ArviZ 1.x)
pytestmark = pytest.mark.py312

X = jnp.linspace(-1.0, 1.0, 30)
Y = (2.0 * X + 0.3 * jax.random.normal(jax.random.PRNGKey(0), (30,))).at[3].set(5.0)


def regression(x, y=None):
    a = numpyro.sample("a", dist.Normal(0.0, 1.0))
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(a * x, s), obs=y)


def _fit(model, loss, *args):
    guide = AutoNormal(model)
    svi = SVI(model, guide, optax.adam(0.05), loss)
    return guide, svi.run(jax.random.PRNGKey(1), 800, *args, progress_bar=False).params


@pytest.fixture(scope="module")
def vi_fit():
    return _fit(regression, Trace_ELBO(), X, Y)


def test_report_agrees_with_the_individual_diagnostics(vi_fit, capsys):
    guide, params = vi_fit
    key = jax.random.PRNGKey(5)
    result = diagnostics.report(
        key, params, regression, guide, X, Y, loss=Trace_ELBO(), num_draws=2000
    )
    text = capsys.readouterr().out
    assert isinstance(result, CONTAINER)
    assert group_names(result) == {
        "posterior",
        "sample_stats",
        "psis",
        "log_likelihood",
        "observed_data",
        "loo",
        "psis_summary",
    }
    smoothed = diagnostics.psis(key, params, regression, guide, X, Y, num_draws=2000)
    assert group(result, "psis").equals(group(smoothed, "psis"))
    assert group(result, "posterior").equals(group(smoothed, "posterior"))
    k = float(group(smoothed, "psis")["pareto_k"])
    summary = diagnostics.psis_summary(smoothed)
    assert f"PSIS k̂ = {k:.2f}: {summary.attrs['verdict']}" in text
    assert result.attrs["verdict"] == summary.attrs["verdict"]
    table = group(result, "psis_summary").to_dataframe()
    np.testing.assert_allclose(table.loc[summary.index].values, summary.values)
    exported = diagnostics.to_inference_data(
        key, params, regression, guide, X, Y, num_draws=2000
    )
    loo = diagnostics.approximate_loo(exported)
    loo_group = group(result, "loo")
    np.testing.assert_allclose(loo_group.attrs["elpd"], elpd(loo))
    assert f"elpd = {elpd(loo):.1f}" in text
    # the outlier y[3] = 5 is the worst observation, named first
    k_i = loo_group["pareto_k"].values
    assert int(np.argmax(k_i)) == 3
    assert "worst: data[3]" in text
    assert result.attrs["report"] == text.rstrip("\n")
    assert "does not target the Bayesian posterior" not in text


@pytest.mark.slow
@pytest.mark.parametrize(
    "loss", [PredictiveELBO("log", num_particles=8), PACmELBO(num_particles=4)], ids=str
)
def test_predictive_objectives_are_read_as_such(loss):
    guide, params = _fit(regression, loss, X, Y)
    result = diagnostics.report(
        jax.random.PRNGKey(5),
        params,
        regression,
        guide,
        X,
        Y,
        loss=loss,
        num_draws=500,
        show=False,
    )
    text = result.attrs["report"]
    assert f"{type(loss).__name__} does not target the Bayesian posterior" in text
    assert "a large k̂ measures the intended distance" in text
    assert BINARY_SPREAD not in text


def binary(x, y=None):
    b = numpyro.sample("b", dist.Normal(0.0, 2.5))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=b * x), obs=y)


def test_binary_outcomes_say_the_spread_is_not_identified():
    y = (X > 0).astype(jnp.float32)
    loss = PredictiveELBO("log", num_particles=8)
    guide, params = _fit(binary, loss, X, y)
    result = diagnostics.report(
        jax.random.PRNGKey(0),
        params,
        binary,
        guide,
        X,
        y,
        loss=loss,
        num_draws=500,
        show=False,
    )
    assert BINARY_SPREAD in result.attrs["report"]
