"""The estimator choices of the scores: the CRPS / energy pair term (all pairs
or a derangement) and the quadratic score's pmf over the support (one pass
from the likelihood's parameters, or one ``log_prob`` per support value).

Every estimator against a closed form (unbiasedness, tolerance from the Monte
Carlo error), against scoringrules' implementation of the same estimator, and
against the other estimator of the same quantity.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from conftest import X64, run_particles
from jax import random
from jax.scipy.stats import norm
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal
from test_scores import SIGMA, _crps_normal, normal_guide, normal_model

import numpyro_pvi.scores.quadratic as quadratic
from numpyro_pvi import PredictiveELBO
from numpyro_pvi.guides import AutoGaussianMixture
from numpyro_pvi.scores import CRPS, EnergyScore, QuadraticScore
from numpyro_pvi.scores import _pmf as pmf
from numpyro_pvi.scores._pmf import support_log_pmf, support_pmf
from numpyro_pvi.scores._sites import support_pmf as terms_pmf
from numpyro_pvi.scores.closed_forms.normal import normal_abs_mean
from tests.score_helpers import law_terms, simulated_terms

sr = pytest.importorskip("scoringrules")

RTOL = 1e-10 if X64 else 2e-5
ESTIMATORS = ["all-pairs", "derangement"]


def _init_params(model, guide, loss, args, seed):
    svi = SVI(model, guide, optax.sgd(0.0), loss=loss)
    return svi.get_params(svi.init(random.PRNGKey(seed), *args))


def _terms(y_sim, y_obs):
    return simulated_terms(y_sim, y_obs)


# --------------------------------------------------------------------------
# CRPS and energy score: the estimators against scoringrules
# --------------------------------------------------------------------------

#: scoringrules' name of each estimator: the fair all-pairs one, and the
#: "approximate kernel representation", each draw paired with its neighbour.
SCORINGRULES = {"all-pairs": "fair", "derangement": "akr"}


@pytest.mark.numerics
@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("m", [2, 3, 16, 64])
def test_crps_estimators_equal_scoringrules(estimator, m):
    x = random.normal(random.PRNGKey(m), (m, 7, 1)) * 2.0 + 0.5
    y = random.normal(random.PRNGKey(100 + m), (7, 1)) * 3.0  # outliers too
    got = CRPS(estimator=estimator).estimate(_terms(x, y))
    want = sr.crps_ensemble(
        np.asarray(y[:, 0], np.float64),
        np.asarray(x[..., 0].T, np.float64),
        estimator=SCORINGRULES[estimator],
    )
    np.testing.assert_allclose(-got, want, rtol=RTOL, atol=RTOL)


@pytest.mark.numerics
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_energy_estimators_equal_scoringrules(estimator):
    x = random.normal(random.PRNGKey(3), (12, 5, 3))
    y = random.normal(random.PRNGKey(4), (5, 3)) * 2.0
    got = EnergyScore(1.0, estimator=estimator).estimate(_terms(x, y))
    energy = getattr(sr, "es_ensemble", None) or sr.energy_score  # renamed in 0.9
    want = energy(
        np.asarray(y, np.float64),
        np.asarray(jnp.swapaxes(x, 0, 1), np.float64),
        estimator=SCORINGRULES[estimator],
    )
    np.testing.assert_allclose(-got, want, rtol=RTOL, atol=RTOL)


@pytest.mark.numerics
def test_derangement_with_two_draws_is_the_all_pairs_estimator():
    x = random.normal(random.PRNGKey(5), (2, 9, 1))
    y = random.normal(random.PRNGKey(6), (9, 1))
    np.testing.assert_allclose(
        CRPS(estimator="derangement").estimate(_terms(x, y)),
        CRPS().estimate(_terms(x, y)),
        rtol=RTOL,
        atol=RTOL,
    )


@pytest.mark.numerics
def test_energy_derangement_in_one_dimension_equals_crps_derangement():
    x = random.normal(random.PRNGKey(7), (10, 6, 1))
    y = random.normal(random.PRNGKey(8), (6, 1))
    np.testing.assert_allclose(
        EnergyScore(1.0, estimator="derangement").estimate(_terms(x, y)),
        CRPS(estimator="derangement").estimate(_terms(x, y)),
        rtol=RTOL,
        atol=RTOL,
    )


# --------------------------------------------------------------------------
# unbiasedness through the objective: a normal predictive with a spread guide
# --------------------------------------------------------------------------

LOC, SCALE = 0.2, 0.8
Y = jnp.array([-6.0, -0.4, 0.3, 1.1, 9.0])  # two outliers far from the guide


@pytest.mark.parametrize("estimator", [*ESTIMATORS, "closed-form", "auto"])
@pytest.mark.parametrize("m", [2, 8])
def test_crps_estimators_unbiased_for_the_normal_predictive(estimator, m):
    # the predictive of N(mu, SIGMA^2) with mu ~ N(LOC, SCALE^2) is
    # N(LOC, SIGMA^2 + SCALE^2): its CRPS has a closed form
    params = {"loc": jnp.asarray(LOC), "scale": jnp.asarray(SCALE)}
    loss = PredictiveELBO(CRPS(estimator=estimator), num_particles=m, regularizer=None)
    keys = random.split(random.PRNGKey(11), 4000)

    def per_obs(key):
        terms = loss.particle_terms(key, params, normal_model, normal_guide, Y)
        return loss.score.estimate(terms)

    est = jax.jit(jax.vmap(per_obs))(keys)  # (keys, b)
    exact = -_crps_normal(LOC, math.sqrt(SIGMA**2 + SCALE**2), Y)
    mean, se = est.mean(0), est.std(0) / math.sqrt(keys.shape[0])
    assert jnp.max(jnp.abs(mean - exact) / se) < 4.5, (mean, exact, se)
    # the check has power: the plug-in (biased, 1/M^2) pair term is off by
    # E|Y - Y'| / (2M), many standard errors
    bias = jnp.sqrt(2 * (SIGMA**2 + SCALE**2)) * math.sqrt(2 / math.pi) / (2 * m)
    assert jnp.min(bias / se) > 10, (bias, se)


@pytest.mark.parametrize("m", [4, 8])  # M = 2, 3: every pair, the same estimate
def test_energy_derangement_unbiased_in_three_dimensions(m):
    # the same i.i.d. draws: the derangement and the all-pairs estimates have
    # the same expectation (the all-pairs one is checked against loops in
    # test_scores); their difference has mean zero within its MC error
    n_keys, b, d = 4000, 4, 3
    keys = random.split(random.PRNGKey(12), n_keys)
    y = jnp.array([[0.0, 0.0, 0.0], [3.0, -2.0, 1.0], [0.5, 0.5, 0.5], [8, 0, 0]])

    def diff(key):
        k1, k2 = random.split(key)
        z = random.normal(k1, (m, 1, d)) * 0.5  # a shared latent per draw
        x = z + random.normal(k2, (m, b, d))
        terms = _terms(x, y)
        new = EnergyScore(0.7, estimator="derangement").estimate(terms)
        return new, new - EnergyScore(0.7).estimate(terms)

    est, delta = jax.jit(jax.vmap(diff))(keys)
    se = delta.std(0) / math.sqrt(n_keys)
    assert jnp.max(jnp.abs(delta.mean(0)) / se) < 4.5, (delta.mean(0), se)
    # power: the estimates themselves vary far more than the tolerance
    assert jnp.min(est.std(0) / math.sqrt(n_keys) / se) > 0.5


# --------------------------------------------------------------------------
# the closed form of Normal likelihoods
# --------------------------------------------------------------------------

U = jnp.array([-1e4, -40.0, -7.0, -1.3, -1e-3, 0.0, 0.2, 1.0, 3.5, 12.0, 1e5])


@pytest.mark.numerics
def test_normal_abs_mean_is_scoringrules_crps_normal_plus_half_pair():
    # E|Y - y| = CRPS(N(mu, s^2), y) + E|Y - Y'| / 2, and E|Y - Y'| = 2 s / sqrt(pi)
    mu = random.normal(random.PRNGKey(30), (40,)) * 3.0
    s = jnp.exp(random.normal(random.PRNGKey(31), (40,)))
    y = jnp.concatenate([random.normal(random.PRNGKey(32), (38,)), U[:2]])
    got = normal_abs_mean(y - mu, s)
    want = sr.crps_normal(
        np.asarray(y, np.float64), np.asarray(mu, np.float64), np.asarray(s, np.float64)
    ) + np.asarray(s, np.float64) / math.sqrt(math.pi)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL)


@pytest.mark.numerics
def test_normal_abs_mean_gradient_and_far_tails():
    # the custom derivatives equal autodiff of the textbook form, and far from
    # the centre the value is |mu| with derivatives (sign(mu), 0), finite
    def textbook(loc, scale):
        z = loc / scale
        return scale * (z * (2 * norm.cdf(z) - 1) + 2 * norm.pdf(z))

    scale = jnp.full_like(U, 0.7)
    inner = jnp.abs(U) < 100
    for f in (normal_abs_mean, textbook):
        assert jnp.all(jnp.isfinite(f(U, scale)))
    got = jax.vmap(jax.grad(normal_abs_mean, argnums=(0, 1)))(U, scale)
    want = jax.vmap(jax.grad(textbook, argnums=(0, 1)))(U[inner], scale[inner])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g[inner], w, rtol=10 * RTOL, atol=10 * RTOL)
    np.testing.assert_allclose(normal_abs_mean(U, scale)[~inner], jnp.abs(U[~inner]))
    np.testing.assert_array_equal(got[0][~inner], jnp.sign(U[~inner]))
    np.testing.assert_array_equal(got[1][~inner], 0.0)


def _normal_terms(loc, scale, y_obs):
    return law_terms(dist.Normal, loc[..., 0], scale[..., 0], y_obs=y_obs)


@pytest.mark.parametrize("m", [2, 5])
def test_closed_form_is_the_derangement_averaged_over_simulations(m):
    # given the particles, the closed form is the expectation over y_sim of the
    # simulated derangement estimate (Rao-Blackwellisation): equal within the
    # Monte Carlo error of many simulations, and an outlier included
    loc = random.normal(random.PRNGKey(33), (m, 6, 1)) * 2.0
    scale = jnp.exp(random.normal(random.PRNGKey(34), (m, 6, 1)) * 0.5)
    y = jnp.array([[0.0], [1.0], [-2.0], [0.5], [30.0], [-3.0]])
    exact = CRPS(estimator="closed-form").estimate(_normal_terms(loc, scale, y))

    def simulated(key):
        x = loc + scale * random.normal(key, loc.shape)
        return CRPS(estimator="derangement").estimate(_terms(x, y))

    keys = random.split(random.PRNGKey(35), 20000)
    est = jax.jit(jax.vmap(simulated))(keys)
    se = est.std(0) / math.sqrt(keys.shape[0])
    assert jnp.max(jnp.abs(est.mean(0) - exact) / se) < 4.5, (est.mean(0), exact)
    if m > 2:  # power: the average over all pairs of particles is another number
        pair = normal_abs_mean(
            loc[:, None] - loc[None], jnp.sqrt(scale[:, None] ** 2 + scale[None] ** 2)
        )[..., 0]  # (M, M, b)
        all_pairs = -jnp.mean(
            normal_abs_mean(y[:, 0] - loc[..., 0], scale[..., 0]), 0
        ) + 0.5 * (pair.sum((0, 1)) - jnp.trace(pair)) / (m * (m - 1))
        assert jnp.max(jnp.abs(all_pairs - exact) / se) > 10


def test_closed_form_variance_is_below_the_simulations():
    # the conditional expectation has less variance than the simulated
    # estimators over draws of the particles and the simulations
    params = {"loc": jnp.asarray(LOC), "scale": jnp.asarray(SCALE)}
    keys = random.split(random.PRNGKey(36), 2000)

    def per_obs(key, estimator):
        loss = PredictiveELBO(CRPS(estimator=estimator), num_particles=8)
        terms = loss.particle_terms(key, params, normal_model, normal_guide, Y)
        return loss.score.estimate(terms)

    sd = {
        e: jax.jit(jax.vmap(lambda k, e=e: per_obs(k, e)))(keys).std(0)
        for e in ("closed-form", "all-pairs", "derangement")
    }
    assert jnp.all(sd["closed-form"] < sd["all-pairs"]), sd
    assert jnp.all(sd["closed-form"] < sd["derangement"]), sd


def studentt_model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.StudentT(4.0, mu, SIGMA), obs=y)


def masked_model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, SIGMA).mask(y > -100), obs=y)


def test_auto_uses_the_closed_form_for_a_masked_normal():
    """A masked Normal is a Normal at its kept observations: auto is the
    closed form, equal to the unmasked model's when nothing is masked."""
    params = {"loc": jnp.asarray(LOC), "scale": jnp.asarray(SCALE)}
    key = random.PRNGKey(37)
    values = {
        (estimator, model.__name__): PredictiveELBO(
            CRPS(estimator=estimator), num_particles=4
        ).loss(key, params, model, normal_guide, Y)
        for estimator in ("auto", "closed-form")
        for model in (masked_model, normal_model)
    }
    assert len({float(v) for v in values.values()}) == 1, values


