"""Proper scoring rules estimated from guide particles.

A score turns the :class:`~numpyro_pvi.particles.ParticleTerms` of ``M``
particles into one estimate per observation of the score of the predictive
distribution :math:`q(y_i) = \\int p(y_i \\mid \\theta)\\, q(\\theta)\\, d\\theta`.
Scores are *positively oriented*: higher is better.

A user-defined score subclasses :class:`Score`, says which particle
quantities it needs in :attr:`Score.requires` and implements
:meth:`Score.estimate`; it then plugs into
:class:`~numpyro_pvi.PredictiveELBO` and :func:`~numpyro_pvi.predictive_score`
like the built-in ones.

==================  ======================  ==========================
name                class                   needs from the model
==================  ======================  ==========================
``"log"``           :class:`LogScore`       log-likelihoods
``"crps"``          :class:`CRPS`           reparameterised simulations
``"energy"``        :class:`EnergyScore`    reparameterised simulations
``"quadratic"``     :class:`QuadraticScore` a finite support (pmf)
``"brier"``         :class:`QuadraticScore` a finite support (pmf)
==================  ======================  ==========================
"""

from __future__ import annotations

from numpyro_pvi.scores._sites import simulations, support_pmf
from numpyro_pvi.scores.base import LogScore, Score
from numpyro_pvi.scores.crps import CRPS
from numpyro_pvi.scores.energy import EnergyScore
from numpyro_pvi.scores.pair_sums import crps_fair
from numpyro_pvi.scores.quadratic import QuadraticScore

__all__ = [
    "CRPS",
    "EnergyScore",
    "LogScore",
    "QuadraticScore",
    "Score",
    "crps_fair",
    "get_score",
    "register_score",
    "simulations",
    "support_pmf",
]


_REGISTRY: dict[str, type[Score]] = {
    "log": LogScore,
    "crps": CRPS,
    "energy": EnergyScore,
    "quadratic": QuadraticScore,
    "brier": QuadraticScore,
}


def register_score(name: str, cls: type[Score]) -> None:
    """Make ``score=name`` build ``cls()``.

    :param name: the string users pass as ``score``.
    :param cls: a :class:`Score` subclass constructible without arguments.
    """
    if not (isinstance(cls, type) and issubclass(cls, Score)):
        raise TypeError(f"register_score: {cls!r} is not a Score subclass.")
    _REGISTRY[name.lower()] = cls


def get_score(score: str | Score) -> Score:
    """Resolve a score name or instance.

    :param score: a :class:`Score` instance or one of the registered names.
    :return: a :class:`Score` instance.
    """
    if isinstance(score, Score):
        return score
    if isinstance(score, str) and score.lower() in _REGISTRY:
        return _REGISTRY[score.lower()]()
    raise ValueError(
        f"Unknown score {score!r}: use one of {sorted(_REGISTRY)} or a "
        "numpyro_pvi.scores.Score instance."
    )
