"""The three readings of calibration ranks, as the groups of a result.

Shared by :func:`~numpyro_pvi.diagnostics.vsbc` (ranks of the true
parameters and test quantities among the guide's draws) and
:func:`~numpyro_pvi.diagnostics.predictive_calibration` (ranks of held-out
observations among posterior-predictive draws): the symmetry test
(``direction``: bias), the dispersion test (``dispersion``: too narrow or
too wide) and the simultaneous ECDF band test (``p_value_uniformity``: any
departure from uniformity), each corrected for multiplicity over the
components, and the histogram of the ranks.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import xarray as xr
from scipy import special, stats

OK = "ok"

_DESCRIPTION = {
    "symmetry": "Kolmogorov-Smirnov statistic of p against 1 - p; exact "
    "p-values under symmetry of p about 1/2 (sign-flip null)",
    "dispersion": "variance of the normal scores of the ranks against its null "
    "distribution (Satterthwaite chi-square); 'too narrow' = intervals "
    "under-cover (U-shaped histogram)",
    "uniformity": "simultaneous ECDF band test (Saeilynoja, Buerkner & Vehtari "
    "2022), exact p-values",
}


def _num_bins(num: int) -> int:
    return int(np.clip(math.ceil(math.sqrt(num)), 5, 20))


def _dispersion(
    ranks: np.ndarray, num_draws: int, correction: str | None, alpha: float
):
    test = dispersion_test(ranks, num_draws)
    adjusted = adjust_p_values(test["p_value"], correction)
    verdict = np.where(
        adjusted >= alpha,
        OK,
        np.where(test["p_value_narrow"] <= test["p_value_wide"], TOO_NARROW, TOO_WIDE),
    )
    return {
        "dispersion": verdict.astype(str),
        "p_value_dispersion": adjusted,
        "spread_ratio": test["spread_ratio"],
    }


def rank_datasets(
    ranks: np.ndarray,
    num_draws: int,
    component: dict[str, Any],
    *,
    correction: str | None,
    alpha: float,
) -> tuple[xr.Dataset, xr.Dataset]:
    """The tests and the histogram of ``(R, C)`` ranks in ``0..num_draws``.

    :return: ``(tests, histogram)``: per ``component``, the symmetry test's
        variables (``ks_statistic``, ``p_value``, ``p_value_adjusted``,
        ``p_value_over``, ``p_value_under``, ``direction``), ``dispersion``,
        ``p_value_dispersion`` (corrected), ``spread_ratio``,
        ``p_value_uniformity`` (corrected), ``p_value_uniformity_unadjusted``
        and ``num_extreme`` (ranks 0 or ``L``); the histogram's ``count``
        per component and ``bin``.
    """
    num = ranks.shape[0]
    symmetry = symmetry_test(ranks, num_draws, correction, alpha)
    uniform = uniformity_test(ranks, num_draws)
    extreme = np.sum((ranks == 0) | (ranks == num_draws), axis=0)
    tests = xr.Dataset(
        {
            **{k: ("component", v) for k, v in symmetry.items()},
            **{
                k: ("component", v)
                for k, v in _dispersion(ranks, num_draws, correction, alpha).items()
            },
            "p_value_uniformity": ("component", adjust_p_values(uniform, correction)),
            "p_value_uniformity_unadjusted": ("component", uniform),
            "num_extreme": ("component", extreme),
        },
        coords=component,
        attrs={
            "test": _DESCRIPTION["symmetry"],
            "dispersion_test": _DESCRIPTION["dispersion"],
            "uniformity_test": _DESCRIPTION["uniformity"],
            "correction": str(correction),
            "alpha": alpha,
            "num_simulations": num,
            "num_draws": num_draws,
        },
    )
    p = ranks / num_draws
    num_bins = _num_bins(num)
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    counts = np.stack([np.histogram(p[:, j], bins=edges)[0] for j in range(p.shape[1])])
    histogram = xr.Dataset(
        {"count": (("component", "bin"), counts)},
        coords={
            **component,
            "bin": np.arange(num_bins),
            "bin_left": ("bin", edges[:-1]),
            "bin_right": ("bin", edges[1:]),
        },
    )
    return tests, histogram


def band_level(row: xr.Dataset) -> float:
    """The simultaneous coverage of the band drawn for one component: the
    ECDF leaves it exactly when the corrected uniformity p-value is below
    ``alpha`` (the level ``1 - alpha`` scaled by the correction's factor
    for this component)."""
    alpha = float(row.attrs.get("alpha", 0.05))
    raw = float(row["p_value_uniformity_unadjusted"])
    adjusted = float(row["p_value_uniformity"])
    factor = adjusted / raw if raw > 0 and adjusted > 0 else 1.0
    return 1.0 - alpha / max(factor, 1.0)


def holm(p_values: np.ndarray) -> np.ndarray:
    """Holm (1979) step-down adjusted p-values.

    :param p_values: ``(m,)`` p-values.
    :return: ``(m,)`` adjusted p-values (at most 1).
    """
    p = np.asarray(p_values, dtype=float)
    m = p.size
    order = np.argsort(p, kind="stable")
    adjusted = np.maximum.accumulate((m - np.arange(m)) * p[order])
    out = np.empty(m)
    out[order] = np.minimum(adjusted, 1.0)
    return out


def adjust_p_values(p_values: np.ndarray, correction: str | None) -> np.ndarray:
    """Multiplicity-corrected p-values: Holm, Benjamini–Hochberg or none.

    :param p_values: ``(m,)`` p-values.
    :param correction: ``"holm"``, ``"bh"`` or ``None``.
    :return: ``(m,)`` corrected p-values.
    """
    p = np.asarray(p_values, dtype=float)
    if correction is None or p.size == 0:
        return p.copy()
    if correction == "holm":
        return holm(p)
    return stats.false_discovery_control(p, method="bh")


def reflection_walk(below: np.ndarray, num_draws: int) -> tuple[np.ndarray, list]:
    r"""The KS difference process of ``p`` against ``1 - p`` as a signed walk.

    With ``p_i = below_i / L``, ``a_i = |2 below_i - L|`` and ``s_i`` the sign
    of ``p_i - 1/2``, the difference of the ECDFs at ``t < 1/2`` is
    :math:`F_p(t) - F_{1-p}(t) = -\frac1R \sum_{i: a_i \ge (1-2t)L} s_i`
    (and the same sums, with strict inequalities, at ``t ≥ 1/2``): its values
    are the partial sums ``T_k`` of the signs grouped by tied magnitude, from
    the largest magnitude down. Returns ``T`` (with ``T_0 = 0``) and the group
    sizes.
    """
    centred = 2 * np.asarray(below, dtype=np.int64) - num_draws
    keep = centred != 0
    magnitude, sign = np.abs(centred[keep]), np.sign(centred[keep])
    levels, group = np.unique(-magnitude, return_inverse=True)  # descending
    sums = np.bincount(group, weights=sign, minlength=levels.size)
    sizes = np.bincount(group, minlength=levels.size)
    return np.concatenate([[0.0], np.cumsum(sums)]), sizes.tolist()


@functools.lru_cache(maxsize=256)
def _rademacher_sum_pmf(m: int) -> np.ndarray:
    """pmf of a sum of ``m`` Rademacher signs on ``-m, ..., m`` (odd offsets 0)."""
    pmf = np.zeros(2 * m + 1)
    pmf[::2] = stats.binom.pmf(np.arange(m + 1), m, 0.5)
    return pmf


def reflection_tail(sizes: Sequence[int], level: int, *, two_sided: bool) -> float:
    """Exact ``P(max_k |T_k| ≥ level)`` (or ``P(max_k T_k ≥ level)``) under symmetry.

    Under the null that ``p`` is symmetric about 1/2 the signs are
    independent fair coin flips given the magnitudes, so ``T_k`` is a walk
    whose ``g``-th step is a sum of ``sizes[g]`` Rademacher variables. The
    probability of reaching the barrier is propagated exactly over the states
    ``T ∈ [-n, n]`` with the barrier absorbing.
    """
    if level <= 0:
        return 1.0
    n = int(sum(sizes))
    state = np.zeros(2 * n + 1)
    state[n] = 1.0
    values = np.arange(-n, n + 1)
    barrier = np.abs(values) >= level if two_sided else values >= level
    absorbed = 0.0
    for m in sizes:
        state = np.convolve(state, _rademacher_sum_pmf(m))[m : m + 2 * n + 1]
        absorbed += state[barrier].sum()
        state[barrier] = 0.0
    return float(min(absorbed, 1.0))


def symmetry_test(
    below: np.ndarray, num_draws: int, correction: str | None, alpha: float
) -> dict[str, np.ndarray]:
    """KS tests of ``p`` against ``1 - p`` for each column of ``below`` (R, C).

    ``p = below / num_draws``. The statistic is the two-sample KS statistic
    of ``p`` against ``1 - p`` (Yao et al. 2018); its p-values are exact
    under the null that ``p`` is symmetric about 1/2 (conditional on
    ``|p - 1/2|``): the two-sample KS distribution assumes independent
    samples, which ``p`` and ``1 - p`` are not, and rejects a symmetric ``p``
    more often than its level (for 40 uniform ``p`` at level 5%: 7.6% with
    SciPy's default, exact, p-value and 11.9% with the asymptotic one, over
    20 000 repetitions). The two-sided p-value is corrected for multiplicity over the
    columns; a column whose corrected p-value is below ``alpha`` gets the
    direction of the one-sided test with the smaller p-value: ``"over"``
    when the ECDF of ``p`` rises above that of ``1 - p`` (``p`` piles up near
    0: q overestimates θ), ``"under"`` when it falls below.
    """
    num, cols = below.shape
    out = {k: np.empty(cols) for k in ("ks", "two", "over", "under")}
    for j in range(cols):
        walk, sizes = reflection_walk(below[:, j], num_draws)
        over, under = int(max(0.0, -walk.min())), int(max(0.0, walk.max()))
        out["ks"][j] = max(over, under) / num
        out["two"][j] = reflection_tail(sizes, max(over, under), two_sided=True)
        out["over"][j] = reflection_tail(sizes, over, two_sided=False)
        out["under"][j] = reflection_tail(sizes, under, two_sided=False)
    adjusted = adjust_p_values(out["two"], correction)
    direction = np.where(
        adjusted >= alpha, "ok", np.where(out["over"] <= out["under"], "over", "under")
    )
    return {
        "ks_statistic": out["ks"],
        "p_value": out["two"],
        "p_value_adjusted": adjusted,
        "p_value_over": out["over"],
        "p_value_under": out["under"],
        "direction": direction.astype(str),
    }


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


TOO_NARROW = "too narrow"
TOO_WIDE = "too wide"


def normal_scores(ranks: np.ndarray, num_draws: int) -> np.ndarray:
    """:math:`\\Phi^{-1}((r + 1/2)/(L + 1))` of integer ranks ``r``."""
    return special.ndtri((np.asarray(ranks, dtype=float) + 0.5) / (num_draws + 1))


def _log_interval_probability(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``log(Φ(hi) - Φ(lo))`` without cancellation: on the side of zero
    where the interval lies, through the tails of the normal."""
    upper = lo + hi > 0  # use Φ(-lo) - Φ(-hi) there
    a, b = np.where(upper, -hi, lo), np.where(upper, -lo, hi)
    log_b, log_a = special.log_ndtr(b), special.log_ndtr(a)
    with np.errstate(divide="ignore"):
        return log_b + np.log1p(-np.exp(log_a - log_b))


