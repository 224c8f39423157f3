"""The pmf of a distribution over its whole finite support.

Categorical and Binomial likelihoods take one pass from their parameters
(the normaliser once for all support values); any other enumerable
distribution one ``log_prob`` per support value. A ``total_count`` that varies
between observations enumerates to the largest count, its pmf 0 (with a
finite gradient) above each observation's own. :func:`binomial_support_sums`
gives the quadratic score's particle sums of a Binomial pmf and its square
without the ``(M, K, b)`` array.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
from jax.scipy.special import gammaln, xlog1py, xlogy
from numpyro.distributions import (
    BernoulliLogits,
    BernoulliProbs,
    BetaBinomial,
    BinomialLogits,
    BinomialProbs,
    CategoricalLogits,
    CategoricalProbs,
    Distribution,
)
from numpyro.distributions.util import clamp_probs

#: Supports of at most this many values are handled one value at a time
#: (fused far better than one broadcast ``log_prob`` or one stacked array).
UNROLLED_SUPPORT = 16


def _categorical(
    d: CategoricalLogits | CategoricalProbs, size: int
) -> list[jax.Array] | jax.Array:
    logits = d.logits
    if isinstance(d, CategoricalLogits):  # CategoricalProbs' are normalised
        logits = logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    if size <= UNROLLED_SUPPORT:
        return [logits[..., k] for k in range(size)]
    return jnp.moveaxis(logits, -1, 0)


def _binomial_logits(d: BinomialLogits, size: int) -> list[jax.Array] | jax.Array:
    n = jnp.asarray(d.total_count, dtype=jnp.result_type(float))
    normaliser = n * jnp.clip(d.logits, 0) + xlog1py(n, jnp.exp(-jnp.abs(d.logits)))
    return _binomial(n, lambda k: k * d.logits - normaliser, size, d.batch_shape)


def _binomial_probs(d: BinomialProbs, size: int) -> list[jax.Array] | jax.Array:
    n = jnp.asarray(d.total_count, dtype=jnp.result_type(float))
    p = clamp_probs(d.probs)
    return _binomial(n, lambda k: xlogy(k, p) + xlog1py(n - k, -p), size, d.batch_shape)


def _binomial(
    n: jax.Array, kernel: Callable, size: int, batch_shape: tuple[int, ...]
) -> list[jax.Array] | jax.Array:
    """``log C(n, k) + kernel(k)`` for ``k = 0 .. size - 1`` (``-inf`` above
    ``n``: a ``total_count`` that varies between observations enumerates to
    the largest one)."""

    def log_pmf(k: jax.Array) -> jax.Array:
        inside = k <= n
        rest = jnp.where(inside, n - k, 0.0)
        value = gammaln(n + 1) - gammaln(k + 1) - gammaln(rest + 1) + kernel(k)
        return jnp.where(inside, value, -jnp.inf)

    if size <= UNROLLED_SUPPORT:
        return [log_pmf(jnp.asarray(k, n.dtype)) for k in range(size)]
    k = jnp.arange(size, dtype=n.dtype).reshape((size,) + (1,) * len(batch_shape))
    return log_pmf(k)


def _beta_binomial(d: BetaBinomial, size: int) -> list[jax.Array] | jax.Array:
    """Its ``log_prob`` at ``k = 0 .. size - 1``, ``-inf`` above the
    observation's own ``total_count``: evaluated there at the count itself,
    so that the gradient stays finite (``log_prob`` beyond the support has a
    NaN gradient, which ``where`` would multiply by zero and keep)."""
    n = jnp.asarray(d.total_count, dtype=jnp.result_type(float))

    def log_pmf(k: jax.Array) -> jax.Array:
        return jnp.where(k <= n, d.log_prob(jnp.minimum(k, n)), -jnp.inf)

    if size <= UNROLLED_SUPPORT:
        return [log_pmf(jnp.asarray(k, n.dtype)) for k in range(size)]
    k = jnp.arange(size, dtype=n.dtype).reshape((size,) + (1,) * len(d.batch_shape))
    return log_pmf(k)


#: The likelihoods whose pmf over the support is computed in one pass.
ONE_PASS = {
    BetaBinomial: _beta_binomial,
    CategoricalLogits: _categorical,
    CategoricalProbs: _categorical,
    BinomialLogits: _binomial_logits,
    BinomialProbs: _binomial_probs,
}


def support_log_pmf(
    fn: Distribution, support: jax.Array, *, one_pass: bool = True
) -> jax.Array | list[jax.Array]:
    """The log pmf of ``fn`` at each value of its support: a list of ``K``
    arrays (one per support value, each broadcastable to ``batch_shape``)
    for supports of at most 16 values, which XLA fuses best one value at a
    time, else one ``(K, ...)`` array.

    :param fn: a distribution with an enumerable support (no wrapper).
    :param support: ``fn.enumerate_support(expand=False)``.
    :param one_pass: compute the log pmf of Binomial and Categorical
        likelihoods from their parameters in one pass (``False``: the generic
        path, one ``log_prob`` per support value, for any distribution).
    """
    size = support.shape[0]
    one_pass_fn = ONE_PASS.get(type(fn)) if one_pass else None
    if one_pass_fn is not None:
        return one_pass_fn(fn, size)
    if size <= UNROLLED_SUPPORT:
        return [fn.log_prob(v) for v in support]
    return fn.log_prob(support)


def _bernoulli(d: BernoulliLogits | BernoulliProbs, size: int) -> list[jax.Array]:
    p = jax.nn.sigmoid(d.logits) if isinstance(d, BernoulliLogits) else d.probs
    return [1.0 - p, p]


#: The likelihoods whose probabilities over the support come straight from
#: their parameters (no logarithm).
PROBS_ONE_PASS = {BernoulliLogits: _bernoulli, BernoulliProbs: _bernoulli}


def support_pmf(
    fn: Distribution, support: jax.Array, *, one_pass: bool = True
) -> jax.Array | list[jax.Array]:
    """The pmf of ``fn`` at each value of its support, laid out like
    :func:`support_log_pmf`: ``[1 - p, p]`` for Bernoulli straight from its
    parameter (no logarithm), else ``exp`` of :func:`support_log_pmf`.

    :param fn: a distribution with an enumerable support (no wrapper).
    :param support: ``fn.enumerate_support(expand=False)``.
    :param one_pass: as in :func:`support_log_pmf`; ``False`` also takes
        Bernoulli through ``exp(log_prob)``.
    """
    probs_fn = PROBS_ONE_PASS.get(type(fn)) if one_pass else None
    if probs_fn is not None:
        return probs_fn(fn, support.shape[0])
    log_pmf = support_log_pmf(fn, support, one_pass=one_pass)
    if isinstance(log_pmf, list):
        return [jnp.exp(v) for v in log_pmf]
    return jnp.exp(log_pmf)


def integer_power(x: jax.Array, count: jax.Array, size: int) -> jax.Array:
    r""":math:`x^n` for integer-valued ``count`` :math:`0 \le n < {\rm size}`
    by binary powering (multiplications and selects only, no
    ``exp(n * log1p(x))``)."""
    bits = count.astype(jnp.int32)
    power, square = jnp.ones_like(x), x
    for i in range(max(1, (size - 1).bit_length())):
        if i:
            square = square * square
        power = jnp.where((bits >> i) & 1 == 1, power * square, power)
    return power


def _binomial_terms(
    logits: jax.Array, count: jax.Array, size: int
) -> tuple[list[jax.Array], jax.Array]:
    r"""The ``size`` arrays :math:`f_k = \binom{n}{k} p^k (1-p)^{n-k}` and
    :math:`p`, by the ratio of consecutive terms from the likelier end:
    with :math:`u = e^{-|\ell|}` and :math:`a = \max(p, 1-p)^n =
    (1 + u)^{-n}`, :math:`f_0 = a`, :math:`f_{k+1} = f_k\, u\, (n-k)/(k+1)`
    when :math:`\ell \le 0`, and :math:`f_n = a`, :math:`f_{k-1} = f_k\, u\,
    k/(n-k+1)` otherwise. One exponential and one division per element
    instead of one exponential per support value; the anchor
    :math:`a \ge 2^{-n}` does not underflow for supports of at most
    :data:`CDF_SUMS_SUPPORT` values, and no term exceeds 1. The ratios
    depend on the counts only (``(b,)``: data, not particles)."""
    u = jnp.exp(-jnp.abs(logits))
    a = integer_power(1.0 / (1.0 + u), count, size)
    # meant to compute them once, not inside every support value's fused
    # loop; XLA's CPU backend removes the barrier before fusing
    u, a = jax.lax.optimization_barrier((u, a))
    up = [a]
    for k in range(size - 1):
        up.append(up[-1] * u * (jnp.clip(count - k, 0) / (k + 1)))
    down: list[jax.Array] = [a] * size
    below = jnp.zeros_like(a)
    for k in reversed(range(size)):
        ratio = jnp.where(count > k, (k + 1) / jnp.maximum(count - k, 1), 0.0)
        below = jnp.where(count == k, a, below * u * ratio)
        down[k] = below
    low = logits <= 0
    p = jnp.where(low, u, 1.0) / (1.0 + u)
    return [jnp.where(low, f, g) for f, g in zip(up, down, strict=True)], p


#: Supports of at most this many values have their cdfs' sums from the
#: logits (:func:`binomial_cdf_sums`: 31 / 47 ``Trace_ELBO`` steps at M =
#: 8 / 64 on 41 values, where the ``(M, V, b)`` pmf took 80 / 189); the
#: anchor :math:`2^{-n}` of :func:`_binomial_terms` stays far from float32's
#: smallest normal number.
CDF_SUMS_SUPPORT = 48

#: Particles per pass of :func:`binomial_support_sums` (at most): the
#: terms of a block of particles stay in cache while they are summed.
PARTICLE_BLOCK = 16

CDF_BLOCK = 4


def _blocks(x: jax.Array, size: int = PARTICLE_BLOCK) -> jax.Array:
    """``(M, b)`` -> ``(M / B, B, b)`` with ``B`` the largest divisor of
    ``M`` that divides ``size`` (:data:`PARTICLE_BLOCK`)."""
    block = math.gcd(x.shape[0], size)
    return x.reshape((x.shape[0] // block, block) + x.shape[1:])


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def binomial_support_sums(
    logits: jax.Array, count: jax.Array, size: int
) -> tuple[jax.Array, jax.Array]:
    r"""``(K, b)`` totals :math:`T_k = \sum_m f_m(k)` and sums of squares
    :math:`\sum_m f_m(k)^2` over the particles of Binomial pmfs
    :math:`f_m(k) = \binom{n}{k} p_m^k (1 - p_m)^{n - k}`, ``k < size``,
    without the ``(M, K, b)`` pmf: a loop over blocks of particles sums the
    terms of each block (:func:`_binomial_terms`) while they are in cache,
    and the gradient, :math:`\partial f_k / \partial \ell = f_k (k - n
    p)`, is computed block by block likewise.

    :param logits: ``(M, b)`` the particles' logits :math:`\ell_m`.
    :param count: ``(b,)`` the total counts :math:`n` (integer-valued
        floats, data: no gradient).
    :param size: ``K``, at most :data:`UNROLLED_SUPPORT` (``n < K``).
    """
    blocks = _blocks(logits)

    def add_block(i: jax.Array, sums: tuple[jax.Array, jax.Array]):
        f, _ = _binomial_terms(blocks[i], count, size)
        totals = jnp.stack([x.sum(0) for x in f])
        return sums[0] + totals, sums[1] + jnp.stack([(x * x).sum(0) for x in f])

    zeros = jnp.zeros((size,) + logits.shape[1:], logits.dtype)
    return jax.lax.fori_loop(0, blocks.shape[0], add_block, (zeros, zeros))


def _sums_fwd(
    logits: jax.Array, count: jax.Array, size: int
) -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]:
    return binomial_support_sums(logits, count, size), (logits, count)


def _sums_bwd(
    size: int,
    residuals: tuple[jax.Array, jax.Array],
    cotangents: tuple[jax.Array, jax.Array],
) -> tuple[jax.Array, None]:
    logits, count = residuals
    d_totals, d_own = cotangents

    def block_gradient(block: jax.Array) -> jax.Array:
        f, p = _binomial_terms(block, count, size)
        mean = count * p
        d_block = jnp.zeros_like(block)
        for k, fk in enumerate(f):
            d_block = d_block + fk * (d_totals[k] + 2.0 * d_own[k] * fk) * (k - mean)
        return d_block

    return jax.lax.map(block_gradient, _blocks(logits)).reshape(logits.shape), None


binomial_support_sums.defvjp(_sums_fwd, _sums_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def binomial_cdf_sums(
    logits: jax.Array, count: jax.Array, size: int
) -> tuple[jax.Array, jax.Array]:
    r"""``(K - 1, b)`` totals :math:`\sum_m F_m(k)` and ``(b,)`` the sum of
    squares :math:`\sum_m \sum_k F_m(k)^2` of the Binomial cdfs
    :math:`F_m(k) = \sum_{v \le k} f_m(v)`, ``k < K - 1`` (``K = size``; at
    the last support value every cdf is 1), what the CRPS from the pmf
    reads, without the ``(M, K, b)`` cdf.

    A loop over blocks of particles and, inside, over the support values:
    each step's pmf, cdf and sums are computed once (with the support
    values unrolled, XLA's CPU backend evaluated the chain of terms again
    inside each value's reduction, :math:`O(K^2)` per element). The terms
    run up from the likelier end: :math:`Z = X` when :math:`\ell \le 0`,
    :math:`Z = n - X` otherwise, :math:`g_0 = \max(p, q)^n`, :math:`g_{j+1}
    = g_j\, u\, (n - j)/(j + 1)` with :math:`u = e^{-|\ell|}`; then
    :math:`F(k) = G(k)` or :math:`1 - G(n - k - 1)`. The gradient,
    :math:`\partial F_k / \partial \ell = \sum_{v \le k} f_v (v - n p)`, is
    computed block by block likewise.

    :param logits: ``(M, b)`` the particles' logits.
    :param count: ``(b,)`` the total counts (data: no gradient).
    :param size: ``K``, at most :data:`CDF_SUMS_SUPPORT`.
    """
    if size == 1:  # every count 0: no value below the last
        empty = jnp.zeros((0,) + logits.shape[1:], logits.dtype)
        return empty, jnp.zeros(logits.shape[1:], logits.dtype)
    if size <= UNROLLED_SUPPORT:
        return _unrolled_cdf_sums(logits, count, size)
    values = size - 1
    b = logits.shape[-1]
    support = jnp.arange(values, dtype=logits.dtype)[:, None]
    flipped = count - support - 1.0  # (K - 1, b): G's index of F(k) for Z = n - X

    def add_block(block: jax.Array, sums: tuple[jax.Array, ...]):
        u = jnp.exp(-jnp.abs(block))
        low = block <= 0

        def step(j: jax.Array, carry: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
            g, cdf, by_value, own = carry
            cdf = cdf + g  # G(j)
            below = jnp.where(low, cdf, 0.0).sum(0)
            above = jnp.where(low, 0.0, cdf).sum(0)
            by_value = jax.lax.dynamic_update_index_in_dim(
                by_value, jnp.stack([below, above]), j, 0
            )
            # F(k)^2 at k = j (Z = X), or at k = n - j - 1 (Z = n - X, j < n)
            square = jnp.where(low, cdf, jnp.where(j < count, 1.0 - cdf, 0.0))
            g = g * u * (jnp.clip(count - j, 0.0) / (j + 1.0))
            return g, cdf, by_value, own + jnp.square(square)

        start = (
            integer_power(1.0 / (1.0 + u), count, size),
            jnp.zeros_like(block),
            jnp.zeros((values, 2, b), block.dtype),
            jnp.zeros_like(block),
        )
        _, _, by_value, own = jax.lax.fori_loop(0, values, step, start)
        high = jnp.sum(~low, axis=0).astype(block.dtype)
        # F(k) = 1 - G(n - k - 1) summed over the block's Z = n - X particles
        index = jnp.clip(flipped, 0.0).astype(jnp.int32)
        flip = jnp.take_along_axis(by_value[:, 1], index, axis=0)
        totals = by_value[:, 0] + high - jnp.where(flipped >= 0, flip, 0.0)
        # the k >= n terms of the Z = n - X particles: F(k) = 1
        ones = high * jnp.clip(values - count, 0.0)
        return sums[0] + totals, sums[1] + own.sum(0) + ones

    zeros = (jnp.zeros((values, b), logits.dtype), jnp.zeros((b,), logits.dtype))
    blocks = _blocks(logits, CDF_BLOCK)
    return jax.lax.fori_loop(
        0, blocks.shape[0], lambda i, sums: add_block(blocks[i], sums), zeros
    )


def _unrolled_cdf_sums(
    logits: jax.Array, count: jax.Array, size: int
) -> tuple[jax.Array, jax.Array]:
    """:func:`binomial_cdf_sums` with the support values unrolled in each
    block (at most :data:`UNROLLED_SUPPORT` of them: faster than the loop
    over them, where repeating the chain of terms in each value's reduction
    costs less than the loop's steps)."""

    def add_block(i: jax.Array, sums: tuple[jax.Array, jax.Array]):
        f, _ = _binomial_terms(blocks[i], count, size)
        cdf = list(itertools.accumulate(f[:-1]))  # values below the last
        totals = jnp.stack([x.sum(0) for x in cdf])
        squares = functools.reduce(jnp.add, [x * x for x in cdf])
        return sums[0] + totals, sums[1] + squares.sum(0)

    blocks = _blocks(logits)
    zeros = jnp.zeros((size - 1,) + logits.shape[1:], logits.dtype)
    return jax.lax.fori_loop(0, blocks.shape[0], add_block, (zeros, zeros[0]))


def _cdf_sums_fwd(
    logits: jax.Array, count: jax.Array, size: int
) -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]:
    return binomial_cdf_sums(logits, count, size), (logits, count)


def _cdf_sums_bwd(
    size: int,
    residuals: tuple[jax.Array, jax.Array],
    cotangents: tuple[jax.Array, jax.Array],
) -> tuple[jax.Array, None]:
    logits, count = residuals
    d_totals, d_own = cotangents

    def block_gradient(block: jax.Array) -> jax.Array:
        # one output: the chain of terms is evaluated once
        f, p = _binomial_terms(block, count, size)
        mean = count * p
        cdf, slope = jnp.zeros_like(block), jnp.zeros_like(block)
        d_block = jnp.zeros_like(block)
        for k, fk in enumerate(f[:-1]):
            cdf, slope = cdf + fk, slope + fk * (k - mean)
            d_block = d_block + slope * (d_totals[k] + 2.0 * d_own * cdf)
        return d_block

    return jax.lax.map(block_gradient, _blocks(logits)).reshape(logits.shape), None


binomial_cdf_sums.defvjp(_cdf_sums_fwd, _cdf_sums_bwd)
