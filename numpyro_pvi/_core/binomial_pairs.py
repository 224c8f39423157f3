r"""The pmf overlap of neighbouring particles' Binomial likelihoods in closed
form: the pair term of the quadratic score's derangement estimator.

For :math:`f_a, f_b` the pmfs of :math:`\mathrm{Binomial}(n, \sigma(\ell_a))`
and :math:`\mathrm{Binomial}(n, \sigma(\ell_b))`,

.. math::

    O_{ab} = \sum_{k=0}^n f_a(k) f_b(k)
    = (q_a q_b)^n\, G(e^{\ell_a + \ell_b}), \qquad
    G(z) = \sum_{k=0}^n \binom{n}{k}^2 z^k,

and since :math:`G(z) = z^n G(1/z)`, with :math:`y = e^{-|\ell_a + \ell_b|}
\le 1`, :math:`O_{ab} = A_{ab}\, G(y)` where the anchor :math:`A_{ab}` is
:math:`(q_a q_b)^n` when :math:`\ell_a + \ell_b \le 0` and :math:`(p_a
p_b)^n` otherwise. With :math:`u = e^{-|\ell|}`, :math:`a = (1 + u)^{-n} =
\max(p, q)^n` and :math:`c = a u^n = \min(p, q)^n` per particle, :math:`y =
u_a u_b` and :math:`A = a_a a_b` when the two logits have the same sign;
otherwise :math:`y = \min(u_a, u_b) / \max(u_a, u_b)` and :math:`A` is
:math:`a_a c_b` or :math:`c_a a_b` (the particle with the smaller
:math:`u` keeps its likelier end). One exponential per particle, no
transcendental function per pair: :math:`a` and :math:`c` are integer powers
(binary powering) and :math:`G` is a polynomial of degree :math:`n` (Horner's
rule, all terms positive). The gradient is
:math:`\partial O_{ab} / \partial \ell_a = O^{(1)}_{ab} - n p_a O_{ab}` with
:math:`O^{(1)}_{ab} = \sum_k k f_a(k) f_b(k)`, which is :math:`A\, y\, G'(y)`
when :math:`\ell_a + \ell_b \le 0` and :math:`n O_{ab} - A\, y\, G'(y)`
otherwise (exact also where :math:`\ell_a + \ell_b = 0`).

The polynomial's coefficients overflow single precision beyond about 63
trials, so it takes at most :data:`POLYNOMIAL_SUPPORT` support values; longer
supports take the three-term recurrence of
:mod:`~numpyro_pvi._core.binomial_recurrence` (any number of trials, no
overflow). Either way the partial derivatives come out of the same pass as
the overlaps (the polynomial's slope, the recurrence's second-to-last
term), so the forward pass of the custom derivative computes them and the
backward pass only multiplies by the cotangent.

The pairs are evaluated block by block of particles inside a loop: XLA's
CPU backend otherwise fuses the computation of the logits (e.g. a guide's
draw of an intercept) into every pair's loop and repeats it for each
observation; a loop's operands are materialised once (a loop of one
iteration is removed by XLA, so there are always at least two blocks).

Under stratified sampling (mixture guides) :func:`binomial_next_overlap_sum`
pairs draw :math:`m` of every stratum with draw :math:`m + 1` of every
stratum and returns the weighted sum over the pairs, one pair of strata at
a time inside the same blocks; its per-particle quantities are computed in
each block from the logits, so that the step's temporaries stay small
(above 32 MiB glibc maps them afresh at every call, ``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp

from numpyro_pvi._core.binomial_recurrence import (
    recurrence_pairs,
    recurrence_particles,
)
from numpyro_pvi._core.pmf import integer_power

__all__ = [
    "POLYNOMIAL_SUPPORT",
    "binomial_next_overlap_sum",
    "binomial_next_overlaps",
]

#: Particles per block of :func:`binomial_next_overlaps` (at most).
PAIR_BLOCK = 8

#: The largest support (``n + 1`` values) the polynomial takes (longer
#: supports take the recurrence of
#: :mod:`~numpyro_pvi._core.binomial_recurrence`): its coefficients
#: :math:`\binom{n}{k}^2`, value :math:`G(1) = \binom{2n}{n}` and slope
#: :math:`n G(1) / 2` stay far below single precision's largest number
#: (6.4e27 and 1.5e29 for :math:`n = 48`; the slope overflows near
#: :math:`n = 63`).
POLYNOMIAL_SUPPORT = 49

_Particles = tuple[jax.Array, ...]
_PairFn = Callable[[_Particles, _Particles, bool], tuple[jax.Array, ...]]


def _squared_binomials(count: jax.Array, size: int) -> list[jax.Array]:
    r"""The ``size`` arrays :math:`\binom{n}{k}^2` (0 for :math:`k > n`)."""
    coefficients = [jnp.ones_like(count)]
    for k in range(size - 1):
        coefficients.append(coefficients[-1] * jnp.maximum(count - k, 0.0) / (k + 1))
    return [jnp.square(c) for c in coefficients]


def _particles(logits: jax.Array, count: jax.Array, size: int) -> _Particles:
    r""":math:`u`, whether :math:`\ell \le 0`, :math:`a`, :math:`c` and
    :math:`n p` per particle."""
    u = jnp.exp(-jnp.abs(logits))
    r = 1.0 / (1.0 + u)
    low = logits <= 0
    a = integer_power(r, count, size)
    c = integer_power(u * r, count, size)
    return u, low, a, c, count * jnp.where(low, u, 1.0) * r


def _horner(coefficients: list[jax.Array], y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The polynomial with ``coefficients`` (lowest degree first) at ``y``
    and its derivative, in one pass."""
    value, slope = coefficients[-1] * jnp.ones_like(y), jnp.zeros_like(y)
    for c in coefficients[-2::-1]:
        slope = slope * y + value
        value = value * y + c
    return value, slope


