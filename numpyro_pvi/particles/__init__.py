r"""What a score or objective is computed from: the terms of ``M`` particles.

The particle machinery (:mod:`numpyro_pvi._core.particles`) draws particles
:math:`\theta_j` from the guide, replays the model against each of them and
returns a :class:`ParticleTerms`: arrays with a leading particle axis, and the
weight with which each particle enters. This module is the public side of
that exchange: the type, the names of the quantities a :class:`Score
<numpyro_pvi.scores.Score>` can request, the reductions over particles every
built-in score uses, and the :class:`StratifiedGuide` protocol through which
a guide asks for stratified draws.

**Weights are always carried.** ``M`` i.i.d. draws are one stratum, every
particle with weight :math:`1/M`. A guide that is a :class:`StratifiedGuide`
(a mixture, :class:`~numpyro_pvi.guides.AutoGaussianMixture`) is drawn from
stratum by stratum, ``M`` draws from each of its ``K`` components, particle
:math:`(k, m)` entering the predictive of observation :math:`i` with weight
:math:`v_{ki} = \omega_k(x_i)/M`. An estimator written with the weights is
correct for both; ``terms.num_strata == 1`` (a Python integer) lets it take
an unweighted fast path chosen when the program is traced.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TypeVar

from numpyro_pvi.particles.reductions import (
    expected_log_q,
    log_joint,
    log_mean_exp,
    observation_scores,
    particle_logsumexp,
    particle_sum,
    predictive_log_density,
)
from numpyro_pvi.particles.stratified import StratifiedGuide
from numpyro_pvi.particles.terms import (
    ObservationSites,
    ParticleTerms,
    Weights,
    require_iid,
)

__all__ = [
    "ObservationSites",
    "BINOMIAL",
    "FIELDS",
    "FINITE_PMF",
    "GUIDE_DRAWS",
    "LATENTS",
    "LOG_LIK",
    "LOG_PMF",
    "LOG_Q_FIXED",
    "OBSERVED",
    "OBS_WEIGHT",
    "PMF",
    "REQUESTS",
    "WHOLE_DATA",
    "Y_LOC_SCALE",
    "Y_LOG_LOC_SCALE",
    "Y_NORMAL_MIXTURE",
    "Y_POISSON",
    "Y_SIM",
    "ParticleTerms",
    "StratifiedGuide",
    "Weights",
    "expected_log_q",
    "log_joint",
    "log_mean_exp",
    "observation_scores",
    "particle_logsumexp",
    "present",
    "particle_sum",
    "predictive_log_density",
    "require_iid",
]

#: Per-observation log-likelihoods ``log_lik`` (with ``log_lik_scaled``).
LOG_LIK = "log_lik"
#: Reparameterised simulated observations ``y_sim`` (with ``y_obs``).
Y_SIM = "y_sim"
#: Location and scale of Normal likelihoods, ``y_loc`` and ``y_scale`` (with
#: ``y_obs``).
Y_LOC_SCALE = "y_loc_scale"
#: Location and scale of the logarithm of LogNormal likelihoods,
#: ``y_log_loc`` and ``y_log_scale`` (with ``y_obs``).
Y_LOG_LOC_SCALE = "y_log_loc_scale"
#: Weights, locations and scales of the components of a Normal-mixture
#: likelihood, ``y_mix_weight``, ``y_mix_loc`` and ``y_mix_scale`` (with
#: ``y_obs``).
Y_NORMAL_MIXTURE = "y_normal_mixture"
#: The rate of every observed site and one draw of its Poisson part per
#: particle, when all of them are Poisson or negative binomial (a draw of
#: its Gamma rate), possibly zero-inflated,
#: ``y_rate``, ``y_count_sim`` and the zero-inflation ``y_gate`` (with
#: ``y_obs``).
Y_POISSON = "y_poisson"
#: The log-likelihood of each observation at one simulation of it per
#: particle, ``log_lik_sim`` (``None`` where an observed site cannot be
#: simulated): how far each observation lies in each particle's predictive.
LOG_LIK_SIM = "log_lik_sim"
#: The log pmf over a finite support, ``log_pmf``.
LOG_PMF = "log_pmf"
#: The pmf over a finite support, ``pmf`` (probabilities, no logarithm).
PMF = "pmf"
#: Logits and total counts of Binomial likelihoods, ``binomial_logits`` and
#: ``binomial_count`` (with ``obs_support``).
BINOMIAL = "binomial"
#: What ``pmf`` and ``binomial`` fill, where every observed site's likelihood
#: has a finite support of ordered values (binary outcomes, counts of
#: trials, ordered categories: what the CRPS from the pmf compares), and
#: ``None`` for any other likelihood: a request that does not refuse one.
FINITE_PMF = "finite_pmf"
#: ``log q`` at the draws with their gradient stopped, ``log_q_fixed``.
LOG_Q_FIXED = "log_q_fixed"
#: The model's latent values, ``latents``.
LATENTS = "latents"
#: The per-observation weight of a score in a data-set sum,
#: ``weights.observation``.
OBS_WEIGHT = "weight"
#: The values of the guide's own sample sites, ``guide_draws``.
GUIDE_DRAWS = "guide_draws"
#: The observed values as the model computes them, ``observed``.
OBSERVED = "observed"
#: What each request fills in :class:`ParticleTerms`, beside the fields
#: every call fills (``log_prior``, ``log_q``, ``weights.particle`` and
#: ``weights.log_predictive``, ``num_strata``, ``mask``, ``entropy`` for a guide
#: that supplies it). The extractors that fill them are keyed by the same
#: requests, beside this table (``numpyro_pvi/_core/particles.py``); a
#: field no request fills is ``None``.
#:
#: =====================  ===========================================
#: request                fields
#: =====================  ===========================================
#: ``log_lik``            ``log_lik``, ``log_lik_scaled``
#: ``log_lik_sim``        ``log_lik_sim``
#: ``y_sim``              ``y_sim``, ``y_obs``
#: ``y_loc_scale``        ``y_loc``, ``y_scale``, ``y_obs``
#: ``y_log_loc_scale``    ``y_log_loc``, ``y_log_scale``, ``y_obs``
#: ``y_normal_mixture``   ``y_mix_weight``, ``y_mix_loc``,
#:                        ``y_mix_scale``, ``y_obs``
#: ``y_poisson``          ``y_rate``, ``y_gate``, ``y_count_sim``,
#:                        ``y_obs``
#: ``log_pmf``            ``log_pmf``, ``obs_support``
#: ``pmf``                ``pmf``, ``obs_support``
#: ``binomial``           ``binomial_logits``, ``binomial_count``,
#:                        ``obs_support``
#: ``finite_pmf``         ``pmf``, ``binomial_logits``,
#:                        ``binomial_count``, ``obs_support`` (or
#:                        ``None``)
#: ``log_q_fixed``        ``log_q_fixed``
#: ``latents``            ``latents``
#: ``weight``             ``weights.observation``
#: ``guide_draws``        ``guide_draws``
#: ``observed``           ``observed``
#: =====================  ===========================================
FIELDS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        LOG_LIK: ("log_lik", "log_lik_scaled"),
        LOG_LIK_SIM: ("log_lik_sim",),
        Y_SIM: ("y_sim", "y_obs"),
        Y_LOC_SCALE: ("y_loc", "y_scale", "y_obs"),
        Y_LOG_LOC_SCALE: ("y_log_loc", "y_log_scale", "y_obs"),
        Y_NORMAL_MIXTURE: ("y_mix_weight", "y_mix_loc", "y_mix_scale", "y_obs"),
        Y_POISSON: ("y_rate", "y_gate", "y_count_sim", "y_obs"),
        LOG_PMF: ("log_pmf", "obs_support"),
        PMF: ("pmf", "obs_support"),
        BINOMIAL: ("binomial_logits", "binomial_count", "obs_support"),
        FINITE_PMF: ("pmf", "binomial_logits", "binomial_count", "obs_support"),
        LOG_Q_FIXED: ("log_q_fixed",),
        LATENTS: ("latents",),
        OBS_WEIGHT: ("weights.observation",),
        GUIDE_DRAWS: ("guide_draws",),
        OBSERVED: ("observed",),
    }
)
#: Every quantity that can be requested.
REQUESTS = frozenset(FIELDS)

#: ``data_plate=WHOLE_DATA`` treats all observed sites as one observation,
#: without looking for a data plate (objectives that need only the total
#: log-likelihood: ``log_lik`` is then ``(M, 1)`` with every site scale applied).
WHOLE_DATA = "<whole data set>"


_T = TypeVar("_T")


def present(value: _T | None, field: str) -> _T:
    """``value``, a field of :class:`ParticleTerms` that a request fills
    (:data:`FIELDS`); a clear error when it was not requested.

    :param value: the field's value, e.g. ``terms.y_sim``.
    :param field: its name, for the message.
    """
    if value is None:
        requests = sorted(r for r, fields in FIELDS.items() if field in fields)
        raise ValueError(
            f"the particle terms have no {field!r}: a score that reads it must "
            f"list one of {requests} in its `requires`."
        )
    return value
