"""Each observed site's values along the data plate: what a score reads of
the likelihood beyond its log density.

From one site of a model trace (and the :class:`DataPlate` of
:mod:`~numpyro_pvi._trace.data_plate`): simulated draws ``(b, d)``, the
observed values, a Normal likelihood's location and scale. Which scores a
site supports is :mod:`~numpyro_pvi._trace.site_laws`'; the pmf over a
finite support :mod:`~numpyro_pvi.scores._support`'s.

**Masks.** A site masked by :class:`numpyro.handlers.mask`,
``Distribution.mask`` or ``obs_mask=`` (NumPyro's ``MaskedDistribution``,
possibly under ``Independent`` and ``Expanded`` wrappers) has no density at
its masked components. Every extractor here and in
:mod:`~numpyro_pvi.scores._support` honours that: the observed and
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
from numpyro.distributions import Distribution, Independent, MaskedDistribution

from numpyro_pvi._trace.data_plate import DataPlate, observed_sites, per_observation
from numpyro_pvi._trace.site_laws import WRAPPERS, innermost


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


def value_mask(site: dict[str, Any], plate: DataPlate) -> jax.Array | None:
    """``(b, d)``: the component mask laid out like the site's values (each
    component repeated over the scalars of its event)."""
    mask = component_mask(site, plate)
    if mask is None:
        return None
    return jnp.repeat(mask, site_components(site).event_size, axis=1)


def masked_rows(rows: jax.Array, mask: jax.Array | None) -> jax.Array:
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
            masked_rows(
                per_observation(s["value"], plate, s["fn"].event_dim),
                value_mask(s, plate),
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
