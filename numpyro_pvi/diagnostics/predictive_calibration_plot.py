"""Plots of a predictive-calibration result: PIT histograms or ECDF
differences, titled with the verdicts."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from numpyro_pvi.diagnostics._containers import Container, dataset
from numpyro_pvi.diagnostics._rank_plot import plot_rank_panels, selected_components

__all__ = ["plot_predictive_calibration"]


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
