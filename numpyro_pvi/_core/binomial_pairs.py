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

The pairs are evaluated block by block of particles inside a loop: XLA's
CPU backend otherwise fuses the computation of the logits (e.g. a guide's
draw of an intercept) into every pair's loop and repeats it for each
observation; a loop's operands are materialised once (a loop of one
iteration is removed by XLA, so there are always at least two blocks).
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp

from numpyro_pvi._core.pmf import integer_power

__all__ = ["binomial_next_overlaps"]

#: Particles per block of :func:`binomial_next_overlaps` (at most).
PAIR_BLOCK = 8

_Particles = tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]


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
    their partial derivatives in the two logits."""
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
    return first_moment - np_a * overlap, first_moment - np_b * overlap


def _num_blocks(m: int) -> int:
    """Blocks of at most :data:`PAIR_BLOCK` particles, at least two."""
    return m // math.gcd(m, min(PAIR_BLOCK, max(m // 2, 1)))


def _over_blocks(fn, particles: _Particles, m: int) -> tuple[jax.Array, ...]:
    """``fn(first, second)`` on blocks of rows ``m`` and ``m + 1`` of the
    ``(M + 1, b)`` particle arrays (the last row is the first again),
    stacked back to ``(M, b)``."""
    blocks = _num_blocks(m)
    size = m // blocks

    def block(i: jax.Array) -> tuple[jax.Array, ...]:
        # two slices: slicing one block of size + 1 rows twice is much slower
        start = i * size
        first, second = (
            tuple(jax.lax.dynamic_slice_in_dim(x, start + j, size) for x in particles)
            for j in (0, 1)
        )
        return fn(first, second)

    out = jax.lax.map(block, jnp.arange(blocks))
    return tuple(x.reshape((m,) + x.shape[2:]) for x in out)


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def binomial_next_overlaps(logits: jax.Array, count: jax.Array, size: int) -> jax.Array:
    r"""``(M, b)`` the overlaps :math:`\sum_k f_m(k) f_{m+1}(k)` of each
    particle's Binomial pmf with the next particle's (cyclically, :math:`m +
    1 \bmod M`), in closed form (module docstring).

    :param logits: ``(M, b)`` the particles' logits :math:`\ell_m`
        (:math:`M \ge 2`).
    :param count: ``(b,)`` the total counts :math:`n` (integer-valued
        floats below ``size``; data: no gradient).
    :param size: the support's size (a Python integer).
    """
    return _forward(logits, count, size)[0]


def _forward(
    logits: jax.Array, count: jax.Array, size: int
) -> tuple[jax.Array, tuple[_Particles, jax.Array]]:
    particles = _particles(jnp.concatenate([logits, logits[:1]]), count, size)
    squares = _squared_binomials(count, size)
    (overlap,) = _over_blocks(
        lambda a, b: _pairs(a, b, count, squares, gradient=False),
        particles,
        logits.shape[0],
    )
    return overlap, (particles, count)


def _backward(
    size: int, residuals: tuple[_Particles, jax.Array], cotangent: jax.Array
) -> tuple[jax.Array, None]:
    particles, count = residuals
    squares = _squared_binomials(count, size)
    d_first, d_second = _over_blocks(
        lambda a, b: _pairs(a, b, count, squares, gradient=True),
        particles,
        cotangent.shape[0],
    )
    # row m is the first of pair m and the second of pair m - 1
    gradient = cotangent * d_first + jnp.roll(cotangent * d_second, 1, axis=0)
    return gradient, None


binomial_next_overlaps.defvjp(_forward, _backward)
