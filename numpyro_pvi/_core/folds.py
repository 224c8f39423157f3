"""Folds of the data plate: each observation dealt into one of ``K`` folds."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import random


def fold_ids(rng_key: jax.Array, num_obs: int, num_folds: int) -> jax.Array:
    """``(num_obs,)`` fold of each observation: a random permutation dealt
    into ``num_folds`` folds in turn, so fold sizes differ by at most one and
    every observation is in exactly one fold.

    :param rng_key: key of the permutation.
    :param int num_obs: number :math:`N` of observations.
    :param int num_folds: number :math:`K \\le N` of folds.
    """
    order = random.permutation(rng_key, num_obs)
    return (
        jnp.zeros(num_obs, jnp.int32)
        .at[order]
        .set(jnp.arange(num_obs, dtype=jnp.int32) % num_folds)
    )
