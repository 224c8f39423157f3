"""Each observed site's values along the data plate: what a score reads of
the likelihood beyond its log density.

From one site of a model trace (and the :class:`DataPlate` of
:mod:`~numpyro_pvi._core.data_plate`): simulated draws ``(b, d)``, the
observed values, a Normal likelihood's location and scale. Which scores a
site supports is :mod:`~numpyro_pvi._core.site_laws`'; the pmf over a
finite support :mod:`~numpyro_pvi._core.site_support`'s.

**Masks.** A site masked by :class:`numpyro.handlers.mask`,
``Distribution.mask`` or ``obs_mask=`` (NumPyro's ``MaskedDistribution``,
possibly under ``Independent`` and ``Expanded`` wrappers) has no density at
its masked components. Every extractor here and in
:mod:`~numpyro_pvi._core.site_support` honours that: the observed and
simulated values of a masked component are both ``0`` (so any distance
between them leaves the component out), and its pmf is a point mass at the
first support value, which is also the value observed (so it leaves the
product support and the probability of the observation unchanged).
:func:`observation_mask` says which observations keep a component at all.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from numpyro.distributions import (
    Distribution,
    Independent,
    MaskedDistribution,
    Normal,
    TransformedDistribution,
    Unit,
)

from numpyro_pvi._core.data_plate import DataPlate, per_observation
from numpyro_pvi._core.fast_draws import fast_draw, has_fast_draw
from numpyro_pvi._core.observed import observed_sites
from numpyro_pvi._core.site_laws import (
    WRAPPERS,
    Advice,
    censoring_refusal,
    describe,
    innermost,
    is_censored,
    no_sampler,
    sampler_failure,
    working_scores,
)


class SiteComponents(NamedTuple):
    """A site's scalar components: its batch dims and the dims reinterpreted
    as event by ``Independent`` (``.to_event``) wrappers, with the innermost
    distribution, whose own event (e.g. a multivariate normal's vector) is
    one component."""

    base: Distribution
    ndim: int  # component dims after the batch dims (reinterpreted ones)
    shape: tuple[int, ...]  # batch + reinterpreted dims
    event_size: int  # scalars per component: the size of base's event


def site_components(site: dict[str, Any]) -> SiteComponents:
    fn = site["fn"]
    base = innermost(fn)
    ndim = len(fn.event_shape) - base.event_dim
    value_shape = jnp.shape(site["value"])
    value_batch = value_shape[: max(len(value_shape) - base.event_dim, 0)]
    shape = jnp.broadcast_shapes(fn.batch_shape + fn.event_shape[:ndim], value_batch)
    return SiteComponents(base, ndim, shape, math.prod(base.event_shape))


def component_rows(
    x: jax.Array, components: SiteComponents, plate: DataPlate
) -> jax.Array:
    """``(b, c)``: an array over a site's components, one row per
    observation (``(1, c)`` without a data plate)."""
    x = jnp.broadcast_to(x, jnp.broadcast_shapes(jnp.shape(x), components.shape))
    return per_observation(x, plate, components.ndim)


def component_mask(site: dict[str, Any], plate: DataPlate) -> jax.Array | None:
    """``(b, c)``: ``False`` at the components a mask removes from the
    site's density; ``None`` when the site is not masked.

    The masks of every ``MaskedDistribution`` among the site's wrappers are
    combined; a mask inside ``Independent`` wrappers covers the dims they
    reinterpret, one outside them is shared along those dims.
    """
    masks, reinterpreted = [], 0
    fn = site["fn"]
    while isinstance(fn, WRAPPERS):
        if isinstance(fn, MaskedDistribution):
            masks.append((fn._mask, reinterpreted))
        elif isinstance(fn, Independent):
            reinterpreted += fn.reinterpreted_batch_ndims
        fn = fn.base_dist
    if not masks:
        return None
    components = site_components(site)
    keep = jnp.ones(components.shape, dtype=bool)
    for mask, above in masks:
        mask = jnp.asarray(mask, dtype=bool)
        keep = keep & jnp.reshape(
            mask, jnp.shape(mask) + (1,) * (reinterpreted - above)
        )
    return component_rows(keep, components, plate)


def _value_mask(site: dict[str, Any], plate: DataPlate) -> jax.Array | None:
    """``(b, d)``: the component mask laid out like the site's values (each
    component repeated over the scalars of its event)."""
    mask = component_mask(site, plate)
    if mask is None:
        return None
    return jnp.repeat(mask, site_components(site).event_size, axis=1)


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
    masks = [component_mask(s, plate) for s in observed]
    if not masks or any(m is None for m in masks):
        return None
    b = plate.subsample_size
    rows = [jnp.broadcast_to(m, (b, m.shape[1])) for m in masks if m is not None]
    return jnp.any(jnp.concatenate(rows, axis=1), axis=1)


def _draw_refusal(site: dict[str, Any], reparam: bool) -> str | None:
    """Why no outcome of the observed site can be simulated as the score
    needs (reparameterised when ``reparam``), for a refusal; ``None`` where
    it can."""
    fn = site["fn"]
    if is_censored(fn):
        return (
            censoring_refusal(site["name"], describe(fn))
            + " A score that compares them (crps, energy, quadratic) would be "
            "wrong."
        )
    if isinstance(innermost(fn), Unit):
        return (
            f"Observed site '{site['name']}' (a numpyro.factor) is a term of the "
            "log density, with no outcome to simulate, which this score "
            "compares with the observations."
        )
    why = sampler_failure(fn)
    if why is not None:
        return (
            no_sampler(site["name"], fn, why)
            + " This score compares simulated outcomes with the observations."
        )
    if reparam and not fn.has_rsample:
        return (
            f"Observed site '{site['name']}' ({describe(fn)}) has no "
            "reparameterised sampler, which this score needs to differentiate "
            "simulated observations."
        )
    return None


def _site_draw(site: dict[str, Any], plate: DataPlate, key: jax.Array) -> jax.Array:
    fn = site["fn"]
    draw = _vectorised_draw(fn, key)
    if draw is None:  # NumPyro's Delta(3.0) draws a Python float
        draw = jnp.asarray(fn.sample(key))
    shape = jnp.broadcast_shapes(draw.shape, jnp.shape(site["value"]))
    draw = jnp.broadcast_to(draw, shape)
    return _masked_rows(
        per_observation(draw, plate, fn.event_dim), _value_mask(site, plate)
    )


def _vectorised_draw(fn: Distribution, key: jax.Array) -> jax.Array | None:
    """A draw of ``fn`` by :func:`~numpyro_pvi._core.fast_draws.fast_draw`
    where its law is one of those (NumPyro's own sampler's law, vectorised),
    under its wrappers and through the transforms of a
    ``TransformedDistribution`` that keeps NumPyro's sampler (an
    ``InverseGamma`` is a Gamma draw's reciprocal); ``None`` otherwise."""
    shape = fn.shape()
    base = innermost(fn)
    transforms: list[Any] = []
    while type(base).sample is TransformedDistribution.sample:
        transforms = list(base.transforms) + transforms
        base = innermost(base.base_dist)
    if not has_fast_draw(base):
        return None
    for transform in reversed(transforms):
        shape = transform.inverse_shape(shape)
    draw = fast_draw(base, key, shape)
    for transform in transforms:
        draw = transform(draw)
    return draw


