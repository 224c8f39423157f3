"""What a score reads of the observed sites beyond their log density, from
the particle terms' :class:`~numpyro_pvi._trace.terms.Likelihood`:
simulations, the pmf over a finite support, and, for a refusal, which
scores apply to a site (the closed forms' registry says where the CRPS has
one)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from numpyro.distributions import CategoricalLogits, CategoricalProbs, OrderedLogistic

from numpyro_pvi._trace.site_laws import COUNTS, describe, innermost, is_censored
from numpyro_pvi._trace.site_values import observation_widths
from numpyro_pvi._trace.terms import Likelihood, ParticleTerms, present
from numpyro_pvi.scores._support import check_pmf_size, observed_support, site_pmf
from numpyro_pvi.scores._support import warn_long_support as long_support_warning
from numpyro_pvi.scores.closed_forms import crps_family, has_crps_closed_form
from numpyro_pvi.scores.simulation import simulated_values

#: The most values of one observation for which the quadratic score informs
#: a fit: beyond, the pmf of the one joint outcome observed (a product of as
#: many probabilities) is nearly zero under every draw, and the score's
#: gradient with it (a 64-pixel binary image: none to speak of).
QUADRATIC_MAX_VALUES = 16


def working_scores(site: dict[str, Any]) -> list[str]:
    """The built-in scores that apply to an observed site's likelihood: the
    log score where it has a density, the CRPS (scalar components) and the
    energy score where it has a reparameterised sampler (the CRPS also
    where it has a closed form or an ordered finite support), the quadratic
    score where its support is finite."""
    fn, base = site["fn"], innermost(site["fn"])
    names = [] if getattr(base, "likelihood_free", False) else ["log"]
    if is_censored(fn):
        return names
    if fn.has_rsample:
        names += ["crps", "energy"] if base.event_dim == 0 else ["energy"]
    elif has_crps_closed_form(base) or (base.event_dim == 0 and ordered_support(site)):
        names.append("crps")
    if _finite(site):
        names.append("quadratic")
    return names


def _finite(site: dict[str, Any]) -> bool:
    """Whether a site's likelihood has a finite support to enumerate."""
    fn, base = site["fn"], innermost(site["fn"])
    return getattr(fn, "has_enumerate_support", False) and (
        isinstance(base, COUNTS) or _enumerates(base)
    )


def _enumerates(base: Any) -> bool:
    try:
        base.enumerate_support(expand=False)
    except NotImplementedError:
        return False
    except Exception:  # noqa: BLE001 - traced parameters: it has a support
        return True
    return True


def ordered_support(site: dict[str, Any]) -> bool:
    """Whether an observed site's likelihood has a finite support of
    ordered values (the CRPS from the pmf is then the ranked probability
    score): every finite support but a ``Categorical``'s, whose categories
    need not be ordered, and none of a censored likelihood."""
    base = innermost(site["fn"])
    nominal = isinstance(base, (CategoricalLogits, CategoricalProbs))
    if nominal and not isinstance(base, OrderedLogistic):
        return False
    return not is_censored(site["fn"]) and _finite(site)


def score_advice(
    site: dict[str, Any], values: int, together: Sequence[dict[str, Any]] = ()
) -> str:
    """Which scores work for the site's likelihood and an observation of
    ``values`` values (the CRPS for one, the quadratic score up to
    :data:`QUADRATIC_MAX_VALUES`), together with the other observed sites
    of the observation, for a refusal."""
    names = [n for n in working_scores(site) if values == 1 or n != "crps"]
    if values > QUADRATIC_MAX_VALUES:
        names = [n for n in names if n != "quadratic"]
    others = [s for s in together if s["name"] != site["name"]]
    for other in others:
        names = [n for n in names if n in working_scores(other)]
    subject = "this likelihood"
    if others:
        listed_sites = ", ".join(f"'{s['name']}'" for s in others)
        subject = f"this likelihood together with {listed_sites}"
    if not names:
        return f"No built-in score applies to {subject}."
    listed = ", ".join(repr(n) for n in names[:-1])
    listed = f"{listed} or {names[-1]!r}" if listed else repr(names[0])
    if values == 1 and "quadratic" in names and "crps" not in names:
        return (
            f"Use score={listed} for {subject}, or, if its categories "
            "are ordered, score=CRPS(estimator='pmf') for its CRPS from the "
            "pmf (the ranked probability score)."
        )
    return f"Use score={listed} for {subject}."


@dataclass(frozen=True)
class Advice:
    """The advice of a refusal at an observed site of an observation of
    ``values`` values and observed sites ``sites`` (:func:`score_advice`)."""

    values: int
    sites: tuple[dict[str, Any], ...] = ()

    def __call__(self, site: dict[str, Any]) -> str:
        return score_advice(site, self.values, self.sites)


