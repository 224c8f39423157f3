"""The CRPS from the pmf over a finite support (``CRPS(estimator="pmf")``):
against scoringrules' Binomial CRPS, against the simulated all-pairs
estimate it averages (with and without a mixture guide's strata, varying
total counts), and fitted with Binomial and Bernoulli likelihoods, a mask
and an outlier; the default CRPS of ordered finite supports (and the
energy score's), and the refusal of a Categorical's, which names it."""

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from conftest import X64
from jax import random
from numpyro.infer import SVI
from numpyro.infer.autoguide import AutoNormal

from numpyro_pvi import PredictiveELBO, predictive_score
from numpyro_pvi.scores import CRPS, crps_pmf, support_pmf
from numpyro_pvi.selection import stacking_weights
from tests.score_helpers import crps_against_log, law_terms, with_simulations

sr = pytest.importorskip("scoringrules")

RTOL = 1e-9 if X64 else 3e-5
PMF_CRPS = CRPS(estimator="pmf")


def _terms(probs, counts, y, num_strata=1, omega=None):
    """Terms of Binomial likelihoods of ``(K M, b)`` probabilities with
    ``(b,)`` counts, observing ``y``."""
    return law_terms(
        lambda p: dist.Binomial(counts, probs=p),
        probs,
        y_obs=y[:, None].astype(float),
        num_strata=num_strata,
        omega=omega,
    )


@pytest.mark.numerics
def test_identical_particles_give_scoringrules_crps_binomial():
    # with every particle the same pmf the fair pair estimate is F(v)^2
    # exactly: the CRPS of that Binomial, at the mode, in a tail and at the
    # ends of the support
    counts = jnp.array([10, 10, 10, 4, 7])
    prob = jnp.array([0.3, 0.3, 0.9, 0.5, 0.05])
    y = jnp.array([3, 10, 0, 4, 0])
    terms = _terms(jnp.tile(prob, (4, 1)), counts, y)
    want = sr.crps_binomial(
        np.asarray(y, float),
        np.asarray(counts, float),
        np.asarray(prob, float),
        backend="numpy",
    )
    np.testing.assert_allclose(-PMF_CRPS.estimate(terms), want, rtol=RTOL * 10)


@pytest.mark.parametrize("num_strata, m", [(1, 2), (1, 5), (2, 3)])
def test_pmf_crps_is_the_all_pairs_estimate_averaged_over_simulations(num_strata, m):
    # given the particles, the CRPS from the pmf is the expectation over the
    # simulations of the fair all-pairs estimate from simulated counts:
    # equal within the Monte Carlo error; counts that vary per observation,
    # an observation in the far tail, strata weights
    km, b = num_strata * m, 5
    probs = jax.nn.sigmoid(random.normal(random.PRNGKey(1), (km, b)))
    counts = jnp.array([1, 5, 10, 10, 3])
    y = jnp.array([1, 0, 10, 2, 3])
    omega = None
    if num_strata > 1:
        omega = jax.nn.softmax(random.normal(random.PRNGKey(2), (num_strata, b)), 0)
    terms = _terms(probs, counts, y, num_strata, omega)
    exact = PMF_CRPS.estimate(terms)

    def simulated(key):
        x = random.binomial(key, counts, probs).astype(float)[..., None]
        return CRPS(estimator="all-pairs").estimate(with_simulations(terms, x))

    keys = random.split(random.PRNGKey(3), 20000)
    est = jax.jit(jax.vmap(simulated))(keys)
    se = est.std(0) / math.sqrt(keys.shape[0])
    assert jnp.max(jnp.abs(est.mean(0) - exact) / se) < 4.5, (est.mean(0), exact)
    # power: the plug-in square (F-bar)^2, biased by Var F / M, is another number
    pmf, obs_support = support_pmf(terms)
    cdf = jnp.cumsum(pmf[:, :-1, :, 0], axis=1)
    v = jnp.exp(terms.weights.log_predictive)[:, None, :]
    mean = jnp.sum(v * cdf, axis=0)
    below = jnp.cumsum(obs_support[:-1, :, 0], axis=0)
    plug_in = -jnp.sum(jnp.square(mean - below), axis=0)
    assert jnp.max(jnp.abs(plug_in - exact) / se) > 10


