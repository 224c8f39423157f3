"""Gaussian-mixture PVI: the mixture guide, stratified expectations,
Gauss--Hermite predictive, pruning, and the XOR known answer (Kock et al.)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from conftest import run_particles
from jax import random
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoMultivariateNormal

from numpyro_pvi import PACmELBO, PredictiveELBO, StratifiedELBO, predictive_score
from numpyro_pvi.guides import (
    AutoGaussianMixture,
    fit_gm_pvi,
    linear_predictor_score,
    prune_components,
)
from numpyro_pvi.particles import LOG_LIK, Likelihood, require_iid
from numpyro_pvi.scores import CRPS, EnergyScore, LogScore, QuadraticScore, simulations

SIGMA = 0.5


def linreg(x, y=None, subsample_size=None):
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        numpyro.sample("y", dist.Normal(x[idx] @ beta, SIGMA), obs=y[idx])


def logreg(x, y=None):
    beta = numpyro.sample("beta", dist.Normal(0.0, 2.0).expand([2]).to_event(1))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=x @ beta), obs=y)


def _data(n=12, seed=0):
    kx, ky = random.split(random.PRNGKey(seed))
    x = jnp.column_stack([jnp.ones(n), random.uniform(kx, (n,), minval=-2, maxval=2)])
    y = jnp.sin(2 * x[:, 1]) + SIGMA * random.normal(ky, (n,))
    return x, y


# a fixed 3-component mixture with strongly covariate-dependent weights
LOCS = jnp.array([[0.0, 1.0], [1.0, -1.0], [-1.0, 0.5]])
TRILS = jnp.array(
    [[[0.3, 0.0], [0.1, 0.2]], [[0.5, 0.0], [-0.2, 0.4]], [[0.2, 0.0], [0.0, 0.6]]]
)
GATE = jnp.array([[0.5, 2.0], [-0.5, -2.5]])  # eta_2, eta_3 (eta_1 = 0)


_GUIDES = {}


def _fixed_guide(model, x, *args, gated=True, entropy="mc"):
    """A set-up guide with the fixed mixture above (cached: one SVI.init per
    model, data size and option)."""
    cache_key = (model, x.shape[0], gated, entropy)
    if cache_key not in _GUIDES:
        guide = AutoGaussianMixture(
            model, 3, gating_covariates=x if gated else None, entropy=entropy
        )
        svi = SVI(model, guide, optax.adam(0.1), Trace_ELBO())
        params = svi.get_params(svi.init(random.PRNGKey(0), x, *args))
        _GUIDES[cache_key] = guide, params
    guide, params = _GUIDES[cache_key]
    params = dict(params)
    params.update(auto_locs=LOCS, auto_scale_trils=TRILS)
    if gated:
        params["auto_gate_coefs"] = GATE
    else:
        params["auto_weight_logits"] = jnp.array([0.3, -0.2, 0.1])
    return guide, params


def _exact_log_weights(x, gated=True):
    if not gated:
        return jnp.broadcast_to(
            jax.nn.log_softmax(jnp.array([0.3, -0.2, 0.1])), (x.shape[0], 3)
        )
    eta = jnp.concatenate([jnp.zeros((1, 2)), GATE])
    return jax.nn.log_softmax(x @ eta.T, axis=-1)


def _exact_gaussian_predictive(x, y, log_omega):
    """eq. 9: sum_k w_k(x_i) N(y_i; x_i mu_k, sigma^2 + x_i Sigma_k x_i)."""
    cov = TRILS @ jnp.swapaxes(TRILS, -1, -2)
    mean = x @ LOCS.T
    var = SIGMA**2 + jnp.einsum("np,kpq,nq->nk", x, cov, x)
    comp = dist.Normal(mean, jnp.sqrt(var)).log_prob(y[:, None])
    return jax.nn.logsumexp(log_omega + comp, axis=-1)


def _stratified(key, guide, params, model, x, y, m):
    return _score_terms(key, guide, params, model, x, y, m, LogScore())


# --------------------------------------------------------------------------
# the guide and its density
# --------------------------------------------------------------------------


@pytest.mark.slow
def test_guide_log_density_is_the_mixture_density():
    x, y = _data()
    guide, params = _fixed_guide(linreg, x, y)
    tr = numpyro.handlers.trace(
        numpyro.handlers.substitute(numpyro.handlers.seed(guide, 3), data=params)
    ).get_trace(x, y)
    site = tr["_auto_latent"]
    theta = site["value"]
    mean_w = jax.nn.logsumexp(_exact_log_weights(x), axis=0) - math.log(x.shape[0])
    reference = dist.MixtureSameFamily(
        dist.Categorical(logits=mean_w), dist.MultivariateNormal(LOCS, scale_tril=TRILS)
    )
    np.testing.assert_allclose(
        site["fn"].log_prob(theta), reference.log_prob(theta), rtol=1e-5
    )


@pytest.mark.slow
def test_sample_posterior_with_and_without_covariate():
    x, y = _data()
    guide, params = _fixed_guide(linreg, x, y)
    s = 20000
    row = x[3]
    draws = guide.sample_posterior(
        random.PRNGKey(1), params, sample_shape=(s,), gating_covariate=row
    )["beta"]
    w = jnp.exp(_exact_log_weights(row[None]))[0]
    expected = w @ LOCS
    se = jnp.std(draws, axis=0) / math.sqrt(s)
    assert draws.shape == (s, 2)
    assert jnp.all(jnp.abs(draws.mean(0) - expected) < 5 * se)
    # several rows: one draw per row
    many = guide.sample_posterior(
        random.PRNGKey(2), params, sample_shape=(5,), gating_covariate=x[:4]
    )["beta"]
    assert many.shape == (5, 4, 2)
    # no covariate: the averaged mixture
    plain = guide.sample_posterior(random.PRNGKey(3), params, sample_shape=(s,))
    w_bar = jnp.exp(_exact_log_weights(x)).mean(0)
    se = jnp.std(plain["beta"], axis=0) / math.sqrt(s)
    assert jnp.all(jnp.abs(plain["beta"].mean(0) - w_bar @ LOCS) < 5 * se)


@pytest.mark.slow
def test_huber_entropy_bound():
    x, y = _data()
    guide, params = _fixed_guide(linreg, x, y, gated=False)
    mix = guide.get_posterior(params)
    # one component: -log N(mu; mu, 2 Sigma), below the exact entropy
    one = type(mix)(jnp.zeros(1), LOCS[:1], TRILS[:1])
    logdet = 2 * jnp.sum(jnp.log(jnp.diag(TRILS[0])))
    np.testing.assert_allclose(
        one.huber_entropy_bound(), math.log(4 * math.pi) + 0.5 * logdet, rtol=1e-6
    )
    # three components: a lower bound of the Monte Carlo entropy
    draws = mix.sample(random.PRNGKey(0), (40000,))
    neg_log_q = -jax.jit(mix.log_prob)(draws)
    se = jnp.std(neg_log_q) / math.sqrt(draws.shape[0])
    assert mix.huber_entropy_bound() < jnp.mean(neg_log_q) + 3 * se


# --------------------------------------------------------------------------
# stratified expectations
# --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("gated", [True, False])
def test_stratified_predictive_is_unbiased(gated):
    """mean over keys of sum_k w_k(x_i) (1/M) sum_m p(y_i|theta_km) = eq. 9,
    and so is the mean of its gradient in the gating/weight parameters."""
    x, y = _data()
    guide, params = _fixed_guide(linreg, x, y, gated=gated)
    exact = _exact_gaussian_predictive(x, y, _exact_log_weights(x, gated))
    name = "auto_gate_coefs" if gated else "auto_weight_logits"

    def estimate(p, key):
        t = _stratified(key, guide, p, linreg, x, y, 2)
        return jnp.exp(
            jax.nn.logsumexp(t.log_lik + t.weights.log_predictive, axis=0)
        )  # (n,)

    keys = random.split(random.PRNGKey(5), 1000)
    est = jax.jit(jax.vmap(estimate, (None, 0)))(params, keys)
    mean, se = est.mean(0), est.std(0) / math.sqrt(keys.shape[0])
    z = (mean - jnp.exp(exact)) / se
    assert jnp.max(jnp.abs(z)) < 5, z

    def total(w, key):
        return estimate({**params, name: w}, key).sum()

    grads = jax.jit(jax.vmap(jax.grad(total), (None, 0)))(params[name], keys)

    def exact_total(w):
        if gated:
            eta = jnp.concatenate([jnp.zeros((1, 2)), w])
            log_w = jax.nn.log_softmax(x @ eta.T, axis=-1)
        else:
            log_w = jax.nn.log_softmax(w) * jnp.ones((x.shape[0], 1))
        return jnp.exp(_exact_gaussian_predictive(x, y, log_w)).sum()

    g_exact = jax.grad(exact_total)(params[name])
    z = (grads.mean(0) - g_exact) / (grads.std(0) / math.sqrt(keys.shape[0]))
    assert jnp.max(jnp.abs(z)) < 5, z
    assert jnp.all(jnp.abs(g_exact) > 1e-3)  # the check has power


def test_stratified_weights_follow_the_subsample():
    x, y = _data(n=20)
    guide, params = _fixed_guide(linreg, x, y)
    t = jax.jit(
        lambda key, p: run_particles(
            key,
            p,
            linreg,
            guide,
            (x, y),
            {"subsample_size": 5},
            num_particles=3,
            vectorize_particles_fn=lambda f, xs: jax.vmap(f)(xs),
            requests=(LOG_LIK, "likelihood"),
        )
    )(random.PRNGKey(0), params)
    assert t.log_lik.shape == (9, 5)
    np.testing.assert_allclose(
        jnp.sum(jnp.exp(t.weights.log_predictive), axis=0), 1.0, rtol=1e-5
    )
    np.testing.assert_allclose(jnp.sum(t.weights.particle), 1.0, rtol=1e-5)
    # the rows of log_w are the gating weights of the subsampled observations
    # (identified by their observed values, which are distinct)
    idx = jnp.argmin(jnp.abs(y[None, :] - t.y_obs[:, :1]), axis=1)
    assert len(set(idx.tolist())) == 5
    rows = t.weights.log_predictive.reshape(3, 3, 5)[:, 0, :].T + math.log(3)  # (5, K)
    np.testing.assert_allclose(rows, _exact_log_weights(x)[idx], atol=1e-5)


# --------------------------------------------------------------------------
# Gauss--Hermite path
# --------------------------------------------------------------------------


@pytest.mark.numerics
def test_gauss_hermite_equals_closed_form_gaussian():
    x, y = _data()
    guide, params = _fixed_guide(linreg, x, y)
    closed = linear_predictor_score(
        params, guide, x, y, likelihood="gaussian", noise_scale=SIGMA
    )
    exact = _exact_gaussian_predictive(x, y, _exact_log_weights(x))
    tol = 1e-6 if jax.config.jax_enable_x64 else 1e-5
    np.testing.assert_allclose(closed, exact, atol=tol, rtol=0)

    def gauss_log_lik(eta, y):
        return dist.Normal(eta, SIGMA).log_prob(y)

    quad = linear_predictor_score(
        params, guide, x, y, likelihood=gauss_log_lik, num_nodes=64
    )
    np.testing.assert_allclose(quad, exact, atol=tol, rtol=0)


@pytest.mark.slow
def test_gauss_hermite_logistic_matches_monte_carlo():
    x, y01 = _data()
    y = (y01 > 0).astype(jnp.float32)
    guide, params = _fixed_guide(logreg, x, y)
    quad = linear_predictor_score(params, guide, x, y, likelihood="bernoulli")
    m = 4000
    t = jax.jit(lambda key, p: _stratified(key, guide, p, logreg, x, y, m))(
        random.PRNGKey(0), params
    )
    p = jnp.exp(t.log_lik).reshape(3, m, -1)  # (K, M, n)
    w = jnp.exp(
        t.weights.log_predictive.reshape(3, m, -1)[:, 0, :] + math.log(m)
    )  # (K, n)
    est = jnp.sum(w * p.mean(1), axis=0)
    se = jnp.sqrt(jnp.sum(w**2 * p.var(1), axis=0) / m)
    z = (est - jnp.exp(quad)) / se
    assert jnp.max(jnp.abs(z)) < 5, z
    # the package's held-out scorer goes through the same stratified draws
    lps = predictive_score(random.PRNGKey(1), params, logreg, guide, x, y)
    np.testing.assert_allclose(lps.score, quad, atol=0.05)


# --------------------------------------------------------------------------
# contract and bad input
# --------------------------------------------------------------------------

# Trace_ELBO cannot learn the weights and refuses the mixture
# (tests/test_stratified.py); StratifiedELBO is its VI baseline
LOSSES = [
    StratifiedELBO(num_particles=2),
    PredictiveELBO("log", num_particles=2, regularizer="posterior", lam=0.5),
    PACmELBO(num_particles=2, beta=0.5),
    PredictiveELBO("log", num_particles=1, regularizer=None, vectorize_particles=False),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "gated, entropy, losses",
    [(True, "mc", LOSSES), (False, "huber", LOSSES[1:2])],
    ids=["gated-mc", "plain-huber"],
)
def test_every_objective_runs_under_jit(gated, entropy, losses):
    x, y = _data()
    guide, params = _fixed_guide(linreg, x, y, gated=gated, entropy=entropy)
    name = "auto_gate_coefs" if gated else "auto_weight_logits"
    for loss in losses:

        def f(p, loss=loss):
            return loss.loss(random.PRNGKey(0), p, linreg, guide, x, y)

        value, grads = jax.jit(jax.value_and_grad(f))(params)
        assert jnp.isfinite(value), loss
        assert all(jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads))
        assert jnp.any(jnp.abs(grads[name]) > 0), loss  # stratified: weights learn


@pytest.mark.slow
def test_bad_input():
    x, y = _data()
    for k in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="num_components"):
            AutoGaussianMixture(linreg, k)
    with pytest.raises(ValueError, match="gating_covariates"):
        AutoGaussianMixture(linreg, 2, gating_covariates=x[:, 0])
    with pytest.raises(ValueError, match="entropy"):
        AutoGaussianMixture(linreg, 2, entropy="exact")
    with pytest.raises(ValueError, match="init_scale"):
        AutoGaussianMixture(linreg, 2, init_scale=0.0)
    # covariates not aligned with the data plate
    guide = AutoGaussianMixture(linreg, 2, gating_covariates=x[:-1])
    loss = PredictiveELBO(num_particles=2)
    svi = SVI(linreg, guide, optax.adam(0.1), loss)
    params = svi.get_params(svi.init(random.PRNGKey(0), x, y))
    with pytest.raises(ValueError, match="rows but the data plate 'data'"):
        loss.loss(random.PRNGKey(0), params, linreg, guide, x, y)
    # a score without a stratified estimator, and the rejection estimator
    guide, params = _fixed_guide(linreg, x, y)

    class PlainLogScore(LogScore):  # an estimator for i.i.d. draws only
        def estimate(self, terms):
            require_iid(terms, "PlainLogScore")
            return super().estimate(terms)

    for bad in (
        PredictiveELBO(PlainLogScore(), num_particles=2),
        PredictiveELBO(
            "log", log_score_estimator="rejection", likelihood_bound=1.0, lam=0.0
        ),
    ):
        with pytest.raises(NotImplementedError, match="stratified"):
            bad.loss(random.PRNGKey(0), params, linreg, guide, x, y)
    with pytest.raises(ValueError, match="noise_scale"):
        linear_predictor_score(params, guide, x, y, likelihood="gaussian")
    with pytest.raises(ValueError, match="not a latent site"):
        linear_predictor_score(
            params, guide, x, y, likelihood="bernoulli", site="gamma"
        )
    with pytest.raises(ValueError, match="no gating_covariates"):
        _fixed_guide(linreg, x, y, gated=False)[0].sample_posterior(
            random.PRNGKey(0), params, gating_covariate=x[0]
        )


# --------------------------------------------------------------------------
# pruning
# --------------------------------------------------------------------------


@pytest.mark.slow
def test_pruning_keeps_argmax_components_and_renormalises():
    x, y = _data(n=40)
    guide, params = _fixed_guide(linreg, x, y)
    # make component 2 (index 1) never the most probable: very negative bias
    params["auto_gate_coefs"] = GATE.at[0].set(jnp.array([-10.0, 0.0]))
    log_w = guide.component_log_weights(params)
    winners = set(np.unique(np.argmax(log_w, axis=1)).tolist())
    assert winners == {0, 2}
    new_guide, new_params, kept = prune_components(
        random.PRNGKey(0), params, linreg, guide, x, y
    )
    assert kept.tolist() == [0, 2] and new_guide.num_components == 2
    # initialise the new guide with the pruned parameters and compare weights
    svi = SVI(linreg, new_guide, optax.adam(0.1), Trace_ELBO())
    state = svi.init(random.PRNGKey(0), x, y, init_params=new_params)
    new_log_w = new_guide.component_log_weights(svi.get_params(state))
    renorm = jax.nn.log_softmax(log_w[:, kept], axis=-1)
    np.testing.assert_allclose(new_log_w, renorm, atol=1e-5)
    np.testing.assert_allclose(
        svi.get_params(state)["auto_locs"], LOCS[kept], atol=1e-6
    )


# --------------------------------------------------------------------------
# known answer: the XOR task of Kock et al. (section 4.1)
# --------------------------------------------------------------------------


def _xor(key, n):
    """x uniform on [-2, 2]^2; y = 1 in quadrant 1, 0 in quadrant 3, a fair
    coin in quadrants 2 and 4. Rows (1, x1, x2)."""
    kx, ky = random.split(key)
    x = random.uniform(kx, (n, 2), minval=-2.0, maxval=2.0)
    q1 = (x[:, 0] > 0) & (x[:, 1] > 0)
    q3 = (x[:, 0] < 0) & (x[:, 1] < 0)
    coin = random.bernoulli(ky, 0.5, (n,))
    y = jnp.where(q1, 1, jnp.where(q3, 0, coin)).astype(jnp.float32)
    return jnp.column_stack([jnp.ones(n), x]), y


def xor_model(X, y=None):
    beta = numpyro.sample("beta", dist.Normal(0.0, 5.0).expand([3]).to_event(1))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ beta), obs=y)


@pytest.fixture(scope="module")
def xor_fits():
    X, y = _xor(random.PRNGKey(0), 300)
    X_test, y_test = _xor(random.PRNGKey(1), 2000)
    vi_guide = AutoMultivariateNormal(xor_model)
    vi = SVI(xor_model, vi_guide, optax.adam(0.05), Trace_ELBO()).run(
        random.PRNGKey(2), 400, X, y, progress_bar=False
    )
    lpd_vi = predictive_score(
        random.PRNGKey(3), vi.params, xor_model, vi_guide, X_test, y_test, num_draws=500
    ).score
    fits, lpds = {}, {}
    for lam in (0.01, 100.0):
        guide = AutoGaussianMixture(xor_model, 5, gating_covariates=X)
        loss = PredictiveELBO(num_particles=2, regularizer="posterior", lam=lam)
        fits[lam] = fit_gm_pvi(
            random.PRNGKey(4),
            xor_model,
            guide,
            optax.adam(0.05),
            loss,
            X,
            y,
            num_steps=400,
            prune_every=100,
        )
        lpds[lam] = linear_predictor_score(
            fits[lam].params,
            fits[lam].guide,
            X_test,
            y_test,
            likelihood="bernoulli",
            gating_covariates=X_test,
        )
    return fits, lpds, lpd_vi


@pytest.mark.slow
def test_xor_small_beta_keeps_four_components_and_beats_posterior(xor_fits):
    fits, lpds, lpd_vi = xor_fits
    fit = fits[0.01]
    assert fit.history[0] < 5 and fit.num_components == 4, fit.history
    # held-out log predictive density: paired difference beyond 5 SE
    diff = lpds[0.01] - lpd_vi
    se = jnp.std(diff) / math.sqrt(diff.shape[0])
    assert diff.mean() > 5 * se, (diff.mean(), se)


@pytest.mark.slow
def test_xor_large_beta_approaches_posterior_predictive(xor_fits):
    fits, lpds, lpd_vi = xor_fits
    gain = lpds[0.01].mean() - lpd_vi.mean()
    assert abs(lpds[100.0].mean() - lpd_vi.mean()) < 0.25 * gain
    assert fits[100.0].num_components < 4


# --------------------------------------------------------------------------
# stratified CRPS, energy and quadratic scores
# --------------------------------------------------------------------------


def _normal_abs_mean(mu, s):
    """E|N(mu, s^2)| = s sqrt(2/pi) exp(-mu^2 / 2 s^2) + mu (1 - 2 Phi(-mu/s))."""
    phi = jax.scipy.stats.norm.cdf(-mu / s)
    return s * jnp.sqrt(2 / jnp.pi) * jnp.exp(-0.5 * (mu / s) ** 2) + mu * (1 - 2 * phi)


def _exact_mixture_crps(x, y, log_omega):
    """-E|X - y| + E|X - X'| / 2 for the Gaussian-mixture predictive (eq. 9)."""
    cov = TRILS @ jnp.swapaxes(TRILS, -1, -2)
    mean = x @ LOCS.T  # (n, K)
    var = SIGMA**2 + jnp.einsum("np,kpq,nq->nk", x, cov, x)
    w = jnp.exp(log_omega)
    obs = jnp.sum(w * _normal_abs_mean(mean - y[:, None], jnp.sqrt(var)), -1)
    pair = _normal_abs_mean(
        mean[:, :, None] - mean[:, None, :], jnp.sqrt(var[:, :, None] + var[:, None, :])
    )
    return -obs + 0.5 * jnp.einsum("nk,nkl,nl->n", w, pair, w)


