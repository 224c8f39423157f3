"""The particle machinery shared by every objective: :func:`particle_terms`.

It draws particles from the guide, replays the model against each and
returns :class:`~numpyro_pvi.particles.ParticleTerms`; a :class:`ParticleSpec`
says what the caller needs. Quantities that do not depend on the particle are
read once from one trace; the rest under the objective's
``vectorize_particles_fn`` (``vmap`` by default), all under ``jit``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
from jax import random
from jax.lax import stop_gradient
from numpyro.distributions import Unit
from numpyro.infer.elbo import ELBO

from numpyro_pvi._trace.data_plate import (
    WHOLE_DATA,
    DataPlate,
    data_sites,
    observation_weight,
    observed_sites,
    plate_of,
    site_log_lik,
)
from numpyro_pvi._trace.imputed import (
    NeedsConstantArguments,
    data_value,
    with_imputed_entries,
)
from numpyro_pvi._trace.site_laws import innermost, is_censored, sampler_failure
from numpyro_pvi._trace.site_values import (
    observation_mask,
    observation_widths,
    observed_values,
)
from numpyro_pvi._trace.structure import (
    amortized_latents,
    latent_dependent_observations,
    refuse_dependent_observations,
)
from numpyro_pvi._trace.terms import (
    GUIDE_DRAWS,
    LATENTS,
    LIKELIHOOD,
    LOG_LIK,
    LOG_LIK_SIM,
    LOG_Q_FIXED,
    OBS_WEIGHT,
    OBSERVED,
    REQUESTS,
    Likelihood,
    ObservationSites,
    ParticleTerms,
    Weights,
)
from numpyro_pvi._trace.tracing import (
    StratifiedGuide,
    guide_latent_log_density,
    guide_log_density,
    guide_sample_values,
    latent_sites,
    obs_mask_latents,
    seed_plates,
    sum_log_density,
    trace_particle,
)


def _vmap(fn: Callable, xs: Any) -> Any:
    return jax.vmap(fn)(xs)


@dataclass(frozen=True)
class ParticleSpec:
    """What a caller asks of :func:`particle_terms`.

    :ivar num_particles: ``M``, draws from the guide (per stratum).
    :ivar requests: quantities wanted besides the latent log densities and the
        weights, a subset of :data:`~numpyro_pvi.particles.REQUESTS`.
    :ivar data_plate: the plate that indexes observations (``None``: the plate
        the observed sites share; ``WHOLE_DATA``: none).
    :ivar objective: the caller's name, for messages.
    :ivar require_reparam: refuse sites without a reparameterised sampler; with
        ``False`` the guide draws with its parameters' gradient stopped.
    :ivar require_observed: refuse a model without observed site.
    :ivar fixed_observations: refuse an observed value computed from the
        latent draws.
    :ivar stratified: draw ``M`` particles from each stratum of a
        :class:`~numpyro_pvi.particles.StratifiedGuide`; ``False`` draws i.i.d.
    :ivar held_out: score the observations as held-out data: an amortized
        guide's local latents enter as the importance weight of the marginal.
    :ivar vectorize: how to map over particles, an ELBO's
        ``vectorize_particles_fn``.
    """

    num_particles: int
    requests: frozenset[str] = frozenset({LOG_LIK})
    data_plate: str | int | None = None
    objective: str = "objective"
    require_reparam: bool = True
    require_observed: bool = True
    fixed_observations: bool = True
    stratified: bool = True
    held_out: bool = False
    vectorize: Callable = field(default=_vmap)

    def __post_init__(self) -> None:
        object.__setattr__(self, "requests", frozenset(self.requests))
        unknown = self.requests - REQUESTS
        if unknown:
            raise ValueError(f"Unknown particle requests {sorted(unknown)}.")

    @classmethod
    def of(cls, elbo: ELBO, requests: Iterable[str], **options: Any) -> ParticleSpec:
        """The spec of an objective: its ``num_particles``, its
        ``vectorize_particles_fn`` and its class name, plus ``options``."""
        options.setdefault("objective", type(elbo).__name__)
        return cls(
            elbo.num_particles,
            frozenset(requests),
            vectorize=elbo.vectorize_particles_fn,
            **options,
        )


def particle_terms(
    rng_key: jax.Array,
    param_map: dict[str, jax.Array],
    model: Callable,
    guide: Callable,
    args: tuple,
    kwargs: dict,
    spec: ParticleSpec,
    *,
    plate_key: jax.Array | None = None,
) -> ParticleTerms:
    """Run the particles of ``spec`` through guide and model.

    All particles see the same subsample of every subsampled plate (the plate
    indices are drawn once per call), so the per-observation arrays line up.

    :param rng_key: random key.
    :param param_map: current parameter values, as passed to ``ELBO.loss``.
    :param model: the NumPyro model.
    :param guide: the guide.
    :param args: positional arguments of model and guide.
    :param kwargs: keyword arguments of model and guide.
    :param spec: what to draw and compute.
    :param plate_key: the key subsampled plates draw their indices from;
        by default the first of :func:`split_particle_key` of ``rng_key``.
        Calls with the same ``plate_key`` see the same subsample (further
        rounds of draws).
    :return: the terms, with a leading particle axis of ``num_particles``
        (``K * num_particles`` for ``K`` strata).
    """
    dependent: list[str] = []
    imputed: dict | None = {}
    if spec.fixed_observations:  # the callers that score observations
        dependent = latent_dependent_observations(model, args, kwargs)
        model, imputed = with_imputed_entries(model, args, kwargs, dependent)
        dependent = [n for n in dependent if n not in (imputed or {})]
    default_plate_key, rng_key = split_particle_key(rng_key)
    plate_key = default_plate_key if plate_key is None else plate_key
    strata = guide if spec.stratified and isinstance(guide, StratifiedGuide) else None
    num_strata = 1 if strata is None else strata.num_strata
    tracer = _ParticleTracer(
        seed_plates(model, plate_key),
        seed_plates(guide, plate_key),
        param_map,
        args,
        kwargs,
        spec,
        strata,
    )
    keys = random.split(rng_key, num_strata * spec.num_particles)
    components = jnp.repeat(jnp.arange(num_strata), spec.num_particles)
    shared = tracer.shared(keys[0], components[0])
    refused = [n for n in dependent if n in shared.names]
    if refused and imputed is None:  # traced arguments: constants may tell
        raise NeedsConstantArguments(
            f"{spec.objective}: the observed site '{refused[0]}' observes a "
            "value computed from the latent draws, and with the model's "
            "arguments traced the entries that are data cannot be told from "
            "imputed ones. Call it with concrete arguments (as SVI.run passes "
            "them), or observe the data alone with obs_mask=."
        )
    refuse_dependent_observations(refused, spec.objective)
    amortized = {}
    if spec.held_out:
        amortized = amortized_latents(
            tracer.model, tracer.guide, param_map, args, kwargs, shared.plate.name
        )
        refuse_amortized(amortized, spec)
    per_particle = spec.vectorize(
        lambda kc: tracer.particle(shared.plate, kc[0], kc[1], amortized),
        (keys, components),
    )
    if LIKELIHOOD in spec.requests:
        per_particle["likelihood"] = Likelihood(
            per_particle.pop("laws"),
            shared.laws,
            shared.values,
            per_particle.pop("sim_key"),
            None,
            shared.plate,
            tuple(shared.names),
            spec.require_reparam,
        )
    log_w, particle_weight = _weights(shared, components, spec.num_particles)
    return ParticleTerms(
        weights=Weights(particle_weight, log_w, shared.weight),
        num_strata=num_strata,
        mask=shared.mask,
        y_obs=shared.y_obs,
        observed=shared.observed,
        entropy=None if strata is None else strata.entropy_term(param_map),
        mutable_state=shared.mutable,
        observation_sites=ObservationSites(shared.widths),
        **per_particle,
    )


@dataclass(frozen=True)
class _Shared:
    """What does not depend on the particle, read from one trace."""

    plate: DataPlate
    names: list[str]  # the observed sites of the data plate
    laws: tuple  # their distributions in this trace
    values: tuple  # their observed values
    weight: jax.Array | None
    mask: jax.Array | None  # (b,) observations not masked out entirely
    y_obs: jax.Array | None
    observed: dict[str, jax.Array] | None
    log_omega_bar: jax.Array | None  # (K,) strata weights over the guide
    log_omega: jax.Array | None  # (b, K) strata weights per observation
    mutable: dict[str, Any] | None  # numpyro.mutable sites after this trace
    widths: tuple[tuple[str, int], ...]  # (site, values per observation)


@dataclass(frozen=True)
class _ParticleTracer:
    """Traces particles of one call of :func:`particle_terms`."""

    model: Callable
    guide: Callable
    param_map: dict[str, jax.Array]
    args: tuple
    kwargs: dict
    spec: ParticleSpec
    strata: StratifiedGuide | None

    def traces(
        self, keys: jax.Array, component: jax.Array
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Guide and model traces of the particle with ``keys`` (the four keys
        of :func:`_particle_keys`)."""
        model_key, guide_key = keys[0], keys[1]
        spec = self.spec
        return trace_particle(
            guide_key,
            model_key,
            self.param_map if spec.require_reparam else stop_gradient(self.param_map),
            self.model,
            self.guide,
            self.args,
            self.kwargs,
            strata=self.strata,
            component=None if self.strata is None else component,
            require_reparam=spec.require_reparam,
            objective=spec.objective,
            # draws held fixed: the model's own parameters keep their gradient
            model_params=self.param_map,
        )

    def shared(self, key: jax.Array, component: jax.Array) -> _Shared:
        """The particle-independent quantities, from the trace of ``key``."""
        spec, requests = self.spec, self.spec.requests
        guide_trace, model_trace = self.traces(_particle_keys(key), component)
        observed = observed_sites(model_trace)
        if observed or spec.require_observed:
            plate = plate_of(model_trace, spec.data_plate)
        else:  # a model without data: no observation to score
            plate = DataPlate(None, 0, 1, 0)
        observed = data_sites(observed, plate)[0]
        weight = None
        if OBS_WEIGHT in requests:
            weight = observation_weight(observed, plate) if observed else jnp.ones(0)
        log_omega_bar = log_omega = None
        if self.strata is not None:
            log_omega_bar, log_omega = self._strata_weights(model_trace, plate)
        return _Shared(
            plate,
            [s["name"] for s in observed],
            tuple(s["fn"] for s in observed),
            tuple(s["value"] for s in observed),
            weight,
            observation_mask(observed, plate) if observed else None,
            observed_values(observed, plate) if LIKELIHOOD in requests else None,
            {s["name"]: data_value(s) for s in observed_sites(model_trace)}
            if OBSERVED in requests
            else None,
            log_omega_bar,
            log_omega,
            _mutable_values(guide_trace, model_trace),
            observation_widths(observed, plate) if observed else (),
        )

    def _strata_weights(
        self, model_trace: dict[str, Any], plate: DataPlate
    ) -> tuple[jax.Array, jax.Array]:
        """``(K,)`` strata log weights and ``(b, K)`` per observation of this
        (sub)sample (the averaged ones without a data plate)."""
        assert self.strata is not None  # only stratified draws have strata
        mean_log_w, per_obs = self.strata.stratum_log_weights(self.param_map)
        b = plate.subsample_size
        if per_obs is None or self.spec.data_plate == WHOLE_DATA:
            return mean_log_w, jnp.broadcast_to(mean_log_w, (b,) + mean_log_w.shape)
        if plate.name is None:
            raise ValueError(
                "The guide's strata weights depend on covariates of the "
                "observations (gating_covariates), but the model has no data "
                "plate to align them with. Put the observations in a plate."
            )
        if per_obs.shape[0] != plate.size:
            raise ValueError(
                f"The guide's gating_covariates have {per_obs.shape[0]} rows but "
                f"the data plate '{plate.name}' has {plate.size} observations: "
                "pass one covariate row per observation, in the order of the plate."
            )
        if plate.batch:  # a batch dimension is never subsampled
            return mean_log_w, per_obs
        return mean_log_w, per_obs[model_trace[plate.name]["value"]]

    def particle(
        self,
        plate: DataPlate,
        key: jax.Array,
        component: jax.Array,
        amortized: Mapping[str, str],
    ) -> dict[str, Any]:
        """The per-particle fields of :class:`ParticleTerms` for one draw."""
        requests = self.spec.requests
        keys = _particle_keys(key)
        with jax.named_scope("trace"):
            guide_trace, model_trace = self.traces(keys, component)
        # observed sites outside the data plate are terms of the joint
        # density (a prior written as an observed site): with the prior
        observed, density_terms = data_sites(observed_sites(model_trace), plate)
        masks = obs_mask_latents(model_trace)
        with jax.named_scope("log_density"):
            out: dict[str, Any] = {
                "log_prior": sum_log_density(latent_sites(model_trace))
                + sum_log_density(density_terms),
                "log_q": guide_latent_log_density(guide_trace, masks),
            }
        if LOG_LIK in requests:
            zeros = jnp.zeros((plate.subsample_size,))
            pairs = [site_log_lik(s, plate) for s in observed]
            out["log_lik"] = sum((u for u, _ in pairs), start=zeros)
            out["log_lik_scaled"] = sum((c for _, c in pairs), start=zeros)
        if LOG_LIK_SIM in requests:
            out["log_lik_sim"] = _log_lik_sim(observed, plate, keys[2])
        if LIKELIHOOD in requests:  # the laws, and the key of simulations
            out["laws"], out["sim_key"] = tuple(s["fn"] for s in observed), keys[2]
        if requests & {LOG_Q_FIXED, GUIDE_DRAWS}:
            draws = guide_sample_values(self.guide, guide_trace)
            if GUIDE_DRAWS in requests:
                out["guide_draws"] = draws
            if LOG_Q_FIXED in requests:
                out["log_q_fixed"] = guide_log_density(
                    self.guide,
                    self.param_map,
                    draws,
                    keys[3],
                    self.args,
                    self.kwargs,
                    masks,
                )
        if LATENTS in requests:
            out["latents"] = {s["name"]: s["value"] for s in latent_sites(model_trace)}
        if amortized and "log_lik" in out:
            out["log_lik_sim"] = None  # the likelihood alone: not comparable
            out["log_lik"] = out["log_lik"] + sum(
                site_log_lik(model_trace[n], plate)[0]
                - site_log_lik(guide_trace[n], plate)[0]
                for n in amortized
            )
        return out


