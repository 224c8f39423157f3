"""The objectives: each a :class:`numpyro.infer.elbo.ELBO` that plugs into
:class:`numpyro.infer.SVI` as ``loss=``."""

from numpyro_pvi.objectives.pacm import PACmELBO
from numpyro_pvi.objectives.predictive import PredictiveELBO
from numpyro_pvi.objectives.snis import SNISForwardKL
from numpyro_pvi.objectives.softcvi import SoftCVIELBO
from numpyro_pvi.objectives.stratified import StratifiedELBO

__all__ = [
    "PACmELBO",
    "PredictiveELBO",
    "SNISForwardKL",
    "SoftCVIELBO",
    "StratifiedELBO",
]
