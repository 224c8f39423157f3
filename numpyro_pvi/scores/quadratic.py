"""The quadratic (Brier) score of a finite support."""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp

from numpyro_pvi._trace.reductions import particle_sum
from numpyro_pvi._trace.site_values import observation_layout
from numpyro_pvi._trace.terms import LIKELIHOOD, LOG_LIK, ParticleTerms, present
from numpyro_pvi.scores._pmf import UNROLLED_SUPPORT, binomial_support_sums
from numpyro_pvi.scores._sites import QUADRATIC_MAX_VALUES, support_pmf
from numpyro_pvi.scores.base import Score, strata, stratum_weights
from numpyro_pvi.scores.closed_forms.binomial import (
    binomial_next_overlaps,
    binomial_parts,
    binomial_strata_overlaps,
)
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
    whole array, :math:`O(K^2)` memory traffic). Two values need the second only: a
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


def _binomial_strata(terms: ParticleTerms) -> tuple[jax.Array, jax.Array] | None:
    """:func:`_strata_sums` for one Binomial component per observation,
    from the logits and counts (no ``(M, K, b)`` pmf); ``None`` where
    :func:`binomial_closed_form` does not apply."""
    closed_form = binomial_parts(terms, UNROLLED_SUPPORT)
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


def _next_overlaps(terms: ParticleTerms, pmf: jax.Array) -> jax.Array:
    r"""``(b,)`` the derangement's pair term :math:`M \sum_{k,l} \sum_m
    v_{km} v_{l,m+1} \langle f_{km}, f_{l,m+1} \rangle` (``m + 1`` modulo
    ``M``; one stratum: :math:`\frac1M \sum_m \langle f_m, f_{m+1}
    \rangle`), the overlaps multiplied over the components. For one Binomial
    component per observation the overlaps are in closed form
    (:func:`~numpyro_pvi.scores.closed_forms.binomial.binomial_next_overlaps`, no
    ``(M, K, b)`` pmf)."""
    k = terms.num_strata
    closed_form = binomial_parts(terms)
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
    pmf = pmf.reshape((k, m) + pmf.shape[1:])  # (K, M, J, b, c)
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
    :data:`~numpyro_pvi._trace.site_laws.QUADRATIC_MAX_VALUES`: the score is
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

    (the negated Brier score plus one) for observed sites with a finite support
    (``enumerate_support``). With :math:`f_m(j) = p(j \mid \theta_m)`,
    :math:`q(j)^2` is estimated by the unbiased pair estimate

    .. math::

        \widehat{q(j)^2} = \frac{(\sum_m f_m(j))^2 - \sum_m f_m(j)^2}{M(M-1)},

    not the plug-in square, whose bias rewards spread-out predictives and makes
    the estimated objective improper. An observation of several components
    (independent given :math:`\theta`) multiplies their overlaps
    :math:`\sum_j f_{m,l}(j) f_{k,l}(j)` without enumerating the product support.
    Stratified draws enter with their weights, still unbiased.
    ``estimator="derangement"`` pairs each draw with the next only (:math:`O(M)`,
    more variance); ``"auto"`` takes it for one Binomial component per
    observation, whose overlaps are in closed form
    (``numpyro_pvi.scores.closed_forms.binomial``), and all pairs elsewhere.

    :param str estimator: ``"auto"`` (default), ``"all-pairs"`` or
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
    requires = frozenset({LOG_LIK, LIKELIHOOD})
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
            return binomial_parts(terms) is not None
        return self.estimator == "derangement"

    def estimate(self, terms: ParticleTerms) -> jax.Array:
        pmf, support = support_pmf(terms)  # (M, K, b, c), (K, b, c)
        _warn_many_values(terms)
        if self._derangement(terms):
            return 2.0 * _predictive_pmf(terms) - _next_overlaps(terms, pmf)
        if terms.num_strata > 1:
            return self._stratified(terms, pmf, support)
        m, _, _, c = pmf.shape
        if c == 1:
            # q(y_i) = T_{y_i} / M: the observed value's pmf is in the totals
            sums = _binomial_sums(terms)
            if sums is None:
                sums = _support_sums(pmf[..., 0])
            totals, sum_sq = sums
            at_obs = _at_observed(totals, support[..., 0])
            return (2.0 * at_obs - sum_sq / (m - 1)) / m
        # several components: the pairs' overlaps (padding 0)
        q_obs = _predictive_pmf(terms)  # (b,)
        overlap = jnp.einsum("mkbc,nkbc->mnbc", pmf, pmf)  # (M, M, b, c)
        log_pair = jnp.sum(_log_overlap(overlap), axis=-1)  # (M, M, b)
        off_diagonal = ~jnp.eye(m, dtype=bool)[:, :, None]
        log_pair = jnp.where(off_diagonal, log_pair, -jnp.inf)
        log_sum_sq = jax.nn.logsumexp(log_pair, axis=(0, 1))
        sum_sq = jnp.exp(log_sum_sq - math.log(m * (m - 1)))
        return 2.0 * q_obs - sum_sq

    @staticmethod
    def _stratified(
        terms: ParticleTerms, pmf: jax.Array, support: jax.Array
    ) -> jax.Array:
        """Pairs ``a != b`` weighted ``v_a v_b``, times ``M/(M-1)`` within a
        stratum, of the overlaps ``<f_a, f_b>``."""
        v, k, m = strata(terms)
        n, _, b, c = pmf.shape  # (N, K, b, c)
        if c == 1:
            strata_sums = _binomial_strata(terms)
            if strata_sums is None:
                strata_sums = _strata_sums(pmf[..., 0], k)
            totals, total, within = weighted_strata(strata_sums, v, m)
            q_obs = _at_observed(totals, support[..., 0])  # the observed total
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
