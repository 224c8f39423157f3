r"""The CRPS of Normal-mixture likelihoods in closed form, without simulations.

For :math:`p(y \mid \theta) = \sum_c w_c\, \mathcal{N}(y; \mu_c, \sigma_c^2)`
(``MixtureSameFamily`` or ``MixtureGeneral`` of Normals) and
:math:`A(\mu, \sigma) = \mathbb{E}|X|`, :math:`X \sim \mathcal{N}(\mu, \sigma^2)`,

.. math::

    \mathbb{E}|Y - y| = \sum_c w_c\, A(y - \mu_c, \sigma_c), \qquad
    \mathbb{E}|Y - Y'| = \sum_{c, c'} w_c w'_{c'}\,
    A\bigl(\mu_c - \mu'_{c'}, \sqrt{\sigma_c^2 + \sigma'^2_{c'}}\bigr).

**References**

1. Grimit, E. P., Gneiting, T., Berrocal, V. J. & Johnson, N. A. (2006).
   *The continuous ranked probability score for circular variables and its
   application to mesoscale forecast ensemble verification*. QJRMS 132.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from numpyro.distributions import (
    Distribution,
    MixtureGeneral,
    MixtureSameFamily,
    Normal,
)

from numpyro_pvi._trace.data_plate import DataPlate
from numpyro_pvi._trace.site_laws import innermost
from numpyro_pvi._trace.site_values import parameter_rows
from numpyro_pvi._trace.terms import Likelihood, ParticleTerms
from numpyro_pvi.scores.closed_forms import CRPSForm, register_crps
from numpyro_pvi.scores.closed_forms.normal import normal_abs_mean

#: ``(weights, locations, scales)`` of the components, each ``(b, C)``.
Components = tuple[jax.Array, jax.Array, jax.Array]


def _normal_parts(base: Distribution) -> list[Distribution] | None:
    """The components of a mixture of scalar Normals (``MixtureSameFamily``
    of a ``Normal``, ``MixtureGeneral`` of ``Normal`` components); ``None``
    for any other distribution."""
    if isinstance(base, MixtureSameFamily):
        parts = [base.component_distribution]
    elif isinstance(base, MixtureGeneral):
        parts = list(base.component_distributions)
    else:
        return None
    if any(type(innermost(p)) is not Normal or p.event_shape for p in parts):
        return None
    return parts


def _normal_components(mixture: Distribution) -> tuple[jax.Array, jax.Array] | None:
    """Locations and scales of a mixture of scalar Normals, broadcasting
    against ``(*batch, C)``; ``None`` for any other mixture."""
    parts = _normal_parts(mixture)
    if parts is None:
        return None
    # as given (right-aligned with the batch shape; a scale shared by every
    # observation stays one per component)
    loc, scale = (
        [jnp.asarray(getattr(innermost(p), a)) for p in parts] for a in ("loc", "scale")
    )
    if isinstance(mixture, MixtureSameFamily):
        return loc[0], scale[0]
    return _stack(loc), _stack(scale)


def _stack(xs: list[jax.Array]) -> jax.Array:
    shape = jnp.broadcast_shapes(*(x.shape for x in xs))
    return jnp.stack([jnp.broadcast_to(x, shape) for x in xs], axis=-1)


def _site_components(site: dict[str, Any], plate: DataPlate) -> Components | None:
    fn = site["fn"]
    mixture = innermost(fn)
    components = _normal_components(mixture)
    if components is None:
        return None
    c = mixture.mixture_size
    shape = jnp.broadcast_shapes(fn.shape(), jnp.shape(site["value"])) + (c,)
    rows = [
        parameter_rows(x, shape, plate, fn.event_dim + 1)
        for x in (mixture.mixing_distribution.probs, *components)
    ]
    if rows[0].shape[1] != c:  # several values per observation
        return None
    return rows[0], rows[1], rows[2]


def _leading(components: Components) -> Components:
    # the components' axis first: the sums over it add whole (M, b) slabs,
    # where a trailing axis of a few components is reduced (and its
    # gradient broadcast) several times slower on XLA's CPU backend
    w, loc, scale = (jnp.moveaxis(x, -1, 0) for x in components)
    return w, loc, scale


def mixture_abs_mean(components: Components, y: jax.Array) -> jax.Array:
    r""":math:`\mathbb{E}|Y - y|` for :math:`Y` the mixture ``components``
    (arrays ``(..., C)``), ``y`` broadcasting against ``(...)``."""
    w, loc, scale = _leading(components)
    return jnp.sum(w * normal_abs_mean(y - loc, scale), axis=0)


def mixture_pair_abs_mean(a: Components, b: Components) -> jax.Array:
    r""":math:`\mathbb{E}|Y - Y'|` for independent :math:`Y` and :math:`Y'`
    of the mixtures ``a`` and ``b`` (arrays ``(..., C)``): ``(...)``."""
    (w_a, loc_a, scale_a), (w_b, loc_b, scale_b) = _leading(a), _leading(b)
    scale = jnp.sqrt(jnp.square(scale_a[:, None]) + jnp.square(scale_b[None]))
    terms = (
        w_a[:, None] * w_b[None] * normal_abs_mean(loc_a[:, None] - loc_b[None], scale)
    )
    return jnp.sum(terms, axis=(0, 1))


@register_crps(
    MixtureSameFamily,
    MixtureGeneral,
    applies=lambda base: bool(_normal_parts(base)),
    name="Normal mixture",
)
def _normal_mixture(
    terms: ParticleTerms, likelihood: Likelihood, y: jax.Array
) -> CRPSForm | None:
    plate = likelihood.plate
    mixture = likelihood.per_particle(
        lambda sites, _: _site_components(sites[0], plate)
    )
    if mixture is None:  # several values per observation
        return None
    return CRPSForm(mixture_abs_mean(mixture, y), mixture, mixture_pair_abs_mean)
