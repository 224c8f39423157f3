"""Scoring rules: CRPS, energy and quadratic (Brier) scores, user-defined scores.

Closed forms (Gneiting & Raftery 2007), unbiasedness of the fair estimators,
properness, the PVI normal toy (Lai & Yao 2024) and bad input.
"""

import functools
import math
import re

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
from numpyro.infer import SVI
from numpyro.infer.autoguide import AutoDelta, AutoNormal

from numpyro_pvi import PredictiveELBO, predictive_score, scores
from numpyro_pvi.scores import (
    CRPS,
    EnergyScore,
    LogScore,
    QuadraticScore,
    Score,
    pair_sums,
)
from tests.score_helpers import gp_model, law_terms, simulated_terms, with_simulations

RTOL = 1e-10 if X64 else 2e-5


def _vmap(f, keys):
    return jax.vmap(f)(keys)


def _crps_normal(mu, sigma, y):
    """Gneiting & Raftery (2007) eq. 5: CRPS of N(mu, sigma^2) at y."""
    z = (y - mu) / sigma
    return sigma * (
        z * (2 * norm.cdf(z) - 1) + 2 * norm.pdf(z) - 1 / math.sqrt(math.pi)
    )


# --------------------------------------------------------------------------
# the estimators against their definitions
# --------------------------------------------------------------------------


