"""Plots of a predictive-calibration result: PIT histograms or ECDF
differences, titled with the verdicts."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from numpyro_pvi.diagnostics._containers import Container, dataset
from numpyro_pvi.diagnostics._rank_plot import plot_rank_panels

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
    """
    tests, pit, histogram = (
        dataset(result, group, "plot_predictive_calibration", "predictive_calibration")
        for group in ("calibration", "calibration_pit", "calibration_histogram")
    )
    available = list(dict.fromkeys(tests["variable"].values.tolist()))
    if var_names is None:
        var_names = available
    elif isinstance(var_names, str):
        var_names = [var_names]
    unknown = [v for v in var_names if v not in available]
    if unknown:
        raise ValueError(
            f"plot_predictive_calibration: {unknown} are not observed sites of "
            f"this result; choose from {available}."
        )
    labels = [
        str(lab)
        for lab, var in zip(
            tests["component"].values, tests["variable"].values, strict=True
        )
        if var in var_names
    ]
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
