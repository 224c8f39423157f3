"""Stacking of cross-validated candidates: known answers of the weights (log
score, and the CRPS against scoringrules' closed form of a Normal mixture),
the quadratic identity of the mixture's score estimates, and the stacked
predictive scored held out on a misspecified model."""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax.example_libraries import stax
from numpyro.infer import Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from numpyro_pvi import FitRecipe, PredictiveELBO, StratifiedELBO, predictive_score
from numpyro_pvi._trace.particles import ParticleSpec
from numpyro_pvi.evaluation.draws import guide_draws
from numpyro_pvi.evaluation.held_out import mixture_terms, pair_gain
from numpyro_pvi.guides import AutoGaussianMixture
from numpyro_pvi.objectives.svi_scan import svi_scan
from numpyro_pvi.scores import CRPS, EnergyScore, QuadraticScore
from numpyro_pvi.selection import (
    StackedGuide,
    cross_validate,
    plot_stacking,
    stack,
    stacking_weights,
)
from numpyro_pvi.selection.stacking import stacked_pointwise, stacking_weights_arrays


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


def _normal_crps_terms(y, mu, sd):
    """Positively oriented CRPS of N(mu_c, sd_c) at y, (C, n), and the
    pairwise gains G_cd = E|X_c - X_d| - E|X_c - X_c'|/2 - E|X_d - X_d'|/2."""
    import scoringrules as sr

    mu, sd = np.asarray(mu, float), np.asarray(sd, float)
    s = np.stack(
        [-sr.crps_normal(y, m, v, backend="numpy") for m, v in zip(mu, sd, strict=True)]
    )

    def abs_mean(m, v):  # E|X| of X ~ N(m, v^2)
        from scipy.stats import norm

        return m * (2 * norm.cdf(m / v) - 1) + 2 * v * norm.pdf(m / v)

    b = abs_mean(mu[:, None] - mu[None, :], np.hypot(sd[:, None], sd[None, :]))
    g = b - 0.5 * np.diag(b)[:, None] - 0.5 * np.diag(b)[None, :]
    return s, np.broadcast_to(g[:, :, None], g.shape + y.shape).copy()


def test_crps_stacking_matches_scoringrules_mixture_crps_on_a_grid():
    import scoringrules as sr

    rng = np.random.default_rng(3)
    y = np.r_[rng.normal(-1.0, 0.5, 70), rng.normal(1.5, 0.5, 30)]
    mu, sd = [-1.0, 1.5], [0.5, 0.7]
    s, g = _normal_crps_terms(y, mu, sd)
    w = stacking_weights_arrays(s, g)
    grid = np.linspace(0.0, 1.0, 2001)
    crps = [
        sr.crps_mixnorm(
            y, np.array(mu), np.array(sd), np.array([v, 1 - v]), backend="numpy"
        ).mean()
        for v in grid
    ]
    assert abs(w[0] - grid[int(np.argmin(crps))]) < 1e-3
    # the quadratic form is the mixture's CRPS at every weight
    for v in (0.2, 0.5, w[0]):
        mixed = sr.crps_mixnorm(
            y, np.array(mu), np.array(sd), np.array([v, 1 - v]), backend="numpy"
        )
        np.testing.assert_allclose(
            stacked_pointwise(np.array([v, 1 - v]), s, g), -mixed, rtol=1e-6
        )
    assert stacked_pointwise(w, s, g).mean() > s.mean(axis=1).max() + 0.05


def test_crps_stacking_halves_for_candidates_right_on_half_the_data_each():
    y = np.r_[np.full(50, -2.0), np.full(50, 2.0)]
    s, g = _normal_crps_terms(y, [-2.0, 2.0], [0.3, 0.3])
    w = stacking_weights_arrays(s, g)
    np.testing.assert_allclose(w, [0.5, 0.5], atol=1e-6)
    assert stacked_pointwise(w, s, g).mean() > s.mean(axis=1).max()