@pytest.mark.parametrize("model", [studentt_model])
def test_auto_uses_simulations_without_a_normal_likelihood(model):
    # auto = the all-pairs estimate from the same simulations; closed-form refuses
    params = {"loc": jnp.asarray(LOC), "scale": jnp.asarray(SCALE)}
    key = random.PRNGKey(37)
    values = {}
    for estimator in ("auto", "all-pairs"):
        loss = PredictiveELBO(CRPS(estimator=estimator), num_particles=4)
        values[estimator] = loss.loss(key, params, model, normal_guide, Y)
    np.testing.assert_allclose(values["auto"], values["all-pairs"], rtol=1e-6)
    loss = PredictiveELBO(CRPS(estimator="closed-form"), num_particles=4)
    with pytest.raises(ValueError, match="closed-form.*Normal.*site.*'y'"):
        loss.loss(key, params, model, normal_guide, Y)


def test_closed_form_reads_loc_and_scale_at_the_subsample():
    # the Normal's loc and scale follow the data plate's subsample like y_obs, and a
    # second (Normal) site still makes one observation two values
    x = jnp.arange(7.0) / 3.0
    y = jnp.arange(7.0) * 10.0

    def model(x, y, z=None):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", 7, subsample_size=3) as idx:
            numpyro.sample("y", dist.Normal(w * x[idx], 0.5 + x[idx]), obs=y[idx])
            if z is not None:
                numpyro.sample("z", dist.Normal(w, 1.0), obs=z[idx])

    guide = AutoNormal(model)
    params = _init_params(model, guide, Trace_ELBO(), (x, y), 0)
    terms = run_particles(
        random.PRNGKey(38),
        params,
        model,
        guide,
        (x, y),
        {},
        num_particles=4,
        requests=CRPS.requires | {"latents"},
    )
    idx = (terms.y_obs[:, 0] / 10.0).astype(int)
    site_lik = terms.likelihood
    loc, scale = (
        site_lik.rows(0, site_lik.laws[0].loc),
        site_lik.rows(0, site_lik.laws[0].scale),
    )
    assert loc.shape == scale.shape == (4, 3, 1)
    w = terms.latents["w"][:, None]
    np.testing.assert_allclose(loc[..., 0], w * x[idx], rtol=1e-6)
    np.testing.assert_allclose(scale[..., 0], jnp.broadcast_to(0.5 + x[idx], (4, 3)))
    loss = PredictiveELBO(CRPS(estimator="closed-form"), num_particles=4)
    with pytest.raises(ValueError, match="score='energy'"):
        loss.loss(random.PRNGKey(0), params, model, guide, x, y, y + 1.0)


