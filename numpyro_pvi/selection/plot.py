"""The cross-validation curve over λ."""

from __future__ import annotations

from typing import Any

import numpy as np

from numpyro_pvi.selection.cross_validation import CrossValidation

__all__ = ["plot_cross_validation"]


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
