"""The fields of :class:`~numpyro_pvi.particles.ParticleTerms` that one
particle fills, by request: :data:`PER_PARTICLE` maps each request of
:data:`~numpyro_pvi.particles.FIELDS` to the extractor that reads them from
the particle's traces (:class:`Particle`), as
:func:`~numpyro_pvi._core.particles.particle_terms` calls them under the
objective's ``vectorize_particles_fn``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from numpyro.distributions import LogNormal, Unit

from numpyro_pvi._core.data_plate import DataPlate, site_log_lik
from numpyro_pvi._core.normal_mixture import normal_mixture
from numpyro_pvi._core.poisson import (
    poisson_draws,
    poisson_likelihoods,
    poisson_parts,
)
from numpyro_pvi._core.site_laws import innermost, is_censored, sampler_failure
from numpyro_pvi._core.site_support import (
    binomial_logits_count,
    ordered_pmf,
    site_log_pmf,
    site_pmf,
)
from numpyro_pvi._core.site_values import (
    normal_loc_scale,
    scalar_observation,
    simulated_values,
)
from numpyro_pvi._core.tracing import (
    guide_log_density,
    guide_sample_values,
    latent_sites,
)
from numpyro_pvi.particles import (
    BINOMIAL,
    FINITE_PMF,
    GUIDE_DRAWS,
    LATENTS,
    LOG_LIK,
    LOG_LIK_SIM,
    LOG_PMF,
    LOG_Q_FIXED,
    PMF,
    Y_LOC_SCALE,
    Y_LOG_LOC_SCALE,
    Y_NORMAL_MIXTURE,
    Y_POISSON,
    Y_SIM,
)


@dataclass(frozen=True)
class Particle:
    """One particle's traces and what its extractors read beside them."""

    guide: Callable
    param_map: dict[str, jax.Array]
    args: tuple
    kwargs: dict
    reparam: bool  # simulated observations differentiable in the draws
    plate: DataPlate
    observed: list[dict[str, Any]]  # the observed sites of the data plate
    guide_trace: dict[str, Any]
    model_trace: dict[str, Any]
    keys: jax.Array  # _particle_keys
    masks: Any  # obs_mask latents
    requests: frozenset[str]  # what the caller asked for

    def guide_values(self) -> dict[str, jax.Array]:
        return guide_sample_values(self.guide, self.guide_trace)


def _log_lik(p: Particle) -> dict[str, jax.Array]:
    zeros = jnp.zeros((p.plate.subsample_size,))
    pairs = [site_log_lik(s, p.plate) for s in p.observed]
    return {
        "log_lik": sum((u for u, _ in pairs), start=zeros),
        "log_lik_scaled": sum((c for _, c in pairs), start=zeros),
    }


def _log_lik_sim(p: Particle) -> dict[str, jax.Array | None]:
    keys = jax.random.split(jax.random.fold_in(p.keys[2], 2), len(p.observed))
    total = jnp.zeros((p.plate.subsample_size,))
    for site, key in zip(p.observed, keys, strict=True):
        fn = site["fn"]
        if is_censored(fn) or isinstance(innermost(fn), Unit) or sampler_failure(fn):
            return {"log_lik_sim": None}  # no simulated outcome compares
        draw = jnp.broadcast_to(fn.sample(key), jnp.shape(site["value"]))
        total = total + site_log_lik({**site, "value": draw}, p.plate)[0]
    return {"log_lik_sim": jax.lax.stop_gradient(total)}


def _y_sim(p: Particle) -> dict[str, jax.Array | None]:
    if scalar_observation(p.observed, p.plate) and (
        (FINITE_PMF in p.requests and ordered_pmf(p.observed))
        or (
            p.reparam
            and (
                normal_mixture(p.observed, p.plate) is not None
                or poisson_likelihoods(p.observed)
            )
        )
    ):
        # read from the pmf instead (no draw: its sampler may not take these
        # arguments), or no reparameterised draw (a discrete component or
        # count): the scores of scalar observations take the closed form, or
        # say so (scores.base.simulations); others refuse the site
        # (_site_draw)
        return {"y_sim": None}
    return {"y_sim": simulated_values(p.observed, p.plate, p.keys[2], p.reparam)}