def _pairs(
    first: _Particles,
    second: _Particles,
    count: jax.Array,
    squares: list[jax.Array],
    gradient: bool,
) -> tuple[jax.Array, ...]:
    r"""The overlaps of ``first[m]`` and ``second[m]``, and with ``gradient``
    their partial derivatives in the two logits (after the overlaps)."""
    u_a, low_a, a_a, c_a, np_a = first
    u_b, low_b, a_b, c_b, np_b = second
    same = low_a == low_b
    high, small = jnp.maximum(u_a, u_b), jnp.minimum(u_a, u_b)
    y = jnp.where(same, u_a * u_b, small / jnp.where(high > 0, high, 1.0))
    a_first = u_a <= u_b
    anchor = jnp.where(same, a_a * a_b, jnp.where(a_first, a_a * c_b, c_a * a_b))
    g, slope = _horner(squares, y)
    overlap = anchor * g
    if not gradient:
        return (overlap,)
    t = anchor * y * slope
    sum_negative = jnp.where(same, low_a, low_a == a_first)  # l_a + l_b <= 0
    first_moment = jnp.where(sum_negative, t, count * overlap - t)
    return overlap, first_moment - np_a * overlap, first_moment - np_b * overlap


def _kernel(
    count: jax.Array, size: int
) -> tuple[Callable[[jax.Array], _Particles], _PairFn]:
    """The per-particle quantities from the logits, and the pairs'
    overlaps (with ``gradient``, their partial derivatives): the polynomial
    for at most :data:`POLYNOMIAL_SUPPORT` support values, the recurrence
    of :mod:`~numpyro_pvi._core.binomial_recurrence` beyond."""
    if size <= POLYNOMIAL_SUPPORT:
        squares = _squared_binomials(count, size)
        return (
            lambda logits: _particles(logits, count, size),
            lambda a, b, gradient: _pairs(a, b, count, squares, gradient),
        )
    constant = jnp.all(count == size - 1)
    return recurrence_particles, lambda a, b, gradient: recurrence_pairs(
        a, b, count, size, constant, gradient
    )


