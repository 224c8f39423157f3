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
from scipy import optimize, special, stats

__all__ = [
    "TOO_NARROW",
    "TOO_WIDE",
    "censored_spread",
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


def censored_spread(ranks: np.ndarray, num_draws: int) -> float:
    """The maximum-likelihood scale of a normal fitted to the PIT intervals
    of integer ranks (see the module's text); ``inf`` when unbounded."""
    edges = special.ndtri(np.arange(num_draws + 2) / (num_draws + 1))
    ranks = np.asarray(ranks, dtype=int)
    lo, hi = edges[ranks], edges[ranks + 1]
    mid = normal_scores(ranks, num_draws)
    upper_bound = np.log(1e3)

    def negative_log_lik(x: np.ndarray) -> tuple[float, np.ndarray]:
        loc, scale = x[0], np.exp(x[1])
        a, b = (lo - loc) / scale, (hi - loc) / scale
        log_p = _log_interval_probability(a, b)
        # d log(Φ(b) - Φ(a)) / d(a, b) = (-φ(a), φ(b)) / (Φ(b) - Φ(a))
        d_a = -np.exp(_log_normal_density(a) - log_p)
        d_b = np.exp(_log_normal_density(b) - log_p)
        d_loc = -(d_a + d_b) / scale
        d_log_scale = -(_times(a, d_a) + _times(b, d_b))
        return -np.sum(log_p), -np.array([np.sum(d_loc), np.sum(d_log_scale)])

    start = np.array([mid.mean(), np.log(max(mid.std(ddof=1), 1e-3))])
    fit = optimize.minimize(
        negative_log_lik,
        start,
        jac=True,
        method="L-BFGS-B",
        bounds=[(-50.0, 50.0), (np.log(1e-3), upper_bound)],
    )
    if fit.x[1] >= upper_bound - 1e-6:
        return np.inf
    return float(np.exp(fit.x[1]))


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
        "spread_ratio": np.array(
            [censored_spread(column, num_draws) for column in ranks.T]
        ),
        "p_value": np.minimum(1.0, 2 * np.minimum(narrow, wide)),
        "p_value_narrow": narrow,
        "p_value_wide": wide,
    }