# --------------------------------------------------------------------------
# mixture guides: the stratified derangement against the stratified all pairs
# --------------------------------------------------------------------------


def linreg(x, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(x @ w, 0.7), obs=y)


@pytest.mark.slow
@pytest.mark.parametrize("score", ["crps", "energy"])
def test_stratified_derangement_equals_all_pairs_in_expectation(score):
    x = jnp.array([[1.0, 0.0], [0.5, -1.0], [2.0, 1.5], [-1.0, 3.0]])
    y = jnp.array([0.3, -2.0, 6.0, 1.0])
    guide = AutoGaussianMixture(linreg, num_components=3, gating_covariates=x)
    params = _init_params(linreg, guide, Trace_ELBO(), (x, y), 0)
    # spread the components and make the gating depend on x
    params = {
        name: p + 0.8 * random.normal(random.PRNGKey(p.size), p.shape)
        if name.endswith(("_locs", "_gate_coefs"))
        else p
        for name, p in params.items()
    }
    cls = CRPS if score == "crps" else EnergyScore
    new, old = cls(estimator="derangement"), cls()
    m = 3

    def diff(key):
        terms = run_particles(
            key,
            params,
            linreg,
            guide,
            (x, y),
            {},
            num_particles=m,
            requests=new.requires,
        )
        est = new.estimate(terms)
        return est, est - old.estimate(terms)

    keys = random.split(random.PRNGKey(13), 3000)
    est, delta = jax.jit(jax.vmap(diff))(keys)
    se = delta.std(0) / math.sqrt(keys.shape[0])
    assert jnp.max(jnp.abs(delta.mean(0)) / se) < 4.5, (delta.mean(0), se)
    # the pairs between components carry weight: dropping them is detected
    assert float(jnp.min(jnp.abs(est.mean(0)))) > 0


