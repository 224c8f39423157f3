"""Proper scoring rules estimated from guide particles.

A score turns the :class:`~numpyro_pvi._particles.ParticleTerms` of ``M``
particles into one estimate per observation of the score of the predictive
distribution :math:`q(y_i) = \\int p(y_i \\mid \\theta)\\, q(\\theta)\\, d\\theta`.
Scores are *positively oriented*: higher is better.

A user-defined score subclasses :class:`Score`, says which particle
quantities it needs in :attr:`Score.requires` and implements
:meth:`Score.estimate`; it then plugs into
:class:`~numpyro_pvi.PredictiveELBO` and :func:`~numpyro_pvi.predictive_score`
like the built-in ones.
"""

from __future__ import annotations

from typing import ClassVar

import jax

from numpyro_pvi._particles import LOG_LIK, ParticleTerms, log_mean_exp

__all__ = ["LogScore", "Score", "get_score", "register_score"]


class Score:
    """Base class of positively oriented scoring rules estimated from particles.

    Subclasses set :attr:`requires` (a subset of ``{"log_lik", "y_sim",
    "log_pmf"}``: per-observation log-likelihoods, reparameterised simulated
    observations, or the log pmf over a finite support) and implement
    :meth:`estimate`. :attr:`min_particles` is the smallest number of
    particles the estimator is defined for.
    """

    name: ClassVar[str] = "score"
    requires: ClassVar[frozenset[str]] = frozenset()
    min_particles: ClassVar[int] = 1

    def estimate(self, terms: ParticleTerms) -> jax.Array:
        """Per-observation score estimates.

        :param terms: the particle terms of ``M`` draws from the guide.
        :return: array of shape ``(b,)``, differentiable in the guide's
            parameters.
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class LogScore(Score):
    r"""The logarithmic score of the predictive distribution.

    .. math::

        S_{\log}(q, y_i) = \log q(y_i)
        \approx \log \frac{1}{M} \sum_{j=1}^M p(y_i \mid \theta_j),
        \qquad \theta_j \sim q_\phi,

    computed in log space (``logsumexp`` minus ``log M``).

    **References**

    1. Lai, J. & Yao, Y. (2024). *Predictive variational inference: Learn the
       predictively optimal posterior distribution*. Table 1, row 1.
    """

    name = "log"
    requires = frozenset({LOG_LIK})

    def estimate(self, terms: ParticleTerms) -> jax.Array:
        return log_mean_exp(terms.log_lik, axis=0)


_REGISTRY: dict[str, type[Score]] = {"log": LogScore}


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
