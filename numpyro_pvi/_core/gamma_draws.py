r"""Simulated observations of Gamma-based likelihoods (``Gamma``, ``Chi2``,
``MultivariateStudentT``, ``Beta``, ``BetaProportion``, ``Dirichlet``) by
an exact vectorised sampler (``StudentT``: :mod:`~numpyro_pvi._core.student_draws`).

:func:`jax.random.gamma` draws each value in its own rejection loop with
its own key; on a CPU that took 348 ms for the ``(64, 6000)`` draws of one
step of a Student-t regression at ``M = 64``, two orders of magnitude more
than the step of ``Trace_ELBO`` (``benchmarks/RESULTS.md``). The scores
that compare simulated observations (the CRPS and the energy score of a
likelihood without a closed form) draw that many at every step.
:func:`standard_gamma` draws the same law with Marsaglia and Tsang's
method as array operations: one candidate for every value, then the
rejected ones (under 5%) again, gathered into blocks, until each value has
an accepted candidate: 14–17 ms for those draws. Its derivative in the
shape parameter is the implicit reparameterisation gradient of
:func:`jax.random.gamma` (:func:`jax.lax.random_gamma_grad`), computed by
:func:`shape_derivative` three to five times faster than by one call on all
the values.

**References**

1. Marsaglia, G. & Tsang, W. W. (2000). *A simple method for generating
   gamma variables*. ACM TOMS 26(3), 363–372.
2. Figurnov, M., Mohamed, S. & Mnih, A. (2018). *Implicit
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
    Gamma,
    MultivariateStudentT,
)

from numpyro_pvi._core.normal_draws import standard_normal
from numpyro_pvi._core.uniforms import uniforms

#: Candidates per rejected value in each redraw (every candidate is
#: accepted with probability above 0.95, so two leave about 1 in 400).
REDRAW_CANDIDATES = 2
#: Rounds of redraws after which a value still without an accepted
#: candidate is NaN (a shape parameter so large that float rounding
#: rejects every candidate), never a hang.
MAX_ROUNDS = 64
#: Values in each block of :func:`shape_derivative`'s loops.
GRAD_BLOCK = 4096


def _normal_deviate(u: jax.Array) -> jax.Array:
    """A standard normal deviate from a uniform one on ``[0, 1)``, as
    :func:`jax.random.normal` makes it (on ``(-1, 1)`` through the inverse
    error function)."""
    low = jnp.nextafter(jnp.asarray(-1.0, u.dtype), 0.0)
    return math.sqrt(2.0) * jax.lax.erf_inv(jnp.maximum(low, 2.0 * u - 1.0))


def _candidates(
    key: jax.Array, a: jax.Array, shape: tuple[int, ...]
) -> tuple[jax.Array, jax.Array]:
    """One Marsaglia–Tsang candidate of ``Gamma(a)`` (``a >= 1``) per entry
    of ``shape``: the value and whether it is accepted."""
    d = a - 1.0 / 3.0
    c = jax.lax.rsqrt(9.0 * d)
    u_z, u = uniforms(key, shape, 2, a.dtype)
    z = _normal_deviate(u_z)
    t = 1.0 + c * z
    v = t * t * t
    positive = v > 0
    log_v = jnp.log(jnp.where(positive, v, 1.0))
    accept = positive & (jnp.log(u) < 0.5 * z * z + d - d * v + d * log_v)
    return d * v, accept


def _rejected(accepted: jax.Array, size: int) -> jax.Array:
    """``(size,)`` the indices of the first ``size`` values not accepted
    (``n`` past the last): a prefix count and a binary search, cheaper on a
    CPU than :func:`jax.numpy.nonzero`'s scatter or :func:`jax.numpy.cumsum`."""
    count = jax.lax.associative_scan(jnp.add, (~accepted).astype(jnp.int32))
    return jnp.searchsorted(count, jnp.arange(1, size + 1, dtype=jnp.int32))


