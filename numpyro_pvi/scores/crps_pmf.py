"""The CRPS of a finite support of consecutive integers from the pmf, the
cdfs' squares from distinct pairs of particles (``CRPS(estimator="pmf")``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from numpyro_pvi._core import CDF_SUMS_SUPPORT, binomial_cdf_sums
from numpyro_pvi.particles import ParticleTerms, present
from numpyro_pvi.scores.base import strata
from numpyro_pvi.scores.pair_sums import stratum_sums, weighted_strata
from numpyro_pvi.scores.quadratic import binomial_closed_form

__all__ = ["pmf_crps"]


def _cdf_sums(
    terms: ParticleTerms, pmf: jax.Array, k: int
) -> tuple[jax.Array, jax.Array]:
    """``(K, V - 1, b)`` per stratum the totals and sums of squares of the
    particles' cdfs but at the last support value: for one Binomial
    component per observation from its logits and counts block by block
    (:func:`~numpyro_pvi._core.pmf.binomial_cdf_sums`), else from the
    ``(K M, V, b, 1)`` pmf."""
    closed = binomial_closed_form(terms, CDF_SUMS_SUPPORT)
    if closed is None:
        cdf = jnp.cumsum(pmf[:, :-1, :, 0], axis=1)  # (K M, V - 1, b)
        return stratum_sums(cdf, k), stratum_sums(jnp.square(cdf), k)
    logits, count, size = closed
    m = logits.shape[0] // k
    sums = [
        binomial_cdf_sums(logits[s * m : (s + 1) * m], count, size) for s in range(k)
    ]
    totals, own = (jnp.stack(x)[:, :-1] for x in zip(*sums, strict=True))
    return totals, own


def pmf_crps(terms: ParticleTerms) -> jax.Array:
    r"""``(b,)`` the fair CRPS from the pmf over a finite support of
    consecutive integers, :math:`-\sum_v (F(v) - 1\{y_i \le v\})^2` with
    :math:`F(v)^2` estimated from distinct pairs of particles (strata
    weighted as in the quadratic score); the last support value, where both
    are 1, is left out."""
    pmf = present(terms.pmf, "pmf")  # (K M, V, b, c)
    below = present(terms.obs_support, "obs_support")  # (V, b, c)
    if pmf.shape[-1] != 1:
        raise ValueError(
            f"CRPS(estimator='pmf') is for scalar observations, but one "
            f"observation has {pmf.shape[-1]} values (a vector-valued site, "
            "several observed sites per index, or scalar observed sites outside "
            "any plate, which form one observation together): use "
            "score='quadratic', which scores them jointly."
        )
    below = jnp.cumsum(below[:-1, :, 0], axis=0).astype(pmf.dtype)  # 1{y <= v}
    v, k, m = strata(terms)
    totals, own = _cdf_sums(terms, pmf, k)
    if k == 1:
        mean = totals[0] / m
        square = jnp.sum(jnp.square(totals[0]) - own[0], axis=0) / (m * (m - 1))
    else:
        mean, total, within = weighted_strata((totals, own), v, m)
        square = total + within / (m - 1)
    return -(square - 2.0 * jnp.sum(mean * below, axis=0) + jnp.sum(below, axis=0))