def _log_normal_density(z: np.ndarray) -> np.ndarray:
    """``log φ(z)``; ``-inf`` at the infinite edges."""
    return -0.5 * z**2 - 0.5 * np.log(2 * np.pi)


def _times(z: np.ndarray, d: np.ndarray) -> np.ndarray:
    """``z * d`` with ``d = 0`` at the infinite edges (``z φ(z) → 0``)."""
    return np.where(np.isfinite(z), z, 0.0) * d


#: the range of the fitted scale and of its centre: a scale at the upper end
#: is unbounded by the ranks (``inf``)
_SCALE_RANGE, _LOC_BOUND = (1e-3, 1e3), 50.0
_MAX_NEWTON, _MAX_HALVINGS = 100, 40


def _negative_log_lik(
    lo: np.ndarray, hi: np.ndarray, x: np.ndarray, *, derivatives: bool = True
) -> tuple[np.ndarray, ...]:
    """The censored normal's negative log-likelihood of ``(R, C)`` PIT
    intervals ``[lo, hi]`` at ``x = (δ, γ) = (μ/σ, 1/σ)``, each ``(C,)``,
    with its gradient ``(2, C)`` and Hessian ``(2, 2, C)``. In these
    coordinates the interval ``[γ lo - δ, γ hi - δ]`` is linear in ``x``, so
    the log-likelihood is concave (the normal is log-concave) and the
    Hessian is the chain rule's outer term only."""
    a, b = x[1] * lo - x[0], x[1] * hi - x[0]
    log_p = _log_interval_probability(a, b)
    if not derivatives:
        return (-log_p.sum(axis=0),)
    d_a = -np.exp(_log_normal_density(a) - log_p)  # ∂ log p / ∂a
    d_b = np.exp(_log_normal_density(b) - log_p)
    d_aa, d_bb, d_ab = -_times(a, d_a) - d_a**2, -_times(b, d_b) - d_b**2, -d_a * d_b
    lo_, hi_ = np.where(np.isfinite(lo), lo, 0.0), np.where(np.isfinite(hi), hi, 0.0)
    grad = np.stack([d_a + d_b, -(lo_ * d_a + hi_ * d_b)]).sum(axis=1)
    h_dd = d_aa + 2 * d_ab + d_bb
    h_dg = -(lo_ * d_aa + (lo_ + hi_) * d_ab + hi_ * d_bb)
    h_gg = lo_**2 * d_aa + 2 * lo_ * hi_ * d_ab + hi_**2 * d_bb
    hess = -np.array([[h_dd, h_dg], [h_dg, h_gg]]).sum(axis=2)
    return -log_p.sum(axis=0), grad, hess


