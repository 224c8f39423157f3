r"""Mean absolute differences of LogNormal variables in closed form: the
CRPS of LogNormal likelihoods without simulations.

With :math:`m = e^{\mu + \sigma^2/2}` the mean of
:math:`X \sim \mathrm{LogNormal}(\mu, \sigma)`, tilting by :math:`X` turns
:math:`\log X` into :math:`\mathcal{N}(\mu + \sigma^2, \sigma^2)`, so
:math:`\mathbb{E}[X\, 1\{X < c\}] = m\, \Phi\bigl((\log c - \mu -
\sigma^2)/\sigma\bigr)`; both expectations of the CRPS follow, each two
error functions and an exponential.

**References**

1. Baran, S. & Lerch, S. (2015). *Log-normal distribution based Ensemble
   Model Output Statistics models for probabilistic wind-speed
   forecasting*. QJRMS 141(691), eq. 5 (the CRPS of a LogNormal forecast).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.scipy.special import erf
from numpyro.distributions import LogNormal

from numpyro_pvi._trace.site_laws import innermost
from numpyro_pvi._trace.terms import Likelihood, ParticleTerms
from numpyro_pvi.scores.closed_forms import CRPSForm, register_crps

_SQRT_HALF = math.sqrt(0.5)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def lognormal_mean(log_loc: jax.Array, log_scale: jax.Array) -> jax.Array:
    r""":math:`e^{\mu + \sigma^2/2}`, the mean of
    :math:`\mathrm{LogNormal}(\mu, \sigma)`."""
    return jnp.exp(log_loc + 0.5 * jnp.square(log_scale))


def _abs_mean_parts(
    log_loc: jax.Array, log_scale: jax.Array, mean: jax.Array, y: jax.Array
) -> tuple[jax.Array, ...]:
    positive = y > 0
    w = (jnp.log(jnp.where(positive, y, 1.0)) - log_loc) / log_scale
    below, tilted = erf(_SQRT_HALF * w), erf(_SQRT_HALF * (w - log_scale))
    value = jnp.where(positive, y * below - mean * tilted, mean - y)
    density = jnp.where(positive, y * jnp.exp(-0.5 * jnp.square(w)), 0.0)
    return value, positive, below, tilted, density


@jax.custom_jvp
def lognormal_abs_mean(
    log_loc: jax.Array, log_scale: jax.Array, mean: jax.Array, y: jax.Array
) -> jax.Array:
    r""":math:`\mathbb{E}|X - y|` for :math:`X \sim \mathrm{LogNormal}(\mu,
    \sigma)` of mean ``mean`` :math:`= m` (:func:`lognormal_mean`, computed
    once for both expectations), elementwise,

    .. math::

        \mathbb{E}|X - y| = y\, \mathrm{erf}\bigl(\tfrac{w}{\sqrt2}\bigr)
        - m\, \mathrm{erf}\bigl(\tfrac{w - \sigma}{\sqrt2}\bigr),
        \qquad w = \frac{\log y - \mu}{\sigma},

    and :math:`m - y` for :math:`y \le 0` (outside the support, e.g. the
    ``0`` of a masked observation: no logarithm of it, so no NaN in the
    gradient either). Since :math:`m\, e^{-(w-\sigma)^2/2} = y\,
    e^{-w^2/2}`, its partial derivatives at fixed :math:`m` are
    :math:`\partial_\mu = 0`, :math:`\partial_\sigma = \sqrt{2/\pi}\, y\,
    e^{-w^2/2}`, :math:`\partial_m = -\mathrm{erf}((w - \sigma)/\sqrt2)`
    and :math:`\partial_y = \mathrm{erf}(w/\sqrt2)`: from the same error
    functions and one exponential. The arguments broadcast; ``log_scale``
    must be positive.
    """
    return _abs_mean_parts(log_loc, log_scale, mean, y)[0]


@lognormal_abs_mean.defjvp
def _abs_mean_jvp(
    primals: tuple[jax.Array, ...], tangents: tuple[jax.Array, ...]
) -> tuple[jax.Array, jax.Array]:
    value, positive, below, tilted, density = _abs_mean_parts(*primals)
    _, d_scale, d_mean, d_y = tangents
    d_value = (
        _SQRT_2_OVER_PI * density * d_scale
        - jnp.where(positive, tilted, -1.0) * d_mean
        + jnp.where(positive, below, -1.0) * d_y
    )
    return value, d_value


def _pair_parts(
    loc_a: jax.Array,
    scale_a: jax.Array,
    mean_a: jax.Array,
    loc_b: jax.Array,
    scale_b: jax.Array,
    mean_b: jax.Array,
) -> tuple[jax.Array, ...]:
    var_a, var_b = jnp.square(scale_a), jnp.square(scale_b)
    inv = jax.lax.rsqrt(var_a + var_b)  # 1 / tau
    diff = loc_b - loc_a
    u_a, u_b = (diff - var_a) * (_SQRT_HALF * inv), (-diff - var_b) * (_SQRT_HALF * inv)
    erf_a, erf_b = erf(u_a), erf(u_b)
    value = -mean_a * erf_a - mean_b * erf_b
    # m_a exp(-u_a^2) = m_b exp(-u_b^2), over tau
    density = _SQRT_2_OVER_PI * mean_a * jnp.exp(-jnp.square(u_a)) * inv
    return value, erf_a, erf_b, density


#: ``(μ, σ, m, μ', σ', m') -> E|X - X'|``, with the derivatives of
#: :func:`lognormal_pair_abs_mean`.
_pair_abs_mean = jax.custom_jvp(lambda *params: _pair_parts(*params)[0])


@_pair_abs_mean.defjvp
def _pair_abs_mean_jvp(
    primals: tuple[jax.Array, ...], tangents: tuple[jax.Array, ...]
) -> tuple[jax.Array, jax.Array]:
    value, erf_a, erf_b, density = _pair_parts(*primals)
    _, scale_a, _, _, scale_b, _ = primals
    _, d_scale_a, d_mean_a, _, d_scale_b, d_mean_b = tangents
    d_value = (
        density * (scale_a * d_scale_a + scale_b * d_scale_b)
        - erf_a * d_mean_a
        - erf_b * d_mean_b
    )
    return value, d_value


def lognormal_pair_abs_mean(
    a: tuple[jax.Array, jax.Array, jax.Array], b: tuple[jax.Array, jax.Array, jax.Array]
) -> jax.Array:
    r""":math:`\mathbb{E}|X - X'|` of independent :math:`X \sim
    \mathrm{LogNormal}(\mu, \sigma)` and :math:`X' \sim
    \mathrm{LogNormal}(\mu', \sigma')` of means :math:`m, m'`, ``a = (μ,
    σ, m)``, ``b = (μ', σ', m')``,

    .. math::

        \mathbb{E}|X - X'| = -m\, \mathrm{erf}\Bigl(\frac{\mu' - \mu -
        \sigma^2}{\tau\sqrt2}\Bigr) - m'\, \mathrm{erf}\Bigl(\frac{\mu -
        \mu' - \sigma'^2}{\tau\sqrt2}\Bigr), \qquad \tau^2 = \sigma^2 +
        \sigma'^2

    (:math:`\sigma' \to 0` gives :func:`lognormal_abs_mean` at :math:`y =
    e^{\mu'}`). With :math:`D = m\, e^{-u^2} = m' e^{-u'^2}` (:math:`u, u'`
    the two arguments of the error functions), its partial derivatives at
    fixed means are :math:`0` in :math:`\mu, \mu'`, :math:`\sqrt{2/\pi}\,
    D \sigma / \tau` in :math:`\sigma` (and likewise :math:`\sigma'`), and
    minus the error functions in :math:`m, m'`.
    """
    return _pair_abs_mean(*a, *b)


@register_crps(LogNormal)
def _lognormal(terms: ParticleTerms, likelihood: Likelihood, y: jax.Array) -> CRPSForm:
    base = innermost(likelihood.laws[0])
    log_loc = likelihood.rows(0, base.loc)[..., 0]  # (M, b or 1)
    log_scale = likelihood.rows(0, base.scale)[..., 0]
    mean = lognormal_mean(log_loc, log_scale)  # once for both terms
    return CRPSForm(
        lognormal_abs_mean(log_loc, log_scale, mean, y),
        (log_loc, log_scale, mean),
        lognormal_pair_abs_mean,
    )
