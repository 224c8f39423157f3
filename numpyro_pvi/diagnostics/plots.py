"""The plot of a :func:`~numpyro_pvi.diagnostics.psis` result: the Pareto
tail fit and k̂ against its thresholds."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from numpyro_pvi._arviz.containers import ADAPTER, Container, dataset
from numpyro_pvi._arviz.idata import component_labels
from numpyro_pvi.diagnostics._pareto import CONSTANT_WEIGHTS, K_RELIABLE, K_THRESHOLD
from numpyro_pvi.diagnostics.rank_tests import OK, band_level, ecdf_band, rank_positions

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


def plot_vsbc(
    idata: Container,
    kind: str = "hist",
    var_names: str | Sequence[str] | None = None,
    *,
    figsize: tuple[float, float] | None = None,
) -> np.ndarray:
    """Plot VSBC results, one panel per scalar component.

    ``kind="hist"``: the histogram of :math:`p` (as Yao et al. 2018) with the
    uniform expectation; ``kind="ecdf"``: the ECDF of :math:`p` minus the uniform
    CDF with its simultaneous band (Säilynoja et al. 2022), at the level where
    leaving the band (red) is exactly a rejected uniformity. Titles give the
    three verdicts and how many replications had not converged.

    :param idata: the result of :func:`vsbc`.
    :param kind: ``"hist"`` or ``"ecdf"``.
    :param var_names: latent site or test quantity name(s); default all.
    :param figsize: figure size; default scales with the number of panels.
    :return: 1-D array of the matplotlib axes, one per component.
    """
    if kind not in ("hist", "ecdf"):
        raise ValueError(f"`kind` must be 'hist' or 'ecdf', got {kind!r}.")
    p_values, tests, hist = (
        dataset(idata, group, "plot_vsbc", "vsbc")
        for group in ("vsbc", "vsbc_symmetry", "vsbc_histogram")
    )
    var_names, labels = selected_components(
        tests, var_names, what="latent sites or test quantities of this VSBC run"
    )
    num_draws = int(tests.attrs["num_draws"])
    ranks = {}
    for var in var_names:
        values = np.asarray(p_values[var])  # (chain, draw, *shape)
        columns = values.reshape(-1, math.prod(values.shape[2:])).T
        for lab, col in zip(
            component_labels(var, values.shape[2:]), columns, strict=True
        ):
            ranks[lab] = np.rint(col * num_draws).astype(int)
    unconverged = int(tests.attrs.get("num_unconverged", 0))
    suptitle = (
        f"{unconverged} of {int(tests.attrs['num_simulations'])} replications had "
        "not converged: their p measure an unfinished fit"
        if unconverged
        else ""
    )
    return plot_rank_panels(
        ranks,
        tests,
        hist,
        labels,
        kind=kind,
        xlabel={
            str(lab): "Pr_q(θ < θ*)" if kind_ == "parameter" else "Pr_q(f < f(θ*))"
            for lab, kind_ in zip(
                tests["component"].values, tests["kind"].values, strict=True
            )
        },
        figsize=figsize,
        suptitle=suptitle,
    )


def plot_predictive_calibration(
    result: Container,
    kind: str = "hist",
    var_names: str | Sequence[str] | None = None,
    *,
    figsize: tuple[float, float] | None = None,
) -> np.ndarray:
    """Plot the PIT of a :func:`predictive_calibration` result, one panel per
    scalar component of an observation: ``kind="hist"`` the PIT histogram
    (U-shaped: the predictive is too narrow), ``kind="ecdf"`` the ECDF
    difference with the simultaneous band at the level that agrees with the
    corrected uniformity p-value; every title gives the three verdicts of
    the ``calibration`` group.

    :param result: the result of :func:`predictive_calibration`.
    :param kind: ``"hist"`` or ``"ecdf"``.
    :param var_names: observed site name(s) to plot; default all.
    :param figsize: figure size.
    :return: 1-D array of the matplotlib axes.

    **References**

    - Säilynoja, T., Bürkner, P.-C. & Vehtari, A. (2022). *Graphical test for
      discrete uniformity and its applications in goodness-of-fit evaluation
      and multiple sample comparison.* Statistics and Computing.
    """
    tests, pit, histogram = (
        dataset(result, group, "plot_predictive_calibration", "predictive_calibration")
        for group in ("calibration", "calibration_pit", "calibration_histogram")
    )
    _, labels = selected_components(
        tests, var_names, what="observed sites of this result"
    )
    num_draws = int(tests.attrs["num_draws"])
    values = np.asarray(pit["pit"].values).reshape(-1, len(tests["component"]))
    ranks = {
        str(lab): np.rint(values[:, j] * (num_draws + 1) - 0.5).astype(int)
        for j, lab in enumerate(tests["component"].values)
    }
    return plot_rank_panels(
        ranks,
        tests,
        histogram,
        labels,
        kind=kind,
        xlabel="PIT of the held-out observation",
        figsize=figsize,
    )


def verdict_lines(row: xr.Dataset) -> str:
    """The verdicts of one component: bias (symmetry), spread (dispersion)
    and uniformity, with their corrected p-values."""
    alpha = float(row.attrs.get("alpha", 0.05))
    uniform = float(row["p_value_uniformity"])
    return (
        f"bias: {row['direction'].item()} (p={float(row['p_value_adjusted']):.2g})"
        f"; spread: {row['dispersion'].item()} "
        f"(×{float(row['spread_ratio']):.2g})\n"
        f"uniformity: {'rejected' if uniform < alpha else OK} (p={uniform:.2g})"
    )


def selected_components(
    tests: xr.Dataset, var_names: str | Sequence[str] | None, *, what: str
) -> tuple[list[str], list[str]]:
    """The variables ``var_names`` (default all) and the labels of their
    components, or an error listing the variables of the result
    (``what`` names them, e.g. ``"observed sites of this result"``)."""
    available = list(dict.fromkeys(tests["variable"].values.tolist()))
    if var_names is None:
        var_names = available
    elif isinstance(var_names, str):
        var_names = [var_names]
    unknown = [v for v in var_names if v not in available]
    if unknown:
        raise ValueError(
            f"`var_names` {unknown} are not {what}; choose from {available}."
        )
    selected = np.isin(tests["variable"].values, list(var_names))
    return list(var_names), [str(lab) for lab in tests["component"].values[selected]]


def plot_rank_panels(
    ranks: Mapping[str, np.ndarray],
    tests: xr.Dataset,
    histogram: xr.Dataset,
    labels: Sequence[str],
    *,
    kind: str,
    xlabel: str | Mapping[str, str],
    figsize: tuple[float, float] | None,
    suptitle: str = "",
) -> np.ndarray:
    """One panel per label: ``kind="hist"`` the histogram of ``p = r/L``
    with the uniform expectation, ``kind="ecdf"`` the ECDF of the ranks
    minus the null CDF with the band of :func:`band_level`; ``xlabel`` one
    label for all panels or one per label."""
    import matplotlib.pyplot as plt

    if kind not in ("hist", "ecdf"):
        raise ValueError(f"`kind` must be 'hist' or 'ecdf', got {kind!r}.")
    n = len(labels)
    ncols = min(4, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=figsize or (3.6 * ncols, 3.0 * nrows),
        squeeze=False,
        constrained_layout=True,
    )
    axes = axes.ravel()
    for ax in axes[n:]:
        fig.delaxes(ax)
    axes = axes[:n]
    if suptitle:
        fig.suptitle(suptitle, fontsize=9, color="tab:red")
    num_draws = int(tests.attrs["num_draws"])
    edges = np.append(histogram["bin_left"].values, histogram["bin_right"].values[-1])
    for ax, label in zip(axes, labels, strict=True):
        row = tests.sel(component=label)
        row.attrs = tests.attrs
        if kind == "hist":
            counts = histogram["count"].sel(component=label).values
            ax.stairs(counts, edges, fill=True, alpha=0.7)
            ax.axhline(counts.sum() / counts.size, color="k", lw=0.8, ls=":")
            ax.axvline(0.5, color="k", lw=0.8, ls="--")
            ax.set_xlim(0.0, 1.0)
        else:
            _ecdf_difference(ax, ranks[label], num_draws, row)
        ax.set_title(f"{label}\n{verdict_lines(row)}", fontsize=8)
        ax.set_xlabel(xlabel if isinstance(xlabel, str) else xlabel[label])
    return axes


def _ecdf_difference(ax: Any, ranks: np.ndarray, num_draws: int, row: Any) -> None:
    """ECDF of the rank positions minus the null CDF, with the band; the
    ECDF is red when uniformity is rejected."""
    level = band_level(row)
    band = ecdf_band(ranks.size, num_draws, level)
    u = np.sort(rank_positions(ranks, num_draws))
    ecdf = np.searchsorted(u, band.z, side="right") / ranks.size
    rejected = float(row["p_value_uniformity"]) < float(row.attrs.get("alpha", 0.05))
    ax.fill_between(
        band.z,
        band.lower - band.cdf,
        band.upper - band.cdf,
        color="0.85",
        step="mid",
        label=f"{100 * band.level:.3g}% simultaneous band",
    )
    ax.step(
        band.z,
        ecdf - band.cdf,
        where="mid",
        color="tab:red" if rejected else "tab:blue",
        lw=1.2,
    )
    ax.axhline(0.0, color="k", lw=0.6)
    ax.set_xlim(0.0, 1.0)
    ax.legend(loc="lower center", fontsize=6, frameon=False)
