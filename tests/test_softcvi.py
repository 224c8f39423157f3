"""SoftCVIELBO and SNISForwardKL: exactness at the posterior, the guide
density at fixed draws for every supported guide, recovery, bad input."""

import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from conftest import X64
from jax import random
from numpyro.handlers import scale, seed, substitute, trace
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import (
    AutoBNAFNormal,
    AutoDelta,
    AutoDiagonalNormal,
    AutoIAFNormal,
    AutoLaplaceApproximation,
    AutoLowRankMultivariateNormal,
    AutoMultivariateNormal,
    AutoNormal,
)
from scipy import stats

from numpyro_pvi import SNISForwardKL, SoftCVIELBO
from numpyro_pvi._trace.tracing import guide_log_density, guide_sample_values
from numpyro_pvi.objectives.contrastive import fixed_draw_terms

# float64 reaches ~1e-13; float32 rounding of log p - log q (|log p| ~ 30)
# leaves ~1e-5 relative noise in the labels.
ZERO_TOL = 1e-5 if X64 else 2e-3

# --------------------------------------------------------------------------
# conjugate Bayesian linear regression with known noise
# --------------------------------------------------------------------------

SIGMA, TAU = 0.5, 1.5


def linreg(x, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, TAU).expand([x.shape[1]]).to_event(1))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(x @ w, SIGMA), obs=y)


