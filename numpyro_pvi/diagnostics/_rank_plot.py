"""Panels of calibration ranks — histogram or ECDF difference with its
simultaneous band — titled with the verdicts of the three tests, so that
every panel says what the result's columns say."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from numpyro_pvi.diagnostics.rank_tests import OK, band_level
from numpyro_pvi.diagnostics.uniformity import ecdf_band, rank_positions


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
