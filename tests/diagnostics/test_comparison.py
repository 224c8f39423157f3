"""Comparing fits in ArviZ points the way held-out data do.

- ``az.compare(cv.to_elpd())`` ranks a VI and a PVI fit of a misspecified
  model as new data from the same source rank them (both ArviZ generations);
- an export made with a predictive objective cannot be fed to PSIS-LOO;
- ``psis(..., loss=)`` reads k̂ for the objective; k̂ carries its Monte Carlo
  standard error (checked against the spread of k̂ over replications) and
  borderline draws are extended until the verdict is settled or says so.
"""

import arviz as az
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax import random
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from numpyro_pvi import FitRecipe, PACmELBO, PredictiveELBO, predictive_score
from numpyro_pvi.diagnostics import (
    approximate_loo,
    pareto_smooth,
    psis,
    psis_summary,
    report,
    to_inference_data,
)
from numpyro_pvi.selection import cross_validate
from tests.arviz_generation import group_names

pytestmark = pytest.mark.py312


def location_model(y):
    """The model says y ~ N(theta, 1)."""
    theta = numpyro.sample("theta", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)


def _data(n, seed, sd=3.0):
    """Data with sd 3: the model's unit noise is misspecified."""
    y = sd * np.random.default_rng(seed).standard_normal(n)
    return jnp.asarray(y, jnp.result_type(float))


CANDIDATES = {
    "VI": Trace_ELBO(num_particles=8),
    "PVI": PredictiveELBO("log", num_particles=8),
}


@pytest.fixture(scope="module")
def fits():
    y = _data(40, 0)
    out = {}
    for label, loss in CANDIDATES.items():
        guide = AutoNormal(location_model)
        svi = SVI(location_model, guide, optax.adam(0.05), loss=loss)
        result = svi.run(random.PRNGKey(1), 800, y, progress_bar=False)
        out[label] = (guide, result.params, loss)
    return y, out


@pytest.mark.slow
def test_az_compare_of_cross_validation_ranks_as_new_data_do(fits):
    y, fitted = fits
    y_new = _data(2000, 1)
    held_out = {
        label: float(
            np.mean(
                predictive_score(
                    random.PRNGKey(2), params, location_model, guide, y_new
                )
            )
        )
        for label, (guide, params, _) in fitted.items()
    }
    cv = cross_validate(
        random.PRNGKey(3),
        location_model,
        AutoNormal(location_model),
        optax.adam(0.05),
        y,
        fit=FitRecipe(num_steps=800, num_draws=256, progress_bar=False),
        candidates=CANDIDATES,
        num_folds=4,
    )
    elpd = cv.to_elpd()
    table = az.compare(elpd)
    ranked = list(table.index)
    assert ranked == sorted(held_out, key=held_out.get, reverse=True)
    assert ranked[0] == "PVI"  # the predictive fit widens to the data's spread
    # the difference is significant on the held-out scale: beyond twice its se
    assert abs(table["elpd_diff"].iloc[1]) > 2 * table["dse"].iloc[1]
    # each ELPD is the sum of the pointwise held-out log scores
    for label, result in elpd.items():
        pointwise = cv.scores["pointwise"].sel(candidate=label).values
        value = float(result.elpd if hasattr(result, "elpd") else result.elpd_loo)
        assert value == pytest.approx(float(pointwise.sum()), rel=1e-6)


def test_a_predictive_export_cannot_be_read_as_psis_loo(fits):
    y, fitted = fits
    guide, params, loss = fitted["PVI"]
    data = to_inference_data(
        random.PRNGKey(4), params, location_model, guide, y, loss=loss, num_draws=200
    )
    groups = group_names(data)
    assert "log_likelihood" not in groups
    assert {"posterior", "pointwise_log_likelihood", "observed_data"} <= groups
    assert data.attrs["objective"] == "PredictiveELBO"
    assert data.attrs["targets_posterior"] == "false"
    with pytest.raises(TypeError, match="log likelihood not found"):
        az.loo(data)
    with pytest.raises(ValueError, match=r"to_elpd\(\)"):
        approximate_loo(data)
    guide, params, loss = fitted["VI"]
    data = to_inference_data(
        random.PRNGKey(4), params, location_model, guide, y, loss=loss, num_draws=200
    )
    assert "log_likelihood" in group_names(data)
    assert data.attrs["targets_posterior"] == "true"
    with pytest.raises(TypeError, match="targets_posterior"):
        to_inference_data(
            random.PRNGKey(4), params, location_model, guide, y, loss=object()
        )