def binomial_model(x, counts, y=None, mask=True):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Binomial(counts, logits=w * x + b).mask(mask), obs=y)


def bernoulli_model(x, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=w * x), obs=y)


X = jnp.linspace(-1.0, 1.0, 12)
COUNTS = jnp.array([3, 8, 8, 8, 1, 8, 8, 8, 5, 8, 8, 8])
Y = jnp.array([1, 3, 4, 3, 0, 4, 5, 6, 3, 6, 7, 0])  # the last: an outlier


def test_fits_a_binomial_regression_and_scores_it_held_out():
    guide = AutoNormal(binomial_model)
    loss = PredictiveELBO(PMF_CRPS, num_particles=8)
    svi = SVI(binomial_model, guide, optax.adam(0.05), loss)
    result = svi.run(random.PRNGKey(4), 300, X, COUNTS, Y, progress_bar=False)
    assert np.all(np.isfinite(result.losses))
    assert float(np.mean(result.losses[-30:])) < float(np.mean(result.losses[:30]))
    score = predictive_score(
        random.PRNGKey(5),
        result.params,
        binomial_model,
        guide,
        X,
        COUNTS,
        Y,
        score=PMF_CRPS,
    )
    assert np.all(np.isfinite(score.score)) and np.all(np.asarray(score.score) <= 0)
    # the outlier (0 of 8 where about 7 are predicted) scores worst
    assert int(np.argmin(score.score)) == 11
    # a masked observation scores nothing and leaves the others unchanged
    keep = np.arange(12) != 11
    params = result.params
    key = random.PRNGKey(6)
    terms = loss.particle_terms(key, params, binomial_model, guide, X, COUNTS, Y)
    masked = loss.particle_terms(
        key, params, binomial_model, guide, X, COUNTS, Y, mask=keep
    )
    np.testing.assert_allclose(
        np.asarray(PMF_CRPS.estimate(masked))[keep],
        np.asarray(PMF_CRPS.estimate(terms))[keep],
        rtol=1e-5,
    )


def test_bernoulli_crps_is_half_the_brier_score():
    # for outcomes in {0, 1} the CRPS is (F(0) - 1{y = 0})^2 = (q(1) - y)^2:
    # the Brier score of the event, and QuadraticScore is 1 - 2 (q(1) - y)^2
    guide = AutoNormal(bernoulli_model)
    y = (X > 0).astype(jnp.int32)
    loss = PredictiveELBO(PMF_CRPS, num_particles=6)
    svi = SVI(bernoulli_model, guide, optax.sgd(0.0), loss)
    params = svi.get_params(svi.init(random.PRNGKey(7), X, y))
    key = random.PRNGKey(8)
    crps = loss.score.estimate(
        loss.particle_terms(key, params, bernoulli_model, guide, X, y)
    )
    quad = PredictiveELBO("quadratic", num_particles=6)
    quadratic = quad.score.estimate(
        quad.particle_terms(key, params, bernoulli_model, guide, X, y)
    )
    np.testing.assert_allclose(2.0 * crps, quadratic - 1.0, rtol=1e-5, atol=1e-6)


def ordinal_model(x, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.OrderedLogistic(w * x, jnp.array([-1.0, 1.0])), obs=y)


def beta_binomial_model(x, counts, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0))
    c = numpyro.sample("c", dist.LogNormal(1.0, 0.5))
    p = jax.nn.sigmoid(w * x)
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.BetaBinomial(c * p, c * (1 - p), counts), obs=y)


def categorical_model(x, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Categorical(logits=w * x[:, None]), obs=y)


