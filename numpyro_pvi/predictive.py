"""Predictive variational inference (PVI) for NumPyro SVI."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import random
from jax.lax import stop_gradient
from numpyro.infer.elbo import ELBO

from numpyro_pvi._particles import (
    LOG_LIK,
    LOG_Q_FIXED,
    ParticleTerms,
    particle_terms,
    particle_weights,
)
from numpyro_pvi.scores import LogScore, Score, get_score

__all__ = ["PredictiveELBO"]

_REGULARIZERS = ("prior", "posterior", None)
_ESTIMATORS = ("reparam", "rejection")


def _check_num_particles(num_particles: Any, minimum: int, objective: str) -> int:
    if (
        isinstance(num_particles, bool)
        or not isinstance(num_particles, int)
        or num_particles < minimum
    ):
        raise ValueError(
            f"{objective}: num_particles must be an integer >= {minimum}, got "
            f"{num_particles!r}."
        )
    return num_particles


def _check_data_plate(data_plate: Any, objective: str) -> str | None:
    if data_plate is not None and not isinstance(data_plate, str):
        raise TypeError(
            f"{objective}: data_plate must be the name of a plate (str) or None, "
            f"got {data_plate!r}."
        )
    return data_plate


class PredictiveELBO(ELBO):
    r"""Predictive variational inference (Lai & Yao 2024).

    Fits the guide :math:`q_\phi` to maximise the score of its posterior
    predictive distribution on the observed data, with an optional
    regularizer:

    .. math::

        \mathcal{L}(\phi) = \sum_{i=1}^n S\big(q_\phi(\cdot), y_i\big)
        - \lambda\, r(\phi),
        \qquad q_\phi(y_i) = \mathbb{E}_{q_\phi(\theta)}\, p(y_i \mid \theta),

    estimated with :math:`M` reparameterised draws :math:`\theta_j \sim
    q_\phi`. For the log score
    :math:`S = \log \frac{1}{M}\sum_j p(y_i\mid\theta_j)` (eq. 5 of [1]). The
    regularizers are

    .. math::

        r_{\rm prior} = \frac{1}{M}\sum_j \big[\log q(\theta_j) -
        \log p(\theta_j)\big], \qquad
        r_{\rm post} = r_{\rm prior} - \frac{1}{M}\sum_j \sum_i
        \log p(y_i \mid \theta_j),

    the Monte Carlo estimates of :math:`\mathrm{KL}(q\,\|\,p(\theta))` and of
    :math:`\mathrm{KL}(q\,\|\,p(\theta\mid y))` up to a constant (the negative
    ELBO). :math:`\lambda = 0` is pure predictive optimisation; as
    :math:`\lambda \to \infty` with the posterior regularizer the optimum is
    the VI posterior. The loss is :math:`-\mathcal{L}`.

    Observations are the entries of the *data plate*: the plate shared by
    every observed site, or the one named by ``data_plate``. All observed
    values at one index of that plate form one observation. With a
    subsampled data plate of size :math:`N` and batch :math:`b` the sum over
    observations is scaled by :math:`N/b`; handler scales are honoured.

    With ``log_score_estimator="rejection"`` the gradient of the log score
    is the rejection-sampling estimator of [1, appendix B]: each draw is
    accepted for observation :math:`i` when :math:`t_{ji} < p(y_i \mid
    \theta_j)/C` with :math:`t_{ji} \sim U(0, 1)`, and

    .. math::

        \widehat{\nabla_\phi \log q_\phi(y_i)} = \frac{1}{|A_i|}
        \sum_{j \in A_i} \nabla_\phi \log q_\phi(\theta_j)
        \quad(\theta_j \text{ held fixed}),

    an unbiased estimate for any :math:`M` given one acceptance (the accepted
    draws are exact draws from :math:`q(\theta \mid y_i)`). Observations
    without an acceptance are dropped and the sum is rescaled by
    :math:`b / \#\text{kept}`. The reported loss value is the ordinary
    log-score estimate. The guide needs no reparameterised sampler for this
    estimator unless the regularizer is used.

    **Example**

    .. code-block:: python

        from numpyro.infer import SVI
        from numpyro_pvi import PredictiveELBO

        svi = SVI(model, guide, optax.adam(1e-2), loss=PredictiveELBO("log"))

    :param score: ``"log"`` or any registered score name (see
        :mod:`numpyro_pvi.scores`), or a :class:`~numpyro_pvi.scores.Score`
        instance.
    :param int num_particles: number :math:`M` of draws from the guide.
    :param regularizer: ``"prior"``, ``"posterior"`` or ``None``.
    :param float lam: weight :math:`\lambda \ge 0` of the regularizer.
    :param data_plate: name of the plate that indexes observations; by
        default the plate shared by all observed sites.
    :param vectorize_particles: ``True`` (``vmap``), ``False`` (``lax.map``)
        or a callable ``fn(f, keys)``, as for :class:`~numpyro.infer.elbo.ELBO`.
    :param str log_score_estimator: ``"reparam"`` (default) or
        ``"rejection"`` (log score only).
    :param likelihood_bound: the bound :math:`C \ge p(y_i \mid \theta)` the
        rejection estimator needs.

    **References**

    1. Lai, J. & Yao, Y. (2024). *Predictive variational inference: Learn
       the predictively optimal posterior distribution*. arXiv:2410.14843.
    """

    def __init__(
        self,
        score: str | Score = "log",
        *,
        num_particles: int = 32,
        regularizer: str | None = "prior",
        lam: float = 1.0,
        data_plate: str | None = None,
        vectorize_particles: bool | Callable = True,
        log_score_estimator: str = "reparam",
        likelihood_bound: float | None = None,
    ) -> None:
        name = type(self).__name__
        self.score = get_score(score)
        num_particles = _check_num_particles(
            num_particles, self.score.min_particles, f"{name}(score={self.score!r})"
        )
        if regularizer not in _REGULARIZERS:
            raise ValueError(
                f"{name}: regularizer must be one of {_REGULARIZERS}, got "
                f"{regularizer!r}."
            )
        try:
            lam = float(lam)
        except (TypeError, ValueError):
            raise TypeError(f"{name}: lam must be a number, got {lam!r}.") from None
        if not (math.isfinite(lam) and lam >= 0):
            raise ValueError(f"{name}: lam must be finite and >= 0, got {lam!r}.")
        if log_score_estimator not in _ESTIMATORS:
            raise ValueError(
                f"{name}: log_score_estimator must be one of {_ESTIMATORS}, got "
                f"{log_score_estimator!r}."
            )
        if log_score_estimator == "rejection":
            if not isinstance(self.score, LogScore):
                raise ValueError(
                    f"{name}: log_score_estimator='rejection' estimates the "
                    f"gradient of the log score only, not of {self.score!r}."
                )
            if likelihood_bound is None or not float(likelihood_bound) > 0:
                raise ValueError(
                    f"{name}: log_score_estimator='rejection' needs "
                    "likelihood_bound=C > 0 with p(y_i | theta) <= C for every "
                    f"observation and theta, got {likelihood_bound!r}."
                )
        elif likelihood_bound is not None:
            raise ValueError(
                f"{name}: likelihood_bound is only used with "
                "log_score_estimator='rejection'."
            )
        self.regularizer = regularizer
        self.lam = lam
        self.data_plate = _check_data_plate(data_plate, name)
        self.log_score_estimator = log_score_estimator
        self.likelihood_bound = (
            None if likelihood_bound is None else float(likelihood_bound)
        )
        super().__init__(
            num_particles=num_particles, vectorize_particles=vectorize_particles
        )

    @property
    def _uses_regularizer(self) -> bool:
        return self.regularizer is not None and self.lam > 0

    def particle_terms(
        self,
        rng_key: jax.Array,
        param_map: dict[str, jax.Array],
        model: Callable,
        guide: Callable,
        *args: Any,
        **kwargs: Any,
    ) -> ParticleTerms:
        """The particle terms this objective is computed from.

        :return: :class:`~numpyro_pvi._particles.ParticleTerms` of
            ``num_particles`` draws.
        """
        requests = set(self.score.requires)
        if self.regularizer == "posterior":
            requests.add(LOG_LIK)
        rejection = self.log_score_estimator == "rejection"
        if rejection:
            requests.add(LOG_Q_FIXED)
        stratify = isinstance(getattr(guide, "num_strata", None), int)
        if stratify and (rejection or not self.score.supports_stratified):
            what = (
                "log_score_estimator='rejection'"
                if rejection
                else f"score={self.score!r}"
            )
            raise NotImplementedError(
                f"{type(self).__name__}: {what} does not support the stratified "
                f"expectations of the mixture guide {type(guide).__name__}; use "
                "a built-in score (log, crps, energy, quadratic) with "
                "log_score_estimator='reparam', or a guide without components."
            )
        return particle_terms(
            rng_key,
            param_map,
            model,
            guide,
            args,
            kwargs,
            num_particles=self.num_particles,
            vectorize_particles_fn=self.vectorize_particles_fn,
            requests=requests,
            data_plate=self.data_plate,
            objective=type(self).__name__,
            require_reparam=not rejection or self._uses_regularizer,
            stratify=stratify,
        )

    def _rejection_log_score(
        self, rng_key: jax.Array, terms: ParticleTerms
    ) -> jax.Array:
        """Data-set log score whose gradient is the rejection estimator."""
        log_lik = terms.log_lik
        value = jnp.sum(terms.weight * self.score.estimate(terms))
        log_t = jnp.log(random.uniform(rng_key, log_lik.shape, dtype=log_lik.dtype))
        accepted = stop_gradient(log_t < log_lik - math.log(self.likelihood_bound))
        num_accepted = jnp.sum(accepted, axis=0)
        kept = num_accepted > 0
        per_obs = jnp.sum(accepted * terms.log_q_fixed[:, None], axis=0) / jnp.maximum(
            num_accepted, 1
        )
        rescale = kept.shape[0] / jnp.maximum(jnp.sum(kept), 1)
        surrogate = rescale * jnp.sum(jnp.where(kept, terms.weight * per_obs, 0.0))
        return stop_gradient(value) + surrogate - stop_gradient(surrogate)

    def loss_with_mutable_state(
        self,
        rng_key: jax.Array,
        param_map: dict[str, jax.Array],
        model: Callable,
        guide: Callable,
        *args: Any,
        **kwargs: Any,
    ) -> dict[str, Any]:
        particle_key, accept_key = random.split(rng_key)
        terms = self.particle_terms(
            particle_key, param_map, model, guide, *args, **kwargs
        )
        if self.log_score_estimator == "rejection":
            data_score = self._rejection_log_score(accept_key, terms)
        else:
            data_score = jnp.sum(terms.weight * self.score.estimate(terms))
        objective = data_score
        if self._uses_regularizer:
            per_particle = terms.log_q - terms.log_prior
            if self.regularizer == "posterior":
                per_particle = per_particle - jnp.sum(
                    terms.weight * terms.log_lik, axis=1
                )
            if terms.particle_weight is None:
                kl = jnp.mean(per_particle)
            else:  # stratified draws of a mixture guide
                kl = jnp.sum(particle_weights(terms) * per_particle)
            objective = objective - self.lam * kl
        return {"loss": -objective, "mutable_state": None}