@pytest.mark.slow
@pytest.mark.parametrize("m", [2, 5])
def test_stratified_closed_form_crps_is_unbiased(m):
    """The closed form of the Normal likelihood under stratified draws (each
    draw of a component paired with the next draw of every component): mean
    over keys = closed-form CRPS of the mixture predictive, with less variance
    than the simulated derangement of the same pairs."""
    x, y = _data()
    guide, params = _fixed_guide(linreg, x, y)
    exact = _exact_mixture_crps(x, y, _exact_log_weights(x))
    closed, simulated = CRPS(estimator="closed-form"), CRPS(estimator="derangement")

    def estimate(key):
        t = _score_terms(key, guide, params, linreg, x, y, m, closed)
        return closed.estimate(t), simulated.estimate(t)

    keys = random.split(random.PRNGKey(9), 2000)
    est, sim = jax.jit(jax.vmap(estimate))(keys)
    se = est.std(0) / math.sqrt(keys.shape[0])
    z = (est.mean(0) - exact) / se
    assert jnp.max(jnp.abs(z)) < 4.5, z
    assert jnp.all(est.std(0) < sim.std(0))
    # power: the mixture with equal weights instead of the gating's is many
    # standard errors away
    log_w = _exact_log_weights(x)
    equal = _exact_mixture_crps(x, y, jnp.full_like(log_w, -math.log(log_w.shape[1])))
    assert jnp.max(jnp.abs(equal - exact) / se) > 10


