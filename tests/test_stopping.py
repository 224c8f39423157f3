"""The stopping rule for noisy SVI losses: a sequential test on the loss
trace read in blocks (``objectives/svi_scan.py``), in ``run_until_flat`` and
behind ``FitRecipe(stop_early=True)`` in ``cross_validate`` and ``stack``."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from jax import random
from numpyro.infer import SVI
from numpyro.infer.autoguide import AutoNormal

from numpyro_pvi import FitRecipe, PredictiveELBO, run_until_flat
from numpyro_pvi.objectives.svi_scan import (
    MIN_FRACTION,
    PATIENCE,
    StopRule,
    svi_scan,
    svi_scan_until_flat,
)
from numpyro_pvi.selection import cross_validate, stack

D = 3


def regression(x, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(x @ w, sigma), obs=y)


def data(n, seed=0):
    kx, ky = random.split(random.PRNGKey(seed))
    x = random.normal(kx, (n, D))
    return x, x @ jnp.array([1.0, -0.5, 0.2]) + random.normal(ky, (n,))


def _feed(rule, trace, t):
    """Blocks of ``t`` losses of ``trace`` until the rule stops: the steps."""
    for done in range(t, len(trace) + 1, t):
        block = trace[done - t : done]
        if rule.update(np.mean(block), np.var(block, ddof=1), t, done):
            return done
    return None


def test_the_rule_stops_a_flat_trace_and_not_a_falling_one():
    """Blocks of 50 losses with unit noise: the mean of a block has standard
    error 0.14, so a fall of 1 per block is a drift of about 7 (never flat)
    while a flat trace's drift is standard normal (flat at 2 with
    probability 0.98)."""
    num_steps, t = 2000, 50
    noise = np.asarray(random.normal(random.PRNGKey(0), (num_steps,)))
    falling = noise - np.arange(num_steps) / t
    assert _feed(StopRule(num_steps), falling, t) is None
    stopped = _feed(StopRule(num_steps), noise, t)
    # not before the minimum share of the steps, and soon after it
    earliest = max(MIN_FRACTION * num_steps, (PATIENCE + 1) * t)
    assert earliest <= stopped <= earliest + 4 * t
    # a trace that falls and then fluctuates stops after the fall
    fall_then_flat = noise + np.maximum(0.0, 1000.0 - np.arange(num_steps)) / t
    assert _feed(StopRule(num_steps), fall_then_flat, t) >= 1000


def test_run_until_flat_stops_where_a_fixed_run_would_end():
    """It stops before the most steps, at a loss within Monte Carlo error of
    that of the whole run's last block."""
    x, y = data(300)
    svi = SVI(regression, AutoNormal(regression), optax.adam(0.05), PredictiveELBO())
    early = run_until_flat(svi, random.PRNGKey(1), 4000, x, y, progress_bar=False)
    whole = svi.run(random.PRNGKey(1), 4000, x, y, progress_bar=False)
    assert len(early.losses) < 4000
    # the same steps (in blocks: equal to rounding)
    np.testing.assert_allclose(
        early.losses, whole.losses[: len(early.losses)], rtol=1e-5
    )
    last, tail = early.losses[-200:], whole.losses[-200:]
    se = np.sqrt((np.var(last) + np.var(tail)) / 200)
    assert abs(float(np.mean(last) - np.mean(tail))) < 4 * se


def test_cross_validation_and_stacking_stop_early_with_the_same_scores():
    """CV with the stopping rule scores every candidate as fixed-step CV
    does, within a standard error of the scores; stack fits with it."""
    x, y = data(200, seed=2)
    guide = AutoNormal(regression)

    def cv(stop_early):
        fit = FitRecipe(
            num_steps=2000, num_draws=100, progress_bar=False, stop_early=stop_early
        )
        return cross_validate(
            random.PRNGKey(3),
            regression,
            guide,
            optax.adam(0.05),
            x,
            y,
            fit=fit,
            num_folds=3,
        )

    early, fixed = cv(True), cv(False)
    gap = np.abs(early.scores["mean"].values - fixed.scores["mean"].values)
    assert np.all(gap < fixed.scores["se"].values), gap
    fit = FitRecipe(num_steps=2000, num_draws=100, progress_bar=False, stop_early=True)
    stacked = stack(
        random.PRNGKey(4), regression, guide, optax.adam(0.05), x, y, cv=early, fit=fit
    )
    for params in stacked.candidate_params.values():
        assert all(np.all(np.isfinite(v)) for v in params.values())


def test_the_compiled_rule_stops_each_fit_of_a_vmap_on_its_own():
    """``svi_scan_until_flat`` under ``vmap``: each fit takes the steps of
    ``svi_scan`` until it stops (losses nan after), fewer than the most."""
    x, y = data(300)
    svi = SVI(regression, AutoNormal(regression), optax.adam(0.05), PredictiveELBO())
    keys = random.split(random.PRNGKey(5), 2)
    svi.init(keys[0], x, y)  # the autoguide sets itself up outside the vmap

    def fit(key, until_flat):
        state = svi.init(key, x, y)
        if until_flat:
            return svi_scan_until_flat(svi, state, num_steps=3000, args=(x, y))[1:3]
        return svi_scan(svi, state, num_steps=3000, args=(x, y))[1]

    losses, done = jax.jit(jax.vmap(lambda k: fit(k, True)))(keys)
    whole = jax.jit(jax.vmap(lambda k: fit(k, False)))(keys)
    for i in range(2):
        n = int(done[i])
        assert 0.2 * 3000 <= n < 3000 and n % 150 == 0
        np.testing.assert_allclose(losses[i, :n], whole[i, :n], rtol=1e-5)
        assert np.all(np.isnan(losses[i, n:]))


def test_vsbc_with_the_rule_reads_the_fits_it_stopped():
    from numpyro_pvi import Replications, diagnostics

    x, y = data(50)
    replications = Replications(
        num_simulations=4,
        num_svi_steps=2000,
        num_draws=50,
        stop_early=True,
        progress_bar=False,
    )
    idata = diagnostics.vsbc(
        random.PRNGKey(6),
        regression,
        AutoNormal(regression),
        optax.adam(0.05),
        PredictiveELBO(),
        x,
        y,
        replications=replications,
    )
    stats = diagnostics.get_group(idata, "vsbc_fit_stats")
    assert np.all(np.isfinite(stats["loss"].values))
    assert np.all(stats["converged"].values)