def _redraw(
    a: jax.Array, size: int, state: tuple[jax.Array, jax.Array, jax.Array, jax.Array]
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """One round: up to ``size`` of the values still rejected, each with
    :data:`REDRAW_CANDIDATES` candidates, the first accepted one kept."""
    value, accepted, key, rounds = state
    key, key_round = random.split(key)
    idx = _rejected(accepted, size)
    a_idx = a.at[idx].get(mode="fill", fill_value=1.0)
    shape = (REDRAW_CANDIDATES, size)
    cand, ok = _candidates(key_round, jnp.broadcast_to(a_idx, shape), shape)
    first = jnp.argmax(ok, axis=0)
    new = jnp.take_along_axis(cand, first[None], axis=0)[0]
    any_ok = jnp.any(ok, axis=0)
    old = value.at[idx].get(mode="fill", fill_value=0.0)
    value = value.at[idx].set(jnp.where(any_ok, new, old), mode="drop")
    accepted = accepted.at[idx].set(any_ok, mode="drop")
    return value, accepted, key, rounds + 1


def _boosted(
    key: jax.Array, alpha: jax.Array, boost: jax.Array, log_value: jax.Array
) -> jax.Array:
    tiny = jnp.finfo(log_value.dtype).tiny  # no log(0)
    u = random.uniform(key, log_value.shape, log_value.dtype, minval=tiny)
    step = jnp.log(u) / jnp.where(boost, alpha, 1.0)
    return jnp.where(boost, log_value + step, log_value)


def _log_draw(key: jax.Array, alpha: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """``log x`` of exact ``Gamma(alpha)`` draws ``x``, in log space so that
    the boost of a shape below 1 does not underflow."""
    alpha = jnp.broadcast_to(alpha, shape).reshape(-1)
    n = alpha.shape[0]
    valid = jnp.isfinite(alpha) & (alpha > 0)
    boost = alpha < 1  # Gamma(a) = Gamma(a + 1) U^(1/a)
    a = jnp.where(valid, jnp.where(boost, alpha + 1.0, alpha), 1.0)
    key_first, key_redraw, key_boost = random.split(key, 3)
    value, accepted = _candidates(key_first, a, a.shape)
    if n:
        # under 5% rejected: one round for a block of them all, then
        # rounds of small blocks for the few (1 in 400) left
        state = (value, accepted, key_redraw, jnp.zeros((), jnp.int32))
        state = _redraw(a, min(n, 256 + n // 16), state)
        value, accepted, _, _ = jax.lax.while_loop(
            lambda s: ~jnp.all(s[1]) & (s[3] < MAX_ROUNDS),
            partial(_redraw, a, min(n, 256 + n // 1024)),
            state,
        )
    log_value = jax.lax.cond(  # the uniforms only where a shape is below 1
        jnp.any(boost),
        partial(_boosted, key_boost, alpha, boost),
        lambda v: v,
        jnp.log(value),
    )
    return jnp.where(valid & accepted, log_value, jnp.nan).reshape(shape)


@jax.custom_batching.custom_vmap
def shape_derivative(alpha: jax.Array, x: jax.Array) -> jax.Array:
    r"""The implicit reparameterisation gradient
    :math:`\partial x / \partial \alpha` of draws ``x`` of
    :math:`\mathrm{Gamma}(\alpha, 1)` (``alpha`` broadcasts to ``x``): the
    values of :func:`jax.lax.random_gamma_grad`, computed block by block.

    :func:`~jax.lax.random_gamma_grad` runs a power series (where
    :math:`x \le \max(\alpha, 1)`) and a continued fraction (elsewhere),
    each a :func:`~jax.lax.while_loop` over the whole array: every iteration
    of either carries all the values, until the slowest value of the array
    converges (about 350 ns a value on a CPU). Here the values are ordered so
    that each method's come first (a prefix count and one scatter), and the
    loops run over blocks of :data:`GRAD_BLOCK` values in turn, whose state
    stays in the core's cache and whose loop for the other method stops at
    once (``benchmarks/RESULTS.md``). Under :func:`jax.vmap` the mapped
    values are one array of values (:func:`_batched_shape_derivative`).
    """
    shape, dtype = x.shape, jnp.result_type(alpha, x)
    a = jnp.broadcast_to(alpha, shape).reshape(-1).astype(dtype)
    x = x.reshape(-1).astype(dtype)
    n = x.shape[0]
    if n <= GRAD_BLOCK:
        return jax.lax.random_gamma_grad(a, x).reshape(shape)
    fraction = (x > 1) & (x > a)  # the continued fraction's values
    count = jax.lax.associative_scan(jnp.add, fraction.astype(jnp.int32))
    before = jnp.arange(1, n + 1, dtype=jnp.int32) - count
    order = jnp.where(fraction, before[-1] + count, before) - 1
    blocks = -(-n // GRAD_BLOCK)
    padded = blocks * GRAD_BLOCK
    a_sorted = jnp.ones(padded, a.dtype).at[order].set(a, unique_indices=True)
    x_sorted = jnp.ones(padded, x.dtype).at[order].set(x, unique_indices=True)
    grad = jax.lax.map(
        lambda ax: jax.lax.random_gamma_grad(*ax),
        (a_sorted.reshape(blocks, -1), x_sorted.reshape(blocks, -1)),
    )
    return grad.reshape(-1)[order].reshape(shape)


@shape_derivative.def_vmap
def _batched_shape_derivative(
    axis_size: int, in_batched: list[bool], alpha: jax.Array, x: jax.Array
) -> tuple[jax.Array, bool]:
    """:func:`shape_derivative` of the mapped values as one array (a
    ``vmap`` of its blocks would carry every mapped row in each block)."""
    alpha_batched, x_batched = in_batched
    values = x.shape[1:] if x_batched else x.shape
    shape = (axis_size, *values)
    if alpha_batched:  # per-row shape parameters, aligned on the right
        alpha = alpha.reshape(
            alpha.shape[:1] + (1,) * (len(values) - alpha.ndim + 1) + alpha.shape[1:]
        )
    return shape_derivative(
        jnp.broadcast_to(alpha, shape), jnp.broadcast_to(x, shape)
    ), True


def _float(alpha: jax.Array) -> jax.Array:
    return jnp.asarray(alpha, dtype=jnp.result_type(alpha, float))


@partial(jax.custom_jvp, nondiff_argnums=(2,))
def standard_gamma(
    key: jax.Array, alpha: jax.Array, shape: tuple[int, ...]
) -> jax.Array:
    r"""Exact draws of :math:`\mathrm{Gamma}(\alpha, 1)` of ``shape``
    (``alpha`` broadcasts to it), with Marsaglia and Tsang's method
    (:math:`\alpha < 1` by :math:`\mathrm{Gamma}(\alpha+1)\,U^{1/\alpha}`)
    and the implicit reparameterisation gradient in ``alpha``,

    .. math::

        \frac{\partial x}{\partial \alpha} = -\frac{\partial_\alpha
        F(x; \alpha)}{f(x; \alpha)}.

    The law of :func:`jax.random.gamma`, not its random stream. A shape
    parameter that is not positive and finite gives NaN.
    """
    return jnp.exp(_log_draw(key, _float(alpha), shape))


@partial(jax.custom_jvp, nondiff_argnums=(2,))
def standard_log_gamma(
    key: jax.Array, alpha: jax.Array, shape: tuple[int, ...]
) -> jax.Array:
    r""":math:`\log x` of the draws :math:`x` of :func:`standard_gamma` (as
    :func:`jax.random.loggamma`: no underflow for shapes far below 1), with
    the derivative :math:`x^{-1}\,\partial x / \partial \alpha`."""
    return _log_draw(key, _float(alpha), shape)


def _gamma_jvp(
    log_space: bool,
    shape: tuple[int, ...],
    primals: tuple[jax.Array, jax.Array],
    tangents: tuple[jax.Array, jax.Array],
) -> tuple[jax.Array, jax.Array]:
    key, alpha = primals[0], _float(primals[1])
    log_value = _log_draw(key, alpha, shape)
    value = jnp.exp(log_value)
    grad = shape_derivative(alpha, value)
    tangent = grad * jnp.broadcast_to(tangents[1], shape)
    if log_space:
        return log_value, tangent / value
    return value, tangent


standard_gamma.defjvp(partial(_gamma_jvp, False))
standard_log_gamma.defjvp(partial(_gamma_jvp, True))


def _multivariate_t(
    key: jax.Array, fn: MultivariateStudentT, shape: tuple[int, ...]
) -> jax.Array:
    # loc + L Z sqrt(df / V), one V ~ chi^2(df) per vector
    key_normal, key_gamma = random.split(key)
    df = _float(fn.df)
    v = 2.0 * standard_gamma(key_gamma, 0.5 * df, shape[:-1])
    z = standard_normal(key_normal, shape, v.dtype) * jnp.sqrt(df / v)[..., None]
    return fn.loc + jnp.squeeze(jnp.matmul(fn.scale_tril, z[..., None]), axis=-1)


def _gamma(key: jax.Array, fn: Gamma, shape: tuple[int, ...]) -> jax.Array:
    return standard_gamma(key, fn.concentration, shape) / fn.rate


def _open_unit(x: jax.Array) -> jax.Array:
    """Clipped into the open unit interval, as NumPyro's ``Dirichlet``."""
    finfo = jnp.finfo(x.dtype)
    return jnp.clip(x, finfo.tiny, 1 - finfo.eps)


def _beta(key: jax.Array, fn: Beta, shape: tuple[int, ...]) -> jax.Array:
    # G1 / (G1 + G0), from the log-gammas (as jax.random.dirichlet)
    key_1, key_0 = random.split(key)
    log_1 = standard_log_gamma(key_1, fn.concentration1, shape)
    log_0 = standard_log_gamma(key_0, fn.concentration0, shape)
    return _open_unit(jax.nn.sigmoid(log_1 - log_0))


def _dirichlet(key: jax.Array, fn: Dirichlet, shape: tuple[int, ...]) -> jax.Array:
    log_gamma = standard_log_gamma(key, fn.concentration, shape)
    return _open_unit(jax.nn.softmax(log_gamma, axis=-1))


#: Samplers by the ``sample`` method they replace
#: (:mod:`~numpyro_pvi._core.fast_draws`).
SAMPLERS: dict[Callable[..., Any], Callable[..., jax.Array]] = {
    MultivariateStudentT.sample: _multivariate_t,
    Gamma.sample: _gamma,
    Beta.sample: _beta,
    Dirichlet.sample: _dirichlet,
}
