"""Held-out evaluation of a fitted guide's posterior predictive."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from numpyro_pvi._draws import check_fitted_call, guide_draws
from numpyro_pvi._particles import ParticleSpec
from numpyro_pvi._structure import check_full_data, replay_trace
from numpyro_pvi._validation import check_data_plate, check_int
from numpyro_pvi.particles import ParticleTerms
from numpyro_pvi.scores import Score, get_score

__all__ = ["predictive_score"]


@dataclasses.dataclass(frozen=True)
class _Estimate:
    """``score.estimate`` as a value: equal scores share one compiled program."""

    score: Score

    def __call__(self, terms: ParticleTerms) -> jax.Array:
        return self.score.estimate(terms)


def predictive_score(
    rng_key: jax.Array,
    params: dict[str, jax.Array],
    model: Callable,
    guide: Callable,
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
    gradient is taken and no weights are applied (handler scales of the
    observed sites are ignored). Every observation of the data plate is
    scored: a model whose data plate is subsampled is refused. The compiled
    program is cached, so scoring further data sets of the same shapes does
    not compile again.

    The arguments follow :func:`numpyro.infer.psis_diagnostic`:
    ``(rng_key, params, model, guide, *args)``. The order ``(rng_key, model,
    guide, params, ...)`` of earlier releases still works, with a
    ``FutureWarning``, until the next release.

    :param rng_key: random key.
    :param params: the fitted parameters (``svi_result.params``).
    :param model: the NumPyro model.
    :param guide: the fitted guide.
    :param args: model arguments holding the data to score.
    :param score: a score name (``"log"``, ...) or a
        :class:`~numpyro_pvi.scores.Score`.
    :param int num_draws: number of posterior draws (per component for a
        mixture guide such as
        :class:`~numpyro_pvi.guides.AutoGaussianMixture`, whose predictive is
        estimated by stratified draws).
    :param data_plate: name of the plate that indexes observations.
    :param kwargs: model keyword arguments.
    :return: array of shape ``(n,)`` of positively oriented scores, one per
        observation of the data plate.

    **References**

    1. Lai, J. & Yao, Y. (2024). *Predictive variational inference: Learn the
       predictively optimal posterior distribution*. §4.3.
    """
    params, model, guide = check_fitted_call(
        "predictive_score", params, model, guide, legacy_order=True
    )
    score = get_score(score)
    num_draws = check_int(
        num_draws, "num_draws", "predictive_score", minimum=score.min_particles
    )
    data_plate = check_data_plate(data_plate, "predictive_score")
    # the structure is traced abstractly: the key draws nothing
    check_full_data(
        replay_trace(rng_key, params, model, guide, args, kwargs),
        "predictive_score",
    )
    return guide_draws(
        rng_key,
        params,
        model,
        guide,
        args,
        kwargs,
        ParticleSpec(
            num_draws, score.requires, data_plate, objective="predictive_score"
        ),
        reduce=_Estimate(score),
    )