def test_psis_verdict_reads_the_objective(fits):
    """The PVI fit is far wider than the posterior: PSIS reweights it well
    (small k̂), but it is not a posterior to use as is."""
    y, fitted = fits
    guide, params, loss = fitted["PVI"]
    for objective in (loss, PACmELBO(num_particles=4)):
        table = psis_summary(
            psis(random.PRNGKey(5), params, location_model, guide, y, loss=objective)
        )
        assert table.attrs["verdict"].startswith("not a posterior fit"), table.attrs
        assert "held-out" in table.attrs["verdict"]
    bayesian = psis_summary(
        psis(random.PRNGKey(5), params, location_model, guide, y, loss=Trace_ELBO())
    )
    unspecified = psis_summary(
        psis(random.PRNGKey(5), params, location_model, guide, y)
    )
    assert bayesian.attrs["verdict"] == unspecified.attrs["verdict"]
    assert not bayesian.attrs["verdict"].startswith("not a posterior")
    # the plain sd is far above the PSIS sd (the posterior's 1/sqrt(40))
    assert bayesian.loc["theta", "vi_sd"] > 3 * bayesian.loc["theta", "psis_sd"]


def _gpd_log_ratios(k, n, rng):
    """log of generalized Pareto draws with shape k (scale 1)."""
    u = rng.uniform(size=n)
    return np.log((u ** (-k) - 1) / k)


@pytest.mark.parametrize("k", [0.3, 0.6])
def test_pareto_k_se_is_the_spread_of_k_hat(k):
    """Over 300 replications of 2000 ratios with a known tail shape the
    standard deviation of k̂ equals the reported standard error (to the
    Monte Carlo error of a standard deviation from 300 values, ~4%)."""
    rng = np.random.default_rng(0)
    fits = [pareto_smooth(_gpd_log_ratios(k, 2000, rng)) for _ in range(300)]
    ks = np.array([f.pareto_k for f in fits])
    se = np.mean([f.pareto_k_se for f in fits])
    # ArviZ's fit shrinks k̂ toward 0.5 (a weak prior): a small bias
    assert abs(ks.mean() - k) < 0.05
    assert ks.std(ddof=1) == pytest.approx(se, rel=0.2)


def conjugate(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def _narrow_guide(scale):
    """The exact posterior's mean with ``scale`` times its sd."""

    def guide(y):
        post_var = 1 / (1 / 100 + y.shape[0])
        loc = post_var * jnp.sum(y)
        numpyro.sample("mu", dist.Normal(loc, scale * jnp.sqrt(post_var)))

    return guide


@pytest.mark.parametrize("scale", [0.7, 1.3])
def test_psis_draws_until_the_verdict_is_settled(scale):
    """In 1D a guide ``scale`` times the posterior's sd has k̂ = 1 - scale²:
    0.51 (borderline at 0.5: more ratios are drawn, the interval shrinks) or
    negative (settled at once)."""
    y = _data(20, 2, sd=1.0)
    result = psis(
        random.PRNGKey(6), {}, conjugate, _narrow_guide(scale), y,
        num_draws=1000, max_draws=16_000,
    )  # fmt: skip
    g = result["psis"]
    k, se = float(g["pareto_k"]), float(g["pareto_k_se"])
    total = int(g["num_ratio_draws"])
    verdict = psis_summary(result).attrs["verdict"]
    assert (f"± {se:.2f}" in verdict) == (se > 0)
    borderline = any(abs(k - t) <= 1.96 * se for t in (0.5, float(g["good_k"])))
    assert ("Borderline" in verdict) == borderline
    if scale > 1:
        assert total == 1000 and not borderline
    else:
        assert total > 1000  # 1000 ratios leave 0.5 inside the interval
        assert borderline == (total == 16_000) or not borderline
        assert abs(k - (1 - scale**2)) < 3 * se
    # the stored draws stay num_draws; their weights are normalised
    weight = np.exp(np.asarray(result["sample_stats"]["log_weight"].values))
    assert weight.size == 1000 and weight.sum() == pytest.approx(1.0, rel=1e-6)


def test_report_caps_the_minimum_sample_size():
    y = _data(20, 2, sd=1.0)
    result = report(
        random.PRNGKey(7), {}, conjugate, _narrow_guide(0.2), y,
        num_draws=1000, show=False,
    )  # fmt: skip
    assert "not reachable" in result.attrs["report"]
    assert "e+" not in result.attrs["report"].split("minimum sample size")[1][:40]
