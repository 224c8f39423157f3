r"""What a score or objective is computed from: the terms of ``M`` particles.

The particle machinery (:mod:`numpyro_pvi._trace.particles`) draws particles
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

from numpyro_pvi._trace.data_plate import WHOLE_DATA
from numpyro_pvi._trace.reductions import (
    log_mean_exp,
    observation_scores,
    particle_logsumexp,
    particle_sum,
    predictive_log_density,
)
from numpyro_pvi._trace.terms import (
    LIKELIHOOD,
    LOG_LIK,
    Likelihood,
    ObservationSites,
    ParticleTerms,
    Weights,
    present,
    require_iid,
)
from numpyro_pvi._trace.tracing import StratifiedGuide

__all__ = [
    "LIKELIHOOD",
    "LOG_LIK",
    "WHOLE_DATA",
    "Likelihood",
    "ObservationSites",
    "ParticleTerms",
    "StratifiedGuide",
    "Weights",
    "log_mean_exp",
    "observation_scores",
    "particle_logsumexp",
    "particle_sum",
    "predictive_log_density",
    "present",
    "require_iid",
]