@pytest.mark.parametrize(
    "model, args",
    [
        (binomial_model, (X, COUNTS, Y)),  # 9 values, a mask of 1s
        (bernoulli_model, (X, (X > 0).astype(jnp.int32))),
        (ordinal_model, (X, jnp.minimum(Y, 2))),  # ordered categories
        (beta_binomial_model, (X, COUNTS, Y)),
    ],
)
@pytest.mark.parametrize("score", ["crps", "energy"])
def test_the_default_crps_of_a_finite_support_is_the_crps_from_the_pmf(
    model, args, score
):
    # PredictiveELBO("crps") as users write it: the same loss and gradient
    # as CRPS(estimator="pmf") (no simulations: a discrete draw has no
    # gradient); the energy score of scalar values with beta = 1 likewise
    guide = AutoNormal(model)
    svi = SVI(model, guide, optax.sgd(0.0), PredictiveELBO("log"))
    params = svi.get_params(svi.init(random.PRNGKey(9), *args))

    def value_and_grad(loss):
        return jax.value_and_grad(
            lambda p: loss.loss(random.PRNGKey(10), p, model, guide, *args)
        )(params)

    value, grad = value_and_grad(PredictiveELBO(score, num_particles=4))
    want, want_grad = value_and_grad(PredictiveELBO(PMF_CRPS, num_particles=4))
    np.testing.assert_allclose(value, want, rtol=RTOL)
    for name in want_grad:
        np.testing.assert_allclose(grad[name], want_grad[name], rtol=RTOL, atol=1e-7)
    if score == "crps":  # and it fits (the energy score is the same program)
        result = SVI(model, guide, optax.adam(0.05), PredictiveELBO(score)).run(
            random.PRNGKey(11), 50, *args, progress_bar=False
        )
        assert np.all(np.isfinite(result.losses))


def test_categories_that_need_not_be_ordered_are_refused_with_the_pmf_on_request():
    # a Categorical's categories may be nominal: the default CRPS does not
    # read them as ordered, and names the estimator that does
    y = (X > 0).astype(jnp.int32) + (X > 0.5)
    guide = AutoNormal(categorical_model)
    svi = SVI(categorical_model, guide, optax.sgd(0.0), PredictiveELBO("log"))
    params = svi.get_params(svi.init(random.PRNGKey(9), X, y))
    loss = PredictiveELBO("crps", num_particles=4)
    with pytest.raises(ValueError, match=r"'y'.*if its categories are ordered"):
        loss.loss(random.PRNGKey(10), params, categorical_model, guide, X, y)
    remedy = PredictiveELBO(PMF_CRPS, num_particles=4)
    value = remedy.loss(random.PRNGKey(10), params, categorical_model, guide, X, y)
    assert np.isfinite(float(value))


def test_cross_validation_and_stacking_score_by_the_pmf():
    # held-out CRPS from the pmf, and the pair gains of two fits' draws
    # (their strata) that stacking's weights are computed from
    cv = crps_against_log(
        11, binomial_model, X, COUNTS, Y, score=PMF_CRPS, learning_rate=0.05
    )
    scores = np.asarray(cv.scores["pointwise"])
    assert scores.shape == (2, 12) and np.all(np.isfinite(scores))
    assert np.all(scores <= 0)
    gains = np.asarray(cv.scores["pair_gain"])
    assert gains.shape == (2, 2, 12) and np.all(np.isfinite(gains))
    np.testing.assert_allclose(np.sum(stacking_weights(cv).weights), 1.0, rtol=1e-6)


