"""Diagnostics for variational fits, returned as ArviZ ``InferenceData``.

"Yes, but did it work?" (Yao, Vehtari, Simpson & Gelman 2018): PSIS k̂ and
variational simulation-based calibration (VSBC), plus the InferenceData export
of any fitted guide and the PVI heterogeneity check of Lai & Yao (2024).
"""

__all__: list[str] = []
