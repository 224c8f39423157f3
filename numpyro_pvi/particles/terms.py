"""The particle terms: what the particle machinery returns and a score
reads (:class:`ParticleTerms`, its :class:`Weights`)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

__all__ = ["ObservationSites", "ParticleTerms", "Weights", "require_iid"]


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


@jax.tree_util.register_static
class ObservationSites(tuple):
    """``((site, values), ...)``: the observed sites that form one
    observation and how many values each gives it. Static under JAX's
    transformations (a pytree without leaves): site names are not arrays."""

    __slots__ = ()


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
    :ivar log_lik_sim: ``(M, b)`` the log-likelihood of one simulation of
        each observation from ``p(y_i | θ_j)``: where ``log_lik`` is below
        it for (nearly) every particle, the observation lies far in the tail
        of every particle's predictive.
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
        Poisson part) when every observed site is Poisson or negative
        binomial, possibly zero-inflated, laid out as ``y_loc`` (``(M, 1,
        d)`` when a Poisson rate does not vary along the data plate); for a
        negative binomial one reparameterised draw of its Gamma rate per
        count; ``None`` otherwise.
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
    :ivar observation_sites: ``((site, values), ...)`` the observed sites of
        the data plate in the order of ``y_obs``'s columns, each with the
        number of values it gives one observation (Python integers, from the
        shapes: for messages that name the sites), :class:`ObservationSites`;
        filled by every call of the particle machinery.
    """

    log_prior: jax.Array
    log_q: jax.Array
    weights: Weights
    num_strata: int
    log_lik: jax.Array | None = None
    log_lik_scaled: jax.Array | None = None
    log_lik_sim: jax.Array | None = None
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
    observation_sites: ObservationSites = ObservationSites()


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
