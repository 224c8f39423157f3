"""PSIS-LOO corrected for an approximate posterior: the array core.

Magnusson et al. (2019): with draws :math:`\\theta_s \\sim q`, the
leave-one-out importance ratios for observation :math:`i` are
:math:`p(\\theta_s, y) / (q(\\theta_s)\\, p(y_i \\mid \\theta_s))`; they are
Pareto-smoothed per observation and weight :math:`p(y_i \\mid \\theta_s)`.
The same computation as ``arviz_stats.loo_approximate_posterior`` (ArviZ ≥ 1.0),
which the ArviZ 0.2x adapter lacks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.special import logsumexp


def approximate_loo_log_weights(
    log_lik: np.ndarray,
    log_p: np.ndarray,
    log_q: np.ndarray,
    psislw: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray]:
    """Pareto-smoothed leave-one-out log weights of the draws of q.

    :param log_lik: ``(N, S)`` pointwise log-likelihood of ``S`` draws of q.
    :param log_p: ``(S,)`` log joint density :math:`\\log p(\\theta_s, y)`.
    :param log_q: ``(S,)`` log density of the approximation.
    :param psislw: Pareto smoothing of ``(N, S)`` log ratios along the last
        axis, returning normalised log weights and ``(N,)`` k̂.
    :return: ``(N, S)`` normalised log weights and ``(N,)`` k̂.
    """
    correction = log_p - log_q
    with np.errstate(invalid="ignore"):  # nan where a ratio is 0 / 0 (the caller warns)
        log_ratio = -log_lik + (correction - np.max(correction))
    log_ratio = log_ratio - np.max(log_ratio, axis=-1, keepdims=True)
    log_weight, pareto_k = psislw(log_ratio)
    return np.asarray(log_weight), np.asarray(pareto_k)


def approximate_loo_pointwise(
    log_lik: np.ndarray,
    log_p: np.ndarray,
    log_q: np.ndarray,
    psislw: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pointwise elpd, k̂ and effective number of parameters (arguments as
    :func:`approximate_loo_log_weights`).

    :return: ``elpd_i``, ``pareto_k``, ``p_loo_i``, each ``(N,)``.
    """
    log_weight, pareto_k = approximate_loo_log_weights(log_lik, log_p, log_q, psislw)
    elpd_i = logsumexp(log_weight + log_lik, axis=-1)
    lppd_i = logsumexp(log_lik, axis=-1) - np.log(log_lik.shape[-1])
    return elpd_i, pareto_k, lppd_i - elpd_i
