r"""The mean absolute value of a Normal variable, the closed form behind the
CRPS of Normal likelihoods."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.scipy.special import erf
from numpyro.distributions import Normal

from numpyro_pvi._trace.site_laws import innermost
from numpyro_pvi._trace.terms import Likelihood, ParticleTerms
from numpyro_pvi.scores.closed_forms import CRPSForm, register_crps

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


def _normal_pair(a: tuple[jax.Array, ...], b: tuple[jax.Array, ...]) -> jax.Array:
    """``E|Y - Y'|`` of independent ``Y ~ N(a)``, ``Y' ~ N(b)``."""
    return normal_abs_mean(a[0] - b[0], jnp.sqrt(jnp.square(a[1]) + jnp.square(b[1])))


@register_crps(Normal)
def _normal(terms: ParticleTerms, likelihood: Likelihood, y: jax.Array) -> Any:
    base = innermost(likelihood.laws[0])
    loc = likelihood.rows(0, base.loc)[..., 0]  # (M, b or 1)
    scale = likelihood.rows(0, base.scale)[..., 0]
    return CRPSForm(normal_abs_mean(y - loc, scale), (loc, scale), _normal_pair)
