r"""Pareto smoothed importance sampling inside JAX programs.

:func:`psis_smooth` is ArviZ 0.2x's ``psislw`` (NumPyro's conventions: a
tail of :math:`\lceil\min(S/5, 3\sqrt S)\rceil` draws, Zhang & Stephens' fit
with the weakly informative prior) in JAX, so held-out scores smooth each
observation inside the compiled program that scores them; it equals
``arviz.psislw(log_ratio, reff=1)`` to rounding.

**References**

1. Vehtari, A., Simpson, D., Gelman, A., Yao, Y. & Gabry, J. (2024).
   *Pareto smoothed importance sampling*. JMLR 25(72), 1–58.
2. Zhang, J. & Stephens, M. A. (2009). *A new and efficient estimation
   method for the generalized Pareto distribution*. Technometrics 51(3).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

#: Fewest draws in the tail that a generalized Pareto fit takes.
MIN_TAIL = 5


def tail_length(num_draws: int) -> int:
    r""":math:`\lceil\min(S/5, 3\sqrt S)\rceil`, the tail of ``num_draws``
    independent draws (ArviZ 0.2x, NumPyro)."""
    return math.ceil(min(0.2 * num_draws, 3 * math.sqrt(num_draws)))


def _gpd_fit(tail: jax.Array, valid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Shape and scale of the generalized Pareto distribution of the
    exceedances ``tail`` (sorted ascending; the first entries may be
    invalid, ``valid`` says which), as ArviZ's ``_gpdfit``."""
    size = tail.shape[0]
    n = jnp.sum(valid)
    first = size - n  # the valid entries are the last n
    grid = 30 + math.isqrt(size)
    m_est = 30 + jnp.floor(jnp.sqrt(n))
    j = jnp.arange(1, grid + 1, dtype=tail.dtype)
    in_grid = j <= m_est
    quartile = tail[jnp.clip(first + jnp.floor(n / 4 + 0.5).astype(int) - 1, 0)]
    b = 1 - jnp.sqrt(m_est / (j - 0.5))
    b = b / (3 * quartile) + 1 / tail[-1]
    log1p_terms = jnp.log1p(-b[:, None] * tail[None, :])
    k = jnp.sum(jnp.where(valid, log1p_terms, 0.0), axis=1) / n
    len_scale = n * (jnp.log(-(b / k)) - k - 1)
    len_scale = jnp.where(in_grid, len_scale, -jnp.inf)
    weights = 1 / jnp.sum(jnp.exp(len_scale[None, :] - len_scale[:, None]), axis=1)
    eps = jnp.finfo(tail.dtype).eps
    weights = jnp.where(in_grid & (weights >= 10 * eps), weights, 0.0)
    weights = weights / jnp.sum(weights)
    b_post = jnp.sum(b * weights)
    k_post = jnp.sum(jnp.where(valid, jnp.log1p(-b_post * tail), 0.0)) / n
    sigma = -k_post / b_post
    return (n * k_post + 10 * 0.5) / (n + 10), sigma


def _gpd_quantiles(probs: jax.Array, k: jax.Array, sigma: jax.Array) -> jax.Array:
    """Quantiles of the generalized Pareto distribution (``0 < probs < 1``)."""
    tiny = jnp.abs(k) < jnp.finfo(probs.dtype).eps
    safe_k = jnp.where(tiny, 1.0, k)
    general = jnp.expm1(-safe_k * jnp.log1p(-probs)) / safe_k
    return sigma * jnp.where(tiny, -jnp.log1p(-probs), general)


