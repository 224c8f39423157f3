"""Each observed site's values along the data plate: what a score reads of
the likelihood beyond its log density.

From one site of a model trace (and the :class:`DataPlate` of
:mod:`~numpyro_pvi._core.data_plate`): simulated draws ``(b, d)``, the
observed values, a Normal likelihood's location and scale, and the pmf over
a finite support ``(K, b, c)`` (as log probabilities or probabilities);
which scores a site supports.

**Masks.** A site masked by :class:`numpyro.handlers.mask`,
``Distribution.mask`` or ``obs_mask=`` (NumPyro's ``MaskedDistribution``,
possibly under ``Independent`` and ``Expanded`` wrappers) has no density at
its masked components. Every extractor here honours that: the observed and
simulated values of a masked component are both ``0`` (so any distance
between them leaves the component out), and its pmf is a point mass at the
first support value, which is also the value observed (so it leaves the
product support and the probability of the observation unchanged).
:func:`observation_mask` says which observations keep a component at all.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from jax.extend.core import concrete_or_error
from numpyro.distributions import (
    BinomialLogits,
    BinomialProbs,
    Distribution,
    ExpandedDistribution,
    Independent,
    MaskedDistribution,
    Normal,
)

from numpyro_pvi._core.data_plate import DataPlate, per_observation, plate_axis_first
from numpyro_pvi._core.pmf import support_log_pmf, support_pmf

#: Distributions that wrap another without changing its family.
_WRAPPERS = (ExpandedDistribution, Independent, MaskedDistribution)


def _innermost(fn: Distribution) -> Distribution:
    """The distribution under its Expanded/Independent/Masked wrappers."""
    while isinstance(fn, _WRAPPERS):
        fn = fn.base_dist
    return fn


def _describe(fn: Distribution) -> str:
    """The name of a distribution under its wrappers, for messages."""
    return type(_innermost(fn)).__name__


class _Components(NamedTuple):
    """A site's scalar components: its batch dims and the dims reinterpreted
    as event by ``Independent`` (``.to_event``) wrappers, with the innermost
    distribution, whose own event (e.g. a multivariate normal's vector) is
    one component."""

    base: Distribution
    ndim: int  # component dims after the batch dims (reinterpreted ones)
    shape: tuple[int, ...]  # batch + reinterpreted dims
    event_size: int  # scalars per component: the size of base's event


def _components(site: dict[str, Any]) -> _Components:
    fn = site["fn"]
    base = _innermost(fn)
    ndim = len(fn.event_shape) - base.event_dim
    value_shape = jnp.shape(site["value"])
    value_batch = value_shape[: max(len(value_shape) - base.event_dim, 0)]
    shape = jnp.broadcast_shapes(fn.batch_shape + fn.event_shape[:ndim], value_batch)
    return _Components(base, ndim, shape, math.prod(base.event_shape))


def _component_rows(
    x: jax.Array, components: _Components, plate: DataPlate
) -> jax.Array:
    """``(b, c)``: an array over a site's components, one row per
    observation (``(1, c)`` without a data plate)."""
    x = jnp.broadcast_to(x, jnp.broadcast_shapes(jnp.shape(x), components.shape))
    if plate.name is None:
        return jnp.reshape(x, (1, -1))
    x = plate_axis_first(x, plate, components.ndim)
    return jnp.reshape(x, (plate.subsample_size, -1))


def _component_mask(site: dict[str, Any], plate: DataPlate) -> jax.Array | None:
    """``(b, c)``: ``False`` at the components a mask removes from the
    site's density; ``None`` when the site is not masked.

    The masks of every ``MaskedDistribution`` among the site's wrappers are
    combined; a mask inside ``Independent`` wrappers covers the dims they
    reinterpret, one outside them is shared along those dims.
    """
    masks, reinterpreted = [], 0
    fn = site["fn"]
    while isinstance(fn, _WRAPPERS):
        if isinstance(fn, MaskedDistribution):
            masks.append((fn._mask, reinterpreted))
        elif isinstance(fn, Independent):
            reinterpreted += fn.reinterpreted_batch_ndims
        fn = fn.base_dist
    if not masks:
        return None
    components = _components(site)
    keep = jnp.ones(components.shape, dtype=bool)
    for mask, above in masks:
        mask = jnp.asarray(mask, dtype=bool)
        keep = keep & jnp.reshape(
            mask, jnp.shape(mask) + (1,) * (reinterpreted - above)
        )
    return _component_rows(keep, components, plate)


def _value_mask(site: dict[str, Any], plate: DataPlate) -> jax.Array | None:
    """``(b, d)``: the component mask laid out like the site's values (each
    component repeated over the scalars of its event)."""
    mask = _component_mask(site, plate)
    if mask is None:
        return None
    return jnp.repeat(mask, _components(site).event_size, axis=1)


def _masked_rows(rows: jax.Array, mask: jax.Array | None) -> jax.Array:
    """Rows of values with the masked entries set to ``0``."""
    return rows if mask is None else jnp.where(mask, rows, jnp.zeros_like(rows))


def observation_mask(
    observed: list[dict[str, Any]], plate: DataPlate
) -> jax.Array | None:
    """``(b,)``: whether each observation keeps a component that no mask
    removes (``False``: the observation is masked out entirely and
    contributes nothing); ``None`` when no observed site is masked, or when
    one that is not masked has a component at every observation."""
    masks = [_component_mask(s, plate) for s in observed]
    if not masks or any(m is None for m in masks):
        return None
    b = plate.subsample_size
    rows = [jnp.broadcast_to(m, (b, m.shape[1])) for m in masks if m is not None]
    return jnp.any(jnp.concatenate(rows, axis=1), axis=1)


def _site_draw(
    site: dict[str, Any], plate: DataPlate, key: jax.Array, reparam: bool = True
) -> jax.Array:
    fn = site["fn"]
    if reparam and not fn.has_rsample:
        raise ValueError(
            f"Observed site '{site['name']}' ({_describe(fn)}) has no "
            "reparameterised sampler, which this score needs to differentiate "
            "simulated observations. " + _score_advice(site)
        )
    draw = fn.sample(key)
    shape = jnp.broadcast_shapes(draw.shape, jnp.shape(site["value"]))
    draw = jnp.broadcast_to(draw, shape)
    return _masked_rows(
        per_observation(draw, plate, fn.event_dim), _value_mask(site, plate)
    )


def _normal_loc_scale(
    site: dict[str, Any], plate: DataPlate
) -> tuple[jax.Array, jax.Array] | None:
    """``(b, d)`` location and scale of a Normal site (under Expanded,
    Independent and Masked wrappers), laid out like its draws (``(1, d)``
    for one that does not vary along the data plate); ``None`` for any
    other distribution. A masked component keeps its parameters: the
    observation it belongs to is left out by :func:`observation_mask` (one
    component per observation is what the closed form scores)."""
    fn = site["fn"]
    base = _innermost(fn)
    if type(base) is not Normal:
        return None
    shape = jnp.broadcast_shapes(fn.shape(), jnp.shape(site["value"]))
    loc, scale = (
        _parameter_rows(x, shape, plate, fn.event_dim) for x in (base.loc, base.scale)
    )
    return loc, scale


def _parameter_rows(
    x: jax.Array, shape: tuple[int, ...], plate: DataPlate, event_ndim: int
) -> jax.Array:
    """``(b, d)`` a site's parameter laid out like its draws, or ``(1, d)``
    when it does not vary along the data plate (a scale shared by every
    observation stays one number per particle, and so does its gradient).
    Integer parameters (``Normal(mu, 1)``) are promoted to floats."""
    x = jnp.asarray(x, dtype=jnp.result_type(x, float))
    if plate.name is None:
        return jnp.reshape(jnp.broadcast_to(x, shape), (1, -1))
    axis = len(shape) + plate.dim - event_ndim
    padded = (1,) * (len(shape) - x.ndim) + x.shape
    target = tuple(
        1 if i == axis and padded[i] == 1 else n for i, n in enumerate(shape)
    )
    x = jnp.moveaxis(jnp.broadcast_to(x, target), axis, 0)
    return jnp.reshape(x, (x.shape[0], -1))


def _enumerable(
    site: dict[str, Any], plate: DataPlate
) -> tuple[Distribution, jax.Array, Callable[[jax.Array], jax.Array]]:
    """The innermost distribution of a site with a finite support, its
    support ``(K, 1, ..., 1[, event])`` and the map of an array over its
    batch (and reinterpreted) dims to ``(b, c)`` rows."""
    fn = site["fn"]
    if not getattr(fn, "has_enumerate_support", False):
        raise ValueError(
            f"Observed site '{site['name']}' ({_describe(fn)}) has no finite "
            "support to enumerate, which the quadratic (Brier) score needs. "
            + _score_advice(site)
        )
    # Independent (.to_event), Expanded and Masked wrappers: enumerate the
    # innermost distribution; reinterpreted batch dims become components of
    # the observation
    components = _components(site)
    try:
        support = _support(site, components.base)
    except NotImplementedError:
        raise ValueError(
            f"Observed site '{site['name']}' ({_describe(fn)}) cannot "
            "enumerate its support, which the quadratic (Brier) score needs. "
            + _score_advice(site)
        ) from None
    return (
        components.base,
        support,
        lambda x: _component_rows(x, components, plate),
    )


def _support(site: dict[str, Any], base: Distribution) -> jax.Array:
    """``(K, 1, ..., 1)`` the support of ``base``; for a Binomial, the values
    ``0 .. max(total_count)`` (a ``total_count`` that varies between
    observations gives the others zero probability above their own)."""
    if not isinstance(base, (BinomialLogits, BinomialProbs)):
        return base.enumerate_support(expand=False)
    total_count = concrete_or_error(
        np.asarray,
        base.total_count,
        f"The quadratic score enumerates the support 0, ..., max(total_count) "
        f"of the Binomial site '{site['name']}', whose size must be known when "
        "the program is compiled, but total_count is a traced value here (an "
        "argument of a jitted function). Close over total_count instead (as "
        "SVI.run does with the model's arguments), or use score='log'.",
    )
    size = int(np.max(total_count)) + 1
    shape = (size,) + (1,) * len(base.batch_shape)
    return jnp.reshape(jnp.arange(size, dtype=jnp.result_type(float)), shape)


def working_scores(site: dict[str, Any]) -> list[str]:
    """The built-in scores that apply to an observed site's likelihood: the
    log score where it has a density, the CRPS (scalar components) and the
    energy score where it has a reparameterised sampler, the quadratic score
    where its support is finite."""
    fn, base = site["fn"], _innermost(site["fn"])
    names = [] if getattr(base, "likelihood_free", False) else ["log"]
    if fn.has_rsample:
        names += ["crps", "energy"] if base.event_dim == 0 else ["energy"]
    finite = getattr(fn, "has_enumerate_support", False)
    if finite and (
        isinstance(base, (BinomialLogits, BinomialProbs)) or _enumerates(base)
    ):
        names.append("quadratic")
    return names


def _enumerates(base: Distribution) -> bool:
    try:
        base.enumerate_support(expand=False)
    except NotImplementedError:
        return False
    except Exception:  # noqa: BLE001 - traced parameters: it has a support
        return True
    return True


def _score_advice(site: dict[str, Any]) -> str:
    """Which scores work for the site's likelihood, for a refusal."""
    names = working_scores(site)
    if not names:
        return "No built-in score applies to this likelihood."
    listed = ", ".join(repr(n) for n in names[:-1])
    listed = f"{listed} or {names[-1]!r}" if listed else repr(names[0])
    return f"Use score={listed} for this likelihood."


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
    site: dict[str, Any], plate: DataPlate, pmf_fn: Callable, masked: tuple
) -> list[jax.Array] | jax.Array:
    """``pmf_fn`` (:func:`~numpyro_pvi._core.pmf.support_log_pmf` or
    :func:`~numpyro_pvi._core.pmf.support_pmf`) of the site over its support: a
    list of ``K`` ``(b, c)`` arrays for short supports, else ``(K, b, c)``;
    a masked component is a point mass, ``masked = (first, rest)``."""
    base, support, rows = _enumerable(site, plate)
    values = pmf_fn(base, support)
    values = (
        [rows(v) for v in values]
        if isinstance(values, list)
        else jax.vmap(rows)(values)
    )
    mask = _component_mask(site, plate)
    return values if mask is None else _point_mass(values, mask, *masked)


