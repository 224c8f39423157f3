r"""The mean absolute value of a Normal variable, the closed form behind the
CRPS of Normal likelihoods."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.scipy.special import erf

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _parts(loc: jax.Array, scale: jax.Array) -> tuple[jax.Array, jax.Array]:
    # one reciprocal of the scale, at its own (often smaller) shape
    v = loc * (1.0 / (math.sqrt(2.0) * scale))
    return erf(v), _SQRT_2_OVER_PI * jnp.exp(-jnp.square(v))


@jax.custom_jvp
def normal_abs_mean(loc: jax.Array, scale: jax.Array) -> jax.Array:
    r""":math:`\mathbb{E}|X|` for :math:`X \sim \mathcal{N}(\mu, \sigma^2)`,

    .. math::

        \mathbb{E}|X| = \mu\, \mathrm{erf}\!\bigl(\tfrac{\mu}{\sigma\sqrt2}\bigr)
        + \sigma \sqrt{\tfrac{2}{\pi}}\, e^{-\mu^2 / 2\sigma^2},

    elementwise, with the derivatives :math:`\partial/\partial\mu =
    \mathrm{erf}(\mu / \sigma\sqrt2)` and :math:`\partial/\partial\sigma =
    \sqrt{2/\pi}\, e^{-\mu^2/2\sigma^2}` from the same two evaluations (the
    terms autodiff would produce cancel). ``scale`` must be positive; the
    two arguments broadcast.

    **References**

    1. Gneiting, T. & Raftery, A. E. (2007). *Strictly proper scoring rules,
       prediction, and estimation*. JASA 102(477), eq. 5 (the CRPS of a
       Normal forecast).
    """
    e, g = _parts(loc, scale)
    return loc * e + scale * g


@normal_abs_mean.defjvp
def _normal_abs_mean_jvp(
    primals: tuple[jax.Array, jax.Array], tangents: tuple[jax.Array, jax.Array]
) -> tuple[jax.Array, jax.Array]:
    loc, scale = primals
    d_loc, d_scale = tangents
    e, g = _parts(loc, scale)
    return loc * e + scale * g, e * d_loc + g * d_scale
