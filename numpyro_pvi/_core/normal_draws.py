r"""Simulated observations of Normal likelihoods (``Normal``,
``MultivariateNormal``), their standard normal deviates drawn as one flat
array.

:func:`jax.random.normal` of a shape whose last axis is short (a vector
observation of 3 values per index: ``(4000, 3)`` per particle) generates
its random bits 2.3–3.9 times more slowly on a CPU than the same number of
values in one flat array (``(64, 4000, 3)`` under ``vmap``: 23.5 ms against
6.1 ms; ``benchmarks/RESULTS.md``). JAX's random bits are counter-based,
one counter per value in row-major order, so the flat draw reshaped holds
the *same deviates* as NumPyro's own sampler's draw (tested), not only the
same law.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import random
from numpyro.distributions import MultivariateNormal, Normal

__all__ = ["SAMPLERS", "standard_normal"]


def standard_normal(
    key: jax.Array, shape: tuple[int, ...], dtype: Any = None
) -> jax.Array:
    """``jax.random.normal(key, shape, dtype)``, drawn as one flat array and
    reshaped (the same values, faster where the last axis is short)."""
    kwargs = {} if dtype is None else {"dtype": dtype}
    return random.normal(key, (math.prod(shape),), **kwargs).reshape(shape)


def _normal(key: jax.Array, fn: Normal, shape: tuple[int, ...]) -> jax.Array:
    # as Normal.sample: loc + eps * scale
    return fn.loc + standard_normal(key, shape) * fn.scale


def _multivariate_normal(
    key: jax.Array, fn: MultivariateNormal, shape: tuple[int, ...]
) -> jax.Array:
    # as MultivariateNormal.sample: loc + L eps
    eps = standard_normal(key, shape)
    return fn.loc + jnp.squeeze(jnp.matmul(fn.scale_tril, eps[..., None]), axis=-1)


#: Samplers by the ``sample`` method they replace.
SAMPLERS: dict[Callable[..., Any], Callable[..., jax.Array]] = {
    Normal.sample: _normal,
    MultivariateNormal.sample: _multivariate_normal,
}
