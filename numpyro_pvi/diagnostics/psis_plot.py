"""The plot of a :func:`~numpyro_pvi.diagnostics.psis` result: the Pareto
tail fit and k̂ against its thresholds."""

from __future__ import annotations

from typing import Any

import numpy as np

from numpyro_pvi.diagnostics._containers import ADAPTER, Container, dataset
from numpyro_pvi.diagnostics._pareto import CONSTANT_WEIGHTS, K_RELIABLE, K_THRESHOLD

__all__ = ["plot_psis"]


def plot_psis(idata: Container, *, axes: Any = None) -> np.ndarray:
    """Plot the Pareto tail fit and k̂ against its thresholds.

    Left: the largest log ratios (the fitted tail, points) with the fitted
    generalized Pareto quantiles (line, the smoothed values ArviZ's PSIS put
    in their place) and the tail cutoff. Right: k̂ with its 95% Monte Carlo
    interval on the k scale, with 0.5, ``good_k`` and 0.7 marked (0.7 once
    when ``good_k`` is 0.7).

    :param idata: the result of :func:`psis`.
    :param axes: two matplotlib axes to draw on; new ones when ``None``.
    :return: the array of the two axes.
    """
    import matplotlib.pyplot as plt

    group = dataset(idata, "psis", "plot_psis", "psis")
    sample_stats = ADAPTER.dataset(idata, "sample_stats")
    if axes is None:
        _, axes = plt.subplots(
            1, 2, figsize=(10, 3.5), width_ratios=(2, 1), layout="constrained"
        )
    axes = np.asarray(axes).reshape(-1)
    if axes.size != 2:
        raise ValueError(f"plot_psis: axes must hold 2 axes, got {axes.size}.")
    k = float(group["pareto_k"])
    good_k = float(group["good_k"])
    note = group.attrs.get("note", "")
    log_ratio = np.asarray(sample_stats["log_ratio"].values).reshape(-1)
    log_weight = np.asarray(sample_stats["log_weight"].values).reshape(-1)
    order = np.argsort(log_ratio)
    tail = int(group["tail_length"])
    ax = axes[0]
    if note == CONSTANT_WEIGHTS:
        ax.plot(np.arange(log_ratio.size), log_ratio[order], ".", ms=2)
        ax.set_title("log ratios: constant weights (no tail to fit)")
        ax.set_xlabel("draw (sorted)")
    else:
        # body draws are not smoothed: their offset maps weights to log ratios
        # (the smallest finite ratio: zero-density draws are -inf in both)
        body = order[np.isfinite(log_ratio[order])][0]
        offset = log_ratio[body] - log_weight[body]
        rank = np.arange(log_ratio.size - tail, log_ratio.size)
        tail_idx = order[-tail:]
        cutoff = log_ratio[order[-tail - 1]]
        ax.plot(rank, log_ratio[tail_idx], ".", ms=3, label="log ratio (tail)")
        fitted = np.sort(log_weight[tail_idx]) + offset
        ax.plot(rank, fitted, "-", lw=1.5, label=f"generalized Pareto, k̂ = {k:.2f}")
        ax.axhline(cutoff, color="0.5", ls=":", lw=1, label="tail cutoff")
        ax.set_title("Pareto tail of the importance ratios")
        ax.set_xlabel("draw rank (sorted log ratio)")
        ax.legend(loc="upper left", fontsize="small")
    ax.set_ylabel("log p(θ, y) − log q(θ)")

    ax = axes[1]
    lo, hi = (min(-0.5, k - 0.1), max(1.2, k + 0.1)) if np.isfinite(k) else (-0.5, 1.2)
    ax.axvline(K_RELIABLE, color="tab:green", ls="--", lw=1, label="0.5")
    ax.axvline(
        good_k, color="tab:orange", ls="--", lw=1, label=f"good_k = {good_k:.2f}"
    )
    if good_k < K_THRESHOLD:
        # good_k is 0.7 from 2154 draws on: one line, one legend entry
        ax.axvline(K_THRESHOLD, color="tab:red", ls="-", lw=1, label="0.7")
    shown = k if np.isfinite(k) else lo
    se = float(group["pareto_k_se"]) if "pareto_k_se" in group else 0.0
    if np.isfinite(k) and se > 0:
        ax.errorbar([k], [0.0], xerr=[1.96 * se], fmt="none", ecolor="k", capsize=4)
    ax.plot([shown], [0.0], "ko", ms=8, label=f"k̂ = {k:.2f}")
    ax.set_xlim(lo, hi)
    ax.set_yticks([])
    ax.set_xlabel("Pareto k")
    ax.set_title(note or "k̂")
    ax.legend(loc="upper right", fontsize="small")
    return axes
