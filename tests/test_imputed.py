"""Observed sites with imputed entries (NumPyro's Bayesian-imputation idiom:
missing values filled by a latent site and the result observed): the data
entries are scored, the imputed ones are a term of the joint density.

Known answer: every objective's loss and gradient equal those of the same
model written with the split explicit (the observed site masked to the data,
the imputed entries' density a ``numpyro.factor`` outside the data plate).
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax import random
from numpyro.infer.autoguide import AutoNormal

from numpyro_pvi import PACmELBO, PredictiveELBO, diagnostics, predictive_score
from numpyro_pvi.guides import AutoGaussianMixture
from numpyro_pvi.scores import EnergyScore

N, MISSING = 12, np.array([2, 5, 9])


def _data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(N).astype(np.float32)
    y = (0.5 + x + 0.3 * rng.standard_normal(N)).astype(np.float32)
    x[MISSING] = np.nan
    return x, y


def imputing(x, y=None):
    """As NumPyro's notebook writes it, in a plate, with a second site (when
    ``y`` is given)."""
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    b = numpyro.sample("b", dist.Normal(0, 1))
    missing = np.nonzero(np.isnan(x))[0]
    x_impute = numpyro.sample("x_impute", dist.Normal(mu, 1).expand([3]).mask(False))
    x = jnp.asarray(x).at[missing].set(x_impute)
    with numpyro.plate("data", N):
        numpyro.sample("x", dist.Normal(mu, 1.0), obs=x)
        if y is not None:
            numpyro.sample("y", dist.Normal(b * x, 0.5), obs=y)


def explicit(x, y=None):
    """The same joint density with the split written out."""
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    b = numpyro.sample("b", dist.Normal(0, 1))
    missing = np.nonzero(np.isnan(x))[0]
    x_impute = numpyro.sample("x_impute", dist.Normal(mu, 1).expand([3]).mask(False))
    numpyro.factor("x_imputed", dist.Normal(mu, 1.0).log_prob(x_impute).sum())
    observed = ~np.isnan(x)
    data = jnp.asarray(np.nan_to_num(x))
    filled = data.at[missing].set(x_impute)
    with numpyro.plate("data", N):
        numpyro.sample("x", dist.Normal(mu, 1.0).mask(observed), obs=data)
        if y is not None:
            numpyro.sample("y", dist.Normal(b * filled, 0.5), obs=y)


def imputing_traced(x, y):
    """The imputation with JAX operations only (the missing entries known to
    the model): programs that can take its arguments traced try that
    first."""
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    b = numpyro.sample("b", dist.Normal(0, 1))
    x_impute = numpyro.sample("x_impute", dist.Normal(mu, 1).expand([3]).mask(False))
    x = jnp.asarray(x).at[MISSING].set(x_impute)
    with numpyro.plate("data", N):
        numpyro.sample("x", dist.Normal(mu, 1.0), obs=x)
        numpyro.sample("y", dist.Normal(b * x, 0.5), obs=y)


def _fitted(shift=0.0, make_guide=AutoNormal):
    """The data, a guide of the imputing model and its initial parameters
    moved by ``shift`` (the explicit model has the same latents, so the same
    guide serves both)."""
    x, y = _data()
    guide = make_guide(imputing)
    tr = numpyro.handlers.trace(numpyro.handlers.seed(guide, 1)).get_trace(x, y)
    params = {k: v["value"] + shift for k, v in tr.items() if v["type"] == "param"}
    return x, y, guide, params


#: The objectives compared; "crps" on the model of x alone (one scalar site),
#: "mixture_log" with a mixture guide (strata of draws).
OBJECTIVES = {
    "log": lambda: PredictiveELBO("log", num_particles=4),
    "crps": lambda: PredictiveELBO("crps", num_particles=4),
    "mixture_log": lambda: PredictiveELBO("log", num_particles=3),
    "energy": lambda: PredictiveELBO(EnergyScore(), num_particles=4),
    "pacm": lambda: PACmELBO(num_particles=4),
}


@pytest.mark.parametrize("label", OBJECTIVES)
def test_imputed_entries_are_prior_terms_and_the_data_are_scored(label):
    mixture = label.startswith("mixture")
    make_guide = partial(AutoGaussianMixture, num_components=2) if mixture else None
    shift = 0.0 if mixture else 0.1  # the mixture's parameters are constrained
    x, y, guide, params = _fitted(shift, make_guide=make_guide or AutoNormal)
    y = None if label == "crps" else y  # the CRPS: one scalar site
    loss = OBJECTIVES[label]()

    def value(model, p):
        return loss.loss(random.PRNGKey(0), p, model, guide, x, y)

    assert np.isfinite(value(imputing, params))
    np.testing.assert_allclose(
        value(imputing, params), value(explicit, params), rtol=1e-5
    )
    grads = [jax.grad(lambda p, m=m: value(m, p))(params) for m in (imputing, explicit)]
    for name in params:
        np.testing.assert_allclose(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model", [imputing, imputing_traced])
def test_predictive_score_reads_the_imputed_rows_data_only(model):
    """Moment matching of far observations included (it re-runs the model);
    ``imputing_traced``'s programs try its arguments traced, then take them
    as constants."""
    x, y, guide, params = _fitted()
    key = random.PRNGKey(3)
    got, want = (
        predictive_score(key, params, m, guide, x, y, num_draws=64)
        for m in (model, explicit)
    )
    np.testing.assert_allclose(got.score, want.score, rtol=1e-5)


@pytest.mark.py312  # the containers
def test_to_inference_data_holds_the_data_and_their_log_likelihood():
    x, y, guide, params = _fitted()
    key = random.PRNGKey(4)
    got, want = (
        diagnostics.to_inference_data(key, params, m, guide, x, y, num_draws=8)
        for m in (imputing, explicit)
    )
    log_lik = [diagnostics.get_group(d, "log_likelihood") for d in (got, want)]
    np.testing.assert_allclose(
        log_lik[0]["x__y"].values, log_lik[1]["x__y"].values, rtol=1e-5
    )
    observed = diagnostics.get_group(got, "observed_data")["x"].values
    np.testing.assert_array_equal(np.isnan(observed), np.isnan(x))


def residual(y):
    """A residual observed: every entry computed from the latents."""
    mu = numpyro.sample("mu", dist.Normal(0, 1))
    with numpyro.plate("data", N):
        numpyro.sample("r", dist.Normal(0, 1), obs=y - mu)


def partly_imputed_row(Y):
    """One of a row's two values imputed: the event is not split."""
    mu = numpyro.sample("mu", dist.Normal(0, 1).expand([2]).to_event(1))
    imp = numpyro.sample("imp", dist.Normal(0, 1).mask(False))
    filled = jnp.asarray(Y).at[3, 0].set(imp)
    with numpyro.plate("data", N):
        numpyro.sample("Y", dist.MultivariateNormal(mu, jnp.eye(2)), obs=filled)


@pytest.mark.parametrize(
    "model, data, site",
    [
        (residual, np.zeros(N, np.float32), "r"),
        (partly_imputed_row, np.zeros((N, 2), np.float32), "Y"),
    ],
)
def test_values_computed_from_the_latents_are_still_refused(model, data, site):
    guide = AutoNormal(model)
    with numpyro.handlers.seed(rng_seed=0):
        guide(data)
    with pytest.raises(ValueError, match=f"'{site}' observes a value computed"):
        PredictiveELBO("log", num_particles=2).loss(
            random.PRNGKey(0), {}, model, guide, data
        )


@pytest.mark.py312  # JAX's errors of traced values
def test_a_users_jit_over_the_data_is_refused_with_the_remedies():
    x, y, guide, params = _fitted()
    key = random.PRNGKey(3)
    loss = PredictiveELBO("log", num_particles=2)
    traced = jax.jit(lambda x: loss.loss(key, params, imputing_traced, guide, x, y))
    with pytest.raises(ValueError, match="'x' observes a value") as refusal:
        traced(x)
    assert "concrete arguments" in str(refusal.value)
    assert "obs_mask=" in str(refusal.value)
