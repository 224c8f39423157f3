"""What an observed site's likelihood is, under NumPyro's wrappers, and
which scores apply to it: its family (:func:`innermost`, :func:`describe`),
censoring, why it cannot be simulated, and the advice a refusal gives
(:func:`working_scores`, :func:`score_advice`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax import random
from numpyro.distributions import (
    BetaBinomial,
    BinomialLogits,
    BinomialProbs,
    CategoricalLogits,
    CategoricalProbs,
    Distribution,
    ExpandedDistribution,
    GammaPoisson,
    GeometricLogits,
    GeometricProbs,
    Independent,
    IntervalCensoredDistribution,
    LeftCensoredDistribution,
    MaskedDistribution,
    MixtureGeneral,
    MixtureSameFamily,
    Normal,
    OrderedLogistic,
    Poisson,
    RightCensoredDistribution,
    TransformedDistribution,
    Unit,
    ZeroInflatedProbs,
)

#: Likelihoods of counts out of ``total_count`` trials: their support is
#: ``0, ..., max(total_count)``, read from concrete counts (NumPyro's
#: ``enumerate_support`` of a ``BetaBinomial`` fails under ``jit`` once its
#: concentrations are traced, and neither enumerates counts that vary).
COUNTS = (BinomialLogits, BinomialProbs, BetaBinomial)
#: Distributions that wrap another without changing its family.
WRAPPERS = (ExpandedDistribution, Independent, MaskedDistribution)


def innermost(fn: Distribution) -> Distribution:
    """The distribution under its Expanded/Independent/Masked wrappers."""
    while isinstance(fn, WRAPPERS):
        fn = fn.base_dist
    return fn


#: NumPyro's censored likelihoods: an observation is a censoring bound (or an
#: interval) of the outcome, while the sampler draws the uncensored outcome.
_CENSORED = (
    IntervalCensoredDistribution,
    LeftCensoredDistribution,
    RightCensoredDistribution,
)


def is_censored(fn: Distribution) -> bool:
    """Whether a site's likelihood is one of NumPyro's censored
    distributions, whose observed values are not draws of its sampler (so
    no simulated outcome compares with them)."""
    return isinstance(innermost(fn), _CENSORED)


def censoring_refusal(name: str, family: str) -> str:
    """Why simulated outcomes do not compare with the observations of the
    censored site ``name`` (of distribution ``family``), for an error
    message."""
    return (
        f"Observed site '{name}' ({family}) is censored: "
        "its observations are censoring bounds of the outcome, while its "
        "sampler draws the uncensored outcome, so simulated outcomes do not "
        "compare with them."
    )


def sampler_failure(fn: Distribution) -> str | None:
    """Why no outcome of the distribution can be simulated, for a message,
    or ``None`` where its sampler draws: one that implements only
    ``log_prob`` (a user's likelihood class, under its wrappers and the
    bases of transformed distributions), or whose sampler raises at these
    arguments (NumPyro's ``BetaBinomial`` with a float ``total_count``),
    found by tracing one draw abstractly."""
    base = innermost(fn)
    while isinstance(base, TransformedDistribution):
        base = innermost(base.base_dist)
    if type(base).sample is Distribution.sample:
        return "its distribution implements log_prob but not sample"
    try:
        jax.eval_shape(fn.sample, random.PRNGKey(0))
    except Exception as err:  # noqa: BLE001 - the sampler's own error, reported
        first = (str(err).splitlines() or [""])[0]
        return (
            f"its sampler raises {type(err).__name__} ({first!r}) at these "
            "arguments, as it does under numpyro.infer.Predictive; pass "
            f"arguments its sampler accepts{_counts_hint(base)}"
        )
    return None


def _counts_hint(base: Distribution) -> str:
    """What to change in a count distribution's ``total_count`` that its
    sampler rejects: float counts (``BetaBinomial`` indexes with them), or
    integers narrower than JAX's default under ``jax_enable_x64`` (NumPyro's
    binomial sampler mixes its own int64 counter with them)."""
    counts = getattr(base, "total_count", None)
    if counts is None:
        return ""
    dtype = jnp.result_type(counts)
    if not jnp.issubdtype(dtype, jnp.integer):
        return f" (its total_count is {dtype}: pass integer counts)"
    default = jnp.result_type(int)
    if dtype != default:
        return (
            f" (its total_count is {dtype}, JAX's default integer is {default}: "
            f"pass the counts as {default}, e.g. jnp.asarray(counts, "
            f"dtype=jnp.{default}))"
        )
    return ""


def no_sampler(name: str, fn: Distribution, why: str) -> str:
    """That no outcome of the observed site ``name`` can be simulated
    (``why``: :func:`sampler_failure`), for a message."""
    return f"Observed site '{name}' ({describe(fn)}) cannot be simulated: {why}."


def describe(fn: Distribution) -> str:
    """The name of a distribution under its wrappers, for messages (a
    ``numpyro.factor`` is an observed site of ``Unit`` distribution)."""
    base = innermost(fn)
    return "a numpyro.factor" if isinstance(base, Unit) else type(base).__name__


def working_scores(site: dict[str, Any]) -> list[str]:
    """The built-in scores that apply to an observed site's likelihood: the
    log score where it has a density, the CRPS (scalar components) and the
    energy score where it has a reparameterised sampler (the CRPS of a
    Poisson, negative binomial or zero-inflated one, and of a Normal
    mixture, without one, in closed form), the quadratic score where its
    support is finite."""
    fn, base = site["fn"], innermost(site["fn"])
    names = [] if getattr(base, "likelihood_free", False) else ["log"]
    if is_censored(fn):
        return names
    if fn.has_rsample:
        names += ["crps", "energy"] if base.event_dim == 0 else ["energy"]
    elif poisson_counts(zero_inflated_base(base)) or normal_mixture_parts(base):
        names.append("crps")  # in closed form: _core/poisson.py, normal_mixture.py
    elif base.event_dim == 0 and ordered_support(site):
        names.append("crps")  # from the pmf: scores/crps_pmf.py
    if _finite(site):
        names.append("quadratic")
    return names


def _finite(site: dict[str, Any]) -> bool:
    """Whether a site's likelihood has a finite support to enumerate."""
    fn, base = site["fn"], innermost(site["fn"])
    return getattr(fn, "has_enumerate_support", False) and (
        isinstance(base, COUNTS) or _enumerates(base)
    )


