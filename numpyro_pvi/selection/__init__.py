"""Choosing among objectives: K-fold cross-validation of the held-out
predictive score, e.g. of PVI's regularizer and λ against VI."""

from numpyro_pvi.selection._candidates import default_candidates
from numpyro_pvi.selection._folds import mask_observations
from numpyro_pvi.selection.cross_validation import CrossValidation, cross_validate
from numpyro_pvi.selection.plot import plot_cross_validation, plot_stacking
from numpyro_pvi.selection.stacking import (
    StackedFit,
    StackedGuide,
    Stacking,
    stack,
    stacking_weights,
)

__all__ = [
    "CrossValidation",
    "StackedFit",
    "StackedGuide",
    "Stacking",
    "cross_validate",
    "default_candidates",
    "mask_observations",
    "plot_cross_validation",
    "plot_stacking",
    "stack",
    "stacking_weights",
]
