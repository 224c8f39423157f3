"""The :class:`Score` protocol and the logarithmic score."""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp

from numpyro_pvi._core import QUADRATIC_MAX_VALUES, site_names
from numpyro_pvi.particles import (
    LOG_LIK,
    ParticleTerms,
    predictive_log_density,
    present,
)

__all__ = [
    "LogScore",
    "Score",
    "finite_support_advice",
    "simulations",
    "strata",
    "stratum_weights",
]


class Score:
    r"""Base class of positively oriented scoring rules estimated from particles.

    Subclasses set ``requires`` (a subset of ``{"log_lik", "y_sim",
    "y_loc_scale", "y_log_loc_scale", "y_normal_mixture", "y_poisson",
    "log_pmf", "pmf", "binomial"}``: per-observation log-likelihoods,
    reparameterised simulated observations, the location and scale of Normal
    likelihoods and of the logarithm of LogNormal ones, the components of
    Normal-mixture likelihoods, the rates and a draw of Poisson ones, the pmf
    over a finite support as log probabilities or probabilities, or the
    logits and counts of Binomial likelihoods) and implement
    :meth:`estimate`. ``min_particles`` is the smallest number of
    particles the estimator is defined for.

    ``mixture_is_quadratic`` says that the score of a mixture
    :math:`\sum_c w_c F_c` of predictives is a quadratic function of the
    weights :math:`w` (kernel scores such as the CRPS and the energy score,
    and the quadratic score), and that :meth:`estimate` under stratified
    draws is that quadratic function of the strata weights: stacking
    (:func:`~numpyro_pvi.selection.stacking_weights`) then solves for the
    weights from the candidates' pairwise mixtures.

    ``terms.log_lik`` is ``(M, b)``; ``terms.y_sim`` is ``(M, b, d)`` with
    ``terms.y_obs`` ``(b, d)`` (one flattened row per observation, several
    observed sites concatenated); ``terms.log_pmf`` and ``terms.pmf`` are
    ``(M, K, b, c)`` (the support axis ``K`` before the observations,
    components ``c`` last); see
    :class:`~numpyro_pvi.particles.ParticleTerms`.

    **Weights.** Particle ``j`` enters the predictive of observation ``i``
    with weight ``exp(terms.weights.log_predictive[j, i])``: ``1/M`` for i.i.d. draws
    (``terms.num_strata == 1``), the strata weights of a mixture guide
    otherwise. An estimator must use them (e.g. through
    :func:`~numpyro_pvi.particles.predictive_log_density`), or call
    :func:`~numpyro_pvi.particles.require_iid` to refuse stratified draws,
    as the example does.

    **Example**: a user-defined score, the (negated) interval score of the
    central :math:`(1-\alpha)` prediction interval :math:`[l, u]` (Gneiting
    & Raftery 2007, §6.2),
    :math:`S = -(u - l) - \tfrac{2}{\alpha}(l - y)_+ - \tfrac{2}{\alpha}(y - u)_+`,
    with :math:`l, u` the empirical quantiles of the simulated observations:

    .. code-block:: python

        import jax.numpy as jnp
        from numpyro_pvi.particles import require_iid
        from numpyro_pvi.scores import Score

        class IntervalScore(Score):
            name = "interval"
            requires = frozenset({"y_sim"})
            min_particles = 2

            def __init__(self, alpha=0.1):
                self.alpha = alpha

            def estimate(self, terms):
                require_iid(terms, "IntervalScore")  # unweighted quantiles
                y, sims = terms.y_obs[:, 0], terms.y_sim[..., 0]  # (b,), (M, b)
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


def simulations(terms: ParticleTerms, score: str) -> tuple[jax.Array, jax.Array]:
    """The simulated and the observed values, ``(M, b, d)`` and ``(b, d)``,
    as floating-point arrays (counts are simulated as integers)."""
    closed_form = (
        "Use the CRPS in closed form (score='crps', estimator 'auto' or "
        "'closed-form'; EnergyScore(beta=1.0) on scalar observations is the "
        "same), or score='log'."
    )
    closed = {
        "the observed site's Normal mixture (MixtureSameFamily or "
        "MixtureGeneral) has no reparameterised sampler (its component is a "
        "discrete draw)": (terms.y_mix_loc, closed_form),
        "the observed Poisson or negative-binomial counts have no "
        "reparameterised sampler (a count is a discrete draw)": (
            terms.y_rate,
            closed_form,
        ),
        "the observed values of a finite support have no reparameterised "
        "sampler (a draw is a discrete value)": (
            terms.obs_support,  # the request finite_pmf, filled
            finite_support_advice(terms),
        ),
    }
    why = next((k for k, (v, _) in closed.items() if v is not None), None)
    if terms.y_sim is None and why is not None:
        raise ValueError(
            f"score={score!r} with this estimator compares simulated observations "
            f"with the observed ones, and {why} (observed site(s) "
            f"{site_names(terms.observation_sites)}). {closed[why][1]}"
        )
    if terms.y_sim is None or terms.y_obs is None:
        raise ValueError(
            f"score={score!r} needs simulated observations: request 'y_sim' from "
            "the particle machinery."
        )
    dtype = jnp.result_type(terms.y_sim, terms.y_obs, float)
    return terms.y_sim.astype(dtype), terms.y_obs.astype(dtype)


def finite_support_advice(terms: ParticleTerms, *, scalar: bool = True) -> str:
    """The scores of observations of a finite support, by their number of
    values (:data:`~numpyro_pvi._core.site_laws.QUADRATIC_MAX_VALUES`;
    ``scalar=False``: not the CRPS)."""
    values = sum(width for _, width in terms.observation_sites)
    if values == 1 and scalar:
        return (
            "Use the CRPS from the pmf (score='crps', estimator 'auto' or "
            "'pmf'; EnergyScore(beta=1.0) on scalar observations is the same), "
            "score='quadratic' or score='log'."
        )
    if values <= QUADRATIC_MAX_VALUES:
        return "Use score='quadratic' (which scores them jointly) or score='log'."
    return f"Use score='log' (an observation has {values} values)."


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
