"""PSIS resampling: on a conjugate model whose guide is too narrow and off
centre, the resampled draws are closer to the exact posterior than the
guide's; refusals and warnings."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer.autoguide import AutoNormal

from numpyro_pvi import PredictiveELBO
from numpyro_pvi.diagnostics import get_group, psis_resample
from numpyro_pvi.diagnostics.resample import resample_indices

N, PRIOR_SD = 20, 10.0
Y = 1.5 + jax.random.normal(jax.random.PRNGKey(0), (N,))
# the exact posterior of theta: y_i ~ N(theta, 1), theta ~ N(0, PRIOR_SD^2)
POST_VAR = 1.0 / (1.0 / PRIOR_SD**2 + N)
POST_MEAN = POST_VAR * float(jnp.sum(Y))
POST_SD = POST_VAR**0.5


def model(y=None):
    theta = numpyro.sample("theta", dist.Normal(0.0, PRIOR_SD))
    with numpyro.plate("data", N):
        numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)


def _guide(shift, scale):
    """An AutoNormal set by hand: its mean ``shift`` posterior sds off, its
    sd ``scale`` times the posterior's."""
    guide = AutoNormal(model)
    numpyro.handlers.seed(guide, 0)(Y)
    params = {
        "theta_auto_loc": jnp.asarray(POST_MEAN + shift * POST_SD),
        "theta_auto_scale": jnp.asarray(scale * POST_SD),
    }
    return guide, params


@pytest.mark.py312
def test_resampled_draws_are_closer_to_the_exact_posterior_than_the_guide():
    guide, params = _guide(shift=0.4, scale=0.8)
    out = psis_resample(
        jax.random.PRNGKey(1),
        params,
        model,
        guide,
        Y,
        num_draws=4000,
        num_proposals=8000,
    )
    k = float(get_group(out, "psis")["pareto_k"])
    assert k < 0.7
    theta = np.asarray(get_group(out, "posterior")["theta"]).ravel()
    ess = float(get_group(out, "psis")["ess_is"])
    # Monte Carlo error of the mean: the weights' ESS and the resampling's
    se = POST_SD * np.sqrt(1.0 / ess + 1.0 / theta.size)
    assert abs(theta.mean() - POST_MEAN) < 4 * se
    assert abs(theta.mean() - POST_MEAN) < 0.4 * POST_SD  # the guide's error
    # the sd: the guide's is 0.8; the resampled one's error is a few se
    assert abs(theta.std() / POST_SD - 1.0) < 4 * np.sqrt(1.0 / (2 * ess)) + 0.02
    assert abs(theta.std() / POST_SD - 1.0) < 0.2
    # the importance-weighted posterior predictive: mean theta, sd sqrt(1 + s^2)
    y_rep = np.asarray(get_group(out, "posterior_predictive")["y"])
    assert y_rep.shape == (1, 4000, N)
    assert abs(y_rep.mean() - POST_MEAN) < 4 * np.sqrt(1 + POST_VAR) / np.sqrt(ess)


def test_without_replacement_every_draw_is_distinct():
    guide, params = _guide(shift=0.0, scale=0.9)
    out = psis_resample(
        jax.random.PRNGKey(2),
        params,
        model,
        guide,
        Y,
        num_draws=500,
        num_proposals=2000,
        replace=False,
    )
    assert int(get_group(out, "psis")["num_distinct"]) == 500


def test_refused_for_objectives_that_do_not_target_the_posterior():
    guide, params = _guide(shift=0.0, scale=1.0)
    with pytest.raises(ValueError, match="does not target the Bayesian posterior"):
        psis_resample(
            jax.random.PRNGKey(3), params, model, guide, Y, loss=PredictiveELBO()
        )


def test_warns_when_the_weights_are_unreliable():
    guide, params = _guide(shift=3.0, scale=0.2)
    with pytest.warns(UserWarning, match="not below good_k"):
        psis_resample(
            jax.random.PRNGKey(4),
            params,
            model,
            guide,
            Y,
            num_draws=100,
            num_proposals=1000,
        )


def test_resample_indices_follow_the_weights():
    with np.errstate(divide="ignore"):
        log_w = np.log(np.array([0.0, 0.25, 0.75]))
        idx = resample_indices(log_w, 20_000, replace=True, seed=0)
    counts = np.bincount(idx, minlength=3) / idx.size
    np.testing.assert_allclose(
        counts, [0.0, 0.25, 0.75], atol=4 * np.sqrt(0.19 / 20_000)
    )
    with pytest.raises(ValueError, match="non-zero weight"):
        resample_indices(log_w, 3, replace=False, seed=0)
