"""The CRPS's closed forms: both expectations over the observations given
the particles exact (Normal, LogNormal and Normal-mixture likelihoods), or
the observation term exact and each pair from one draw (Poisson and
zero-inflated Poisson likelihoods), each particle paired with the next
(:func:`~numpyro_pvi.scores.pair_sums.next_pair_score`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from numpyro_pvi._core import normal_abs_mean, normal_strata_crps
from numpyro_pvi._core.lognormal import (
    lognormal_abs_mean,
    lognormal_mean,
    lognormal_pair_abs_mean,
)
from numpyro_pvi._core.normal_mixture import (
    mixture_abs_mean,
    mixture_pair_abs_mean,
)
from numpyro_pvi._core.poisson import (
    poisson_abs_mean,
    poisson_pair_abs_mean,
    zero_inflated_abs_mean,
    zero_inflated_pair_abs_mean,
)
from numpyro_pvi.particles import ParticleTerms, present
from numpyro_pvi.scores.base import stratum_weights
from numpyro_pvi.scores.pair_sums import next_pair_score

__all__ = ["closed_form", "has_closed_form"]


def _normal_pair(a: tuple[jax.Array, ...], b: tuple[jax.Array, ...]) -> jax.Array:
    """``E|Y - Y'|`` of independent ``Y ~ N(a)``, ``Y' ~ N(b)``."""
    return normal_abs_mean(a[0] - b[0], jnp.sqrt(jnp.square(a[1]) + jnp.square(b[1])))


def has_closed_form(terms: ParticleTerms) -> bool:
    closed = (terms.y_loc, terms.y_log_loc, terms.y_mix_loc, terms.y_rate)
    return any(x is not None for x in closed)


def _poisson(terms: ParticleTerms) -> jax.Array:
    """The closed form of Poisson and zero-inflated Poisson likelihoods: the
    observation term exact, each pair from one draw (``_core/poisson.py``)."""
    rate = present(terms.y_rate, "y_rate")[..., 0]  # (M, b or 1)
    counts = present(terms.y_count_sim, "y_count_sim")[..., 0]  # (M, b)
    y = present(terms.y_obs, "y_obs")[:, 0].astype(rate.dtype)
    pairs = (jnp.broadcast_to(rate, counts.shape), counts)
    if terms.y_gate is None:
        obs_term = poisson_abs_mean(rate, y)
        return next_pair_score(terms, obs_term, pairs, poisson_pair_abs_mean)
    gate = terms.y_gate[..., 0]
    obs_term = zero_inflated_abs_mean(rate, gate, y)
    gated = (*pairs, jnp.broadcast_to(gate, counts.shape))
    return next_pair_score(terms, obs_term, gated, zero_inflated_pair_abs_mean)


def closed_form(terms: ParticleTerms) -> jax.Array:
    """The derangement estimator with both expectations over ``y`` given
    ``θ`` in closed form (Normal, LogNormal and Normal-mixture
    likelihoods), or for Poisson likelihoods the one and a draw of the
    other (``y`` given ``θ_j``, for the pair of particles ``j`` and
    ``j + 1``)."""
    if terms.y_rate is not None:
        return _poisson(terms)
    if terms.y_mix_loc is not None:
        y = present(terms.y_obs, "y_obs")[:, 0]
        mixture = (
            present(terms.y_mix_weight, "y_mix_weight"),
            terms.y_mix_loc,
            present(terms.y_mix_scale, "y_mix_scale"),
        )  # each (M, b or 1, C)
        obs_term = mixture_abs_mean(mixture, y)
        return next_pair_score(terms, obs_term, mixture, mixture_pair_abs_mean)
    if terms.y_loc is None:
        log_loc = present(terms.y_log_loc, "y_log_loc")[..., 0]  # (M, b or 1)
        log_scale = present(terms.y_log_scale, "y_log_scale")[..., 0]
        y = present(terms.y_obs, "y_obs")[:, 0]
        mean = lognormal_mean(log_loc, log_scale)  # once for both terms
        obs_term = lognormal_abs_mean(log_loc, log_scale, mean, y)
        pairs = (log_loc, log_scale, mean)
        return next_pair_score(terms, obs_term, pairs, lognormal_pair_abs_mean)
    loc = present(terms.y_loc, "y_loc")[..., 0]  # (M, b or 1)
    scale = present(terms.y_scale, "y_scale")[..., 0]
    y = present(terms.y_obs, "y_obs")[:, 0]
    if terms.num_strata > 1:  # in one pass with its partial derivatives
        return normal_strata_crps(loc, scale, y, stratum_weights(terms))
    return next_pair_score(
        terms, normal_abs_mean(y - loc, scale), (loc, scale), _normal_pair
    )
