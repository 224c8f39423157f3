"""The CRPS, from reparameterised simulations, from the pmf of a finite
support or, for Normal, LogNormal, Normal-mixture, Poisson and
negative-binomial likelihoods, in closed form;
its estimators serve the energy score of scalar observations
(:mod:`~numpyro_pvi.scores.energy`)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from numpyro_pvi._core import observation_layout, site_names
from numpyro_pvi.particles import (
    BINOMIAL,
    FINITE_PMF,
    PMF,
    Y_LOC_SCALE,
    Y_LOG_LOC_SCALE,
    Y_NORMAL_MIXTURE,
    Y_POISSON,
    Y_SIM,
    ParticleTerms,
    particle_sum,
    present,
)
from numpyro_pvi.scores.base import Score, simulations, strata
from numpyro_pvi.scores.crps_closed_form import closed_form, has_closed_form
from numpyro_pvi.scores.crps_pmf import has_ordered_pmf, pmf_crps
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


def estimator_requests(estimator: str) -> frozenset[str]:
    """What the CRPS (and the energy score) requests with ``estimator``:
    the pmf only, or the simulations and every closed form's parameters
    (the ones the estimate does not read are dropped by XLA's dead-code
    elimination when the step is compiled), with ``"auto"`` the pmf of an
    ordered finite support as well (in place of its simulations)."""
    if estimator == "pmf":
        return frozenset({PMF, BINOMIAL})
    closed = {Y_SIM, Y_LOC_SCALE, Y_LOG_LOC_SCALE, Y_NORMAL_MIXTURE, Y_POISSON}
    return frozenset(closed | {FINITE_PMF} if estimator == "auto" else closed)


class CRPS(Score):
    r"""The continuous ranked probability score, negated (higher is better).

    .. math::

        S_{\rm CRPS}(q, y_i) = -\mathbb{E}_q|Y - y_i|
        + \tfrac{1}{2}\mathbb{E}_q|Y - Y'|,

    estimated (``estimator="all-pairs"``, the default for likelihoods other
    than Normal) from reparameterised draws :math:`y^{\rm sim}_j \sim p(y_i
    \mid \theta_j)`, :math:`\theta_j \sim q_\phi`, with the *fair*
    all-pairs estimator (unbiased for every :math:`M \ge 2`)

    .. math::

        \widehat{S}_i = -\frac{1}{M}\sum_{j=1}^M |y^{\rm sim}_j - y_i|
        + \frac{1}{2M(M-1)} \sum_{j \ne k} |y^{\rm sim}_j - y^{\rm sim}_k|,

    whose pair sum :math:`\sum_{j<k}|x_j - x_k| = \sum_j x_j \sum_k
    \mathrm{sign}(x_j - x_k)` is computed by vectorised sign sums for
    :math:`M \le 1024` (no sort: XLA's sort is slow on CPU) and from the
    order statistics, :math:`\sum_{k=1}^M (2k-M-1)\, x_{(k)}`, beyond.
    Gradients flow through the simulated observations, so every observed
    site needs a reparameterised sampler (e.g.
    :class:`~numpyro_pvi.distributions.Simulator` for likelihood-free
    models); no likelihood is evaluated. ``StudentT``, ``Gamma``,
    ``Chi2``, ``Beta`` and ``Dirichlet`` sites are simulated by an exact
    vectorised sampler of their law (Marsaglia and Tsang's, with the
    implicit reparameterisation gradient in the shape), not by
    :func:`jax.random.gamma`'s rejection loop per value: on a Student-t
    regression (``N = 5000``, one core) a step takes 5.3× ``Trace_ELBO``
    at ``M = 8`` and 12.8× at ``M = 64``, against 47× and 169×. For
    vector-valued observations or several observed sites per index use
    :class:`EnergyScore`.

    Under stratified sampling (mixture guides, ``M`` draws from each
    component :math:`k` with weight :math:`\omega_k(x_i)`) the predictive is
    :math:`\sum_k \omega_k F_k` and, with :math:`v_j = \omega_{k(j)}/M`,

    .. math::

        \widehat{S}_i = -\sum_j v_j |x_j - y_i|
        + \tfrac{1}{2} \sum_{j \ne l} v_j v_l
        \bigl(1 + \tfrac{1}{M-1}[k(j) = k(l)]\bigr) |x_j - x_l|,

    unbiased for :math:`M \ge 2` (between-component pairs are independent;
    within-component pairs use the fair :math:`1/(M(M-1))`); the weighted
    pair sum and its gradients in :math:`x` and :math:`v` come from one
    pass of weighted sign and absolute-difference sums.

    With ``estimator="derangement"`` the pair term pairs each draw with the
    next one only,

    .. math::

        \widehat{S}_i = -\frac{1}{M}\sum_{j} |y^{\rm sim}_j - y_i|
        + \frac{1}{2M} \sum_{j} |y^{\rm sim}_j - y^{\rm sim}_{j+1 \bmod M}|,

    also unbiased for every :math:`M \ge 2` (each pair is two independent
    draws), in :math:`O(M)` time and with the same simulations; it has more
    variance than the all-pairs estimator, which averages over every pair of
    the same draws. Under stratified sampling it pairs draw :math:`m` of
    component :math:`k` with draw :math:`m+1` of every component :math:`l`,
    weighted :math:`\omega_k \omega_l` (:math:`O(K^2 M)`).

    With ``estimator="closed-form"`` (Normal likelihoods
    :math:`p(y_i \mid \theta_j) = \mathcal{N}(\mu_{ij}, \sigma_{ij}^2)`)
    both expectations over :math:`y` given the particles are taken exactly,
    and each particle is paired with the next,

    .. math::

        \widehat{S}_i = -\frac{1}{M}\sum_j A(y_i - \mu_{ij}, \sigma_{ij})
        + \frac{1}{2M}\sum_j A\bigl(\mu_{ij} - \mu_{i,j+1},
        \sqrt{\sigma_{ij}^2 + \sigma_{i,j+1}^2}\bigr),

    with :math:`A(\mu, \sigma) = \mathbb{E}|X|` for :math:`X \sim
    \mathcal{N}(\mu, \sigma^2)`
    (``normal_abs_mean``): the derangement
    estimator averaged over the simulations (so unbiased for every :math:`M
    \ge 2`, with less variance), in :math:`O(M)` time with no random
    numbers. Drawing :math:`M b` normal deviates costs as much as a whole
    ``Trace_ELBO`` step on a cheap likelihood, and the pair sum as much
    again; on the benchmark GLM (M = 64) the step fell from 4.4–5.5× to
    1.65–2.25× ``Trace_ELBO`` (two threads) and the efficiency (inverse of
    gradient variance × step time) is 1.37 times the all-pairs estimator's.
    On one core it takes 2.5–2.7×, where its terms' value and gradient
    compiled alone set a floor of 1.9× (``benchmarks/crps_floor.py``) and
    the passes that evaluate its error functions and exponentials, by
    themselves, 1.53× (M = 64, 8000 observations). Its variance is that of
    the derangement: nearly all of the gradient's variance comes from the
    draws of :math:`\theta`, not from the simulations, so where the
    likelihood dominates the step (a neural network) the all-pairs
    estimator's smaller variance wins (efficiency 0.77 of it at M = 8).
    Mixture guides pair as for the derangement.

    LogNormal likelihoods, :math:`\log y_i \mid \theta_j \sim
    \mathcal{N}(\mu_{ij}, \sigma_{ij}^2)`, have the same closed-form
    estimator with the LogNormal's expectations (two error functions and an
    exponential each; ``_core/lognormal.py``): on LogNormal regressions
    (one core) 2.2–2.3× ``Trace_ELBO`` at ``M = 8`` and 3.4–3.5× at
    ``M = 64``, against 2.6–2.9× and 6.5–7.1× with all pairs of
    simulations, and 1.1–2.0 times their efficiency
    (``benchmarks/RESULTS.md``).

    Normal-mixture likelihoods, :math:`p(y_i \mid \theta_j) = \sum_c
    w_{ijc}\, \mathcal{N}(\mu_{ijc}, \sigma_{ijc}^2)` (the one observed
    site a :class:`~numpyro.distributions.MixtureSameFamily` of a ``Normal``
    or a :class:`~numpyro.distributions.MixtureGeneral` of ``Normal``
    components, as a model writes a mixture whose component is summed out),
    have no reparameterised sampler, so no estimator from simulations; their
    closed form sums :math:`A` over the ``C`` components (observation term)
    and the ``C²`` pairs of components (pair term) with the mixture weights
    (``_core/normal_mixture.py``), differentiable in the weights: on a
    regression of 10⁴ observations with two components (one core) 1.1×
    ``Trace_ELBO`` at ``M = 8`` and 2.5× at ``M = 64``
    (``benchmarks/RESULTS.md``).

    Poisson likelihoods, :math:`y_i \mid \theta_j \sim
    \mathrm{Poisson}(\lambda_{ij})`, have no reparameterised sampler
    either; their observation term is exact, :math:`G(\lambda, y) =
    \mathbb{E}|Y - y| = (y - \lambda)(2F_\lambda(y) - 1) + 2\lambda
    p_\lambda(y)` (an incomplete gamma function), and each pair of
    particles is :math:`G(\lambda_{i,j+1}, y^{\rm sim}_{ij})` with one
    draw :math:`y^{\rm sim}_{ij}` of particle :math:`j`'s count, the other
    count integrated out; the gradient in the drawn rate is the Poisson
    identity :math:`\partial_\lambda \mathbb{E} f(Y) = \mathbb{E}[f(Y + 1) -
    f(Y)]`, :math:`2F_{\lambda_{i,j+1}}(y^{\rm sim}_{ij}) - 1`
    (``_core/poisson.py``). Value and gradient are unbiased for every
    :math:`M \ge 2`; mixture guides pair as for the derangement. A
    zero-inflated Poisson (``ZeroInflatedPoisson``, zero with probability
    :math:`g`) mixes these terms with its point mass at zero. A negative
    binomial (NumPyro's ``GammaPoisson``: ``NegativeBinomial2``,
    ``NegativeBinomialProbs``, ``NegativeBinomialLogits``, and their
    zero-inflated forms) is a Poisson of a Gamma rate: each particle's rate
    is one reparameterised draw of it per observation (the implicit
    gradient in the Gamma's shape), and the terms are the Poisson's, still
    unbiased in value and gradient; a ``Geometric`` one is a Poisson of an
    exponential rate, likewise. Each term costs a Poisson cdf and pmf
    in a fixed number of operations (Temme's expansion and Loader's pmf,
    ``_core/poisson_cdf.py``, accurate in float32 at any
    count) and each pair a draw by inverting that cdf: 14–38×
    ``Trace_ELBO`` per step on a Poisson regression of 10⁴ counts, 6–14×
    on 5000 zero-inflated ones and 1.4–2.2× on a negative-binomial one
    (one core, ``benchmarks/RESULTS.md``).

    With ``estimator="pmf"`` the CRPS of a likelihood with a finite support
    of consecutive integers (Bernoulli, Binomial, Categorical read as
    ordered categories, where it is the ranked probability score, ...),
    which has no reparameterised sampler, is computed from the pmf over its
    support (the request ``pmf``, as the quadratic score reads it): with
    :math:`F_j` the particles' cdfs and :math:`\bar F` their weighted mean,

    .. math::

        \widehat{S}_i = -\sum_v \Bigl[\widehat{\bar F(v)^2}
        - 2 \bar F(v)\, 1\{y_i \le v\} + 1\{y_i \le v\}\Bigr],

    the square estimated from distinct pairs of particles,
    :math:`\frac{1}{M(M-1)} \sum_{j \ne l} F_j(v) F_l(v)` (strata weighted
    as in :class:`~numpyro_pvi.scores.QuadraticScore`): unbiased for every
    :math:`M \ge 2`, the fair all-pairs estimate from simulations averaged
    over the simulations. For one Binomial component per observation of at
    most 48 support values the cdfs' sums come from the logits and counts
    block by block of particles (``_core/pmf.py``'s ``binomial_cdf_sums``),
    without the ``(M, V, b)`` pmf. One core: 0.7–0.8× ``Trace_ELBO`` on a
    logistic regression, 2.5–4.3× on a Binomial of 10 trials (the quadratic
    score 1.9–2.6×), 15–21× on 40 trials (a term per value, particle and
    observation); from the pmf, longer supports are memory-bound: 420–940×
    on 200 trials, where the default warns and names the quadratic score
    (``benchmarks/RESULTS.md``).

    ``estimator="auto"`` (the default) is ``"closed-form"`` when every
    observed site is a :class:`~numpyro.distributions.Normal`, or every one
    a :class:`~numpyro.distributions.LogNormal`, or every one a
    :class:`~numpyro.distributions.Poisson` or negative binomial, possibly
    zero-inflated (possibly expanded, ``.to_event`` or masked), or the one
    observed site a Normal mixture; ``"pmf"`` when every observed site has
    a finite support of ordered values (Bernoulli, Binomial,
    ``BetaBinomial``, ``OrderedLogistic``, ...: none has a reparameterised
    sampler, and the pmf's estimate is the all-pairs one averaged over its
    simulations); and ``"all-pairs"`` otherwise. A ``Categorical``'s
    categories need not be ordered, so the default refuses it and names
    ``estimator="pmf"``, which reads them as ordered.
    ``benchmarks/RESULTS.md`` compares the estimators by efficiency.

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
    requires = estimator_requests("auto")
    min_particles = 2
    mixture_is_quadratic = True
    default_estimator = "auto"

    def __init__(self, *, estimator: str = default_estimator) -> None:
        self.estimator = check_estimator(estimator, "CRPS", ESTIMATORS)
        self.requires = estimator_requests(self.estimator)

    def __repr__(self) -> str:
        if self.estimator == self.default_estimator:
            return "CRPS()"
        return f"CRPS(estimator={self.estimator!r})"

    def estimate(self, terms: ParticleTerms) -> jax.Array:
        if self.estimator == "pmf" or (
            self.estimator == "auto" and has_ordered_pmf(terms)
        ):
            return pmf_crps(terms)
        exact = self.estimator == "closed-form" or (
            self.estimator == "auto" and has_closed_form(terms)
        )
        if exact and not has_closed_form(terms):
            raise ValueError(
                "CRPS(estimator='closed-form') needs a Normal likelihood at every "
                "observed site, a LogNormal or a Poisson one at every observed site "
                "(numpyro.distributions.Normal, LogNormal or Poisson, possibly "
                "expanded or .to_event) or one observed site with a mixture of "
                "scalar Normals (MixtureSameFamily or MixtureGeneral), and the "
                "request 'y_loc_scale', 'y_log_loc_scale', 'y_poisson' or "
                "'y_normal_mixture'; "
                "use estimator='all-pairs' or 'derangement' (from simulations) "
                "for other likelihoods (observed site(s) "
                f"{site_names(terms.observation_sites)})."
            )
        if exact:
            y_obs = present(terms.y_obs, "y_obs")
        else:
            y_sim, y_obs = simulations(terms, self.name)
        if y_obs.shape[-1] != 1:
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
        if exact:
            return closed_form(terms)
        if self.estimator == "derangement":
            return derangement(terms, y_sim[..., 0], y_obs[:, 0], jnp.abs)
        return all_pairs(terms, y_sim[..., 0], y_obs[:, 0])