@pytest.mark.parametrize("cls", [CRPS, EnergyScore])
def test_unknown_estimator_is_refused(cls):
    with pytest.raises(ValueError, match="estimator must be one of"):
        cls(estimator="sorted")


def test_estimator_is_part_of_the_score_value():
    assert CRPS(estimator="derangement") != CRPS()
    assert CRPS(estimator="derangement") == CRPS(estimator="derangement")
    assert repr(CRPS()) == "CRPS()"
    assert "derangement" in repr(EnergyScore(estimator="derangement"))


# --------------------------------------------------------------------------
# the quadratic score's pmf: one pass from the parameters = one log_prob per
# support value, value and gradient
# --------------------------------------------------------------------------

LOGITS = random.normal(random.PRNGKey(20), (6, 4)) * 3.0


def _distributions(theta):
    """Finite-support likelihoods of the parameters ``theta`` ``(6, 4)``."""
    probs = jax.nn.softmax(theta, -1)
    return {
        "categorical-logits": dist.CategoricalLogits(theta),
        "categorical-probs": dist.CategoricalProbs(probs),
        "binomial-logits": dist.BinomialLogits(theta[:, 0], total_count=7),
        "binomial-probs": dist.BinomialProbs(probs[:, 0], total_count=7),
        "binomial-large": dist.BinomialLogits(theta[:, 1], total_count=30),
        "bernoulli": dist.BernoulliLogits(theta[:, 2]),
        "bernoulli-probs": dist.BernoulliProbs(jax.nn.sigmoid(theta[:, 3])),
        "beta-binomial": dist.BetaBinomial(
            jnp.exp(theta[:, 0]), jnp.exp(theta[:, 1]), total_count=6
        ),
    }


