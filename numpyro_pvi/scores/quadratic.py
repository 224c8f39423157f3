"""The quadratic (Brier) score of a finite support."""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp

from numpyro_pvi._core import (
    QUADRATIC_MAX_VALUES,
    UNROLLED_SUPPORT,
    binomial_next_overlaps,
    binomial_strata_overlaps,
    binomial_support_sums,
    observation_layout,
)
from numpyro_pvi.particles import (
    BINOMIAL,
    LOG_LIK,
    PMF,
    ParticleTerms,
    particle_sum,
    present,
)
from numpyro_pvi.scores.base import Score, strata, stratum_weights
from numpyro_pvi.scores.pair_sums import stratum_sums, weighted_strata

__all__ = ["QuadraticScore"]

#: The estimators of the pair term.
ESTIMATORS = ("auto", "all-pairs", "derangement")


def _predictive_pmf(terms: ParticleTerms) -> jax.Array:
    r"""``(b,)`` :math:`\sum_j v_j f_j(y_i)`, the predictive pmf at the
    observations, summed in probability space (the score is linear in it, so
    an underflow to 0 costs nothing; no log-sum-exp pass is needed)."""
    log_lik = present(terms.log_lik, "log_lik")
    if terms.num_strata == 1:
        return particle_sum(jnp.exp(log_lik)) / log_lik.shape[0]
    k = terms.num_strata  # the strata's weights (K, b), no (K M, b) array
    totals = stratum_sums(jnp.exp(log_lik), k)
    return jnp.sum(stratum_weights(terms) * totals, axis=0) * (k / log_lik.shape[0])


def _log_overlap(overlap: jax.Array) -> jax.Array:
    """``log`` of the pmf overlaps, ``-inf`` (with a zero, not NaN,
    gradient) where they are 0; a NaN stays NaN."""
    zero = overlap == 0
    return jnp.where(zero, -jnp.inf, jnp.log(jnp.where(zero, 1.0, overlap)))


def _strata_sums(pmf: jax.Array, num_strata: int) -> tuple[jax.Array, jax.Array]:
    r"""``(S, K, b)`` per stratum the totals :math:`T_{sj} = \sum_{m \in s}
    f_m(j)` and :math:`\sum_{m \in s} f_m(j)^2` of the ``(S M, K, b)`` pmf.

    Two reductions over the particles of the whole array (slices taken one
    support value at a time each have for gradient a zero-padded copy of the
    whole array, :math:`O(K^2)` memory traffic: 26× ``Trace_ELBO`` on a
    binomial likelihood with 11 values). Two values need the second only: a
    pmf sums to one over its support, so :math:`f_m(0) = 1 - f_m(1)`,
    :math:`T_{s0} = M - T_{s1}` and :math:`\sum_m f_m(0)^2 = M - 2 T_{s1} +
    \sum_m f_m(1)^2` (sums of one ``(S M, b)`` slice).
    """
    n, k = pmf.shape[:2]
    if k == 2:
        m = n // num_strata
        f = pmf[:, 1]
        t1 = stratum_sums(f, num_strata)
        own1 = stratum_sums(jnp.square(f), num_strata)
        totals = jnp.stack([m - t1, t1], axis=1)
        return totals, jnp.stack([m - 2.0 * t1 + own1, own1], axis=1)
    return stratum_sums(pmf, num_strata), stratum_sums(jnp.square(pmf), num_strata)


def _support_sums(pmf: jax.Array) -> tuple[jax.Array, jax.Array]:
    r"""``(K, b)`` totals :math:`T_j = \sum_m f_m(j)` and ``(b,)``
    :math:`\sum_j [T_j^2 - \sum_m f_m(j)^2]` of the ``(M, K, b)`` pmf
    (:func:`_strata_sums` of one stratum)."""
    totals, own = (x[0] for x in _strata_sums(pmf, 1))
    return totals, jnp.sum(jnp.square(totals) - own, axis=0)


