"""The draws of a fitted guide as vectors in the unconstrained space of its
own sample sites, and the model evaluated at given such vectors: what
moment matching (:mod:`~numpyro_pvi.evaluation.moment_matching`) moves and
weighs.

Each site's value is mapped by ``biject_to`` of its support; the log
determinant of that map enters the guide's density at the moved draws.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from numpyro.distributions import biject_to
from numpyro.handlers import seed, substitute, trace

from numpyro_pvi._trace.data_plate import (
    data_sites,
    observed_sites,
    plate_of,
    site_log_lik,
)
from numpyro_pvi._trace.imputed import NeedsConstantArguments, with_imputed_entries
from numpyro_pvi._trace.particles import ParticleSpec, particle_terms
from numpyro_pvi._trace.structure import (
    amortized_latents,
    latent_dependent_observations,
)
from numpyro_pvi._trace.terms import GUIDE_DRAWS
from numpyro_pvi._trace.tracing import (
    guide_latent_log_density,
    is_sample_draw,
    obs_mask_latents,
    seed_plates,
    trace_particle,
)


class _Site(NamedTuple):
    name: str
    shape: tuple[int, ...]  # unconstrained shape
    transform: Any  # unconstrained -> the site's support


def _layout(
    key: jax.Array, params: dict, guide: Callable, args: tuple, kwargs: dict
) -> list[_Site]:
    """The guide's own sample sites and the bijection of each support."""
    tr = trace(substitute(seed(guide, key), data=params)).get_trace(*args, **kwargs)
    sites = []
    for name, site in tr.items():
        if not is_sample_draw(site):
            continue
        support = site["fn"].support
        if support.is_discrete:
            raise Unsupported(
                f"the guide's site '{name}' is discrete (moment matching moves "
                "continuous draws)"
            )
        transform = biject_to(support)
        shape = jnp.shape(transform.inv(site["value"]))
        sites.append(_Site(name, shape, transform))
    return sites


class Unsupported(Exception):
    """The guide cannot be moment-matched (the reason in the message)."""


def _pack(values: dict, layout: list[_Site]) -> jax.Array:
    return jnp.concatenate(
        [jnp.reshape(s.transform.inv(values[s.name]), -1) for s in layout]
    )


def _unpack(u: jax.Array, layout: list[_Site]) -> tuple[dict, jax.Array]:
    """The sites' values at ``u`` and ``log |det J|`` of the map."""
    values, log_det, start = {}, jnp.zeros(()), 0
    for s in layout:
        size = math.prod(s.shape)
        x = jnp.reshape(u[start : start + size], s.shape)
        start += size
        value = s.transform(x)
        values[s.name] = value
        log_det = log_det + jnp.sum(s.transform.log_abs_det_jacobian(x, value))
    return values, log_det


def draw_unconstrained(key, params, args, kwargs, *, model, guide, num_draws, plate):
    """``(S, D)`` unconstrained i.i.d. draws of the guide."""
    spec = ParticleSpec(
        num_draws,
        frozenset({GUIDE_DRAWS}),
        plate,
        objective="moment matching",
        require_reparam=False,
        fixed_observations=False,  # the caller's draws were checked
        stratified=False,
    )
    terms = particle_terms(key, params, model, guide, args, kwargs, spec)
    layout = _layout(key, params, guide, args, kwargs)
    return jax.vmap(lambda v: _pack(v, layout))(terms.guide_draws)


def _at_draws(key, params, args, kwargs, u, model, guide, plate):
    """``(S,)`` the guide's log density at the unconstrained draws ``u``
    ``(S, D)`` and ``(S, n)`` the log-likelihood of every observation."""
    layout = _layout(key, params, guide, args, kwargs)
    # imputed entries of observed sites: terms of the joint, not of log_lik
    dependent = latent_dependent_observations(model, args, kwargs)
    split, imputed = with_imputed_entries(model, args, kwargs, dependent)
    seeded_model = seed_plates(split, key)

    def one(u_s: jax.Array) -> tuple[jax.Array, jax.Array]:
        values, log_det = _unpack(u_s, layout)
        fixed_guide = substitute(seed_plates(guide, key), data=values)
        guide_trace, model_trace = trace_particle(
            key,
            key,
            params,
            seeded_model,
            fixed_guide,
            args,
            kwargs,
            require_reparam=False,
        )
        log_q = guide_latent_log_density(
            guide_trace, obs_mask_latents(model_trace), draws_only=True
        )
        data = plate_of(model_trace, plate)
        sites = data_sites(observed_sites(model_trace), data)[0]
        if imputed is None and {s["name"] for s in sites} & set(dependent):
            raise NeedsConstantArguments("moment matching: traced arguments")
        log_lik = sum(site_log_lik(s, data)[0] for s in sites)
        amortized = amortized_latents(
            seeded_model, guide, params, args, kwargs, data.name
        )
        for name in amortized:  # the importance weight of the local latents
            log_lik += site_log_lik(model_trace[name], data)[0]
            log_lik -= site_log_lik(guide_trace[name], data)[0]
        return log_q + log_det, jnp.asarray(log_lik)

    return jax.vmap(one)(u)


def evaluate_all(key, params, args, kwargs, u, *, model, guide, plate):
    """:func:`_at_draws` of one set of draws."""
    return _at_draws(key, params, args, kwargs, u, model, guide, plate)


def evaluate_sets(key, params, args, kwargs, u, index, *, model, guide, plate):
    """For ``C`` sets of draws ``u`` ``(C, S, D)``, each moved toward
    observation ``index[c]``: ``(C, S)`` log q and ``(C, S)`` the
    log-likelihood of that observation, one set after another."""

    def one_set(u_c: jax.Array, i: jax.Array) -> tuple[jax.Array, jax.Array]:
        log_q, log_lik = _at_draws(key, params, args, kwargs, u_c, model, guide, plate)
        return log_q, log_lik[:, i]

    return jax.lax.map(lambda x: one_set(*x), (u, index))
