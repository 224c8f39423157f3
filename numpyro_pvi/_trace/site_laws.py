"""What an observed site's likelihood is, under NumPyro's wrappers, and
which scores apply to it: its family (:func:`innermost`, :func:`describe`),
censoring, why it cannot be simulated, and the advice a refusal gives
(:func:`working_scores`, :func:`score_advice`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import random
from numpyro.distributions import (
    BetaBinomial,
    BinomialLogits,
    BinomialProbs,
    Distribution,
    ExpandedDistribution,
    Independent,
    IntervalCensoredDistribution,
    LeftCensoredDistribution,
    MaskedDistribution,
    RightCensoredDistribution,
    TransformedDistribution,
    Unit,
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