def _score_terms(key, guide, params, model, x, y, m, score):
    return run_particles(
        key,
        params,
        model,
        guide,
        (x, y),
        {},
        num_particles=m,
        vectorize_particles_fn=lambda f, xs: jax.vmap(f)(xs),
        requests=score.requires,
    )


@pytest.mark.numerics
@pytest.mark.parametrize("m", [2, 5])
@pytest.mark.optimized  # run time dominates (benchmarks/RESULTS.md)
def test_stratified_crps_and_energy_are_unbiased(m):
    """Mean over keys of the stratified CRPS = closed-form CRPS of the mixture
    predictive; the 1-D energy score with beta = 1 is the same estimate with
    each estimator (by default the CRPS's closed form, a Normal likelihood)."""
    x, y = _data()
    guide, params = _fixed_guide(linreg, x, y)
    exact = _exact_mixture_crps(x, y, _exact_log_weights(x))
    crps, energy = CRPS(estimator="all-pairs"), EnergyScore(1.0, estimator="all-pairs")

    def estimate(key):
        t = _score_terms(key, guide, params, linreg, x, y, m, crps)
        return (
            crps.estimate(t),
            energy.estimate(t),
            CRPS().estimate(t) - EnergyScore(1.0).estimate(t),
            t.weights.log_predictive,
            simulations(t)[0][..., 0],
        )

    keys = random.split(random.PRNGKey(7), 2000)
    est, est_energy, auto_difference, log_w, xs = jax.jit(jax.vmap(estimate))(keys)
    tol = 1e-8 if jax.config.jax_enable_x64 else 2e-5
    np.testing.assert_allclose(est_energy, est, atol=tol, rtol=0)
    np.testing.assert_array_equal(auto_difference, 0.0)
    mean, se = est.mean(0), est.std(0) / math.sqrt(keys.shape[0])
    z = (mean - exact) / se
    assert jnp.max(jnp.abs(z)) < 4.5, z
    # the check has power: the i.i.d.-style plug-in of E|X - X'| (all pairs
    # weighted v_i v_j, no within-component correction) is biased
    assert log_w.shape == (keys.shape[0], 3 * m, x.shape[0])
    v = jnp.exp(log_w)  # (keys, K M, n)
    diff = jnp.abs(xs[:, :, None] - xs[:, None, :])
    plug = -jnp.sum(v * jnp.abs(xs - y), 1) + 0.5 * jnp.einsum(
        "sin,sijn,sjn->sn", v, diff, v
    )
    z_plug = (plug.mean(0) - exact) / (plug.std(0) / math.sqrt(keys.shape[0]))
    assert jnp.max(jnp.abs(z_plug)) > 10, z_plug


