"""Plots of a VSBC result: histograms or ECDF differences of the p values."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from numpyro_pvi.diagnostics._containers import Container, dataset
from numpyro_pvi.diagnostics._idata import component_labels
from numpyro_pvi.diagnostics._rank_plot import plot_rank_panels, selected_components

__all__ = ["plot_vsbc"]


def plot_vsbc(
    idata: Container,
    kind: str = "hist",
    var_names: str | Sequence[str] | None = None,
    *,
    figsize: tuple[float, float] | None = None,
) -> np.ndarray:
    """Plot VSBC results, one panel per scalar component.

    ``kind="hist"`` draws the histogram of :math:`p` (as Figures 1, 6 and 8
    of Yao et al. 2018) with the uniform expectation (dotted);
    ``kind="ecdf"`` draws the ECDF of :math:`p` minus the uniform CDF with
    its simultaneous band (Säilynoja et al. 2022), at the level at which the
    band agrees with the corrected uniformity p-value: the ECDF leaves the
    band, and turns red, exactly when uniformity is rejected. Every title
    gives the three verdicts of the ``vsbc_symmetry`` group — bias
    (symmetry), spread (dispersion, with ``spread_ratio``) and uniformity —
    and, above the panels, how many replications had not converged. On
    ArviZ ≥ 1.0, ``arviz_plots.plot_ecdf_pit(idata)`` draws ArviZ's ECDF of
    the same values from the ``prior_sbc`` group.

    :param idata: the result of :func:`vsbc`.
    :param kind: ``"hist"`` or ``"ecdf"``.
    :param var_names: latent site or test quantity name(s) to plot; default
        all.
    :param figsize: figure size; default scales with the number of panels.
    :return: 1-D array of the matplotlib axes, one per component.

    **References**

    - Yao, Y., Vehtari, A., Simpson, D. & Gelman, A. (2018). *Yes, but did
      it work?: Evaluating variational inference.* ICML.
    - Säilynoja, T., Bürkner, P.-C. & Vehtari, A. (2022). *Graphical test for
      discrete uniformity and its applications in goodness-of-fit evaluation
      and multiple sample comparison.* Statistics and Computing.
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
