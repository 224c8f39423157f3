r"""Simulated observations: one draw of every observed site at each particle.

Each site is drawn by NumPyro's own sampler, except the laws registered by
type (:func:`register_sampler`) that draw the same law without a rejection
loop per value: Student-t by Bailey's polar method, Gamma-based laws (Gamma,
Beta, Dirichlet, multivariate Student-t) by Marsaglia and Tsang's method with
the implicit reparameterisation gradient in the shape,
:math:`\partial x / \partial \alpha = -\partial_\alpha F(x; \alpha) / f(x; \alpha)`.

**References**

1. Marsaglia, G. & Tsang, W. W. (2000). *A simple method for generating
   gamma variables*. ACM TOMS 26(3), 363–372.
2. Bailey, R. W. (1994). *Polar generation of random variates with the
   t-distribution*. Mathematics of Computation 62(206), 779–781.
3. Figurnov, M., Mohamed, S. & Mnih, A. (2018). *Implicit
   reparameterization gradients*. NeurIPS.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from jax import random
from numpyro.distributions import (
    Beta,
    Dirichlet,
    Distribution,
    Gamma,
    MultivariateStudentT,
    StudentT,
    TransformedDistribution,
    Unit,
)

from numpyro_pvi._trace.data_plate import DataPlate, per_observation
from numpyro_pvi._trace.site_laws import (
    censoring_refusal,
    describe,
    innermost,
    is_censored,
    no_sampler,
    sampler_failure,
)
from numpyro_pvi._trace.site_values import masked_rows, value_mask

#: Samplers by the ``sample`` method they replace: a subclass that keeps
#: NumPyro's sampler (``Chi2`` keeps ``Gamma``'s) is drawn the same way.
_SAMPLERS: dict[Callable, Callable[[jax.Array, Any, tuple[int, ...]], jax.Array]] = {}

#: Rounds of redraws after which a Gamma value still rejected is NaN (a
#: shape so large that rounding rejects every candidate), never a hang.
MAX_ROUNDS = 64


def register_sampler(*types: type) -> Callable[[Callable], Callable]:
    """Register ``sampler(key, fn, shape)`` as the draw of the distributions
    ``types`` (and of their subclasses that keep their ``sample``)."""

    def register(sampler: Callable) -> Callable:
        for t in types:
            _SAMPLERS[t.sample] = sampler  # type: ignore[attr-defined]
        return sampler

    return register


# -- Gamma: Marsaglia and Tsang as array operations --------------------------


def _candidates(
    key: jax.Array, a: jax.Array, shape: tuple[int, ...]
) -> tuple[jax.Array, jax.Array]:
    """One candidate of ``Gamma(a)`` (``a >= 1``) per entry of ``shape``:
    the value and whether it is accepted."""
    key_z, key_u = random.split(key)
    d = a - 1.0 / 3.0
    z = random.normal(key_z, shape, a.dtype)
    v = (1.0 + jax.lax.rsqrt(9.0 * d) * z) ** 3
    positive = v > 0
    log_v = jnp.log(jnp.where(positive, v, 1.0))
    log_u = jnp.log(random.uniform(key_u, shape, a.dtype))
    return d * v, positive & (log_u < 0.5 * z * z + d - d * v + d * log_v)


def _redraw(a: jax.Array, size: int, state: tuple) -> tuple:
    """One round: two candidates for each of up to ``size`` values still
    rejected, the first accepted kept."""
    value, accepted, key, rounds = state
    key, key_round = random.split(key)
    count = jnp.cumsum((~accepted).astype(jnp.int32))
    idx = jnp.searchsorted(count, jnp.arange(1, size + 1, dtype=jnp.int32))
    a_idx = a.at[idx].get(mode="fill", fill_value=1.0)
    cand, ok = _candidates(key_round, jnp.broadcast_to(a_idx, (2, size)), (2, size))
    new = jnp.take_along_axis(cand, jnp.argmax(ok, axis=0)[None], axis=0)[0]
    any_ok = jnp.any(ok, axis=0)
    old = value.at[idx].get(mode="fill", fill_value=0.0)
    value = value.at[idx].set(jnp.where(any_ok, new, old), mode="drop")
    return value, accepted.at[idx].set(any_ok, mode="drop"), key, rounds + 1


def _boosted(
    key: jax.Array, alpha: jax.Array, boost: jax.Array, log_value: jax.Array
) -> jax.Array:
    tiny = jnp.finfo(log_value.dtype).tiny  # no log(0)
    u = random.uniform(key, log_value.shape, log_value.dtype, minval=tiny)
    return jnp.where(
        boost, log_value + jnp.log(u) / jnp.where(boost, alpha, 1.0), log_value
    )


def _log_draw(key: jax.Array, alpha: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """``log x`` of exact ``Gamma(alpha)`` draws (in log space, so that the
    boost ``Gamma(a) = Gamma(a + 1) U^(1/a)`` of a shape below 1 does not
    underflow)."""
    alpha = jnp.broadcast_to(alpha, shape).reshape(-1)
    n = alpha.shape[0]
    valid = jnp.isfinite(alpha) & (alpha > 0)
    boost = alpha < 1
    a = jnp.where(valid, jnp.where(boost, alpha + 1.0, alpha), 1.0)
    key_first, key_redraw, key_boost = random.split(key, 3)
    value, accepted = _candidates(key_first, a, a.shape)
    if n:  # under 5% rejected: one round for all, then small rounds
        state = _redraw(a, min(n, 256 + n // 16), (value, accepted, key_redraw, 0))
        value, accepted, _, _ = jax.lax.while_loop(
            lambda s: ~jnp.all(s[1]) & (s[3] < MAX_ROUNDS),
            partial(_redraw, a, min(n, 256 + n // 1024)),
            state,
        )
    log_value = jax.lax.cond(  # uniforms only where a shape is below 1
        jnp.any(boost),
        partial(_boosted, key_boost, alpha, boost),
        lambda v: v,
        jnp.log(value),
    )
    return jnp.where(valid & accepted, log_value, jnp.nan).reshape(shape)


def _float(alpha: jax.Array) -> jax.Array:
    return jnp.asarray(alpha, dtype=jnp.result_type(alpha, float))


@partial(jax.custom_jvp, nondiff_argnums=(2,))
def standard_gamma(
    key: jax.Array, alpha: jax.Array, shape: tuple[int, ...]
) -> jax.Array:
    """Exact draws of ``Gamma(alpha, 1)`` of ``shape``, differentiable in
    ``alpha`` (the law of :func:`jax.random.gamma`, not its stream; a shape
    that is not positive and finite gives NaN)."""
    return jnp.exp(_log_draw(key, _float(alpha), shape))


@partial(jax.custom_jvp, nondiff_argnums=(2,))
def standard_log_gamma(
    key: jax.Array, alpha: jax.Array, shape: tuple[int, ...]
) -> jax.Array:
    """``log`` of :func:`standard_gamma`'s draws (no underflow for shapes
    far below 1)."""
    return _log_draw(key, _float(alpha), shape)


def _gamma_jvp(log_space: bool, shape: tuple[int, ...], primals, tangents):
    key, alpha = primals[0], _float(primals[1])
    log_value = _log_draw(key, alpha, shape)
    value = jnp.exp(log_value)
    a = jnp.broadcast_to(alpha, shape).astype(value.dtype)
    tangent = jax.lax.random_gamma_grad(a, value) * jnp.broadcast_to(tangents[1], shape)
    return (log_value, tangent / value) if log_space else (value, tangent)


standard_gamma.defjvp(partial(_gamma_jvp, False))
standard_log_gamma.defjvp(partial(_gamma_jvp, True))


def _open_unit(x: jax.Array) -> jax.Array:
    """Clipped into the open unit interval, as NumPyro's ``Dirichlet``."""
    finfo = jnp.finfo(x.dtype)
    return jnp.clip(x, finfo.tiny, 1 - finfo.eps)