def _site_obs_support(site: dict[str, Any], plate: DataPlate) -> jax.Array:
    """``(K, b, c)``: whether each observed component equals each support
    value (a masked component: the first value)."""
    base, support, rows = _enumerable(site, plate)
    value = jnp.asarray(site["value"])
    event = support.shape[support.ndim - base.event_dim :]
    ones = (1,) * (value.ndim - base.event_dim)
    equal = support.reshape(support.shape[:1] + ones + event) == value
    if base.event_dim:
        equal = jnp.all(equal, axis=tuple(range(-base.event_dim, 0)))
    equal = jax.vmap(rows)(equal)
    mask = _component_mask(site, plate)
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
            a,
            [(0, k - a.shape[0])] + [(0, 0)] * (a.ndim - 1),
            constant_values=fill,
        )
        for a in stacked
    ]
    return jnp.concatenate(padded, axis=-1)


def observed_values(observed: list[dict[str, Any]], plate: DataPlate) -> jax.Array:
    """``(b, d)`` the observed values, one flattened row per observation
    (``0`` at masked components)."""
    return jnp.concatenate(
        [
            _masked_rows(
                per_observation(s["value"], plate, s["fn"].event_dim),
                _value_mask(s, plate),
            )
            for s in observed
        ],
        axis=1,
    )


