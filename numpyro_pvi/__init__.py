"""Predictive and calibrated variational inference for NumPyro.

Objectives that plug into :class:`numpyro.infer.SVI` as ``loss=...`` with any
autoguide, held-out scoring, and diagnostics returned in ArviZ's native
container (``xarray.DataTree`` on ArviZ ≥ 1.0, ``InferenceData`` on 0.2x).
"""

from numpyro_pvi import guides, scores, selection
from numpyro_pvi._core import RejectionStats
from numpyro_pvi.evaluation import PredictiveScore, predictive_score
from numpyro_pvi.pacm import PACmELBO
from numpyro_pvi.predictive import PredictiveELBO
from numpyro_pvi.recipes import FitRecipe, Replications
from numpyro_pvi.sharding import shard_data, shard_particles
from numpyro_pvi.snis import SNISForwardKL
from numpyro_pvi.softcvi import SoftCVIELBO
from numpyro_pvi.stratified import StratifiedELBO

__version__ = "0.2.0"

__all__ = [
    "FitRecipe",
    "PACmELBO",
    "PredictiveELBO",
    "PredictiveScore",
    "RejectionStats",
    "Replications",
    "SNISForwardKL",
    "SoftCVIELBO",
    "StratifiedELBO",
    "__version__",
    "guides",
    "predictive_score",
    "scores",
    "selection",
    "shard_data",
    "shard_particles",
]
