r"""CRPS of Poisson, negative-binomial and zero-inflated likelihoods of counts.

For :math:`Y \sim \mathrm{Poisson}(\lambda)` and :math:`n = \lfloor y \rfloor`,

.. math::

    G(\lambda, y) = \mathbb{E}|Y - y|
    = (y - \lambda)\bigl(2F_\lambda(n) - 1\bigr) + 2\lambda\, p_\lambda(n)

(Wei & Held 2014). The pair term :math:`\mathbb{E}|Y - Y'| =
\mathbb{E}_Y G(\lambda', Y)` takes one draw of :math:`Y`; its gradient in
:math:`\lambda` comes from the measure-valued derivative
:math:`\mathbb{E}[2F_{\lambda'}(Y) - 1]` (Mohamed et al. 2020, §6), so value
and gradient are unbiased. A zero-inflated Poisson mixes these with the point
mass; a negative binomial is a Poisson of one reparameterised Gamma rate draw.

**References**

1. Wei, W. & Held, L. (2014). *Calibration tests for count data*. TEST 23.
2. Mohamed, S., Rosca, M., Figurnov, M. & Mnih, A. (2020). *Monte Carlo
   gradient estimation in machine learning*. JMLR 21(132).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import random
from jax.lax import stop_gradient
from numpyro.distributions import (
    Distribution,
    GammaPoisson,
    GeometricLogits,
    GeometricProbs,
    Poisson,
    ZeroInflatedProbs,
)

from numpyro_pvi._trace.data_plate import DataPlate
from numpyro_pvi._trace.site_laws import innermost
from numpyro_pvi._trace.site_values import parameter_rows
from numpyro_pvi._trace.terms import Likelihood, ParticleTerms
from numpyro_pvi.scores.closed_forms import CRPSForm, register_crps
from numpyro_pvi.scores.closed_forms.poisson_cdf import (
    poisson_cdf_pmf,
    poisson_quantile,
)
from numpyro_pvi.scores.simulation import standard_gamma


def poisson_abs_mean(rate: jax.Array, y: jax.Array) -> jax.Array:
    r""":math:`\mathbb{E}|Y - y|` for :math:`Y \sim
    \mathrm{Poisson}(\lambda)`, elementwise (broadcasting); differentiable
    in ``rate`` only (``y`` is a count, data or a draw)."""
    return _abs_mean(rate, y, *poisson_cdf_pmf(rate, jnp.floor(y)))


@jax.custom_jvp
def _abs_mean(
    rate: jax.Array, y: jax.Array, cdf: jax.Array, pmf: jax.Array
) -> jax.Array:
    """:func:`poisson_abs_mean` from ``F_λ(n)`` and ``p_λ(n)``, ``n = ⌊y⌋``
    (their derivatives in the rate are in the rule)."""
    return (y - rate) * (2.0 * cdf - 1.0) + 2.0 * rate * pmf


@_abs_mean.defjvp
def _abs_mean_jvp(primals: tuple, tangents: tuple) -> tuple[jax.Array, jax.Array]:
    rate, y, cdf, pmf = primals
    n = jnp.floor(y)
    # dF(n)/dλ = -p(n), dp(n)/dλ = p(n - 1) - p(n) and λ p(n - 1) = n p(n)
    slope = 1.0 - 2.0 * cdf + 2.0 * pmf * (n + 1.0 - y)
    return _abs_mean(rate, y, cdf, pmf), slope * tangents[0]


def poisson_pair_abs_mean(
    a: tuple[jax.Array, jax.Array], b: tuple[jax.Array, jax.Array]
) -> jax.Array:
    r"""An unbiased estimate of :math:`\mathbb{E}|Y - Y'|` for independent
    :math:`Y \sim \mathrm{Poisson}(\lambda)`, :math:`Y' \sim
    \mathrm{Poisson}(\lambda')` from ``a = (λ, y)``, ``y`` a draw of
    :math:`Y`, and ``b = (λ', ·)``: :math:`G(\lambda', y)`, with the
    gradient in :math:`\lambda` of the Poisson identity (module
    docstring)."""
    (rate, y), (other, _) = a, b
    cdf, pmf = poisson_cdf_pmf(other, jnp.floor(y))
    value = _abs_mean(other, y, cdf, pmf)
    step = 2.0 * cdf - 1.0  # G(λ', y + 1) - G(λ', y)
    return value + (rate - stop_gradient(rate)) * stop_gradient(step)


def zero_inflated_abs_mean(rate: jax.Array, gate: jax.Array, y: jax.Array) -> jax.Array:
    r""":math:`\mathbb{E}|Y - y|` for :math:`Y` zero with probability
    ``gate``, else :math:`\mathrm{Poisson}(\lambda)`."""
    return gate * jnp.abs(y) + (1.0 - gate) * poisson_abs_mean(rate, y)


def zero_inflated_pair_abs_mean(
    a: tuple[jax.Array, jax.Array, jax.Array], b: tuple[jax.Array, jax.Array, jax.Array]
) -> jax.Array:
    r"""An unbiased estimate of :math:`\mathbb{E}|Y - Y'|` for independent
    zero-inflated Poissons, ``a = (λ, y, g)`` and ``b = (λ', ·, g')`` (``y``
    a draw of the Poisson part of :math:`Y`): a zero against the other's
    Poisson part is its mean, two Poisson parts are
    :func:`poisson_pair_abs_mean`."""
    (rate, _, gate), (other, _, other_gate) = a, b
    return (
        gate * (1.0 - other_gate) * other
        + (1.0 - gate) * other_gate * rate
        + (1.0 - gate) * (1.0 - other_gate) * poisson_pair_abs_mean(a[:2], b[:2])
    )


def _rate(
    base: Distribution, site: dict[str, Any], plate: DataPlate, key: jax.Array
) -> jax.Array:
    """``(b, d)`` the Poisson rate of a site of distribution ``base`` (a
    Poisson, a Gamma–Poisson or a geometric one: :func:`poisson_likelihoods`)
    laid out like its draws: a Poisson's rate (``(1, d)`` when it does not
    vary along the data plate), or for a Gamma–Poisson (the negative
    binomials) one reparameterised draw of its Gamma rate per count, for a
    geometric distribution of success probability :math:`p` (failures
    before the first success) one of its exponential rate, of mean
    :math:`(1 - p)/p`."""
    fn = site["fn"]
    shape = jnp.broadcast_shapes(fn.shape(), jnp.shape(site["value"]))
    if type(base) is Poisson:
        return parameter_rows(base.rate, shape, plate, fn.event_dim)
    if isinstance(base, GeometricLogits):
        rate = random.exponential(key, shape) * jnp.exp(-base.logits)
    elif isinstance(base, GeometricProbs):
        rate = random.exponential(key, shape) * (1.0 - base.probs) / base.probs
    else:
        rate = standard_gamma(key, base.concentration, shape) / base.rate
    return parameter_rows(rate, shape, plate, fn.event_dim)


def _rate_gate(
    site: dict[str, Any], plate: DataPlate, key: jax.Array
) -> tuple[jax.Array, jax.Array | None]:
    """``(b, d)`` the rate of a site of :func:`poisson_likelihoods` and its
    zero-inflation gate (``None`` without)."""
    fn = site["fn"]
    outer = innermost(fn)
    rate = _rate(zero_inflated_base(outer), site, plate, key)
    if not isinstance(outer, ZeroInflatedProbs):
        return rate, None
    shape = jnp.broadcast_shapes(fn.shape(), jnp.shape(site["value"]))
    return rate, parameter_rows(outer.gate, shape, plate, fn.event_dim)


def poisson_counts(base: Distribution) -> bool:
    """Whether ``base`` is a Poisson, or a Poisson of a Gamma rate (the
    negative binomials, and the geometric distribution: its exponential
    rate)."""
    return type(base) is Poisson or isinstance(
        base, (GammaPoisson, GeometricProbs, GeometricLogits)
    )


def zero_inflated_base(base: Distribution) -> Distribution:
    """The distribution a zero-inflated one inflates, or ``base``."""
    if isinstance(base, ZeroInflatedProbs):
        return innermost(base.base_dist)
    return base


def poisson_likelihoods(observed: list[dict[str, Any]]) -> bool:
    """Whether every observed site is a Poisson, negative binomial or
    zero-inflated one (:func:`poisson_parts` has their rates)."""
    return bool(observed) and all(
        poisson_counts(zero_inflated_base(innermost(s["fn"]))) for s in observed
    )


def poisson_parts(
    observed: list[dict[str, Any]], plate: DataPlate, key: jax.Array
) -> tuple[jax.Array, jax.Array | None] | None:
    """``(b, d)`` the rate of every observed site (:func:`_rate`), laid out
    like :func:`~numpyro_pvi._trace.site_values.observed_values`, and the
    zero-inflation gate (``0`` at a site without; ``None`` when no site is
    zero-inflated), when all of them are Poisson, negative binomial or
    zero-inflated ones (``(1, d)`` for one Poisson site whose parameters do
    not vary along the data plate); ``None`` otherwise."""
    if not poisson_likelihoods(observed):
        return None
    keys = random.split(key, len(observed))
    present = [_rate_gate(s, plate, k) for s, k in zip(observed, keys, strict=True)]
    if len(present) == 1:
        return present[0]
    b = plate.subsample_size
    rows = [jnp.broadcast_to(r, (b, r.shape[1])) for r, _ in present]
    rate = jnp.concatenate(rows, 1)
    if all(g is None for _, g in present):
        return rate, None
    gates = [
        jnp.zeros_like(r) if g is None else jnp.broadcast_to(g, r.shape)
        for r, (_, g) in zip(rows, present, strict=True)
    ]
    return rate, jnp.concatenate(gates, 1)


def poisson_draws(key: jax.Array, rate: jax.Array, num_rows: int) -> jax.Array:
    """``(b, d)`` one draw of each Poisson part, as floats, not
    differentiable: the quantile of one uniform each
    (:func:`~numpyro_pvi.scores.closed_forms.poisson_cdf.poisson_quantile`, one
    evaluation of the cdf, where :func:`jax.random.poisson` loops until
    every value's rejection step has accepted)."""
    rate = stop_gradient(jnp.broadcast_to(rate, (num_rows, rate.shape[1])))
    return poisson_quantile(random.uniform(key, rate.shape, rate.dtype), rate)


@register_crps(
    Poisson,
    GammaPoisson,
    GeometricProbs,
    GeometricLogits,
    ZeroInflatedProbs,
    applies=lambda base: poisson_counts(zero_inflated_base(base)),
    name="Poisson or negative-binomial counts",
)
def _counts(terms: ParticleTerms, likelihood: Likelihood, y: jax.Array) -> CRPSForm:
    """The observation term exact, each pair from one draw of the count of
    particle ``j`` (its rate's draw, for a negative binomial, another)."""
    plate = likelihood.plate

    def parts(sites: list, key: jax.Array) -> tuple:
        rate_key, count_key = random.split(random.fold_in(key, 1))
        parts = poisson_parts(sites, plate, rate_key)
        assert parts is not None  # the registry applies this form to counts only
        rate, gate = parts
        counts = poisson_draws(count_key, rate, plate.subsample_size)
        return rate[..., 0], None if gate is None else gate[..., 0], counts[..., 0]

    rate, gate, counts = likelihood.per_particle(parts)  # (M, b or 1), (M, b)
    y = y.astype(rate.dtype)
    pairs = (jnp.broadcast_to(rate, counts.shape), counts)
    if gate is None:
        return CRPSForm(poisson_abs_mean(rate, y), pairs, poisson_pair_abs_mean)
    gated = (*pairs, jnp.broadcast_to(gate, counts.shape))
    return CRPSForm(
        zero_inflated_abs_mean(rate, gate, y), gated, zero_inflated_pair_abs_mean
    )
