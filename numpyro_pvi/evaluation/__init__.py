"""Held-out evaluation of a fitted guide's posterior predictive, with the
Monte Carlo error of every estimate."""

from numpyro_pvi.evaluation.scoring import PredictiveScore, predictive_score

__all__ = ["PredictiveScore", "predictive_score"]
