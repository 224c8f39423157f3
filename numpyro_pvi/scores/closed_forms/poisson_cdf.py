r"""The Poisson pmf and cdf at any rate, accurate in float32, in a fixed number
of elementwise operations.

The pmf is Loader's saddle-point form [1],
:math:`p_\lambda(n) = e^{-\delta(n) - D(n, \lambda)} / \sqrt{2\pi n}`. The cdf
:math:`F_\lambda(n) = Q(n + 1, \lambda)` is a finite sum of the pmf for small
:math:`n`, Temme's uniform asymptotic expansion [2, 3] where
:math:`\lambda / (n + 1)` is near one,

.. math::

    Q(a, x) = \tfrac12 \operatorname{erfc}\bigl(\eta\sqrt{a/2}\bigr)
    + \frac{e^{-a\eta^2/2}}{\sqrt{2\pi a}} \sum_{k<K} c_k(\eta)\, a^{-k},
    \qquad \tfrac12 \eta^2 = \tfrac{x}{a} - 1 - \log\tfrac{x}{a},

and a short sum of pmf ratios elsewhere. Every branch is evaluated and
selected, so no loop waits for a slow element. Not differentiable: callers
give the derivatives in closed form. :func:`poisson_quantile` inverts the cdf.

**References**

1. Loader, C. (2000). *Fast and accurate computation of binomial
   probabilities*. Technical report.
2. Temme, N. M. (1979). *The asymptotic expansion of the incomplete gamma
   functions*. SIAM J. Math. Anal. 10(4), 757–766.
3. NIST DLMF §8.12 (the coefficients :math:`c_k(\eta)`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.lax import stop_gradient
from jax.scipy.special import erfc, ndtri, xlogy

__all__ = ["poisson_cdf_pmf", "poisson_quantile", "quantile_start", "temme_table"]

#: By float width: the counts from which the cdf is not a finite sum (and
#: the terms of the sums down or up from n), Temme's orders and their terms
#: in η, and the terms of Loader's series of ``D``.
_SETTINGS = {
    4: {"sum_terms": 24, "orders": 4, "eta_terms": 13, "d_terms": 8},
    8: {"sum_terms": 48, "orders": 6, "eta_terms": 18, "d_terms": 14},
}
#: Rates relative to ``n + 1`` between which the cdf is Temme's expansion.
_LOW, _HIGH = 0.45, 2.2
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
#: Stirling's remainder δ(n) at n = 1, ..., 15 (δ(0) is not used).
_STIRLING_SMALL = [0.0] + [
    math.lgamma(n + 1.0) - (n + 0.5) * math.log(n) + n - _LOG_SQRT_2PI
    for n in range(1, 16)
]


@functools.cache
def temme_table(orders: int, eta_terms: int) -> np.ndarray:
    r"""``(orders, eta_terms)`` the coefficients :math:`d_{k,m}` of
    :math:`c_k(\eta) = \sum_m d_{k,m}\eta^m` (DLMF 8.12.8–8.12.9), computed
    exactly in rationals: :math:`\mu = x/a - 1` as a series in
    :math:`\eta` from :math:`\mu\mu' = \eta(1 + \mu)`, :math:`c_0 = 1/\mu
    - 1/\eta`, and :math:`d_{k,m} = (m + 2)\,d_{k-1,m+2} + (-1)^k g_k
    d_{0,m}` with :math:`g_k` the coefficients of Stirling's series of
    :math:`\Gamma^*`."""
    length = eta_terms + 2 * orders + 2
    mu = [Fraction(0), Fraction(1)]
    for k in range(2, length + 2):
        conv = _sum(mu[i] * (k - i + 1) * mu[k - i + 1] for i in range(2, k))
        mu.append((mu[k - 1] - conv) / (k + 1))
    denominator = [Fraction(1), *mu[2 : length + 2]]  # μ / η
    inverse = [Fraction(1)]
    for k in range(1, length + 1):
        inverse.append(-_sum(denominator[i] * inverse[k - i] for i in range(1, k + 1)))
    d0 = inverse[1:]  # 1/μ − 1/η
    g = _stirling_gamma_star(orders)
    rows = [d0]
    for k in range(1, orders):
        prev = rows[-1]
        rows.append(
            [
                (m + 2) * prev[m + 2] + (-1) ** k * g[k] * d0[m]
                for m in range(len(prev) - 2)
            ]
        )
    return np.array([[float(x) for x in row[:eta_terms]] for row in rows])


def _sum(terms: Iterable[Fraction]) -> Fraction:
    """An exact sum of rationals."""
    return sum(terms, Fraction(0))


def _stirling_gamma_star(orders: int) -> list[Fraction]:
    r""":math:`g_0, \dots, g_{K-1}` of :math:`\Gamma^*(a) = \Gamma(a) /
    (\sqrt{2\pi}\, a^{a - 1/2} e^{-a}) \sim \sum_k g_k a^{-k}`: the
    exponential of :math:`\sum_j B_{2j} / (2j(2j - 1)\, a^{2j-1})`."""
    bernoulli = [Fraction(1)]
    for m in range(1, orders + 2):
        bernoulli.append(
            -_sum(math.comb(m + 1, j) * bernoulli[j] for j in range(m)) / (m + 1)
        )
    log_series = [Fraction(0)] * orders
    for j in range(1, orders // 2 + 1):
        if 2 * j - 1 < orders:
            log_series[2 * j - 1] = bernoulli[2 * j] / (2 * j * (2 * j - 1))
    g = [Fraction(1)] + [Fraction(0)] * (orders - 1)
    for k in range(1, orders):
        g[k] = _sum(i * log_series[i] * g[k - i] for i in range(1, k + 1)) / k
    return g


def _deviance(x: jax.Array, m: jax.Array, terms: int) -> jax.Array:
    """Loader's ``D(x, m) = x log(x/m) + m - x`` (``x, m >= 0``), by its
    series in ``v = (x - m)/(x + m)`` where ``|v| < 0.25``."""
    total = x + m
    v = (x - m) / jnp.where(total > 0, total, 1.0)
    w = v * v
    series = jnp.zeros_like(v)
    for j in reversed(range(1, terms + 1)):  # Horner's rule: no term kept
        series = (series + 1.0 / (2 * j + 1)) * w
    near = (x - m) * v + 2.0 * x * v * series
    far = xlogy(x, x / m) + m - x
    return jnp.where(jnp.abs(v) < 0.25, near, far)


def _stirling_remainder(n: jax.Array) -> jax.Array:
    r""":math:`\delta(n)` at integers ``n >= 1``."""
    small = jnp.asarray(_STIRLING_SMALL, n.dtype)[jnp.clip(n, 0, 15).astype(jnp.int32)]
    r = 1.0 / jnp.maximum(n, 1.0) ** 2
    series = (
        1 / 12 - (1 / 360 - (1 / 1260 - (1 / 1680 - r / 1188) * r) * r) * r
    ) / jnp.maximum(n, 1.0)
    return jnp.where(n < 16, small, series)


def _temme(
    a: jax.Array, x: jax.Array, orders: int, eta_terms: int, d_terms: int
) -> jax.Array:
    """``Q(a, x)`` by Temme's expansion (meant for ``0.45 < x/a < 2.2``,
    ``a > 20``)."""
    deviance = _deviance(a, x, d_terms)  # a(λ - 1 - log λ), λ = x/a
    eta = jnp.sign(x - a) * jnp.sqrt(2.0 * deviance / a)
    table = temme_table(orders, eta_terms)
    total = jnp.zeros_like(eta)
    for k in reversed(range(orders)):
        row = jnp.zeros_like(eta)
        for coefficient in reversed(table[k]):
            row = row * eta + coefficient
        total = total / a + row
    tail = jnp.exp(-deviance - _LOG_SQRT_2PI) / jnp.sqrt(a) * total
    return 0.5 * erfc(eta * jnp.sqrt(0.5 * a)) + tail


#: Values per block of :func:`poisson_cdf_pmf` (its arrays stay in the
#: core's cache).
BLOCK = 4096


def poisson_cdf_pmf(rate: jax.Array, n: jax.Array) -> tuple[jax.Array, jax.Array]:
    r""":math:`F_\lambda(n)` and :math:`p_\lambda(n)` at integer-valued
    ``n`` (0 for ``n < 0``) and rates ``rate >= 0``, elementwise
    (broadcasting); not differentiated (``stop_gradient``). Evaluated in a
    loop over blocks of :data:`BLOCK` values: callers read both arrays, and
    XLA would otherwise keep each term of the sums as an array of the full
    size to share it between them. The last block ends at the last value,
    overlapping the one before it (computed again, to the same values):
    padded inputs and sliced outputs would be copies of the full size."""
    dtype = jnp.promote_types(jnp.result_type(rate, n), jnp.float32)
    rate, n = jnp.broadcast_arrays(
        stop_gradient(jnp.asarray(rate, dtype)), stop_gradient(jnp.asarray(n, dtype))
    )
    size = rate.size
    if size <= BLOCK:
        return _cdf_pmf(rate, n)
    flat = (rate.reshape(-1), n.reshape(-1))

    def step(i: jax.Array, out: tuple[jax.Array, jax.Array]):
        start = jnp.minimum(i * BLOCK, size - BLOCK)
        values = _cdf_pmf(*(lax.dynamic_slice_in_dim(x, start, BLOCK) for x in flat))
        return tuple(
            lax.dynamic_update_slice_in_dim(o, v, start, 0)
            for o, v in zip(out, values, strict=True)
        )

    zeros = (jnp.zeros(size, dtype), jnp.zeros(size, dtype))
    cdf, pmf = lax.fori_loop(0, -(-size // BLOCK), step, zeros)
    return cdf.reshape(rate.shape), pmf.reshape(rate.shape)


def _cdf_pmf(rate: jax.Array, n: jax.Array) -> tuple[jax.Array, jax.Array]:
    """:func:`poisson_cdf_pmf` of equally shaped arrays, elementwise."""
    s = _SETTINGS[jnp.dtype(rate.dtype).itemsize]
    count = jnp.maximum(n, 0.0)
    scale = 1.0 / jnp.sqrt(jnp.maximum(count, 1.0))
    deviance = _deviance(count, rate, s["d_terms"])
    pmf_high = jnp.exp(-_stirling_remainder(count) - deviance - _LOG_SQRT_2PI)
    pmf = jnp.where(count == 0, jnp.exp(-rate), pmf_high * scale)
    relative = rate / (count + 1.0)
    small = count < s["sum_terms"]
    # the sum of the pmf from 0 (small counts above the rate), down from n
    # (to 0 for small counts, ratio <= 0.46 for large ones) or up from n
    forward = small & (rate < count)
    down = jnp.where(small, rate >= count, relative >= _HIGH)
    temme = ~small & (relative > _LOW) & (relative < _HIGH)
    inverse_rate = 1.0 / jnp.where(rate > 0, rate, 1.0)
    total = jnp.ones_like(rate)
    for j in reversed(range(1, s["sum_terms"] + 1)):  # Horner's rule
        ratio = jnp.where(
            forward,
            rate / j,
            jnp.where(down, (count - j + 1.0) * inverse_rate, rate / (count + j)),
        )
        ratio = jnp.where(j > count, 0.0, ratio)  # finite sums: nothing inside
        total = 1.0 + ratio * total
    a = count + 1.0
    q = _temme(a, jnp.where(temme, rate, a), s["orders"], s["eta_terms"], s["d_terms"])
    cdf = jnp.where(
        forward,
        jnp.exp(-rate) * total,
        jnp.where(temme, q, jnp.where(down, pmf * total, 1.0 - pmf * (total - 1.0))),
    )
    negative = n < 0
    return jnp.where(negative, 0.0, jnp.clip(cdf, 0.0, 1.0)), jnp.where(
        negative, 0.0, pmf
    )


#: The most counts :func:`poisson_quantile` moves from its start (two at
#: most at the tests' rates; a count whose next float is more than one
#: away, beyond 2**24 in float32, stays at its start).
MAX_STEPS = 32


def quantile_start(u: jax.Array, rate: jax.Array) -> jax.Array:
    """The Cornish–Fisher start of :func:`poisson_quantile`, rounded; at
    most the median ``⌊λ + 1/3⌋`` below it, 0 at ``u = 0`` or ``λ = 0``."""
    z = ndtri(jnp.maximum(u, jnp.finfo(u.dtype).tiny))
    start = rate + jnp.sqrt(rate) * z + (z * z - 1.0) / 6.0
    k = jnp.maximum(jnp.floor(start + 0.5), 0.0)
    k = jnp.where(z < 0, jnp.minimum(k, jnp.floor(rate + 1.0 / 3.0)), k)
    return jnp.where((u > 0) & (rate != 0), k, 0.0 * rate)  # NaN for a NaN rate


def poisson_quantile(u: jax.Array, rate: jax.Array) -> jax.Array:
    r"""The Poisson quantile :math:`\min\{k \ge 0 : F_\lambda(k) \ge u\}`,
    elementwise, as floats: from the Cornish–Fisher start
    :math:`\lambda + \sqrt\lambda z + (z^2 - 1)/6`, :math:`z =
    \Phi^{-1}(u)` (:func:`quantile_start`: within two counts of the
    quantile, one at mean rates from 1 to 10⁵), one count at a time, up
    while :math:`F(k) < u` or down while :math:`F(k - 1) \ge u`, the cdf
    and pmf carried along by the
    pmf's recurrence: one evaluation of :func:`poisson_cdf_pmf`. Each value
    moves in one direction only (no oscillation where rounding meets a
    step). With ``u`` uniform, a Poisson draw (exact to the float's rounding
    of the cdf: within one unit in the last place of 1, in the tail beyond
    :math:`1 - 10^{-7}` in float32, a count or two low)."""
    u, rate = jnp.broadcast_arrays(u, stop_gradient(rate))
    k = quantile_start(u, rate)
    cdf, pmf = poisson_cdf_pmf(rate, k)
    up = cdf < u
    inverse_rate = 1.0 / jnp.where(rate > 0, rate, 1.0)

    def step(carry: tuple) -> tuple:
        k, cdf, pmf, _, steps = carry
        move = jnp.where(up, cdf < u, (cdf - pmf >= u) & (k > 0)) & (k + 1.0 > k)
        next_pmf = pmf * rate / (k + 1.0)  # p(k + 1); p(k - 1) = p(k) k / λ
        cdf = jnp.where(move, jnp.where(up, cdf + next_pmf, cdf - pmf), cdf)
        pmf = jnp.where(move, jnp.where(up, next_pmf, pmf * k * inverse_rate), pmf)
        k = k + jnp.where(move, jnp.where(up, 1.0, -1.0), 0.0)
        return k, cdf, pmf, jnp.any(move), steps + 1

    def more(carry: tuple) -> jax.Array:
        return carry[3] & (carry[4] < MAX_STEPS)

    return lax.while_loop(more, step, (k, cdf, pmf, jnp.asarray(True), 0))[0]
