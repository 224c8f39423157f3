r"""Is an approximation too narrow or too wide? The dispersion of calibration
ranks.

A rank :math:`r \in \{0, \dots, L\}` of the true value among ``L`` draws is
turned into a normal score :math:`z = \Phi^{-1}((r + 1/2)/(L + 1))`. For a
location-scale family whose centre may be off, :math:`z` has the spread
:math:`\sigma_{\rm true} / \sigma_q`: too narrow an approximation (its
intervals under-cover, a U-shaped rank histogram) spreads the scores more
than a calibrated one, too wide a one (a hump) less. The test compares the
sample variance :math:`s^2` of the scores with its null distribution, the
ranks discrete uniform: :math:`s^2 \approx c\,\chi^2_\nu` with :math:`c, \nu`
matching its exact null mean :math:`\mu_2` and variance
:math:`(\mu_4 - \mu_2^2 (R-3)/(R-1)) / R` (Satterthwaite; :math:`\nu = R - 1`
when the scores are exactly normal). The sample variance is taken about the
sample mean, so a shift of every rank (bias, which the symmetry test reads)
does not enter.

The reading :math:`\hat\rho` estimates by what factor the approximation's
spread should grow (1: calibrated; 2: intervals half as wide as they should
be). The normal scores saturate where the true value falls outside every
draw (rank 0 or :math:`L`), so their standard deviation understates a large
:math:`\rho`; :math:`\hat\rho` is instead the maximum-likelihood scale of
a normal distribution of the exact PIT on the normal scale, each rank
:math:`r` read as the interval :math:`[\Phi^{-1}(r/(L+1)),
\Phi^{-1}((r+1)/(L+1))]` it implies: censored at the ends, nearly exact
inside (Tobit regression). It is ``inf`` when the ranks bound it from below
only (nearly all at the ends).

**References**

1. Talts, S., Betancourt, M., Simpson, D., Vehtari, A. & Gelman, A. (2018).
   *Validating Bayesian inference algorithms with simulation-based
   calibration.* arXiv:1804.06788 (U- and hump-shaped rank histograms).
2. Satterthwaite, F. E. (1946). *An approximate distribution of estimates
   of variance components.* Biometrics Bulletin 2, 110-114.
"""

from __future__ import annotations

import numpy as np
from scipy import special, stats

__all__ = [
    "TOO_NARROW",
    "TOO_WIDE",
    "censored_spread",
    "censored_spreads",
    "dispersion_test",
    "normal_scores",
]

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


def censored_spread(ranks: np.ndarray, num_draws: int) -> float:
    """:func:`censored_spreads` of one column of ranks."""
    return float(censored_spreads(np.asarray(ranks)[:, None], num_draws)[0])


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