def psis_smooth(log_ratio: jax.Array) -> tuple[jax.Array, jax.Array]:
    r"""Pareto-smoothed, normalised log weights of ``S`` log ratios and k̂.

    As ``arviz.psislw(log_ratio, reff=1)`` on ArviZ 0.2x: k̂ = ``inf`` when
    fewer than 5 draws exceed the cutoff (the raw weights are kept); a fit
    that is not finite leaves the weights unsmoothed. One difference: when
    the largest ratios of the tail are tied with the cutoff (e.g. a mixture
    component whose draws all predict an observation equally, far above the
    other components), the weights are bounded and k̂ is ``-inf`` (ArviZ
    reports ``inf``, no draw exceeding the cutoff). ``-inf`` ratios (zero
    density) get weight zero. Use under ``vmap`` for several vectors.

    :param log_ratio: ``(S,)`` log importance ratios.
    :return: ``(S,)`` log weights summing to one, and the scalar k̂.
    """
    num = log_ratio.shape[0]
    m = tail_length(num)
    top = jnp.max(log_ratio)
    x = log_ratio - jnp.where(jnp.isfinite(top), top, 0.0)
    # XLA's CPU compiler runs a top-k as a partial sort only when its results
    # reach their users whole: sliced (the cutoff, the tail) it becomes a
    # sort of all S ratios. One barrier per result: a barrier of the pair
    # aborts XLA's SPMD partitioner on sharded observations.
    values, index = jax.lax.top_k(x, m + 1)
    values = jax.lax.optimization_barrier(values)
    index = jax.lax.optimization_barrier(index)
    cutoff = jnp.maximum(values[m], jnp.log(jnp.finfo(x.dtype).tiny))
    tail_x, tail_index = values[:m][::-1], index[:m][::-1]  # ascending
    valid = tail_x > cutoff
    n = jnp.sum(valid)
    exceed = jnp.where(valid, jnp.exp(tail_x) - jnp.exp(cutoff), 1.0)
    k, sigma = _gpd_fit(exceed, valid)
    fitted = (n > MIN_TAIL - 1) & jnp.isfinite(k)
    k = jnp.where(n > MIN_TAIL - 1, k, jnp.inf)
    # the largest m + 1 ratios tied (a stratum of equal contributions above
    # the rest): the weights are bounded, not heavy-tailed (ArviZ: inf)
    eps = jnp.finfo(x.dtype).eps
    flat = jnp.isfinite(values[m]) & (values[0] - values[m] <= 64 * eps)
    k = jnp.where(flat, -jnp.inf, k)
    rank = jnp.arange(m) - (m - n)  # 0 .. n-1 over the valid entries
    probs = jnp.clip((rank + 0.5) / jnp.maximum(n, 1), 0.0, 1.0)
    smoothed = jnp.log(_gpd_quantiles(probs, k, sigma) + jnp.exp(cutoff))
    smoothed = jnp.minimum(smoothed, 0.0)
    new_tail = jnp.where(valid & fitted, smoothed, tail_x)
    x = x.at[tail_index].set(new_tail)
    return x - jax.nn.logsumexp(x), k


def log_mean_estimate(log_values: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    r"""The importance-sampling estimate of :math:`\log \frac1S\sum_s
    e^{\ell_s}`, its Monte Carlo standard error and k̂.

    The standard error of the logarithm of a mean of ``S`` weights
    :math:`w_s = e^{\ell_s}` is, by the delta method,
    :math:`\sqrt{\mathrm{Var}(w)/S}/\bar w = \sqrt{\sum_s \tilde w_s^2 -
    1/S}` with :math:`\tilde w` the normalised weights; the Pareto-smoothed
    weights are used there (Vehtari et al. 2024, §3.2: the raw weights'
    variance is itself unreliable in a heavy tail). The estimate is the raw
    mean, unbiased for the mean of the weights; k̂ says whether its
    error is to be trusted (:math:`\hat k <` ``good_k``).

    :param log_values: ``(S,)`` the log weights :math:`\ell_s`.
    :return: ``(estimate, se, k̂)``.
    """
    num = log_values.shape[0]
    estimate = jax.nn.logsumexp(log_values) - math.log(num)
    log_weight, k = psis_smooth(log_values)
    var = jnp.sum(jnp.exp(2 * log_weight)) - 1.0 / num
    return estimate, jnp.sqrt(jnp.maximum(var, 0.0)), k


def good_k(num_draws: int) -> float:
    r""":math:`\min(1 - 1/\log_{10} S, 0.7)`: k̂ below it makes an
    importance-sampling estimate from ``S`` draws reliable (Vehtari et al.
    2024)."""
    return min(1 - 1 / math.log10(num_draws), 0.7)
