r"""What a score or objective is computed from: the terms of ``M`` particles.

The particle machinery (:mod:`numpyro_pvi._core.particles`) draws particles
:math:`\theta_j` from the guide, replays the model against each of them and
returns a :class:`ParticleTerms`: arrays with a leading particle axis, and the
weight with which each particle enters. This module is the public side of
that exchange: the type, the names of the quantities a :class:`Score
<numpyro_pvi.scores.Score>` can request, the reductions over particles every
built-in score uses, and the :class:`StratifiedGuide` protocol through which
a guide asks for stratified draws.

**Weights are always carried.** ``M`` i.i.d. draws are one stratum, every
particle with weight :math:`1/M`. A guide that is a :class:`StratifiedGuide`
(a mixture, :class:`~numpyro_pvi.guides.AutoGaussianMixture`) is drawn from
stratum by stratum, ``M`` draws from each of its ``K`` components, particle
:math:`(k, m)` entering the predictive of observation :math:`i` with weight
:math:`v_{ki} = \omega_k(x_i)/M`. An estimator written with the weights is
correct for both; ``terms.num_strata == 1`` (a Python integer) lets it take
an unweighted fast path chosen when the program is traced.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol, TypeVar, runtime_checkable

import jax
import jax.numpy as jnp

__all__ = [
    "BINOMIAL",
    "FIELDS",
    "GUIDE_DRAWS",
    "LATENTS",
    "LOG_LIK",
    "LOG_PMF",
    "LOG_Q_FIXED",
    "OBSERVED",
    "OBS_WEIGHT",
    "PMF",
    "REQUESTS",
    "WHOLE_DATA",
    "Y_LOC_SCALE",
    "Y_LOG_LOC_SCALE",
    "Y_NORMAL_MIXTURE",
    "Y_POISSON",
    "Y_SIM",
    "ParticleTerms",
    "StratifiedGuide",
    "Weights",
    "expected_log_q",
    "log_joint",
    "log_mean_exp",
    "observation_scores",
    "particle_logsumexp",
    "present",
    "particle_sum",
    "predictive_log_density",
    "require_iid",
]

#: Per-observation log-likelihoods ``log_lik`` (with ``log_lik_scaled``).
LOG_LIK = "log_lik"
#: Reparameterised simulated observations ``y_sim`` (with ``y_obs``).
Y_SIM = "y_sim"
#: Location and scale of Normal likelihoods, ``y_loc`` and ``y_scale`` (with
#: ``y_obs``).
Y_LOC_SCALE = "y_loc_scale"
#: Location and scale of the logarithm of LogNormal likelihoods,
#: ``y_log_loc`` and ``y_log_scale`` (with ``y_obs``).
Y_LOG_LOC_SCALE = "y_log_loc_scale"
#: Weights, locations and scales of the components of a Normal-mixture
#: likelihood, ``y_mix_weight``, ``y_mix_loc`` and ``y_mix_scale`` (with
#: ``y_obs``).
Y_NORMAL_MIXTURE = "y_normal_mixture"
#: The rate of every observed site and one draw of its Poisson part per
#: particle, when all of them are Poisson or zero-inflated Poisson,
#: ``y_rate``, ``y_count_sim`` and the zero-inflation ``y_gate`` (with
#: ``y_obs``).
Y_POISSON = "y_poisson"
#: The log pmf over a finite support, ``log_pmf``.
LOG_PMF = "log_pmf"
#: The pmf over a finite support, ``pmf`` (probabilities, no logarithm).
PMF = "pmf"
#: Logits and total counts of Binomial likelihoods, ``binomial_logits`` and
#: ``binomial_count`` (with ``obs_support``).
BINOMIAL = "binomial"
#: ``log q`` at the draws with their gradient stopped, ``log_q_fixed``.
LOG_Q_FIXED = "log_q_fixed"
#: The model's latent values, ``latents``.
LATENTS = "latents"
#: The per-observation weight of a score in a data-set sum,
#: ``weights.observation``.
OBS_WEIGHT = "weight"
#: The values of the guide's own sample sites, ``guide_draws``.
GUIDE_DRAWS = "guide_draws"
#: The observed values as the model computes them, ``observed``.
OBSERVED = "observed"
#: What each request fills in :class:`ParticleTerms`, beside the fields
#: every call fills (``log_prior``, ``log_q``, ``weights.particle`` and
#: ``weights.log_predictive``, ``num_strata``, ``mask``, ``entropy`` for a guide
#: that supplies it). The extractors that fill them are keyed by the same
#: requests, beside this table (``numpyro_pvi/_core/particles.py``); a
#: field no request fills is ``None``.
#:
#: =====================  ===========================================
#: request                fields
#: =====================  ===========================================
#: ``log_lik``            ``log_lik``, ``log_lik_scaled``
#: ``y_sim``              ``y_sim``, ``y_obs``
#: ``y_loc_scale``        ``y_loc``, ``y_scale``, ``y_obs``
#: ``y_log_loc_scale``    ``y_log_loc``, ``y_log_scale``, ``y_obs``
#: ``y_normal_mixture``   ``y_mix_weight``, ``y_mix_loc``,
#:                        ``y_mix_scale``, ``y_obs``
#: ``y_poisson``          ``y_rate``, ``y_gate``, ``y_count_sim``,
#:                        ``y_obs``
#: ``log_pmf``            ``log_pmf``, ``obs_support``
#: ``pmf``                ``pmf``, ``obs_support``
#: ``binomial``           ``binomial_logits``, ``binomial_count``,
#:                        ``obs_support``
#: ``log_q_fixed``        ``log_q_fixed``
#: ``latents``            ``latents``
#: ``weight``             ``weights.observation``
#: ``guide_draws``        ``guide_draws``
#: ``observed``           ``observed``
#: =====================  ===========================================
FIELDS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        LOG_LIK: ("log_lik", "log_lik_scaled"),
        Y_SIM: ("y_sim", "y_obs"),
        Y_LOC_SCALE: ("y_loc", "y_scale", "y_obs"),
        Y_LOG_LOC_SCALE: ("y_log_loc", "y_log_scale", "y_obs"),
        Y_NORMAL_MIXTURE: ("y_mix_weight", "y_mix_loc", "y_mix_scale", "y_obs"),
        Y_POISSON: ("y_rate", "y_gate", "y_count_sim", "y_obs"),
        LOG_PMF: ("log_pmf", "obs_support"),
        PMF: ("pmf", "obs_support"),
        BINOMIAL: ("binomial_logits", "binomial_count", "obs_support"),
        LOG_Q_FIXED: ("log_q_fixed",),
        LATENTS: ("latents",),
        OBS_WEIGHT: ("weights.observation",),
        GUIDE_DRAWS: ("guide_draws",),
        OBSERVED: ("observed",),
    }
)
#: Every quantity that can be requested.
REQUESTS = frozenset(FIELDS)

#: ``data_plate=WHOLE_DATA`` treats all observed sites as one observation,
#: without looking for a data plate (objectives that need only the total
#: log-likelihood: ``log_lik`` is then ``(M, 1)`` with every site scale applied).
WHOLE_DATA = "<whole data set>"


class Weights(NamedTuple):
    r"""The three weights of :class:`ParticleTerms`, by what they weight.

    :ivar particle: ``(M,)`` weight of each particle in expectations over
        the guide, :math:`E_q[f] \approx \sum_j` ``particle[j]`` :math:`f(\theta_j)`
        (sums to one): ``1/M`` for i.i.d. draws, ``ω̄_k / M`` for the draws
        of stratum ``k``.
    :ivar log_predictive: ``(M, b)`` log weight of particle ``j`` in the
        predictive of observation ``i``, :math:`q(y_i) \approx \sum_j
        e^{\text{log\_predictive}[j, i]} p(y_i \mid \theta_j)`: ``-log M``
        for i.i.d. draws, ``log ω_k(x_i) - log M`` for the draws of stratum
        ``k`` (the strata weights may depend on the observation).
    :ivar observation: ``(b,)`` weight of each observation's score in a
        data-set sum: the scale shared by every observed site of the
        observation (the subsample scale ``N / b`` times any handler scale);
        filled on the request ``"weight"``, ``None`` otherwise.
    """

    particle: jax.Array
    log_predictive: jax.Array
    observation: jax.Array | None = None


class ParticleTerms(NamedTuple):
    """The terms of ``M`` particles: what every objective and score reads.

    Shapes use ``M`` for particles (``K * M`` when stratified: strata are
    consecutive blocks of ``M``), ``b`` for the observations of the data
    plate in this (sub)sample, ``d`` for the flattened size of one
    observation and ``c``, ``V`` for the scalar components of one
    observation and the size of their common finite support. Fields that
    were not requested are ``None``.

    :ivar log_prior: ``(M,)`` log density of the latent sites under the model
        (scaled as NumPyro scales them), and of the observed sites outside
        the data plate, which are terms of the joint density rather than
        observations (e.g. a prior written as an observed site).
    :ivar log_q: ``(M,)`` log density of the guide at its draws (scaled).
    :ivar weights: the three weights, :class:`Weights` (``particle`` and
        ``log_predictive`` always present, ``observation`` on request).
    :ivar num_strata: the number of strata (a Python integer; 1 for i.i.d.
        draws).
    :ivar log_lik: ``(M, b)`` log-likelihood of each observation (unscaled):
        what a predictive score of the observation is computed from.
    :ivar log_lik_scaled: ``(M, b)`` the same with each observed site's own
        scale applied (subsample scale ``N / b`` times any handler scale):
        ``log_prior + log_lik_scaled.sum(1)`` is the log joint density
        :func:`numpyro.infer.util.log_density` gives.
    :ivar mask: ``(b,)`` ``False`` for an observation that masks
        (``numpyro.handlers.mask``, ``Distribution.mask``, ``obs_mask=``)
        remove entirely: it contributes nothing to any score
        (:func:`observation_scores`). ``None`` when no observation is masked
        out (always present otherwise). Masked components of an observation
        that keeps others are handled in the fields themselves: ``0`` in
        ``y_obs`` and ``y_sim``, a point mass at the first support value in
        ``pmf``, ``log_pmf`` and ``obs_support``, zero log-likelihood.
    :ivar y_obs: ``(b, d)`` the observed values, one flattened row per
        observation (several observed sites concatenated).
    :ivar y_sim: ``(M, b, d)`` reparameterised draws from ``p(y_i | θ_j)``.
    :ivar y_loc: ``(M, b, d)`` the location of ``p(y_i | θ_j)`` when every
        observed site is Normal (possibly expanded or ``.to_event``), laid
        out like ``y_obs``; ``(M, 1, d)`` when it does not vary along the
        data plate; ``None`` when any observed site is not Normal.
    :ivar y_scale: its scale, likewise (often ``(M, 1, d)``: one noise scale
        for all observations).
    :ivar y_log_loc: ``(M, b, d)`` the location of ``log y`` under ``p(y_i
        | θ_j)`` when every observed site is LogNormal, laid out as
        ``y_loc``; ``None`` when any observed site is not LogNormal.
    :ivar y_log_scale: its scale, likewise.
    :ivar y_mix_weight: ``(M, b, C)`` the weights of the ``C`` components
        of ``p(y_i | θ_j)`` when the one observed site is a mixture of
        scalar Normals (``MixtureSameFamily`` or ``MixtureGeneral``), each
        ``(M, 1, C)`` when it does not vary along the data plate; ``None``
        otherwise.
    :ivar y_mix_loc: the components' locations, likewise.
    :ivar y_mix_scale: the components' scales, likewise.
    :ivar y_rate: ``(M, b, d)`` the rate of ``p(y_i | θ_j)`` (of its
        Poisson part) when every observed site is Poisson or zero-inflated
        Poisson, laid out as ``y_loc`` (``(M, 1, d)`` when it does not vary
        along the data plate); ``None`` otherwise.
    :ivar y_gate: the probability of an extra zero, likewise (``0`` at a
        Poisson site); ``None`` also when no site is zero-inflated.
    :ivar y_count_sim: ``(M, b, d)`` one draw of each count's Poisson part
        with those rates, not differentiable (a Poisson draw has no
        reparameterisation).
    :ivar log_pmf: ``(M, V, b, c)`` log pmf over the finite support (``V``
        values, ``-inf`` padding shorter supports) of each component ``c``.
    :ivar pmf: ``(M, V, b, c)`` the same pmf as probabilities (``0``
        padding), computed without a logarithm where the likelihood's
        parameter gives it directly (Bernoulli).
    :ivar binomial_logits: ``(M, b, c)`` the logits of ``p(y_i | θ_j)``
        when every observed site is Binomial (logits or probabilities; laid
        out like ``pmf``'s components, ``0`` at a masked component); ``None``
        otherwise.
    :ivar binomial_count: its total counts, likewise (``0`` at a masked
        component: the point mass at 0 of ``pmf``).
    :ivar obs_support: ``(V, b, c)`` (with ``log_pmf``, ``pmf`` or
        ``binomial``) whether
        each observed component equals each support value: ``f_j(y_i)`` is
        ``pmf[j]`` where it is ``True``.
    :ivar log_q_fixed: ``(M,)`` ``log q_φ`` at the draws with their gradient
        stopped: its gradient is the score function ``∇_φ log q_φ(θ)``.
    :ivar latents: ``{site: (M, *shape)}`` the model's latent values at each
        particle (constrained space, as the model sees them).
    :ivar guide_draws: ``{site: (M, *shape)}`` the values of the guide's own
        sample sites (e.g. ``_auto_latent`` of an ``AutoContinuous`` guide).
    :ivar observed: ``{site: value}`` the observed values as the model
        computes them.
    :ivar entropy: the guide's entropy (or a lower bound of it) in closed
        form when the guide supplies one
        (:meth:`StratifiedGuide.entropy_term`), used by
        :func:`expected_log_q` instead of the Monte Carlo mean of ``log_q``.
    :ivar mutable_state: ``{site: value}`` the ``numpyro.mutable`` sites of
        guide and model after one trace of them (a batch-norm layer's running
        statistics), what an objective returns as its mutable state (as
        ``Trace_ELBO`` does with one particle); ``None`` without any.
    """

    log_prior: jax.Array
    log_q: jax.Array
    weights: Weights
    num_strata: int
    log_lik: jax.Array | None = None
    log_lik_scaled: jax.Array | None = None
    mask: jax.Array | None = None
    y_obs: jax.Array | None = None
    y_sim: jax.Array | None = None
    y_loc: jax.Array | None = None
    y_scale: jax.Array | None = None
    y_log_loc: jax.Array | None = None
    y_log_scale: jax.Array | None = None
    y_mix_weight: jax.Array | None = None
    y_mix_loc: jax.Array | None = None
    y_mix_scale: jax.Array | None = None
    y_rate: jax.Array | None = None
    y_gate: jax.Array | None = None
    y_count_sim: jax.Array | None = None
    log_pmf: jax.Array | None = None
    pmf: jax.Array | None = None
    binomial_logits: jax.Array | None = None
    binomial_count: jax.Array | None = None
    obs_support: jax.Array | None = None
    log_q_fixed: jax.Array | None = None
    latents: dict[str, jax.Array] | None = None
    guide_draws: dict[str, jax.Array] | None = None
    observed: dict[str, jax.Array] | None = None
    entropy: jax.Array | None = None
    mutable_state: dict[str, Any] | None = None


@runtime_checkable
class StratifiedGuide(Protocol):
    """A guide drawn from stratum by stratum (the guide side of stratification).

    The particle machinery draws ``M`` particles from each of the guide's
    ``num_strata`` strata when an objective asks for stratified draws, and
    weights them with :meth:`stratum_log_weights`.
    :class:`~numpyro_pvi.guides.AutoGaussianMixture` implements it.
    """

    @property
    def num_strata(self) -> int:
        """The number ``K`` of strata."""

    def draw_stratum(self, fn: object, component: jax.Array) -> object:
        """``fn`` (this guide, seeded and substituted) drawing its stratified
        site from stratum ``component`` only; that site's log density stays
        the whole guide's."""

    def stratum_log_weights(
        self, params: dict[str, jax.Array]
    ) -> tuple[jax.Array, jax.Array | None]:
        """``(K,)`` log weights of the strata in expectations over the guide,
        and ``(N, K)`` per-observation log weights ``log ω_k(x_i)`` over the
        data plate, or ``None`` when they do not depend on the observation."""

    def entropy_term(self, params: dict[str, jax.Array]) -> jax.Array | None:
        """The guide's entropy (or a bound) in closed form, used in place of
        the Monte Carlo mean of ``-log q``; ``None`` to use the mean."""


# --------------------------------------------------------------------------
# reductions over particles
# --------------------------------------------------------------------------


#: Largest number of elements per particle that :func:`particle_sum` sums
#: by a reduction; larger rows are contracted (``benchmarks/RESULTS.md``).
_REDUCE_MAX = 1 << 14


def particle_sum(x: jax.Array, weights: jax.Array | None = None) -> jax.Array:
    r""":math:`\sum_j w_j x_j` over the leading (particle) axis (``w = 1`` when
    ``weights`` is ``None``; ``weights`` is ``(M,)`` or ``x.shape``).

    Up to 16,384 elements per particle a reduction
    (``jnp.sum``); beyond, a contraction (``dot_general``). On CPU, XLA
    reduces a leading axis column by column, and once the ``(M, b)`` array
    outgrows the cache that strided loop is up to 1.5 times slower than a
    matrix-vector product; on smaller rows the two take the same time, but
    under ``vmap`` (the fits of a cross-validation) the contraction first
    copies the batched array into the matrix's layout, and the reduction is
    20% faster for the whole step (``benchmarks/RESULTS.md``).
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
    gives ``-inf``), with the fast contraction of :func:`particle_sum`.

    The shift is one reduction over the particles. A maximum by halving
    (elementwise maxima of the two halves, again and again) made the log
    score's step up to 1.45 times slower on posteriordb's regressions (350
    to 950 observations, M = 16 to 64) and on linear and logistic
    regressions of 10³ to 10⁵ observations, and was at most 10% faster on
    a few shapes of 10⁴ to 3·10⁴ (``benchmarks/RESULTS.md``, "The log
    score's shift")."""
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
    return terms.log_prior + jnp.sum(present(terms.log_lik_scaled, "log_lik_scaled"), 1)


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


_T = TypeVar("_T")


def present(value: _T | None, field: str) -> _T:
    """``value``, a field of :class:`ParticleTerms` that a request fills
    (:data:`FIELDS`); a clear error when it was not requested.

    :param value: the field's value, e.g. ``terms.y_sim``.
    :param field: its name, for the message.
    """
    if value is None:
        requests = sorted(r for r, fields in FIELDS.items() if field in fields)
        raise ValueError(
            f"the particle terms have no {field!r}: a score that reads it must "
            f"list one of {requests} in its `requires`."
        )
    return value


def require_iid(terms: ParticleTerms, name: str) -> None:
    """Raise :class:`NotImplementedError` for stratified terms: for an
    estimator written for ``M`` i.i.d. equally weighted draws only.

    :param terms: particle terms.
    :param name: the estimator's name, for the message.
    """
    if terms.num_strata != 1:
        raise NotImplementedError(
            f"{name} assumes M i.i.d. draws of weight 1/M, but the draws are "
            f"stratified ({terms.num_strata} strata, weighted by "
            "terms.weights.log_predictive): "
            "use the weights, or a guide without strata."
        )
