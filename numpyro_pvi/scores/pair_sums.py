"""Sums over pairs of particles: the all-pairs terms of the CRPS."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from numpyro_pvi._trace.reductions import particle_sum
from numpyro_pvi._trace.terms import ParticleTerms
from numpyro_pvi.scores.base import strata

__all__ = [
    "stratum_sums",
    "weighted_strata",
    "crps_fair",
    "derangement_pair_mean",
    "pair_abs_sum",
    "pair_norm_sum",
    "weighted_pair_abs_sum",
]


def crps_fair(samples: jax.Array, y: jax.Array) -> jax.Array:
    r"""Fair (unbiased) CRPS of the ensemble ``samples`` at ``y``.

    .. math::

        \widehat{\rm CRPS} = \frac{1}{M}\sum_{j} |x_j - y|
        - \frac{1}{2M(M-1)} \sum_{j \ne k} |x_j - x_k|,

    with the all-pairs term computed by ``pair_abs_sum`` (no sort for
    :math:`M \le 1024`).

    :param samples: ``(M, ...)`` draws from the forecast, ``M >= 2``.
    :param y: observations, broadcastable to ``samples.shape[1:]``.
    :return: the negatively oriented CRPS, shape ``samples.shape[1:]``.
    """
    m = samples.shape[0]
    abs_err = particle_sum(jnp.abs(samples - y)) / m
    return abs_err - pair_abs_sum(samples) / (m * (m - 1))


#: Largest ensemble whose pair sums are computed by the O(M^2) sign sums;
#: beyond it, by sorting (XLA's comparator sort is slow on CPU).
_PAIR_SIGN_MAX = 1024


def _sign_sums(x: jax.Array, v: jax.Array | None = None) -> tuple[jax.Array, ...]:
    r""":math:`C_j = \sum_k v_k\, \mathrm{sign}(x_j - x_k)` along axis 0, and
    with weights also :math:`A_j = \sum_k v_k |x_j - x_k|` (``v = 1`` when
    ``None``).

    One vectorised pass over the ``(M, ...)`` array per particle ``k``
    inside a ``fori_loop`` (no sort, no ``(M, M, ...)`` intermediate); no
    gradient flows through it.
    """
    x = jax.lax.stop_gradient(x)
    weighted = v is not None
    if weighted:
        v = jax.lax.stop_gradient(v)

    def body(k: jax.Array, acc: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        diff = x - jax.lax.dynamic_index_in_dim(x, k, 0, keepdims=True)
        if not weighted:
            return (acc[0] + jnp.sign(diff),)
        vk = jax.lax.dynamic_index_in_dim(v, k, 0, keepdims=True)
        return (acc[0] + vk * jnp.sign(diff), acc[1] + vk * jnp.abs(diff))

    init = (jnp.zeros_like(x),) * (2 if weighted else 1)
    return jax.lax.fori_loop(0, x.shape[0], body, init, unroll=8)


def pair_abs_sum(x: jax.Array) -> jax.Array:
    r""":math:`\sum_{j<k} |x_j - x_k|` along axis 0 (of length ``M``).

    Equals :math:`\sum_j x_j C_j` with :math:`C_j = \sum_k
    \mathrm{sign}(x_j - x_k) = 2\,\mathrm{rank}_j - M + 1`, piecewise
    constant in :math:`x`, so treating :math:`C` as a constant gives the
    exact gradient. For :math:`M \le` ``_PAIR_SIGN_MAX`` :math:`C` comes
    from :func:`_sign_sums` (:math:`O(M^2)` but vectorised), otherwise from
    the order statistics (:math:`O(M \log M)` sort).
    """
    m = x.shape[0]
    if m <= _PAIR_SIGN_MAX:
        (coef,) = _sign_sums(x)
        return particle_sum(x, coef)
    coef = jnp.arange(1 - m, m, 2, dtype=x.dtype)  # 2k - M - 1, k = 1..M
    return particle_sum(jnp.sort(x, axis=0), coef)


@jax.custom_jvp
def weighted_pair_abs_sum(x: jax.Array, v: jax.Array) -> jax.Array:
    r""":math:`\sum_{j<k} v_j v_k |x_j - x_k|` along axis 0.

    The value is :math:`\tfrac12 \sum_j v_j A_j`; its derivatives are
    :math:`\partial/\partial x_j = v_j C_j` and :math:`\partial/\partial v_j
    = A_j` (:func:`_sign_sums`), so both come from one pass.
    """
    _, a = _sign_sums(x, v)
    return 0.5 * particle_sum(a, v)


@weighted_pair_abs_sum.defjvp
def _weighted_pair_abs_sum_jvp(
    primals: tuple[jax.Array, jax.Array], tangents: tuple[jax.Array, jax.Array]
) -> tuple[jax.Array, jax.Array]:
    x, v = primals
    dx, dv = tangents
    c, a = _sign_sums(x, v)
    value = 0.5 * particle_sum(a, v)
    return value, particle_sum(v * c * dx + a * dv)


#: Largest event size whose pair sums take each component of the draws as an
#: ``(N, b)`` array of its own: XLA's CPU backend reduces a short trailing
#: event axis slowly, and beyond about 6 components it evaluates each
#: component's accumulation as a fusion of its own.
_COMPONENTS_MAX = 6


def _square_norm(diff: jax.Array) -> jax.Array:
    """``‖diff‖²`` of one component ``(N, b)`` or of an ``(N, b, d)`` block."""
    sq = jnp.square(diff)
    return sq if diff.ndim == 2 else jnp.sum(sq, axis=-1)


def _norm_pair_sums(
    x: jax.Array, v: jax.Array, stratum_size: int, beta: float, with_grad: bool
) -> tuple[jax.Array, ...]:
    r""":math:`R_j = \sum_k c_{jk} v_k \|x_j - x_k\|^\beta` ``(N, b)`` and,
    ``with_grad``, :math:`G_j = \sum_k c_{jk} v_k\, \beta
    \|x_j - x_k\|^{\beta - 2} (x_j - x_k)`, with :math:`c_{jk} = S/(S-1)` for
    two draws of one stratum of ``stratum_size`` :math:`S`, else 1. One pass
    over the ``(N, b, d)`` draws per particle ``k`` in a ``fori_loop`` (no
    ``(N, N, b)`` intermediate); no gradient flows through it. A pair of
    equal draws adds 0 to both. :math:`G` comes as one ``(N, b)`` array per
    component up to :data:`_COMPONENTS_MAX` components, else as one ``(N, b,
    d)`` array: ``(R, G_1, ..., G_d)`` or ``(R, G)``."""
    x, v = jax.lax.stop_gradient(x), jax.lax.stop_gradient(v)
    n, d = x.shape[0], x.shape[-1]
    parts = tuple(x[..., i] for i in range(d)) if d <= _COMPONENTS_MAX else (x,)
    stratum = jnp.arange(n) // stratum_size
    same = stratum_size / (stratum_size - 1)

    def body(k: jax.Array, acc: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        diffs = [
            t - jax.lax.dynamic_index_in_dim(t, k, 0, keepdims=True) for t in parts
        ]
        sq = sum(_square_norm(t) for t in diffs)
        zero = sq == 0
        safe = jnp.where(zero, 1.0, sq)
        weight = jnp.where(stratum == stratum[k], same, 1.0)[:, None]
        weight = weight * jax.lax.dynamic_index_in_dim(v, k, 0, keepdims=True)
        if beta == 1.0:  # the slope 1 / ‖d‖ and ‖d‖ = ‖d‖² / ‖d‖
            step = weight * jnp.where(zero, 0.0, jax.lax.rsqrt(safe))
            out = (acc[0] + step * sq,)
        else:
            norm = jnp.where(zero, 0.0, safe ** (0.5 * beta))
            step = weight * (beta * norm / safe)  # β ‖d‖^(β-2)
            out = (acc[0] + weight * norm,)
        if not with_grad:
            return out
        return out + tuple(
            a + (step if t.ndim == 2 else step[..., None]) * t
            for a, t in zip(acc[1:], diffs, strict=True)
        )

    shape = jnp.broadcast_shapes(v.shape, x.shape[:-1])
    init: tuple[jax.Array, ...] = (jnp.zeros(shape, x.dtype),)
    if with_grad:
        init += tuple(jnp.zeros(shape + t.shape[2:], x.dtype) for t in parts)
    return jax.lax.fori_loop(0, n, body, init, unroll=2)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def pair_norm_sum(
    x: jax.Array, v: jax.Array, stratum_size: int, beta: float
) -> jax.Array:
    r""":math:`\tfrac12 \sum_{j \ne k} c_{jk} v_j v_k \|x_j - x_k\|^\beta`
    over the leading axis of the ``(N, b, d)`` draws, ``(b,)``.

    :math:`c_{jk} = S/(S-1)` for two draws of one stratum (``N = K S``
    draws, ``S`` = ``stratum_size`` consecutive per stratum), else 1: with
    weights :math:`v = 1/S` and one stratum this is the fair pair term
    :math:`\frac{1}{2S(S-1)} \sum_{j \ne k} \|x_j - x_k\|^\beta`. Its
    derivatives are :math:`v_j G_j` in :math:`x_j` and :math:`R_j` in
    :math:`v_j` (:func:`_norm_pair_sums`): value and gradient come from one
    pass over the pairs, :math:`O(N^2 b\, d)` time and :math:`O(N b\, d)`
    memory.

    :param x: ``(N, b, d)`` draws.
    :param v: ``(N, b)`` or ``(N, 1)`` weights.
    :param stratum_size: ``S >= 2``, a divisor of ``N``.
    :param beta: the exponent, ``0 < beta < 2``.
    """
    (r,) = _norm_pair_sums(x, v, stratum_size, beta, with_grad=False)
    return 0.5 * particle_sum(r * v)


@pair_norm_sum.defjvp
def _pair_norm_sum_jvp(
    stratum_size: int,
    beta: float,
    primals: tuple[jax.Array, jax.Array],
    tangents: tuple[jax.Array, jax.Array],
) -> tuple[jax.Array, jax.Array]:
    x, v = primals
    dx, dv = tangents
    r, *g = _norm_pair_sums(x, v, stratum_size, beta, with_grad=True)
    if g[0].ndim == dx.ndim:  # one array (N, b, d)
        g_dx = jnp.sum(g[0] * dx, axis=-1)
    else:  # one (N, b) array per component
        g_dx = g[0] * dx[..., 0]
        for i, g_i in enumerate(g[1:], start=1):
            g_dx = g_dx + g_i * dx[..., i]
    tangent = particle_sum(v * g_dx + r * dv)
    return 0.5 * particle_sum(r * v), tangent


def derangement_pair_mean(
    x: Any, pair: Callable[[Any, Any], jax.Array], omega: jax.Array | None = None
) -> jax.Array:
    r"""Unbiased :math:`\mathbb{E}\, d(X, X')` from each draw paired with the next,
    :math:`O(M)`: :math:`\frac{1}{M} \sum_j d(x_j, x_{j+1 \bmod M})` for i.i.d.
    draws; for ``K`` strata,
    :math:`\sum_{k,l} \omega_k \omega_l \frac{1}{M} \sum_m d(x_{k,m},
    x_{l,m+1 \bmod M})` (:math:`O(K^2 M)`).

    :param x: the draws, an array or a tuple of arrays with the particle axis
        first: ``(M, b, ...)`` (``(K M, b, ...)`` with strata).
    :param pair: ``d``, elementwise on two such draws, returning ``(M, b)``.
    :param omega: ``(K, b)`` strata weights, or ``None`` for i.i.d. draws.
    :return: ``(b,)``.
    """
    tree = jax.tree_util
    if omega is None:
        shifted = tree.tree_map(lambda t: jnp.roll(t, 1, axis=0), x)
        d = pair(x, shifted)
        return particle_sum(d) / d.shape[0]
    k = omega.shape[0]
    m = tree.tree_leaves(x)[0].shape[0] // k
    # static slices, pair by pair: their gradients are sums of slices, where
    # broadcasts over the strata would transpose to reductions over a middle
    # axis (slow on XLA's CPU backend)
    strata_draws = [
        tree.tree_map(lambda t, a=a: t[a * m : (a + 1) * m], x) for a in range(k)
    ]
    shifted = [tree.tree_map(lambda t: jnp.roll(t, 1, axis=0), s) for s in strata_draws]
    total = jnp.zeros(())
    for a in range(k):  # K is a small Python integer
        for c in range(k):
            d = particle_sum(pair(strata_draws[a], shifted[c])) / m  # (b,)
            total = total + omega[a] * omega[c] * d
    return total


def stratum_sums(x: jax.Array, num_strata: int) -> jax.Array:
    """``(S, ...)`` the sums of ``x`` ``(S M, ...)`` over each stratum's
    ``M`` draws: one reduction over the middle axis of ``(S, M, ...)``
    (not slices per stratum, whose gradients are zero-padded copies)."""
    if num_strata == 1:
        return particle_sum(x)[None]
    return jnp.sum(x.reshape((num_strata, -1) + x.shape[1:]), axis=1)


def weighted_strata(
    strata_sums: tuple[jax.Array, jax.Array], v: jax.Array, m: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    r"""The weighted totals ``(K, b)`` :math:`\sum_a v_a f_a(j)`, their pair
    term ``(b,)`` :math:`\sum_j [(\sum_a v_a f_a(j))^2 - \sum_a v_a^2
    f_a(j)^2]` and the strata's own pair terms ``(b,)``, from the ``(S, K,
    b)`` per-stratum totals and sums of squares of :func:`stratum_sums` (each
    stratum's ``M`` draws share one weight ``v``): the pair sums of the
    quadratic score and of the CRPS from the pmf under strata."""
    t, o = strata_sums
    w = v.reshape((t.shape[0], m) + v.shape[1:])[:, 0, None]  # (S, 1, b)
    totals, own = jnp.sum(w * t, axis=0), jnp.sum(jnp.square(w) * o, axis=0)
    within = jnp.sum(jnp.square(w[:, 0]) * jnp.sum(jnp.square(t) - o, axis=1), axis=0)
    return totals, jnp.sum(jnp.square(totals) - own, axis=0), within


def next_pair_score(
    terms: ParticleTerms,
    obs_term: jax.Array,
    draws: Any,
    pair: Callable[[Any, Any], jax.Array],
) -> jax.Array:
    """``-E d(Y, y) + E d(Y, Y') / 2`` from ``(M, b)`` terms ``d(Y_j, y_i)``
    and each draw paired with the next (:func:`derangement_pair_mean`),
    under strata weighted by them: the derangement estimators of the CRPS
    and the energy score, from simulations or in closed form."""
    if terms.num_strata == 1:
        m = obs_term.shape[0]
        return -particle_sum(obs_term) / m + 0.5 * derangement_pair_mean(draws, pair)
    v, k, m = strata(terms)
    omega = v.reshape((k, m) + v.shape[1:])[:, 0] * m  # (K, b)
    obs = particle_sum(obs_term, v)
    return -obs + 0.5 * derangement_pair_mean(draws, pair, omega)
