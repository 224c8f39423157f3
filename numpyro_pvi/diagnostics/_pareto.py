"""Pareto smoothing of one vector of importance log ratios, the NumPy core
under :func:`~numpyro_pvi.diagnostics.psis` and its readers: ArviZ's
generalized Pareto fit, with what it leaves undefined (constant ratios,
draws of zero density, tails too short to fit) decided here, and the
rounds of further draws that settle k̂.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from scipy.special import logsumexp

from numpyro_pvi._arviz.numerics import NUMERICS
from numpyro_pvi.evaluation.psis import MIN_TAIL

__all__ = [
    "CONSTANT_WEIGHTS",
    "K_RELIABLE",
    "K_THRESHOLD",
    "ParetoSmoothing",
    "pareto_smooth",
    "stable_smoothing",
]

#: k̂ above which importance sampling is unreliable at any sample size.
K_THRESHOLD = 0.7
#: k̂ below which the variational approximation itself is reliable
#: (Yao et al. 2018, Algorithm 1).
K_RELIABLE = 0.5
CONSTANT_WEIGHTS = "constant weights"


class ParetoSmoothing(NamedTuple):
    r"""The result of Pareto smoothing one vector of ``S`` log ratios.

    :ivar log_weight: ``(S,)`` smoothed, normalised log weights.
    :ivar pareto_k: the shape estimate k̂ (``-inf`` for constant weights).
    :ivar good_k: ``min(1 - 1/log10(S), 0.7)``, the sample-size dependent
        threshold of Vehtari et al. (2024).
    :ivar ess_is: importance sampling effective sample size ``1/Σ w̃²``.
    :ivar min_ss: the minimum sample size for a reliable estimate at this k̂,
        ``10^(1/(1-max(0, k̂)))`` (``inf`` for k̂ ≥ 1).
    :ivar tail_length: number of draws in the fitted tail, ArviZ's:
        ``ceil(min(S/5, 3√S))`` on ArviZ 0.2x, ``floor(3√S)`` (``floor(S/5)``
        up to 225 draws) on ArviZ ≥ 1.0.
    :ivar note: ``"constant weights"`` when the ratios are constant (an exact
        guide), otherwise ``""``.
    :ivar num_zero_density: draws with log ratio ``-inf`` (zero model
        density): weight zero, counted in ``S``.
    :ivar pareto_k_se: the Monte Carlo standard error of k̂, the asymptotic
        :math:`(1 + \hat k)/\sqrt{M}` of a generalized Pareto shape fitted to
        a tail of :math:`M` draws (across 20 keys of one fit it matched the
        spread of k̂ to 3%, ``tests``); 0 for constant weights, NaN for
        k̂ = inf.
    """

    log_weight: np.ndarray
    pareto_k: float
    good_k: float
    ess_is: float
    min_ss: float
    tail_length: int
    note: str
    num_zero_density: int = 0

    @property
    def pareto_k_se(self) -> float:
        if self.pareto_k == -math.inf:
            return 0.0
        if not math.isfinite(self.pareto_k):
            return math.nan
        return max(1.0 + self.pareto_k, 0.0) / math.sqrt(self.tail_length)


def _min_sample_size(k: float) -> float:
    r""":math:`10^{1/(1-\hat k)}` (Vehtari et al. 2024), the draws for a
    reliable estimate at this k̂: ``inf`` at k̂ ≥ 1 and where it exceeds the
    largest float (k̂ within about 0.003 of 1)."""
    exponent = 1 / (1 - max(0.0, k)) if k < 1 else math.inf
    return 10**exponent if exponent < math.log10(sys.float_info.max) else math.inf


def pareto_smooth(
    log_ratio: Any, *, constant_rtol: float | None = None
) -> ParetoSmoothing:
    r"""Pareto-smooth importance log ratios with ArviZ's PSIS (relative
    efficiency 1: the guide's draws are independent).

    Draws of log ratio ``-inf`` (zero model density) get weight zero, are
    counted in ``num_zero_density`` and stay among the ``S`` draws, as in
    :func:`numpyro.infer.psis_diagnostic`. Ratios constant to ``constant_rtol``
    (an exact guide) read k̂ = ``-inf``, uniform weights and the note
    ``"constant weights"``. Too few draws for a tail, or a failed fit, read
    k̂ = ``inf`` with the raw normalised ratios.

    :param log_ratio: ``(S,)`` log importance ratios
        :math:`\log p(\theta_s, y) - \log q(\theta_s)`.
    :param constant_rtol: relative spread below which the ratios count as
        constant; default ``sqrt`` of the float64 machine epsilon.
    :return: :class:`~numpyro_pvi.diagnostics.ParetoSmoothing`.
    """
    lr = np.asarray(log_ratio, dtype=np.float64).reshape(-1)
    num = lr.size
    if num < 2 or not np.all(np.isfinite(lr) | (lr == -np.inf)):
        raise ValueError(
            "pareto_smooth: need at least 2 log ratios, none NaN or +inf; got "
            f"{num} with {int(np.sum(~np.isfinite(lr) & (lr != -np.inf)))} invalid."
        )
    if constant_rtol is None:
        constant_rtol = math.sqrt(np.finfo(np.float64).eps)
    tail_length = NUMERICS.tail_length(num)
    good_k = min(1 - 1 / math.log10(num), K_THRESHOLD)
    finite = lr[np.isfinite(lr)]
    if finite.size == 0:
        raise ValueError(
            "pareto_smooth: every log ratio is -inf: the model gives the guide's "
            "draws zero density; check the guide's support against the model's."
        )
    num_zero = num - finite.size
    constant = np.ptp(finite) <= constant_rtol * max(1.0, float(np.max(np.abs(finite))))
    if constant and num_zero:
        # bounded weights: uniform over the draws of positive density
        log_weight = np.where(np.isfinite(lr), -math.log(finite.size), -np.inf)
        return ParetoSmoothing(
            log_weight,
            -math.inf,
            good_k,
            float(finite.size),
            10.0,
            tail_length,
            "",
            num_zero,
        )
    if constant:
        log_weight = np.full(num, -math.log(num))
        return ParetoSmoothing(
            log_weight,
            -math.inf,
            good_k,
            float(num),
            10.0,
            tail_length,
            CONSTANT_WEIGHTS,
        )
    k: Any
    if tail_length < MIN_TAIL:
        # too few draws to fit a tail (ArviZ 0.2x's convention on both
        # generations; arviz-stats refuses): k̂ = inf, raw normalised weights
        log_weight, k = np.asarray(lr - logsumexp(lr)), math.inf
    else:
        log_weight, k = NUMERICS.psislw(lr)
        # a failed fit: NaN from arviz-stats (e.g. 25 draws), inf from 0.2x
        k = math.inf if math.isnan(k) else float(k)
    ess_is = float(np.exp(-logsumexp(2 * log_weight)))
    min_ss = _min_sample_size(k)
    return ParetoSmoothing(
        np.asarray(log_weight), k, good_k, ess_is, min_ss, tail_length, "", num_zero
    )


def _settled(smooth: ParetoSmoothing) -> bool:
    """Whether the 95% interval of k̂ lies on one side of 0.5 and ``good_k``."""
    k, se = smooth.pareto_k, smooth.pareto_k_se
    if smooth.note == CONSTANT_WEIGHTS or not math.isfinite(k) or not se >= 0:
        return True
    return all(abs(k - t) > 1.96 * se for t in (K_RELIABLE, smooth.good_k))


def stable_smoothing(
    log_ratio: np.ndarray, max_draws: int, more: Callable[[int], np.ndarray]
) -> tuple[ParetoSmoothing, int]:
    """Pareto smoothing of ``log_ratio`` and batches ``more(i)`` of further
    log ratios (as many as ``log_ratio``), four times as many each round,
    until k̂ is settled or ``max_draws`` are reached."""
    eps = math.sqrt(float(jnp.finfo(jnp.result_type(float)).eps))
    ratios = [log_ratio]
    smooth = pareto_smooth(log_ratio, constant_rtol=eps)
    total, batch = log_ratio.size, 0
    while not _settled(smooth) and total * 4 <= max_draws:
        for _ in range(3 * total // log_ratio.size):
            batch += 1
            ratios.append(more(batch))
        total = sum(r.size for r in ratios)
        smooth = pareto_smooth(np.concatenate(ratios), constant_rtol=eps)
    return smooth, total