#: What the held-out scores of amortized local latents read: the log score.
_AMORTIZED_REQUESTS = frozenset(
    {LOG_LIK, LOG_LIK_SIM, OBS_WEIGHT, OBSERVED, LATENTS, GUIDE_DRAWS, LOG_Q_FIXED}
)


def refuse_amortized(amortized: Mapping[str, str], spec: ParticleSpec) -> None:
    """Refuse a held-out score other than the log score where the guide's
    local latents read the data (``amortized``: site -> argument): their
    draws given the observation would score its reconstruction."""
    if not amortized or spec.requests <= _AMORTIZED_REQUESTS:
        return
    site, argument = next(iter(amortized.items()))
    raise ValueError(
        f"{spec.objective}: the guide draws the local latent site '{site}' from "
        f"the data it is scored on (its argument {argument} carries the "
        "observations: an amortized encoder), so its draws reconstruct each "
        "observation and a score from them would be too good. The held-out log "
        "score corrects for it (score='log': the importance-weighted marginal "
        "E_q[p(y|z, θ) p(z|θ) / q(z|y)]); the other scores need the local "
        "latents drawn without the observation: pass the guide data that do "
        f"not hold the observations scored through {argument}, or use "
        "score='log'."
    )


def _log_lik_sim(
    observed: list[dict[str, Any]], plate: DataPlate, key: jax.Array
) -> jax.Array | None:
    """``(b,)`` each observation's log-likelihood at one simulation of it
    (``None`` where a site has no outcome to simulate)."""
    keys = random.split(random.fold_in(key, 2), len(observed))
    total = jnp.zeros((plate.subsample_size,))
    for site, site_key in zip(observed, keys, strict=True):
        fn = site["fn"]
        if is_censored(fn) or isinstance(innermost(fn), Unit) or sampler_failure(fn):
            return None
        draw = jnp.broadcast_to(fn.sample(site_key), jnp.shape(site["value"]))
        total = total + site_log_lik({**site, "value": draw}, plate)[0]
    return stop_gradient(total)


