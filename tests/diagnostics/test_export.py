"""Export of a fitted guide to ArviZ's container; PVI heterogeneity detection."""

import math

import arviz as az
import jax.numpy as jnp
import matplotlib
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax import random
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal
from scipy import stats

from numpyro_pvi import PredictiveELBO
from numpyro_pvi.diagnostics import (
    approximate_loo_weights,
    heterogeneity,
    plot_heterogeneity,
    psis_resample,
    to_inference_data,
)
from tests.arviz_generation import (
    ARVIZ_1,
    CONTAINER,
    assert_same_groups,
    elpd,
    group,
    group_names,
    netcdf_round_trip,
)

matplotlib.use("Agg")

pytestmark = pytest.mark.py312

# conjugate normal model: y_i ~ N(mu, SIGMA^2), mu ~ N(0, TAU0^2)
Y = np.array([1.2, 0.3, -0.4, 2.1, 0.8, 1.5, -0.2, 0.9, 1.1, 0.4, 0.0, 4.5])
SIGMA, TAU0 = 1.0, 2.0


def _posterior(y):
    var = 1 / (1 / TAU0**2 + len(y) / SIGMA**2)
    return var * y.sum() / SIGMA**2, var


def conjugate_model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, TAU0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, SIGMA), obs=y)


def exact_guide(y):
    mean, var = _posterior(Y)
    numpyro.sample("mu", dist.Normal(mean, math.sqrt(var)))


@pytest.fixture(scope="module")
def exported():
    return to_inference_data(
        random.PRNGKey(0),
        {},
        conjugate_model,
        exact_guide,
        jnp.asarray(Y),
        num_draws=4000,
    )


def test_layout_and_pointwise_log_likelihood(exported):
    idata = exported
    assert isinstance(idata, CONTAINER)
    assert group_names(idata) == {
        "posterior",
        "log_likelihood",
        "sample_stats",
        "observed_data",
        "posterior_predictive",  # no constant_data: the model's one input is y
    }
    assert idata.log_likelihood["y"].dims == ("chain", "draw", "data")
    sizes = dict(group(idata, "log_likelihood").sizes)
    assert sizes == {"chain": 1, "draw": 4000, "data": 12}
    np.testing.assert_allclose(idata.observed_data["y"].values, Y, rtol=1e-6)
    assert idata.observed_data["y"].dims == ("data",)
    mu = idata.posterior["mu"].values.reshape(-1).astype(float)
    np.testing.assert_allclose(
        idata.log_likelihood["y"].values.reshape(4000, 12),
        stats.norm(mu[:, None], SIGMA).logpdf(Y),
        rtol=1e-5,
        atol=1e-5,
    )
    assert idata.attrs["guide"] == "exact_guide"
    # lp and log_q of the same draws, for the approximation-corrected LOO
    lp = stats.norm(0.0, TAU0).logpdf(mu) + stats.norm(mu[:, None], SIGMA).logpdf(
        Y
    ).sum(axis=1)
    mean, var = _posterior(Y)
    log_q = stats.norm(mean, math.sqrt(var)).logpdf(mu)
    for name, expected in (("lp", lp), ("log_q", log_q)):
        values = idata.sample_stats[name]
        assert values.dims == ("chain", "draw") and values.dtype == np.float64
        np.testing.assert_allclose(
            values.values.reshape(-1), expected, rtol=1e-5, atol=1e-6
        )


def test_loo_matches_exact_leave_one_out(exported):
    loo = az.loo(exported, pointwise=True)
    exact = 0.0
    for i in range(len(Y)):
        rest = np.delete(Y, i)
        mean, var = _posterior(rest)
        exact += stats.norm(mean, math.sqrt(var + SIGMA**2)).logpdf(Y[i])
    # Monte Carlo error of the importance sampling estimate of each
    # log p(y_i | y_-i) = -log E_post[1 / p(y_i | mu)] (delta method)
    log_lik = exported.log_likelihood["y"].values.reshape(-1, len(Y)).astype(float)
    num = log_lik.shape[0]
    inv = np.exp(-log_lik - (-log_lik).max(axis=0))
    rel_var = inv.var(axis=0) / inv.mean(axis=0) ** 2 / num
    mc_se = math.sqrt(rel_var.sum())
    assert abs(elpd(loo) - exact) < 5 * mc_se + 1e-3
    assert mc_se < 0.1  # the check is sharp
    # all observations but the outlier are well within PSIS's range
    assert np.all(loo.pareto_k.values[:-1] < 0.5)


