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

    **From simulations** (``"all-pairs"``): reparameterised draws
    :math:`x_j \sim p(y_i \mid \theta_j)`, :math:`\theta_j \sim q_\phi`,
    and the *fair* estimator, unbiased for every :math:`M \ge 2`,

    .. math::

        \widehat{S}_i = -\frac{1}{M}\sum_{j} |x_j - y_i|
        + \frac{1}{2M(M-1)} \sum_{j \ne k} |x_j - x_k|.

    Gradients flow through the simulations, so every observed site needs a
    reparameterised sampler (``numpyro_pvi.scores.simulation``, or a
    :class:`~numpyro_pvi.distributions.Simulator` for likelihood-free
    models); no likelihood is evaluated. ``"derangement"`` pairs each draw
    with the next one only, :math:`\frac{1}{2M}\sum_j |x_j - x_{j+1}|`:
    also unbiased, :math:`O(M)`, with more variance.

    **In closed form** (``"closed-form"``): for the likelihoods of the
    registry ``numpyro_pvi.scores.closed_forms`` (Normal, LogNormal,
    Normal mixtures, Poisson, negative-binomial and geometric counts,
    zero-inflated or not) both expectations given the particles are exact
    and each particle is paired with the next: the derangement averaged
    over its simulations, unbiased with less variance.

    **From the pmf** (``"pmf"``): for a finite support of ordered values
    (Bernoulli, Binomial, ``BetaBinomial``, ``OrderedLogistic``; the ranked
    probability score), with :math:`F_j` the particles' cdfs,
    :math:`-\sum_v [\widehat{\bar F(v)^2} - 2\bar F(v)\, 1\{y_i \le v\}
    + 1\{y_i \le v\}]`, the square from distinct pairs of particles: the
    all-pairs estimate averaged over its simulations.

    ``"auto"`` (the default) takes the closed form where one is registered,
    the pmf for ordered finite supports and all pairs otherwise; a
    ``Categorical``'s categories need not be ordered, so it is refused with
    ``estimator="pmf"`` as the remedy. Under stratified sampling (mixture
    guides, ``M`` draws per component :math:`k`, :math:`v_j =
    \omega_{k(j)}/M`) each estimator weights draw :math:`j` by :math:`v_j`
    and pairs of one component by :math:`M/(M-1)`: still unbiased. For
    vector observations use :class:`~numpyro_pvi.scores.EnergyScore`.

    :param str estimator: ``"auto"`` (default), ``"all-pairs"``,
        ``"derangement"``, ``"closed-form"`` (Normal, LogNormal,
        Normal-mixture, Poisson and negative-binomial likelihoods only) or
        ``"pmf"`` (likelihoods with a finite support).

    **References**

    1. Lai, J. & Yao, Y. (2024). *Predictive variational inference: Learn the
       predictively optimal posterior distribution*. Table 1, row 3;
       appendix A.4.
    2. Gneiting, T. & Raftery, A. E. (2007). *Strictly proper scoring rules,
       prediction, and estimation*. JASA 102(477), eq. 20-21.
    3. Ferro, C. A. T. (2014). *Fair scores for ensemble forecasts*. QJRMS
       140, 1917-1923.
    4. Zamo, M. & Naveau, P. (2018). *Estimation of the continuous ranked
       probability score with limited information and applications to
       ensemble weather forecasts*. Mathematical Geosciences 50, 209-234
       (the approximate kernel representation: the derangement's pairing).
    5. Grimit, E. P., Gneiting, T., Berrocal, V. J. & Johnson, N. A. (2006).
       *The continuous ranked probability score for circular variables and
       its application to mesoscale forecast ensemble verification*. QJRMS
       132(621C), 2925-2942, eq. 5 (the CRPS of a Normal mixture).
    6. Wei, W. & Held, L. (2014). *Calibration tests for count data*. TEST
       23, 787-805 (the CRPS of a Poisson distribution).
    7. Mohamed, S., Rosca, M., Figurnov, M. & Mnih, A. (2020). *Monte Carlo
       gradient estimation in machine learning*. JMLR 21(132), §6 (the
       measure-valued derivative of a Poisson distribution).
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
