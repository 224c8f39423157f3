r"""What a score or objective is computed from: the terms of ``M`` particles.

:class:`ParticleTerms` holds arrays with a leading particle axis and the
weight with which each particle enters; with it the request names a
:class:`Score <numpyro_pvi.scores.Score>` can ask for, the reductions over
particles, and the :class:`StratifiedGuide` protocol. ``M`` i.i.d. draws are
one stratum, weights :math:`1/M`; a stratified guide's particle
:math:`(k, m)` enters observation :math:`i` with weight
:math:`v_{ki} = \omega_k(x_i)/M`. ``terms.num_strata == 1`` (a Python
integer) selects an unweighted path when the program is traced.
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
