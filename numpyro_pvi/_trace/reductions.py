"""Reductions over particles that every built-in score uses: sums,
log-sum-exps, the predictive log density and the regularizers' terms."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from numpyro_pvi._trace.terms import ParticleTerms

__all__ = [
    "expected_log_q",
    "log_joint",
    "log_mean_exp",
    "observation_scores",
    "particle_logsumexp",
    "particle_sum",
    "predictive_log_density",
]


#: Largest number of elements per particle that :func:`particle_sum` sums
#: by a reduction; larger rows are contracted.
_REDUCE_MAX = 1 << 14


def particle_sum(x: jax.Array, weights: jax.Array | None = None) -> jax.Array:
    r""":math:`\sum_j w_j x_j` over the leading (particle) axis (``w = 1`` when
    ``weights`` is ``None``; ``weights`` is ``(M,)`` or ``x.shape``).

    Up to 16,384 elements per particle a reduction (``jnp.sum``); beyond,
    a contraction (``dot_general``): XLA's CPU backend reduces a leading
    axis column by column, which loses to a matrix-vector product once the
    array outgrows the cache.
    """
    if weights is not None and jnp.ndim(weights) > 1:
        x = weights * x
        weights = None
    if math.prod(x.shape[1:]) <= _REDUCE_MAX:
        if weights is not None:
            x = jnp.reshape(weights, weights.shape + (1,) * (x.ndim - 1)) * x
        return jnp.sum(x, axis=0)
    if weights is None:
        weights = jnp.ones(x.shape[0], x.dtype)
    return jnp.tensordot(weights, x, axes=(0, 0), precision=jax.lax.Precision.HIGHEST)


def particle_logsumexp(x: jax.Array) -> jax.Array:
    """``log Σ_j exp(x_j)`` over the leading (particle) axis, stable for
    ``±inf`` entries like :func:`jax.nn.logsumexp` (an all ``-inf`` slice
    gives ``-inf``), with the contraction of :func:`particle_sum`."""
    shift = jax.lax.stop_gradient(jnp.max(x, axis=0))
    shift = jnp.where(jnp.isfinite(shift), shift, 0.0)
    return jnp.log(particle_sum(jnp.exp(x - shift))) + shift


def log_mean_exp(x: jax.Array, axis: int = 0) -> jax.Array:
    """``log((1/M) Σ_j exp(x_j))`` along ``axis``, stable for ``-inf`` entries.

    An all ``-inf`` slice gives ``-inf`` (not NaN).
    """
    m = x.shape[axis]
    return particle_logsumexp(jnp.moveaxis(x, axis, 0)) - math.log(m)


def predictive_log_density(terms: ParticleTerms, log_f: jax.Array) -> jax.Array:
    r"""``(b, ...)`` :math:`\log \sum_j v_{ji} f_j`: the predictive mean of
    :math:`f_j = \exp(\text{log\_f}_j)` (``(M, b, ...)``, e.g. ``log_lik``)
    under the particles' weights; ``log_mean_exp`` for one stratum.

    :param terms: the particle terms (for their weights).
    :param log_f: ``(M, b, ...)`` per-particle log values.
    """
    if terms.num_strata == 1:
        return log_mean_exp(log_f, axis=0)
    log_w = jnp.reshape(
        terms.weights.log_predictive,
        terms.weights.log_predictive.shape + (1,) * (log_f.ndim - 2),
    )
    return particle_logsumexp(log_f + log_w)


def log_joint(terms: ParticleTerms) -> jax.Array:
    """``(M,)`` the log joint density ``log p(θ_j, y)`` of each particle, every
    site with its own scale as in :func:`numpyro.infer.util.log_density`
    (needs ``"log_lik"``).

    :param terms: particle terms.
    """
    if terms.log_lik_scaled is None:
        raise ValueError(
            "log_joint: the particle terms have no 'log_lik_scaled': an "
            "objective that reads it must request 'log_lik'."
        )
    return terms.log_prior + jnp.sum(terms.log_lik_scaled, 1)


def expected_log_q(terms: ParticleTerms) -> jax.Array:
    r""":math:`\mathbb{E}_q \log q`: minus the guide's closed-form entropy
    term when it has one (``terms.entropy``), else the weighted mean of
    ``log_q`` over the particles.

    :param terms: particle terms.
    """
    if terms.entropy is not None:
        return -terms.entropy
    return jnp.sum(terms.weights.particle * terms.log_q)


def observation_scores(estimate: jax.Array, terms: ParticleTerms) -> jax.Array:
    """``(b,)`` a score's per-observation estimate with the observations
    that masks remove entirely scoring ``0`` (as their log-likelihood does
    in NumPyro), whatever the estimate computed there.

    :param estimate: ``(b,)`` the output of a score's ``estimate``.
    :param terms: the particle terms it was computed from.
    """
    if terms.mask is None:
        return estimate
    return jnp.where(terms.mask, estimate, jnp.zeros_like(estimate))
