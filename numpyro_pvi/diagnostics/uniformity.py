r"""The simultaneous ECDF band test of uniformity for calibration ranks.

A calibration rank :math:`r \in \{0, \dots, L\}` — the number of ``L``
approximate-posterior (or posterior-predictive) draws below the true value —
is discrete uniform when the approximation is calibrated. Its ECDF, at the
points :math:`z_1 < \dots < z_K`, is compared with the null CDF
:math:`F_0` through the pointwise two-sided binomial tail probabilities
:math:`\gamma_i = 2 \min\{\Pr(X \le c_i), \Pr(X \ge c_i)\}`,
:math:`X \sim \mathrm{Bin}(R, F_0(z_i))`, of the ECDF counts :math:`c_i`
(Säilynoja, Bürkner & Vehtari 2022). The statistic is
:math:`\gamma_{\min} = \min_i \gamma_i`; its p-value
:math:`\Pr(\gamma_{\min}^{\rm null} \le \gamma_{\min})` is computed exactly
by the recursion over the evaluation points that also gives ArviZ's
optimised simultaneous band (the probability that a uniform sample's ECDF
stays inside a pointwise band). The band at level :math:`1 - a` and the
p-value are two readings of one computation: the ECDF leaves the band
exactly when the p-value is at most :math:`a`.

The ranks are placed at :math:`u = (r + 1/2)/(L + 1)` and the null CDF is
that of the discrete uniform ranks, so the test is exact for any ``L``.

**References**

1. Säilynoja, T., Bürkner, P.-C. & Vehtari, A. (2022). *Graphical test for
   discrete uniformity and its applications in goodness-of-fit evaluation
   and multiple sample comparison.* Statistics and Computing 32, 32.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from scipy import special, stats

__all__ = ["EcdfBand", "ecdf_band", "eval_points", "uniformity_test"]

#: Evaluation points of the ECDF on (0, 1).
NUM_EVAL = 100
#: Counts whose pointwise tail probability is below this are outside every
#: band: the null mass they carry (at most ``K`` times this) is negligible,
#: and leaving them out keeps the recursion to the counts that matter.
_NEGLIGIBLE = 1e-15


def rank_positions(ranks: np.ndarray, num_draws: int) -> np.ndarray:
    """``u = (r + 1/2) / (L + 1)``, the ranks as points of (0, 1)."""
    return (np.asarray(ranks, dtype=float) + 0.5) / (num_draws + 1)


def eval_points(num_draws: int) -> tuple[np.ndarray, np.ndarray]:
    """Evaluation points ``z`` in (0, 1) and the null CDF ``F0(z)`` of the
    rank positions there (distinct values of ``F0`` strictly inside (0, 1))."""
    z = np.arange(1, NUM_EVAL) / NUM_EVAL
    cdf = np.clip(np.floor(z * (num_draws + 1) + 0.5), 0, num_draws + 1)
    cdf = cdf / (num_draws + 1)
    keep = (cdf > 0) & (cdf < 1)
    z, cdf = z[keep], cdf[keep]
    _, first = np.unique(cdf, return_index=True)
    return z[first], cdf[first]


@functools.lru_cache(maxsize=32)
def _tail_table(num: int, num_draws: int) -> np.ndarray:
    """``(K, R + 1)`` pointwise two-sided tail probability of every count."""
    _, cdf = eval_points(num_draws)
    counts = np.arange(num + 1)[None, :]
    lower = stats.binom.cdf(counts, num, cdf[:, None])
    upper = stats.binom.sf(counts - 1, num, cdf[:, None])
    return np.minimum(2 * np.minimum(lower, upper), 1.0)


def _interior_probability(num: int, cdf: np.ndarray, inside: np.ndarray) -> np.ndarray:
    """Probability that the ECDF counts of ``num`` null draws lie in
    ``inside`` at every point, for each of a batch of bands.

    The counts form a Markov chain over the points, the increment from point
    ``i - 1`` to ``i`` binomial in the draws still above (Säilynoja et al.
    2022); the chain is run over the counts some band allows.

    :param inside: ``(C, K, R + 1)`` booleans: the counts each of ``C``
        bands allows at each of the ``K`` points.
    :return: ``(C,)`` probabilities.
    """
    log_factorial = special.gammaln(np.arange(num + 1) + 1.0)
    union = np.asarray(inside.any(axis=0))
    prev_counts = np.zeros(1, dtype=int)
    prob = np.ones((inside.shape[0], 1))
    prev_cdf = 0.0
    for i, f in enumerate(cdf):
        counts = np.flatnonzero(union[i])
        if counts.size == 0:
            return np.zeros(inside.shape[0])
        step = (f - prev_cdf) / (1.0 - prev_cdf)
        k = counts[None, :] - prev_counts[:, None]
        n = num - prev_counts[:, None]
        valid = k >= 0
        k = np.where(valid, k, 0)
        log_pmf = (
            log_factorial[n]
            - log_factorial[k]
            - log_factorial[n - k]
            + k * np.log(step)
            + (n - k) * np.log1p(-step)
        )
        prob = (prob @ np.where(valid, np.exp(log_pmf), 0.0)) * inside[:, i, counts]
        prev_counts, prev_cdf = counts, f
    return prob.sum(axis=1)


def _statistic(ranks: np.ndarray, num_draws: int) -> float:
    """``γ_min`` of one column of ranks."""
    z, _ = eval_points(num_draws)
    u = np.sort(rank_positions(ranks, num_draws))
    counts = np.searchsorted(u, z, side="right")
    table = _tail_table(u.size, num_draws)
    return float(np.min(table[np.arange(z.size), counts]))


def uniformity_test(ranks: np.ndarray, num_draws: int) -> np.ndarray:
    """Exact p-values of the simultaneous ECDF band test, per column.

    :param ranks: ``(R, C)`` integer ranks in ``0..num_draws``.
    :param num_draws: ``L``, the number of draws each rank counts.
    :return: ``(C,)`` p-values :math:`\\Pr(\\gamma_{\\min}^{\\rm null} \\le
        \\gamma_{\\min})`.
    """
    ranks = np.asarray(ranks)
    num = ranks.shape[0]
    _, cdf = eval_points(num_draws)
    if cdf.size == 0:
        return np.ones(ranks.shape[1])
    table = _tail_table(num, num_draws)
    gamma = np.array([_statistic(col, num_draws) for col in ranks.T])
    inside = table[None] > np.maximum(gamma, _NEGLIGIBLE)[:, None, None]
    out = 1.0 - _interior_probability(num, cdf, inside)
    return np.clip(out, 0.0, 1.0)


class EcdfBand(NamedTuple):
    """The simultaneous band of an ECDF of ``R`` calibrated ranks.

    :ivar z: evaluation points in (0, 1).
    :ivar cdf: the null CDF at ``z``.
    :ivar lower: lower edge of the band (an ECDF value) at ``z``.
    :ivar upper: upper edge at ``z``.
    :ivar level: the simultaneous coverage of the band under uniformity.
    """

    z: np.ndarray
    cdf: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    level: float


def ecdf_band(num: int, num_draws: int, prob: float) -> EcdfBand:
    """The simultaneous ``prob`` band of the ECDF of ``num`` calibrated ranks.

    The narrowest pointwise band (the largest threshold on the pointwise tail
    probabilities) whose simultaneous coverage under uniformity is at least
    ``prob``: the ECDF of ranks with :func:`uniformity_test` p-value ``p``
    leaves it exactly when ``p ≤ 1 - prob``.

    :param num: ``R``, the number of ranks.
    :param num_draws: ``L``.
    :param prob: the simultaneous coverage, in (0, 1).
    """
    z, cdf = eval_points(num_draws)
    table = _tail_table(num, num_draws)
    candidates = np.unique(np.maximum(table, _NEGLIGIBLE))
    lo, hi = 0, candidates.size - 1  # coverage(candidates[lo]) ≥ prob holds
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _interior_probability(num, cdf, (table > candidates[mid])[None])[0] >= prob:
            lo = mid
        else:
            hi = mid - 1
    inside = table > candidates[lo]
    level = float(_interior_probability(num, cdf, inside[None])[0])
    counts = np.arange(num + 1)
    lower = np.array([counts[row].min() for row in inside]) / num
    upper = np.array([counts[row].max() for row in inside]) / num
    return EcdfBand(z, cdf, lower, upper, level)