def _support(name, theta, one_pass, fn):
    d = _distributions(theta)[name]
    out = fn(d, d.enumerate_support(expand=False), one_pass=one_pass)
    out = jnp.stack(out) if isinstance(out, list) else out
    return jnp.broadcast_to(out, out.shape[:1] + d.batch_shape)


@pytest.mark.numerics
@pytest.mark.parametrize("name", list(_distributions(LOGITS)))
def test_one_pass_pmf_equals_generic_pmf_value_and_gradient(name):
    # the log pmf and the probabilities, each from the parameters in one pass
    # and from one log_prob per support value
    (log_fast, log_slow), (prob_fast, prob_slow) = jax.jit(
        lambda t: [
            [_support(name, t, o, fn) for o in (True, False)]
            for fn in (support_log_pmf, support_pmf)
        ]
    )(LOGITS)
    np.testing.assert_allclose(log_fast, log_slow, rtol=RTOL, atol=RTOL)
    np.testing.assert_allclose(jnp.exp(log_slow).sum(0), 1.0, rtol=1e-4)
    np.testing.assert_allclose(prob_fast, jnp.exp(log_slow), rtol=3 * RTOL, atol=RTOL)
    np.testing.assert_allclose(prob_slow, jnp.exp(log_slow), rtol=RTOL, atol=RTOL)
    cotangent = random.normal(random.PRNGKey(21), log_fast.shape)
    paths = [
        lambda t, o: jnp.exp(_support(name, t, o, support_log_pmf)),
        lambda t, o: _support(name, t, o, support_pmf),
    ]
    grads = jax.jit(
        lambda t: [
            jax.grad(lambda t, o=o, f=f: jnp.sum(cotangent * f(t, o)))(t)
            for f in paths
            for o in (True, False)
        ]
    )(LOGITS)
    for g in grads[1:]:
        np.testing.assert_allclose(g, grads[0], rtol=1e-4, atol=1e-5)


def test_one_pass_covers_categorical_binomial_beta_binomial_and_bernoulli():
    assert set(pmf.ONE_PASS) == {
        dist.CategoricalLogits,
        dist.CategoricalProbs,
        dist.BinomialLogits,
        dist.BinomialProbs,
        dist.BetaBinomial,
    }
    assert set(pmf.PROBS_ONE_PASS) == {dist.BernoulliLogits, dist.BernoulliProbs}


def softmax_model(x, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2, 4]).to_event(2))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Categorical(logits=x @ w), obs=y)


