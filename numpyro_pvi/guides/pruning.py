"""Fitting a Gaussian-mixture guide with the component pruning of Kock et al."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from numpyro.infer import SVI

from numpyro_pvi._trace.particles import ParticleSpec, particle_terms
from numpyro_pvi._trace.terms import LOG_LIK, present
from numpyro_pvi._trace.validation import check_data_plate, check_int
from numpyro_pvi.evaluation.draws import check_fitted_call
from numpyro_pvi.guides.auto_mixture import AutoGaussianMixture
from numpyro_pvi.objectives.svi_scan import svi_scan

__all__ = ["PrunedFit", "fit_gm_pvi", "prune_components"]


class PrunedFit(NamedTuple):
    """Result of :func:`fit_gm_pvi`.

    :ivar guide: the guide with the surviving components.
    :ivar params: its fitted parameters.
    :ivar num_components: the surviving :math:`K`.
    :ivar losses: the loss at every step.
    :ivar history: :math:`K` after every block of ``prune_every`` steps.
    """

    guide: AutoGaussianMixture
    params: dict[str, jax.Array]
    num_components: int
    losses: jax.Array
    history: list[int]


@partial(
    jax.jit,
    static_argnames=("model", "guide", "num_particles", "with_likelihood", "plate"),
)
def _strata_log_weights(
    rng_key: jax.Array,
    model: Callable,
    guide: AutoGaussianMixture,
    params: dict[str, jax.Array],
    args: tuple,
    kwargs: dict,
    num_particles: int,
    with_likelihood: bool,
    plate: str | int | None,
) -> jax.Array:
    """``(K, b)`` log ω_k(x_i), plus log p̂_k(y_i) when ``with_likelihood``."""
    spec = ParticleSpec(
        num_particles,
        frozenset({LOG_LIK} if with_likelihood else ()),
        plate,
        objective="prune_components",
        require_reparam=False,
    )
    terms = particle_terms(rng_key, params, model, guide, args, kwargs, spec)
    k = guide.num_components
    # w = ω_k(x_i) / M
    log_w = jnp.reshape(terms.weights.log_predictive, (k, num_particles, -1))
    if not with_likelihood:
        return log_w[:, 0, :] + math.log(num_particles)
    log_lik = jnp.reshape(present(terms.log_lik, "log_lik"), (k, num_particles, -1))
    return jax.nn.logsumexp(log_w + log_lik, axis=1)  # log ω_k p̂_k(y_i)


def prune_components(
    rng_key: jax.Array,
    params: dict[str, jax.Array],
    model: Callable,
    guide: AutoGaussianMixture,
    *args: Any,
    criterion: str = "auto",
    num_particles: int = 64,
    data_plate: str | int | None = None,
    **kwargs: Any,
) -> tuple[AutoGaussianMixture, dict[str, jax.Array], np.ndarray]:
    r"""Remove the components never the most probable for any observation (the
    pruning heuristic of Kock et al.).

    Component :math:`k` survives if it is :math:`\arg\max_l a_{il}` for some
    observation, with :math:`a_{il} = \omega_l(x_i)` (``criterion="weight"``, the
    default for gated weights) or the responsibility
    :math:`a_{il} \propto \omega_l(x_i)\, \frac1M\sum_m p(y_i\mid\theta_{l,m})`
    (``"responsibility"``, the default otherwise). The survivors' weights are
    renormalised.

    :param rng_key: random key (for the responsibilities).
    :param params: the fitted parameters of ``guide``.
    :param model: the model.
    :param guide: a fitted :class:`AutoGaussianMixture`.
    :param args: model arguments (the training data).
    :param str criterion: ``"auto"``, ``"weight"`` or ``"responsibility"``.
    :param int num_particles: draws per component for the responsibilities.
    :param data_plate: the plate (or negative batch dimension) that indexes
        observations, as for :class:`~numpyro_pvi.PredictiveELBO`.
    :param kwargs: model keyword arguments.
    :return: ``(new_guide, new_params, kept)``, ``kept`` the surviving indices.
    """
    params, model, _ = check_fitted_call("prune_components", params, model, guide)
    if criterion == "auto":
        criterion = "responsibility" if guide.gating_covariates is None else "weight"
    if criterion not in ("weight", "responsibility"):
        raise ValueError(
            "criterion must be 'auto', 'weight' or 'responsibility', got "
            f"{criterion!r}."
        )
    scores = _strata_log_weights(
        rng_key,
        model,
        guide,
        params,
        args,
        kwargs,
        num_particles,
        criterion == "responsibility",
        check_data_plate(data_plate, "prune_components"),
    )
    winners = np.asarray(jnp.argmax(scores, axis=0))
    kept = np.unique(winners)
    if kept.size == guide.num_components:
        return guide, params, kept
    return (*_subset_guide(guide, params, kept), kept)


def _subset_guide(
    guide: AutoGaussianMixture, params: dict[str, jax.Array], kept: np.ndarray
) -> tuple[AutoGaussianMixture, dict[str, jax.Array]]:
    p = guide.prefix
    new_params = dict(params)
    new_params[f"{p}_locs"] = params[f"{p}_locs"][kept]
    new_params[f"{p}_scale_trils"] = params[f"{p}_scale_trils"][kept]
    if guide.gating_covariates is None:
        new_params[f"{p}_weight_logits"] = params[f"{p}_weight_logits"][kept]
    else:
        coefs = params[f"{p}_gate_coefs"]
        eta = jnp.concatenate([jnp.zeros((1, coefs.shape[1])), coefs])[kept]
        eta = eta - eta[:1]
        if kept.size > 1:
            new_params[f"{p}_gate_coefs"] = eta[1:]
        else:
            new_params.pop(f"{p}_gate_coefs")
    new_guide = AutoGaussianMixture(
        guide.model,
        int(kept.size),
        gating_covariates=guide.gating_covariates,
        prefix=p,
        init_loc_fn=guide.init_loc_fn,
        init_scale=guide.init_scale,
        init_spread=guide.init_spread,
        entropy=guide.entropy,
    )
    return new_guide, new_params


def fit_gm_pvi(
    rng_key: jax.Array,
    model: Callable,
    guide: AutoGaussianMixture,
    optim: Any,
    loss: Any,
    *args: Any,
    num_steps: int,
    prune_every: int | None = None,
    criterion: str = "auto",
    num_prune_particles: int = 64,
    **kwargs: Any,
) -> PrunedFit:
    """Fit a Gaussian-mixture guide with SVI, pruning components as it goes.

    Runs ``num_steps`` steps in compiled blocks of ``prune_every``; after every
    block but the last, :func:`prune_components` removes the components never
    the most probable for any observation, and SVI continues from the survivors
    (fresh optimiser state).

    **Example**::

        >>> fit = fit_gm_pvi(key, model, AutoGaussianMixture(model, 4),
        ...                  optax.adam(1e-2), PredictiveELBO("log"), x, y,
        ...                  num_steps=3000, prune_every=500)

    :param rng_key: random key.
    :param model: the model.
    :param guide: an :class:`AutoGaussianMixture`.
    :param optim: an optimiser (``optax`` or ``numpyro.optim``).
    :param loss: the objective, e.g. ``PredictiveELBO(...)``.
    :param args: model arguments.
    :param int num_steps: total number of SVI steps.
    :param prune_every: block length; ``None`` fits without pruning.
    :param str criterion: see :func:`prune_components`.
    :param int num_prune_particles: draws per component for the
        responsibilities.
    :param kwargs: model keyword arguments.
    :return: :class:`PrunedFit`.
    """
    if not isinstance(guide, AutoGaussianMixture):
        raise TypeError(
            "fit_gm_pvi needs an AutoGaussianMixture guide, got "
            f"{type(guide).__name__}."
        )
    num_steps = check_int(num_steps, "num_steps", "fit_gm_pvi", minimum=1)
    if prune_every is not None:
        prune_every = check_int(prune_every, "prune_every", "fit_gm_pvi", minimum=1)
    block = num_steps if prune_every is None else prune_every
    blocks = [block] * (num_steps // block)
    if num_steps % block:
        blocks.append(num_steps % block)
    params, losses, history = None, [], []
    state: Any = None
    svi: Any = None
    runners: dict[int, Callable] = {}
    for i, length in enumerate(blocks):
        rng_key, init_key, prune_key = random.split(rng_key, 3)
        if state is None:
            svi, runners = SVI(model, guide, optim, loss), {}
            state = svi.init(init_key, *args, init_params=params, **kwargs)
        if length not in runners:
            runners[length] = _block_runner(svi, length)
        state, block_losses = runners[length](state, args=args, kwargs=kwargs)
        losses.append(block_losses)
        params = svi.get_params(state)
        if prune_every is not None and i < len(blocks) - 1:
            new_guide, params, _ = prune_components(
                prune_key,
                params,
                model,
                guide,
                *args,
                criterion=criterion,
                num_particles=num_prune_particles,
                data_plate=getattr(loss, "data_plate", None),
                **kwargs,
            )
            if new_guide is not guide:
                guide, state = new_guide, None
        history.append(guide.num_components)
    assert params is not None  # num_steps >= 1 blocks ran
    return PrunedFit(
        guide, params, guide.num_components, jnp.concatenate(losses), history
    )


def _block_runner(svi: SVI, length: int) -> Callable:
    """A compiled function running ``length`` SVI steps (one ``lax.scan``)."""
    return jax.jit(partial(svi_scan, svi, num_steps=length))
