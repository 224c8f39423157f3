"""Observed sites inside NumPyro's ``scan``: each step's distribution draws,
in the scores and the posterior predictive (NumPyro stacks a body site's
distributions and keeps the inner ones' shapes of one step)."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax import random
from numpyro.contrib.control_flow import scan
from scipy import stats

from numpyro_pvi import PredictiveELBO, predictive_score
from numpyro_pvi.diagnostics import to_inference_data
from tests.arviz_generation import group

pytestmark = pytest.mark.py312

A, T, DRAWS = 0.6, 40, 2000

#: a likelihood of the previous value ``prev``, and the law of one step's
#: outcome at ``prev`` (SciPy), for the families whose NumPyro sampler draws
#: through an inner distribution (the Student-t's chi-square, the LogNormal's
#: Normal, the Beta's Dirichlet, the negative binomial's Gamma)
FAMILIES = {
    "student_t": (
        lambda prev: dist.StudentT(4.0, A * prev, 1.0),
        lambda prev: stats.t(4.0, A * prev, 1.0),
    ),
    "lognormal": (
        lambda prev: dist.LogNormal(A * prev, 0.5),
        lambda prev: stats.lognorm(0.5, scale=np.exp(A * prev)),
    ),
    "beta": (
        lambda prev: dist.Beta(2.0 + A * prev, 3.0),
        lambda prev: stats.beta(2.0 + A * prev, 3.0),
    ),
    "negative_binomial": (
        lambda prev: dist.NegativeBinomial2(1.0 + A * prev, 3.0),
        lambda prev: stats.nbinom(3.0, 3.0 / (3.0 + 1.0 + A * prev)),
    ),
}


def _model(likelihood):
    def model(y):
        numpyro.sample("a", dist.Normal(0.0, 1.0))

        def step(prev, t):
            return numpyro.sample("y", likelihood(prev)), None

        with numpyro.handlers.condition(data={"y": y[1:]}):
            scan(step, y[0], jnp.arange(y.shape[0] - 1))

    return model


def _guide(y):
    numpyro.sample("a", dist.Normal(A, 1e-3))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_scan_site_draws_each_step_from_its_own_distribution(family):
    likelihood, law = FAMILIES[family]
    rng = np.random.default_rng(0)
    y = rng.uniform(0.1, 0.9, T) if family == "beta" else rng.poisson(2, T)
    y = jnp.asarray(y, jnp.float32)
    idata = to_inference_data(
        random.PRNGKey(0), {}, _model(likelihood), _guide, y, num_draws=DRAWS
    )
    y_rep = np.asarray(group(idata, "posterior_predictive")["y"]).reshape(DRAWS, T - 1)
    # one-step-ahead: the outcome of step t at the observed y[t - 1]
    for t in (0, T // 2):
        prev = float(y[t])
        pit = law(prev).cdf(y_rep[:, t])
        if family == "negative_binomial":  # randomised PIT of a count
            lower = law(prev).cdf(y_rep[:, t] - 1)
            pit = lower + rng.uniform(size=DRAWS) * (pit - lower)
        assert stats.kstest(pit, "uniform").pvalue > 1e-3
    # steps draw independently (one shared noise would correlate them fully)
    pit0 = law(float(y[0])).cdf(y_rep[:, 0])
    pit1 = law(float(y[T // 2])).cdf(y_rep[:, T // 2])
    assert abs(stats.spearmanr(pit0, pit1)[0]) < 4 / np.sqrt(DRAWS)


def _plate_model(likelihood):
    def model(y):
        numpyro.sample("a", dist.Normal(0.0, 1.0))
        with numpyro.plate("time", y.shape[0] - 1):
            numpyro.sample("y", likelihood(y[:-1]), obs=y[1:])

    return model


#: likelihoods whose simulated draws go through an inner distribution
SIMULATED = {
    "half_normal": lambda prev: dist.HalfNormal(1.0 + A * prev),
    "lognormal": lambda prev: dist.LogNormal(A * prev, 0.5),
    "student_t": lambda prev: dist.StudentT(4.0, A * prev, 1.0),
}


@pytest.mark.parametrize("family", list(SIMULATED))
def test_scores_of_a_scan_site_are_those_of_the_plate_model(family):
    """The same likelihood written in a ``scan`` body and along a plate: the
    same draws, so the same scores (a draw shared by every step differs)."""
    likelihood = SIMULATED[family]
    y = jnp.asarray(np.random.default_rng(1).gamma(2.0, 1.0, T), jnp.float32)
    scan_model, plate_model = _model(likelihood), _plate_model(likelihood)
    key = random.PRNGKey(2)
    for score in ("crps", "energy"):
        scan_score, plate_score = (
            predictive_score(key, {}, m, _guide, y, score=score, num_draws=500).score
            for m in (scan_model, plate_model)
        )
        np.testing.assert_allclose(scan_score, plate_score, rtol=1e-5, atol=1e-6)
    loss = PredictiveELBO("crps", num_particles=16)
    np.testing.assert_allclose(
        loss.loss(key, {}, scan_model, _guide, y),
        loss.loss(key, {}, plate_model, _guide, y),
        rtol=1e-5,
    )