def test_crps_stacking_gives_the_true_predictive_weight_near_one():
    """The expected CRPS of (1 - t) F + t G under F is flat at t = 0 (it
    falls as t² times the energy distance), so the true predictive's weight
    tends to one as the data grow, at rate n^(-1/2): the other weights are
    noise of that order."""
    for n, floor in ((200, 0.85), (2000, 0.97)):
        y = np.random.default_rng(4).normal(0.0, 1.0, n)
        for mu, sd in (([0.0, 3.0, -4.0], [1.0, 1.0, 2.0]), ([0.0, 0.5], [1.0, 1.0])):
            s, g = _normal_crps_terms(y, mu, sd)
            assert stacking_weights_arrays(s, g)[0] > floor, (n, mu, sd)


def _regression(x, y=None):
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    with numpyro.plate("n", x.shape[0]):
        numpyro.sample("y", dist.Normal(b * x, s), obs=y)


def _counts(x, y=None):
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("n", x.shape[0]):
        numpyro.sample("y", dist.Binomial(5, logits=b * x), obs=y)


_X = jnp.linspace(-1.0, 1.0, 7)
_Y = {"line": 2 * _X, "counts": jnp.array([0.0, 1, 2, 3, 4, 5, 5])}


def _mixture(model):
    return AutoGaussianMixture(model, num_components=2)


_IDENTITY_CASES = {
    "crps-closed-form": (_regression, "line", CRPS(), AutoNormal),
    "crps-all-pairs": (_regression, "line", CRPS(estimator="all-pairs"), AutoNormal),
    "crps-derangement": (
        _regression,
        "line",
        CRPS(estimator="derangement"),
        AutoNormal,
    ),
    "energy-beta-0.5": (_regression, "line", EnergyScore(0.5), AutoNormal),
    "quadratic-counts": (_counts, "counts", QuadraticScore(), AutoNormal),
    "quadratic-counts-derangement": (
        _counts,
        "counts",
        QuadraticScore(estimator="derangement"),
        AutoNormal,
    ),
    "crps-counts": (_counts, "counts", CRPS(estimator="all-pairs"), AutoNormal),
    "crps-mixture-guide": (_regression, "line", CRPS(estimator="all-pairs"), _mixture),
}


@functools.cache
def _two_fits(model, make_guide, y_key):
    """Two fits of one guide (30 and 300 steps), shared by the cases with
    the same model and guide (one compiled fit each)."""
    y = _Y[y_key]
    guide = make_guide(model)
    mixture = isinstance(guide, AutoGaussianMixture)
    loss = StratifiedELBO() if mixture else Trace_ELBO()
    svi = numpyro.infer.SVI(model, guide, optax.adam(0.1), loss)
    state = svi.init(jax.random.PRNGKey(0), _X, y)
    steps = jax.jit(lambda st: svi_scan(svi, st, num_steps=30, args=(_X, y))[0])
    fits = []
    for blocks in (1, 9):  # after 30 and 300 steps
        for _ in range(blocks):
            state = steps(state)
        fits.append(svi.get_params(state))
    return guide, fits


@pytest.mark.parametrize("case", list(_IDENTITY_CASES))
def test_mixture_score_estimate_is_the_quadratic_of_the_pair_gain(case):
    """The score's own estimate of w q_a + (1 - w) q_b from the two fits'
    draws (stratified, weights w and 1 - w) equals w S_a + (1 - w) S_b +
    w (1 - w) G_ab with the pair gain from the same draws, at every w: the
    identity the CRPS, energy and quadratic stacking rests on."""
    model, y_key, score, make_guide = _IDENTITY_CASES[case]
    guide, fits = _two_fits(model, make_guide, y_key)
    y = _Y[y_key]
    spec = ParticleSpec(8, score.requires, None, objective="test")
    a, b = (
        guide_draws(jax.random.PRNGKey(3), p, model, guide, (_X, y), {}, spec)
        for p in fits
    )
    s_a, s_b, gain = score.estimate(a), score.estimate(b), pair_gain(score, a, b)
    assert np.all(np.isfinite(gain)) and np.any(np.abs(gain) > 1e-4)
    for w in (0.1, 0.35, 0.8):
        direct = score.estimate(mixture_terms(a, b, w))
        np.testing.assert_allclose(
            direct, w * s_a + (1 - w) * s_b + w * (1 - w) * gain, atol=2e-5
        )


