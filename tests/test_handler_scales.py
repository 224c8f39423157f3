"""Handler scales on several observed sites of one data plate, and on a
prior.

The joint density (PSIS's ``lp``, the exported log-likelihood, the posterior
regularizer, the contrastive objectives, the stratified ELBO) applies every
site's own scale exactly as NumPyro does; a per-observation score needs one
weight per observation and refuses sites with different scales, naming them.
The procedures that draw the latents from the prior refuse a prior whose
scale tempers it, naming the site.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax import random
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoDelta, AutoNormal
from numpyro.infer.util import log_density

from numpyro_pvi import (
    PACmELBO,
    PredictiveELBO,
    Replications,
    SoftCVIELBO,
    StratifiedELBO,
    diagnostics,
    predictive_score,
)

N = 6
X = jnp.linspace(-1.0, 1.0, N)
Y1, Y2 = 2.0 * X + 0.3, jnp.full(N, 3.0)
Y3 = jnp.stack([X, -X], axis=-1)


def two_sites(x, y1, y2, s2=5.0):
    t = numpyro.sample("t", dist.Normal(0.0, 1.0))
    with numpyro.plate("N", x.shape[0]):
        numpyro.sample("y1", dist.Normal(t * x, 1.0), obs=y1)
        with numpyro.handlers.scale(scale=s2):
            numpyro.sample("y2", dist.Normal(t, 1.0), obs=y2)


def three_sites(x, y1, y2, y3):
    """Three observed sites with three scales, a vector-valued one, and a
    local latent with a scale of its own."""
    t = numpyro.sample("t", dist.Normal(0.0, 1.0))
    with numpyro.plate("N", x.shape[0]):
        with numpyro.handlers.scale(scale=2.0):
            u = numpyro.sample("u", dist.Normal(0.0, 1.0))
        numpyro.sample("y1", dist.Normal(t * x + u, 1.0), obs=y1)
        with numpyro.handlers.scale(scale=5.0):
            numpyro.sample("y2", dist.Normal(t, 1.0), obs=y2)
        with numpyro.handlers.scale(scale=0.25):
            numpyro.sample(
                "y3", dist.Normal(t * y3, 2.0).to_event(1), obs=jnp.zeros_like(y3)
            )


def shared_scale(x, y1, y2):
    """Both sites of an observation under the same scale: accepted."""
    t = numpyro.sample("t", dist.Normal(0.0, 1.0))
    with numpyro.plate("N", x.shape[0]), numpyro.handlers.scale(scale=3.0):
        numpyro.sample("y1", dist.Normal(t * x, 1.0), obs=y1)
        numpyro.sample("y2", dist.Normal(t, 1.0), obs=y2)


CASES = {
    "two sites": (two_sites, (X, Y1, Y2)),
    "three sites": (three_sites, (X, Y1, Y2, Y3)),
}


def _params(model, guide, args):
    """A guide's parameters away from their initial values (the initial ones
    shifted: no fit needed, and no compilation)."""
    svi = SVI(model, guide, numpyro.optim.Adam(0.05), Trace_ELBO())
    params = svi.get_params(svi.init(random.PRNGKey(0), *args))
    return jax.tree.map(lambda v: v * 0.9 + 0.05, params)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_psis_lp_is_numpyro_log_density(case):
    model, args = CASES[case]
    guide = AutoNormal(model)
    params = _params(model, guide, args)
    idata = diagnostics.psis(
        random.PRNGKey(1), params, model, guide, *args, num_draws=8
    )
    for s in range(8):
        draw = {k: v.values[0, s] for k, v in idata.posterior.items()}
        expected, _ = log_density(model, args, {}, draw)
        np.testing.assert_allclose(
            idata.sample_stats["lp"].values[0, s], expected, rtol=1e-5
        )


@pytest.mark.parametrize("case", sorted(CASES))
def test_exported_log_likelihood_applies_each_scale(case):
    model, args = CASES[case]
    guide = AutoNormal(model)
    params = _params(model, guide, args)
    fit = diagnostics.to_inference_data(
        random.PRNGKey(2), params, model, guide, *args, num_draws=4
    )
    (name,) = fit.log_likelihood.data_vars
    assert fit.log_likelihood[name].dtype == np.float64
    for s in range(4):
        draw = {k: v.values[0, s] for k, v in fit.posterior.items()}
        joint, _ = log_density(model, args, {}, draw)
        prior = sum(
            float(jnp.sum(site["fn"].log_prob(site["value"])) * (site["scale"] or 1))
            for site in numpyro.handlers.trace(
                numpyro.handlers.substitute(numpyro.handlers.seed(model, 0), draw)
            )
            .get_trace(*args)
            .values()
            if site["type"] == "sample" and not site["is_observed"]
        )
        np.testing.assert_allclose(
            fit.log_likelihood[name].values[0, s].sum(), joint - prior, rtol=1e-5
        )
        # lp and log_q of the approximation-corrected LOO: NumPyro's joint
        # density (each site with its own scale) and the guide's density
        np.testing.assert_allclose(
            fit.sample_stats["lp"].values[0, s], joint, rtol=1e-5
        )
        log_q, _ = log_density(guide, args, {}, {**params, **draw})
        np.testing.assert_allclose(
            fit.sample_stats["log_q"].values[0, s], log_q, rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize(
    "loss",
    [
        PredictiveELBO("log", num_particles=4),
        PredictiveELBO("crps", num_particles=4),
        PACmELBO(num_particles=2),
    ],
    ids=repr,
)
@pytest.mark.parametrize("case", sorted(CASES))
def test_score_refuses_different_scales_naming_the_sites(case, loss):
    model, args = CASES[case]
    guide = AutoNormal(model)
    params = _params(model, guide, args)
    with pytest.raises(ValueError, match="different scales") as err:
        loss.loss(random.PRNGKey(0), params, model, guide, *args)
    message = str(err.value)
    assert "'y1'" in message and "'y2'" in message and "5.0" in message


def test_pacm_with_point_mass_equals_trace_elbo_when_accepted():
    """PAC^m (m = 1, β = 1) with AutoDelta is the negative ELBO exactly; with
    one scale per observation the score weights each observation by it."""
    guide = AutoDelta(shared_scale)
    args = (X, Y1, Y2)
    params = _params(shared_scale, guide, args)
    expected = Trace_ELBO().loss(random.PRNGKey(3), params, shared_scale, guide, *args)
    with pytest.warns(UserWarning, match="point mass"):
        got = PACmELBO(num_particles=1, beta=1.0).loss(
            random.PRNGKey(4), params, shared_scale, guide, *args
        )
    np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_joint_density_objectives_match_trace_elbo_with_different_scales(case):
    """The stratified ELBO (i.i.d. draws here) and the posterior regularizer
    use the joint density: with a point mass they equal Trace_ELBO."""
    model, args = CASES[case]
    guide = AutoDelta(model)
    params = _params(model, guide, args)
    expected = Trace_ELBO().loss(random.PRNGKey(3), params, model, guide, *args)
    got = StratifiedELBO().loss(random.PRNGKey(4), params, model, guide, *args)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_posterior_regularizer_is_the_scaled_negative_elbo():
    """loss(λ=2) − loss(λ=1) is the posterior regularizer, the negative ELBO of
    a point mass, with the shared scale applied to every site."""
    guide = AutoDelta(shared_scale)
    args = (X, Y1, Y2)
    params = _params(shared_scale, guide, args)
    expected = Trace_ELBO().loss(random.PRNGKey(3), params, shared_scale, guide, *args)

    def loss(lam):
        return PredictiveELBO(
            "log", num_particles=1, regularizer="posterior", lam=lam
        ).loss(random.PRNGKey(4), params, shared_scale, guide, *args)

    with pytest.warns(UserWarning, match="point mass"):
        np.testing.assert_allclose(loss(2.0) - loss(1.0), expected, rtol=1e-5)


def test_softcvi_log_joint_applies_each_scale():
    """SoftCVI's labels use log p(θ, x): different scales are accepted."""
    model, args = CASES["two sites"]
    guide = AutoNormal(model)
    params = _params(model, guide, args)
    loss = SoftCVIELBO(num_particles=4).loss(
        random.PRNGKey(0), params, model, guide, *args
    )
    assert jnp.isfinite(loss)


