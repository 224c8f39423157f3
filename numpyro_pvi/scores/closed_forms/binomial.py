r"""The pmf overlap of neighbouring particles' Binomial likelihoods in closed form.

For :math:`f_a, f_b` the pmfs of :math:`\mathrm{Binomial}(n, \sigma(\ell_a))`
and :math:`\mathrm{Binomial}(n, \sigma(\ell_b))`,

.. math::

    O_{ab} = \sum_{k=0}^n f_a(k) f_b(k) = A_{ab}\, G(y), \qquad
    G(y) = \sum_{k=0}^n \binom{n}{k}^2 y^k,

with :math:`y = e^{-|\ell_a + \ell_b|} \le 1` and the anchor :math:`A_{ab}`
the likelier end's :math:`(q_a q_b)^n` or :math:`(p_a p_b)^n`: one
exponential per particle, a polynomial per pair. The polynomial overflows
single precision beyond :data:`POLYNOMIAL_SUPPORT` support values; longer
supports take the recurrence of
:mod:`~numpyro_pvi.scores.closed_forms.binomial_recurrence`. The pairs run in
blocks of particles inside a loop, so XLA materialises the logits once.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from numpyro.distributions import BinomialLogits, BinomialProbs

from numpyro_pvi._trace.site_laws import innermost
from numpyro_pvi._trace.site_values import (
    component_mask,
    component_rows,
    site_components,
)
from numpyro_pvi._trace.terms import ParticleTerms
from numpyro_pvi.scores._pmf import UNROLLED_SUPPORT, integer_power
from numpyro_pvi.scores._support import count_size
from numpyro_pvi.scores.closed_forms.binomial_recurrence import (
    recurrence_pairs,
    recurrence_particles,
)

__all__ = ["POLYNOMIAL_SUPPORT", "binomial_next_overlaps", "binomial_strata_overlaps"]

#: Particles per block of :func:`binomial_next_overlaps` (at most).
PAIR_BLOCK = 8

#: The largest support (``n + 1`` values) the polynomial takes (longer
#: supports take the recurrence of
#: :mod:`~numpyro_pvi.scores.closed_forms.binomial_recurrence`): its coefficients
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


def _moments(
    first: _Particles,
    second: _Particles,
    count: jax.Array,
    squares: list[jax.Array],
    gradient: bool,
) -> tuple[jax.Array, ...]:
    r"""The overlaps :math:`O` of ``first[m]`` and ``second[m]``, and with
    ``gradient`` their first moments :math:`O^{(1)} = \sum_k k f_a(k)
    f_b(k)` (:func:`_pairs` turns them into partial derivatives)."""
    u_a, low_a, a_a, c_a, _ = first
    u_b, low_b, a_b, c_b, _ = second
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
    return overlap, jnp.where(sum_negative, t, count * overlap - t)


def _derivatives(
    overlap: jax.Array, moment: jax.Array, np_a: jax.Array, np_b: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    r"""The overlaps and their partial derivatives in the two logits,
    :math:`O^{(1)} - n p\, O`, from :func:`_moments`."""
    return overlap, moment - np_a * overlap, moment - np_b * overlap


def _pairs(
    first: _Particles,
    second: _Particles,
    count: jax.Array,
    squares: list[jax.Array],
    gradient: bool,
) -> tuple[jax.Array, ...]:
    r"""The overlaps of ``first[m]`` and ``second[m]``, and with ``gradient``
    their partial derivatives in the two logits (after the overlaps)."""
    out = _moments(first, second, count, squares, gradient)
    if not gradient:
        return out
    overlap, moment = out
    return _derivatives(overlap, moment, first[-1], second[-1])


def _kernel(
    count: jax.Array, size: int
) -> tuple[Callable[[jax.Array], _Particles], _PairFn]:
    """The per-particle quantities from the logits, and the pairs'
    overlaps (with ``gradient``, their partial derivatives): the polynomial
    for at most :data:`POLYNOMIAL_SUPPORT` support values, the recurrence
    of :mod:`~numpyro_pvi.scores.closed_forms.binomial_recurrence` beyond."""
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
    derivatives in the first and in the second logits of each pair. The
    polynomial's blocks beyond :data:`~numpyro_pvi.scores._pmf.UNROLLED_SUPPORT`
    values return the overlaps and first moments only, the derivatives
    formed after the loop: each of a block's outputs is its own fusion,
    which evaluates the polynomial again (two outputs instead of three; for
    shorter polynomials the pass after the loop costs more than that
    saves)."""
    if gradient and UNROLLED_SUPPORT < size <= POLYNOMIAL_SUPPORT:
        squares = _squared_binomials(count, size)
        particles = _particles(_cyclic(logits), count, size)
        overlap, moment = (
            _rows(x)
            for x in _over_blocks(
                lambda a, b: _moments(a, b, count, squares, True),
                particles,
                logits.shape[0],
            )
        )
        return _derivatives(overlap, moment, particles[-1][:-1], particles[-1][1:])
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
def binomial_strata_overlaps(
    logits: jax.Array, omega: jax.Array, count: jax.Array, size: int
) -> jax.Array:
    r"""``(b,)`` :math:`\sum_{s,t} \omega_s \omega_t \frac1M \sum_m \langle
    f_{sm}, f_{t,m+1} \rangle`: draw :math:`m` of each stratum :math:`s`
    paired with draw :math:`m + 1` (cyclically) of each stratum :math:`t`,
    the strata weighted, in closed form, block by block of draws (no
    ``(K, K, M, b)`` array of pairs, whose value and gradient would be the
    step's largest temporaries). The partial derivatives come out of the
    same pass: the only ``(K, M, b)`` array the step keeps is the
    derivative in the logits, each block's rows written once into it.

    :param logits: ``(K, M, b)`` the logits of draw :math:`m` of stratum
        :math:`s` at ``[s, m]`` (:math:`M \ge 2`).
    :param omega: ``(K, b)`` the strata's weights :math:`\omega_s` (the same
        for each of a stratum's draws).
    :param count: ``(b,)`` as :func:`binomial_next_overlaps`.
    :param size: as :func:`binomial_next_overlaps`.
    """
    sums = _strata_pass(logits, count, size, None)[0]
    return _weighted(sums, omega, logits.shape[1])