def simulated_values(
    observed: list[dict[str, Any]], plate: DataPlate, key: jax.Array, reparam: bool
) -> jax.Array:
    """``(b, d)`` one draw of every observed site given the latents, laid out
    like :func:`observed_values` (reparameterised when ``reparam``)."""
    keys = random.split(key, len(observed))
    return jnp.concatenate(
        [_site_draw(s, plate, k, reparam) for s, k in zip(observed, keys, strict=True)],
        axis=1,
    )


def normal_loc_scale(
    observed: list[dict[str, Any]], plate: DataPlate
) -> tuple[jax.Array, jax.Array] | tuple[None, None]:
    """``(b, d)`` location and scale of every observed site, laid out like
    :func:`observed_values`, when all of them are Normal (each ``(1, d)``
    when it does not vary along the data plate); ``(None, None)``
    otherwise."""
    pairs = [_normal_loc_scale(s, plate) for s in observed]
    if not pairs or any(p is None for p in pairs):
        return None, None
    present = [p for p in pairs if p is not None]
    if len(present) == 1:
        return present[0]
    b = plate.subsample_size
    loc, scale = (
        jnp.concatenate([jnp.broadcast_to(r, (b, r.shape[1])) for r in x], axis=1)
        for x in zip(*present, strict=True)
    )
    return loc, scale