def _shifted_guide(y):
    mean, var = _posterior(Y)
    numpyro.sample("mu", dist.Normal(mean + 1.5 * math.sqrt(var), math.sqrt(var)))


def test_arviz_functions_run(exported):
    import matplotlib.pyplot as plt

    shifted = to_inference_data(
        random.PRNGKey(1), {}, conjugate_model, _shifted_guide, Y, num_draws=4000
    )
    table = az.compare({"shifted": shifted, "exact": exported})
    assert list(table.index) == ["exact", "shifted"]
    assert np.all(np.isfinite(az.ess(exported)["mu"].values))
    summary = az.summary(exported)
    assert "mu" in summary.index[0]
    if ARVIZ_1:  # arviz-plots
        plot = az.plot_dist(exported)
        assert plot.viz is not None
    else:
        assert np.isfinite(az.waic(exported).elpd_waic)  # WAIC left ArviZ 1.0
        assert np.size(az.plot_posterior(exported)) == 1
    plt.close("all")


def test_posterior_predictive_is_the_model_simulated_at_each_draw(exported):
    y_rep = group(exported, "posterior_predictive")["y"]
    assert y_rep.dims == ("chain", "draw", "data")
    mu = exported.posterior["mu"].values.reshape(-1)
    residual = y_rep.values.reshape(4000, 12) - mu[:, None]
    # y_rep - mu ~ N(0, SIGMA^2) independently of mu: mean 0, sd SIGMA
    assert abs(residual.mean()) < 4 * SIGMA / np.sqrt(residual.size)
    assert abs(residual.std() / SIGMA - 1) < 4 / np.sqrt(2 * residual.size)
    assert abs(np.corrcoef(residual[:, 0], mu)[0, 1]) < 4 / np.sqrt(4000)


def _regression(x, y=None):
    b = numpyro.sample("b", dist.Normal(0.0, 2.0))
    with numpyro.plate("obs", x.shape[0]):
        numpyro.sample("y", dist.Normal(b * x, 0.5), obs=y)


def test_constant_data_and_predictions_at_new_inputs():
    x = jnp.linspace(-1.0, 1.0, 20)
    y = 0.8 * x + 0.5 * random.normal(random.PRNGKey(0), (20,))
    guide = AutoNormal(_regression)
    params = (
        SVI(_regression, guide, optax.adam(0.05), Trace_ELBO())
        .run(random.PRNGKey(1), 500, x, y, progress_bar=False)
        .params
    )
    x_new = jnp.array([-3.0, 0.0, 3.0])
    idata = to_inference_data(
        random.PRNGKey(2),
        params,
        _regression,
        guide,
        x,
        y,
        num_draws=2000,
        predictions={"x": x_new},
    )
    assert {"constant_data", "predictions", "predictions_constant_data"} <= (
        group_names(idata)
    )
    np.testing.assert_allclose(group(idata, "constant_data")["x"], x)
    assert group(idata, "constant_data")["x"].dims == ("obs",)
    np.testing.assert_allclose(group(idata, "predictions_constant_data")["x"], x_new)
    pred = group(idata, "predictions")["y"]
    assert pred.sizes["draw"] == 2000 and pred.shape[-1] == 3
    b = idata.posterior["b"].values.reshape(-1)
    expected = b.mean() * np.asarray(x_new)
    sd = np.sqrt(b.var() * np.asarray(x_new) ** 2 + 0.25)
    np.testing.assert_array_less(
        np.abs(pred.values.reshape(2000, 3).mean(0) - expected), 4 * sd / np.sqrt(2000)
    )
    with pytest.raises(ValueError, match="not arguments of the model"):
        to_inference_data(
            random.PRNGKey(2),
            params,
            _regression,
            guide,
            x,
            y,
            num_draws=10,
            predictions={"z": x_new},
        )