def _y_loc_scale(p: Particle) -> dict[str, jax.Array | None]:
    y_loc, y_scale = normal_loc_scale(p.observed, p.plate)
    return {"y_loc": y_loc, "y_scale": y_scale}


def _y_log_loc_scale(p: Particle) -> dict[str, jax.Array | None]:
    y_log_loc, y_log_scale = normal_loc_scale(p.observed, p.plate, LogNormal)
    return {"y_log_loc": y_log_loc, "y_log_scale": y_log_scale}


def _y_normal_mixture(p: Particle) -> dict[str, jax.Array | None]:
    parts = normal_mixture(p.observed, p.plate) or (None, None, None)
    return dict(zip(("y_mix_weight", "y_mix_loc", "y_mix_scale"), parts, strict=True))


def _y_poisson(p: Particle) -> dict[str, jax.Array | None]:
    rate_key, count_key = jax.random.split(jax.random.fold_in(p.keys[2], 1))
    parts = poisson_parts(p.observed, p.plate, rate_key)  # not y_sim's draws
    if parts is None:
        return {"y_rate": None, "y_gate": None, "y_count_sim": None}
    rate, gate = parts
    counts = poisson_draws(count_key, rate, p.plate.subsample_size)
    return {"y_rate": rate, "y_gate": gate, "y_count_sim": counts}


def _pmf(p: Particle) -> dict[str, jax.Array | None]:
    logits, count = binomial_logits_count(p.observed, p.plate)
    return {"pmf": site_pmf(p.observed, p.plate), **_binomial(logits, count)}


def _finite_pmf(p: Particle) -> dict[str, jax.Array | None]:
    if not ordered_pmf(p.observed):
        return {"pmf": None, **_binomial(None, None)}
    return _pmf(p)


def _binomial(logits: Any, count: Any) -> dict[str, Any]:
    return {"binomial_logits": logits, "binomial_count": count}


def _log_q_fixed(p: Particle) -> dict[str, jax.Array]:
    fixed = p.guide_values()
    log_q = guide_log_density(
        p.guide, p.param_map, fixed, p.keys[3], p.args, p.kwargs, p.masks
    )
    return {"log_q_fixed": log_q}


#: The per-particle extractors, keyed by request: what each fills is
#: :data:`~numpyro_pvi.particles.FIELDS` (``y_obs``, ``obs_support``,
#: ``weight`` and ``observed`` do not depend on the particle: read once, in
#: :meth:`ParticleTracer.shared`).
PER_PARTICLE: dict[str, Callable[[Particle], dict[str, Any]]] = {
    LOG_LIK: _log_lik,
    LOG_LIK_SIM: _log_lik_sim,
    Y_SIM: _y_sim,
    Y_LOC_SCALE: _y_loc_scale,
    Y_LOG_LOC_SCALE: _y_log_loc_scale,
    Y_NORMAL_MIXTURE: _y_normal_mixture,
    Y_POISSON: _y_poisson,
    LOG_PMF: lambda p: {"log_pmf": site_log_pmf(p.observed, p.plate)},
    PMF: lambda p: {"pmf": site_pmf(p.observed, p.plate)},
    BINOMIAL: lambda p: _binomial(*binomial_logits_count(p.observed, p.plate)),
    FINITE_PMF: _finite_pmf,
    LOG_Q_FIXED: _log_q_fixed,
    GUIDE_DRAWS: lambda p: {"guide_draws": p.guide_values()},
    LATENTS: lambda p: {
        "latents": {s["name"]: s["value"] for s in latent_sites(p.model_trace)}
    },
}