def _naive_energy(x, y, beta):
    """Fair energy score (negatively oriented) by explicit loops in numpy."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    m, b, _ = x.shape
    out = np.zeros(b)
    for i in range(b):
        obs = np.mean([np.linalg.norm(x[j, i] - y[i]) ** beta for j in range(m)])
        pairs = sum(
            np.linalg.norm(x[j, i] - x[k, i]) ** beta
            for j in range(m)
            for k in range(m)
            if j != k
        )
        out[i] = obs - pairs / (2 * m * (m - 1))
    return out


@pytest.mark.numerics
def test_crps_pair_sum_matches_all_pairs_definition():
    x = random.normal(random.PRNGKey(0), (9, 6, 1))
    y = random.normal(random.PRNGKey(1), (6, 1))
    got = CRPS().estimate(simulated_terms(x, y))
    np.testing.assert_allclose(-got, _naive_energy(x, y, 1.0), rtol=RTOL)


def _naive_pair_sum(x, v=None):
    """sum_{j<k} v_j v_k |x_j - x_k| along axis 0 through the (M, M, b) array."""
    v = jnp.ones_like(x) if v is None else v
    pairs = v[:, None] * v[None] * jnp.abs(x[:, None] - x[None])
    return 0.5 * jnp.sum(pairs, axis=(0, 1))


@pytest.mark.numerics
@pytest.mark.parametrize("m", [2, 7, 64, pair_sums._PAIR_SIGN_MAX + 3])
def test_pair_sum_value_and_gradient_match_all_pairs(m):
    # Both algorithms (sign sums up to _PAIR_SIGN_MAX, sorting beyond): the
    # value and the gradient (sign(x_j - x_k) summed; distinct draws, so the
    # all-pairs gradient is unique) equal those of the explicit pair array.
    x = random.normal(random.PRNGKey(m), (m, 5))
    want, want_grad = jax.value_and_grad(lambda x: _naive_pair_sum(x).sum())(x)
    got, grad = jax.value_and_grad(lambda x: pair_sums.pair_abs_sum(x).sum())(x)
    np.testing.assert_allclose(got, want, rtol=RTOL)
    np.testing.assert_allclose(grad, want_grad, rtol=RTOL, atol=RTOL)


@pytest.mark.numerics
def test_weighted_pair_sum_value_and_gradients_match_all_pairs():
    # The mixture guide's weighted pair sum: value, d/dx and d/dv (the
    # weights are mixture probabilities that carry gradients) by reverse
    # and forward mode.
    x = random.normal(random.PRNGKey(0), (12, 4))
    v = random.uniform(random.PRNGKey(1), (12, 4))
    args = (x, v)
    want = jax.grad(lambda x, v: _naive_pair_sum(x, v).sum(), (0, 1))(*args)
    got = jax.grad(lambda x, v: pair_sums.weighted_pair_abs_sum(x, v).sum(), (0, 1))(
        *args
    )
    np.testing.assert_allclose(
        pair_sums.weighted_pair_abs_sum(x, v), _naive_pair_sum(x, v), rtol=RTOL
    )
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=RTOL)
    fwd = jax.jacfwd(lambda v: pair_sums.weighted_pair_abs_sum(x, v))(v)
    np.testing.assert_allclose(
        fwd, jax.jacfwd(lambda v: _naive_pair_sum(x, v))(v), rtol=RTOL, atol=RTOL
    )


def _naive_norm_pair_sum(x, v, stratum_size, beta):
    """(1/2) sum_{j != k} c_jk v_j v_k ||x_j - x_k||^beta through the (N, N, b)
    array (a zero, not NaN, gradient at a tie)."""
    n = x.shape[0]
    stratum = jnp.arange(n) // stratum_size
    same = stratum[:, None] == stratum[None]
    c = jnp.where(same, stratum_size / (stratum_size - 1), 1.0)[..., None]
    sq = jnp.sum(jnp.square(x[:, None] - x[None]), axis=-1)
    safe = jnp.where(sq == 0, 1.0, sq)
    norm = jnp.where(sq == 0, 0.0, safe ** (0.5 * beta))
    return 0.5 * jnp.sum(c * v[:, None] * v[None] * norm, axis=(0, 1))


@pytest.mark.numerics
@pytest.mark.parametrize("beta", [0.5, 1.0, 1.7])
@pytest.mark.parametrize("strata", [1, 3])
@pytest.mark.parametrize("d", [3, 8])
def test_norm_pair_sum_value_and_gradients_match_all_pairs(beta, strata, d):
    # The energy score's pair term (one pass, custom derivative) against the
    # explicit pair array: value, d/dx and d/dv by reverse and forward mode,
    # with a tie (two equal draws: zero, not NaN, gradient) and weights per
    # observation (a mixture guide's strata) or per particle; vectors of a
    # few components (one array each) and of more (one array).
    x = random.normal(random.PRNGKey(7), (12, 5, d))
    x = x.at[1].set(x[0])
    v = random.uniform(random.PRNGKey(8), (12, 5))
    size = 12 // strata

    def got(x, v):
        return pair_sums.pair_norm_sum(x, v, size, beta)

    def want(x, v):
        return _naive_norm_pair_sum(x, v, size, beta)

    np.testing.assert_allclose(got(x, v), want(x, v), rtol=RTOL)
    grads = [
        jax.grad(lambda x, v, f=f: f(x, v).sum(), (0, 1))(x, v) for f in (got, want)
    ]
    for g, w in zip(*grads, strict=True):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=RTOL)
    fwd = [jax.jacfwd(f, (0, 1))(x, v[:, :1]) for f in (got, want)]
    for g, w in zip(*fwd, strict=True):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=RTOL)


def _temp_bytes(f, *args):
    """Scratch memory of the compiled value and gradient of ``f``."""
    compiled = jax.jit(jax.value_and_grad(f)).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_norm_pair_sum_memory_is_linear_in_the_particles():
    # The energy score's pair term claims O(M b d) memory for its value and
    # gradient: no (M, M, b, d) difference array. The explicit pair sum,
    # which does hold one, fails the same bounds.
    b, d = 500, 3

    def one_pass(x):
        v = jnp.full((x.shape[0], 1), 1.0 / x.shape[0])
        return pair_sums.pair_norm_sum(x, v, x.shape[0], 1.0).sum()

    def explicit(x):
        sq = jnp.sum(jnp.square(x[:, None] - x[None]), axis=-1)
        return jnp.sum(jnp.sqrt(sq + 1.0))

    def bounded(f):
        temp = {m: _temp_bytes(f, jnp.ones((m, b, d))) for m in (64, 128)}
        pair_array = 128 * 128 * b * d * jnp.ones(()).dtype.itemsize
        return temp[128] < pair_array / 4 and temp[128] < 2.5 * temp[64]

    assert bounded(one_pass)
    assert not bounded(explicit)


@pytest.mark.numerics
def test_energy_beta_one_in_one_dimension_equals_crps():
    # EnergyScore(1.0) of scalar draws takes the CRPS's sign sums: value and
    # gradient equal the norms' pair sum it takes in several dimensions
    x = random.normal(random.PRNGKey(2), (33, 7, 1)) * 3.0
    y = random.normal(random.PRNGKey(3), (7, 1))
    terms = simulated_terms(x, y)

    def by_norms(x):
        v = jnp.full((33, 1), 1 / 33)
        obs = jnp.sum(jnp.abs(x - y)[..., 0] * v, axis=0)
        return -obs + pair_sums.pair_norm_sum(x, v, 33, 1.0)

    def energy(x):
        return EnergyScore(1.0).estimate(with_simulations(terms, x))

    np.testing.assert_allclose(energy(x), CRPS().estimate(terms), rtol=RTOL, atol=0)
    np.testing.assert_allclose(energy(x), by_norms(x), rtol=RTOL, atol=RTOL)
    np.testing.assert_allclose(
        jax.grad(lambda x: energy(x).sum())(x),
        jax.grad(lambda x: by_norms(x).sum())(x),
        rtol=RTOL,
        atol=RTOL,
    )


@pytest.mark.numerics
@pytest.mark.parametrize("beta", [0.5, 1.0, 1.7])
@pytest.mark.parametrize("d", [1, 3])
def test_energy_score_matches_definition_in_several_dimensions(beta, d):
    x = random.normal(random.PRNGKey(4), (8, 5, d))
    y = random.normal(random.PRNGKey(5), (5, d))
    x = x.at[1].set(x[0])  # a tie: |x_0 - x_1| = 0 must not give NaN
    terms = simulated_terms(x, y)
    got = EnergyScore(beta).estimate(terms)
    np.testing.assert_allclose(-got, _naive_energy(x, y, beta), rtol=RTOL)
    grad = jax.grad(
        lambda x: EnergyScore(beta).estimate(with_simulations(terms, x)).sum()
    )
    assert np.all(np.isfinite(grad(x)))


# --------------------------------------------------------------------------
# CRPS closed form and unbiasedness through the objective
# --------------------------------------------------------------------------

MU0, SIGMA = 0.3, 1.5
Y_CRPS = jnp.array([-2.0, -0.4, 0.3, 1.1, 3.5])


def normal_model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, SIGMA), obs=y)


def normal_guide(y):
    loc = numpyro.param("loc", 0.0)
    scale = numpyro.param("scale", 1.0, constraint=dist.constraints.positive)
    numpyro.sample("mu", dist.Normal(loc, scale))


NORMAL_PARAMS = {"loc": jnp.asarray(0.2), "scale": jnp.asarray(0.8)}
DELTA_GUIDE = AutoDelta(normal_model)  # set up once, shared by the tests


@pytest.mark.numerics
@pytest.mark.parametrize("estimator", ["all-pairs", "auto"])
@pytest.mark.parametrize("num_particles", [2, 16])
def test_crps_of_normal_predictive_is_unbiased_for_closed_form(
    num_particles, estimator
):
    # AutoDelta: every particle is mu = MU0, so the predictive is N(MU0, SIGMA^2)
    guide = DELTA_GUIDE
    params = {"mu_auto_loc": jnp.asarray(MU0)}
    loss = PredictiveELBO(
        CRPS(estimator=estimator), num_particles=num_particles, regularizer=None
    )
    keys = random.split(random.PRNGKey(6), 4000 if num_particles == 2 else 500)
    losses = jax.jit(
        jax.vmap(lambda k: loss.loss(k, params, normal_model, guide, Y_CRPS))
    )(keys)
    exact = float(jnp.sum(_crps_normal(MU0, SIGMA, Y_CRPS)))  # loss = +sum CRPS
    if estimator == "auto":  # the Normal likelihood's closed form: exact
        np.testing.assert_allclose(losses, exact, rtol=1e-12 if X64 else 2e-6)
        return
    se = float(jnp.std(losses)) / math.sqrt(keys.shape[0])
    assert abs(float(jnp.mean(losses)) - exact) < 4.5 * se, (losses.mean(), exact, se)


def studentt_model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.StudentT(4.0, mu, SIGMA), obs=y)


@pytest.mark.parametrize(
    "model, same_as",
    [
        (normal_model, CRPS()),  # the closed form: no simulations
        (studentt_model, EnergyScore(1.0, estimator="all-pairs")),
    ],
    ids=["normal", "student-t"],
)
def test_default_energy_score_of_scalar_observations_is_the_crps(model, same_as):
    # beta = 1 on scalar observations: the default energy objective is the
    # default CRPS objective (value and gradient, the same draws) where the
    # likelihood is Normal, and the all-pairs estimate otherwise
    def loss_and_grad(score):
        elbo = PredictiveELBO(score, num_particles=5, regularizer=None)
        return jax.value_and_grad(
            lambda p: elbo.loss(random.PRNGKey(3), p, model, normal_guide, Y_CRPS)
        )(NORMAL_PARAMS)

    got, want = loss_and_grad("energy"), loss_and_grad(same_as)
    np.testing.assert_allclose(got[0], want[0], rtol=RTOL)
    for name in NORMAL_PARAMS:
        np.testing.assert_allclose(got[1][name], want[1][name], rtol=RTOL)
    # the check has power: the closed form is not the all-pairs estimate
    other = loss_and_grad(EnergyScore(1.0, estimator="all-pairs"))
    assert (model is studentt_model) == bool(jnp.isclose(other[0], got[0]))
    # another exponent is not the CRPS: simulations, as before
    assert EnergyScore(0.5).estimator == "auto"
    half = loss_and_grad(EnergyScore(0.5))[0]
    assert half == loss_and_grad(EnergyScore(0.5, estimator="all-pairs"))[0]


def test_crps_properness_over_a_location_and_scale_grid():
    # truth y ~ N(0, 1); forecasts N(mu, s^2); the expected score (over y and
    # over the ensemble) must be highest at mu = 0, s = 1.
    n, m = 20000, 8
    y = random.normal(random.PRNGKey(7), (n, 1))
    z = random.normal(random.PRNGKey(8), (m, n, 1))  # common random numbers
    crps = CRPS()

    def expected(mu, s):
        return jnp.mean(crps.estimate(simulated_terms(mu + s * z, y)))

    locs = jnp.array([-0.5, -0.25, 0.0, 0.25, 0.5])
    by_loc = jax.vmap(lambda mu: expected(mu, 1.0))(locs)
    assert int(jnp.argmax(by_loc)) == 2, by_loc
    scales = jnp.array([0.6, 0.8, 1.0, 1.25, 1.6])
    by_scale = jax.vmap(lambda s: expected(0.0, s))(scales)
    assert int(jnp.argmax(by_scale)) == 2, by_scale


# --------------------------------------------------------------------------
# quadratic (Brier) score
# --------------------------------------------------------------------------


def bernoulli_model(y):
    p = numpyro.sample("p", dist.Beta(1.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Bernoulli(p), obs=y)


def test_quadratic_score_of_a_bernoulli_closed_form():
    y = jnp.array([0.0, 1.0, 1.0, 0.0])
    p = 0.3
    guide = AutoDelta(bernoulli_model)
    for name in ("quadratic", "brier"):
        got = predictive_score(
            random.PRNGKey(0),
            {"p_auto_loc": jnp.asarray(p)},
            bernoulli_model,
            guide,
            y,
            score=name,
            num_draws=3,
        )
        q_y = jnp.where(y == 1, p, 1 - p)
        np.testing.assert_allclose(got.score, 2 * q_y - p**2 - (1 - p) ** 2, rtol=1e-5)


def test_quadratic_score_unbiased_for_mixture_predictive():
    # guide p ~ Beta(a, b): q(1) = a / (a + b); with M = 2 the unbiased pair
    # estimate has mean 2 q(y) - q(0)^2 - q(1)^2, the plug-in square has a bias
    # Var[p] = ab / ((a+b)^2 (a+b+1)) (= 1/12 here) per support point pair.
    a, b = 1.0, 1.0

    def guide(y):
        numpyro.sample("p", dist.Beta(a, b))

    y = jnp.array([1.0, 0.0, 1.0])
    loss = PredictiveELBO("quadratic", num_particles=2, regularizer=None)
    keys = random.split(random.PRNGKey(9), 5000)
    losses = jax.jit(jax.vmap(lambda k: loss.loss(k, {}, bernoulli_model, guide, y)))(
        keys
    )
    q1 = a / (a + b)
    exact = -float(jnp.sum(2 * jnp.where(y == 1, q1, 1 - q1) - q1**2 - (1 - q1) ** 2))
    se = float(jnp.std(losses)) / math.sqrt(keys.shape[0])
    assert abs(float(jnp.mean(losses)) - exact) < 4.5 * se, (losses.mean(), exact, se)


def _two_point_expected_score(pmf_lo, pmf_hi, truth):
    """Expected quadratic-score estimate with M = 2 particles drawn from the
    two-point guide {pmf_lo, pmf_hi} (prob 1/2 each), exactly: averaged over
    the four ordered particle pairs and over y ~ truth."""
    k = truth.shape[0]
    pairs = jnp.array(
        [[pmf_lo, pmf_lo], [pmf_lo, pmf_hi], [pmf_hi, pmf_lo], [pmf_hi, pmf_hi]]
    )  # (4, M=2, K)
    y = jnp.arange(k)

    def one_pair(pmfs):  # pmfs (2, K): observations are the K support points
        terms = law_terms(
            lambda p: dist.Categorical(probs=jnp.broadcast_to(p, (k, k))),
            pmfs,
            y_obs=y[:, None],
        )
        return QuadraticScore().estimate(terms)

    per_y = jnp.mean(jax.vmap(one_pair)(pairs), axis=0)  # (K,)
    return jnp.sum(truth * per_y)


def test_quadratic_properness_bernoulli_grid_with_spread_predictive():
    # The particles' spread grows with min(q, 1-q): the plug-in square of the
    # predictive pmf would then favour forecasts near 0 or 1 (argmax 0.2 here).
    truth = jnp.array([0.7, 0.3])
    grid = jnp.linspace(0.05, 0.95, 19)

    def score(q):
        delta = 0.9 * jnp.minimum(q, 1 - q)
        lo, hi = q - delta, q + delta
        return _two_point_expected_score(
            jnp.stack([1 - lo, lo]), jnp.stack([1 - hi, hi]), truth
        )

    values = jax.vmap(score)(grid)
    assert float(grid[jnp.argmax(values)]) == pytest.approx(0.3)
    # and the expected estimate is the exact score of the forecast
    exact = 2 * (truth[1] * grid + truth[0] * (1 - grid)) - grid**2 - (1 - grid) ** 2
    np.testing.assert_allclose(values, exact, rtol=1e-4, atol=1e-6)


def test_quadratic_properness_categorical_simplex_grid():
    truth = jnp.array([0.2, 0.5, 0.3])
    grid = jnp.array(
        [[i / 10, j / 10, (10 - i - j) / 10] for i in range(11) for j in range(11 - i)]
    )
    grid = grid[jnp.all(grid > 0, axis=1)]
    shift = jnp.array([1.0, -1.0, 0.0])

    def score(q):
        delta = 0.9 * jnp.minimum(q[0], q[1])
        return _two_point_expected_score(q - delta * shift, q + delta * shift, truth)

    values = jax.vmap(score)(grid)
    np.testing.assert_allclose(grid[jnp.argmax(values)], truth, atol=1e-6)


def multi_component_model(y_pair, y_cat):
    # one observation = 2 Bernoulli outcomes + 1 Categorical outcome (c = 3)
    p = numpyro.sample("p", dist.Beta(2.0, 2.0))
    logits = numpyro.sample("logits", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    with numpyro.plate("data", y_cat.shape[0]):
        numpyro.sample("y_pair", dist.Bernoulli(p).expand([2]).to_event(1), obs=y_pair)
        numpyro.sample("y_cat", dist.Categorical(logits=logits), obs=y_cat)


@pytest.mark.numerics
@pytest.mark.parametrize("support", [2, 4])
def test_stratified_quadratic_from_support_sums_equals_pair_overlaps(support):
    # Mixture-guide strata (3 strata of 4 draws, weights varying by
    # observation): the support sums (one component per observation, the
    # observed value's total read from them) against the pair overlaps the
    # several-components path takes (a point-mass component appended leaves
    # every overlap unchanged), value and gradient in the pmf's logits (two
    # support values read one, the other being one minus it) and in the
    # components' log weights log w_k(x_i) (a stratum's draws share its
    # weight, so only their sum over the stratum is defined).
    k, m, b = 3, 4, 5
    logits = random.normal(random.PRNGKey(11), (k * m, support, b))
    y = random.randint(random.PRNGKey(12), (b,), 0, support)
    log_omega = jax.nn.log_softmax(random.normal(random.PRNGKey(13), (k, b)), axis=0)
    point = jnp.zeros((b, support)).at[:, 0].set(1.0)

    @functools.partial(jax.jit, static_argnums=2)
    def score(logits, log_omega, several):
        def law(lg):  # (V, b) logits -> b Categoricals, or (b, 2) with the point
            probs = jax.nn.softmax(lg, axis=0).T
            if several:
                return dist.Categorical(probs=jnp.stack([probs, point], 1)).to_event(1)
            return dist.Categorical(probs=probs)

        y_obs = jnp.stack([y, jnp.zeros_like(y)], -1) if several else y[:, None]
        terms = law_terms(
            law, logits, y_obs=y_obs, num_strata=k, omega=jnp.exp(log_omega)
        )
        return QuadraticScore().estimate(terms)

    got, want = (score(logits, log_omega, several) for several in (False, True))
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL)
    grads = [
        jax.jit(jax.grad(lambda p, w, s=s: score(p, w, s).sum(), (0, 1)))(
            logits, log_omega
        )
        for s in (False, True)
    ]
    for g, w in zip(*grads, strict=True):
        np.testing.assert_allclose(g, w, rtol=10 * RTOL, atol=10 * RTOL)


@pytest.mark.numerics
def test_quadratic_several_components_match_product_support_enumeration():
    y_pair = jnp.array([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    y_cat = jnp.array([2, 0, 1])

    def guide(y_pair, y_cat):  # draws spread out the particles' pmfs
        numpyro.sample("p", dist.Beta(2.0, 2.0))
        numpyro.sample("logits", dist.Normal(0.0, 1.0).expand([3]).to_event(1))

    terms = jax.jit(
        lambda key: run_particles(
            key,
            {},
            multi_component_model,
            guide,
            (y_pair, y_cat),
            {},
            num_particles=5,
            vectorize_particles_fn=_vmap,
            requests=QuadraticScore.requires,
        )
    )(random.PRNGKey(1))
    pmf, _ = scores.support_pmf(terms)
    assert pmf.shape == (5, 3, 3, 3)  # (M, K, b, c)
    got = QuadraticScore().estimate(terms)

    f = np.asarray(pmf, np.float64)  # (M, K, b, c)
    m = f.shape[0]
    sum_sq = np.zeros(3)
    for i in range(3):
        for j in np.ndindex(2, 2, 3):  # the product support of one observation
            fj = f[:, j[0], i, 0] * f[:, j[1], i, 1] * f[:, j[2], i, 2]  # (M,)
            sum_sq[i] += (fj.sum() ** 2 - (fj**2).sum()) / (m * (m - 1))
    q_obs = np.exp(np.asarray(terms.log_lik, np.float64)).mean(0)
    np.testing.assert_allclose(got, 2 * q_obs - sum_sq, rtol=1e-9 if X64 else 1e-4)


# --------------------------------------------------------------------------
# known answer from the paper: the PVI normal toy
# --------------------------------------------------------------------------


def toy_model(y):
    theta = numpyro.sample("theta", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)


def toy_guide(y):
    loc = numpyro.param("loc", 0.5)
    scale = numpyro.param("scale", 1.0, constraint=dist.constraints.positive)
    numpyro.sample("theta", dist.Normal(loc, scale))


@pytest.mark.slow
def test_pvi_normal_toy_with_crps_gives_sqrt3():
    # y ~ N(0, 2^2) (as evenly spaced quantiles), model N(theta, 1), Gaussian
    # guide, no regularizer: the predictive N(m, 1 + s^2) matches N(0, 4), so
    # s -> sqrt(3) (Lai & Yao 2024: the same limit for every proper score)
    n, steps = 100, 500
    y = 2.0 * norm.ppf((jnp.arange(n) + 0.5) / n)
    optim = optax.adam(optax.exponential_decay(0.05, steps, 0.05))
    loss = PredictiveELBO("crps", num_particles=16, regularizer=None)
    result = SVI(toy_model, toy_guide, optim, loss).run(
        random.PRNGKey(0), steps, y, progress_bar=False
    )
    sd = float(result.params["scale"])
    assert abs(sd - math.sqrt(3)) < 0.1 * math.sqrt(3), sd
    assert abs(float(result.params["loc"])) < 0.2


# --------------------------------------------------------------------------
# the objective: requirements, regularizer, held-out scores
# --------------------------------------------------------------------------


def test_crps_objective_with_prior_regularizer_matches_its_terms():
    guide, params = normal_guide, NORMAL_PARAMS
    elbo = PredictiveELBO("crps", num_particles=4, regularizer="prior", lam=0.7)
    key = random.PRNGKey(3)

    @jax.jit
    def run(params):
        loss, grads = jax.value_and_grad(elbo.loss, argnums=1)(
            key, params, normal_model, guide, Y_CRPS
        )
        terms = elbo.particle_terms(
            random.split(key)[0], params, normal_model, guide, Y_CRPS
        )
        return loss, grads, terms

    loss, grads, terms = run(params)
    assert terms.likelihood is not None and terms.log_lik is None
    expected = -jnp.sum(CRPS().estimate(terms)) + 0.7 * jnp.mean(
        terms.log_q - terms.log_prior
    )
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    assert all(np.isfinite(g).all() and np.any(g != 0) for g in grads.values())


def poisson_model(y):
    rate = numpyro.sample("rate", dist.Gamma(2.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("counts", dist.Poisson(rate), obs=y)


def poisson_guide(y):
    numpyro.sample("rate", dist.LogNormal(0.0, 1.0))


def _interval_score_class():
    """The user-defined score of the Score docstring, executed as written."""
    code = re.search(
        r"\.\. code-block:: python\n\n(.*?)\n\n\s+loss =", Score.__doc__, re.S
    ).group(1)
    namespace = {}
    exec(compile(_dedent(code), "Score-docstring", "exec"), namespace)
    return namespace["IntervalScore"]


def _dedent(code):
    import textwrap

    return textwrap.dedent(code)


def test_user_defined_interval_score_from_the_docstring():
    interval = _interval_score_class()(alpha=0.2)
    x = random.normal(random.PRNGKey(10), (101, 4, 1))
    y = jnp.array([[-3.0], [0.0], [0.5], [2.0]])
    got = interval.estimate(simulated_terms(x, y))
    xs = np.asarray(x[..., 0])
    lo, hi = np.quantile(xs, 0.1, axis=0), np.quantile(xs, 0.9, axis=0)
    yy = np.asarray(y[:, 0])
    want = -(hi - lo) - 10 * (np.maximum(lo - yy, 0) + np.maximum(yy - hi, 0))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # it plugs into the objective
    elbo = PredictiveELBO(interval, num_particles=8)
    loss, grads = jax.jit(
        jax.value_and_grad(
            lambda p: elbo.loss(
                random.PRNGKey(0), p, normal_model, normal_guide, Y_CRPS
            )
        )
    )(NORMAL_PARAMS)
    assert np.isfinite(loss) and all(np.isfinite(g) for g in grads.values())


@pytest.mark.slow
def test_predictive_score_supports_every_score():
    y = jnp.array([0.0, 1.0, 4.0, 2.0])
    guide = AutoDelta(poisson_model)
    rate = 1.7
    params = {"rate_auto_loc": jnp.asarray(rate)}
    # CRPS of a Poisson forecast by enumeration (held-out evaluation needs no
    # reparameterised sampler)
    support = np.arange(60)
    pmf = np.exp(np.asarray(dist.Poisson(rate).log_prob(support), np.float64))
    pair = 0.5 * np.sum(pmf[:, None] * pmf[None] * np.abs(support[:, None] - support))
    crps = np.array([np.sum(pmf * np.abs(support - v)) - pair for v in y])
    got = predictive_score(
        random.PRNGKey(2), params, poisson_model, guide, y, score="crps", num_draws=4000
    )
    # 5 standard errors of a mean of 4000 draws of |X - y| (sd < 2.5 here)
    np.testing.assert_allclose(-got.score, crps, atol=5 * 2.5 / math.sqrt(4000))
    # the batch-means standard error is of the right size: within a factor 2
    # of sd(|X - y|)/sqrt(S) (the pair term adds little)
    assert np.all(got.se < 2 * 2.5 / math.sqrt(4000)) and np.all(got.se > 0)
    log = predictive_score(
        random.PRNGKey(2),
        params,
        poisson_model,
        guide,
        y,
        score=LogScore(),
        num_draws=2,
    )
    np.testing.assert_allclose(log.score, dist.Poisson(rate).log_prob(y), rtol=1e-5)
    bern = predictive_score(
        random.PRNGKey(2),
        {"p_auto_loc": jnp.array(0.5)},
        bernoulli_model,
        AutoDelta(bernoulli_model),
        jnp.array([0.0, 1.0]),
        score="brier",
        num_draws=2,
    )
    np.testing.assert_allclose(bern.score, [0.5, 0.5], rtol=1e-5)


# --------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------


def test_registry_and_aliases():
    assert isinstance(scores.get_score("CRPS"), CRPS)
    assert isinstance(scores.get_score("brier"), QuadraticScore)
    assert isinstance(scores.get_score("quadratic"), QuadraticScore)
    energy = scores.get_score("energy")
    assert isinstance(energy, EnergyScore) and energy.beta == 1.0
    with pytest.raises(ValueError, match="Unknown score 'logg'.*crps"):
        scores.get_score("logg")


@pytest.mark.parametrize("beta", [0.0, 2.0, -1.0, float("nan")])
def test_energy_beta_outside_open_interval_is_rejected(beta):
    with pytest.raises(ValueError, match=r"beta must lie in \(0, 2\)"):
        EnergyScore(beta)
    with pytest.raises(TypeError, match="beta must be a number"):
        EnergyScore("one")


@pytest.mark.parametrize("score", ["crps", "energy", "quadratic"])
def test_pair_estimators_need_two_particles(score):
    with pytest.raises(ValueError, match="num_particles must be an integer >= 2"):
        PredictiveELBO(score, num_particles=1)
    with pytest.raises(ValueError, match="num_draws.*>= 2"):
        predictive_score(
            random.PRNGKey(0),
            {},
            normal_model,
            DELTA_GUIDE,
            Y_CRPS,
            score=score,
            num_draws=1,
        )


def von_mises_model(y):
    rate = numpyro.sample("rate", dist.Gamma(2.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("counts", dist.VonMises(0.0, rate), obs=y)


@pytest.mark.parametrize("score", ["crps", "energy"])
def test_simulation_scores_reject_observed_site_without_reparameterised_sampler(score):
    # (Poisson, negative-binomial and geometric sites have the CRPS in closed
    # form: tests/scores/test_poisson_crps.py)
    loss = PredictiveELBO(score, num_particles=4)
    with pytest.raises(
        ValueError, match="site 'counts' \\(VonMises\\) has no reparameterised sampler"
    ):
        loss.loss(
            random.PRNGKey(0), {}, von_mises_model, poisson_guide, jnp.array([1.0, 3.0])
        )


def test_quadratic_score_rejects_infinite_support():
    loss = PredictiveELBO("brier", num_particles=4)
    with pytest.raises(
        ValueError, match="site 'counts' \\(Poisson\\) has no finite support"
    ):
        loss.loss(
            random.PRNGKey(0), {}, poisson_model, poisson_guide, jnp.array([1.0, 3.0])
        )


def test_crps_rejects_vector_observations_and_points_to_energy():
    x = jnp.zeros((4, 3, 2))
    with pytest.raises(ValueError, match="Use score='energy'"):
        CRPS().estimate(simulated_terms(x, jnp.zeros((3, 2))))


def varying_binomial(n, y):
    b = numpyro.sample("b", dist.Normal(0.0, 2.0))
    with numpyro.plate("obs", n.shape[0]):
        numpyro.sample("y", dist.Binomial(n, logits=b), obs=y)


def test_quadratic_score_of_binomials_with_varying_total_count():
    """total_count per observation, passed as a model argument: the support
    is enumerated to the largest (zero probability above each one's own);
    at a point-mass guide the score is 2 p(y) - Σ_k p(k)² of each binomial."""
    from scipy.stats import binom

    n, y = jnp.array([3, 5, 10, 1, 7]), jnp.array([1.0, 4.0, 3.0, 0.0, 6.0])
    guide = AutoDelta(varying_binomial)
    got = predictive_score(
        random.PRNGKey(0),
        {"b_auto_loc": jnp.asarray(0.4)},
        varying_binomial,
        guide,
        n,
        y,
        score="quadratic",
        num_draws=2,
    )
    p = 1 / (1 + math.exp(-0.4))
    expected = [
        2 * binom.pmf(yi, ni, p) - np.sum(binom.pmf(np.arange(ni + 1), ni, p) ** 2)
        for ni, yi in zip(np.asarray(n), np.asarray(y), strict=True)
    ]
    # (the default estimator's closed form, in single precision: terms of
    # 0.1-0.3 to rounding)
    np.testing.assert_allclose(got.score, expected, rtol=1e-5, atol=2e-6)
    # a total_count traced by a jitted step is named, with what to do
    loss = PredictiveELBO("quadratic", num_particles=4)
    params = {"b_auto_loc": jnp.asarray(0.4)}
    step = jax.jit(
        lambda n: loss.loss(random.PRNGKey(0), params, varying_binomial, guide, n, y)
    )
    with pytest.raises(ValueError, match="total_count is a traced value"):
        step(n)


def test_quadratic_score_refuses_a_pmf_beyond_memory_before_making_it():
    """A Binomial count of 10⁸ (NumPyro's mortality example counts deaths
    among populations of thousands to millions): 64 draws of the pmf over
    10⁸ + 1 values at 1000 observations would be 25 TB. Refused from the
    shapes, naming the site and what to do, before any array of that size
    exists (an abstract evaluation would still make the concrete ones)."""
    n, y = jnp.full(1000, 10**8), jnp.zeros(1000)
    guide = AutoDelta(varying_binomial)
    params = {"b_auto_loc": jnp.asarray(0.4)}
    loss = PredictiveELBO("quadratic", num_particles=64)
    with pytest.raises(ValueError, match=r"'y'.*100,000,001 values.*score='log'"):
        jax.eval_shape(
            lambda: loss.loss(random.PRNGKey(0), params, varying_binomial, guide, n, y)
        )
    # a support of 201 values at 1000 observations fits in memory
    small = jnp.full(1000, 200)
    value = loss.loss(random.PRNGKey(0), params, varying_binomial, guide, small, y)
    assert np.isfinite(value)


def censored_model(y, censored):
    """A right-censored Normal, the censored observations' likelihood a
    ``numpyro.factor`` in the data plate (as NumPyro's censoring notebook
    writes it)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, sigma).mask(~censored), obs=y)
        numpyro.factor("cens_lik", jnp.where(censored, norm.logsf(y, mu, sigma), 0.0))


