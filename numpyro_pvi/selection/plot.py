"""The cross-validation curve over λ, and the stacking weights."""

from __future__ import annotations

from typing import Any

import numpy as np

from numpyro_pvi.selection.cross_validation import CrossValidation
from numpyro_pvi.selection.stacking import Stacking

__all__ = ["plot_cross_validation", "plot_stacking"]


def plot_cross_validation(cv: CrossValidation, *, axes: Any = None) -> Any:
    """Plot the held-out score of every candidate against λ, one line per
    regularizer with ±1 standard error bars; candidates without λ (VI) as
    horizontal lines with their band. With a VI candidate a second panel
    shows the paired difference to VI with its standard error, the quantity
    the one-standard-error rule reads. The selected candidate is circled.

    :param cv: the result of :func:`~numpyro_pvi.selection.cross_validate`.
    :param axes: one or two matplotlib axes (default: a new figure).
    :return: the axes.
    """
    import matplotlib.pyplot as plt

    if not isinstance(cv, CrossValidation):
        raise TypeError(
            "plot_cross_validation: expected the result of cross_validate, got "
            f"{type(cv).__name__}."
        )
    s = cv.scores
    panels = [("mean", "se", "held-out score per observation")]
    if cv.reference is not None:
        panels.append(("diff", "diff_se", f"difference to {cv.reference}"))
    if axes is None:
        _, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6))
    axes = np.atleast_1d(axes)
    lams = np.asarray(s["lam"])
    positive = lams[np.isfinite(lams) & (lams > 0)]
    for ax, (var, err, ylabel) in zip(axes, panels, strict=False):
        _draw_panel(ax, cv, var, err)
        ax.set_ylabel(ylabel)
        ax.set_xlabel("λ")
        if positive.size:
            ax.set_xscale("symlog", linthresh=float(positive.min()))
        if var == "diff":
            ax.axhline(0.0, color="0.5", lw=0.8)
    axes[0].set_title(
        f"{s.attrs['num_folds']}-fold CV, {s.attrs['score']} score: "
        f"selected {cv.best_label} ({cv.rule})"
    )
    axes[0].legend(fontsize="small")
    return axes


def _draw_panel(ax: Any, cv: CrossValidation, var: str, err: str) -> None:
    s = cv.scores
    lams, regs = np.asarray(s["lam"]), np.asarray(s["regularizer"])
    mean, se = np.asarray(s[var]), np.asarray(s[err])
    labels = list(s.candidate.values)
    zero = np.isfinite(lams) & (lams == 0)
    for reg in sorted({r for r in regs if r}):
        on = (regs == reg) | zero  # λ = 0 starts every curve
        order = np.argsort(lams[on])
        ax.errorbar(
            lams[on][order], mean[on][order], yerr=se[on][order],
            marker="o", capsize=3, label=f"PVI, {reg} regularizer",
        )  # fmt: skip
    for i in np.flatnonzero(~np.isfinite(lams)):
        line = ax.axhline(mean[i], ls="--", label=labels[i])
        ax.axhspan(mean[i] - se[i], mean[i] + se[i], color=line.get_color(), alpha=0.15)
    best = labels.index(cv.best_label)
    x = lams[best] if np.isfinite(lams[best]) else ax.get_xlim()[0]
    ax.plot([x], [mean[best]], "o", ms=14, mfc="none", mec="k", label="selected")


def plot_stacking(stacking: Stacking, *, ax: Any = None) -> Any:
    """Plot the stacking weights: one bar per candidate, its weight in the
    stacked predictive, with the stacked predictive's mean held-out score
    against the best single candidate's (and the paired standard error of
    the difference) in the title.

    :param stacking: the result of
        :func:`~numpyro_pvi.selection.stacking_weights`.
    :param ax: a matplotlib axis (default: a new figure).
    :return: the axis.
    """
    import matplotlib.pyplot as plt

    if not isinstance(stacking, Stacking):
        raise TypeError(
            "plot_stacking: expected the result of stacking_weights, got "
            f"{type(stacking).__name__}."
        )
    labels = [str(c) for c in stacking.weights["candidate"].values]
    weights = np.asarray(stacking.weights.values)
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 0.35 * len(labels) + 1.4))
    colors = ["C1" if label == stacking.single else "C0" for label in labels]
    ax.barh(labels, weights, color=colors)
    for y, w in enumerate(weights):
        ax.text(min(w, 0.85) + 0.01, y, f"{w:.2f}", va="center", fontsize="small")
    ax.invert_yaxis()
    ax.set_xlim(0.0, 1.0)
    ax.set_xlabel(f"weight in the stacked predictive ({stacking.score} score)")
    ax.set_title(
        f"stacked {stacking.mean:.4f} vs best single {stacking.single_mean:.4f} "
        f"(orange): {stacking.mean - stacking.single_mean:+.4f} ± "
        f"{stacking.se:.4f}",
        fontsize="medium",
    )
    return ax
