"""Each observed site's pmf over its finite support along the data plate:
what the quadratic score reads.

The pmf ``(K, b, c)`` of every scalar component of each observation (as
log probabilities or probabilities, shorter supports padded), whether each
observed component equals each support value, and for Binomial likelihoods
the logits and counts that
:func:`~numpyro_pvi.scores._pmf.binomial_support_sums` reads instead of the
pmf. A masked component is a point mass at the first support value (the
conventions of :mod:`~numpyro_pvi._trace.site_values`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import BinomialLogits, BinomialProbs, Distribution

from numpyro_pvi._trace.data_plate import DataPlate
from numpyro_pvi._trace.imputed import NeedsConstantArguments
from numpyro_pvi._trace.site_laws import (
    COUNTS,
    censoring_refusal,
    describe,
    innermost,
    is_censored,
)
from numpyro_pvi._trace.site_values import (
    component_mask,
    component_rows,
    site_components,
)
from numpyro_pvi.scores._pmf import CDF_SUMS_SUPPORT, UNROLLED_SUPPORT, support_pmf


def _enumerable(
    site: dict[str, Any], plate: DataPlate, advice: Callable
) -> tuple[Distribution, jax.Array, Callable[[jax.Array], jax.Array]]:
    """The innermost distribution of a site with a finite support, its
    support ``(K, 1, ..., 1[, event])`` and the map of an array over its
    batch (and reinterpreted) dims to ``(b, c)`` rows (``advice``: what a
    refusal advises, :func:`~numpyro_pvi._trace.site_values.observation_advice`)."""
    fn = site["fn"]
    if is_censored(fn):
        raise ValueError(
            censoring_refusal(site["name"], describe(fn))
            + " The scores from the pmf (the quadratic score, "
            "CRPS(estimator='pmf')), which compare the predictive pmf with "
            "them, would be wrong. " + advice(site)
        )
    if not getattr(fn, "has_enumerate_support", False):
        raise ValueError(
            f"Observed site '{site['name']}' ({describe(fn)}) has no finite "
            "support to enumerate, which the scores from the pmf (the quadratic "
            "score, CRPS(estimator='pmf')) need. " + advice(site)
        )
    # Independent (.to_event), Expanded and Masked wrappers: enumerate the
    # innermost distribution; reinterpreted batch dims become components of
    # the observation
    components = site_components(site)
    try:
        support = _support(site, components.base)
    except NotImplementedError:
        raise ValueError(
            f"Observed site '{site['name']}' ({describe(fn)}) cannot "
            "enumerate its support, which the scores from the pmf (the quadratic "
            "score, CRPS(estimator='pmf')) need. " + advice(site)
        ) from None
    return (components.base, support, lambda x: component_rows(x, components, plate))


def count_size(site: dict[str, Any], base: Distribution) -> int:
    """``max(total_count) + 1``, the values a site of :data:`COUNTS`
    enumerates (its ``total_count`` must be concrete)."""
    family = type(base).__name__
    first = innermost(site.get("first_fn", site["fn"]))  # outside any mapping
    try:
        total_count = np.asarray(first.total_count)
    except jax.errors.TracerArrayConversionError:
        raise NeedsConstantArguments(
            f"The scores from the pmf (the quadratic score, the CRPS of counts) "
            f"enumerate the support 0, ..., max(total_count) of the {family} "
            f"site '{site['name']}', whose size must be known when the program "
            "is compiled, but total_count is a traced value here (an argument "
            "of a jitted function). Close over total_count instead (as SVI.run "
            "does with the model's arguments), or use score='log'."
        ) from None
    return int(np.max(total_count)) + 1


def _support(site: dict[str, Any], base: Distribution) -> jax.Array:
    """``(K, 1, ..., 1)`` the support of ``base``; for counts
    (:data:`COUNTS`), the values ``0 .. max(total_count)`` (a
    ``total_count`` that varies between observations gives the others zero
    probability above their own)."""
    if not isinstance(base, COUNTS):
        return base.enumerate_support(expand=False)
    size = count_size(site, base)
    shape = (size,) + (1,) * len(base.batch_shape)
    return jnp.reshape(jnp.arange(size, dtype=jnp.result_type(float)), shape)


def _point_mass(
    values: list[jax.Array] | jax.Array, mask: jax.Array, first: Any, rest: Any
):
    """``values`` over the support (a list of ``K`` ``(b, c)`` arrays, or
    ``(K, b, c)``) with each masked component replaced by a point mass at
    the first support value (``first`` there, ``rest`` elsewhere)."""
    if isinstance(values, list):
        return [
            jnp.where(mask, v, first if j == 0 else rest) for j, v in enumerate(values)
        ]
    at_first = (jnp.arange(values.shape[0]) == 0)[:, None, None]
    return jnp.where(mask, values, jnp.where(at_first, first, rest))


def _site_support(
    site: dict[str, Any],
    plate: DataPlate,
    pmf_fn: Callable,
    masked: tuple,
    advice: Callable,
) -> list[jax.Array] | jax.Array:
    """``pmf_fn`` (:func:`~numpyro_pvi.scores._pmf.support_log_pmf` or
    :func:`~numpyro_pvi.scores._pmf.support_pmf`) of the site over its support: a
    list of ``K`` ``(b, c)`` arrays for short supports, else ``(K, b, c)``;
    a masked component is a point mass, ``masked = (first, rest)``."""
    base, support, rows = _enumerable(site, plate, advice)
    values = pmf_fn(base, support)
    values = (
        [rows(v) for v in values]
        if isinstance(values, list)
        else jax.vmap(rows)(values)
    )
    mask = component_mask(site, plate)
    return values if mask is None else _point_mass(values, mask, *masked)


def _site_obs_support(
    site: dict[str, Any], plate: DataPlate, advice: Callable
) -> jax.Array:
    """``(K, b, c)``: whether each observed component equals each support
    value (a masked component: the first value)."""
    base, support, rows = _enumerable(site, plate, advice)
    value = jnp.asarray(site["value"])
    event = support.shape[support.ndim - base.event_dim :]
    ones = (1,) * (value.ndim - base.event_dim)
    equal = support.reshape(support.shape[:1] + ones + event) == value
    if base.event_dim:
        equal = jnp.all(equal, axis=tuple(range(-base.event_dim, 0)))
    equal = jax.vmap(rows)(equal)
    mask = component_mask(site, plate)
    return equal if mask is None else _point_mass(equal, mask, True, False)


def _pad_support(
    arrays: list[list[jax.Array] | jax.Array], fill: Any = -jnp.inf
) -> tuple[jax.Array, ...] | jax.Array:
    """Concatenate the sites' ``(K_s, b, c_s)`` arrays (or lists of ``K_s``
    ``(b, c_s)`` arrays) along the components, padding shorter supports with
    ``fill``: a tuple of ``K`` ``(b, c)`` arrays when every site gave a list,
    else one ``(K, b, c)`` array."""
    k = max(len(a) for a in arrays)
    if all(isinstance(a, list) for a in arrays):
        return tuple(
            jnp.concatenate(
                [a[j] if j < len(a) else jnp.full_like(a[0], fill) for a in arrays],
                axis=-1,
            )
            for j in range(k)
        )
    stacked = [jnp.stack(a) if isinstance(a, list) else a for a in arrays]
    padded = [
        jnp.pad(
            a, [(0, k - a.shape[0])] + [(0, 0)] * (a.ndim - 1), constant_values=fill
        )
        for a in stacked
    ]
    return jnp.concatenate(padded, axis=-1)


def site_pmf(
    observed: list[dict[str, Any]], plate: DataPlate, advice: Callable
) -> tuple[jax.Array, ...] | jax.Array:
    """``(K, b, c)`` the pmf over the finite support of every scalar
    component of each observation, as probabilities (shorter supports
    padded with ``0``), in one pass from the likelihood's parameters where
    :func:`~numpyro_pvi.scores._pmf.support_pmf` can; for supports of at
    most :data:`~numpyro_pvi.scores._pmf.UNROLLED_SUPPORT` values a tuple
    of ``K`` ``(b, c)`` arrays, which the caller stacks after the particle
    axis. ``advice``: what a refusal advises for a site."""
    return _pad_support(
        [_site_support(s, plate, support_pmf, (1.0, 0.0), advice) for s in observed],
        0.0,
    )


def warn_long_support(observed: list[dict[str, Any]], plate: DataPlate) -> None:
    """Warn where the CRPS from the pmf, taken by default for an ordered
    finite support (the request ``finite_pmf``), sums over more than
    :data:`~numpyro_pvi.scores._pmf.CDF_SUMS_SUPPORT` values: a term per
    support value, particle and observation, read from the ``(M, K, b)``
    pmf."""
    shapes = [_pmf_shape(s, plate) for s in observed]
    if any(x is None for x in shapes):
        return
    k = max(x[0] for x in cast(list, shapes))
    if k <= CDF_SUMS_SUPPORT:
        return
    names = ", ".join(f"'{s['name']}'" for s in observed)
    warnings.warn(
        f"The CRPS of {names} is computed from the pmf over its {k} support "
        "values: a term per value, particle and observation (on a Binomial "
        "regression of 200 trials, 400 to 900 times the cost of a Trace_ELBO "
        "step). For counts of many trials, score='quadratic' (its default "
        "takes Binomials in closed form) or score='log' are far cheaper.",
        UserWarning,
        stacklevel=2,
    )


def observed_support(
    observed: list[dict[str, Any]], plate: DataPlate, advice: Callable
) -> jax.Array:
    """``(K, b, c)`` whether each observed scalar component equals each value
    of its finite support (laid out like :func:`site_pmf`, padding
    ``False``)."""
    support = _pad_support(
        [_site_obs_support(s, plate, advice) for s in observed], False
    )
    return cast(jax.Array, support)


def _memory_bytes() -> int | None:
    """The default device's memory (an accelerator's limit, else the host's
    physical memory), or ``None`` where neither is known."""
    stats = jax.devices()[0].memory_stats()
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def _pmf_shape(site: dict[str, Any], plate: DataPlate) -> tuple[int, int] | None:
    """``(K, c)``: the support values and the components per observation
    of a site's pmf, from shapes and concrete counts (no array of that
    size); ``None`` where the site has no support to enumerate (its
    refusal comes later, with its advice)."""
    components = site_components(site)
    base = components.base
    if isinstance(base, COUNTS):
        k = count_size(site, base)
    else:
        try:
            k = base.enumerate_support(expand=False).shape[0]
        except (NotImplementedError, AttributeError):
            return None
    rows = jax.eval_shape(
        lambda: component_rows(jnp.zeros(components.shape, bool), components, plate)
    )
    return k, rows.shape[1]


def check_pmf_size(
    observed: list[dict[str, Any]], plate: DataPlate, num_draws: int
) -> None:
    """Refuse a pmf that would take more than a quarter of the device's
    memory as one array (its gradient and the score's temporaries take as
    much again): ``num_draws`` draws of the ``(K, b, c)`` probabilities of
    :func:`site_pmf`. Checked from shapes, before any array of that size
    is made. Binomial sites of one component per observation and at most
    :data:`~numpyro_pvi.scores._pmf.UNROLLED_SUPPORT` values are exempt: their
    score reads particle sums, never the pmf."""
    shapes = [_pmf_shape(s, plate) for s in observed]
    if not shapes or any(x is None for x in shapes):
        return
    k = max(x[0] for x in cast(list, shapes))
    c = sum(x[1] for x in cast(list, shapes))
    binomial = all(
        isinstance(innermost(s["fn"]), (BinomialLogits, BinomialProbs))
        for s in observed
    )
    if binomial and c == 1 and k <= UNROLLED_SUPPORT:
        return
    b = plate.subsample_size if plate.name is not None else 1
    size = num_draws * k * b * c
    nbytes = size * jnp.dtype(jnp.result_type(float)).itemsize
    memory = _memory_bytes()
    if memory is None or 4 * nbytes <= memory:
        return
    names = ", ".join(f"'{s['name']}'" for s in observed)
    raise ValueError(
        f"The pmf over the finite support of {names} (what the quadratic score "
        f"and the CRPS from the pmf read) has {k:,} values at each of {b:,} "
        f"observations ({c} component(s) each) for each of {num_draws:,} draws: "
        f"{size:,} probabilities, {nbytes / 2**30:,.1f} GiB in one array, more "
        f"than a quarter of this device's {memory / 2**30:,.0f} GiB. Use "
        "score='log', fewer particles (or draws), or a subsample of the "
        "observations (numpyro.plate(..., subsample_size=...))."
    )