def observation_advice(observed: list[dict[str, Any]], plate: Any) -> Advice:
    """The advice of a refusal at one of the observed sites of an
    observation."""
    widths = observation_widths(observed, plate)
    return Advice(sum(width for _, width in widths), tuple(observed))


#: The remedies where the CRPS of a scalar observation needs no simulation.
CLOSED_FORM_REMEDY = (
    "Use the CRPS in closed form (score='crps', estimator 'auto' or "
    "'closed-form'; EnergyScore(beta=1.0) on scalar observations is the "
    "same), or score='log'."
)
PMF_REMEDY = (
    "Use the CRPS from the pmf (score='crps', estimator 'auto' or 'pmf'; "
    "EnergyScore(beta=1.0) on scalar observations is the same), "
    "score='quadratic' or score='log'."
)


def _blame(
    refused: list[tuple[dict[str, Any], str]],
    observed: list[dict[str, Any]],
    plate: Any,
) -> str:
    """The refusal of simulations: the site that the fewest scores take
    (the cause, where several cannot be simulated), why, and what to do."""
    site, why = min(refused, key=lambda r: len(working_scores(r[0])))
    advice = observation_advice(observed, plate)
    family = crps_family(site["fn"])
    if advice.values == 1 and family is not None:
        return (
            "This estimator compares simulated observations with the observed "
            f"ones, and the {family} of observed site '{site['name']}' "
            f"({describe(site['fn'])}) has no reparameterised sampler. "
            f"{CLOSED_FORM_REMEDY}"
        )
    if advice.values == 1 and ordered_support(site):
        return f"{why} {PMF_REMEDY}"
    return f"{why} {advice(site)}"


def simulations(terms: ParticleTerms) -> tuple[jax.Array, jax.Array]:
    """``(M, b, d)`` one simulation of every observation per particle and
    ``(b, d)`` the observed values, as floating-point arrays:
    reparameterised in the draws where the objective differentiates them
    (a site without such a sampler is refused, naming what works for it).

    :param terms: particle terms with the request ``"likelihood"``.
    """
    likelihood = present(terms.likelihood, "likelihood")
    plate = likelihood.plate

    def draw(sites: list, key: jax.Array) -> jax.Array:
        def blame(refused: list) -> str:
            return _blame(refused, sites, plate)

        return simulated_values(sites, plate, key, likelihood.reparam, blame)

    y_sim = likelihood.per_particle(draw)
    y_obs = present(terms.y_obs, "y_obs")
    dtype = jnp.result_type(y_sim, y_obs, float)
    return y_sim.astype(dtype), y_obs.astype(dtype)


def _first(likelihood: Likelihood) -> list[dict[str, Any]]:
    """The observed sites at the first particle: shapes, supports, masks."""
    return likelihood.sites()


def support_pmf(terms: ParticleTerms) -> tuple[jax.Array, jax.Array]:
    """``(M, V, b, c)`` the pmf over the finite support of every scalar
    component ``c`` of each observation (``V`` values, ``0`` padding
    shorter supports; a masked component a point mass at the first value)
    and ``(V, b, c)`` whether the observed component equals each value.
    A site without a finite support is refused, naming what works for it;
    a pmf too large for the device's memory likewise.

    :param terms: particle terms with the request ``"likelihood"``.
    """
    likelihood = present(terms.likelihood, "likelihood")
    plate, sites = likelihood.plate, _first(likelihood)
    advice = observation_advice(sites, plate)
    check_pmf_size(sites, plate, likelihood.keys.shape[0])
    pmf = likelihood.per_particle(lambda s, _: site_pmf(s, plate, advice))
    if isinstance(pmf, tuple):  # short supports: the values after the particles
        pmf = jnp.stack(pmf, axis=1)
    support = observed_support(sites, plate, advice)
    if likelihood.index is not None:
        support = jnp.take(support, likelihood.index, axis=1)
    return pmf, support


def ordered_pmf(terms: ParticleTerms) -> bool:
    """Whether every observed site of the terms has a finite support of
    ordered values (where the CRPS by default is the one from the pmf)."""
    likelihood = terms.likelihood
    if likelihood is None or not likelihood.laws:
        return False
    return all(ordered_support(s) for s in _first(likelihood))


def warn_long_support(terms: ParticleTerms) -> None:
    """Warn where the CRPS from the pmf, the default for an ordered finite
    support, sums over a long support (:func:`~numpyro_pvi.scores._support.
    warn_long_support`)."""
    likelihood = present(terms.likelihood, "likelihood")
    long_support_warning(_first(likelihood), likelihood.plate)
