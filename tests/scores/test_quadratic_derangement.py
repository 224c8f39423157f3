"""The quadratic score's derangement estimator: each draw's pmf paired with
the next draw's, the Binomial overlaps in closed form.

Against the definition (sums over the support of NumPyro's pmf, and their
autodiff), against known answers (point masses), and against the all-pairs
estimator: averaged over every relabelling of the same draws the
derangement *is* the all-pairs estimate (each ordered pair of distinct draws
appears equally often), with and without a mixture guide's strata and with
several components per observation.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from conftest import X64, run_particles
from jax import random
from numpyro.infer import Trace_ELBO
from numpyro.infer.autoguide import AutoNormal
from test_score_estimators import COUNTS, Y_CAT, X, _binomial_model, _init_params

from numpyro_pvi import PredictiveELBO
from numpyro_pvi.guides import AutoGaussianMixture
from numpyro_pvi.scores import QuadraticScore
from numpyro_pvi.scores.closed_forms.binomial import (
    POLYNOMIAL_SUPPORT,
    binomial_next_overlaps,
    binomial_parts,
    binomial_strata_overlaps,
)

RTOL = 1e-10 if X64 else 2e-5
DERANGEMENT = QuadraticScore(estimator="derangement")


def _next_overlaps_by_definition(logits, count, size):
    """``sum_k f_m(k) f_{m+1}(k)`` from exp(NumPyro's log pmf), ``(M, b)``."""
    k = jnp.arange(size, dtype=logits.dtype)[:, None, None]
    log_pmf = dist.Binomial(count, logits=logits).log_prob(jnp.minimum(k, count))
    f = jnp.where(k <= count, jnp.exp(log_pmf), 0.0)  # (K, M, b)
    return jnp.sum(f * jnp.roll(f, -1, axis=1), axis=0)


@pytest.mark.numerics
@pytest.mark.parametrize(
    "num_particles, size, constant",
    [
        (2, 16, False),  # blocks of 1
        (5, 16, False),  # blocks of 1
        (48, 16, False),  # blocks of 8
        (48, 41, False),  # moments in blocks of 8, derivatives after the loop
        (5, POLYNOMIAL_SUPPORT, False),  # the polynomial's largest support
        # the recurrence from here on (a loop: also on the second JAX)
        pytest.param(5, POLYNOMIAL_SUPPORT + 1, False, marks=pytest.mark.py312),
        (4, 301, False),
        # every count the largest: the loop without selection
        pytest.param(4, 301, True, marks=pytest.mark.py312),
    ],
)
def test_binomial_next_overlaps_equal_their_definition(num_particles, size, constant):
    """Counts from 0 to the support's largest (or all the largest), logits
    far out on both sides (±40: one end's probability underflows; pairs of
    the same and of opposite signs) and at 0: the closed forms (the
    polynomial up to 49 support values, the recurrence beyond) give the
    overlaps and their gradient to rounding."""
    n = size - 1.0
    count = jnp.array([0.0, 1.0, 3.0, n, n, 7.0, 10.0, 5.0, n])
    if constant:
        count = jnp.full_like(count, n)
    logits = 6.0 * random.normal(random.PRNGKey(7), (num_particles, count.size))
    logits = logits.at[0, 3].set(40.0).at[1, 3].set(-40.0).at[0, 4].set(-40.0)
    logits = logits.at[1, 4].set(-39.0).at[0, 5].set(0.0).at[1, 8].set(12.0)
    got, want = jax.jit(
        lambda x: (
            binomial_next_overlaps(x, count, size),
            _next_overlaps_by_definition(x, count, size),
        )
    )(logits)
    # single precision's rounding grows with the trials, in the definition's
    # log-gamma functions as in the closed forms'
    tol = RTOL * max(1.0, size / 16.0)
    np.testing.assert_allclose(got, want, rtol=10 * tol, atol=10 * tol)
    # the gradient of a weighted sum, against autodiff of the definition
    # (away from logit 0, where NumPyro's |l| has a kink)
    logits = jnp.where(logits == 0.0, 0.3, logits)
    weights = random.normal(random.PRNGKey(8), logits.shape)
    got, want = jax.jit(
        lambda x: tuple(
            jax.grad(lambda x, f=f: jnp.sum(weights * f(x, count, size)))(x)
            for f in (binomial_next_overlaps, _next_overlaps_by_definition)
        )
    )(logits)
    np.testing.assert_allclose(got, want, rtol=100 * tol, atol=100 * tol)


def _strata_overlaps_by_definition(logits, omega, count, size):
    """``sum_{s,t} ω_s ω_t / M sum_m <f_{sm}, f_{t,m+1}>`` from NumPyro's
    pmf, ``(b,)``; ``logits`` ``(S, M, b)``, ``omega`` ``(S, b)``."""
    k = jnp.arange(size, dtype=logits.dtype)[:, None, None, None]
    log_pmf = dist.Binomial(count, logits=logits).log_prob(jnp.minimum(k, count))
    f = jnp.where(k <= count, jnp.exp(log_pmf), 0.0)  # (K, S, M, b)
    pairs = jnp.einsum("ksmb,ktmb->stb", f, jnp.roll(f, -1, axis=2))
    return jnp.einsum("stb,sb,tb->b", pairs, omega, omega) / logits.shape[1]


@pytest.mark.numerics
@pytest.mark.parametrize(
    "num_strata, num_particles, size",
    [
        (2, 2, 11),  # blocks of one draw
        (3, 6, 11),  # blocks of three
        (2, 24, 41),  # blocks of eight, a polynomial of 41 terms
        pytest.param(2, 6, 60, marks=pytest.mark.py312),  # the recurrence
    ],
)
def test_binomial_strata_overlaps_equal_their_definition(
    num_strata, num_particles, size
):
    """Under strata each draw is paired with the next draw of every stratum,
    block by block with each block's first pair evaluated again: the value
    and its gradient in the logits and in the strata's weights equal the
    definition's to rounding (a row's two pairs in different blocks, the
    last draw's pair with the first)."""
    n = size - 1.0
    count = jnp.array([0.0, 1.0, 3.0, n, n, 7.0, 10.0])
    keys = random.split(random.PRNGKey(3), 3)
    shape = (num_strata, num_particles, count.size)
    logits = 4.0 * random.normal(keys[0], shape) + 0.1  # away from NumPyro's kink
    omega = jax.nn.softmax(random.normal(keys[1], (num_strata, count.size)), axis=0)
    weights = random.normal(keys[2], count.shape)
    functions = (binomial_strata_overlaps, _strata_overlaps_by_definition)
    got, want = jax.jit(
        lambda x, w: tuple(
            jax.value_and_grad(
                lambda x, w, f=f: jnp.sum(weights * f(x, w, count, size)), (0, 1)
            )(x, w)
            for f in functions
        )
    )(logits, omega)
    tol = 100 * RTOL * max(1.0, size / 16.0)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
    assert np.mean(np.asarray(got[1][0]) != 0) > 0.8  # not vacuous


@pytest.mark.parametrize("size", [4, 60])  # the polynomial, the recurrence
def test_binomial_next_overlaps_of_point_masses(size):
    """Infinite logits are point masses at ``n`` (``+inf``) and ``0``
    (``-inf``): they overlap (1, to the recurrence's rounding) with each
    other only at ``n = 0``; a NaN logit reads NaN in both of its pairs."""
    logits = jnp.array([[jnp.inf, jnp.inf, jnp.nan], [-jnp.inf, jnp.inf, 0.0]])
    count = jnp.array([size - 1.0, size - 1.0, 2.0])
    overlaps = binomial_next_overlaps(logits, count, size)
    np.testing.assert_allclose(
        overlaps[:, :2], [[0.0, 1.0], [0.0, 1.0]], rtol=1e-12 if X64 else 1e-6
    )
    assert np.all(np.isnan(overlaps[:, 2]))
    np.testing.assert_array_equal(
        binomial_next_overlaps(logits[:, :1], jnp.zeros(1), 1), [[1.0], [1.0]]
    )


def _rows_model(x, y):
    """Two Bernoulli components per observation (a product support)."""
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample(
            "y",
            dist.Bernoulli(logits=jnp.stack([x @ w, x @ w - 1.0], -1)).to_event(1),
            obs=y,
        )


def _relabelled(terms, order):
    """The same draws in the order ``order`` (an index along the particles)."""
    weights = terms.weights
    return terms._replace(
        log_lik=terms.log_lik[order],
        likelihood=terms.likelihood.particles(order),
        weights=weights._replace(
            particle=weights.particle[order],
            log_predictive=weights.log_predictive[order],
        ),
    )


@pytest.mark.numerics
@pytest.mark.parametrize(
    "case", ["binomial", "binomial, mixture guide", "two components"]
)
def test_derangement_over_every_relabelling_is_the_all_pairs_estimate(case):
    """Known answer: every ordered pair of distinct draws (of one stratum, or
    any pair of two strata) is a neighbour pair in equally many orders of
    the draws, so the derangement estimate averaged over all of them equals
    the all-pairs estimate of the same draws exactly, for the closed form
    (one Binomial component), the pmf's overlaps (strata) and products of
    overlaps (two components)."""
    if case == "two components":
        model, args = _rows_model, (X, jnp.stack([Y_CAT > 1, Y_CAT > 2], -1) * 1.0)
    else:
        model = _binomial_model("logits")
        args = (X, jnp.minimum(Y_CAT.astype(float), COUNTS), COUNTS)
    if case == "binomial, mixture guide":
        guide = AutoGaussianMixture(model, num_components=2, gating_covariates=X)
        strata, m = 2, 3
    else:
        guide, strata, m = AutoNormal(model, init_scale=0.5), 1, 4
    params = _init_params(model, guide, Trace_ELBO(), args, 3)
    terms = run_particles(
        random.PRNGKey(4),
        params,
        model,
        guide,
        args,
        {},
        num_particles=m,
        requests=QuadraticScore.requires,
    )
    assert terms.num_strata == strata
    assert (binomial_parts(terms) is not None) == case.startswith("binomial")
    orders = [
        jnp.concatenate([jnp.asarray(p) + s * m for s, p in enumerate(perms)])
        for perms in itertools.product(itertools.permutations(range(m)), repeat=strata)
    ]
    relabelled = jax.jit(
        jax.vmap(lambda order: DERANGEMENT.estimate(_relabelled(terms, order)))
    )(jnp.stack(orders))
    np.testing.assert_allclose(
        relabelled.mean(0),
        QuadraticScore(estimator="all-pairs").estimate(terms),
        rtol=RTOL,
        atol=RTOL,
    )
    assert np.ptp(np.asarray(relabelled), axis=0).max() > 10 * RTOL  # not all equal


def test_derangement_loss_is_unbiased_for_the_all_pairs_loss():
    """Both estimators are unbiased for the same objective: the mean loss
    and gradient over keys agree within their Monte Carlo error (M = 2, the
    smallest number of draws, where the derangement pairs the two draws
    twice)."""
    model = _binomial_model("logits")
    args = (X, jnp.minimum(Y_CAT.astype(float), COUNTS), COUNTS)
    guide = AutoNormal(model, init_scale=0.8)
    params = _init_params(model, guide, Trace_ELBO(), args, 3)
    keys = random.split(random.PRNGKey(0), 4000)

    def over_keys(score):
        loss = PredictiveELBO(score, num_particles=2, regularizer=None)
        values, grads = jax.jit(
            jax.vmap(
                jax.value_and_grad(lambda p, k: loss.loss(k, p, model, guide, *args)),
                (None, 0),
            )
        )(params, keys)
        return np.concatenate([values[:, None], grads["w_auto_loc"]], axis=1)

    a, d = over_keys(QuadraticScore(estimator="all-pairs")), over_keys(DERANGEMENT)
    se = np.sqrt((a.var(0) + d.var(0)) / len(keys))
    assert np.all(np.abs(a.mean(0) - d.mean(0)) < 4.5 * se), (a.mean(0), d.mean(0), se)


def test_unknown_estimator_is_refused_and_the_estimator_is_part_of_the_value():
    with pytest.raises(ValueError, match="estimator must be one of"):
        QuadraticScore(estimator="closed-form")
    assert DERANGEMENT != QuadraticScore()
    assert DERANGEMENT == QuadraticScore(estimator="derangement")
    assert repr(QuadraticScore()) == "QuadraticScore()"
    assert repr(DERANGEMENT) == "QuadraticScore(estimator='derangement')"


def _counts_model(trials):
    """A binomial regression with ``trials`` trials per observation (a
    Bernoulli likelihood for ``trials=None``)."""

    def model(x, y):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with numpyro.plate("data", x.shape[0]):
            if trials is None:
                fn = dist.Bernoulli(logits=x @ w)
            else:
                fn = dist.Binomial(trials, logits=x @ w)
            numpyro.sample("y", fn, obs=y)

    return model


@pytest.mark.parametrize(
    "case, resolved",
    [
        ("binomial", "derangement"),
        ("binomial, mixture guide", "derangement"),
        ("binomial, 48 trials", "derangement"),
        ("binomial, 100 trials", "derangement"),
        ("bernoulli", "all-pairs"),
    ],
)
def test_default_estimator_is_the_derangement_where_its_overlaps_are_closed(
    case, resolved
):
    """``estimator="auto"`` is the derangement for one Binomial component
    per observation, of any number of trials (the polynomial up to 48, the
    recurrence beyond), with or without strata (one estimator for a fit and
    its mixtures), and all pairs otherwise (a Bernoulli). Checked as equal
    to the explicit estimator, finite, and different from the other
    one."""
    trials = {
        "binomial, 48 trials": 48,
        "binomial, 100 trials": 100,
        "bernoulli": None,
    }.get(case, 10)
    model = _counts_model(trials)
    y = jnp.floor(Y_CAT * (trials or 1) / 3.0)
    if case == "binomial, mixture guide":
        guide = AutoGaussianMixture(model, num_components=2, gating_covariates=X)
    else:
        guide = AutoNormal(model, init_scale=0.5)
    params = _init_params(model, guide, Trace_ELBO(), (X, y), 3)
    terms = run_particles(
        random.PRNGKey(4),
        params,
        model,
        guide,
        (X, y),
        {},
        num_particles=4,
        requests=QuadraticScore.requires,
    )
    assert (binomial_parts(terms) is not None) == (trials is not None)
    other = {"derangement": "all-pairs", "all-pairs": "derangement"}[resolved]
    got, want, alternative = (
        QuadraticScore(estimator=e).estimate(terms) for e in ("auto", resolved, other)
    )
    assert np.all(np.isfinite(got)) and np.all(np.isfinite(alternative))
    np.testing.assert_array_equal(got, want)
    assert np.abs(got - alternative).max() > 10 * RTOL


@pytest.mark.numerics
def test_derangement_of_a_long_binomial_support_equals_its_definition():
    """100 trials (101 support values, the same for every observation): the
    derangement's overlaps by the recurrence (the polynomial's coefficients
    would overflow) equal those of NumPyro's pmf, and are finite."""
    model = _counts_model(100)
    y = jnp.minimum(Y_CAT * 30.0, 100.0)
    guide = AutoNormal(model, init_scale=0.5)
    params = _init_params(model, guide, Trace_ELBO(), (X, y), 3)
    terms = run_particles(
        random.PRNGKey(4),
        params,
        model,
        guide,
        (X, y),
        {},
        num_particles=4,
        requests=QuadraticScore.requires,
    )
    logits, count, _ = binomial_parts(terms)
    pair = jnp.mean(_next_overlaps_by_definition(logits, count, 101), axis=0)
    q_obs = jnp.mean(jnp.exp(terms.log_lik), axis=0)
    np.testing.assert_allclose(
        DERANGEMENT.estimate(terms), 2.0 * q_obs - pair, rtol=10 * RTOL, atol=RTOL
    )
