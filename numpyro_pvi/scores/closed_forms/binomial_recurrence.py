r"""The pmf overlap of two Binomial likelihoods of many trials by a recurrence.

:math:`O_n = \sum_k f_a(k) f_b(k)` is the central coefficient
:math:`[t^n](\alpha + \beta t + \gamma t^2)^n` with
:math:`\alpha = q_a p_b`, :math:`\beta = q_a q_b + p_a p_b`,
:math:`\gamma = p_a q_b`, and satisfies Legendre's scaled recurrence

.. math::

    (k + 1)\, O_{k+1} = (2k + 1)\, \beta\, O_k - k\, \delta^2 O_{k-1},
    \qquad \delta^2 = (q_a q_b - p_a p_b)^2,

stable forward (its dominant solution) with every :math:`O_k` a probability,
so nothing overflows at any :math:`n`. The gradient in the logits needs only
:math:`O_{n-1}` (Euler's identity for the homogeneous :math:`O_n`).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["recurrence_pairs", "recurrence_particles"]

#: Steps of the recurrence unrolled in each iteration of its loop.
UNROLL = 8

_State = tuple[jax.Array, jax.Array, jax.Array, jax.Array]


def recurrence_particles(logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """:math:`p` and :math:`q` per particle (each from its own sigmoid, so
    that neither loses precision near the other end)."""
    return jax.nn.sigmoid(logits), jax.nn.sigmoid(-logits)


def _coefficients(size: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    r"""The recurrence's :math:`(2k + 1) / (k + 1)` and :math:`k / (k + 1)`
    for :math:`k < ` ``size``, the second rounded to a multiple of the
    precision's epsilon so that the first is exactly one more: a constant
    overlap (point masses) stays exactly constant."""
    k = np.arange(size, dtype=np.float64)
    eps = np.finfo(dtype).eps
    second = np.round(k / (k + 1.0) / eps) * eps
    return (1.0 + second).astype(dtype), second.astype(dtype)


def _step(
    beta: jax.Array, d2: jax.Array, count: jax.Array | None, size: int
) -> Callable[[jax.Array, _State], _State]:
    r"""One step :math:`O_{k-1}, O_k \to O_k, O_{k+1}`; with ``count``,
    :math:`O_n` and :math:`O_{n-1}` kept where :math:`k + 1 = n`."""
    tables = tuple(jnp.asarray(x) for x in _coefficients(size, beta.dtype))

    def step(k: jax.Array, state: _State) -> _State:
        previous, current, kept, kept_previous = state
        a, b = (jax.lax.dynamic_index_in_dim(x, k, keepdims=False) for x in tables)
        # one multiplication and one subtraction after the last step's
        # value: the loop's time is this chain's latency
        following = (a * beta) * current - (b * d2) * previous
        if count is None:
            return current, following, kept, kept_previous
        hit = count == (k + 1).astype(beta.dtype)
        return (
            current,
            following,
            jnp.where(hit, following, kept),
            jnp.where(hit, current, kept_previous),
        )

    return step


def _last_two(
    beta: jax.Array, d2: jax.Array, count: jax.Array, size: int, constant: jax.Array
) -> tuple[jax.Array, jax.Array]:
    r""":math:`O_n` and :math:`O_{n-1}` (0 where :math:`n = 0`) at each
    observation's count, for counts below ``size``."""
    ones = jnp.ones_like(beta)
    empty = count == 0
    start = (ones, beta, jnp.where(empty, ones, beta), jnp.where(empty, 0.0, ones))

    def run(keep: bool) -> tuple[jax.Array, jax.Array]:
        step = _step(beta, d2, count if keep else None, size)
        previous, current, kept, kept_previous = jax.lax.fori_loop(
            1, size - 1, step, start, unroll=UNROLL
        )
        return (kept, kept_previous) if keep else (current, previous)

    return jax.lax.cond(constant, lambda: run(False), lambda: run(True))


def recurrence_pairs(
    first: tuple[jax.Array, jax.Array],
    second: tuple[jax.Array, jax.Array],
    count: jax.Array,
    size: int,
    constant: jax.Array,
    gradient: bool,
) -> tuple[jax.Array, ...]:
    r"""The overlaps of ``first[m]`` and ``second[m]``
    (:func:`recurrence_particles` of their logits), and with ``gradient``
    their partial derivatives in the two logits (after the overlaps).

    :param count: the total counts :math:`n` (integer-valued floats below
        ``size``), broadcasting against the particles' arrays.
    :param size: the support's size (a Python integer, at least 3).
    :param constant: whether every count is ``size - 1`` (a boolean
        scalar).
    """
    p_a, q_a = first
    p_b, q_b = second
    same, other = q_a * q_b, p_a * p_b
    beta = same + other
    overlap, before = _last_two(beta, jnp.square(same - other), count, size, constant)
    if not gradient:
        return (overlap,)
    half = 0.5 * count * (overlap - beta * before)
    tail = count * before
    return (
        overlap,
        half * (q_a - p_a) + p_a * q_a * (p_b - q_b) * tail,
        half * (q_b - p_b) + p_b * q_b * (p_a - q_a) * tail,
    )