def test_a_factor_in_the_data_plate_is_part_of_the_observation():
    """At a point-mass guide the log score of each observation is its
    log-likelihood, the factor's term for a censored one; the scores that
    simulate observations refuse the factor by name."""
    y = jnp.array([0.3, 1.8, -0.5, 1.8])
    censored = jnp.array([False, True, False, True])
    guide = AutoDelta(censored_model)
    params = {"mu_auto_loc": jnp.asarray(0.4), "sigma_auto_loc": jnp.asarray(1.3)}
    got = predictive_score(
        random.PRNGKey(0), params, censored_model, guide, y, censored, num_draws=2
    )
    expected = jnp.where(censored, norm.logsf(y, 0.4, 1.3), norm.logpdf(y, 0.4, 1.3))
    np.testing.assert_allclose(got.score, expected, rtol=1e-5)
    loss = PredictiveELBO("crps", num_particles=4)
    with pytest.raises(ValueError, match=r"'cens_lik' \(a numpyro.factor\).*'log'"):
        loss.loss(random.PRNGKey(0), params, censored_model, guide, y, censored)
    # and so does the evaluation, which needs no reparameterised draws (the
    # energy score read the factor as a zero-width outcome and left the
    # censoring out)
    for score in ("crps", "energy"):
        with pytest.raises(ValueError, match=r"'cens_lik' \(a numpyro.factor\).*'log'"):
            predictive_score(
                random.PRNGKey(0), params, censored_model, guide, y, censored,
                score=score, num_draws=2,
            )  # fmt: skip


