"""Sums over pairs of particles: the all-pairs terms of the CRPS."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from numpyro_pvi.particles import particle_sum

__all__ = [
    "crps_fair",
    "derangement_pair_mean",
    "pair_abs_sum",
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
#: beyond it, by sorting. On CPU, XLA's comparator sort costs about as much
#: as 1024 vectorised sign sums per element (``benchmarks/RESULTS.md``).
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


def derangement_pair_mean(
    x: Any,
    pair: Callable[[Any, Any], jax.Array],
    omega: jax.Array | None = None,
) -> jax.Array:
    r"""Unbiased :math:`\mathbb{E}\, d(X, X')` from each draw paired with
    the next one, :math:`O(M)`.

    For ``M`` i.i.d. draws (``omega`` ``None``)

    .. math::

        \frac{1}{M} \sum_{j=1}^M d(x_j, x_{j+1 \bmod M}),

    each term a pair of independent draws. The cyclic shift is one
    derangement; a random one has the same distribution for exchangeable
    draws when it is a single ``M``-cycle, and more variance otherwise (fewer
    distinct pairs), so none is drawn. For ``K`` strata of ``M`` draws each
    (leading axis ``K M``, stratum weights ``omega`` ``(K, b)``) the
    predictive is the mixture :math:`\sum_k \omega_k F_k` and

    .. math::

        \sum_{k,l} \omega_k \omega_l \frac{1}{M} \sum_{m=1}^M
        d(x_{k,m}, x_{l,m+1 \bmod M}),

    unbiased since draw :math:`m` of stratum :math:`k` is independent of draw
    :math:`m+1` of every stratum (:math:`O(K^2 M)`).

    :param x: the draws, an array or a tuple of arrays with the particle axis
        first: ``(M, b, ...)`` (``(K M, b, ...)`` with strata).
    :param pair: ``d``, elementwise on two such draws (aligned particle by
        particle), returning ``(M, b)``.
    :param omega: ``(K, b)`` strata weights (each row sums to one over ``K``),
        or ``None`` for i.i.d. draws.
    :return: ``(b,)``.
    """
    tree = jax.tree_util
    if omega is None:
        shifted = tree.tree_map(lambda t: jnp.roll(t, 1, axis=0), x)
        d = pair(x, shifted)
        return particle_sum(d) / d.shape[0]
    k = omega.shape[0]
    xs = tree.tree_map(lambda t: t.reshape((k, -1) + t.shape[1:]), x)  # (K, M, ..)
    shifted = tree.tree_map(lambda t: jnp.roll(t, 1, axis=1), xs)
    total = jnp.zeros(())
    for a in range(k):  # K is a small Python integer
        x_a = tree.tree_map(lambda t, a=a: t[a], xs)
        d = jax.vmap(lambda xl, xa=x_a: particle_sum(pair(xa, xl)))(shifted)
        m = tree.tree_leaves(xs)[0].shape[1]
        total = total + omega[a] * jnp.sum(omega * d, axis=0) / m  # (b,)
    return total