def test_held_out_score_ignores_scales():
    """predictive_score applies no weights, so scales do not matter to it."""
    model, args = CASES["two sites"]
    guide = AutoNormal(model)
    params = _params(model, guide, args)
    a = predictive_score(random.PRNGKey(5), params, model, guide, *args, num_draws=50)
    b = predictive_score(
        random.PRNGKey(5), params, model, guide, *args, s2=1.0, num_draws=50
    )
    assert a.score.shape == (N,)
    np.testing.assert_allclose(a.score, b.score, rtol=1e-6)


def subsampled_shared_scale(x, y1, y2, b, s):
    t = numpyro.sample("t", dist.Normal(0.0, 1.0))
    with numpyro.plate("N", x.shape[0], subsample_size=b) as i:
        with numpyro.handlers.scale(scale=s):
            numpyro.sample("y1", dist.Normal(t * x[i], 1.0), obs=y1[i])
            numpyro.sample("y2", dist.Normal(t, 1.0), obs=y2[i])


def test_shared_scale_with_subsampling_is_accepted_under_jit():
    """Under jit (SVI.run) each site's scale is its own product of the handler
    scale and the subsample scale N/b: equal values, different objects."""
    guide = AutoNormal(subsampled_shared_scale)
    svi = SVI(
        subsampled_shared_scale,
        guide,
        numpyro.optim.Adam(0.01),
        PredictiveELBO("log", num_particles=2),
    )
    for s in (3.0, jnp.full(3, 3.0)):
        losses = svi.run(
            random.PRNGKey(0), 3, X, Y1, Y2, 3, s, progress_bar=False
        ).losses
        assert jnp.all(jnp.isfinite(losses))