def binomial_closed_form(
    terms: ParticleTerms, max_size: int | None = None
) -> tuple[jax.Array, jax.Array, int] | None:
    """``(N, b)`` logits, ``(b,)`` total counts and the support's size of one
    Binomial component per observation (with ``max_size``, of at most
    ``max_size`` values): what the closed forms read instead of the ``(N,
    K, b)`` pmf; ``None`` otherwise (another likelihood, several
    components, a longer support)."""
    logits, count = terms.binomial_logits, terms.binomial_count
    support = terms.obs_support
    if logits is None or count is None or support is None:
        return None
    size = support.shape[0]
    if logits.shape[-1] != 1 or (max_size is not None and size > max_size):
        return None
    # the counts are data, the same for every particle (the support's size
    # is read from them when the program is compiled)
    return logits[..., 0], count[0, :, 0], size


def _binomial_strata(terms: ParticleTerms) -> tuple[jax.Array, jax.Array] | None:
    """:func:`_strata_sums` for one Binomial component per observation,
    from the logits and counts (no ``(M, K, b)`` pmf); ``None`` where
    :func:`binomial_closed_form` does not apply."""
    closed_form = binomial_closed_form(terms, UNROLLED_SUPPORT)
    if closed_form is None:
        return None
    logits, count, size = closed_form
    m = logits.shape[0] // terms.num_strata
    sums = [
        binomial_support_sums(logits[s * m : (s + 1) * m], count, size)
        for s in range(terms.num_strata)
    ]
    totals, own = (jnp.stack(x) for x in zip(*sums, strict=True))
    return totals, own


def _binomial_sums(terms: ParticleTerms) -> tuple[jax.Array, jax.Array] | None:
    """:func:`_support_sums` from :func:`_binomial_strata` (one stratum)."""
    strata_sums = _binomial_strata(terms)
    if strata_sums is None:
        return None
    totals, own = (x[0] for x in strata_sums)
    return totals, jnp.sum(jnp.square(totals) - own, axis=0)


def _next_overlaps(terms: ParticleTerms) -> jax.Array:
    r"""``(b,)`` the derangement's pair term :math:`M \sum_{k,l} \sum_m
    v_{km} v_{l,m+1} \langle f_{km}, f_{l,m+1} \rangle` (``m + 1`` modulo
    ``M``; one stratum: :math:`\frac1M \sum_m \langle f_m, f_{m+1}
    \rangle`), the overlaps multiplied over the components. For one Binomial
    component per observation the overlaps are in closed form
    (:func:`~numpyro_pvi._core.binomial_pairs.binomial_next_overlaps`, no
    ``(M, K, b)`` pmf)."""
    k = terms.num_strata
    closed_form = binomial_closed_form(terms)
    if closed_form is not None:
        logits, count, size = closed_form
        m = logits.shape[0] // k
        if k == 1:
            overlaps = binomial_next_overlaps(logits, count, size)
            return particle_sum(overlaps) / m
        omega = stratum_weights(terms)  # (K, b); the logits stratum-major
        b = omega.shape[-1]
        logits = jnp.broadcast_to(logits.reshape(k, m, -1), (k, m, b))
        count = jnp.broadcast_to(count, (b,))
        return binomial_strata_overlaps(logits, omega, count, size)
    v, k, m = strata(terms)
    pmf = present(terms.pmf, "pmf")  # (K M, J, b, c)
    pmf = pmf.reshape((k, m) + pmf.shape[1:])
    following = jnp.roll(pmf, -1, axis=1)
    overlap = jnp.prod(jnp.einsum("smjbc,tmjbc->stmbc", pmf, following), axis=-1)
    v = v.reshape(k, m, -1)
    weight = v[:, None] * jnp.roll(v, -1, axis=1)[None]  # (K, K, M, b)
    return m * jnp.sum(weight * overlap, axis=(0, 1, 2))


def _at_observed(totals: jax.Array, obs_support: jax.Array) -> jax.Array:
    """``(b,)`` the totals at the observed values (``obs_support`` ``(K, b)``)."""
    return jnp.sum(jnp.where(obs_support, totals, 0.0), axis=0)