def _exact_bernoulli_quadratic(guide, params, x, y):
    """2 P(y) - P(0)^2 - P(1)^2 of the mixture predictive (Gauss--Hermite)."""

    def prob(v):
        return jnp.exp(
            linear_predictor_score(params, guide, x, v, likelihood="bernoulli")
        )

    p1 = prob(jnp.ones_like(y))
    return 2 * prob(y) - p1**2 - (1 - p1) ** 2


def _with_point_mass(t):
    """``t`` with a second observed site per observation, a point mass at 0
    on the support {0, 1}."""
    site_lik = t.likelihood
    m, b = site_lik.keys.shape[0], site_lik.values[0].shape[0]
    return t._replace(
        likelihood=Likelihood(
            (*site_lik.laws, dist.Bernoulli(probs=jnp.zeros((m, b)))),
            (*site_lik.first, dist.Bernoulli(probs=jnp.zeros(b))),
            (*site_lik.values, jnp.zeros(b)),
            site_lik.keys,
            site_lik.index,
            site_lik.plate,
            (*site_lik.names, "point"),
            site_lik.reparam,
        )
    )


def test_stratified_quadratic_is_unbiased():
    x, y01 = _data()
    y = (y01 > 0).astype(jnp.result_type(float))
    guide, params = _fixed_guide(logreg, x, y)
    exact = _exact_bernoulli_quadratic(guide, params, x, y)
    score = QuadraticScore()

    def estimate(key):
        t = _score_terms(key, guide, params, logreg, x, y, 2, score)
        # several components per observation: appending a component with a
        # point-mass pmf leaves every overlap, so the score, unchanged
        return score.estimate(t), score.estimate(_with_point_mass(t))

    keys = random.split(random.PRNGKey(8), 2000)
    est, two = jax.jit(jax.vmap(estimate))(keys)
    np.testing.assert_allclose(two, est, atol=1e-5, rtol=1e-5)
    z = (est.mean(0) - exact) / (est.std(0) / math.sqrt(keys.shape[0]))
    assert jnp.max(jnp.abs(z)) < 4.5, z


@pytest.mark.parametrize("name, model", [("crps", linreg), ("quadratic", logreg)])
def test_stratified_scores_train_the_mixture_weights_under_jit(name, model):
    x, y01 = _data()
    y = y01 if model is linreg else (y01 > 0).astype(y01.dtype)
    guide, params = _fixed_guide(model, x, y)
    loss = PredictiveELBO(name, num_particles=2, regularizer="posterior", lam=0.5)

    def f(p):
        return loss.loss(random.PRNGKey(0), p, model, guide, x, y)

    value, grads = jax.jit(jax.value_and_grad(f))(params)
    assert jnp.isfinite(value)
    assert all(jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads))
    assert jnp.any(jnp.abs(grads["auto_gate_coefs"]) > 0)
    assert jnp.any(jnp.abs(grads["auto_locs"]) > 0)
