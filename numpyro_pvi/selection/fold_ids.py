"""Folds of the data plate: each observation dealt into one of ``K`` folds."""

from __future__ import annotations

import jax
import numpy as np
from jax import random


def fold_ids(rng_key: jax.Array, num_obs: int, num_folds: int) -> np.ndarray:
    """``(num_obs,)`` fold of each observation: a random permutation dealt
    into ``num_folds`` folds in turn, so fold sizes differ by at most one and
    every observation is in exactly one fold.

    :param rng_key: key of the permutation.
    :param int num_obs: number :math:`N` of observations.
    :param int num_folds: number :math:`K \\le N` of folds.
    """
    order = np.asarray(random.permutation(rng_key, num_obs))
    folds = np.empty(num_obs, np.int32)
    folds[order] = np.arange(num_obs, dtype=np.int32) % num_folds
    return folds
