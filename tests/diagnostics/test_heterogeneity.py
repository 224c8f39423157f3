"""heterogeneity reads spread only where the predictive score identifies it."""

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from numpyro_pvi import PredictiveELBO, diagnostics
from numpyro_pvi._trace.structure import single_draw_outcome
from numpyro_pvi.diagnostics.heterogeneity import NOT_IDENTIFIED, _readings
from tests.arviz_generation import group
from tests.score_helpers import gp_model, initial_params

N, D = 400, 6
X = jax.random.normal(jax.random.PRNGKey(0), (N, D))
# x3 is a null predictor; the true logit has a term x0² the model omits
TRUE_LOGIT = 0.3 + X @ jnp.array([1.0, -1.0, 0.5, 0.0, 0.8, 0.4]) + X[:, 0] ** 2
Y = dist.Bernoulli(logits=TRUE_LOGIT).sample(jax.random.PRNGKey(1))


def logistic(X, y=None, *, binomial=False):
    alpha = numpyro.sample("alpha", dist.Normal(0.0, 2.5))
    beta = numpyro.sample("beta", dist.Normal(0.0, 2.5).expand([D]).to_event(1))
    with numpyro.plate("data", X.shape[0]):
        logits = alpha + X @ beta
        fn = (
            dist.Binomial(1, logits=logits)
            if binomial
            else dist.Bernoulli(logits=logits)
        )
        numpyro.sample("y", fn, obs=y)


def _fit(loss, **kwargs):
    guide = AutoNormal(logistic)
    svi = SVI(logistic, guide, optax.adam(0.02), loss)
    result = svi.run(jax.random.PRNGKey(2), 1500, X, Y, progress_bar=False, **kwargs)
    return guide, result.params


@pytest.mark.parametrize(
    "binomial",
    [
        pytest.param(False, marks=[pytest.mark.py312, pytest.mark.slow]),
        pytest.param(True, marks=pytest.mark.slow),
    ],
)
@pytest.mark.optimized  # run time dominates (benchmarks/RESULTS.md)
def test_binary_logistic_regression_flags_nothing_and_says_why(binomial):
    """A new user's case: PVI-Log leaves coefficients near their prior sd
    (the null predictor among them) because a binary outcome's predictive
    sees only E_q[σ(η)]; the sd ratio would flag them. The reading says the
    spread is not identified, and flags none."""
    vi_guide, vi_params = _fit(Trace_ELBO(), binomial=binomial)
    pvi_guide, pvi_params = _fit(
        PredictiveELBO("log", num_particles=16), binomial=binomial
    )
    result = diagnostics.heterogeneity(
        jax.random.PRNGKey(3),
        pvi_params,
        logistic,
        pvi_guide,
        X,
        Y,
        reference_params=vi_params,
        reference_guide=vi_guide,
        binomial=binomial,
    )
    ds = group(result, "heterogeneity")
    # the sd ratio alone would flag several coefficients
    assert int((ds["ratio"].values > ds.attrs["threshold"]).sum()) >= 2
    assert not ds["flagged"].values.any()
    assert set(ds["reading"].values) == {NOT_IDENTIFIED}
    assert ds.attrs["identified"] == 0
    assert "single binary or categorical outcome (y)" in ds.attrs["identification"]
    np.testing.assert_allclose(ds["prior_sd"].values, 2.5, rtol=0.1)
    ax = diagnostics.plot_heterogeneity(result)
    assert "not identified" in ax.get_title()
    plt.close("all")


def test_readings_of_identified_models():
    ratio = np.array([20.0, 20.0, 2.0, 2.0])
    prior_ratio = np.array([0.1, 0.9, 0.1, 0.9])
    readings = _readings(ratio, prior_ratio, 5.0, binary_only=False)
    assert list(readings) == ["heterogeneous", NOT_IDENTIFIED, "ok", "ok"]
    binary = _readings(ratio, prior_ratio, 5.0, binary_only=True)
    assert set(binary) == {NOT_IDENTIFIED}


@pytest.mark.parametrize(
    "fn, expected",
    [
        (dist.Bernoulli(logits=jnp.zeros(3)), True),
        (dist.Bernoulli(probs=0.3).expand([4]).to_event(1), True),
        (dist.Categorical(logits=jnp.zeros((3, 4))).mask(False), True),
        (dist.Binomial(1, probs=0.2), True),
        (dist.Binomial(20, probs=0.2), False),
        (dist.Poisson(2.0), False),
        (dist.Normal(0.0, 1.0), False),
    ],
)
def test_single_draw_outcomes(fn, expected):
    assert single_draw_outcome(fn) == expected


def _hierarchical(y):
    # the group effects' prior scale is the model's own parameter
    tau = numpyro.param("tau", 1.0, constraint=dist.constraints.positive)
    with numpyro.plate("groups", y.shape[0]):
        z = numpyro.sample("z", dist.Normal(0.0, tau))
        numpyro.sample("y", dist.Normal(z, 1.0), obs=y)


def test_prior_sd_reads_the_models_own_parameters():
    # the prior at the fitted tau = 5 (the reference's), not the initial 1
    y = jnp.array([-6.0, 2.0, 7.0, -3.0])
    guide = AutoNormal(_hierarchical)
    params = {
        "tau": jnp.asarray(5.0),
        "z_auto_loc": y * 25.0 / 26.0,
        "z_auto_scale": jnp.full(4, 0.98),
    }
    result = diagnostics.heterogeneity(
        jax.random.PRNGKey(0),
        params,
        _hierarchical,
        guide,
        y,
        reference_params=params,
        num_draws=4000,
    )
    prior_sd = np.asarray(group(result, "heterogeneity")["prior_sd"])
    np.testing.assert_allclose(prior_sd, 5.0, rtol=0.06)


def test_vague_priors_whose_draws_invalidate_the_likelihood():
    """NumPyro's ``examples/gp.py``: at a draw of its ``LogNormal(0, 10)``
    priors the kernel matrix is not positive definite, and NumPyro's
    ``MultivariateNormal`` refuses it when the model runs at that draw; the
    prior sd needs the latent draws only, which are the prior's whatever the
    likelihood makes of them."""
    x = jnp.linspace(-1.0, 1.0, 25)
    y = jnp.sin(3.0 * x)
    guide, params = initial_params(gp_model, x, y)
    result = diagnostics.heterogeneity(
        jax.random.PRNGKey(1), params, gp_model, guide, x, y, reference_params=params
    )
    data = group(result, "heterogeneity")
    # the LogNormal(0, 10) prior spreads over many orders of magnitude
    assert np.all(np.asarray(data["prior_sd"]) > 1e3)
    assert list(np.asarray(data["reading"])) == ["ok"] * 3