def test_arviz_predictive_checks_run_on_the_export(exported):
    import matplotlib.pyplot as plt

    if ARVIZ_1:
        import arviz_plots
        import arviz_stats

        pit = arviz_stats.loo_pit(exported)
        values = np.asarray(pit["y"])
        assert values.shape == (12,) and np.all((values >= 0) & (values <= 1))
        plot = arviz_plots.plot_ppc_pit(exported)
        assert plot.viz is not None
    else:
        assert np.size(az.plot_ppc(exported, num_pp_samples=50)) >= 1
        pit = az.loo_pit(exported, y="y")
        assert pit.shape == (12,) and np.all((pit >= 0) & (pit <= 1))
    plt.close("all")


def _off_guide(y):
    """Half a posterior sd off centre and 0.8 times too narrow."""
    mean, var = _posterior(Y)
    sd = math.sqrt(var)
    numpyro.sample("mu", dist.Normal(mean + 0.5 * sd, 0.8 * sd))


def _loo_pit(data, weights=None):
    if ARVIZ_1:
        import arviz_stats

        if weights is None:
            return np.asarray(arviz_stats.loo_pit(data)["y"])
        log_weights, pareto_k = weights
        pit = arviz_stats.loo_pit(data, log_weights=log_weights, pareto_k=pareto_k)
        return np.asarray(pit["y"])
    if weights is None:
        return np.asarray(az.loo_pit(data, y="y"))
    stacked = weights[0]["y"].stack(__sample__=("chain", "draw"))
    return np.asarray(az.loo_pit(data, y="y", log_weights=stacked))


def test_corrected_loo_pit_of_an_off_guide_matches_the_exact_loo_pit():
    """The exact LOO-PIT of the conjugate model, Φ((y_i - m_-i) / s_-i),
    against ArviZ's loo_pit of the draws of a guide 0.5 sd off and 0.8 times
    too narrow: with the package's corrected weights within Monte Carlo
    error of it, without them (the draws taken as the posterior's) off."""
    data = to_inference_data(
        random.PRNGKey(2), {}, conjugate_model, _off_guide, Y, num_draws=4000
    )
    exact = np.array(
        [
            stats.norm(m, math.sqrt(v + SIGMA**2)).cdf(Y[i])
            for i, (m, v) in enumerate(_posterior(np.delete(Y, i)) for i in range(12))
        ]
    )
    log_weights, pareto_k = approximate_loo_weights(data)
    assert log_weights["y"].dims == ("chain", "draw", "data")
    assert pareto_k["y"].dims == ("data",)
    # every observation but the outlier (y = 4.5) within PSIS's range
    reliable = pareto_k["y"].values < 0.7
    assert np.all(reliable[:-1])
    corrected = _loo_pit(data, (log_weights, pareto_k))[reliable]
    plain = _loo_pit(data)[reliable]
    exact = exact[reliable]
    # the Monte Carlo error of a self-normalised importance-sampling estimate
    # of a probability p: sqrt(p (1 - p) / ESS), ESS = 1 / Σ w² per observation
    w = np.exp(log_weights["y"].values.reshape(-1, 12)[:, reliable])
    se = np.sqrt(exact * (1 - exact) / (1 / np.sum(w**2, axis=0)))
    assert np.all(np.abs(corrected - exact) < 4 * se), (corrected - exact, se)
    assert np.mean(np.abs(plain - exact)) > 2 * np.mean(np.abs(corrected - exact))


