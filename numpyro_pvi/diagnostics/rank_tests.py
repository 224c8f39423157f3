"""The three readings of calibration ranks, as the groups of a result.

Shared by :func:`~numpyro_pvi.diagnostics.vsbc` (ranks of the true
parameters and test quantities among the guide's draws) and
:func:`~numpyro_pvi.diagnostics.predictive_calibration` (ranks of held-out
observations among posterior-predictive draws): the symmetry test
(``direction``: bias), the dispersion test (``dispersion``: too narrow or
too wide) and the simultaneous ECDF band test (``p_value_uniformity``: any
departure from uniformity), each corrected for multiplicity over the
components, and the histogram of the ranks.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import xarray as xr

from numpyro_pvi.diagnostics.dispersion import TOO_NARROW, TOO_WIDE, dispersion_test
from numpyro_pvi.diagnostics.symmetry import adjust_p_values, symmetry_test
from numpyro_pvi.diagnostics.uniformity import uniformity_test

OK = "ok"

_DESCRIPTION = {
    "symmetry": "Kolmogorov-Smirnov statistic of p against 1 - p; exact "
    "p-values under symmetry of p about 1/2 (sign-flip null)",
    "dispersion": "variance of the normal scores of the ranks against its null "
    "distribution (Satterthwaite chi-square); 'too narrow' = intervals "
    "under-cover (U-shaped histogram)",
    "uniformity": "simultaneous ECDF band test (Saeilynoja, Buerkner & Vehtari "
    "2022), exact p-values",
}


def _num_bins(num: int) -> int:
    return int(np.clip(math.ceil(math.sqrt(num)), 5, 20))


def _dispersion(
    ranks: np.ndarray, num_draws: int, correction: str | None, alpha: float
):
    test = dispersion_test(ranks, num_draws)
    adjusted = adjust_p_values(test["p_value"], correction)
    verdict = np.where(
        adjusted >= alpha,
        OK,
        np.where(test["p_value_narrow"] <= test["p_value_wide"], TOO_NARROW, TOO_WIDE),
    )
    return {
        "dispersion": verdict.astype(str),
        "p_value_dispersion": adjusted,
        "spread_ratio": test["spread_ratio"],
    }


def rank_datasets(
    ranks: np.ndarray,
    num_draws: int,
    component: dict[str, Any],
    *,
    correction: str | None,
    alpha: float,
) -> tuple[xr.Dataset, xr.Dataset]:
    """The tests and the histogram of ``(R, C)`` ranks in ``0..num_draws``.

    :return: ``(tests, histogram)``: per ``component``, the symmetry test's
        variables (``ks_statistic``, ``p_value``, ``p_value_adjusted``,
        ``p_value_over``, ``p_value_under``, ``direction``), ``dispersion``,
        ``p_value_dispersion`` (corrected), ``spread_ratio``,
        ``p_value_uniformity`` (corrected), ``p_value_uniformity_unadjusted``
        and ``num_extreme`` (ranks 0 or ``L``); the histogram's ``count``
        per component and ``bin``.
    """
    num = ranks.shape[0]
    symmetry = symmetry_test(ranks, num_draws, correction, alpha)
    uniform = uniformity_test(ranks, num_draws)
    extreme = np.sum((ranks == 0) | (ranks == num_draws), axis=0)
    tests = xr.Dataset(
        {
            **{k: ("component", v) for k, v in symmetry.items()},
            **{
                k: ("component", v)
                for k, v in _dispersion(ranks, num_draws, correction, alpha).items()
            },
            "p_value_uniformity": (
                "component",
                adjust_p_values(uniform, correction),
            ),
            "p_value_uniformity_unadjusted": ("component", uniform),
            "num_extreme": ("component", extreme),
        },
        coords=component,
        attrs={
            "test": _DESCRIPTION["symmetry"],
            "dispersion_test": _DESCRIPTION["dispersion"],
            "uniformity_test": _DESCRIPTION["uniformity"],
            "correction": str(correction),
            "alpha": alpha,
            "num_simulations": num,
            "num_draws": num_draws,
        },
    )
    p = ranks / num_draws
    num_bins = _num_bins(num)
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    counts = np.stack([np.histogram(p[:, j], bins=edges)[0] for j in range(p.shape[1])])
    histogram = xr.Dataset(
        {"count": (("component", "bin"), counts)},
        coords={
            **component,
            "bin": np.arange(num_bins),
            "bin_left": ("bin", edges[:-1]),
            "bin_right": ("bin", edges[1:]),
        },
    )
    return tests, histogram


def band_level(row: xr.Dataset) -> float:
    """The simultaneous coverage of the band drawn for one component: the
    ECDF leaves it exactly when the corrected uniformity p-value is below
    ``alpha`` (the level ``1 - alpha`` scaled by the correction's factor
    for this component)."""
    alpha = float(row.attrs.get("alpha", 0.05))
    raw = float(row["p_value_uniformity_unadjusted"])
    adjusted = float(row["p_value_uniformity"])
    factor = adjusted / raw if raw > 0 and adjusted > 0 else 1.0
    return 1.0 - alpha / max(factor, 1.0)
