"""Stacking of cross-validated candidates: known answers of the weights, and
the stacked predictive scored held out on a misspecified model."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from numpyro_pvi import FitRecipe, PredictiveELBO, predictive_score
from numpyro_pvi.selection import (
    StackedGuide,
    cross_validate,
    stack,
    stacking_weights,
)
from numpyro_pvi.selection.stacking import stacking_weights_arrays


def _stacked(w, s):
    return np.mean(np.log(np.exp(s).T @ w))


def test_two_candidates_right_on_half_the_data_each_get_half_and_beat_both():
    n = 200
    right, wrong = np.zeros(n // 2), np.full(n // 2, -10.0)
    s = np.stack([np.r_[right, wrong], np.r_[wrong, right]])
    w = stacking_weights_arrays(s)
    np.testing.assert_allclose(w, [0.5, 0.5], atol=1e-6)
    assert _stacked(w, s) > s.mean(axis=1).max() + 4.0  # -0.69 against -5


def test_a_dominating_candidate_gets_weight_one():
    rng = np.random.default_rng(0)
    good = rng.normal(-1.0, 0.3, 100)
    s = np.stack([good, good - 3.0, good - 1.0])
    w = stacking_weights_arrays(s)
    assert w[0] > 0.999
    np.testing.assert_allclose(w.sum(), 1.0, atol=1e-12)


def test_weights_match_a_grid_search_for_two_candidates():
    rng = np.random.default_rng(1)
    s = rng.normal(0.0, 1.0, (2, 60))
    w = stacking_weights_arrays(s)
    grid = np.linspace(0.0, 1.0, 100_001)
    values = np.log(
        np.exp(s[0])[None, :] * grid[:, None]
        + np.exp(s[1])[None, :] * (1 - grid[:, None])
    ).sum(1)
    assert abs(w[0] - grid[np.argmax(values)]) < 1e-4


@pytest.mark.parametrize("seed", range(5))
def test_stacked_score_is_at_least_every_single_candidate(seed):
    rng = np.random.default_rng(seed)
    s = rng.normal(0.0, 2.0, (4, 30)) + rng.normal(0.0, 1.0, (4, 1))
    w = stacking_weights_arrays(s)
    assert np.all(w >= 0) and abs(w.sum() - 1) < 1e-12
    assert _stacked(w, s) >= s.mean(axis=1).max() - 1e-9


def test_stacking_refuses_non_finite_scores_and_other_scores():
    with pytest.raises(ValueError, match="not finite"):
        stacking_weights_arrays(np.array([[0.0, -np.inf], [0.0, 0.0]]))
    with pytest.raises(TypeError, match="cross_validate"):
        stacking_weights({"a": 1})


def _model(x, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(w * x, 1.0), obs=y)


def _data(key, n):
    # misspecified: the noise is Student-t with scale 2, the model's is N(0, 1)
    kx, ke = jax.random.split(key)
    x = jax.random.normal(kx, (n,))
    return x, 0.7 * x + 2.0 * jax.random.t(ke, 4.0, (n,))


@pytest.mark.slow
@pytest.mark.xdist_group("stacking")
def test_stacked_predictive_scores_at_least_the_chosen_candidate_held_out():
    x, y = _data(jax.random.PRNGKey(0), 150)
    x_test, y_test = _data(jax.random.PRNGKey(1), 3000)
    guide = AutoNormal(_model)
    optim = optax.adam(0.05)
    recipe = FitRecipe(num_steps=600, num_draws=400, progress_bar=False)
    cv = cross_validate(
        jax.random.PRNGKey(2),
        _model,
        guide,
        optim,
        x,
        y,
        fit=recipe,
        num_folds=5,
        candidates={
            "VI": Trace_ELBO(),
            "PVI": PredictiveELBO("log", lam=0.0),
            "PVI posterior λ=1": PredictiveELBO(
                "log", regularizer="posterior", lam=1.0
            ),
        },
    )
    stacked = stack(
        jax.random.PRNGKey(3), _model, guide, optim, x, y, cv=cv, fit=recipe
    )
    assert isinstance(stacked.guide, StackedGuide)
    np.testing.assert_allclose(stacked.weights.sum(), 1.0, atol=1e-6)
    assert "weight" in repr(stacked.stacking)
    key = jax.random.PRNGKey(4)
    mixed = predictive_score(key, stacked.params, _model, stacked.guide, x_test, y_test)
    chosen = stacked.candidate_params.get(cv.best_label)
    if chosen is None:  # the chosen candidate's weight was below min_weight
        chosen = _refit(cv, guide, optim, x, y, recipe)
    single = predictive_score(key, chosen, _model, guide, x_test, y_test)
    diff = np.asarray(mixed.score) - np.asarray(single.score)
    # paired over the test points, plus both estimates' Monte Carlo error
    se = np.sqrt(diff.var(ddof=1) * diff.size + mixed.total_se**2 + single.total_se**2)
    assert diff.sum() > -3.0 * se, (diff.sum(), se, stacked.stacking)


def _refit(cv, guide, optim, x, y, recipe):
    svi = numpyro.infer.SVI(_model, guide, optim, loss=cv.best)
    return svi.run(
        jax.random.PRNGKey(5), recipe.num_steps, x, y, progress_bar=False
    ).params


def test_stacked_guide_draws_each_candidate_with_its_weight():
    guide = AutoNormal(_model)
    x = jnp.linspace(-1, 1, 5)
    numpyro.handlers.seed(guide, 0)(x)  # the autoguide's prototype
    params = {
        "w_auto_loc": jnp.array([-5.0, 5.0]),
        "w_auto_scale": jnp.array([0.01, 0.01]),
    }
    stacked = StackedGuide(guide, [0.25, 0.75])
    draws = jax.vmap(
        lambda k: numpyro.handlers.substitute(
            numpyro.handlers.seed(stacked, k), data={"stacked_params": params}
        )(x)["w"]
    )(jax.random.split(jax.random.PRNGKey(0), 4000))
    frac = float(jnp.mean(draws > 0))
    assert abs(frac - 0.75) < 4 * np.sqrt(0.75 * 0.25 / 4000)


@pytest.mark.parametrize(
    "call", ["psis", "psis_resample", "report", "to_inference_data"]
)
def test_functions_that_read_the_guide_density_refuse_a_stacked_guide(call):
    from numpyro_pvi import diagnostics

    guide = AutoNormal(_model)
    x = jnp.linspace(-1, 1, 5)
    numpyro.handlers.seed(guide, 0)(x)
    params = {
        "stacked_params": {
            "w_auto_loc": jnp.array([-1.0, 1.0]),
            "w_auto_scale": jnp.array([0.1, 0.1]),
        }
    }
    stacked = StackedGuide(guide, [0.5, 0.5])
    with pytest.raises(ValueError, match="a component's density is not the mixture"):
        getattr(diagnostics, call)(
            jax.random.PRNGKey(0), params, _model, stacked, x, jnp.zeros(5)
        )
