"""The CRPS: from simulations, from the pmf of a finite support, or in
closed form (``numpyro_pvi.scores.closed_forms``)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from numpyro_pvi._trace.reductions import particle_sum
from numpyro_pvi._trace.site_values import observation_layout, site_names
from numpyro_pvi._trace.terms import LIKELIHOOD, ParticleTerms, present
from numpyro_pvi.scores._sites import ordered_pmf, simulations, warn_long_support
from numpyro_pvi.scores.base import Score, strata
from numpyro_pvi.scores.closed_forms import crps_closed_form
from numpyro_pvi.scores.crps_pmf import pmf_crps
from numpyro_pvi.scores.pair_sums import (
    crps_fair,
    next_pair_score,
    pair_abs_sum,
    weighted_pair_abs_sum,
)

__all__ = ["CRPS"]

#: The estimators of the CRPS (the energy score has the first three).
ESTIMATORS = ("auto", "all-pairs", "derangement", "closed-form", "pmf")


def check_estimator(estimator: str, score: str, choices: tuple[str, ...]) -> str:
    if estimator not in choices:
        raise ValueError(
            f"{score}: estimator must be one of {choices}, got {estimator!r}."
        )
    return estimator


def derangement(
    terms: ParticleTerms,
    y_sim: jax.Array,
    y_obs: jax.Array,
    distance: Callable[[jax.Array], jax.Array],
) -> jax.Array:
    """The derangement estimator from the simulations."""
    pair = lambda a, b: distance(a - b)  # noqa: E731
    return next_pair_score(terms, distance(y_sim - y_obs), y_sim, pair)


def all_pairs(terms: ParticleTerms, x: jax.Array, y: jax.Array) -> jax.Array:
    """The fair all-pairs estimator from ``(M, b)`` scalar simulations
    (sign sums: one cheap comparison per pair)."""
    if terms.num_strata == 1:  # weights 1/M: the fair estimator
        return -crps_fair(x, y)
    v, k, m = strata(terms)
    abs_err = particle_sum(jnp.abs(x - y), v)
    # (1/2) sum_{i != j} v_i v_j |x_i - x_j| over all pairs, plus the
    # within-stratum correction (M/(M-1) - 1) (w_k/M)^2 sum_{m != m'}
    between = weighted_pair_abs_sum(x, v)
    within = jax.vmap(pair_abs_sum)(x.reshape(k, m, -1))  # (K, b)
    v_k = v.reshape(k, m, -1)[:, 0, :]  # w_k(x_i) / M
    correction = jnp.sum(jnp.square(v_k) * within, axis=0) / (m - 1)
    return -abs_err + between + correction


class CRPS(Score):
    r"""The continuous ranked probability score, negated (higher is better).

    .. math::

        S_{\rm CRPS}(q, y_i) = -\mathbb{E}_q|Y - y_i|
        + \tfrac{1}{2}\mathbb{E}_q|Y - Y'|.

    Estimators: ``"all-pairs"``, from reparameterised simulations
    :math:`x_j \sim p(y_i \mid \theta_j)`, the fair estimator [3]

    .. math::

        \widehat{S}_i = -\frac{1}{M}\sum_{j} |x_j - y_i|
        + \frac{1}{2M(M-1)} \sum_{j \ne k} |x_j - x_k|,

    unbiased for every :math:`M \ge 2` (every observed site needs a
    reparameterised sampler, or a :class:`~numpyro_pvi.distributions.Simulator`);
    ``"derangement"``, each draw paired with the next [4]; ``"closed-form"``,
    both expectations given the particles exact for the likelihoods registered
    in ``numpyro_pvi.scores.closed_forms`` (Normal, LogNormal, Normal mixtures
    [5], Poisson and negative-binomial counts [6, 7]); ``"pmf"``, the ranked
    probability score of a finite ordered support (Bernoulli, Binomial,
    ``BetaBinomial``, ``OrderedLogistic``). ``"auto"`` takes the closed form, then
    the pmf, then all pairs; a ``Categorical`` is refused (its categories need
    not be ordered). Under stratified sampling every estimator weights the draws
    by :math:`v_j` and stays unbiased. For vectors use
    :class:`~numpyro_pvi.scores.EnergyScore`.

    :param str estimator: ``"auto"`` (default), ``"all-pairs"``,
        ``"derangement"``, ``"closed-form"`` or ``"pmf"``.

    **References**

    1. Lai, J. & Yao, Y. (2024). *Predictive variational inference: Learn the
       predictively optimal posterior distribution*. arXiv:2410.14843.
    2. Gneiting, T. & Raftery, A. E. (2007). *Strictly proper scoring rules,
       prediction, and estimation*. JASA 102(477).
    3. Ferro, C. A. T. (2014). *Fair scores for ensemble forecasts*. QJRMS 140.
    4. Zamo, M. & Naveau, P. (2018). *Estimation of the continuous ranked
       probability score with limited information and applications to
       ensemble weather forecasts*. Mathematical Geosciences 50.
    5. Grimit, E. P., Gneiting, T., Berrocal, V. J. & Johnson, N. A. (2006).
       *The continuous ranked probability score for circular variables and
       its application to mesoscale forecast ensemble verification*. QJRMS 132.
    6. Wei, W. & Held, L. (2014). *Calibration tests for count data*. TEST 23.
    7. Mohamed, S., Rosca, M., Figurnov, M. & Mnih, A. (2020). *Monte Carlo
       gradient estimation in machine learning*. JMLR 21(132).
    """

    name = "crps"
    requires = frozenset({LIKELIHOOD})
    min_particles = 2
    mixture_is_quadratic = True
    default_estimator = "auto"

    def __init__(self, *, estimator: str = default_estimator) -> None:
        self.estimator = check_estimator(estimator, "CRPS", ESTIMATORS)

    def __repr__(self) -> str:
        if self.estimator == self.default_estimator:
            return "CRPS()"
        return f"CRPS(estimator={self.estimator!r})"

    def estimate(self, terms: ParticleTerms) -> jax.Array:
        auto = self.estimator == "auto"
        if self.estimator == "pmf" or (auto and ordered_pmf(terms)):
            if auto:
                warn_long_support(terms)
            return pmf_crps(terms)
        y_obs = present(terms.y_obs, "y_obs")
        if y_obs.shape[-1] != 1:
            simulations(terms)  # first, a site no estimator takes is named
            raise ValueError(
                f"score='crps' is for scalar observations, but each observation "
                f"has {y_obs.shape[-1]} values "
                f"({observation_layout(terms.observation_sites)}; a vector-valued "
                "site, several observed sites at one index of the data plate, or "
                "scalar observed sites outside any plate form one observation "
                "together). Use "
                "score='energy' (EnergyScore, the multivariate generalisation) or "
                "'log' for these observations."
            )
        if auto or self.estimator == "closed-form":
            closed = crps_closed_form(terms)
            if closed is not None:
                return closed
            if not auto:
                raise ValueError(
                    "CRPS(estimator='closed-form') needs a likelihood whose CRPS "
                    "has a closed form (Normal, LogNormal, a mixture of scalar "
                    "Normals, Poisson, negative binomial, geometric or "
                    "zero-inflated counts, possibly expanded, .to_event or "
                    "masked); use estimator='all-pairs' or 'derangement' (from "
                    "simulations) for other likelihoods (observed site(s) "
                    f"{site_names(terms.observation_sites)})."
                )
        y_sim, y_obs = simulations(terms)
        if self.estimator == "derangement":
            return derangement(terms, y_sim[..., 0], y_obs[:, 0], jnp.abs)
        return all_pairs(terms, y_sim[..., 0], y_obs[:, 0])