def test_several_observed_sites_form_one_observation(tmp_path):
    y1, y2 = jnp.array([0.1, -0.3, 0.8]), jnp.array([0.5, 0.2, 1.9])

    def model(y1, y2):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with numpyro.plate("unit", 3):
            numpyro.sample("a", dist.Normal(mu, 1.0), obs=y1)
            numpyro.sample("b", dist.Normal(2 * mu, 0.5), obs=y2)

    def guide(y1, y2):
        numpyro.sample("mu", dist.Normal(0.3, 0.2))

    idata = to_inference_data(random.PRNGKey(1), {}, model, guide, y1, y2, num_draws=50)
    mu = idata.posterior["mu"].values.reshape(-1, 1).astype(float)
    expected = stats.norm(mu, 1.0).logpdf(np.asarray(y1)) + stats.norm(
        2 * mu, 0.5
    ).logpdf(np.asarray(y2))
    np.testing.assert_allclose(
        idata.log_likelihood["a__b"].values.reshape(50, 3), expected, rtol=1e-5
    )
    assert set(idata.observed_data.data_vars) == {"a", "b"}
    assert idata.observed_data["b"].dims == ("unit",)
    # netCDF round trip
    back = netcdf_round_trip(idata, str(tmp_path / "export.nc"))
    assert_same_groups(idata, back)
    assert back.attrs["guide"] == "guide"


def test_export_bad_input():
    def subsampled(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, TAU0))
        with numpyro.plate("data", y.shape[0], subsample_size=4) as idx:
            numpyro.sample("y", dist.Normal(mu, SIGMA), obs=y[idx])

    with pytest.raises(ValueError, match="'data' is subsampled"):
        to_inference_data(
            random.PRNGKey(0), {}, subsampled, exact_guide, jnp.asarray(Y)
        )
    with pytest.raises(ValueError, match="num_draws"):
        to_inference_data(
            random.PRNGKey(0), {}, conjugate_model, exact_guide, Y, num_draws=0
        )
    predictive = to_inference_data(
        random.PRNGKey(0),
        {},
        conjugate_model,
        exact_guide,
        Y,
        num_draws=20,
        loss=PredictiveELBO(),
    )
    with pytest.raises(ValueError, match="does not target the Bayesian posterior"):
        approximate_loo_weights(predictive)
    exported = to_inference_data(
        random.PRNGKey(0), {}, conjugate_model, exact_guide, Y, num_draws=20
    )
    with pytest.raises(ValueError, match=r"\['z'\] are not log_likelihood"):
        approximate_loo_weights(exported, var_names="z")
    with pytest.raises(TypeError, match="to_inference_data"):
        approximate_loo_weights(group(exported, "posterior"))


# --------------------------------------------------------------------------
# heterogeneity (Lai & Yao 2024, sections 2.5 and 4.1, small synthetic version):
# the coefficient of x_1 varies across observations, the model treats it as
# fixed; PVI keeps its posterior wide, VI concentrates it.
# --------------------------------------------------------------------------


def regression(x, y=None):
    alpha = numpyro.sample("alpha", dist.Normal(0.0, 5.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 5.0).expand([2]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(alpha + x @ beta, sigma), obs=y)


@pytest.fixture(scope="module")
def heterogeneity_result():
    rng = np.random.default_rng(1)
    n = 100
    x = rng.normal(size=(n, 2))
    varying = 1.0 + 1.5 * rng.normal(size=n)
    y = 0.5 + 1.0 * x[:, 0] + varying * x[:, 1] + 0.5 * rng.normal(size=n)
    x, y = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)
    guide = AutoNormal(regression)  # one guide, two sets of parameters
    params = {}
    for name, loss in [("pvi", PredictiveELBO(num_particles=8)), ("vi", Trace_ELBO())]:
        svi = SVI(regression, guide, numpyro.optim.Adam(0.05), loss)
        params[name] = svi.run(random.PRNGKey(0), 600, x, y, progress_bar=False).params
    return heterogeneity(
        random.PRNGKey(2),
        params["pvi"],
        regression,
        guide,
        x,
        y,
        reference_params=params["vi"],
        num_draws=1000,
    )


