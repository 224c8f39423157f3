"""Censored likelihoods (NumPyro's ``LeftCensoredDistribution``,
``RightCensoredDistribution`` and ``IntervalCensoredDistribution``, as
NumPyro's censoring notebook uses them).

A censored observation is a bound (or an interval) of the outcome, while the
distribution's sampler draws the uncensored outcome. The log score reads the
censored density and applies; every score that compares simulated outcomes
with the observations (CRPS, energy, quadratic), the posterior predictive
and the procedures on simulated data sets would be silently wrong, so each
refuses, naming the site, with a remedy that works. So do the procedures on
simulated data sets at a ``numpyro.factor`` (the older way of writing a
censored likelihood), whose term no draw simulates, at an observed site
whose value is computed from the latents (a prior written as an observed
site, a residual) where the latents are drawn from the prior, and at a
likelihood class that implements ``log_prob`` but not ``sample``.
"""

import warnings

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax import random
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal
from scipy import stats

from numpyro_pvi import PredictiveELBO, Replications, diagnostics, predictive_score
from tests.arviz_generation import group, group_names

RNG = np.random.default_rng(0)
X = RNG.normal(size=40).astype(np.float32)
TIMES = (RNG.weibull(1.5, size=40) * np.exp(0.3 + 0.5 * X)).astype(np.float32)
#: right-censored at 2 (the study ends), left-censored below 0.3 (not seen
#: before the first visit)
RIGHT = TIMES > 2.0
LEFT = TIMES < 0.3
T_RIGHT = np.minimum(TIMES, 2.0)
T_LEFT = np.maximum(TIMES, 0.3)
BOUNDS = np.stack(
    [np.where(LEFT, 0.0, T_RIGHT), np.where(RIGHT, np.inf, T_LEFT)], -1
).astype(np.float32)