def test_stacking_refuses_non_finite_scores_and_other_scores():
    with pytest.raises(ValueError, match="not finite"):
        stacking_weights_arrays(np.array([[0.0, -np.inf], [0.0, 0.0]]))
    with pytest.raises(TypeError, match="cross_validate"):
        stacking_weights({"a": 1})
    with pytest.raises(ValueError, match="do not match"):
        stacking_weights_arrays(np.zeros((2, 3)), np.zeros((2, 2, 4)))


def _model(x, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(w * x, 1.0), obs=y)


def _data(key, n):
    # misspecified: the noise is Student-t with scale 2, the model's is N(0, 1)
    kx, ke = jax.random.split(key)
    x = jax.random.normal(kx, (n,))
    return x, 0.7 * x + 2.0 * jax.random.t(ke, 4.0, (n,))


def test_crps_cross_validation_keeps_pair_gains_from_the_same_draws():
    """Two identical candidates (the same objective, the same key: the same
    fits) have a gain of zero at every observation, which they
    would not if the pairs drew other particles than the scores or were
    assembled at the wrong fits; a different candidate has gains."""
    x, y = _data(jax.random.PRNGKey(0), 40)
    cv = cross_validate(
        jax.random.PRNGKey(2),
        _model,
        AutoNormal(_model),
        optax.adam(0.05),
        x,
        y,
        fit=FitRecipe(num_steps=100, num_draws=64, progress_bar=False),
        num_folds=4,
        score="crps",
        candidates={
            "VI": Trace_ELBO(),
            "PVI": PredictiveELBO("crps", lam=0.0),
            "VI again": Trace_ELBO(),
        },
    )
    gains = cv.scores["pair_gain"]
    assert gains.dims == ("candidate", "other", "observation")
    # zero up to float32 rounding of the scores (about 1), times four
    np.testing.assert_allclose(
        gains.sel(candidate="VI", other="VI again"), 0.0, atol=2e-5
    )
    np.testing.assert_array_equal(gains.values, gains.values.transpose(1, 0, 2))
    assert np.all(np.diagonal(gains.values) == 0.0)
    assert np.abs(gains.sel(candidate="VI", other="PVI").values).max() > 1e-3
    stacking = stacking_weights(cv)
    assert "crps score" in repr(stacking)
    ax = plot_stacking(stacking)  # the bars are the weights
    widths = [p.get_width() for p in ax.patches]
    np.testing.assert_allclose(widths, stacking.weights.values)
    assert f"{stacking.mean:.4f}" in ax.get_title()
    with pytest.raises(TypeError, match="stacking_weights"):
        plot_stacking(cv)
    assert stacking.mean >= stacking.single_mean - 1e-9
    vertex = stacked_pointwise(
        np.array([1.0, 0.0, 0.0]),
        cv.scores["pointwise"].values,
        cv.scores["pair_gain"].values,
    )
    np.testing.assert_allclose(vertex, cv.scores["pointwise"].sel(candidate="VI"))