@register_sampler(Gamma)
def _gamma(key: jax.Array, fn: Gamma, shape: tuple[int, ...]) -> jax.Array:
    return standard_gamma(key, fn.concentration, shape) / fn.rate


@register_sampler(Beta)
def _beta(key: jax.Array, fn: Beta, shape: tuple[int, ...]) -> jax.Array:
    key_1, key_0 = random.split(key)
    log_1 = standard_log_gamma(key_1, fn.concentration1, shape)
    log_0 = standard_log_gamma(key_0, fn.concentration0, shape)
    return _open_unit(jax.nn.sigmoid(log_1 - log_0))


@register_sampler(Dirichlet)
def _dirichlet(key: jax.Array, fn: Dirichlet, shape: tuple[int, ...]) -> jax.Array:
    log_gamma = standard_log_gamma(key, fn.concentration, shape)
    return _open_unit(jax.nn.softmax(log_gamma, axis=-1))


@register_sampler(MultivariateStudentT)
def _multivariate_t(
    key: jax.Array, fn: MultivariateStudentT, shape: tuple[int, ...]
) -> jax.Array:
    # loc + L Z sqrt(df / V), one V ~ chi^2(df) per vector
    key_normal, key_gamma = random.split(key)
    df = _float(fn.df)
    v = 2.0 * standard_gamma(key_gamma, 0.5 * df, shape[:-1])
    z = random.normal(key_normal, shape, v.dtype) * jnp.sqrt(df / v)[..., None]
    return fn.loc + jnp.squeeze(jnp.matmul(fn.scale_tril, z[..., None]), axis=-1)