def beta_binomial_model(x, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", x.shape[0]):
        a = jnp.exp(w * x)
        numpyro.sample("y", dist.BetaBinomial(a, 2.0, total_count=COUNTS), obs=y)


def test_a_beta_binomial_fits_by_its_pmf():
    guide = AutoNormal(beta_binomial_model)
    loss = PredictiveELBO(PMF_CRPS, num_particles=4)
    svi = SVI(beta_binomial_model, guide, optax.adam(0.05), loss)
    result = svi.run(random.PRNGKey(12), 100, X, Y, progress_bar=False)
    assert np.all(np.isfinite(result.losses))


@pytest.mark.numerics
@pytest.mark.parametrize("num_strata", [1, 2])
@pytest.mark.parametrize(
    ("counts", "y"),
    [([1, 5, 10, 10, 3], [1, 0, 10, 2, 3]), ([47, 40, 12, 0, 40], [20, 40, 3, 0, 1])],
)
def test_binomial_cdfs_from_the_logits_equal_the_pmfs_value_and_gradient(
    num_strata, counts, y
):
    # one Binomial component per observation: the cdfs' sums from the logits
    # block by block (no (M, V, b) pmf) give the pmf path's numbers, up to
    # CDF_SUMS_SUPPORT = 48 values
    km, b = num_strata * 16, 5
    logits = random.normal(random.PRNGKey(13), (km, b)) * 2.0
    counts, y = jnp.array(counts), jnp.array(y)
    omega = None
    if num_strata > 1:
        omega = jax.nn.softmax(random.normal(random.PRNGKey(14), (num_strata, b)), 0)

    def estimate(logits, closed):
        terms = _terms(jax.nn.sigmoid(logits), counts, y, num_strata, omega)
        if closed:
            return PMF_CRPS.estimate(terms)
        with pytest.MonkeyPatch.context() as patch:  # the pmf path
            patch.setattr(crps_pmf, "binomial_parts", lambda *a, **k: None)
            return PMF_CRPS.estimate(terms)

    values = [estimate(logits, closed) for closed in (False, True)]
    # float32: each of the V values' pair sums rounds to ~1e-6 of M²
    atol = 1e-5 if X64 else 2e-6 * int(counts.max() + 1)
    np.testing.assert_allclose(values[1], values[0], rtol=1e-4, atol=atol)
    cotangent = random.normal(random.PRNGKey(15), (b,))
    grads = [
        jax.grad(lambda t, c=c: jnp.sum(cotangent * estimate(t, c)))(logits)
        for c in (False, True)
    ]
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-4, atol=atol)


@pytest.mark.parametrize("score", ["crps", "quadratic"])
def test_traced_total_counts_are_refused_with_a_remedy_that_works(score):
    # the support's size is read from the counts: under a jitted function
    # that takes them as an argument they are traced; closed over, they work
    guide = AutoNormal(binomial_model)
    svi = SVI(binomial_model, guide, optax.sgd(0.0), PredictiveELBO("log"))
    params = svi.get_params(svi.init(random.PRNGKey(9), X, COUNTS, Y))
    loss = PredictiveELBO(score, num_particles=4)

    @jax.jit
    def traced(counts):
        return loss.loss(
            random.PRNGKey(10), params, binomial_model, guide, X, counts, Y
        )

    message = r"'y'.*total_count is a traced value.*Close over"
    with pytest.raises(ValueError, match=message):
        traced(COUNTS)
    closed = jax.jit(
        lambda: loss.loss(
            random.PRNGKey(10), params, binomial_model, guide, X, COUNTS, Y
        )
    )
    assert np.isfinite(float(closed()))


def test_the_default_crps_of_a_long_support_says_what_it_costs():
    # beyond 48 support values the pmf is summed value by value: the default
    # says so (and what is cheaper); 8 trials, or the estimator asked for by
    # name, pass quietly
    many = COUNTS * 8  # up to 64 trials
    guide = AutoNormal(binomial_model)
    svi = SVI(binomial_model, guide, optax.sgd(0.0), PredictiveELBO("log"))
    params = svi.get_params(svi.init(random.PRNGKey(9), X, many, Y))

    def loss(score, counts):
        return PredictiveELBO(score, num_particles=4).loss(
            random.PRNGKey(10), params, binomial_model, guide, X, counts, Y
        )

    with pytest.warns(UserWarning, match=r"'y'.*65 support values.*'quadratic'"):
        assert np.isfinite(float(loss("crps", many)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss("crps", COUNTS)
        loss(PMF_CRPS, many)