def _project(x: np.ndarray) -> np.ndarray:
    """Onto ``σ`` in its range and ``|μ| ≤ 50``."""
    gamma = np.clip(x[1], 1 / _SCALE_RANGE[1], 1 / _SCALE_RANGE[0])
    return np.stack([np.clip(x[0], -_LOC_BOUND * gamma, _LOC_BOUND * gamma), gamma])


def _newton_direction(grad: np.ndarray, hess: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Newton's step of every column; along ``δ`` alone where ``γ`` sits at
    its lower end and the step would leave the range; the gradient's where
    the Hessian is singular."""
    det = hess[0, 0] * hess[1, 1] - hess[0, 1] ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        step = -np.stack(
            [
                hess[1, 1] * grad[0] - hess[0, 1] * grad[1],
                hess[0, 0] * grad[1] - hess[0, 1] * grad[0],
            ]
        ) / np.where(det > 0, det, np.nan)
        at_bound = (x[1] <= 1 / _SCALE_RANGE[1]) & (step[1] < 0)
        along_delta = np.stack([-grad[0] / hess[0, 0], np.zeros_like(grad[0])])
    step = np.where(at_bound, along_delta, step)
    return np.where(np.isfinite(step), step, -grad)


def _line_search(
    lo: np.ndarray,
    hi: np.ndarray,
    x: np.ndarray,
    value: np.ndarray,
    grad: np.ndarray,
    step: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Backtracking (Armijo) along ``step`` within the range: the new point
    of every column, and whether it moved."""
    t, accepted = np.ones_like(value), np.zeros(value.shape, dtype=bool)
    new = x.copy()
    for _ in range(_MAX_HALVINGS):
        trial = _project(x + t * step)
        (trial_value,) = _negative_log_lik(lo, hi, trial, derivatives=False)
        decrease = 1e-4 * np.sum(grad * (trial - x), axis=0)
        ok = ~accepted & (trial_value <= value + decrease)
        new[:, ok], accepted = trial[:, ok], accepted | ok
        if accepted.all():
            break
        t = np.where(accepted, t, t / 2)
    moved = np.max(np.abs(new - x) / (1 + np.abs(x)), axis=0) > 1e-10
    return new, accepted & moved


def censored_spreads(ranks: np.ndarray, num_draws: int) -> np.ndarray:
    """The maximum-likelihood scale of a normal fitted to the PIT intervals
    of every column of ``(R, C)`` integer ranks (see the module's text);
    ``inf`` where unbounded. Newton's method with a backtracking line
    search on the concave log-likelihood in :math:`(\\mu/\\sigma,
    1/\\sigma)`, the columns not yet converged at once."""
    edges = special.ndtri(np.arange(num_draws + 2) / (num_draws + 1))
    ranks = np.asarray(ranks, dtype=int)
    lo, hi = edges[ranks], edges[ranks + 1]
    mid = normal_scores(ranks, num_draws)
    gamma = 1 / np.maximum(mid.std(axis=0, ddof=1), _SCALE_RANGE[0])
    x = _project(np.stack([mid.mean(axis=0) * gamma, gamma]))
    active = np.arange(x.shape[1])
    for _ in range(_MAX_NEWTON):
        lo_, hi_, x_ = lo[:, active], hi[:, active], x[:, active]
        value, grad, hess = _negative_log_lik(lo_, hi_, x_)
        step = _newton_direction(grad, hess, x_)
        x[:, active], moved = _line_search(lo_, hi_, x_, value, grad, step)
        active = active[moved]
        if not active.size:
            break
    scale = 1 / x[1]
    return np.where(scale >= _SCALE_RANGE[1] * (1 - 1e-6), np.inf, scale)


def dispersion_test(ranks: np.ndarray, num_draws: int) -> dict[str, np.ndarray]:
    """The dispersion test of every column of ``(R, C)`` ranks.

    :param ranks: ``(R, C)`` integer ranks in ``0..num_draws`` (``R ≥ 2``).
    :param num_draws: ``L``.
    :return: ``spread_ratio`` :math:`\\hat\\rho`, and the p-values
        ``p_value`` (two-sided), ``p_value_narrow`` (one-sided, scores too
        spread out) and ``p_value_wide``, each ``(C,)``.
    """
    ranks = np.asarray(ranks)
    num = ranks.shape[0]
    grid = normal_scores(np.arange(num_draws + 1), num_draws)
    mu2, mu4 = np.mean(grid**2), np.mean(grid**4)
    s2 = np.var(normal_scores(ranks, num_draws), axis=0, ddof=1)
    var_s2 = (mu4 - mu2**2 * (num - 3) / (num - 1)) / num
    dof = 2 * mu2**2 / var_s2
    statistic = s2 * dof / mu2
    narrow = stats.chi2.sf(statistic, dof)
    wide = stats.chi2.cdf(statistic, dof)
    return {
        "spread_ratio": censored_spreads(ranks, num_draws),
        "p_value": np.minimum(1.0, 2 * np.minimum(narrow, wide)),
        "p_value_narrow": narrow,
        "p_value_wide": wide,
    }