# -- Student-t: Bailey's polar method ----------------------------------------


def standard_t(key: jax.Array, df: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Exact draws of the standard Student-t with ``df`` degrees of freedom,
    differentiable in ``df`` (the radius in log space: no cancellation for
    large ``df``, no overflow for small)."""
    df = _float(df)
    key_angle, key_w = random.split(key)
    angle = random.uniform(key_angle, shape, df.dtype)
    w = random.uniform(key_w, shape, df.dtype, minval=jnp.finfo(df.dtype).tiny)
    a = -2.0 * jnp.log(w) / df
    log_radius = 0.5 * (jnp.log(df) + a + jnp.log(-jnp.expm1(-a)))
    return jnp.cos(2.0 * math.pi * angle) * jnp.exp(log_radius)


@register_sampler(StudentT)
def _student_t(key: jax.Array, fn: StudentT, shape: tuple[int, ...]) -> jax.Array:
    return fn.loc + fn.scale * standard_t(key, fn.df, shape)


# -- the observed sites' draws -----------------------------------------------


def _registered_draw(fn: Distribution, key: jax.Array) -> jax.Array | None:
    """A draw of ``fn`` by a registered sampler, under its wrappers and
    through the transforms of a ``TransformedDistribution`` that keeps
    NumPyro's sampler (an ``InverseGamma``: a Gamma draw's reciprocal);
    ``None`` where none is registered."""
    shape, base = fn.shape(), innermost(fn)
    transforms: list = []
    while type(base).sample is TransformedDistribution.sample:
        transforms = list(base.transforms) + transforms
        base = innermost(base.base_dist)
    sampler = _SAMPLERS.get(type(base).sample)
    if sampler is None:
        return None
    for transform in reversed(transforms):
        shape = transform.inverse_shape(shape)
    draw = sampler(key, base, shape)
    for transform in transforms:
        draw = transform(draw)
    return draw


def _refusal(site: dict[str, Any], reparam: bool) -> str | None:
    """Why the site cannot be simulated as the score needs (reparameterised
    when ``reparam``); ``None`` where it can."""
    fn, name = site["fn"], site["name"]
    if is_censored(fn):
        return (
            censoring_refusal(name, describe(fn))
            + " A score that compares them (crps, energy, quadratic) would be "
            "wrong."
        )
    if isinstance(innermost(fn), Unit):
        return (
            f"Observed site '{name}' (a numpyro.factor) is a term of the log "
            "density, with no outcome to simulate, which this score compares "
            "with the observations."
        )
    why = sampler_failure(fn)
    if why is not None:
        return (
            no_sampler(name, fn, why)
            + " This score compares simulated outcomes with the observations."
        )
    if reparam and not fn.has_rsample:
        return (
            f"Observed site '{name}' ({describe(fn)}) has no reparameterised "
            "sampler, which this score needs to differentiate simulated "
            "observations." + getattr(innermost(fn), "reparam_remedy", "")
        )
    return None


def _site_draw(site: dict[str, Any], plate: DataPlate, key: jax.Array) -> jax.Array:
    fn = site["fn"]
    draw = _registered_draw(fn, key)
    if draw is None:  # NumPyro's Delta(3.0) draws a Python float
        draw = jnp.asarray(fn.sample(key))
    draw = jnp.broadcast_to(
        draw, jnp.broadcast_shapes(draw.shape, jnp.shape(site["value"]))
    )
    return masked_rows(
        per_observation(draw, plate, fn.event_dim), value_mask(site, plate)
    )


def simulated_values(
    observed: list[dict[str, Any]],
    plate: DataPlate,
    key: jax.Array,
    reparam: bool,
    blame: Callable[[list[tuple[dict[str, Any], str]]], str],
) -> jax.Array:
    """``(b, d)`` one draw of every observed site given the latents, laid out
    like the observed values (``0`` at masked components); where a site
    cannot be simulated so, the refusal ``blame(refused)`` words from the
    sites and reasons."""
    reasons = [(s, _refusal(s, reparam)) for s in observed]
    refused = [(s, why) for s, why in reasons if why is not None]
    if refused:
        raise ValueError(blame(refused))
    keys = random.split(key, len(observed))
    draws = [_site_draw(s, plate, k) for s, k in zip(observed, keys, strict=True)]
    return jnp.concatenate(draws, axis=1)