@pytest.mark.slow
def test_heterogeneity_flags_the_varying_coefficient(heterogeneity_result):
    assert isinstance(heterogeneity_result, CONTAINER)
    assert group_names(heterogeneity_result) == {"heterogeneity"}
    ds = group(heterogeneity_result, "heterogeneity")
    assert list(ds["parameter"].values) == ["alpha", "beta[0]", "beta[1]", "sigma"]
    flagged = list(ds["parameter"].values[ds["flagged"].values])
    assert flagged == ["beta[1]"]
    np.testing.assert_allclose(ds["ratio"], ds["pvi_sd"] / ds["vi_sd"])
    # PVI's spread of the varying coefficient approaches its population sd 1.5
    assert 0.7 < float(ds["pvi_sd"].sel(parameter="beta[1]")) < 2.5


def test_plot_heterogeneity(heterogeneity_result):
    import matplotlib.pyplot as plt

    ax = plot_heterogeneity(heterogeneity_result)
    assert len(ax.patches) == 4
    colors = [patch.get_facecolor() for patch in ax.patches]
    red = matplotlib.colors.to_rgba("tab:red")
    assert sum(np.allclose(c, red) for c in colors) == 1
    assert len(ax.lines) == 2  # ratio 1 and the threshold
    plt.close("all")


def test_heterogeneity_bad_input():
    guide = AutoNormal(regression)
    with pytest.raises(ValueError, match="threshold must be finite and in"):
        heterogeneity(
            random.PRNGKey(0),
            {},
            regression,
            guide,
            None,
            reference_params={},
            threshold=0.5,
        )


def _own_parameter(x, y=None):
    # a location the model owns (numpyro.param), a latent scale
    mu = numpyro.param("mu", 0.5)
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    with numpyro.plate("obs", x.shape[0]):
        numpyro.sample("y", dist.Normal(mu + 0.0 * x, s), obs=y)


def test_predictive_groups_read_the_models_own_parameters():
    # the model's numpyro.param at its fitted value (10), not its initial one
    # (0.5): posterior predictive, predictions and psis_resample's draws
    x = jnp.zeros(20)
    y = 10.0 + 0.1 * random.normal(random.PRNGKey(0), (20,))
    guide = AutoNormal(_own_parameter)
    params = {"mu": jnp.asarray(10.0), "s_auto_loc": jnp.asarray(-2.3)}
    params["s_auto_scale"] = jnp.asarray(0.1)
    fit = (params, _own_parameter, guide, x, y)
    idata = to_inference_data(random.PRNGKey(1), *fit, predictions={"x": jnp.zeros(3)})
    for name in ("posterior_predictive", "predictions"):
        np.testing.assert_allclose(group(idata, name)["y"].mean(), 10.0, atol=0.05)
    resampled = psis_resample(random.PRNGKey(2), *fit)
    resampled_y = group(resampled, "posterior_predictive")["y"]
    np.testing.assert_allclose(resampled_y.mean(), 10.0, atol=0.05)


def test_a_model_without_latent_sites_is_exported():
    # maximum likelihood (every parameter a numpyro.param, an empty guide):
    # no posterior group; the predictive and log-likelihood at the parameters
    y = jnp.array([1.0, 2.0, 4.0])

    def model(y):
        mu = numpyro.param("mu", 0.5)
        with numpyro.plate("obs", y.shape[0]):
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    idata = to_inference_data(
        random.PRNGKey(0), {"mu": jnp.asarray(2.0)}, model, lambda y: None, y
    )
    assert {"posterior_predictive", "log_likelihood"} <= group_names(idata)
    np.testing.assert_allclose(
        group(idata, "log_likelihood")["y"].values[0, 0],
        stats.norm.logpdf(np.asarray(y), 2.0),
        rtol=1e-5,
    )
    simulated = group(idata, "posterior_predictive")["y"]
    np.testing.assert_allclose(simulated.mean(), 2.0, atol=0.1)