def test_different_scales_are_refused_under_jit():
    guide = AutoNormal(two_sites)
    svi = SVI(
        two_sites,
        guide,
        numpyro.optim.Adam(0.01),
        PredictiveELBO("log", num_particles=2),
    )
    with pytest.raises(ValueError, match="different scales"):
        svi.run(random.PRNGKey(0), 2, X, Y1, Y2, progress_bar=False)


def test_traced_scales_are_compared_when_the_program_runs():
    """Scales computed from a traced argument cannot be compared at trace time:
    equal ones give the loss with constant scales, different ones NaN."""
    guide = AutoNormal(shared_scale)
    args = (X, Y1, Y2)
    params = _params(shared_scale, guide, args)
    loss = PredictiveELBO("log", num_particles=2)
    key = random.PRNGKey(0)
    constant = loss.loss(key, params, shared_scale, guide, *args)
    traced = jax.jit(
        lambda s: loss.loss(key, params, subsampled_shared_scale, guide, *args, None, s)
    )(jnp.asarray(3.0))
    np.testing.assert_allclose(traced, constant, rtol=1e-5)
    guide2 = AutoNormal(two_sites)
    params2 = _params(two_sites, guide2, args)
    differ = jax.jit(lambda s: loss.loss(key, params2, two_sites, guide2, *args, s))(
        jnp.asarray(5.0)
    )
    assert jnp.isnan(differ)


def tempered_prior(y, s=1.0):
    """The prior's density scaled by ``s`` (consensus Monte Carlo's
    subposteriors write ``with handlers.scale(scale=1 / num_shards)``)."""
    with numpyro.handlers.scale(scale=s):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("N", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


@pytest.mark.parametrize(
    "function", [diagnostics.vsbc, diagnostics.predictive_calibration]
)
def test_procedures_that_draw_the_prior_refuse_a_tempered_prior(function):
    """With the prior's density scaled by 10 (a Normal of standard deviation
    0.32), VSBC drew ``mu`` from Normal(0, 1): an exact guide was reported
    miscalibrated (spread ratio 2.28, 10 of 40 ranks extreme). Now both
    procedures refuse, naming the site; the unscaled prior runs, and so do
    the predictive calibration's data sets of one's own (no prior draws)."""
    tiny = Replications(num_simulations=2, num_svi_steps=2, num_draws=10)

    def run(s, replications=tiny):
        return function(
            random.PRNGKey(0), tempered_prior, AutoNormal(tempered_prior),
            optax.adam(0.01), Trace_ELBO(), X, s=s, replications=replications,
        )  # fmt: skip

    name = function.__name__
    with pytest.raises(ValueError, match=f"{name}: the latent site 'mu' has a handler"):
        run(10.0)
    assert run(1.0) is not None
    if function is diagnostics.predictive_calibration:
        generated = Replications(
            num_simulations=2, num_svi_steps=2, num_draws=10,
            data_generator=lambda key: {"y": random.normal(key, (N,))},
        )  # fmt: skip
        assert run(10.0, generated) is not None
