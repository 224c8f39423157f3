"""One replication of :func:`~numpyro_pvi.diagnostics.predictive_calibration`:
fit to a data set without one observation, and rank that observation among
draws of the fitted posterior predictive (the randomised PIT)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from numpyro.handlers import condition

from numpyro_pvi._core import (
    DataPlate,
    ParticleSpec,
    data_sites,
    particle_terms,
    per_observation,
)
from numpyro_pvi.diagnostics._idata import component_labels
from numpyro_pvi.diagnostics._replications import fit_replication
from numpyro_pvi.particles import Y_SIM, present
from numpyro_pvi.selection import mask_observations


def pit_ranks(
    rng_key: jax.Array,
    params: dict[str, jax.Array],
    model: Callable,
    guide: Callable,
    args: tuple,
    kwargs: dict,
    *,
    index: jax.Array,
    plate: DataPlate,
    num_draws: int,
) -> jax.Array:
    r"""Randomised PIT ranks of observation ``index`` of the data plate.

    With :math:`\tilde y_l \sim p(\tilde y \mid \theta_l)`,
    :math:`\theta_l \sim q` (:math:`l = 1..L`), the rank of the observed
    :math:`y` is :math:`\#\{\tilde y_l < y\} + U`, :math:`U` uniform on
    :math:`0, \dots, \#\{\tilde y_l = y\}`: discrete uniform on
    :math:`0..L` when :math:`y` is a draw from the same predictive, for
    continuous and discrete outcomes alike. One rank per scalar component
    of the observation (observed sites in trace order).

    :return: ``(d,)`` integer ranks in ``0..num_draws``.

    **References**

    - Czado, C., Gneiting, T. & Held, L. (2009). *Predictive model
      assessment for count data.* Biometrics (the randomised PIT).
    """
    key_draw, key_tie = random.split(rng_key)
    spec = ParticleSpec(
        num_draws,
        frozenset({Y_SIM}),
        plate.selector,
        objective="predictive_calibration",
        require_reparam=False,
        stratified=False,
    )
    terms = particle_terms(key_draw, params, model, guide, args, kwargs, spec)
    y_sim = jax.lax.stop_gradient(present(terms.y_sim, "y_sim")[:, index])  # (L, d)
    y_obs = present(terms.y_obs, "y_obs")[index]
    below = jnp.sum(y_sim < y_obs, axis=0)
    ties = jnp.sum(y_sim == y_obs, axis=0)
    return below + random.randint(key_tie, below.shape, 0, ties + 1)


def in_plate(model_trace: dict, observed: Sequence[str], plate: DataPlate) -> list:
    """The observed sites of the data plate (the ones ranked)."""
    sites = data_sites([model_trace[name] for name in observed], plate)[0]
    return [site["name"] for site in sites]


def pit_columns(model_trace: dict, observed: Sequence[str], plate: DataPlate) -> list:
    """``(label, site)`` of every scalar component of one observation."""
    out = []
    for name in observed:
        site = model_trace[name]
        rows = per_observation(
            np.zeros(np.shape(site["value"])), plate, site["fn"].event_dim, xp=np
        )
        width = rows.shape[1]
        labels = component_labels(name, () if width == 1 else (width,))
        out += [(label, name) for label in labels]
    return out


def pit_replication(
    model: Callable,
    guide: Callable,
    optim: Any,
    loss: Any,
    inject: Callable,
    plate: DataPlate,
    num_svi_steps: int,
    num_draws: int,
) -> Callable:
    """``(key, data, index) -> (ranks, final loss, tail loss, drift)``: fit
    to the data without observation ``index``, rank that observation."""

    def one(inputs: tuple) -> tuple:
        key, data, index = inputs
        key_svi, key_pit = random.split(key)
        args, kwargs = inject(data)
        keep = jnp.ones(plate.size).at[index].set(0.0)
        conditioned = condition(model, data)
        assert plate.selector is not None  # one observation is held out of a plate
        masked = mask_observations(conditioned, keep=keep, data_plate=plate.selector)
        params, fit = fit_replication(
            key_svi,
            masked,
            guide,
            optim,
            loss,
            args,
            kwargs,
            num_svi_steps=num_svi_steps,
        )
        ranks = pit_ranks(
            key_pit,
            params,
            conditioned,
            guide,
            args,
            kwargs,
            index=index,
            plate=plate,
            num_draws=num_draws,
        )
        return (ranks, *fit)

    return one
