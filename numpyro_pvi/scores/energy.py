"""The energy score, from reparameterised simulations; on scalar
observations with :math:`\\beta = 1` it is the CRPS and is estimated as
:class:`~numpyro_pvi.scores.CRPS` estimates it."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from numpyro_pvi._trace.reductions import particle_sum
from numpyro_pvi._trace.terms import LIKELIHOOD, ParticleTerms
from numpyro_pvi.scores._sites import ordered_pmf, simulations
from numpyro_pvi.scores.base import Score, strata
from numpyro_pvi.scores.closed_forms import crps_closed_form
from numpyro_pvi.scores.crps import ESTIMATORS, all_pairs, check_estimator, derangement
from numpyro_pvi.scores.crps_pmf import pmf_crps
from numpyro_pvi.scores.pair_sums import pair_norm_sum

__all__ = ["EnergyScore"]


def _pow_norm(x: jax.Array, beta: float) -> jax.Array:
    """``‖x‖^β`` over the last axis with a zero (not NaN) gradient at 0; a
    NaN stays NaN."""
    sq = jnp.sum(jnp.square(x), axis=-1)
    zero = sq == 0
    safe = jnp.where(zero, 1.0, sq)
    return jnp.where(zero, 0.0, safe ** (0.5 * beta))


class EnergyScore(Score):
    r"""The energy score with exponent :math:`\beta`, negated.

    .. math::

        S_{\rm ES}(q, y_i) = -\mathbb{E}_q\|Y - y_i\|^\beta
        + \tfrac{1}{2}\mathbb{E}_q\|Y - Y'\|^\beta, \qquad 0 < \beta < 2,

    strictly proper. One observation is the vector of all observed values at
    one index of the data plate. Estimated by the fair all-pairs estimator from
    reparameterised draws,

    .. math::

        \widehat{S}_i = -\frac{1}{M}\sum_{j} \|y^{\rm sim}_j - y_i\|^\beta
        + \frac{1}{2M(M-1)} \sum_{j \ne k}
        \|y^{\rm sim}_j - y^{\rm sim}_k\|^\beta,

    in :math:`O(M b\, d)` memory; stratified draws are weighted as in
    :class:`CRPS`. In one dimension with :math:`\beta = 1` it is the CRPS and is
    estimated as :class:`CRPS` estimates it (``"auto"`` takes the closed form or
    the pmf where :class:`CRPS` would), so ``PredictiveELBO("energy")`` and
    ``PredictiveELBO("crps")`` are then the same objective.
    ``estimator="derangement"`` pairs each draw with the next only.

    :param float beta: the exponent :math:`\beta \in (0, 2)`.
    :param str estimator: ``"auto"`` (default), ``"all-pairs"`` or
        ``"derangement"``.

    **References**

    1. Gneiting, T. & Raftery, A. E. (2007). *Strictly proper scoring rules,
       prediction, and estimation*. JASA 102(477), eq. 22.
    2. Lai, J. & Yao, Y. (2024). *Predictive variational inference: Learn the
       predictively optimal posterior distribution*. Table 1; appendix A.4.
    """

    name = "energy"
    requires = frozenset({LIKELIHOOD})
    min_particles = 2
    mixture_is_quadratic = True
    default_estimator = "auto"

    def __init__(
        self, beta: float = 1.0, *, estimator: str = default_estimator
    ) -> None:
        try:
            beta = float(beta)
        except (TypeError, ValueError):
            raise TypeError(
                f"EnergyScore: beta must be a number, got {beta!r}."
            ) from None
        if not 0.0 < beta < 2.0:
            raise ValueError(
                f"EnergyScore: beta must lie in (0, 2) for a strictly proper "
                f"score, got {beta!r}."
            )
        self.beta = beta
        self.estimator = check_estimator(estimator, "EnergyScore", ESTIMATORS[:3])

    def estimate(self, terms: ParticleTerms) -> jax.Array:
        scalar = terms.y_obs is not None and terms.y_obs.shape[-1] == 1
        is_crps = self.beta == 1.0 and scalar
        if is_crps and self.estimator == "auto":  # the CRPS's estimators
            if ordered_pmf(terms):
                return pmf_crps(terms)
            closed = crps_closed_form(terms)
            if closed is not None:
                return closed
        y_sim, y_obs = simulations(terms)
        if self.estimator == "derangement":
            return derangement(
                terms, y_sim, y_obs, lambda diff: _pow_norm(diff, self.beta)
            )
        if is_crps:
            return all_pairs(terms, y_sim[..., 0], y_obs[:, 0])
        if terms.num_strata > 1:
            v, _, m = strata(terms)
        else:
            m = y_sim.shape[0]
            v = jnp.full((m, 1), 1.0 / m, y_sim.dtype)
        obs_term = particle_sum(_pow_norm(y_sim - y_obs, self.beta) * v)
        return -obs_term + pair_norm_sum(y_sim, v, m, self.beta)

    def __repr__(self) -> str:
        if self.estimator == self.default_estimator:
            return f"EnergyScore(beta={self.beta!r})"
        return f"EnergyScore(beta={self.beta!r}, estimator={self.estimator!r})"