def linreg_posterior(x, y, sigma=SIGMA, tau=TAU):
    """Exact posterior mean, covariance and log evidence."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    precision = x.T @ x / sigma**2 + np.eye(x.shape[1]) / tau**2
    cov = np.linalg.inv(precision)
    mean = cov @ x.T @ y / sigma**2
    marginal = sigma**2 * np.eye(len(y)) + tau**2 * x @ x.T
    log_z = stats.multivariate_normal(np.zeros(len(y)), marginal).logpdf(y)
    return mean, cov, log_z


@pytest.fixture(scope="module")
def regression():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 3))
    y = x @ np.array([1.0, -1.0, 0.5]) + SIGMA * rng.normal(size=20)
    mean, cov, log_z = linreg_posterior(x, y)
    guide = AutoMultivariateNormal(linreg)
    seed(guide, 0)(jnp.asarray(x), jnp.asarray(y))  # sets up the prototype
    exact = {
        "auto_loc": jnp.asarray(mean),
        "auto_scale_tril": jnp.asarray(np.linalg.cholesky(cov)),
    }
    return jnp.asarray(x), jnp.asarray(y), guide, exact, log_z


def _grads(loss, params, model, guide, *args, num_keys=3):
    """Gradients of ``loss`` at ``params`` for ``num_keys`` keys (run eagerly:
    for these small models op-by-op dispatch is cheaper than compiling)."""
    keys = random.split(random.PRNGKey(3), num_keys)
    return [
        jax.grad(lambda p, k=k: loss.loss(k, p, model, guide, *args))(params)
        for k in keys
    ]


def _max_abs(tree):
    return max(float(jnp.max(jnp.abs(v))) for v in jax.tree.leaves(tree))


@pytest.mark.slow
@pytest.mark.numerics
def test_log_joint_minus_log_q_is_log_evidence_at_exact_posterior(regression):
    x, y, guide, exact, log_z = regression
    draws = fixed_draw_terms(
        SoftCVIELBO(16), random.PRNGKey(0), exact, linreg, guide, (x, y), {}
    )
    # log p(θ, y) - log q(θ) = log p(y) for every draw: checks the joint
    # (prior + likelihood) and the guide density against closed forms
    rtol = 1e-10 if X64 else 1e-5
    np.testing.assert_allclose(draws.log_joint - draws.log_q, log_z, rtol=rtol)
    np.testing.assert_allclose(draws.log_q_phi, draws.log_q, rtol=rtol)
    assert np.ptp(np.asarray(draws.log_q)) > 1.0  # the draws differ


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize(
    "loss",
    [
        SoftCVIELBO(8, 0.0),
        SoftCVIELBO(8, 0.75),
        SoftCVIELBO(8, 1.0),
        SoftCVIELBO(8, 0.5, negative="posterior"),
        SNISForwardKL(8, low_variance=True),
    ],
    ids=["softcvi-0", "softcvi-0.75", "softcvi-1", "softcvi-post-0.5", "snis-lv"],
)
def test_zero_gradient_at_exact_posterior(regression, loss):
    x, y, guide, exact, _ = regression
    grads = _grads(loss, exact, linreg, guide, x, y)
    assert _max_abs(grads) < ZERO_TOL


@pytest.mark.optimized  # run time dominates (benchmarks/RESULTS.md)
def test_plain_snis_gradient_is_not_zero_at_exact_posterior(regression):
    x, y, guide, exact, _ = regression
    grads = _grads(SNISForwardKL(8), exact, linreg, guide, x, y)
    # it is the average score -mean_k ∇ log q(θ_k), of order one here
    assert _max_abs(grads) > 0.1


@pytest.mark.slow
def test_softcvi_alpha_one_gradient_equals_low_variance_snis(regression):
    x, y, guide, exact, _ = regression
    params = {
        "auto_loc": exact["auto_loc"] + 0.05,
        "auto_scale_tril": 1.5 * exact["auto_scale_tril"],
    }
    soft = _grads(SoftCVIELBO(8, 1.0), params, linreg, guide, x, y)
    snis = _grads(SNISForwardKL(8, low_variance=True), params, linreg, guide, x, y)
    plain = _grads(SNISForwardKL(8), params, linreg, guide, x, y)
    assert _max_abs(soft) > 1e-2  # away from the optimum
    for a, b in zip(jax.tree.leaves(soft), jax.tree.leaves(snis), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    # the control variate changes the gradient, not the value
    diff = jax.tree.map(lambda a, b: a - b, plain, snis)
    assert _max_abs(diff) > 1e-2
    lv, pl = SNISForwardKL(8, low_variance=True), SNISForwardKL(8)
    key = random.PRNGKey(0)
    np.testing.assert_allclose(
        lv.loss(key, params, linreg, guide, x, y),
        pl.loss(key, params, linreg, guide, x, y),
        rtol=1e-6,
    )


# --------------------------------------------------------------------------
# log q_φ at fixed draws, for every guide with a density
# --------------------------------------------------------------------------


def small_model(y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(w[0] + w[1], s), obs=y)


Y_SMALL = jnp.array([0.3, -0.5, 1.2, 0.1, 0.7])


def _init_params(model, guide, *args):
    svi = SVI(model, guide, optax.adam(1e-2), Trace_ELBO())
    return svi.get_params(svi.init(random.PRNGKey(1), *args))


def _autonormal_log_q(guide, params, tr):
    """Closed form: Normal over unconstrained values, minus log|ds/du| = u."""
    w, s = tr["w"]["value"], tr["s"]["value"]
    log_q = dist.Normal(params["w_auto_loc"], params["w_auto_scale"]).log_prob(w)
    log_s = jnp.log(s)
    log_q_s = dist.Normal(params["s_auto_loc"], params["s_auto_scale"]).log_prob(log_s)
    return jnp.sum(log_q) + log_q_s - log_s


def _autocontinuous_log_q(guide, params, tr):
    """Closed form from numpyro's ``get_posterior`` on the unconstrained latent."""
    latent = tr["_auto_latent"]["value"]
    log_q = jnp.sum(guide.get_posterior(params).log_prob(latent))
    return log_q - jnp.log(tr["s"]["value"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "guide_class, closed_form",
    [
        (AutoNormal, _autonormal_log_q),
        (AutoDiagonalNormal, _autocontinuous_log_q),
        (AutoMultivariateNormal, _autocontinuous_log_q),
        (AutoLowRankMultivariateNormal, _autocontinuous_log_q),
        (AutoIAFNormal, _autocontinuous_log_q),
    ],
)
def test_guide_log_density_at_fixed_draws(guide_class, closed_form):
    guide = guide_class(small_model)
    params0 = _init_params(small_model, guide, Y_SMALL)
    tr = trace(substitute(seed(guide, 0), data=params0)).get_trace(Y_SMALL)
    log_q_draw = sum(
        jnp.sum(site["fn"].log_prob(site["value"], site["intermediates"]))
        if site["intermediates"]
        else jnp.sum(site["fn"].log_prob(site["value"]))
        for site in tr.values()
        if site["type"] == "sample"
    )

    def fixed(p):
        draws = guide_sample_values(guide, tr)
        return guide_log_density(guide, p, draws, random.PRNGKey(5), (Y_SMALL,), {})

    def closed(p):
        return closed_form(guide, p, tr)

    def objective(p):
        return SoftCVIELBO(4).loss(random.PRNGKey(2), p, small_model, guide, Y_SMALL)

    @jax.jit  # one program for every evaluation below
    def evaluate(params0, params1):
        return (
            fixed(params0),
            jax.value_and_grad(fixed)(params1),
            jax.value_and_grad(closed)(params1),
            jax.value_and_grad(objective)(params0),
        )

    params1 = jax.tree.map(lambda v: 1.1 * v, params0)
    at_draw, (v_fixed, g_fixed), (v_closed, g_closed), (loss, grads) = evaluate(
        params0, params1
    )
    # at the parameters of the draw: the density of the sampling pass (for
    # IAF that pass uses the forward transform, the evaluation its inverse)
    np.testing.assert_allclose(at_draw, log_q_draw, rtol=1e-5, atol=1e-5)
    # elsewhere, value and gradient in φ at the same draws: the closed form
    np.testing.assert_allclose(v_fixed, v_closed, rtol=1e-5, atol=1e-5)
    assert _max_abs(g_closed) > 1e-3
    for a, b in zip(jax.tree.leaves(g_fixed), jax.tree.leaves(g_closed), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    # and the objective gives a finite loss and gradient
    assert jnp.isfinite(loss) and all(
        bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads)
    )


# --------------------------------------------------------------------------
# hand-written guides: hierarchical q(z2 | z1), and a discrete latent
# --------------------------------------------------------------------------

Y_HIER = jnp.array([0.8, 1.9, 1.1])


def hier_model(y):
    z1 = numpyro.sample("z1", dist.Normal(0.0, 1.0))
    z2 = numpyro.sample("z2", dist.Normal(z1, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(z2, 1.0), obs=y)


def hier_guide(y):
    a = numpyro.param("a", 0.0)
    s1 = numpyro.param("s1", 1.0, constraint=dist.constraints.positive)
    b = numpyro.param("b", 0.0)
    c = numpyro.param("c", 0.0)
    s2 = numpyro.param("s2", 1.0, constraint=dist.constraints.positive)
    z1 = numpyro.sample("z1", dist.Normal(a, s1))
    numpyro.sample("z2", dist.Normal(b + c * z1, s2))


def hier_exact(y):
    """q(z1) q(z2 | z1) factorisation of the Gaussian posterior, and log p(y)."""
    n = len(y)
    # joint covariance of (z1, z2, y_1..y_n)
    cov = np.zeros((n + 2, n + 2))
    cov[0, 0], cov[0, 1], cov[1, 1] = 1.0, 1.0, 2.0
    cov[0, 2:], cov[1, 2:] = 1.0, 2.0
    cov[2:, 2:] = 2.0 + np.eye(n)
    cov = np.triu(cov) + np.triu(cov, 1).T
    syy, sxy = cov[2:, 2:], cov[:2, 2:]
    mean = sxy @ np.linalg.solve(syy, y)
    post = cov[:2, :2] - sxy @ np.linalg.solve(syy, sxy.T)
    c = post[1, 0] / post[0, 0]
    params = {
        "a": mean[0],
        "s1": np.sqrt(post[0, 0]),
        "b": mean[1] - c * mean[0],
        "c": c,
        "s2": np.sqrt(post[1, 1] - c * post[1, 0]),
    }
    log_z = stats.multivariate_normal(np.zeros(n), syy).logpdf(y)
    return {k: jnp.asarray(v) for k, v in params.items()}, log_z


Y_MIX = jnp.array([1.7, 2.4, 0.9, 2.2])


def mix_model(y):
    z = numpyro.sample("z", dist.Bernoulli(0.3))
    w = numpyro.sample("w", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(w + 2.0 * z, 1.0), obs=y)


def mix_guide(y):
    p = numpyro.param("p", 0.5, constraint=dist.constraints.unit_interval)
    a = numpyro.param("a", 0.0)
    c = numpyro.param("c", 0.0)
    s = numpyro.param("s", 1.0, constraint=dist.constraints.positive)
    z = numpyro.sample("z", dist.Bernoulli(p))
    numpyro.sample("w", dist.Normal(a + c * z, s))


def mix_exact(y):
    """Exact posterior: P(z=1 | y), w | z, y ~ N((Σy - 2zn)/(n+1), 1/(n+1))."""
    y, n = np.asarray(y, np.float64), len(y)
    marginal = np.eye(n) + np.ones((n, n))
    log_ev = [
        math.log(prior)
        + stats.multivariate_normal(2.0 * z * np.ones(n), marginal).logpdf(y)
        for z, prior in ((0, 0.7), (1, 0.3))
    ]
    log_z = np.logaddexp(*log_ev)
    params = {
        "p": math.exp(log_ev[1] - log_z),
        "a": y.sum() / (n + 1),
        "c": -2.0 * n / (n + 1),
        "s": 1.0 / math.sqrt(n + 1),
    }
    return {k: jnp.asarray(v) for k, v in params.items()}, log_z


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize(
    "model, guide, exact, y",
    [
        (hier_model, hier_guide, hier_exact, Y_HIER),
        (mix_model, mix_guide, mix_exact, Y_MIX),
    ],
    ids=["hierarchical", "discrete"],
)
def test_hand_written_guides_at_exact_posterior(model, guide, exact, y):
    params, log_z = exact(np.asarray(y))
    draws = fixed_draw_terms(
        SoftCVIELBO(16), random.PRNGKey(0), params, model, guide, (y,), {}
    )
    rtol = 1e-10 if X64 else 1e-5
    np.testing.assert_allclose(draws.log_joint - draws.log_q, log_z, rtol=rtol)
    np.testing.assert_allclose(draws.log_q_phi, draws.log_q, rtol=rtol)
    for loss in (SoftCVIELBO(8, 0.75), SNISForwardKL(8, low_variance=True)):
        assert _max_abs(_grads(loss, params, model, guide, y, num_keys=2)) < ZERO_TOL
    assert _max_abs(_grads(SNISForwardKL(8), params, model, guide, y)) > 0.1


def test_discrete_guide_fit_recovers_posterior_probability():
    params, _ = mix_exact(np.asarray(Y_MIX))
    svi = SVI(mix_model, mix_guide, optax.adam(2e-2), SoftCVIELBO(16, 0.75))
    result = svi.run(random.PRNGKey(0), 600, Y_MIX, progress_bar=False)
    fitted = result.params
    # the label noise of K = 16 draws leaves a small stationary spread
    assert abs(float(fitted["p"]) - float(params["p"])) < 0.05
    assert abs(float(fitted["a"]) - float(params["a"])) < 0.1
    assert abs(float(fitted["c"]) - float(params["c"])) < 0.2


# --------------------------------------------------------------------------
# subsampling and handler scales enter the log joint
# --------------------------------------------------------------------------


def test_log_joint_honours_subsampling_and_handler_scale():
    y = jnp.full((10,), 0.7)  # equal values: any subsample gives the same estimate

    def model(y):
        theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
        with scale(scale=2.0), numpyro.plate("data", 10, subsample_size=4):
            numpyro.sample("y", dist.Normal(0.0, 1.0), obs=y[:4])
        numpyro.sample("t", dist.Normal(theta, 1.0), obs=0.0)

    def guide(y):
        numpyro.sample("theta", dist.Normal(0.0, 1.0))

    draws = fixed_draw_terms(
        SoftCVIELBO(4), random.PRNGKey(0), {}, model, guide, (y,), {}
    )
    # log p(θ) - log q(θ) = 0; the data part is 2 * (10 / 4) * 4 * log N(0.7)
    # and the site outside any plate adds log N(0; θ, 1)
    data = 2.0 * 10 * float(dist.Normal(0.0, 1.0).log_prob(0.7))
    rest = draws.log_joint - draws.log_q - data
    theta_sq = -2.0 * (rest + 0.5 * math.log(2 * math.pi))
    assert np.all(np.asarray(theta_sq) >= -1e-4)
    # θ² recovered from the extra term equals θ² recovered from log q(θ)
    theta_sq_q = -2.0 * (draws.log_q + 0.5 * math.log(2 * math.pi))
    np.testing.assert_allclose(theta_sq, theta_sq_q, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [-0.1, 1.5, float("nan")])
def test_alpha_outside_unit_interval(alpha):
    with pytest.raises(ValueError, match="alpha must be finite and in"):
        SoftCVIELBO(8, alpha)


def test_bad_hyperparameters():
    with pytest.raises(TypeError, match="alpha"):
        SoftCVIELBO(8, True)
    with pytest.raises(TypeError, match="alpha"):
        SoftCVIELBO(8, "big")
    for bad in (1, 0, 2.5, True):
        with pytest.raises(ValueError, match="num_particles must be an integer >= 2"):
            SoftCVIELBO(bad)
        with pytest.raises(ValueError, match="num_particles must be an integer >= 2"):
            SNISForwardKL(bad)
    with pytest.raises(ValueError, match="negative must be one of"):
        SoftCVIELBO(negative="prior")
    with pytest.raises(TypeError, match="low_variance"):
        SNISForwardKL(8, low_variance=1)
    with pytest.raises(TypeError):
        SNISForwardKL(8, True)  # keyword-only
    with pytest.raises(TypeError):
        SoftCVIELBO(8, 0.5, "posterior")  # keyword-only


@pytest.mark.parametrize(
    "guide_class", [AutoBNAFNormal, AutoDelta, AutoLaplaceApproximation]
)
@pytest.mark.parametrize("loss", [SoftCVIELBO(), SNISForwardKL()])
def test_guides_without_density_are_rejected(guide_class, loss):
    guide = guide_class(small_model)
    with pytest.raises(ValueError, match=guide_class.__name__) as err:
        loss.loss(random.PRNGKey(0), {}, small_model, guide, Y_SMALL)
    assert "AutoMultivariateNormal" in str(err.value)
    assert "AutoIAFNormal" in str(err.value)


def test_hand_written_point_mass_guide_is_rejected():
    def guide(y):
        numpyro.sample("w", dist.Delta(jnp.zeros(2)).to_event(1))
        numpyro.sample("s", dist.Delta(1.0))

    with pytest.raises(ValueError, match="point-mass"):
        SoftCVIELBO().loss(random.PRNGKey(0), {}, small_model, guide, Y_SMALL)


# --------------------------------------------------------------------------
# recovery: 50-dimensional linear regression with an analytic posterior
# --------------------------------------------------------------------------


@pytest.mark.slow
def test_recovery_50d_regression_means_and_coverage():
    """Mean-field fits of a correlated 50-d Gaussian posterior. Trace_ELBO
    under-disperses (reverse KL); SoftCVI(α = 0.75), refining the same guide
    from the Trace_ELBO fit, spreads it towards the marginals. Coverage is
    the exact posterior mass inside q's central intervals, averaged over
    coordinates."""
    dim, n = 50, 100
    rng = np.random.default_rng(0)
    shared = rng.normal(size=(n, 1))  # a common factor correlates the covariates
    x = (rng.normal(size=(n, dim)) + 0.5 * shared) / math.sqrt(1.25)
    y = x @ rng.normal(size=dim) + rng.normal(size=n)
    mean, cov, _ = linreg_posterior(x, y, sigma=1.0, tau=1.0)
    sd = np.sqrt(np.diag(cov))

    def model(x, y):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([dim]).to_event(1))
        with numpyro.plate("data", n):
            numpyro.sample("y", dist.Normal(x @ w, 1.0), obs=y)

    x, y = jnp.asarray(x), jnp.asarray(y)
    guide = AutoDiagonalNormal(model)
    elbo = SVI(
        model,
        guide,
        optax.adam(optax.exponential_decay(2e-2, 1500, 0.1)),
        Trace_ELBO(4),
    ).run(random.PRNGKey(1), 1500, x, y, progress_bar=False)
    svi = SVI(model, guide, optax.adam(3e-3), SoftCVIELBO(8, 0.75))
    state = svi.init(random.PRNGKey(2), x, y, init_params=elbo.params)
    soft = svi.run(random.PRNGKey(2), 1000, x, y, progress_bar=False, init_state=state)

    levels = np.array([0.5, 0.8, 0.95])
    half = stats.norm.ppf(0.5 + levels / 2)[:, None]

    def coverage(params):
        loc, scale = np.asarray(params["auto_loc"]), np.asarray(params["auto_scale"])
        hi = stats.norm.cdf((loc + half * scale - mean) / sd)
        lo = stats.norm.cdf((loc - half * scale - mean) / sd)
        return (hi - lo).mean(axis=1), np.sqrt(np.mean(((loc - mean) / sd) ** 2))

    cov_elbo, err_elbo = coverage(elbo.params)
    cov_soft, err_soft = coverage(soft.params)
    # measured: Trace_ELBO ≈ [0.33, 0.58, 0.78], SoftCVI ≈ [0.41, 0.70, 0.88];
    # means within ~0.3 posterior sd (root mean square over coordinates)
    assert err_elbo < 0.5 and err_soft < 0.5
    assert np.all(np.abs(cov_soft - levels) < np.abs(cov_elbo - levels))
    assert np.all(cov_elbo < levels)  # the known under-coverage of the ELBO


# --------------------------------------------------------------------------
# eight schools (non-centred) against posteriordb reference draws
# --------------------------------------------------------------------------

POSTERIORDB = Path(__file__).parents[1] / ".." / "shared" / "data" / "posteriordb"
REFERENCE = POSTERIORDB / "eight_schools-eight_schools_noncentered.reference_draws.json"


def eight_schools(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("schools", sigma.shape[0]):
        theta_tilde = numpyro.sample("theta_tilde", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(mu + tau * theta_tilde, sigma), obs=y)


@pytest.mark.slow
@pytest.mark.skipif(not REFERENCE.exists(), reason="posteriordb data not found")
def test_eight_schools_softcvi_covers_reference_draws_better():
    data = json.loads((POSTERIORDB / "eight_schools.json").read_text())
    chains = json.loads(REFERENCE.read_text())
    sigma = jnp.asarray(data["sigma"], dtype=float)
    y = jnp.asarray(data["y"], dtype=float)
    mu = np.concatenate([c["mu"] for c in chains])
    tau = np.concatenate([c["tau"] for c in chains])
    theta = np.stack(
        [np.concatenate([c[f"theta[{j}]"] for c in chains]) for j in range(1, 9)], -1
    )
    draws = {
        "mu": jnp.asarray(mu),
        "tau": jnp.asarray(tau),
        "theta_tilde": jnp.asarray((theta - mu[:, None]) / tau[:, None]),
    }

    def mean_log_q(guide, params):
        def one(value):
            return numpyro.infer.util.log_density(
                guide, (sigma, y), {}, {**params, **value}
            )[0]

        return float(jnp.mean(jax.vmap(one)(draws)))

    # each fit run to its optimum (a decaying step size, 6000 steps): at 2000
    # steps of a constant 0.01 the difference is the optimiser's noise, of
    # either sign over keys (-0.18 to +0.31), and at 2000 or 4000 decaying
    # steps SoftCVI has not converged; at 6000 it is ahead by 0.16 to 0.31
    # on each of six keys, in float32 and float64
    scores = {}
    for name, loss in [("elbo", Trace_ELBO(8)), ("softcvi", SoftCVIELBO(8, 0.75))]:
        guide = AutoNormal(eight_schools)
        optim = optax.adam(optax.cosine_decay_schedule(1e-2, 6000))
        result = SVI(eight_schools, guide, optim, loss).run(
            random.PRNGKey(0), 6000, sigma, y, progress_bar=False
        )
        scores[name] = mean_log_q(guide, result.params)
    assert scores["softcvi"] > scores["elbo"], scores


def hyper_model(y):
    """θ ~ N(μ, 1) with μ a parameter of the model, y_i ~ N(θ, 1)."""
    mu = numpyro.param("mu", 0.0)
    theta = numpyro.sample("theta", dist.Normal(mu, 1.0))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)


@pytest.mark.parametrize(
    "loss", [SoftCVIELBO(8, 0.75), SNISForwardKL(8, low_variance=True)], ids=repr
)
def test_model_parameters_follow_the_marginal_likelihood(loss):
    """The model's own parameter gets the self-normalised estimate of
    ∇_μ log p_μ(y); at the exact posterior every weight is 1/K and its mean
    over draws is E[θ | y] - μ (Fisher's identity). Mean over 400 keys,
    tolerance four Monte Carlo standard errors."""
    y = jnp.array([1.5, 2.5, 0.5, 3.0])
    mu, n = 0.3, y.shape[0]
    var = 1.0 / (1.0 + n)
    mean = var * (mu + float(jnp.sum(y)))
    guide = AutoNormal(hyper_model)
    params = {
        "mu": jnp.asarray(mu),
        "theta_auto_loc": jnp.asarray(mean),
        "theta_auto_scale": jnp.asarray(math.sqrt(var)),
    }
    SVI(hyper_model, guide, optax.adam(0.1), loss).init(random.PRNGKey(0), y)

    def grad_mu(key):
        return jax.grad(lambda p: loss.loss(key, p, hyper_model, guide, y))(params)[
            "mu"
        ]

    keys = random.split(random.PRNGKey(1), 400)
    grads = np.asarray(jax.jit(jax.vmap(grad_mu))(keys))
    se = math.sqrt(var / (400 * loss.num_particles))
    assert abs(-grads.mean() - (mean - mu)) < 4 * se, (-grads.mean(), mean - mu, se)


# --------------------------------------------------------------------------
# a target density without data (NumPyro's neutra and funnel examples)
# --------------------------------------------------------------------------
def _target(shift=0.0):
    def model():
        numpyro.sample("x", dist.Normal(1.0, 2.0))
        if shift:  # the same target with an observed site of constant density
            numpyro.sample("c", dist.Normal(0.0, 1.0), obs=shift)

    return model


@pytest.mark.parametrize("loss", [SoftCVIELBO, SNISForwardKL])
def test_a_model_without_data_is_a_target_density(loss):
    """A model with no observed site is its prior, an unnormalised target:
    the objectives' gradients are those of the same model with a term of
    constant density added (softmax weights ignore a constant), and the fit
    finds the target N(1, 2)."""
    guide = AutoNormal(_target())
    params = guide_params_of(guide, _target())

    def grads(model):
        objective = loss(num_particles=8)
        return jax.grad(lambda p: objective.loss(random.PRNGKey(3), p, model, guide))(
            params
        )

    plain, shifted = grads(_target()), grads(_target(0.7))
    assert _max_abs(plain) > 1e-2  # away from the target: not a zero gradient
    for name in params:
        np.testing.assert_allclose(plain[name], shifted[name], rtol=1e-5, atol=1e-6)
    svi = SVI(_target(), guide, optax.adam(0.05), loss(num_particles=16))
    fitted = svi.run(random.PRNGKey(0), 1500, progress_bar=False).params
    # 16-draw stochastic gradients: the last iterate within ~0.15 of (1, 2)
    np.testing.assert_allclose(fitted["x_auto_loc"], 1.0, atol=0.25)
    np.testing.assert_allclose(fitted["x_auto_scale"], 2.0, atol=0.3)


def guide_params_of(guide, model):
    svi = SVI(model, guide, optax.adam(0.1), Trace_ELBO())
    return svi.get_params(svi.init(random.PRNGKey(1)))
