r"""The mean absolute value of a Normal variable, the closed form behind the
CRPS of Normal likelihoods, and the CRPS of a mixture guide's strata with
its partial derivatives in one pass."""

from __future__ import annotations

import math
from typing import Any

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


def _unbroadcast(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """``x`` summed over the axes along which an array of ``shape`` was
    broadcast to ``x.shape`` (same rank)."""
    axes = tuple(
        i for i, (a, b) in enumerate(zip(x.shape, shape, strict=True)) if b == 1 < a
    )
    return jnp.sum(x, axis=axes, keepdims=True) if axes else x


def _strata_score(
    loc: jax.Array, scale: jax.Array, y: jax.Array, omega: jax.Array
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """The value of :func:`normal_strata_crps` and its partial derivatives
    in each argument (at the broadcast shape ``(K M, b)`` of ``loc`` and
    ``scale``), stratum by stratum and pair of strata by pair of strata:
    nothing but the partials outlives the pass."""
    k = omega.shape[0]
    m = loc.shape[0] // k
    shape = jnp.broadcast_shapes(loc.shape, scale.shape, (1,) + y.shape)
    locs = [loc[a * m : (a + 1) * m] for a in range(k)]
    scales = [scale[a * m : (a + 1) * m] for a in range(k)]
    value = jnp.zeros(y.shape, loc.dtype)
    d_omega = [jnp.zeros(y.shape, loc.dtype) for _ in range(k)]
    d_loc, d_scale = [], []
    d_y = jnp.zeros(y.shape, loc.dtype)
    for a in range(k):  # -E|Y - y| over stratum a, weighted omega_a / M
        diff = y - locs[a]
        e, g = _parts(diff, scales[a])
        mean = jnp.sum(diff * e + scales[a] * g, axis=0) / m
        value = value - omega[a] * mean
        d_omega[a] = d_omega[a] - mean
        d_y = d_y - omega[a] * jnp.sum(e, axis=0) / m
        d_loc.append(jnp.broadcast_to(omega[a] / m * e, (m,) + shape[1:]))
        d_scale.append(jnp.broadcast_to(-omega[a] / m * g, (m,) + shape[1:]))
    for a in range(k):  # + E|Y - Y'| / 2: draw j of a with draw j - 1 of c
        for c in range(k):
            loc_c, scale_c = (
                jnp.roll(locs[c], 1, axis=0),
                jnp.roll(scales[c], 1, axis=0),
            )
            diff = locs[a] - loc_c
            s = jnp.sqrt(jnp.square(scales[a]) + jnp.square(scale_c))
            e, g = _parts(diff, s)
            mean = jnp.sum(diff * e + s * g, axis=0) / m
            half = 0.5 * omega[a] * omega[c]
            value = value + half * mean
            d_omega[a] = d_omega[a] + 0.5 * omega[c] * mean
            d_omega[c] = d_omega[c] + 0.5 * omega[a] * mean
            coef = half / m
            g_over_s = coef * g / s
            d_loc[a] = d_loc[a] + coef * e
            d_loc[c] = d_loc[c] - jnp.roll(coef * e, -1, axis=0)
            d_scale[a] = d_scale[a] + g_over_s * scales[a]
            d_scale[c] = d_scale[c] + jnp.roll(g_over_s * scale_c, -1, axis=0)
    partials = (
        jnp.concatenate(d_loc),
        jnp.concatenate(d_scale),
        d_y,
        jnp.stack(d_omega),
    )
    return value, partials


@jax.custom_vjp
def normal_strata_crps(
    loc: jax.Array, scale: jax.Array, y: jax.Array, omega: jax.Array
) -> jax.Array:
    r"""``(b,)`` the negative CRPS of the mixture :math:`\sum_k \omega_k
    F_k`, each :math:`F_k` the mean of ``M`` Normals
    :math:`\mathcal{N}(\mu_{km}, \sigma_{km}^2)`, estimated with both
    expectations in closed form and each draw paired with the previous
    one of every stratum:

    .. math::

        -\sum_{k,m} \frac{\omega_k}{M}\, \mathbb{E}|Y_{km} - y|
        + \frac12 \sum_{k,l} \omega_k \omega_l \frac1M \sum_m
        \mathbb{E}|Y_{km} - Y'_{l,m-1}|,

    with :math:`\mathbb{E}|Y - Y'|` of two independent Normals
    :func:`normal_abs_mean` at the difference of the means and
    :math:`\sqrt{\sigma^2 + \sigma'^2}`. The same estimate as
    :func:`~numpyro_pvi.scores.pair_sums.derangement_pair_mean` of
    :func:`normal_abs_mean` terms, with its partial derivatives computed in
    the same pass (the backward pass multiplies them by the cotangent): the
    step's temporaries are the two ``(K M, b)`` partials, where autodiff
    kept each term's error function and exponential. On a GLM with
    ``N = 8000`` that brought a mixture guide's step under the 32 MiB that
    glibc's ``malloc`` reuses between calls (``benchmarks/RESULTS.md``).

    :param loc: ``(K M, b)`` (or ``(K M, 1)``) the means, stratum-major.
    :param scale: ``(K M, b)`` or ``(K M, 1)``, positive.
    :param y: ``(b,)`` the observations.
    :param omega: ``(K, b)`` the strata weights.
    """
    return _strata_score(loc, scale, y, omega)[0]


#: Elements of a ``(K M, b)`` array up to which :func:`_blocked_strata_score`
#: takes all the observations at once. Beyond, a step's temporaries outgrow
#: the 32 MiB that glibc's ``malloc`` reuses between calls (a 2 × 64-draw
#: mixture at 8000 observations: 37 MiB at once, 24 MiB in blocks); below,
#: the loop costs more than it saves (a 2 × 8-draw mixture at 10⁴
#: observations: 1.2 ms at once, 2.5–3.1 ms in blocks).
UNBLOCKED_SIZE = 2**19
#: Elements per ``(K M, block)`` array of a block (512 observations of 128
#: draws: a block's error functions and exponentials stay in cache).
STRATA_BLOCK_SIZE = 2**16


def _blocked_strata_score(
    loc: jax.Array, scale: jax.Array, y: jax.Array, omega: jax.Array
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """:func:`_strata_score` block of observations by block of
    observations, in a loop: each block's error functions and exponentials
    are temporaries of the block only (no loop up to
    :data:`UNBLOCKED_SIZE`). The last block ends at the last observation,
    overlapping the one before it (its observations computed again, to the
    same values), so that nothing is padded or sliced: copies of the
    ``(K M, b)`` arrays cost as much as a third of the loop."""
    b = y.shape[0]
    size = max(16, STRATA_BLOCK_SIZE // loc.shape[0] // 16 * 16)
    if b <= size or loc.shape[0] * b <= UNBLOCKED_SIZE:
        return _strata_score(loc, scale, y, omega)
    shape = jnp.broadcast_shapes(loc.shape, scale.shape)[:1] + (b,)

    def start(i: jax.Array) -> jax.Array:
        return jnp.minimum(i * size, b - size)

    def block(x: jax.Array, i: jax.Array) -> jax.Array:
        if x.shape[-1] == 1:
            return x
        return jax.lax.dynamic_slice_in_dim(x, start(i), size, -1)

    def step(i: jax.Array, out: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        value, partials = _strata_score(*(block(x, i) for x in (loc, scale, y, omega)))
        return tuple(
            jax.lax.dynamic_update_slice_in_dim(o, x, start(i), -1)
            for o, x in zip(out, (value, *partials), strict=True)
        )

    zeros = (
        jnp.zeros(y.shape, loc.dtype),
        jnp.zeros(shape, loc.dtype),
        jnp.zeros(shape, loc.dtype),
        jnp.zeros(y.shape, loc.dtype),
        jnp.zeros(omega.shape[:1] + y.shape, loc.dtype),
    )
    value, *partials = jax.lax.fori_loop(0, -(-b // size), step, zeros)
    return value, tuple(partials)


def _strata_fwd(
    loc: jax.Array, scale: jax.Array, y: jax.Array, omega: jax.Array
) -> tuple[jax.Array, tuple[Any, ...]]:
    value, partials = _blocked_strata_score(loc, scale, y, omega)
    return value, (partials, loc.shape, scale.shape)


def _strata_bwd(
    residuals: tuple[Any, ...], cotangent: jax.Array
) -> tuple[jax.Array, ...]:
    (d_loc, d_scale, d_y, d_omega), loc_shape, scale_shape = residuals
    return (
        _unbroadcast(cotangent * d_loc, loc_shape),
        _unbroadcast(cotangent * d_scale, scale_shape),
        cotangent * d_y,
        cotangent * d_omega,
    )


normal_strata_crps.defvjp(_strata_fwd, _strata_bwd)
