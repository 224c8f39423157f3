r"""Per-observation estimates of a predictive score with their Monte Carlo error.

The log score :math:`\log \sum_s v_{si}\, p(y_i \mid \theta_s)` is an
importance-sampling estimate; :func:`pointwise_estimate` returns with it the
Pareto k̂ of the weights (Vehtari et al. 2024) and the standard error from the
smoothed weights. Other scores' standard errors are those of ``B`` batch
means (k̂ is NaN). The data set's total has an error that is not the sum of
the observations' (they share the draws): :func:`estimate_with_total`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_pvi._trace.reductions import observation_scores
from numpyro_pvi._trace.terms import ParticleTerms, present
from numpyro_pvi.evaluation.psis import psis_smooth

if TYPE_CHECKING:  # the scores import the core: no import cycle at run time
    from numpyro_pvi.scores import Score

#: Batches of the batch-means standard error.
NUM_BATCHES = 20
#: The fields of :class:`~numpyro_pvi.particles.ParticleTerms` with one
#: entry per particle (leading axis).
_PER_PARTICLE = (
    "log_prior",
    "log_q",
    "log_lik",
    "log_lik_scaled",
    "log_lik_sim",
    "log_q_fixed",
    "latents",
    "guide_draws",
)


class Pointwise(NamedTuple):
    """Per-observation estimates, each ``(b,)``.

    :ivar score: the estimate (``0`` for an observation masked out).
    :ivar se: its Monte Carlo standard error.
    :ivar pareto_k: k̂ of the importance weights (log score), NaN otherwise.
    :ivar observed: whether the observation is scored (not masked out).
    """

    # JAX arrays inside the compiled programs, NumPy arrays after them
    score: jax.Array | np.ndarray
    se: jax.Array | np.ndarray
    pareto_k: jax.Array | np.ndarray
    observed: jax.Array | np.ndarray


def log_sum_estimate(
    log_contrib: jax.Array, num_strata: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    r"""``log Σ_s c_s``, its standard error and k̂, from ``(S,)`` log
    contributions :math:`\log c_s` (weights included), ``S = K M`` for ``K``
    strata of ``M`` draws (i.i.d. draws: ``K = 1``).

    With :math:`\tilde c` the Pareto-smoothed normalised contributions, the
    relative variance of the sum is :math:`\sum_k [\sum_m \tilde c_{km}^2 -
    (\sum_m \tilde c_{km})^2 / M]` (independent strata; one stratum:
    :math:`\sum_s \tilde c_s^2 - 1/S`), and by the delta method it is the
    variance of the logarithm. Contributions equal up to rounding (a guide
    at a point) have k̂ = ``-inf``: the estimate is exact.
    """
    estimate, k, w = log_sum_parts(log_contrib)
    return estimate, jnp.sqrt(_strata_variance(w, num_strata)), k


def log_sum_parts(log_contrib: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    r"""``log Σ_s c_s``, k̂ and the ``(S,)`` Pareto-smoothed normalised
    contributions :math:`\tilde c_s`."""
    estimate = jax.nn.logsumexp(log_contrib)
    log_weight, k = psis_smooth(log_contrib)
    k = jnp.where(_constant(log_contrib), -jnp.inf, k)
    return estimate, k, jnp.exp(log_weight)


def _strata_variance(w: jax.Array, num_strata: int) -> jax.Array:
    r""":math:`\sum_k [\sum_m w_{km}^2 - (\sum_m w_{km})^2 / M]` of ``(K M,)``
    values: the variance of their sum, ``M`` i.i.d. draws in each of ``K``
    independent strata (clipped at zero)."""
    w = w.reshape(num_strata, -1)
    m = w.shape[1]
    var = jnp.sum(jnp.square(w)) - jnp.sum(jnp.square(jnp.sum(w, axis=1))) / m
    return jnp.maximum(var, 0.0)


def _constant(log_values: jax.Array) -> jax.Array:
    """Whether the values are equal up to rounding (``-inf`` entries, zero
    weights, make them not constant)."""
    top, bottom = jnp.max(log_values), jnp.min(log_values)
    eps = jnp.finfo(log_values.dtype).eps
    spread = jnp.where(jnp.isfinite(bottom), top - bottom, jnp.inf)
    return spread <= 64 * eps * jnp.maximum(1.0, jnp.abs(top))


def particle_subset(terms: ParticleTerms, index: jax.Array) -> ParticleTerms:
    """The terms of the particles ``index`` (a traced integer array), their
    weights renormalised to the smaller set."""
    num, sub = terms.weights.log_predictive.shape[0], index.shape[0]
    fields = {
        name: jax.tree.map(lambda x: jnp.take(x, index, axis=0), getattr(terms, name))
        for name in _PER_PARTICLE
        if getattr(terms, name) is not None
    }
    if terms.likelihood is not None:
        fields["likelihood"] = terms.likelihood.particles(index)
    weights = terms.weights
    fields["weights"] = weights._replace(
        particle=jnp.take(weights.particle, index, axis=0) * (num / sub),
        log_predictive=jnp.take(weights.log_predictive, index, axis=0)
        + math.log(num / sub),
    )
    return terms._replace(**fields)


#: The axis of the data plate's observations in each per-observation field
#: of :class:`~numpyro_pvi.particles.ParticleTerms` (the likelihood keeps
#: the observations taken: ``Likelihood.observations``).
_OBSERVATION_AXIS = {
    "log_lik": 1,
    "log_lik_scaled": 1,
    "log_lik_sim": 1,
    "mask": 0,
    "y_obs": 0,
}


def observation_subset(terms: ParticleTerms, index: jax.Array) -> ParticleTerms:
    """The terms of the observations ``index`` (a traced integer array, along
    the data plate): what a score estimates at those observations alone.
    The fields that are not per observation (the latents, the observed
    values by site) are kept whole."""

    def take(x: jax.Array, axis: int) -> jax.Array:
        return x if x.shape[axis] == 1 else jnp.take(x, index, axis=axis)

    fields: dict[str, Any] = {
        name: take(getattr(terms, name), axis)
        for name, axis in _OBSERVATION_AXIS.items()
        if getattr(terms, name) is not None
    }
    weights = terms.weights
    fields["weights"] = weights._replace(
        log_predictive=take(weights.log_predictive, 1),
        observation=None
        if weights.observation is None
        else take(weights.observation, 0),
    )
    if terms.likelihood is not None:
        fields["likelihood"] = terms.likelihood.observations(index)
    return terms._replace(**fields)


def pointwise_estimate(score: Score, terms: ParticleTerms) -> Pointwise:
    """``score``'s per-observation estimate with its Monte Carlo error.

    :param score: the score.
    :param terms: the particle terms of the fitted guide's draws.
    :return: :class:`Pointwise` over the observations of the terms.
    """
    return estimate_with_total(score, terms, reliable_k=math.inf)[0]


def estimate_with_total(
    score: Score, terms: ParticleTerms, *, reliable_k: float
) -> tuple[Pointwise, jax.Array]:
    r""":func:`pointwise_estimate` and the Monte Carlo standard error of the
    sum of the estimates over the observations, which share the draws.

    Every observation is estimated from the same draws, so their errors are
    correlated and the sum's variance is not the sum of their variances: a
    draw that moves every prediction moves every estimate. For the log score
    the sum's error is, by the delta method, that of :math:`\sum_s W_s` with
    :math:`W_s = \sum_i \tilde c_{is}` (the smoothed normalised weights of
    draw :math:`s` summed over the observations), over the observations
    with k̂ below ``reliable_k`` (the others are re-estimated from fresh
    draws or named unreliable: their variances are added apart). For the
    other scores it is the batch-means error of the batches' sums over the
    observed observations.

    :return: the :class:`Pointwise` estimates and the sum's standard error.
    """
    b = terms.weights.log_predictive.shape[1]
    observed = jnp.ones(b, bool) if terms.mask is None else terms.mask
    from numpyro_pvi.scores import LogScore  # the scores import the core

    if isinstance(score, LogScore):
        log_lik = present(terms.log_lik, "log_lik")
        log_contrib = log_lik + terms.weights.log_predictive  # (S, b)
        estimate, k, w = jax.vmap(log_sum_parts, in_axes=1)(log_contrib)
        se = jax.vmap(lambda x: jnp.sqrt(_strata_variance(x, terms.num_strata)))(w)
        shared_obs = observed & (k < reliable_k)
        if terms.log_lik_sim is not None:  # those re-estimated apart
            num = log_lik.shape[0]
            shared_obs &= ~unsettled(near_draws(terms), k, num, reliable_k, jnp)
        shared = jnp.sum(jnp.where(shared_obs[:, None], w, 0), 0)
        total_se = jnp.sqrt(_strata_variance(shared, terms.num_strata))
    else:
        estimate = score.estimate(terms)
        batches = _batch_estimates(score, terms)
        se = _batch_se(batches)
        total_se = _batch_se(jnp.sum(jnp.where(observed, batches, 0), axis=1))
        k = jnp.full(b, jnp.nan, dtype=estimate.dtype)
    estimate = observation_scores(estimate, terms)
    se = jnp.where(observed, se, 0.0)
    k = jnp.where(observed, k, jnp.nan)
    return Pointwise(estimate, se, k, observed), total_se


#: Fewest draws under whose predictive an observation is not far in the
#: tail (:func:`near_draws`) for its estimate to rest on the draws alone.
MIN_NEAR = 10


def near_draws(terms: ParticleTerms) -> jax.Array:
    """``(b,)`` the draws under whose predictive each observation is no less
    likely than a simulation of it (``log_lik >= log_lik_sim``): few of them
    (below :data:`MIN_NEAR`) and the observation lies far in the tail of
    every draw's predictive, where the estimate rests on the guide's tail
    beyond its draws, which k̂ cannot see. All draws where the observations
    cannot be simulated (no ``log_lik_sim``)."""
    log_lik = present(terms.log_lik, "log_lik")
    if terms.log_lik_sim is None:
        return jnp.full(log_lik.shape[1], log_lik.shape[0])
    return jnp.sum(log_lik >= terms.log_lik_sim, axis=0)


def unsettled(near: Any, k: Any, num_draws: Any, threshold: float, xp: Any = np) -> Any:
    r"""Whether each log-score estimate needs more draws to be settled: far
    in the tail of every draw's predictive (fewer than :data:`MIN_NEAR`
    near draws, :func:`near_draws`), or k̂'s 95% interval (standard error
    :math:`(1 + \hat k)/\sqrt{M}` for a tail of ``M`` draws of
    ``num_draws``) holding ``threshold``; not where k̂ is above it whatever
    more draws show."""
    num_draws = xp.maximum(xp.asarray(num_draws), 1)
    tail = xp.ceil(xp.minimum(0.2 * num_draws, 3 * xp.sqrt(num_draws)))
    k_se = xp.maximum(1.0 + k, 0.0) / xp.sqrt(tail)
    straddles = xp.isfinite(k) & (xp.abs(k - threshold) <= 1.96 * k_se)
    above = ~(k - 1.96 * k_se <= threshold)
    return ((near < MIN_NEAR) | straddles) & ~above


def log_contributions(terms: ParticleTerms) -> tuple[jax.Array, jax.Array]:
    """``(S, b)`` the log contributions ``log v_s + log p(y_i | θ_s)`` of the
    log score's estimate and whether each observation is near each draw's
    predictive (:func:`near_draws`)."""
    log_lik = present(terms.log_lik, "log_lik")
    near = jnp.ones(log_lik.shape, bool)
    if terms.log_lik_sim is not None:
        near = log_lik >= terms.log_lik_sim
    return log_lik + terms.weights.log_predictive, near


def mixture_terms(a: ParticleTerms, b: ParticleTerms, weight: float) -> ParticleTerms:
    r"""The terms of the mixture :math:`w\,q_a + (1 - w)\,q_b` of two fits of
    one guide, as stratified draws: ``a``'s strata weighted by
    :math:`w`, then ``b``'s by :math:`1 - w` (both must have the same number
    of draws per stratum; the observations' fields are ``a``'s)."""
    if a.weights.log_predictive.shape != b.weights.log_predictive.shape:
        raise ValueError(
            "mixture_terms: the two fits' draws differ in shape "
            f"{a.weights.log_predictive.shape} and {b.weights.log_predictive.shape}."
        )
    fields = {
        name: jax.tree.map(
            lambda x, y: jnp.concatenate([x, y]), getattr(a, name), getattr(b, name)
        )
        for name in _PER_PARTICLE
        if getattr(a, name) is not None
    }
    log_w, log_1mw = math.log(weight), math.log1p(-weight)
    fields["weights"] = a.weights._replace(
        particle=jnp.concatenate(
            [a.weights.particle * weight, b.weights.particle * (1 - weight)]
        ),
        log_predictive=jnp.concatenate(
            [a.weights.log_predictive + log_w, b.weights.log_predictive + log_1mw]
        ),
    )
    if a.likelihood is not None and b.likelihood is not None:
        fields["likelihood"] = a.likelihood.join(b.likelihood)
    return a._replace(num_strata=a.num_strata + b.num_strata, entropy=None, **fields)


def pair_gain(score: Score, a: ParticleTerms, b: ParticleTerms) -> jax.Array:
    r"""``(b,)`` the quadratic coefficient :math:`G_{ab}` of the score of the
    mixture of two fits' predictives: for a score whose mixture score is
    quadratic in the weights (``score.mixture_is_quadratic``),
    :math:`S(w F_a + (1-w) F_b) = w S(F_a) + (1-w) S(F_b) + w(1-w) G_{ab}`,
    so :math:`G_{ab} = 4[S(\tfrac12 F_a + \tfrac12 F_b) - \tfrac12 S(F_a) -
    \tfrac12 S(F_b)]`, estimated from the same draws as the two scores (an
    exact identity of the estimates, not only of their expectations).
    Observations that masks remove have gain ``0``."""
    mid = score.estimate(mixture_terms(a, b, 0.5))
    gain = 4.0 * (mid - 0.5 * (score.estimate(a) + score.estimate(b)))
    return observation_scores(gain, a)


def _batch_estimates(score: Score, terms: ParticleTerms) -> jax.Array:
    """``(B, b)`` ``score``'s estimate from each of ``B`` batches of the
    draws (every stratum's draws split alike); ``(1, b)`` of NaN when the
    draws make fewer than two batches."""
    k = terms.num_strata
    m = terms.weights.log_predictive.shape[0] // k
    batches = min(NUM_BATCHES, m // max(score.min_particles, 2))
    if batches < 2:
        return jnp.full((1, terms.weights.log_predictive.shape[1]), jnp.nan)
    size = m // batches
    start = jnp.arange(k)[:, None] * m + jnp.arange(size)[None, :]  # (K, size)
    index = (start[None] + (jnp.arange(batches) * size)[:, None, None]).reshape(
        batches, -1
    )
    return jax.lax.map(lambda idx: score.estimate(particle_subset(terms, idx)), index)


def _batch_se(estimates: jax.Array) -> jax.Array:
    """The batch-means standard error along the leading axis, scaled so that
    estimates around 1e20 (a fit that diverged) do not overflow float32's
    squares (NaN for a single batch)."""
    centred = estimates - jnp.mean(estimates, axis=0)
    scale = jnp.max(jnp.abs(centred), axis=0)
    scale = jnp.where(scale > 0, scale, 1.0)
    num = estimates.shape[0]
    return scale * jnp.std(centred / scale, axis=0, ddof=1) / math.sqrt(num)