# --------------------------------------------------------------------------
# observations of several values: the scalar scores name the sites
# --------------------------------------------------------------------------


def two_counts_per_index(y, z):
    p = numpyro.sample("p", dist.Beta(2.0, 2.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Bernoulli(p), obs=y)
        numpyro.sample("z", dist.Binomial(3, p), obs=z)


MULTI_VALUED = {
    "gp": (gp_model, (jnp.linspace(-1.0, 1.0, 20), jnp.cos(jnp.arange(20.0))), "crps"),
    "pmf": (
        two_counts_per_index,
        (jnp.array([0.0, 1.0, 1.0]), jnp.array([0.0, 2.0, 3.0])),
        scores.CRPS(estimator="pmf"),
    ),
}


@pytest.mark.parametrize(
    "case, layout, advice",
    [
        ("gp", "'Y': 20 values", ("energy", "log")),
        ("pmf", "'y', 'z': 1 value each (2 sites)", ("quadratic", "log")),
    ],
    ids=["gp", "two sites"],
)
def test_scalar_scores_of_several_values_name_the_sites_and_the_advice_fits(
    case, layout, advice
):
    """The CRPS of an observation of several values is refused in training
    and held out, naming the observed sites that form it (NumPyro's GP
    example as written, two sites per index; the AR(2) example's loop of
    sites in ``tests/examples/test_programs.py``); every score advised
    fits."""
    model, args, score = MULTI_VALUED[case]
    guide = AutoNormal(model)
    optim = optax.adam(0.01)
    with pytest.raises(ValueError, match=re.escape(layout)) as refusal:
        SVI(model, guide, optim, PredictiveELBO(score, num_particles=2)).run(
            random.PRNGKey(0), 2, *args, progress_bar=False
        )
    assert "is for scalar observations" in str(refusal.value)
    for name in advice:
        assert f"'{name}'" in str(refusal.value)
        result = SVI(model, guide, optim, PredictiveELBO(name, num_particles=2)).run(
            random.PRNGKey(0), 3, *args, progress_bar=False
        )
        assert np.all(np.isfinite(result.losses)), name
    with pytest.raises(ValueError, match=re.escape(layout)):
        predictive_score(
            random.PRNGKey(1), result.params, model, guide, *args, score=score
        )