def _mutable_values(
    guide_trace: dict[str, Any], model_trace: dict[str, Any]
) -> dict[str, Any] | None:
    """The values of the ``numpyro.mutable`` sites of guide and model after
    they ran (e.g. a batch-norm layer's running statistics), as NumPyro's
    ``Trace_ELBO`` returns them with one particle; ``None`` without any."""
    values = {
        name: site["value"]
        for tr in (guide_trace, model_trace)
        for name, site in tr.items()
        if site["type"] == "mutable"
    }
    return values or None


def split_particle_key(rng_key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The key protocol of :func:`particle_terms`: ``rng_key`` splits into
    the plate key (subsampled plates' indices, shared by every particle) and
    the draws key, which splits into one key per particle, each of which
    splits into four (:func:`_particle_keys`). A caller that needs the same
    subsample in a further call passes the plate key as ``plate_key``."""
    plate_key, draws_key = random.split(rng_key)
    return plate_key, draws_key


def _particle_keys(key: jax.Array) -> jax.Array:
    """The keys of one particle's model, guide, simulations and guide re-run."""
    return random.split(key, 4)


def _weights(
    shared: _Shared, components: jax.Array, num_particles: int
) -> tuple[jax.Array, jax.Array]:
    """``(K M, b)`` log weights in each observation's predictive and ``(K M,)``
    weights in expectations over the guide (``1/M`` for i.i.d. draws)."""
    if shared.log_omega is None:
        b = shared.plate.subsample_size
        m = components.shape[0]
        log_w = jnp.full((m, b), -math.log(m), dtype=jnp.result_type(float))
        return log_w, jnp.full((m,), 1.0 / m, dtype=log_w.dtype)
    assert shared.log_omega_bar is not None  # set together with log_omega
    log_w = shared.log_omega.T[components] - math.log(num_particles)
    particle_weight = jnp.exp(shared.log_omega_bar[components]) / num_particles
    return log_w, particle_weight