def _warn_many_values(terms: ParticleTerms) -> None:
    """Warn, when the program is traced, of observations of more values than
    :data:`~numpyro_pvi._core.site_laws.QUADRATIC_MAX_VALUES`: the score is
    then nearly zero under every draw, and informs no fit."""
    values = sum(width for _, width in terms.observation_sites)
    if values > QUADRATIC_MAX_VALUES:
        warnings.warn(
            f"QuadraticScore: each observation has {values} values "
            f"({observation_layout(terms.observation_sites)}): its score is the "
            f"pmf of the one joint outcome observed, a product of {values} "
            "probabilities, nearly zero under every draw, so the score gives a "
            "fit next to no gradient and compares fits by next to nothing. Use "
            "score='log' for such observations.",
            UserWarning,
            stacklevel=2,
        )


class QuadraticScore(Score):
    r"""The quadratic (Brier) score of a forecast with finite support.

    .. math::

        S_{\rm quad}(q, y_i) = 2\, q(y_i) - \sum_{j} q(j)^2, \qquad
        q(j) = \mathbb{E}_{q_\phi(\theta)}\, p(j \mid \theta),

    (the negated Brier score plus one), for observed sites with a finite
    support (Bernoulli, Categorical, Binomial, ... via
    ``enumerate_support``), from the pmf over the support as probabilities
    (``terms.pmf``: for a Bernoulli likelihood the sigmoid of its logits, no
    logarithm). With :math:`f_m(j) = p(j \mid \theta_m)`, :math:`q(y_i)` is
    estimated by :math:`\frac{1}{M}\sum_m f_m(y_i)` (in probability space)
    and :math:`q(j)^2` by the *unbiased* pair estimate

    .. math::

        \widehat{q(j)^2} = \frac{1}{M(M-1)} \sum_{m \ne k} f_m(j)\, f_k(j)
        = \frac{(\sum_m f_m(j))^2 - \sum_m f_m(j)^2}{M(M-1)},

    not the plug-in square :math:`(\frac{1}{M}\sum_m f_m(j))^2`, whose bias
    :math:`\mathrm{Var}_q[f(j)]/M` rewards guides with a spread-out
    predictive and so makes the estimated objective improper. The estimate
    of :math:`S` is unbiased for every :math:`M \ge 2`. With one component
    per observation :math:`\frac{1}{M}\sum_m f_m(y_i)` is the support total
    :math:`\frac{1}{M}\sum_m f_m(j)` at :math:`j = y_i`, read from the same
    sums (no separate pass over the log-likelihoods).

    When one observation has several components :math:`c` (several batch
    elements of its observed sites at one index of the data plate, e.g. a
    row of Bernoulli outcomes or several observed sites) its support is the
    product of the component supports, and given :math:`\theta` the
    components are independent (NumPyro's batch semantics), so

    .. math::

        \sum_{j_1..j_c} q(j)^2 \approx \frac{1}{M(M-1)} \sum_{m\ne k}
        \prod_{l=1}^c \sum_{j} f_{m,l}(j) f_{k,l}(j),

    computed in :math:`O(M^2 b\, c K)` without enumerating the product
    support (:math:`O(M b K)` for one component). This assumes no observed
    site's distribution depends on the observed value of another.

    For one Binomial component per observation the totals
    :math:`\sum_m f_m(j)` and :math:`\sum_m f_m(j)^2` come from the
    logits and counts (``terms.binomial_logits``,
    a ratio recurrence per block of particles) instead of the
    ``(M, K, b)`` pmf: the same numbers, without writing the pmf and its
    gradient to memory.

    Under stratified sampling (mixture guides, ``M`` draws per component
    :math:`k`, :math:`v_a = \omega_{k(a)}(x_i)/M`) :math:`q(y_i) \approx
    \sum_a v_a f_a(y_i)` and the pair estimate weights :math:`\langle f_a,
    f_b\rangle` by :math:`v_a v_b`, times :math:`M/(M-1)` when :math:`a \ne
    b` are draws of one component; it stays unbiased.

    With ``estimator="derangement"`` the pair term pairs each draw with the
    next one only,

    .. math::

        \widehat{\sum_j q(j)^2} = \frac{1}{M} \sum_{m=1}^M
        \langle f_m, f_{m+1 \bmod M} \rangle,

    also unbiased for every :math:`M \ge 2` (each pair is two independent
    draws; averaged over every order of the same draws it is the all-pairs
    estimate), in :math:`O(M)` pair overlaps instead of :math:`O(M^2)` for
    several components per observation. For one Binomial component per
    observation the overlaps are in closed form,
    :math:`\langle f_a, f_b \rangle = (q_a q_b)^n \sum_k \binom{n}{k}^2
    e^{k(\ell_a + \ell_b)}` evaluated from the likelier end
    (``numpyro_pvi/_core/binomial_pairs.py``) up to 48 trials, and beyond
    by a three-term recurrence in the number of trials, whose terms are
    probabilities (``numpyro_pvi/_core/binomial_recurrence.py``): no pmf
    over the support, no transcendental function per pair, any number of
    trials. It has more variance
    than the all-pairs estimator, which averages over every pair of the same
    draws. On the benchmark's binomial regressions (``benchmarks/RESULTS.md``)
    a step takes 1.6–2.9 times ``Trace_ELBO`` (M = 8 to 64, constant or
    varying counts) against 2.0–6.0 times with all pairs, at 1.4–1.8 times
    the gradient variance: 0.8–0.85 times the all-pairs efficiency (inverse
    of gradient variance × step time) with constant counts and 1.1–1.2
    times it with varying counts, 4.3–8.2 times it with 40 trials and
    9–19 times it with 200 trials (3.0–3.2 and 5.2–7.5 times
    ``Trace_ELBO`` at M = 8 and 64, against 70–74 and 203–209 times with
    all pairs), where all pairs read the pmf
    over every support value (``benchmarks/quadratic_efficiency.py``);
    so ``estimator="auto"`` (the default) takes it where the overlaps are
    in closed form (one Binomial component per observation, with or
    without strata: the choice depends on the likelihood alone, so a fit's
    estimate and its mixtures' are the same estimator) and all pairs
    elsewhere; pass ``estimator="all-pairs"`` for the smaller variance
    (e.g. to compare fits by a held-out score with fewer draws). Other
    likelihoods take the overlaps from the pmf over the support, which for
    one Bernoulli or Categorical component is slower than the all-pairs
    sums (one pass over the pmf); there the derangement pays off with
    several components per observation, where all pairs cost
    :math:`O(M^2)`. Under stratified sampling draw :math:`m` of component
    :math:`k` is paired with draw :math:`m + 1` of every component :math:`l`,
    weighted :math:`M v_{km} v_{l,m+1}` (still a quadratic function of the
    component weights, so stacking's pair gains stay exact identities of the
    estimates).

    :param str estimator: ``"auto"`` (default; above), ``"all-pairs"`` or
        ``"derangement"``.

    **References**

    1. Lai, J. & Yao, Y. (2024). *Predictive variational inference: Learn the
       predictively optimal posterior distribution*. Table 1, row 2.
    2. Gneiting, T. & Raftery, A. E. (2007). *Strictly proper scoring rules,
       prediction, and estimation*. JASA 102(477), §3.2.
    3. Brier, G. W. (1950). *Verification of forecasts expressed in terms of
       probability*. Monthly Weather Review 78(1), 1-3.
    """

    name = "quadratic"
    requires = frozenset({LOG_LIK, PMF, BINOMIAL})
    min_particles = 2
    mixture_is_quadratic = True

    default_estimator = "auto"

    def __init__(self, *, estimator: str = default_estimator) -> None:
        if estimator not in ESTIMATORS:
            raise ValueError(
                f"QuadraticScore: estimator must be one of {ESTIMATORS}, "
                f"got {estimator!r}."
            )
        self.estimator = estimator

    def __repr__(self) -> str:
        if self.estimator == self.default_estimator:
            return "QuadraticScore()"
        return f"QuadraticScore(estimator={self.estimator!r})"

    def _derangement(self, terms: ParticleTerms) -> bool:
        """Whether the pair term is the derangement's: asked for, or
        ``"auto"`` where the Binomial overlaps are in closed form (decided
        by the likelihood alone, the same with and without strata)."""
        if self.estimator == "auto":
            return binomial_closed_form(terms) is not None
        return self.estimator == "derangement"

    def estimate(self, terms: ParticleTerms) -> jax.Array:
        if terms.pmf is None or terms.log_lik is None:
            raise ValueError(
                "score='quadratic' needs the pmf over the finite support and "
                "the log-likelihoods: request 'pmf' and 'log_lik'."
            )
        _warn_many_values(terms)
        if self._derangement(terms):
            return 2.0 * _predictive_pmf(terms) - _next_overlaps(terms)
        if terms.num_strata > 1:
            return self._stratified(terms)
        m, _, _, c = terms.pmf.shape
        if c == 1 and terms.obs_support is not None:
            # q(y_i) = T_{y_i} / M: the observed value's pmf is in the totals
            sums = _binomial_sums(terms)
            if sums is None:
                sums = _support_sums(terms.pmf[..., 0])
            totals, sum_sq = sums
            at_obs = _at_observed(totals, terms.obs_support[..., 0])
            return (2.0 * at_obs - sum_sq / (m - 1)) / m
        q_obs = _predictive_pmf(terms)  # (b,)
        if c == 1:
            sum_sq = _support_sums(terms.pmf[..., 0])[1] / (m * (m - 1))
        else:
            pmf = terms.pmf  # (M, K, b, c); padding 0
            overlap = jnp.einsum("mkbc,nkbc->mnbc", pmf, pmf)  # (M, M, b, c)
            log_overlap = _log_overlap(overlap)
            log_pair = jnp.sum(log_overlap, axis=-1)  # (M, M, b)
            off_diagonal = ~jnp.eye(m, dtype=bool)[:, :, None]
            log_pair = jnp.where(off_diagonal, log_pair, -jnp.inf)
            sum_sq = jnp.exp(
                jax.nn.logsumexp(log_pair, axis=(0, 1)) - math.log(m * (m - 1))
            )
        return 2.0 * q_obs - sum_sq

    @staticmethod
    def _stratified(terms: ParticleTerms) -> jax.Array:
        """Pairs ``a != b`` weighted ``v_a v_b``, times ``M/(M-1)`` within a
        stratum, of the overlaps ``<f_a, f_b>``."""
        v, k, m = strata(terms)
        pmf = present(terms.pmf, "pmf")  # (N, K, b, c)
        n, _, b, c = pmf.shape
        if c == 1:
            strata_sums = _binomial_strata(terms)
            if strata_sums is None:
                strata_sums = _strata_sums(pmf[..., 0], k)
            totals, total, within = weighted_strata(strata_sums, v, m)
            if terms.obs_support is not None:  # q(y_i): the observed value's total
                q_obs = _at_observed(totals, terms.obs_support[..., 0])
            else:
                q_obs = _predictive_pmf(terms)
            return 2.0 * q_obs - total - within / (m - 1)
        q_obs = _predictive_pmf(terms)
        overlap = jnp.einsum("mkbc,nkbc->mnbc", pmf, pmf)  # (N, N, b, c)
        log_overlap = _log_overlap(overlap)
        stratum = jnp.arange(n) // m
        same = stratum[:, None] == stratum[None, :]
        log_c = jnp.where(same, math.log(m / (m - 1)), 0.0)[:, :, None]
        log_pair = (
            jnp.sum(log_overlap, axis=-1)
            + log_c
            + terms.weights.log_predictive[:, None, :]
            + terms.weights.log_predictive[None, :, :]
        )  # (N, N, b)
        off_diagonal = ~jnp.eye(n, dtype=bool)[:, :, None]
        log_pair = jnp.where(off_diagonal, log_pair, -jnp.inf)
        return 2.0 * q_obs - jnp.exp(jax.nn.logsumexp(log_pair, axis=(0, 1)))