def several_components_model(x, y, counts):
    # two observed sites and a row of Categorical outcomes per observation
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2, 4]).to_event(2))
    with numpyro.plate("data", x.shape[0]):
        logits = x @ w
        numpyro.sample(
            "y",
            dist.Categorical(logits=logits[:, None, :])
            .expand([x.shape[0], 2])
            .to_event(1),
            obs=y,
        )
        numpyro.sample(
            "k", dist.BinomialLogits(logits[:, 0], total_count=5), obs=counts
        )


X = jnp.array([[1.0, 0.0], [0.5, -1.0], [2.0, 1.5], [-1.0, 3.0], [0.1, 0.2]])
Y_CAT = jnp.array([0, 3, 1, 2, 3])
Y_ROWS = jnp.array([[0, 1], [3, 3], [1, 0], [2, 2], [3, 0]])
COUNTS = jnp.array([0.0, 5.0, 2.0, 1.0, 4.0])


def logistic_model(x, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=x @ w), obs=y)


CASES = {
    "bernoulli": (logistic_model, (X, (Y_CAT % 2).astype(float))),
    "categorical": (softmax_model, (X, Y_CAT)),
    "several components": (several_components_model, (X, Y_ROWS, COUNTS)),
}


#: the fast tier: the case with several components (one pass per component)
PMF_PATHS = [
    pytest.param(
        case,
        guide_cls,
        marks=()
        if (case, guide_cls) in {("several components", "AutoNormal")}
        else pytest.mark.slow,
        id=f"{guide_cls}-{case}",
    )
    for guide_cls in ("AutoNormal", "AutoGaussianMixture")
    for case in CASES
]