def _weighted(sums: jax.Array, omega: jax.Array, m: int) -> jax.Array:
    """``(b,)`` the ``(K, K, b)`` strata pairs' sums weighted ``ω_s ω_t / M``."""
    return jnp.einsum("stb,sb,tb->b", sums, omega, omega) / m


def _block_pairs(
    first: list[_Particles],
    second: list[_Particles],
    pairs: _PairFn,
    omega: jax.Array | None,
) -> tuple[list[jax.Array], list[Any], list[Any]]:
    """A block's pairs ``j`` (rows ``start - 1 + j`` and ``start + j``) of
    each pair of strata: the overlaps of the block's own pairs (all but the
    first), and with ``omega`` each stratum's rows' parts of the derivative
    as the first of their pair and as the second of the previous pair
    (``(rows, b)`` each, unscaled)."""
    k = len(first)
    overlaps: list[jax.Array] = []
    d_first: list[Any] = [0.0] * k
    d_second: list[Any] = [0.0] * k
    for s, t in itertools.product(range(k), repeat=2):
        out = pairs(first[s], second[t], omega is not None)
        overlaps.append(out[0][1:])
        if omega is not None:
            d_first[s] = d_first[s] + omega[t] * out[1][1:]
            d_second[t] = d_second[t] + omega[s] * out[2][:-1]
    return overlaps, d_first, d_second


def _write_rows(
    d_logits: jax.Array, parts: list[Any], scale: jax.Array, start: jax.Array, add: bool
) -> jax.Array:
    """Each stratum's ``(rows, b)`` part times ``scale[s]`` written into its
    rows from ``start`` of ``d_logits`` (``add``: added to them)."""
    for s, part in enumerate(parts):
        update = (part * scale[s])[None]
        if add:
            update = update + jax.lax.dynamic_slice(
                d_logits, (s, start, 0), update.shape
            )
        d_logits = jax.lax.dynamic_update_slice(d_logits, update, (s, start, 0))
    return d_logits