def _loc_scale(
    site: dict[str, Any], plate: DataPlate, family: type[Distribution]
) -> tuple[jax.Array, jax.Array] | None:
    """``(b, d)`` location and scale of a site of ``family`` (``Normal``,
    ``LogNormal``: ``loc`` and ``scale`` attributes; under Expanded,
    Independent and Masked wrappers), laid out like its draws (``(1, d)``
    for one that does not vary along the data plate); ``None`` for any
    other distribution. A masked component keeps its parameters: the
    observation it belongs to is left out by :func:`observation_mask` (one
    component per observation is what the closed form scores)."""
    fn = site["fn"]
    base = innermost(fn)
    if type(base) is not family:
        return None
    shape = jnp.broadcast_shapes(fn.shape(), jnp.shape(site["value"]))
    loc, scale = (
        parameter_rows(x, shape, plate, fn.event_dim) for x in (base.loc, base.scale)
    )
    return loc, scale


def parameter_rows(
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


def observation_widths(
    observed: list[dict[str, Any]], plate: DataPlate
) -> tuple[tuple[str, int], ...]:
    """``(site, values)`` for each observed site: how many values of one
    observation (a row of :func:`observed_values`) it holds, from the shapes
    alone."""
    return tuple(
        (
            s["name"],
            per_observation(
                np.zeros(jnp.shape(s["value"]), bool), plate, s["fn"].event_dim, np
            ).shape[1],
        )
        for s in observed
    )


def observation_layout(sites: tuple[tuple[str, int], ...]) -> str:
    """The observed sites that form one observation and how many values
    each gives it (:func:`observation_widths`), for messages: ``"'Y': 20
    values"``, ``"'y_2', 'y_3', ..., 'y_11': 1 value each (10 sites)"``."""
    if not sites:
        return "the observed sites"

    def values(width: int) -> str:
        return f"{width} value{'' if width == 1 else 's'}"

    widths = {width for _, width in sites}
    if len(sites) > 1 and len(widths) == 1:
        names = [f"'{name}'" for name, _ in sites]
        if len(names) > 4:
            names = [*names[:2], "...", names[-1]]
        return f"{', '.join(names)}: {values(sites[0][1])} each ({len(sites)} sites)"
    return ", ".join(f"'{name}': {values(width)}" for name, width in sites)


def site_names(sites: tuple[tuple[str, int], ...]) -> str:
    """The names of :func:`observation_widths`' sites, for messages:
    ``"'y'"``, ``"'y', 'z'"`` (``"the observed sites"`` without any)."""
    return ", ".join(f"'{name}'" for name, _ in sites) or "the observed sites"


def single_observation(model_trace: dict[str, Any], where: str, cannot: str) -> str:
    """The refusal of ``where`` for a model whose data form one observation
    (no data plate): which observed sites form it and how many values each
    gives it, why, and what to do; ``cannot`` says what one observation
    cannot be (``"folded"``, ``"held out"``)."""
    plate = DataPlate(None, 0, 1, 0)
    layout = observation_layout(observation_widths(observed_sites(model_trace), plate))
    return (
        f"{where}: the data form one observation in all ({layout}; no "
        "numpyro.plate and no batch dimension of an observed site holds them), "
        f"and one observation cannot be {cannot}. Put independent observations "
        "in a numpyro.plate (or observe them as an array along a batch "
        "dimension); a joint distribution of the whole data set (e.g. a "
        "MultivariateNormal of a series or a Gaussian process) is one "
        "observation."
    )


def scalar_observation(observed: list[dict[str, Any]], plate: DataPlate) -> bool:
    """Whether one observation is one value (the observed sites' components
    in a row of :func:`observed_values`), from the shapes alone."""
    return sum(width for _, width in observation_widths(observed, plate)) == 1


def observation_advice(observed: list[dict[str, Any]], plate: DataPlate) -> Advice:
    """The advice of a refusal at one of the observed sites: the scores that
    apply to all of them, the CRPS only where one observation is one value."""
    widths = observation_widths(observed, plate)
    return Advice(sum(width for _, width in widths), tuple(observed))


def simulated_values(
    observed: list[dict[str, Any]], plate: DataPlate, key: jax.Array, reparam: bool
) -> jax.Array:
    """``(b, d)`` one draw of every observed site given the latents, laid out
    like :func:`observed_values` (reparameterised when ``reparam``)."""
    refused = [(s, _draw_refusal(s, reparam)) for s in observed]
    refused = [(s, why) for s, why in refused if why is not None]
    if refused:  # the site no other estimator of a score takes is the cause
        site, why = min(refused, key=lambda r: len(working_scores(r[0])))
        raise ValueError(why + " " + observation_advice(observed, plate)(site))
    keys = random.split(key, len(observed))
    return jnp.concatenate(
        [_site_draw(s, plate, k) for s, k in zip(observed, keys, strict=True)],
        axis=1,
    )


def normal_loc_scale(
    observed: list[dict[str, Any]],
    plate: DataPlate,
    family: type[Distribution] = Normal,
) -> tuple[jax.Array, jax.Array] | tuple[None, None]:
    """``(b, d)`` location and scale of every observed site, laid out like
    :func:`observed_values`, when all of them are of ``family`` (``Normal``;
    ``LogNormal``: the location and scale of the logarithm), each ``(1, d)``
    when it does not vary along the data plate; ``(None, None)``
    otherwise."""
    pairs = [_loc_scale(s, plate, family) for s in observed]
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
