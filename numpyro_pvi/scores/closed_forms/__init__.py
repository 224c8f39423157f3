r"""The CRPS in closed form, registered by the type of the observed site's
distribution, as :mod:`numpyro.distributions.kl` registers
``kl_divergence``: Normal, LogNormal, mixtures of Normals (both
expectations over the observations exact), Poisson, negative binomial,
geometric and zero-inflated counts (the observation term exact, each pair
from one draw). Each particle is paired with the next
(:func:`~numpyro_pvi.scores.pair_sums.next_pair_score`):

.. math::

    \widehat S_i = -\frac1M \sum_j \mathbb{E}|Y_j - y_i|
    + \frac1{2M} \sum_j \mathbb{E}|Y_j - Y_{j+1 \bmod M}|.

Adding a family is one registration (:func:`register_crps`) in its module
of this package.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
from numpyro.distributions import Distribution

from numpyro_pvi._trace.site_laws import innermost
from numpyro_pvi._trace.terms import Likelihood, ParticleTerms, present
from numpyro_pvi.scores.pair_sums import next_pair_score


class CRPSForm(NamedTuple):
    """What the CRPS of one particle reads: ``obs_term`` ``(M, b)``
    :math:`\\mathbb{E}|Y_j - y_i|`, and for its pair term the particle's
    ``draws`` (arrays with a leading particle axis) and ``pair(a, b)``,
    :math:`\\mathbb{E}|Y - Y'|` of two particles' draws, ``(M, b)``."""

    obs_term: jax.Array
    draws: Any
    pair: Callable[[Any, Any], jax.Array]


class _Entry(NamedTuple):
    applies: Callable[[Distribution], bool]
    form: Callable
    name: str


#: type -> whether the closed form applies to a distribution of it, the form
#: ``(terms, likelihood, y) -> CRPSForm`` (or the estimate itself), and what
#: the family is called in messages
_CRPS: dict[type, _Entry] = {}


def register_crps(
    *types: type,
    applies: Callable[[Distribution], bool] = lambda base: True,
    name: str = "",
) -> Callable[[Callable], Callable]:
    """Register the CRPS's closed form of the distributions ``types`` (and
    their subclasses, unless one is registered itself), where ``applies``
    says so of the distribution (a mixture of Normals, not of any family).
    The form is called with the particle terms, their
    :class:`~numpyro_pvi._trace.terms.Likelihood` (one observed site) and
    the ``(b,)`` observed values, and returns a :class:`CRPSForm` or the
    ``(b,)`` estimate; ``name`` (default: the first type's) names the
    family in messages."""

    def register(form: Callable) -> Callable:
        for t in types:
            _CRPS[t] = _Entry(applies, form, name or types[0].__name__)
        return form

    return register


def _entry(base: Distribution) -> _Entry | None:
    for cls in type(base).__mro__:
        if cls in _CRPS:
            entry = _CRPS[cls]
            return entry if entry.applies(base) else None
    return None


def crps_family(base: Distribution) -> str | None:
    """The name of the family whose CRPS has a closed form here, of a
    distribution under its wrappers; ``None`` where none has."""
    entry = _entry(innermost(base))
    return None if entry is None else entry.name


def has_crps_closed_form(base: Distribution) -> bool:
    """Whether the CRPS of a distribution (under its wrappers) has a closed
    form here."""
    return crps_family(base) is not None


def crps_closed_form(terms: ParticleTerms) -> jax.Array | None:
    """``(b,)`` the CRPS estimate in closed form, where the observation is
    one value of one site whose distribution has one; ``None`` otherwise."""
    likelihood: Likelihood | None = terms.likelihood
    if likelihood is None or len(likelihood.laws) != 1:
        return None
    entry = _entry(innermost(likelihood.laws[0]))
    if entry is None:
        return None
    y = present(terms.y_obs, "y_obs")[:, 0]
    out = entry.form(terms, likelihood, y)
    if isinstance(out, CRPSForm):
        return next_pair_score(terms, out.obs_term, out.draws, out.pair)
    return out


# the families: each module registers its own
from numpyro_pvi.scores.closed_forms import (  # noqa: E402, F401, I001
    counts,
    lognormal,
    mixture,
    normal,
)