def _strata_pass(
    logits: jax.Array, count: jax.Array, size: int, omega: jax.Array | None
) -> tuple[jax.Array, jax.Array | None]:
    r"""``(K, K, b)`` the sums :math:`\sum_m \langle f_{sm}, f_{t,m+1}
    \rangle`; with ``omega``, also ``(K, M, b)`` the derivative of
    :func:`binomial_strata_overlaps` in the logits.

    A loop over blocks of draws. A block of rows ``r`` evaluates the pairs
    of rows ``r - 1`` and ``r`` with their successors (the per-particle
    quantities of rows ``r - 1`` to ``r + 1`` once): each row's derivative
    is then the block's own, as the first of its pair and the second of the
    previous one, at the cost of one pair evaluated twice per block. Each
    pair of strata is an array of its own (stacked, XLA's CPU backend would
    evaluate all of them in one loop, selecting among them element by
    element), and each stratum's rows are written with the derivative as
    the first of the pairs, then added to as the second: one loop over the
    four pairs of a stratum is too large for XLA's CPU backend to
    vectorise (with a polynomial of 41 terms, six times slower).
    """
    k, m, b = logits.shape
    blocks = _num_blocks(m)
    rows = m // blocks
    particles_of, pairs = _kernel(count, size)

    def block(i: jax.Array, carry: tuple[Any, ...]) -> tuple[Any, ...]:
        sums, d_logits = carry
        start = i * rows
        index = (start - 1 + jnp.arange(rows + 2)) % m  # rows start - 1, ...
        both = [particles_of(jnp.take(logits[s], index, axis=0)) for s in range(k)]
        overlaps, d_first, d_second = _block_pairs(
            [tuple(x[:-1] for x in p) for p in both],
            [tuple(x[1:] for x in p) for p in both],
            pairs,
            omega,
        )
        sums = [a + b for a, b in zip(sums, overlaps, strict=True)]
        if omega is not None:
            scale = omega / m
            d_logits = _write_rows(d_logits, d_first, scale, start, add=False)
            d_logits = _write_rows(d_logits, d_second, scale, start, add=True)
        return sums, d_logits

    carry = (
        [jnp.zeros((rows, b), logits.dtype) for _ in range(k * k)],
        jnp.zeros(logits.shape if omega is not None else (0,), logits.dtype),
    )
    sums, d_logits = jax.lax.fori_loop(0, blocks, block, carry)
    sums = jnp.stack([jnp.sum(x, axis=0) for x in sums]).reshape(k, k, b)
    return sums, (d_logits if omega is not None else None)


def _strata_forward(
    logits: jax.Array, omega: jax.Array, count: jax.Array, size: int
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    # the value is per observation, so its gradient is the cotangent times
    # its partial derivatives, computed here in the same pass as the pairs
    sums, d_logits = _strata_pass(logits, count, size, omega)
    assert d_logits is not None  # computed with omega
    m = logits.shape[1]
    pair_sums = sums + jnp.swapaxes(sums, 0, 1)  # omega_s in both places
    d_omega = jnp.einsum("stb,tb->sb", pair_sums, omega) / m
    return _weighted(sums, omega, m), (d_logits, d_omega)


def _strata_backward(
    size: int, residuals: tuple[jax.Array, jax.Array], cotangent: jax.Array
) -> tuple[jax.Array, jax.Array, None]:
    d_logits, d_omega = residuals
    return cotangent * d_logits, cotangent * d_omega, None


binomial_strata_overlaps.defvjp(_strata_forward, _strata_backward)


def _logits_count(site: dict, plate: Any) -> tuple[jax.Array, jax.Array]:
    """``(b, c)`` logits and total counts of a Binomial site's components;
    a masked component has count 0 (the point mass at 0 of its pmf)."""
    components = site_components(site)
    base = components.base
    logits = base.logits  # BinomialProbs: the logits of its clamped probs
    count = jnp.asarray(base.total_count, dtype=jnp.result_type(logits))

    def rows(x: jax.Array) -> jax.Array:
        return component_rows(x, components, plate)

    logits, count = rows(logits), rows(jax.lax.stop_gradient(count))
    mask = component_mask(site, plate)
    if mask is not None:
        logits, count = jnp.where(mask, logits, 0.0), jnp.where(mask, count, 0.0)
    return logits, count


def binomial_parts(
    terms: ParticleTerms, max_size: int | None = None
) -> tuple[jax.Array, jax.Array, int] | None:
    """``(N, b)`` logits, ``(b,)`` total counts and the support's size where
    the one observed site is a Binomial of one component per observation
    (with ``max_size``, of at most ``max_size`` values): what the quadratic
    score and the CRPS from the pmf read in closed form instead of the
    ``(N, K, b)`` pmf; ``None`` otherwise."""
    likelihood = terms.likelihood
    if likelihood is None or len(likelihood.laws) != 1:
        return None
    if not isinstance(innermost(likelihood.laws[0]), (BinomialLogits, BinomialProbs)):
        return None
    plate = likelihood.plate
    logits, count = likelihood.per_particle(lambda s, _: _logits_count(s[0], plate))
    site = likelihood.sites()[0]
    size = count_size(site, innermost(site["fn"]))  # from concrete counts
    if logits.shape[-1] != 1 or (max_size is not None and size > max_size):
        return None
    # the counts are data, the same for every particle
    return logits[..., 0], count[0, :, 0], size