@pytest.mark.parametrize("case, guide_cls", PMF_PATHS)
def test_quadratic_loss_and_gradient_same_with_either_pmf_path(
    case, guide_cls, monkeypatch
):
    model, args = CASES[case]
    if guide_cls == "AutoNormal":
        guide = AutoNormal(model, init_scale=0.5)
    else:
        guide = AutoGaussianMixture(model, num_components=2, gating_covariates=X)
    loss = PredictiveELBO("quadratic", num_particles=4)
    params = _init_params(model, guide, loss, args, 1)

    def value_and_grad():
        # a new function each call: jit traces it again after the patch
        f = lambda p: loss.loss(random.PRNGKey(2), p, model, guide, *args)  # noqa: E731
        return jax.jit(jax.value_and_grad(f))(params)

    fast = value_and_grad()
    monkeypatch.setattr(pmf, "ONE_PASS", {})
    monkeypatch.setattr(pmf, "PROBS_ONE_PASS", {})
    slow = value_and_grad()
    np.testing.assert_allclose(fast[0], slow[0], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(fast[1]), jax.tree.leaves(slow[1]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", ["bernoulli", "categorical", "binomial", "binomial-20"]
)
def test_quadratic_from_support_totals_equals_from_log_likelihood(case):
    # one component per observation: q(y_i) is read from the support totals;
    # from the log-likelihoods it is the same value and gradient
    def model(x, y):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2, 4]).to_event(2))
        logits = x @ w
        with numpyro.plate("data", x.shape[0]):
            if case == "bernoulli":
                numpyro.sample("y", dist.Bernoulli(logits=logits[:, 0]), obs=y % 2)
            elif case == "categorical":
                numpyro.sample("y", dist.Categorical(logits=logits), obs=y)
            elif case == "binomial":
                numpyro.sample(
                    "y", dist.Binomial(3, logits=logits[:, 1]), obs=y.astype(float)
                )
            else:  # 21 support values: the stacked (not per-value) path
                numpyro.sample("y", dist.Binomial(20, logits=logits[:, 1]), obs=5.0 * y)

    guide = AutoNormal(model, init_scale=0.5)
    params = _init_params(model, guide, Trace_ELBO(), (X, Y_CAT), 3)
    score = QuadraticScore(estimator="all-pairs")  # the path reading the totals

    def estimate(p, keep):
        terms = run_particles(
            random.PRNGKey(4),
            p,
            model,
            guide,
            (X, Y_CAT),
            {},
            num_particles=5,
            requests=QuadraticScore.requires,
        )
        if keep:
            return score.estimate(terms)
        pmf, _ = terms_pmf(terms)
        _, sum_sq = quadratic._support_sums(pmf[..., 0])
        m = pmf.shape[0]
        return 2.0 * quadratic._predictive_pmf(terms) - sum_sq / (m * (m - 1))

    @jax.jit  # one program for the four evaluations
    def values_and_grads(p):
        weights = jnp.arange(1.0, 6.0)
        return [
            (
                estimate(p, k),
                jax.grad(lambda p, k=k: jnp.sum(estimate(p, k) * weights))(p),
            )
            for k in (True, False)
        ]

    (fast, grad_fast), (slow, grad_slow) = values_and_grads(params)
    np.testing.assert_allclose(fast, slow, rtol=1e-5, atol=1e-7)
    for a, b in zip(*(jax.tree.leaves(g) for g in (grad_fast, grad_slow)), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.numerics
@pytest.mark.parametrize("k", [1, 2, 3, 11])
def test_support_sums_equal_their_definition(k):
    # two support values take f(0) = 1 - f(1): the same totals and sum of
    # squares as the definition, for a normalised pmf
    probs = jax.nn.softmax(random.normal(random.PRNGKey(5), (6, k, 7)) * 2, axis=1)
    totals, sum_sq = quadratic._support_sums(probs)
    np.testing.assert_allclose(totals, probs.sum(0), rtol=RTOL)
    want = jnp.sum(jnp.square(probs.sum(0)) - jnp.square(probs).sum(0), axis=0)
    np.testing.assert_allclose(sum_sq, want, rtol=10 * RTOL, atol=10 * RTOL)


@pytest.mark.numerics
@pytest.mark.parametrize("k", [2, 5])
def test_strata_sums_are_each_strata_draws_sums(k):
    # 3 strata of 4 draws: the sums of each stratum's own rows, not of
    # rows spread over the strata (the draws are stratum-major)
    probs = jax.nn.softmax(random.normal(random.PRNGKey(6), (12, k, 7)) * 2, axis=1)
    totals, own = quadratic._strata_sums(probs, 3)
    for s in range(3):
        rows = probs[4 * s : 4 * (s + 1)]
        np.testing.assert_allclose(totals[s], rows.sum(0), rtol=RTOL)
        squares = jnp.square(rows).sum(0)
        np.testing.assert_allclose(own[s], squares, rtol=RTOL, atol=RTOL)


# --------------------------------------------------------------------------
# Binomial support sums from the logits (no (M, K, b) pmf)
# --------------------------------------------------------------------------


def _binomial_sums_by_definition(logits, count, size):
    """Totals and sums of squares of exp(NumPyro's log pmf), (K, b)."""
    k = jnp.arange(size, dtype=logits.dtype)[:, None, None]
    log_pmf = dist.Binomial(count, logits=logits).log_prob(jnp.minimum(k, count))
    f = jnp.where(k <= count, jnp.exp(log_pmf), 0.0)  # (K, M, b)
    return f.sum(1), jnp.square(f).sum(1)


@pytest.mark.numerics
@pytest.mark.parametrize("num_particles", [1, 5, 48])  # blocks of 1, 1 and 16
def test_binomial_support_sums_equal_their_definition(num_particles):
    """Counts from 0 to 10 (11 support values), logits far out on both
    sides (±40, where one end's probability underflows) and at 0: the
    ratio recurrences from the likelier end give the pmf's totals and sums
    of squares, and their gradient, to rounding."""
    count = jnp.array([0.0, 1.0, 3.0, 10.0, 10.0, 7.0, 10.0, 5.0])
    logits = 4.0 * random.normal(random.PRNGKey(7), (num_particles, count.size))
    logits = logits.at[0, 3].set(40.0).at[0, 4].set(-40.0).at[0, 5].set(0.0)
    got, want = jax.jit(
        lambda x: (
            pmf.binomial_support_sums(x, count, 11),
            _binomial_sums_by_definition(x, count, 11),
        )
    )(logits)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=10 * RTOL, atol=10 * RTOL)
    # the gradient of a weighted sum of both, against autodiff of the
    # definition (away from logit 0, where NumPyro's |l| has a kink)
    logits = jnp.where(logits == 0.0, 0.3, logits)
    weights = random.normal(random.PRNGKey(8), (2, 11, count.size))

    def weighted(sums):
        return lambda x: sum(
            jnp.sum(w * s) for w, s in zip(weights, sums(x), strict=True)
        )

    got, want = jax.jit(
        lambda x: (
            jax.grad(weighted(lambda x: pmf.binomial_support_sums(x, count, 11)))(x),
            jax.grad(weighted(lambda x: _binomial_sums_by_definition(x, count, 11)))(x),
        )
    )(logits)
    np.testing.assert_allclose(got, want, rtol=100 * RTOL, atol=100 * RTOL)
    assert np.all(np.isfinite(got))