@pytest.mark.slow
@pytest.mark.parametrize("score", ["log", "crps"])
def test_stacked_predictive_keeps_its_estimated_gain_held_out(score):
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
        score=score,
        candidates={
            "VI": Trace_ELBO(),
            "PVI": PredictiveELBO(score, lam=0.0),
            "PVI posterior λ=1": PredictiveELBO(
                score, regularizer="posterior", lam=1.0
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
    mixed = predictive_score(
        key, stacked.params, _model, stacked.guide, x_test, y_test, score=score
    )
    best = stacked.stacking.single  # the candidate stacking compares with
    chosen = stacked.candidate_params.get(best)
    if chosen is None:  # its weight was below min_weight
        chosen = _refit(cv.candidates[best], guide, optim, x, y, recipe)
    single = predictive_score(key, chosen, _model, guide, x_test, y_test, score=score)
    diff = np.asarray(mixed.score) - np.asarray(single.score)
    n = diff.size
    # the gain per test point, paired over the points, with both estimates'
    # Monte Carlo errors (their totals': every point shares the draws)
    test_se = np.sqrt(diff.var(ddof=1) * n + mixed.total_se**2 + single.total_se**2)
    test_se /= n
    # stacking's own estimate of the gain (optimistic: its weights maximise
    # it) is not undercut by more than the two estimates' errors allow (it
    # would be, were the stacked draws all VI's)
    claimed = stacked.stacking.mean - stacked.stacking.single_mean
    bound = claimed - 3.0 * np.hypot(stacked.stacking.se, test_se)
    assert diff.mean() > bound, (diff.mean(), bound, stacked.stacking)


def _refit(loss, guide, optim, x, y, recipe):
    svi = numpyro.infer.SVI(_model, guide, optim, loss=loss)
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


def _stacked_params(locs, scales):
    return {
        "stacked_params": {
            "w_auto_loc": jnp.asarray(locs),
            "w_auto_scale": jnp.asarray(scales),
        }
    }


def _mixture_log_density(w, weights, locs, scales):
    from scipy.stats import norm

    parts = [
        np.log(p) + norm.logpdf(w, m, s)
        for p, m, s in zip(weights, locs, scales, strict=True)
    ]
    return np.logaddexp.reduce(parts, axis=0)


@pytest.mark.parametrize("call", ["psis", "psis_resample", "report"])
def test_functions_that_read_the_guide_density_read_the_mixtures(call):
    """psis, psis_resample and report read the stacked guide's density: the
    mixture's at every draw (exact), not the drawn candidate's."""
    from numpyro_pvi import diagnostics

    guide = AutoNormal(_model)
    x = jnp.linspace(-1, 1, 5)
    numpyro.handlers.seed(guide, 0)(x, jnp.zeros(5))
    locs, scales, weights = [-1.0, 1.0], [0.3, 0.5], [0.3, 0.7]
    out = getattr(diagnostics, call)(
        jax.random.PRNGKey(0),
        _stacked_params(locs, scales),
        _model,
        StackedGuide(guide, weights),
        x,
        jnp.zeros(5),
        num_draws=400,
    )
    if call == "psis_resample":
        return  # resampled by the weights of psis' draws, read below
    stats = diagnostics.get_group(out, "sample_stats")
    w = np.asarray(diagnostics.get_group(out, "posterior")["w"]).ravel()
    np.testing.assert_allclose(
        np.asarray(stats["log_q"]).ravel(),
        _mixture_log_density(w, weights, locs, scales),
        rtol=1e-4,
        atol=1e-4,
    )


def _point_model(y=None):
    theta = numpyro.sample("theta", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", 1):
        numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)


def _point_guide(y=None):
    loc = numpyro.param("loc", 0.0)
    scale = numpyro.param("scale", 1.0, constraint=dist.constraints.positive)
    numpyro.sample("theta", dist.Normal(loc, scale))


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_a_stacked_guides_score_far_from_the_fit_is_the_mixtures(order):
    """The known answer: candidates N(0, 0.3²) and N(3, 0.5²) with weights
    (0.6, 0.4), y ~ N(θ, 1), y = -10: log Σ_c w_c N(y; μ_c, 1 + σ_c²) =
    -47.344, in both orders (moment matching reads the guide's density at
    given points: the mixture's, not one fixed candidate's, which gave -65)."""
    from scipy.stats import norm

    candidates = [(0.0, 0.3, 0.6), (3.0, 0.5, 0.4)]
    candidates = [candidates[i] for i in order]
    locs, scales, weights = (np.array(c) for c in zip(*candidates, strict=True))
    exact = np.logaddexp.reduce(
        np.log(weights) + norm.logpdf(-10, locs, np.sqrt(1 + scales**2))
    )
    params = {
        "stacked_params": {"loc": jnp.asarray(locs), "scale": jnp.asarray(scales)}
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an unreliable estimate says so
        result = predictive_score(
            jax.random.PRNGKey(0),
            params,
            _point_model,
            StackedGuide(_point_guide, weights),
            jnp.array([-10.0]),
        )
    assert abs(result.score[0] - exact) < max(4 * result.se[0], 1.0), (
        result.score[0],
        result.se[0],
        exact,
    )


def _module_model(x, y=None):
    """A model with a parameter of its own (a numpyro.module's weights)."""
    net = numpyro.module("net", stax.Dense(1), (x.shape[0], 1))
    w = numpyro.sample("w", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", x.shape[0]):
        mean = net(x[:, None])[:, 0] + w
        numpyro.sample("y", dist.Normal(mean, 1.0), obs=y)


def test_a_stacked_fit_gives_the_model_its_candidates_parameters():
    """The model's own parameters reach it in a stacked fit: one candidate at
    weight 1 scores what its own fit scores (the same draws: the component
    draw takes its own key), where untrained model parameters score far
    less."""
    x = jnp.linspace(-2, 2, 30)
    y = 3.0 * x + 1.0
    guide = AutoNormal(_module_model)
    svi = numpyro.infer.SVI(_module_model, guide, optax.adam(0.05), Trace_ELBO())
    params = svi.run(jax.random.PRNGKey(0), 1500, x, y, progress_bar=False).params
    own = predictive_score(jax.random.PRNGKey(1), params, _module_model, guide, x, y)
    stacked = {"stacked_params": jax.tree.map(lambda p: p[None], params)}
    mixed = predictive_score(
        jax.random.PRNGKey(1), stacked, _module_model, StackedGuide(guide, [1.0]), x, y
    )
    se = np.hypot(own.total_se, mixed.total_se)
    assert abs(mixed.total - own.total) < 4 * se + 1e-3, (mixed.total, own.total, se)
    assert own.total > -60.0  # the fit predicts y, untrained weights do not


@pytest.mark.py312
def test_a_stacked_guide_exports_its_predictive_for_arviz():
    """to_inference_data of the stacked predictive: draws from both
    candidates, a posterior_predictive for ArviZ's checks, the mixture's
    log_q, and its log-likelihood kept out of ArviZ's LOO (approximate_loo
    refuses it)."""
    import arviz as az
    import matplotlib.pyplot as plt

    from numpyro_pvi import diagnostics

    guide = AutoNormal(_model)
    x = jnp.linspace(-1, 1, 5)
    numpyro.handlers.seed(guide, 0)(x, jnp.zeros(5))
    params = {
        "stacked_params": {
            "w_auto_loc": jnp.array([-1.0, 1.0]),
            "w_auto_scale": jnp.array([0.01, 0.01]),
        }
    }
    data = diagnostics.to_inference_data(
        jax.random.PRNGKey(0),
        params,
        _model,
        StackedGuide(guide, [0.5, 0.5]),
        x,
        jnp.zeros(5),
        num_draws=400,
    )
    w = np.asarray(diagnostics.get_group(data, "posterior")["w"]).ravel()
    assert abs(np.mean(w > 0) - 0.5) < 4 * np.sqrt(0.25 / 400)
    log_q = np.asarray(diagnostics.get_group(data, "sample_stats")["log_q"]).ravel()
    np.testing.assert_allclose(
        log_q, _mixture_log_density(w, [0.5, 0.5], [-1.0, 1.0], [0.01, 0.01]), rtol=1e-4
    )
    with pytest.raises(KeyError, match="no group 'log_likelihood'"):
        diagnostics.get_group(data, "log_likelihood")
    assert "y" in diagnostics.get_group(data, "pointwise_log_likelihood")
    assert diagnostics.get_group(data, "posterior_predictive")["y"].shape[-1] == 5
    assert data.attrs["objective"] == "StackedGuide"
    assert "mixture of fits" in data.attrs["guide_density"]
    with pytest.raises(ValueError, match="does not target the Bayesian posterior"):
        diagnostics.approximate_loo(data)
    if not hasattr(az, "plot_ppc_dist"):  # ArviZ 0.2x; 1.x: arviz_plots
        assert np.size(az.plot_ppc(data, num_pp_samples=20)) >= 1
    plt.close("all")
