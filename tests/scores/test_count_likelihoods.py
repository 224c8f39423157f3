"""Likelihoods of counts out of ``total_count`` trials beyond the Binomial:
NumPyro's ``BetaBinomial`` (over-dispersed counts). Its quadratic score
enumerates ``0, ..., max(total_count)`` from the concrete counts, as a
Binomial's does (NumPyro's own ``enumerate_support`` fails under ``jit``
once the concentrations are traced); its sampler fails on a float
``total_count``, which every simulating function names, and which the
CRPS from the pmf does not need."""

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax import random
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoDelta, AutoNormal
from scipy.stats import betabinom

from numpyro_pvi import PredictiveELBO, Replications, diagnostics, predictive_score
from numpyro_pvi.scores import CRPS, EnergyScore
from tests.arviz_generation import group, group_names

pytestmark = pytest.mark.py312

N = jnp.array([3, 5, 10, 1, 7])
Y = jnp.array([1.0, 4.0, 3.0, 0.0, 6.0])
PARAMS = {"a_auto_loc": jnp.asarray(0.7), "b_auto_loc": jnp.asarray(2.0)}


def beta_binomial(n, y):
    a = numpyro.sample("a", dist.LogNormal(0.0, 1.0))
    b = numpyro.sample("b", dist.LogNormal(0.0, 1.0))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.BetaBinomial(a, b, total_count=n), obs=y)


def test_quadratic_score_of_beta_binomials_with_varying_total_count():
    """Known answer: at a point-mass guide the score is 2 p(y) - Σ_k p(k)²
    of each observation's BetaBinomial, over its own support (the shared
    support up to max(total_count) gives zero probability above it)."""
    got = predictive_score(
        random.PRNGKey(0),
        PARAMS,
        beta_binomial,
        AutoDelta(beta_binomial),
        N,
        Y,
        score="quadratic",
        num_draws=2,
    )
    a, b = 0.7, 2.0
    expected = [
        2 * betabinom.pmf(y, n, a, b)
        - np.sum(betabinom.pmf(np.arange(n + 1), n, a, b) ** 2)
        for n, y in zip(np.asarray(N), np.asarray(Y), strict=True)
    ]
    np.testing.assert_allclose(got.score, expected, rtol=2e-5, atol=2e-6)


def test_the_quadratic_objective_fits_a_beta_binomial():
    """Under SVI's jitted steps (concentrations traced) the objective
    compiles and decreases."""
    guide = AutoNormal(beta_binomial)
    svi = SVI(beta_binomial, guide, optax.adam(0.05), PredictiveELBO("quadratic"))
    losses = svi.run(random.PRNGKey(0), 200, N, Y, progress_bar=False).losses
    assert np.isfinite(losses).all()
    assert losses[-20:].mean() < losses[:20].mean()


FLOAT_COUNTS = N.astype(jnp.float32)
SAMPLER = (
    r"'y' \(BetaBinomial\) cannot be simulated: its sampler raises TypeError "
    r"\('Indexer must have integer.*as it does under numpyro.infer.Predictive.*"
    r"its total_count is float32: pass integer counts"
)


def binomial(n, y=None):
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("obs", n.shape[0]):
        numpyro.sample("y", dist.Binomial(n, logits=b), obs=y)


def binomial_guide(n, y=None):
    numpyro.sample("b", dist.Normal(numpyro.param("m", 0.0), 0.3))


def test_narrow_integer_counts_under_x64_get_the_width_that_works():
    """Under jax_enable_x64 NumPyro's binomial sampler fails on int32 counts
    (an int64 counter of its own meets them in a lax.cond; so does NumPyro's
    Predictive): the refusal of a score that simulates names the width to
    pass, and that width works."""
    import jax

    with jax.enable_x64(True):
        key, params, y = random.PRNGKey(0), {"m": jnp.asarray(0.5)}, Y.astype(int)
        narrow, wide = N.astype(jnp.int32), N.astype(jnp.int64)
        message = (
            r"'y' \(BinomialLogits\).*its total_count is int32, JAX's default "
            r"integer is int64: pass the counts as int64"
        )
        simulating = CRPS(estimator="all-pairs")
        with pytest.raises(ValueError, match=message):
            predictive_score(
                key, params, binomial, binomial_guide, narrow, y, score=simulating
            )
        scores = predictive_score(
            key, params, binomial, binomial_guide, wide, y, score=simulating
        )
        assert np.isfinite(scores.score).all()
        # the CRPS from the pmf (the default) draws nothing: both widths
        for counts in (narrow, wide):
            scores = predictive_score(
                key, params, binomial, binomial_guide, counts, y, score="crps"
            )
            assert np.isfinite(scores.score).all()


@pytest.mark.parametrize(
    "score", [CRPS(estimator="all-pairs"), EnergyScore(0.5)], ids=["crps", "energy"]
)
def test_a_sampler_that_fails_is_named_with_its_error(score):
    """NumPyro's BetaBinomial sampler indexes with total_count: a float one
    fails (so does NumPyro's Predictive); the scores that simulate name it,
    the log score and the CRPS from the pmf (the default ``"crps"``, and
    ``"energy"`` with beta = 1), which do not simulate, take it."""
    key = random.PRNGKey(0)
    guide = AutoDelta(beta_binomial)
    for name in ("log", "crps", "energy"):
        scores = predictive_score(
            key, PARAMS, beta_binomial, guide, FLOAT_COUNTS, Y, score=name
        )
        assert np.isfinite(scores.score).all(), name
        loss = PredictiveELBO(name).loss(
            key, PARAMS, beta_binomial, AutoNormal(beta_binomial), FLOAT_COUNTS, Y
        )
        assert np.isfinite(loss), name
    with pytest.raises(ValueError, match=SAMPLER):
        predictive_score(
            key, PARAMS, beta_binomial, guide, FLOAT_COUNTS, Y, score=score
        )
    with pytest.raises(ValueError, match=SAMPLER):
        PredictiveELBO(score).loss(
            key, PARAMS, beta_binomial, AutoNormal(beta_binomial), FLOAT_COUNTS, Y
        )


def test_the_posterior_predictive_leaves_it_out_and_vsbc_refuses_it():
    key = random.PRNGKey(0)
    guide = AutoNormal(beta_binomial)
    params = {
        "a_auto_loc": jnp.asarray(0.0),
        "a_auto_scale": jnp.asarray(0.1),
        "b_auto_loc": jnp.asarray(0.5),
        "b_auto_scale": jnp.asarray(0.1),
    }
    with pytest.warns(UserWarning, match="no simulated values of the observed s"):
        data = diagnostics.to_inference_data(
            key, params, beta_binomial, guide, FLOAT_COUNTS, Y, num_draws=50
        )
    assert "posterior" in group_names(data)
    names = group_names(data)
    assert "posterior_predictive" not in names or "y" not in group(
        data, "posterior_predictive"
    )
    with pytest.raises(ValueError, match="vsbc: the observed site 'y' cannot be s"):
        diagnostics.vsbc(
            key,
            beta_binomial,
            guide,
            optax.adam(0.01),
            Trace_ELBO(),
            FLOAT_COUNTS,
            Y,
            replications=Replications(num_simulations=2, num_svi_steps=2),
        )
