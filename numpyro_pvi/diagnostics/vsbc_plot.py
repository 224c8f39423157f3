"""Plots of a VSBC result: histograms or ECDF differences of the p values."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from numpyro_pvi.diagnostics._containers import ADAPTER, Container, dataset
from numpyro_pvi.diagnostics._idata import component_labels

__all__ = ["plot_vsbc"]

#: Points at which the ECDF of p is compared with the uniform CDF.
_EVAL = np.linspace(0.0, 1.0, 101)


def plot_vsbc(
    idata: Container,
    kind: str = "hist",
    var_names: str | Sequence[str] | None = None,
    *,
    figsize: tuple[float, float] | None = None,
) -> np.ndarray:
    """Plot VSBC results, one panel per scalar component.

    ``kind="hist"`` draws the histogram of :math:`p` with the corrected
    p-value and direction in each title (and, above the panels, how many
    replications had not converged) (as Figures 1, 6 and 8 of Yao et al.
    2018); ``kind="ecdf"`` draws the ECDF difference of :math:`p` against the
    uniform distribution with simultaneous 94% bands (ArviZ's, Säilynoja et
    al. 2022; uniformity is what an exact posterior gives, symmetry what VSBC
    tests). On ArviZ ≥ 1.0, ``arviz_plots.plot_ecdf_pit(idata)`` draws the
    same ECDF from the ``prior_sbc`` group.

    :param idata: the result of :func:`vsbc`.
    :param kind: ``"hist"`` or ``"ecdf"``.
    :param var_names: latent site name(s) to plot; default all.
    :param figsize: figure size; default scales with the number of panels.
    :return: 1-D array of the matplotlib axes, one per component.

    **References**

    - Yao, Y., Vehtari, A., Simpson, D. & Gelman, A. (2018). *Yes, but did
      it work?: Evaluating variational inference.* ICML.
    - Säilynoja, T., Bürkner, P.-C. & Vehtari, A. (2022). *Graphical test for
      discrete uniformity and its applications in goodness-of-fit evaluation
      and multiple sample comparison.* Statistics and Computing.
    """
    import matplotlib.pyplot as plt

    if kind not in ("hist", "ecdf"):
        raise ValueError(f"`kind` must be 'hist' or 'ecdf', got {kind!r}.")
    p_values, sym, hist = (
        dataset(idata, group, "plot_vsbc", "vsbc")
        for group in ("vsbc", "vsbc_symmetry", "vsbc_histogram")
    )
    available = list(dict.fromkeys(sym["variable"].values.tolist()))
    if var_names is None:
        var_names = available
    elif isinstance(var_names, str):
        var_names = [var_names]
    unknown = [v for v in var_names if v not in available]
    if unknown:
        raise ValueError(
            f"`var_names` {unknown} are not latent sites of this VSBC run; "
            f"choose from {available}."
        )
    selected = np.isin(sym["variable"].values, list(var_names))
    labels = sym["component"].values[selected]
    n = len(labels)
    ncols = min(4, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=figsize or (3.2 * ncols, 2.6 * nrows),
        squeeze=False,
        constrained_layout=True,
    )
    axes = axes.ravel()
    for ax in axes[n:]:
        fig.delaxes(ax)
    axes = axes[:n]
    unconverged = int(sym.attrs.get("num_unconverged", 0))
    if unconverged:
        fig.suptitle(
            f"{unconverged} of {int(sym.attrs['num_simulations'])} replications had "
            "not converged: their p measure an unfinished fit",
            fontsize=9,
            color="tab:red",
        )
    p_by_label = {}
    for var in var_names:
        values = np.asarray(p_values[var])  # (chain, draw, *shape)
        columns = values.reshape(-1, math.prod(values.shape[2:])).T
        for lab, col in zip(
            component_labels(var, values.shape[2:]), columns, strict=True
        ):
            p_by_label[lab] = col
    if kind == "ecdf":
        band = ADAPTER.ecdf_band(int(sym.attrs["num_simulations"]), _EVAL, 0.94)
    edges = np.append(hist["bin_left"].values, hist["bin_right"].values[-1])
    for ax, label in zip(axes, labels, strict=True):
        row = sym.sel(component=label)
        if kind == "hist":
            ax.stairs(
                hist["count"].sel(component=label).values,
                edges,
                fill=True,
                alpha=0.7,
            )
            ax.axvline(0.5, color="k", lw=0.8, ls="--")
            ax.set_xlim(0.0, 1.0)
        else:
            _ecdf_difference(ax, p_by_label[label], band)
        ax.set_title(
            f"{label}\nsymmetry test p-value {float(row['p_value_adjusted']):.2g}: "
            f"{row['direction'].item()}",
            fontsize=9,
        )
        ax.set_xlabel("Pr_q(θ < θ*)")
    return axes


def _ecdf_difference(
    ax: Any, p: np.ndarray, band: tuple[np.ndarray, np.ndarray]
) -> None:
    """ECDF of ``p`` minus the uniform CDF, with the simultaneous band."""
    ecdf = np.searchsorted(np.sort(p), _EVAL, side="right") / p.size
    ax.fill_between(_EVAL, band[0] - _EVAL, band[1] - _EVAL, color="0.85", step="post")
    ax.step(_EVAL, ecdf - _EVAL, where="post", color="tab:blue", lw=1.2)
    ax.axhline(0.0, color="k", lw=0.6)
    ax.set_xlim(0.0, 1.0)