def site_log_pmf(
    observed: list[dict[str, Any]], plate: DataPlate
) -> tuple[jax.Array, ...] | jax.Array:
    """``(K, b, c)`` the log pmf over the finite support of every scalar
    component of each observation (shorter supports padded with ``-inf``),
    in one pass from the likelihood's parameters where
    :func:`~numpyro_pvi._core.pmf.support_log_pmf` can. For supports of at most
    :data:`~numpyro_pvi._core.pmf.UNROLLED_SUPPORT` values, a tuple of ``K``
    ``(b, c)`` arrays instead, which the particle machinery stacks after the
    particle axis: stacked per particle, the support axis lands outside the
    particle axis in memory and XLA transposes the whole array."""
    return _pad_support(
        [_site_support(s, plate, support_log_pmf, (0.0, -jnp.inf)) for s in observed]
    )


def site_pmf(
    observed: list[dict[str, Any]], plate: DataPlate
) -> tuple[jax.Array, ...] | jax.Array:
    """The pmf over the finite support, as probabilities (padding ``0``),
    laid out like :func:`site_log_pmf`; see
    :func:`~numpyro_pvi._core.pmf.support_pmf`."""
    return _pad_support(
        [_site_support(s, plate, support_pmf, (1.0, 0.0)) for s in observed], 0.0
    )


def _binomial_logits_count(
    site: dict[str, Any], plate: DataPlate
) -> tuple[jax.Array, jax.Array] | None:
    """``(b, c)`` logits and total counts of a Binomial site's components
    (``None`` for any other distribution); a masked component has count 0,
    the point mass at 0 of :func:`site_pmf`."""
    if not isinstance(_innermost(site["fn"]), (BinomialLogits, BinomialProbs)):
        return None
    base, _, rows = _enumerable(site, plate)
    logits = base.logits  # BinomialProbs: the logits of its clamped probs
    count = jnp.asarray(base.total_count, dtype=jnp.result_type(logits))
    logits, count = rows(logits), rows(jax.lax.stop_gradient(count))
    mask = _component_mask(site, plate)
    if mask is not None:
        logits, count = jnp.where(mask, logits, 0.0), jnp.where(mask, count, 0.0)
    return logits, count


def binomial_logits_count(
    observed: list[dict[str, Any]], plate: DataPlate
) -> tuple[jax.Array, jax.Array] | tuple[None, None]:
    """``(b, c)`` logits and total counts of every observed site, laid out
    like :func:`site_pmf`'s components, when all of them are Binomial (what
    :func:`~numpyro_pvi._core.pmf.binomial_support_sums` reads instead of
    the pmf); ``(None, None)`` otherwise."""
    pairs = [_binomial_logits_count(s, plate) for s in observed]
    if not pairs or any(p is None for p in pairs):
        return None, None
    logits, count = (
        jnp.concatenate(x, axis=-1) for x in zip(*cast(list, pairs), strict=True)
    )
    return logits, count


def observed_support(observed: list[dict[str, Any]], plate: DataPlate) -> jax.Array:
    """``(K, b, c)`` whether each observed scalar component equals each value
    of its finite support (laid out like :func:`site_log_pmf` and
    :func:`site_pmf`, padding ``False``)."""
    support = _pad_support([_site_obs_support(s, plate) for s in observed], False)
    return cast(jax.Array, support)