def _binomial_model(kind):
    def model(x, y, count):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        logits = 2.0 * (x @ w)
        with numpyro.plate("data", x.shape[0]):
            if kind == "probs":
                fn = dist.Binomial(count, probs=jax.nn.sigmoid(logits))
            else:
                fn = dist.Binomial(count, logits=logits)
            if kind == "masked":
                fn = fn.mask(jnp.array([True, False, True, True, False]))
            numpyro.sample("y", fn, obs=y)

    return model


@pytest.mark.numerics
@pytest.mark.parametrize(
    "kind, guide_cls",
    [
        ("logits", "AutoNormal"),
        ("probs", "AutoNormal"),
        ("masked", "AutoNormal"),
        ("logits", "AutoGaussianMixture"),
    ],
)
@pytest.mark.parametrize(
    "estimator, trials", [("all-pairs", 1), ("derangement", 1), ("derangement", 25)]
)
def test_quadratic_score_from_binomial_logits_equals_from_the_pmf(
    kind, guide_cls, estimator, trials
):
    """The quadratic score of a Binomial likelihood reads the logits and
    counts when it can: the same value and gradient
    as from the pmf over the support (all-pairs sums, or the derangement's
    overlaps in closed form: up to 5 trials by the polynomial, up to 100 by
    the recurrence), with counts that vary between observations (one of
    them 0), masked observations, and a mixture guide's strata (weights
    that depend on the observation)."""
    model = _binomial_model(kind)
    counts = trials * COUNTS
    y = jnp.minimum(trials * Y_CAT.astype(float), counts)
    args = (X, y, counts)
    if guide_cls == "AutoNormal":
        guide = AutoNormal(model, init_scale=0.5)
    else:
        guide = AutoGaussianMixture(model, num_components=2, gating_covariates=X)
    params = _init_params(model, guide, Trace_ELBO(), args, 3)
    score = QuadraticScore(estimator=estimator)

    def estimate(p, from_logits):
        terms = run_particles(
            random.PRNGKey(4),
            p,
            model,
            guide,
            args,
            {},
            num_particles=6,
            requests=QuadraticScore.requires,
        )
        assert quadratic.binomial_parts(terms) is not None
        assert terms.num_strata == (1 if guide_cls == "AutoNormal" else 2)
        if from_logits:
            return score.estimate(terms)
        with pytest.MonkeyPatch.context() as patch:  # the pmf path
            patch.setattr(quadratic, "binomial_parts", lambda *a, **k: None)
            return score.estimate(terms)

    weights = jnp.arange(1.0, 6.0)

    @jax.jit  # one program for the four evaluations
    def values_and_grads(p):
        return [
            jax.value_and_grad(lambda p, f=f: jnp.sum(estimate(p, f) * weights))(p)
            + (estimate(p, f),)
            for f in (True, False)
        ]

    (_, grad_fast, fast), (_, grad_slow, slow) = values_and_grads(params)
    np.testing.assert_allclose(fast, slow, rtol=10 * RTOL, atol=10 * RTOL)
    for a, b in zip(*(jax.tree.leaves(g) for g in (grad_fast, grad_slow)), strict=True):
        np.testing.assert_allclose(a, b, rtol=100 * RTOL, atol=100 * RTOL)


def test_beta_binomial_counts_that_vary_keep_a_finite_gradient():
    # the support runs to the largest total_count; above an observation's
    # own count the pmf is 0, and its gradient finite (log_prob beyond the
    # support has a NaN gradient: the quadratic objective and the CRPS from
    # the pmf went NaN after one step)
    counts = jnp.array([1, 4, 2, 4])

    def total(theta):
        d = dist.BetaBinomial(jnp.exp(theta), 2.0, total_count=counts)
        support = jnp.arange(5.0).reshape(5, 1)
        out = jnp.stack(support_pmf(d, support))  # (5, 4)
        return jnp.sum(jnp.square(out)), out

    (_, out), grad = jax.value_and_grad(total, has_aux=True)(jnp.zeros(4))
    assert np.all(np.isfinite(grad)) and np.all(grad != 0)
    np.testing.assert_allclose(out.sum(0), 1.0, rtol=1e-5)
    assert np.all(np.asarray(out)[np.arange(5)[:, None] > np.asarray(counts)] == 0)