def weibull(x):
    a = numpyro.sample("a", dist.Normal(0.0, 1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    k = numpyro.sample("k", dist.Gamma(4.0, 2.0))
    return dist.Weibull(scale=jnp.exp(a + b * x), concentration=k)


def right_censored(x, censored, t=None):
    base = weibull(x)
    with numpyro.plate("subjects", x.shape[0]):
        numpyro.sample("t", dist.RightCensoredDistribution(base, censored), obs=t)


def left_censored(x, censored, t=None):
    base = weibull(x)
    with numpyro.plate("subjects", x.shape[0]):
        numpyro.sample("t", dist.LeftCensoredDistribution(base, censored), obs=t)


def interval_censored(x, left, right, t=None):
    base = weibull(x)
    with numpyro.plate("subjects", x.shape[0]):
        numpyro.sample("t", dist.IntervalCensoredDistribution(base, left, right), obs=t)


def with_uncensored_site(x, censored, t=None, z=None):
    """A censored outcome and an uncensored one per subject."""
    base = weibull(x)
    with numpyro.plate("subjects", x.shape[0]):
        numpyro.sample("t", dist.RightCensoredDistribution(base, censored), obs=t)
        numpyro.sample("z", dist.Normal(base.scale, 1.0), obs=z)


PROGRAMS = {
    "right": (right_censored, (X, RIGHT), {"t": T_RIGHT}),
    "left": (left_censored, (X, LEFT), {"t": T_LEFT}),
    "interval": (interval_censored, (X, LEFT, RIGHT), {"t": BOUNDS}),
}
ADVICE = "Use score='log' for this likelihood."


def _params(model, args, kwargs):
    guide = AutoNormal(model)
    svi = SVI(model, guide, optax.adam(0.01), Trace_ELBO())
    return guide, svi.get_params(svi.init(random.PRNGKey(0), *args, **kwargs))


@pytest.mark.parametrize(
    "program",
    [pytest.param(p, marks=[] if p == "right" else pytest.mark.slow) for p in PROGRAMS],
)
def test_scores_of_simulated_outcomes_refuse_and_the_advice_works(program):
    model, args, kwargs = PROGRAMS[program]
    refusal = r"Observed site 't' \(\w+CensoredDistribution\) is censored"
    guide, params = _params(model, args, kwargs)
    for score in ("crps", "energy", "quadratic"):
        with pytest.raises(ValueError, match=refusal) as objective:
            PredictiveELBO(score).loss(
                random.PRNGKey(0), params, model, guide, *args, **kwargs
            )
        with pytest.raises(ValueError, match=refusal) as evaluation:
            predictive_score(
                random.PRNGKey(1), params, model, guide, *args, score=score, **kwargs
            )
        for err in (objective, evaluation):
            assert ADVICE in str(err.value), (score, str(err.value))
    # the advice works, for the objective and for the evaluation
    result = SVI(model, guide, optax.adam(0.01), PredictiveELBO("log")).run(
        random.PRNGKey(2), 5, *args, progress_bar=False, **kwargs
    )
    assert np.all(np.isfinite(result.losses))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # unreliable estimates
        scores = predictive_score(
            random.PRNGKey(1), params, model, guide, *args, score="log", **kwargs
        )
    assert scores.score.shape == (40,) and np.all(np.isfinite(scores.score))


def test_log_score_reads_the_censored_density():
    """At a guide of negligible spread the predictive log score is the
    likelihood's at its location: the log survival function at a
    right-censored time, the log density elsewhere (scipy's Weibull); it
    would be the density everywhere if the censoring were ignored."""
    model, args, kwargs = PROGRAMS["right"]
    guide, params = _params(model, args, kwargs)
    loc = {"a": 0.3, "b": 0.5, "k": float(np.log(1.5))}  # k's unconstrained value
    params = {
        **{f"{n}_auto_loc": jnp.asarray(v) for n, v in loc.items()},
        **{f"{n}_auto_scale": jnp.asarray(1e-4) for n in loc},
    }
    weib = stats.weibull_min(1.5, scale=np.exp(0.3 + 0.5 * X.astype(float)))
    expected = np.where(RIGHT, weib.logsf(T_RIGHT), weib.logpdf(T_RIGHT))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a near point mass
        got = predictive_score(random.PRNGKey(3), params, model, guide, *args, **kwargs)
    assert RIGHT.sum() >= 5
    np.testing.assert_allclose(got.score, expected, rtol=2e-3, atol=2e-3)


@pytest.mark.py312  # the containers of both ArviZ generations
def test_posterior_predictive_leaves_the_censored_site_out_and_says_so():
    z = (np.exp(0.3 + 0.5 * X) + RNG.normal(size=40)).astype(np.float32)
    model, args, kwargs = with_uncensored_site, (X, RIGHT), {"t": T_RIGHT, "z": z}
    guide, params = _params(model, args, kwargs)
    with pytest.warns(UserWarning, match="observed site 't' .* is censored") as rec:
        data = diagnostics.to_inference_data(
            random.PRNGKey(4), params, model, guide, *args, num_draws=50, **kwargs
        )
    assert any("to_inference_data" in str(w.message) for w in rec)
    predictive = diagnostics.get_group(data, "posterior_predictive")
    assert set(predictive.data_vars) == {"z"}
    assert {"t", "z"} <= set(diagnostics.get_group(data, "observed_data").data_vars)
    # the censored density is still in the pointwise log-likelihood
    log_lik = diagnostics.get_group(data, "log_likelihood")
    (joint,) = log_lik.data_vars
    assert log_lik[joint].shape[-1] == 40
    with pytest.warns(UserWarning, match="psis_resample: .*'t'.* is censored"):
        resampled = diagnostics.psis_resample(
            random.PRNGKey(5), params, model, guide, *args, num_draws=20, **kwargs
        )
    assert set(diagnostics.get_group(resampled, "posterior_predictive").data_vars) == {
        "z"
    }


@pytest.mark.parametrize(
    "function", [diagnostics.vsbc, diagnostics.predictive_calibration]
)
def test_procedures_on_simulated_data_refuse_and_the_remedy_works(function):
    model, args, kwargs = PROGRAMS["interval"]
    tiny = Replications(
        num_simulations=2, num_svi_steps=2, num_draws=10, progress_bar=False
    )
    name = function.__name__
    with pytest.raises(ValueError) as err:
        function(
            random.PRNGKey(0), model, AutoNormal(model), optax.adam(0.01),
            Trace_ELBO(), *args, replications=tiny, **kwargs,
        )  # fmt: skip
    message = str(err.value)
    assert message.startswith(f"{name}: Observed site 't'"), message
    assert "base_dist" in message and "uncensored likelihood" in message

    # the remedy: the same procedure on the uncensored likelihood
    def uncensored(x, t=None):
        base = weibull(x)
        with numpyro.plate("subjects", x.shape[0]):
            numpyro.sample("t", base, obs=t)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        result = function(
            random.PRNGKey(0), uncensored, AutoNormal(uncensored), optax.adam(0.01),
            Trace_ELBO(), X, t=TIMES, replications=tiny,
        )  # fmt: skip
    assert result is not None


def factor_likelihood(x, t=None):
    base = weibull(x)
    with numpyro.plate("subjects", x.shape[0]):
        numpyro.factor("likelihood", base.log_prob(t))


def prior_factor(x, t=None):
    base = weibull(x)
    numpyro.factor("shrink", -(base.concentration**2))
    with numpyro.plate("subjects", x.shape[0]):
        numpyro.sample("t", base, obs=t)


@pytest.mark.parametrize(
    "function", [diagnostics.vsbc, diagnostics.predictive_calibration]
)
@pytest.mark.parametrize(
    "model, match",
    [
        (factor_likelihood, "the observed site 'likelihood' is a numpyro.factor"),
        (prior_factor, "numpyro.factor site 'shrink' is a term of its log density"),
    ],
)
def test_procedures_on_simulated_data_refuse_a_factor(function, model, match):
    """VSBC ran on the model's own data in every replication (a factor has
    no outcome to simulate), and on prior draws that ignore a factor of the
    prior."""
    tiny = Replications(num_simulations=2, num_svi_steps=2, num_draws=10)
    with pytest.raises(ValueError, match=f"{function.__name__}: .*{match}") as err:
        function(
            random.PRNGKey(0), model, AutoNormal(model), optax.adam(0.01),
            Trace_ELBO(), X, t=TIMES, replications=tiny,
        )  # fmt: skip
    assert "Write " in str(err.value)


def prior_as_observed(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    numpyro.sample("mu_prior", dist.Normal(0.0, 1.0), obs=mu)
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def residual(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(0.0, 1.0), obs=y - mu)


def prior_written_out(y):
    """``prior_as_observed`` with the observed term in the prior: the
    product of the two Normal densities is a Normal of precision 1.01."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.01**-0.5))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


@pytest.mark.parametrize(
    "function", [diagnostics.vsbc, diagnostics.predictive_calibration]
)
@pytest.mark.parametrize(
    "model, site", [(prior_as_observed, "mu_prior"), (residual, "y")]
)
def test_procedures_that_draw_the_prior_refuse_an_observed_latent_value(
    function, model, site
):
    """An observed site whose value is computed from the latents is a term
    of the joint density that the prior's draws do not see. VSBC drew ``mu``
    from Normal(0, 10) while every fit had the prior of precision 1.01: an
    exact guide (AutoNormal of a Normal posterior) was reported
    miscalibrated (spread ratio 4.8, 25 of 40 ranks extreme). Now both
    procedures refuse, naming the site; the remedies run: the term written
    into the prior, and for the predictive calibration data sets of the
    user's own (the fits keep the term)."""
    y = jnp.asarray([0.3, -1.2, 0.8, 2.1, -0.4])
    tiny = Replications(num_simulations=2, num_svi_steps=2, num_draws=10)
    with pytest.raises(ValueError, match=f"{function.__name__}: .*'{site}'") as err:
        function(
            random.PRNGKey(0), model, AutoNormal(model), optax.adam(0.01),
            Trace_ELBO(), y, replications=tiny,
        )  # fmt: skip
    message = str(err.value)
    assert "an exact fit would look miscalibrated" in message
    assert "Write the term into the distributions" in message
    assert ("data_generator" in message) == (function is not diagnostics.vsbc)
    if model is residual:
        return
    result = function(
        random.PRNGKey(0), prior_written_out, AutoNormal(prior_written_out),
        optax.adam(0.01), Trace_ELBO(), y, replications=tiny,
    )  # fmt: skip
    assert result is not None
    if function is diagnostics.predictive_calibration:
        generated = Replications(
            num_simulations=2, num_svi_steps=2, num_draws=10,
            data_generator=lambda key: {"y": random.normal(key, (5,))},
        )  # fmt: skip
        result = function(
            random.PRNGKey(0), model, AutoNormal(model), optax.adam(0.01),
            Trace_ELBO(), y, replications=generated,
        )  # fmt: skip
        assert result is not None


class _LogProbOnly(dist.Distribution):
    """A user's likelihood class with a density and no sampler."""

    support = dist.constraints.real

    def __init__(self, loc):
        self.loc = loc
        super().__init__(batch_shape=jnp.shape(loc))

    def log_prob(self, value):
        return -jnp.logaddexp(value - self.loc, self.loc - value) - jnp.log(jnp.pi)


def _log_prob_only(x, y=None):
    a = numpyro.sample("a", dist.Normal(0.0, 5.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", _LogProbOnly(a * x), obs=y)


@pytest.mark.py312  # the containers of both ArviZ generations
def test_a_likelihood_without_a_sampler_is_named_where_outcomes_are_simulated():
    """NumPyro's ``Distribution.sample`` raised an empty NotImplementedError
    in the CRPS evaluation, ``psis_resample`` and ``vsbc``: each now names the
    site; the posterior predictive leaves it out with a warning; the log
    score, which reads the density only, runs."""
    y = 2.0 * X + RNG.normal(size=40).astype(np.float32)
    guide = AutoNormal(_log_prob_only)
    svi = SVI(_log_prob_only, guide, optax.adam(0.05), Trace_ELBO())
    params = svi.get_params(svi.init(random.PRNGKey(0), X, y))
    key = random.PRNGKey(1)
    assert np.isfinite(
        predictive_score(key, params, _log_prob_only, guide, X, y).score
    ).all()
    named = (
        r"'y' \(_LogProbOnly\) cannot be simulated: its distribution implements "
        r"log_prob but not sample.*Use score='log'"
    )
    with pytest.raises(ValueError, match=named):
        predictive_score(key, params, _log_prob_only, guide, X, y, score="crps")
    with pytest.raises(ValueError, match=named):
        PredictiveELBO("energy").loss(key, params, _log_prob_only, guide, X, y)
    with pytest.warns(UserWarning, match="'y' \\(_LogProbOnly\\): its distribution"):
        data = diagnostics.to_inference_data(key, params, _log_prob_only, guide, X, y)
    if "posterior_predictive" in group_names(data):
        assert "y" not in group(data, "posterior_predictive")
    replications = Replications(num_simulations=2, num_svi_steps=2)
    for function, remedy in [
        (diagnostics.vsbc, "implements log_prob but not sample; and vsbc"),
        (diagnostics.predictive_calibration, "data_generator"),
    ]:
        with pytest.raises(
            ValueError, match="'y' cannot be simulated: its distribution.*" + remedy
        ):
            function(
                key,
                _log_prob_only,
                AutoNormal(_log_prob_only),
                optax.adam(0.01),
                Trace_ELBO(),
                X,
                y,
                replications=replications,
            )
