"""The :class:`Score` protocol and the logarithmic score."""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp

from numpyro_pvi._trace.reductions import predictive_log_density
from numpyro_pvi._trace.terms import LOG_LIK, ParticleTerms, present

__all__ = ["LogScore", "Score", "strata", "stratum_weights"]


class Score:
    r"""Base class of positively oriented scoring rules estimated from particles.

    Subclasses set ``requires`` (``"log_lik"``: per-observation log-likelihoods;
    ``"likelihood"``: the observed sites' distributions at every particle, which
    :func:`~numpyro_pvi.scores.simulations` draws from and
    :func:`~numpyro_pvi.scores.support_pmf` enumerates), ``min_particles``, and
    implement :meth:`estimate`. ``mixture_is_quadratic`` says the score of a
    mixture of predictives is quadratic in its weights (what stacking solves).
    Particle ``j`` enters observation ``i`` with weight
    ``exp(terms.weights.log_predictive[j, i])``; an estimator uses it or refuses
    stratified draws with :func:`~numpyro_pvi.particles.require_iid`.

    **Example**: the (negated) interval score (Gneiting & Raftery 2007, §6.2):

    .. code-block:: python

        import jax.numpy as jnp
        from numpyro_pvi.particles import require_iid
        from numpyro_pvi.scores import Score, simulations

        class IntervalScore(Score):
            name = "interval"
            requires = frozenset({"likelihood"})
            min_particles = 2

            def __init__(self, alpha=0.1):
                self.alpha = alpha

            def estimate(self, terms):
                require_iid(terms, "IntervalScore")  # unweighted quantiles
                y_sim, y_obs = simulations(terms)  # (M, b, d), (b, d)
                sims, y = y_sim[..., 0], y_obs[:, 0]
                lo = jnp.quantile(sims, self.alpha / 2, axis=0)
                hi = jnp.quantile(sims, 1 - self.alpha / 2, axis=0)
                miss = jnp.maximum(lo - y, 0) + jnp.maximum(y - hi, 0)
                return -(hi - lo) - 2 / self.alpha * miss

        loss = PredictiveELBO(IntervalScore(0.1), num_particles=64)

    **References**

    1. Gneiting, T. & Raftery, A. E. (2007). *Strictly proper scoring rules,
       prediction, and estimation*. JASA 102(477), 359-378.
    """

    name: ClassVar[str] = "score"
    #: set on the class, or on an instance whose options change what it
    #: reads (``CRPS(estimator="pmf")``)
    requires: frozenset[str] = frozenset()
    min_particles: ClassVar[int] = 1
    mixture_is_quadratic: ClassVar[bool] = False

    def estimate(self, terms: ParticleTerms) -> jax.Array:
        """Per-observation score estimates.

        :param terms: the particle terms of ``M`` draws from the guide.
        :return: array of shape ``(b,)``, differentiable in the guide's
            parameters.
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        # value objects: equal scores share compiled programs
        return type(other) is type(self) and vars(other) == vars(self)

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(vars(self).items()))))


class LogScore(Score):
    r"""The logarithmic score of the predictive distribution.

    .. math::

        S_{\log}(q, y_i) = \log q(y_i)
        \approx \log \frac{1}{M} \sum_{j=1}^M p(y_i \mid \theta_j),
        \qquad \theta_j \sim q_\phi,

    computed in log space (``logsumexp`` minus ``log M``).

    **References**

    1. Lai, J. & Yao, Y. (2024). *Predictive variational inference: Learn the
       predictively optimal posterior distribution*. Table 1, row 1.
    """

    name = "log"
    requires = frozenset({LOG_LIK})

    def estimate(self, terms: ParticleTerms) -> jax.Array:
        return predictive_log_density(terms, present(terms.log_lik, "log_lik"))


def strata(terms: ParticleTerms) -> tuple[jax.Array, int, int]:
    """Stratified weights ``v_j = ω_k(x_i) / M`` ``(K M, b)``, ``K`` and ``M``."""
    k = terms.num_strata
    m = terms.weights.log_predictive.shape[0] // k
    return jnp.exp(terms.weights.log_predictive), k, m


def stratum_weights(terms: ParticleTerms) -> jax.Array:
    """``(K, b)`` the strata's weights ``ω_k(x_i)`` in each observation's
    predictive: :func:`strata`'s ``v_j`` times ``M``, read from each
    stratum's first draw (the weights are the same for each of a stratum's
    draws), with no ``(K M, b)`` array of them."""
    k = terms.num_strata
    log_v = terms.weights.log_predictive
    m = log_v.shape[0] // k
    return jnp.exp(log_v.reshape((k, m) + log_v.shape[1:])[:, 0]) * m
