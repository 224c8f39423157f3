"""Predictive and calibrated variational inference for NumPyro.

Objectives that plug into :class:`numpyro.infer.SVI` as ``loss=...`` with any
autoguide, held-out scoring, and diagnostics returned in ArviZ's native
container (``xarray.DataTree`` on ArviZ ≥ 1.0, ``InferenceData`` on 0.2x).
"""

from importlib.metadata import version

from numpyro_pvi import guides, scores, selection
from numpyro_pvi.evaluation.scoring import PredictiveScore, predictive_score
from numpyro_pvi.objectives.pacm import PACmELBO
from numpyro_pvi.objectives.predictive import PredictiveELBO
from numpyro_pvi.objectives.rejection import RejectionStats
from numpyro_pvi.objectives.snis import SNISForwardKL
from numpyro_pvi.objectives.softcvi import SoftCVIELBO
from numpyro_pvi.objectives.stratified import StratifiedELBO
from numpyro_pvi.objectives.svi_scan import run_until_flat
from numpyro_pvi.recipes import FitRecipe, Replications
from numpyro_pvi.sharding import shard_data, shard_particles

__version__ = version("numpyro-pvi")

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
    "run_until_flat",
    "scores",
    "selection",
    "shard_data",
    "shard_particles",
]
