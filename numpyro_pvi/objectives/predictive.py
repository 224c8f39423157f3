"""Predictive variational inference (PVI) for NumPyro SVI."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import random
from jax.lax import stop_gradient
from numpyro.infer.elbo import ELBO

from numpyro_pvi._trace.particles import (
    ParticleSpec,
    particle_terms,
    split_particle_key,
)
from numpyro_pvi._trace.reductions import expected_log_q, log_joint, observation_scores
from numpyro_pvi._trace.terms import (
    LOG_LIK,
    LOG_Q_FIXED,
    OBS_WEIGHT,
    ParticleTerms,
    present,
)
from numpyro_pvi._trace.tracing import StratifiedGuide
from numpyro_pvi._trace.validation import (
    check_data_plate,
    check_int,
    check_real_or_array,
    warn_point_mass,
)
from numpyro_pvi.objectives.rejection import (
    RejectionStats,
    check_no_model_params,
    rejection_estimate,
    rejection_options,
)
from numpyro_pvi.scores import LogScore, Score, get_score

__all__ = ["PredictiveELBO"]

_REGULARIZERS = ("prior", "posterior", None)
_ESTIMATORS = ("reparam", "rejection")


class PredictiveELBO(ELBO):
    r"""Predictive variational inference (Lai & Yao 2024).

    Fits the guide :math:`q_\phi` to maximise the score of its posterior
    predictive distribution on the observed data, with an optional regularizer:

    .. math::

        \mathcal{L}(\phi) = \sum_{i=1}^n S\big(q_\phi(\cdot), y_i\big)
        - \lambda\, r(\phi),
        \qquad q_\phi(y_i) = \mathbb{E}_{q_\phi(\theta)}\, p(y_i \mid \theta),

    estimated with :math:`M` reparameterised draws :math:`\theta_j \sim q_\phi`
    (for the log score :math:`S = \log \frac{1}{M}\sum_j p(y_i\mid\theta_j)`,
    eq. 5 of [1]). The regularizers are the Monte Carlo estimates

    .. math::

        r_{\rm prior} = \frac{1}{M}\sum_j \big[\log q(\theta_j) -
        \log p(\theta_j)\big], \qquad
        r_{\rm post} = r_{\rm prior} - \frac{1}{M}\sum_j \sum_i
        \log p(y_i \mid \theta_j),

    of :math:`\mathrm{KL}(q\,\|\,p(\theta))` and of the negative ELBO.
    :math:`\lambda = 0` is pure predictive optimisation; as :math:`\lambda \to
    \infty` with the posterior regularizer the optimum is the VI posterior. The
    loss is :math:`-\mathcal{L}`.

    Observations are the entries of the data plate (the plate the observed
    sites share, or ``data_plate``; without a plate, the rightmost batch
    dimension). Masked observations score nothing; a subsampled plate scales
    the sum by :math:`N/b`; an observed site outside the data plate is a term of
    the prior. With ``log_score_estimator="rejection"`` the log score's gradient
    is the rejection-sampling estimator of [1, appendix B], unbiased for any
    :math:`M`: an observation without an acceptance gets further rounds inside
    ``jit`` rather than being dropped (:meth:`rejection_stats` reports those
    still without one after ``max_rounds``).

    **Example**

    .. code-block:: python

        svi = SVI(model, guide, optax.adam(1e-2), loss=PredictiveELBO("log"))

    :param score: ``"log"`` or any registered score name (see
        :mod:`numpyro_pvi.scores`), or a :class:`~numpyro_pvi.scores.Score`
        instance.
    :param int num_particles: number :math:`M` of draws from the guide.
    :param regularizer: ``"prior"``, ``"posterior"`` or ``None``.
    :param lam: weight :math:`\lambda \ge 0` of the regularizer: a real
        number, or a scalar JAX array (traced, so that one compiled program fits
        a grid of values under ``vmap``).
    :param data_plate: name of the plate that indexes observations, or a
        negative batch dimension of the observed values.
    :param vectorize_particles: ``True`` (``vmap``), ``False`` (``lax.map``)
        or a callable ``fn(f, keys)``, as for :class:`~numpyro.infer.elbo.ELBO`.
    :param str log_score_estimator: ``"reparam"`` (default) or
        ``"rejection"`` (log score only; the guide's density must be evaluable
        at given points).
    :param likelihood_bound: the bound :math:`C \ge p(y_i \mid \theta)` the
        rejection estimator needs.
    :param int max_rounds: the largest number of further rounds of the
        rejection estimator (default 1000).

    **References**

    1. Lai, J. & Yao, Y. (2024). *Predictive variational inference: Learn
       the predictively optimal posterior distribution*. arXiv:2410.14843.
    """

    #: Whether the optimum is the Bayesian posterior (read by diagnostics:
    #: PSIS k̂ of a fit that does not target it measures a chosen distance).
    targets_posterior: bool = False
    #: enumerated sites of the model are summed out within each observation
    #: (a discrete site of the guide is refused where draws are differentiated)
    can_infer_discrete = True
    #: A traced indicator of the posterior regularizer (set by
    #: cross-validation: one program for the grids of both regularizers).
    _posterior: jax.Array | None = None

    def __init__(
        self,
        score: str | Score = "log",
        *,
        num_particles: int = 32,
        regularizer: str | None = "prior",
        lam: float = 1.0,
        data_plate: str | int | None = None,
        vectorize_particles: bool | Callable = True,
        log_score_estimator: str = "reparam",
        likelihood_bound: float | None = None,
        max_rounds: int | None = None,
    ) -> None:
        name = self._objective_name()
        self.score = get_score(score)
        num_particles = check_int(
            num_particles, "num_particles", name, minimum=self.score.min_particles
        )
        if regularizer not in _REGULARIZERS:
            raise ValueError(
                f"{name}: regularizer must be one of {_REGULARIZERS}, got "
                f"{regularizer!r}."
            )
        self.lam = check_real_or_array(lam, "lam", name, low=0.0)
        if log_score_estimator not in _ESTIMATORS:
            raise ValueError(
                f"{name}: log_score_estimator must be one of {_ESTIMATORS}, got "
                f"{log_score_estimator!r}."
            )
        if log_score_estimator == "rejection":
            likelihood_bound, max_rounds = rejection_options(
                name,
                self.score,
                isinstance(self.score, LogScore),
                likelihood_bound,
                max_rounds,
            )
        elif likelihood_bound is not None or max_rounds is not None:
            raise ValueError(
                f"{name}: likelihood_bound and max_rounds are only used with "
                "log_score_estimator='rejection'."
            )
        self.regularizer = regularizer
        self.data_plate = check_data_plate(data_plate, name)
        self.log_score_estimator = log_score_estimator
        self.likelihood_bound = likelihood_bound
        self.max_rounds = max_rounds
        super().__init__(
            num_particles=num_particles, vectorize_particles=vectorize_particles
        )

    def _objective_name(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        fields = [
            f"score={self.score!r}",
            f"num_particles={self.num_particles}",
            f"regularizer={self.regularizer!r}",
            f"lam={self.lam:g}" if isinstance(self.lam, float) else f"lam={self.lam}",
        ]
        if self.data_plate is not None:
            fields.append(f"data_plate={self.data_plate!r}")
        if self.log_score_estimator == "rejection":
            fields += [
                "log_score_estimator='rejection'",
                f"likelihood_bound={self.likelihood_bound:g}",
                f"max_rounds={self.max_rounds}",
            ]
        return f"{type(self).__name__}({', '.join(fields)})"

    @property
    def _uses_regularizer(self) -> bool:
        # an array lam (a grid value under vmap) is used whatever its value
        return self.regularizer is not None and (
            not isinstance(self.lam, float) or self.lam > 0
        )

    def particle_terms(
        self,
        rng_key: jax.Array,
        param_map: dict[str, jax.Array],
        model: Callable,
        guide: Callable,
        *args: Any,
        plate_key: jax.Array | None = None,
        **kwargs: Any,
    ) -> ParticleTerms:
        """The particle terms this objective is computed from.

        :param plate_key: key of the subsampled plates' indices (default:
            derived from ``rng_key``).
        :return: :class:`~numpyro_pvi.particles.ParticleTerms` of
            ``num_particles`` draws.
        """
        requests = set(self.score.requires) | {OBS_WEIGHT}
        if self.regularizer == "posterior":
            requests.add(LOG_LIK)
        rejection = self.log_score_estimator == "rejection"
        if rejection:
            requests.add(LOG_Q_FIXED)
        if rejection and isinstance(guide, StratifiedGuide):
            raise NotImplementedError(
                f"{type(self).__name__}: log_score_estimator='rejection' does not "
                "support the stratified expectations of the mixture guide "
                f"{type(guide).__name__}; use log_score_estimator='reparam', or a "
                "guide without components."
            )
        spec = ParticleSpec.of(
            self,
            requests,
            data_plate=self.data_plate,
            require_reparam=not rejection or self._uses_regularizer,
        )
        return particle_terms(
            rng_key, param_map, model, guide, args, kwargs, spec, plate_key=plate_key
        )

    def rejection_stats(
        self,
        rng_key: jax.Array,
        param_map: dict[str, jax.Array],
        model: Callable,
        guide: Callable,
        *args: Any,
        **kwargs: Any,
    ) -> RejectionStats:
        """How the rejection estimator fares at ``param_map``: the fraction of
        observations accepted by the step's particles, the further rounds
        needed and the fraction left without an acceptance after
        ``max_rounds`` (the estimator's only bias). Same arguments as
        :meth:`~numpyro.infer.elbo.ELBO.loss`; the key gives the same draws
        as a step with that key.

        :return: :class:`~numpyro_pvi.RejectionStats`.
        """
        if self.log_score_estimator != "rejection":
            raise ValueError(
                f"{type(self).__name__}.rejection_stats: this objective uses "
                f"log_score_estimator={self.log_score_estimator!r}, not "
                "'rejection'."
            )
        stats = self._loss_parts(rng_key, param_map, model, guide, args, kwargs)[1]
        assert stats is not None  # the rejection estimator always has them
        return stats

    def _loss_parts(
        self,
        rng_key: jax.Array,
        param_map: dict[str, jax.Array],
        model: Callable,
        guide: Callable,
        args: tuple,
        kwargs: dict,
    ) -> tuple[jax.Array, RejectionStats | None, dict[str, Any] | None]:
        """The loss, for the rejection estimator its statistics, and the
        mutable state (:attr:`ParticleTerms.mutable_state`)."""
        warn_point_mass(guide, self._objective_name())
        particle_key, accept_key = random.split(rng_key)
        # the plate key of particle_terms' key protocol, kept for the
        # further rounds of the rejection estimator (same subsample)
        plate_key, _ = split_particle_key(particle_key)
        terms = self.particle_terms(
            particle_key, param_map, model, guide, *args, plate_key=plate_key, **kwargs
        )
        with jax.named_scope(f"score_{self.score.name}"):
            scores = observation_scores(self.score.estimate(terms), terms)
            observation = present(terms.weights.observation, "weights.observation")
            data_score = jnp.sum(observation * scores)
        stats = None
        if self.log_score_estimator == "rejection":
            surrogate, stats = rejection_estimate(
                accept_key,
                self,
                terms,
                plate_key,
                param_map,
                model,
                guide,
                args,
                kwargs,
            )
            surrogate = jnp.sum(observation * surrogate)
            if self._uses_regularizer:  # reparameterised draws: the guide's
                check_no_model_params(model, args, kwargs, self._objective_name())
                data_score = stop_gradient(data_score)
            # else the draws are held fixed: the log score's gradient is the
            # model's own parameters' only, and kept
            data_score = data_score + surrogate - stop_gradient(surrogate)
        objective = data_score
        if self._uses_regularizer:
            # KL(q || prior), or the negative ELBO: E_q[log q - log p(θ, y)]
            log_p = log_joint(terms) if self.regularizer == "posterior" else None
            log_p = terms.log_prior if log_p is None else log_p
            if self._posterior is not None:  # a grid of both regularizers
                log_p = jnp.where(self._posterior > 0, log_p, terms.log_prior)
            kl = expected_log_q(terms) - jnp.sum(terms.weights.particle * log_p)
            objective = objective - self.lam * kl
        return -objective, stats, terms.mutable_state

    def loss_with_mutable_state(
        self,
        rng_key: jax.Array,
        param_map: dict[str, jax.Array],
        model: Callable,
        guide: Callable,
        *args: Any,
        **kwargs: Any,
    ) -> dict[str, Any]:
        loss, _, mutable = self._loss_parts(
            rng_key, param_map, model, guide, args, kwargs
        )
        return {"loss": loss, "mutable_state": mutable}
