"""Held-out evaluation of a fitted guide's posterior predictive."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax import vmap

from numpyro_pvi._particles import particle_terms
from numpyro_pvi.predictive import _check_data_plate, _check_num_particles
from numpyro_pvi.scores import Score, get_score

__all__ = ["predictive_score"]


def predictive_score(
    rng_key: jax.Array,
    model: Callable,
    guide: Callable,
    params: dict[str, jax.Array],
    *args: Any,
    score: str | Score = "log",
    num_draws: int = 1000,
    data_plate: str | None = None,
    **kwargs: Any,
) -> jax.Array:
    r"""Per-observation score of the posterior predictive on the given data.

    With :math:`S` draws :math:`\theta_s \sim q` from the fitted guide,
    returns for each observation :math:`y_i` of the data plate the estimate
    of :math:`S(q(\cdot), y_i)`, e.g. for the log score
    :math:`\log \frac{1}{S}\sum_s p(y_i \mid \theta_s)`. Pass held-out data
    as the model arguments to compare fits; the total score is the sum. No
    gradient is taken and no subsampling weights are applied.

    :param rng_key: random key.
    :param model: the NumPyro model.
    :param guide: the fitted guide.
    :param params: the fitted parameters (``svi_result.params``).
    :param args: model arguments holding the data to score.
    :param score: a score name (``"log"``, ...) or a
        :class:`~numpyro_pvi.scores.Score`.
    :param int num_draws: number of posterior draws (per component for a
        mixture guide such as
        :class:`~numpyro_pvi.guides.AutoGaussianMixture`, whose predictive is
        estimated by stratified draws).
    :param data_plate: name of the plate that indexes observations.
    :param kwargs: model keyword arguments.
    :return: array of shape ``(n,)`` of positively oriented scores.

    **References**

    1. Lai, J. & Yao, Y. (2024). *Predictive variational inference: Learn the
       predictively optimal posterior distribution*. §4.3.
    """
    score = get_score(score)
    stratify = isinstance(getattr(guide, "num_strata", None), int)
    if stratify and not score.supports_stratified:
        raise NotImplementedError(
            f"predictive_score: score={score!r} does not support the stratified "
            f"expectations of the mixture guide {type(guide).__name__}; use "
            "a built-in score (log, crps, energy, quadratic)."
        )
    num_draws = _check_num_particles(
        num_draws, score.min_particles, "predictive_score: num_draws"
    )
    data_plate = _check_data_plate(data_plate, "predictive_score")

    @jax.jit
    def run(key: jax.Array, params: dict[str, jax.Array]) -> jax.Array:
        terms = particle_terms(
            key,
            params,
            model,
            guide,
            args,
            kwargs,
            num_particles=num_draws,
            vectorize_particles_fn=lambda f, keys: vmap(f)(keys),
            requests=score.requires,
            data_plate=data_plate,
            objective="predictive_score",
            require_reparam=False,
            stratify=stratify,
        )
        return jax.lax.stop_gradient(score.estimate(terms))

    return run(rng_key, params)