def _num_blocks(m: int) -> int:
    """Blocks of at most :data:`PAIR_BLOCK` particles, at least two."""
    return m // math.gcd(m, min(PAIR_BLOCK, max(m // 2, 1)))


def _over_blocks(fn, arrays: tuple[jax.Array, ...], m: int) -> tuple[jax.Array, ...]:
    """``fn(first, second)`` on blocks of rows ``m`` and ``m + 1`` of the
    ``(M + 1, ...)`` arrays (the last row is the first again), its outputs
    stacked ``(blocks, ...)``."""
    blocks = _num_blocks(m)
    size = m // blocks

    def block(i: jax.Array) -> tuple[jax.Array, ...]:
        # two slices: slicing one block of size + 1 rows twice is much slower
        start = i * size
        first, second = (
            tuple(jax.lax.dynamic_slice_in_dim(x, start + j, size) for x in arrays)
            for j in (0, 1)
        )
        return fn(first, second)

    return jax.lax.map(block, jnp.arange(blocks))


def _rows(x: jax.Array) -> jax.Array:
    """``(blocks, B, ...)`` block outputs as ``(blocks B, ...)`` rows."""
    return x.reshape((-1,) + x.shape[2:])


def _cyclic(x: jax.Array) -> jax.Array:
    """``(M + 1, ...)``: the first row again after the last."""
    return jnp.concatenate([x, x[:1]])


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def binomial_next_overlaps(logits: jax.Array, count: jax.Array, size: int) -> jax.Array:
    r"""``(M, b)`` the overlaps :math:`\sum_k f_m(k) f_{m+1}(k)` of each
    particle's Binomial pmf with the next particle's (cyclically, :math:`m +
    1 \bmod M`), in closed form (module docstring), for any number of
    trials.

    :param logits: ``(M, b)`` the particles' logits :math:`\ell_m`
        (:math:`M \ge 2`).
    :param count: ``(b,)`` the total counts :math:`n` (integer-valued
        floats below ``size``; data: no gradient).
    :param size: the support's size (a Python integer; beyond
        :data:`POLYNOMIAL_SUPPORT` values the recurrence).
    """
    return _overlaps(logits, count, size, gradient=False)[0]


def _overlaps(
    logits: jax.Array, count: jax.Array, size: int, gradient: bool
) -> tuple[jax.Array, ...]:
    """The overlaps ``(M, b)``, with ``gradient`` also their partial
    derivatives in the first and in the second logits of each pair."""
    particles_of, pairs = _kernel(count, size)
    return tuple(
        _rows(x)
        for x in _over_blocks(
            lambda a, b: pairs(a, b, gradient),
            particles_of(_cyclic(logits)),
            logits.shape[0],
        )
    )