def ordered_support(site: dict[str, Any]) -> bool:
    """Whether an observed site's likelihood has a finite support of
    consecutive integers whose order means something, where the CRPS from
    the pmf (``CRPS()``'s default for it) is the ranked probability score:
    every finite support to enumerate (binary outcomes, counts of trials,
    ``OrderedLogistic``'s categories, ...) but that of a ``Categorical``,
    whose categories need not be ordered (``CRPS(estimator='pmf')`` reads
    them as ordered when asked to), and none of a censored likelihood."""
    base = innermost(site["fn"])
    nominal = isinstance(base, (CategoricalLogits, CategoricalProbs))
    if nominal and not isinstance(base, OrderedLogistic):
        return False
    return not is_censored(site["fn"]) and _finite(site)


def normal_mixture_parts(base: Distribution) -> list[Distribution] | None:
    """The components of a mixture of scalar Normals (``MixtureSameFamily``
    of a ``Normal``, ``MixtureGeneral`` of ``Normal`` components), whose
    CRPS ``_core/normal_mixture.py`` computes; ``None`` for any other
    distribution."""
    if isinstance(base, MixtureSameFamily):
        parts = [base.component_distribution]
    elif isinstance(base, MixtureGeneral):
        parts = list(base.component_distributions)
    else:
        return None
    if any(type(innermost(p)) is not Normal or p.event_shape for p in parts):
        return None
    return parts


def poisson_counts(base: Distribution) -> bool:
    """Whether ``base`` is a Poisson, or a Poisson of a Gamma rate (the
    negative binomials, and the geometric distribution: its exponential
    rate), whose CRPS ``_core/poisson.py`` computes."""
    return type(base) is Poisson or isinstance(
        base, (GammaPoisson, GeometricProbs, GeometricLogits)
    )


def zero_inflated_base(base: Distribution) -> Distribution:
    """The distribution a zero-inflated one inflates (under its wrappers),
    or ``base``."""
    if isinstance(base, ZeroInflatedProbs):
        return innermost(base.base_dist)
    return base


def _enumerates(base: Distribution) -> bool:
    try:
        base.enumerate_support(expand=False)
    except NotImplementedError:
        return False
    except Exception:  # noqa: BLE001 - traced parameters: it has a support
        return True
    return True


def score_advice(
    site: dict[str, Any], values: int, together: Sequence[dict[str, Any]] = ()
) -> str:
    """Which scores work for the site's likelihood, for a refusal (the CRPS
    only where one observation is one value, the quadratic score up to
    :data:`QUADRATIC_MAX_VALUES`; ``values``: the observation's). ``together``:
    the observed sites of the whole observation, which a score must apply to
    as well (an observation of a Normal and a Bernoulli value is scored by
    the log score only)."""
    scalar = values == 1
    names = [n for n in working_scores(site) if scalar or n != "crps"]
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
    if scalar and "quadratic" in names and "crps" not in names:
        # categories that need not be ordered: the CRPS from the pmf on request
        return (
            f"Use score={listed} for {subject}, or, if its categories "
            "are ordered, score=CRPS(estimator='pmf') for its CRPS from the "
            "pmf (the ranked probability score)."
        )
    return f"Use score={listed} for {subject}."


#: The most values of one observation for which the quadratic score informs
#: a fit: beyond, the pmf of the one joint outcome observed (a product of as
#: many probabilities) is nearly zero under every draw, and the score's
#: gradient with it (a 64-pixel binary image: none to speak of).
QUADRATIC_MAX_VALUES = 16


@dataclass(frozen=True)
class Advice:
    """The advice of a refusal at an observed site of an observation:
    :func:`score_advice` with the observation's shape (``values``: how many
    values it has) and its observed sites (``sites``)."""

    values: int
    sites: tuple[dict[str, Any], ...] = ()

    def __call__(self, site: dict[str, Any]) -> str:
        return score_advice(site, self.values, self.sites)
