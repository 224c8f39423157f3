"""The CRPS of a finite support of consecutive integers from the pmf, the
cdfs' squares from distinct pairs of particles (``CRPS(estimator="pmf")``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from numpyro_pvi._trace.site_values import observation_layout
from numpyro_pvi._trace.terms import ParticleTerms
from numpyro_pvi.scores._pmf import CDF_SUMS_SUPPORT, binomial_cdf_sums
from numpyro_pvi.scores._sites import QUADRATIC_MAX_VALUES, support_pmf
from numpyro_pvi.scores.base import stratum_weights
from numpyro_pvi.scores.closed_forms.binomial import binomial_parts
from numpyro_pvi.scores.pair_sums import stratum_sums

__all__ = ["pmf_crps"]


def _cdf_sums(
    terms: ParticleTerms, pmf: jax.Array, k: int
) -> tuple[jax.Array, jax.Array]:
    """``(K, V - 1, b)`` per stratum the totals of the particles' cdfs but at
    the last support value, and ``(K, b)`` the sums of their squares over
    those values and the particles: for one Binomial component per
    observation from its logits and counts block by block
    (:func:`~numpyro_pvi.scores._pmf.binomial_cdf_sums`), else from the
    ``(K M, V, b, 1)`` pmf."""
    closed = binomial_parts(terms, CDF_SUMS_SUPPORT)
    if closed is None:
        cdf = jnp.cumsum(pmf[:, :-1, :, 0], axis=1)  # (K M, V - 1, b)
        return stratum_sums(cdf, k), stratum_sums(jnp.sum(jnp.square(cdf), 1), k)
    logits, count, size = closed
    m = logits.shape[0] // k
    sums = [
        binomial_cdf_sums(logits[s * m : (s + 1) * m], count, size) for s in range(k)
    ]
    totals, own = (jnp.stack(x) for x in zip(*sums, strict=True))
    return totals, own


def _squares(
    totals: jax.Array, own: jax.Array, terms: ParticleTerms
) -> tuple[jax.Array, jax.Array]:
    r"""``(V - 1, b)`` the predictive cdf :math:`\bar F(v)` and ``(b,)``
    :math:`\sum_v \widehat{\bar F(v)^2}` from distinct pairs of particles
    (each stratum's draws weighted :math:`\omega_s / M`, the pairs within a
    stratum times :math:`M / (M - 1)`), from :func:`_cdf_sums`."""
    k = terms.num_strata
    m = terms.weights.log_predictive.shape[0] // k
    if k == 1:
        square = jnp.sum(jnp.square(totals[0]), axis=0) - own[0]
        return totals[0] / m, square / (m * (m - 1))
    w = stratum_weights(terms) / m  # (K, b), each draw's weight
    mean = jnp.sum(w[:, None] * totals, axis=0)
    w2 = jnp.square(w)
    between = jnp.sum(jnp.square(mean), axis=0) - jnp.sum(w2 * own, axis=0)
    within = jnp.sum(w2 * (jnp.sum(jnp.square(totals), axis=1) - own), axis=0)
    return mean, between + within / (m - 1)


def pmf_crps(terms: ParticleTerms) -> jax.Array:
    r"""``(b,)`` the fair CRPS from the pmf over a finite support of
    consecutive integers, :math:`-\sum_v (F(v) - 1\{y_i \le v\})^2` with
    :math:`F(v)^2` estimated from distinct pairs of particles (strata
    weighted as in the quadratic score); the last support value, where both
    are 1, is left out."""
    pmf, below = support_pmf(terms)  # (K M, V, b, c), (V, b, c)
    if pmf.shape[-1] != 1:
        raise ValueError(
            f"The CRPS from the pmf is for scalar observations, but each "
            f"observation has {pmf.shape[-1]} values "
            f"({observation_layout(terms.observation_sites)}; a vector-valued "
            "site, several observed sites at one index of the data plate, or "
            "scalar observed sites outside any plate form one observation "
            "together). "
            + (
                "Use score='quadratic' (which scores them jointly) or 'log' for "
                "these observations."
                if pmf.shape[-1] <= QUADRATIC_MAX_VALUES
                else "Use score='log' for these observations."
            )
        )
    below = jnp.cumsum(below[:-1, :, 0], axis=0).astype(pmf.dtype)  # 1{y <= v}
    totals, own = _cdf_sums(terms, pmf, terms.num_strata)
    mean, square = _squares(totals, own, terms)
    return -(square - 2.0 * jnp.sum(mean * below, axis=0) + jnp.sum(below, axis=0))
