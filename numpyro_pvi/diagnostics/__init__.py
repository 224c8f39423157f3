"""Diagnostics for variational fits, in ArviZ's native container.

``arviz.InferenceData`` on ArviZ 0.2x, ``xarray.DataTree`` with the same
groups on ArviZ ≥ 1.0.

"Yes, but did it work?" (Yao, Vehtari, Simpson & Gelman 2018): PSIS k̂ and
variational simulation-based calibration (VSBC) read for bias, dispersion and
uniformity, the calibration of a fit's posterior predictive on held-out data,
one report of a fit, plus the export of any fitted guide (with PSIS-LOO
corrected for the approximation) and the PVI heterogeneity check of Lai & Yao
(2024).
"""

from numpyro_pvi._arviz.containers import get_group
from numpyro_pvi.diagnostics._pareto import ParetoSmoothing, pareto_smooth
from numpyro_pvi.diagnostics.export import to_inference_data
from numpyro_pvi.diagnostics.heterogeneity import heterogeneity, plot_heterogeneity
from numpyro_pvi.diagnostics.loo import approximate_loo, approximate_loo_weights
from numpyro_pvi.diagnostics.plots import plot_predictive_calibration, plot_psis
from numpyro_pvi.diagnostics.predictive_calibration import predictive_calibration
from numpyro_pvi.diagnostics.psis import psis, psis_summary
from numpyro_pvi.diagnostics.report import report
from numpyro_pvi.diagnostics.resample import psis_resample
from numpyro_pvi.diagnostics.vsbc import plot_vsbc, vsbc

__all__: list[str] = [
    "ParetoSmoothing",
    "approximate_loo",
    "approximate_loo_weights",
    "get_group",
    "heterogeneity",
    "pareto_smooth",
    "predictive_calibration",
    "plot_heterogeneity",
    "plot_predictive_calibration",
    "plot_psis",
    "plot_vsbc",
    "psis",
    "psis_resample",
    "psis_summary",
    "report",
    "to_inference_data",
    "vsbc",
]