def _forward(
    logits: jax.Array, count: jax.Array, size: int
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    # the partial derivatives come with the overlaps, in the same pass (the
    # polynomial's slope, the recurrence's second-to-last step)
    overlap, d_first, d_second = _overlaps(logits, count, size, gradient=True)
    return overlap, (d_first, d_second)


def _backward(
    size: int, residuals: tuple[jax.Array, jax.Array], cotangent: jax.Array
) -> tuple[jax.Array, None]:
    d_first, d_second = residuals
    # row m is the first of pair m and the second of pair m - 1
    gradient = cotangent * d_first + jnp.roll(cotangent * d_second, 1, axis=0)
    return gradient, None


binomial_next_overlaps.defvjp(_forward, _backward)


@partial(jax.custom_vjp, nondiff_argnums=(3,))
def binomial_next_overlap_sum(
    logits: jax.Array, weights: jax.Array, count: jax.Array, size: int
) -> jax.Array:
    r"""``(b,)`` :math:`\sum_m \sum_{s,t} w_{ms} w_{m+1,t} \langle f_{ms},
    f_{m+1,t} \rangle`: the overlaps of draw :math:`m` of each stratum
    :math:`s` with draw :math:`m + 1` (cyclically) of each stratum
    :math:`t`, weighted, in closed form, summed block by block (no ``(M, K,
    K, b)`` array of pairs, whose value and gradient would be the step's
    largest temporaries).

    :param logits: ``(M, K, b)`` the logits of draw :math:`m` of stratum
        :math:`s` at ``[m, s]`` (:math:`M \ge 2`).
    :param weights: ``(M, K, b)`` their weights :math:`w_{ms}`.
    :param count: ``(b,)`` as :func:`binomial_next_overlaps`.
    :param size: as :func:`binomial_next_overlaps`.
    """
    (total,) = _strata_blocks(logits, weights, count, size, gradient=False)
    return jnp.sum(total, axis=0)


def _weighted_pairs(
    first: list[tuple[_Particles, jax.Array]],
    second: list[tuple[_Particles, jax.Array]],
    pairs: _PairFn,
    gradient: bool,
) -> tuple[jax.Array, ...]:
    """The weighted pairs of a block's rows ``(B, b)`` summed over the
    strata pairs (each stratum's particles and weights; one pair of strata
    at a time, elementwise); with ``gradient``, after it the sum's partial
    derivatives ``(B, b)`` in each stratum's first rows' logits, second
    rows' logits, first rows' weights and second rows' weights."""
    k = len(first)
    value = jnp.zeros_like(first[0][1])
    grads: list[list[list[jax.Array]]] = [[[] for _ in range(k)] for _ in range(4)]
    for s, t in itertools.product(range(k), repeat=2):
        (p_s, w_s), (p_t, w_t) = first[s], second[t]
        overlap, *derivatives = pairs(p_s, p_t, gradient)
        value = value + w_s * w_t * overlap
        if gradient:
            d_s, d_t = derivatives
            grads[0][s].append(w_s * w_t * d_s)
            grads[1][t].append(w_s * w_t * d_t)
            grads[2][s].append(w_t * overlap)
            grads[3][t].append(w_s * overlap)
    if not gradient:
        return (value,)
    return (value, *(functools.reduce(jnp.add, g) for x in grads for g in x))


def _strata_blocks(
    logits: jax.Array, weights: jax.Array, count: jax.Array, size: int, gradient: bool
) -> tuple[jax.Array, ...]:
    """:func:`_weighted_pairs` over the blocks, its outputs as rows ``(M,
    b)``. The per-particle quantities are computed in each block from the
    logits: five ``(M + 1, b)`` arrays per stratum would push the step's
    temporaries past the allocator's reuse threshold."""
    arrays = tuple(
        _cyclic(x[:, s]) for s in range(logits.shape[1]) for x in (logits, weights)
    )
    particles_of, pairs = _kernel(count, size)

    def strata(x: tuple[jax.Array, ...]) -> list[tuple[_Particles, jax.Array]]:
        return [(particles_of(x[i]), x[i + 1]) for i in range(0, len(x), 2)]

    out = _over_blocks(
        lambda a, b: _weighted_pairs(strata(a), strata(b), pairs, gradient),
        arrays,
        logits.shape[0],
    )
    return tuple(_rows(x) for x in out)


def _sum_forward(
    logits: jax.Array, weights: jax.Array, count: jax.Array, size: int
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    # the sum is per observation, so its gradient is the cotangent times its
    # partial derivatives, computed here in the same pass as the pairs
    total, *grads = _strata_blocks(logits, weights, count, size, gradient=True)
    k = logits.shape[1]
    first, second, weight_first, weight_second = (
        jnp.stack(grads[i * k : (i + 1) * k], axis=1) for i in range(4)
    )
    # row m is the first of the pairs of m and the second of those of m - 1
    return jnp.sum(total, axis=0), (
        first + jnp.roll(second, 1, axis=0),
        weight_first + jnp.roll(weight_second, 1, axis=0),
    )


def _sum_backward(
    size: int, residuals: tuple[jax.Array, jax.Array], cotangent: jax.Array
) -> tuple[jax.Array, jax.Array, None]:
    d_logits, d_weights = residuals
    return cotangent * d_logits, cotangent * d_weights, None


binomial_next_overlap_sum.defvjp(_sum_forward, _sum_backward)
