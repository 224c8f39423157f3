"""The particle machinery shared by every objective in :mod:`numpyro_pvi`.

One function, :func:`particle_terms`, draws ``M`` particles from the guide,
replays the model against each of them and returns, as arrays with a leading
particle axis, everything an objective needs:

- per-particle latent log densities ``log p(θ)`` and ``log q(θ)`` (site
  ``scale`` from NumPyro handlers honoured, as in :class:`~numpyro.infer.Trace_ELBO`);
- the ``(M, b)`` per-observation log-likelihood ``log p(y_i | θ_j)`` over the
  *data plate* (several observed sites at one index form one observation);
- the per-observation weight (the subsample scale ``N / b`` times any handler
  scale) so that ``Σ_i w_i s_i`` estimates a sum over the whole data set;
- on request: reparameterised draws ``y_sim ~ p(y_i | θ_j)`` of the observed
  sites (CRPS, energy score), the log pmf over a finite support (quadratic
  score), and ``log q_φ`` evaluated at the draws with their gradient stopped
  (score-function estimators, SoftCVI).

Every objective goes through this module: there is no second particle loop.
All work is vectorised over particles with the objective's
``vectorize_particles_fn`` and over observations as arrays along the data
plate, so it runs under ``jit`` and shards with :mod:`jax.sharding`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from jax.lax import stop_gradient
from numpyro.distributions import Delta, ExpandedDistribution, Independent
from numpyro.handlers import replay, seed, substitute, trace
from numpyro.infer.util import _without_rsample_stop_gradient, is_identically_one
from numpyro.primitives import Messenger
from numpyro.util import check_model_guide_match

__all__ = [
    "GUIDE_DRAWS",
    "LATENTS",
    "LOG_LIK",
    "LOG_PMF",
    "LOG_Q_FIXED",
    "OBSERVED",
    "OBS_WEIGHT",
    "WHOLE_DATA",
    "Y_SIM",
    "ParticleTerms",
    "find_data_plate",
    "log_joint",
    "log_mean_exp",
    "particle_logsumexp",
    "particle_sum",
    "particle_log_weights",
    "particle_weights",
    "guide_log_density",
    "particle_terms",
    "require_reparam_guide",
    "seed_plates",
]

#: Names of the optional quantities that an objective or score can request.
LOG_LIK = "log_lik"
Y_SIM = "y_sim"
LOG_PMF = "log_pmf"
LOG_Q_FIXED = "log_q_fixed"
LATENTS = "latents"
OBS_WEIGHT = "weight"
GUIDE_DRAWS = "guide_draws"
OBSERVED = "observed"
_KNOWN_REQUESTS = frozenset(
    {LOG_LIK, Y_SIM, LOG_PMF, LOG_Q_FIXED, LATENTS, OBS_WEIGHT, GUIDE_DRAWS, OBSERVED}
)

#: ``data_plate=WHOLE_DATA`` treats all observed sites as one observation,
#: without looking for a data plate (objectives that need only the total
#: log-likelihood: ``log_lik`` is then ``(M, 1)`` with every site scale applied).
WHOLE_DATA = "<whole data set>"


class ParticleTerms(NamedTuple):
    """What one vectorised pass over ``M`` particles returns.

    Shapes use ``M`` for particles, ``b`` for the observations of the data
    plate in this (sub)sample, ``d`` for the flattened size of one
    observation and ``c``, ``K`` for the components of one observation and
    the size of their common finite support.

    :ivar log_prior: ``(M,)`` log density of the latent sites under the model
        (scaled as NumPyro scales them).
    :ivar log_q: ``(M,)`` log density of the guide at its draws (scaled).
    :ivar log_lik: ``(M, b)`` log-likelihood of each observation (unscaled):
        what a predictive score of the observation is computed from.
    :ivar log_lik_scaled: ``(M, b)`` the same with each observed site's own
        scale applied (subsample scale ``N / b`` times any handler scale), as
        NumPyro applies it: ``log_prior + log_lik_scaled.sum(1)`` is the log
        joint density :func:`numpyro.infer.util.log_density` gives.
    :ivar weight: ``(b,)`` weight of each observation's score in a data-set
        sum: the scale shared by every observed site of the observation
        (requested with ``"weight"``; sites of one observation with
        different scales are refused, see :func:`particle_terms`), else
        ``None``.
    :ivar subsample_scale: scalar ``N / b`` of the data plate (1 without
        subsampling).
    :ivar y_obs: ``(b, d)`` the observed values, one flattened row per
        observation (requested together with ``y_sim``), else ``None``.
    :ivar y_sim: ``(M, b, d)`` reparameterised draws from ``p(y_i | θ_j)``.
    :ivar log_pmf: ``(M, K, b, c)`` log pmf over the finite support (``K``
        values, ``-inf`` padding shorter supports) of each scalar component
        ``c`` of each observation ``b``.
    :ivar log_q_fixed: ``(M,)`` ``log q_φ`` at the draws with their gradient
        stopped: its gradient is the score function ``∇_φ log q_φ(θ)``.
    :ivar latents: ``{site: (M, *shape)}`` the values of the model's latent
        sample sites at each particle (constrained space, as the model sees
        them).
    :ivar guide_draws: ``{site: (M, *shape)}`` the values of the guide's own
        sample sites (e.g. ``_auto_latent`` of an ``AutoContinuous`` guide)
        at each particle, what :func:`guide_log_density` takes.
    :ivar observed: ``{site: value}`` the observed values as the model
        computes them (requested with ``"observed"``), else ``None``.
    :ivar log_w: ``(M, b)`` log weight of particle ``j`` in the predictive of
        observation ``i`` under *stratified* sampling (mixture guides, see
        :func:`particle_terms`), ``None`` for ``M`` i.i.d. draws (weights
        ``1/M``); scores use :func:`particle_log_weights`.
    :ivar particle_weight: ``(M,)`` weight of each particle in expectations
        over the guide (sums to one; ``None`` for i.i.d. draws); see
        :func:`particle_weights`.
    :ivar num_strata: number ``K`` of strata; the particles are ordered
        stratum-major, ``M / K`` consecutive draws per stratum.
    """

    log_prior: jax.Array
    log_q: jax.Array
    log_lik: jax.Array | None
    weight: jax.Array | None
    subsample_scale: jax.Array
    log_lik_scaled: jax.Array | None = None
    y_obs: jax.Array | None = None
    y_sim: jax.Array | None = None
    log_pmf: jax.Array | None = None
    log_q_fixed: jax.Array | None = None
    latents: dict[str, jax.Array] | None = None
    guide_draws: dict[str, jax.Array] | None = None
    observed: dict[str, jax.Array] | None = None
    log_w: jax.Array | None = None
    particle_weight: jax.Array | None = None
    num_strata: int = 1


# --------------------------------------------------------------------------
# trace helpers
# --------------------------------------------------------------------------


def _scaled_sum(site: dict[str, Any]) -> jax.Array:
    """Sum of a site's log density with its handler scale applied."""
    fn, value = site["fn"], site["value"]
    if site.get("intermediates"):
        log_prob = fn.log_prob(value, site["intermediates"])
    else:
        log_prob = fn.log_prob(value)
    scale = site["scale"]
    if scale is not None and not is_identically_one(scale):
        log_prob = scale * log_prob
    return jnp.sum(log_prob)


def _latent_sites(tr: dict[str, Any]) -> Iterable[dict[str, Any]]:
    return (s for s in tr.values() if s["type"] == "sample" and not s["is_observed"])


def _observed_sites(tr: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in tr.values() if s["type"] == "sample" and s["is_observed"]]


def _sum_log_density(sites: Iterable[dict[str, Any]]) -> jax.Array:
    return sum((_scaled_sum(s) for s in sites), start=jnp.zeros(()))


def require_reparam_guide(guide_trace: dict[str, Any], objective: str) -> None:
    """Raise if a latent site of the guide has no reparameterised sampler.

    :param guide_trace: a trace of the guide.
    :param objective: the objective's name, for the message.
    """
    for site in _latent_sites(guide_trace):
        if not site["fn"].has_rsample:
            raise ValueError(
                f"{objective}: the guide's latent site '{site['name']}' "
                f"({type(site['fn']).__name__}) has no reparameterised sampler, "
                "and this estimator differentiates through the draws. Use a "
                "continuous guide for that site, or an objective that does not "
                "need reparameterisation (SoftCVIELBO, SNISForwardKL, or "
                "PredictiveELBO(log_score_estimator='rejection'))."
            )


# --------------------------------------------------------------------------
# the data plate
# --------------------------------------------------------------------------


class _DataPlate(NamedTuple):
    name: str | None  # None: no data plate, the data form one observation
    dim: int  # negative batch dim of the plate
    size: int  # full size N
    subsample_size: int  # b


def _find_data_plate(
    model_trace: dict[str, Any], data_plate: str | None, *, warn: bool = True
) -> _DataPlate:
    observed = _observed_sites(model_trace)
    if not observed:
        raise ValueError(
            "The model has no observed site: predictive objectives score "
            "observations, so pass the data to a sample statement with obs=..."
        )
    if data_plate == WHOLE_DATA:
        return _DataPlate(None, 0, 1, 1)
    plates = {
        name: site for name, site in model_trace.items() if site["type"] == "plate"
    }
    if data_plate is not None:
        if data_plate not in plates:
            raise ValueError(
                f"data_plate='{data_plate}' is not a plate of the model; its plates "
                f"are {sorted(plates) or 'none'}."
            )
        for site in observed:
            if data_plate not in {f.name for f in site["cond_indep_stack"]}:
                raise ValueError(
                    f"Observed site '{site['name']}' is not inside "
                    f"data_plate='{data_plate}': every observed site must be "
                    "indexed by the data plate."
                )
        frame = next(f for f in observed[0]["cond_indep_stack"] if f.name == data_plate)
    else:
        frames = [{f for f in s["cond_indep_stack"]} for s in observed]
        shared = set.intersection(*frames)
        if not shared:
            if not warn:
                return _DataPlate(None, 0, 1, 1)
            warnings.warn(
                "No plate is shared by all observed sites "
                f"({[s['name'] for s in observed]}), so the data are treated as "
                "one observation. Put the observations in a plate, or name it "
                "with data_plate=..., to score them one by one.",
                UserWarning,
                stacklevel=4,
            )
            return _DataPlate(None, 0, 1, 1)
        if len(shared) > 1:
            subsampled = [f for f in shared if plates[f.name]["args"][0] > f.size]
            if len(subsampled) != 1:
                raise ValueError(
                    "The observed sites share several plates "
                    f"{sorted(f.name for f in shared)}; pass data_plate=... to "
                    "say which one indexes the observations."
                )
            shared = set(subsampled)
        (frame,) = shared
    full_size = int(plates[frame.name]["args"][0])
    return _DataPlate(frame.name, frame.dim, full_size, int(frame.size))


def find_data_plate(model_trace: dict[str, Any], data_plate: str | None) -> str | None:
    """The name of the data plate of a model trace (``None``: the data form one
    observation), found as :func:`particle_terms` finds it, without warning."""
    return _find_data_plate(model_trace, data_plate, warn=False).name


def _plate_axis_first(
    x: jax.Array, plate: _DataPlate, event_ndim: int, xp: Any = jnp
) -> jax.Array:
    """Move the data-plate axis of ``x`` (batch + event dims) to the front and
    broadcast it to the subsample size; returns shape ``(b, rest...)``.
    ``xp=numpy`` keeps a constant a (concrete) NumPy array under ``jit``."""
    x = xp.asarray(x)
    axis = plate.dim - event_ndim  # negative axis in the full shape
    if x.ndim < -axis:
        x = xp.reshape(x, (1,) * (-axis - x.ndim) + x.shape)
    x = xp.moveaxis(x, axis, 0)
    return xp.broadcast_to(x, (plate.subsample_size,) + x.shape[1:])


def _per_observation(
    x: jax.Array, plate: _DataPlate, event_ndim: int, xp: Any = jnp
) -> jax.Array:
    """``(b, d)``: one flattened row per observation."""
    x = _plate_axis_first(x, plate, event_ndim, xp)
    return xp.reshape(x, (plate.subsample_size, -1))


# --------------------------------------------------------------------------
# per-site extraction
# --------------------------------------------------------------------------


def _site_log_lik(
    site: dict[str, Any], plate: _DataPlate
) -> tuple[jax.Array, jax.Array]:
    """``(b,)`` log-likelihood of each observation, unscaled and with the
    site's own scale applied (``(1,)`` without a data plate)."""
    fn, value = site["fn"], site["value"]
    if site.get("intermediates"):
        log_prob = fn.log_prob(value, site["intermediates"])
    else:
        log_prob = fn.log_prob(value)
    scale = site["scale"]
    scaled = log_prob
    if scale is not None and not is_identically_one(scale):
        scaled = scale * log_prob
    if plate.name is None:
        return jnp.sum(log_prob)[None], jnp.sum(scaled)[None]
    return (
        jnp.sum(_per_observation(log_prob, plate, 0), axis=1),
        jnp.sum(_per_observation(scaled, plate, 0), axis=1),
    )


def _site_scale_rows(site: dict[str, Any], plate: _DataPlate, xp: Any) -> jax.Array:
    """``(b, c)``: the site's scale at each scalar component of each
    observation (``(1, c)`` without a data plate), computed with ``xp``."""
    # the batch shape from shapes alone: a likelihood-free site has no log_prob
    fn, value = site["fn"], site["value"]
    batch_shape = jnp.broadcast_shapes(
        fn.batch_shape, jnp.shape(value)[: max(jnp.ndim(value) - fn.event_dim, 0)]
    )
    scale = site["scale"]
    scale = xp.broadcast_to(
        xp.asarray(1.0 if scale is None else scale, dtype=float), batch_shape
    )
    if plate.name is None:
        return xp.reshape(scale, (1, -1))
    return _per_observation(scale, plate, 0, xp)


def _observation_weight(observed: list[dict[str, Any]], plate: _DataPlate) -> jax.Array:
    """``(b,)`` the scale shared by every observed site of each observation.

    A predictive score is a function of the whole observation, so it can be
    weighted by one number only: scales that differ between the sites (or
    the components) of one observation have no single meaning. Constant
    scales (the usual case, subsample scales included) are compared when
    the model is traced and refused with an error naming the sites and their
    scales. Scales that are traced values (computed from a model argument
    under ``jit``) can only be compared when the program runs: an
    observation whose sites' scales differ then gets a NaN weight, so the
    loss is NaN rather than a wrong number.
    """
    if any(isinstance(s["scale"], jax.core.Tracer) for s in observed):
        rows = jnp.concatenate([_site_scale_rows(s, plate, jnp) for s in observed], 1)
        equal = jnp.all(rows == rows[:, :1], axis=1)
        return jnp.where(equal, rows[:, 0], jnp.nan)
    rows = [_site_scale_rows(s, plate, np) for s in observed]
    values = np.concatenate(rows, axis=1)
    if not np.allclose(values, values[:, :1], rtol=1e-6, atol=0.0):
        per_site = {
            s["name"]: np.unique(r).round(6).tolist()
            for s, r in zip(observed, rows, strict=True)
        }
        raise ValueError(
            "The observed sites of one observation have different scales "
            f"({per_site}; subsample scale included): a predictive score is a "
            "function of the whole observation and can be weighted by one "
            "number only. Apply numpyro.handlers.scale to all sites of an "
            "observation alike, or score the sites separately (one data plate "
            "per site). The ELBO, PSIS and to_inference_data accept such models."
        )
    return jnp.asarray(values[:, 0])


def _dist_name(fn: Any) -> str:
    """The name of a distribution under its Expanded/Independent/Masked wrappers."""
    while hasattr(fn, "base_dist") and type(fn).__name__ in (
        "ExpandedDistribution",
        "Independent",
        "MaskedDistribution",
    ):
        fn = fn.base_dist
    return type(fn).__name__


def _site_draw(
    site: dict[str, Any], plate: _DataPlate, key: jax.Array, reparam: bool = True
) -> jax.Array:
    fn = site["fn"]
    if reparam and not fn.has_rsample:
        raise ValueError(
            f"Observed site '{site['name']}' ({_dist_name(fn)}) has no "
            "reparameterised sampler, which this score needs to differentiate "
            "simulated observations. Use a reparameterisable likelihood (or "
            "numpyro_pvi.distributions.Simulator), or score='log'."
        )
    draw = fn.sample(key)
    shape = jnp.broadcast_shapes(draw.shape, jnp.shape(site["value"]))
    draw = jnp.broadcast_to(draw, shape)
    return _per_observation(draw, plate, fn.event_dim)


#: Supports of at most this many values are enumerated one value at a time.
_UNROLLED_SUPPORT = 16


def _site_log_pmf(site: dict[str, Any], plate: _DataPlate) -> jax.Array:
    fn = site["fn"]
    if not getattr(fn, "has_enumerate_support", False):
        raise ValueError(
            f"Observed site '{site['name']}' ({_dist_name(fn)}) has no finite "
            "support to enumerate, which the quadratic (Brier) score needs. Use "
            "score='log', 'crps' or 'energy' for this likelihood."
        )
    # Independent (.to_event) and Expanded wrappers: enumerate the innermost
    # distribution; reinterpreted batch dims become components of the observation
    base = fn
    while isinstance(base, (Independent, ExpandedDistribution)):
        base = base.base_dist
    try:
        support = base.enumerate_support(expand=False)  # (K, 1, ..., 1[, event])
    except NotImplementedError:
        raise ValueError(
            f"Observed site '{site['name']}' ({_dist_name(fn)}) cannot "
            "enumerate its support, which the quadratic (Brier) score needs. Use "
            "score='log', 'crps' or 'energy' for this likelihood."
        ) from None
    component_ndim = len(fn.event_shape) - base.event_dim
    shape = fn.batch_shape + fn.event_shape[:component_ndim]

    def rows(log_pmf: jax.Array) -> jax.Array:  # (*base batch) -> (b, c)
        log_pmf = jnp.broadcast_to(
            log_pmf, jnp.broadcast_shapes(jnp.shape(log_pmf), shape)
        )
        rows = _plate_axis_first(log_pmf, plate, component_ndim)
        return jnp.reshape(rows, (plate.subsample_size, -1))

    # The support axis leads, so that each support value's pmf is one
    # contiguous (b, c) block: with a short trailing support axis XLA's CPU
    # loops were several times slower. Short supports are enumerated one
    # value at a time (fused far better than one broadcast log_prob).
    if support.shape[0] <= _UNROLLED_SUPPORT:
        return jnp.stack([rows(base.log_prob(v)) for v in support])
    return jax.vmap(rows)(base.log_prob(support))


def _pad_support(arrays: list[jax.Array]) -> jax.Array:
    """Concatenate ``(K_s, b, c_s)`` site pmfs into ``(K, b, c)``, padding
    shorter supports with ``-inf``."""
    k = max(a.shape[0] for a in arrays)
    padded = [
        jnp.pad(
            a,
            [(0, k - a.shape[0])] + [(0, 0)] * (a.ndim - 1),
            constant_values=-jnp.inf,
        )
        for a in arrays
    ]
    return jnp.concatenate(padded, axis=-1)


# --------------------------------------------------------------------------
# the machinery
# --------------------------------------------------------------------------


def _is_deterministic_transform(site: dict[str, Any]) -> bool:
    """Delta sites of a guide (e.g. the constrained sites of AutoContinuous
    guides) are functions of earlier draws, not draws of their own."""
    fn = site["fn"]
    while hasattr(fn, "base_dist") and not isinstance(fn, Delta):
        fn = fn.base_dist
    return isinstance(fn, Delta)


def _guide_sample_values(
    guide: Callable, guide_trace: dict[str, Any]
) -> dict[str, jax.Array]:
    """The values of the guide's own (non-deterministic) latent sample sites,
    with their gradient stopped: what fixes a draw of the guide."""
    fixed = {
        name: stop_gradient(site["value"])
        for name, site in guide_trace.items()
        if site["type"] == "sample"
        and not site["is_observed"]
        and not _is_deterministic_transform(site)
    }
    if not fixed and any(True for _ in _latent_sites(guide_trace)):
        raise ValueError(
            f"The guide ({type(guide).__name__}) has only point-mass (Delta) latent "
            "sites, so it has no log density to evaluate, which this objective "
            "needs. Use AutoNormal, AutoDiagonalNormal, AutoMultivariateNormal, "
            "AutoLowRankMultivariateNormal, AutoIAFNormal or a hand-written guide "
            "whose latent sites have densities."
        )
    return fixed


def guide_log_density(
    guide: Callable,
    param_map: dict[str, jax.Array],
    draws: dict[str, jax.Array],
    key: jax.Array,
    args: tuple,
    kwargs: dict,
) -> jax.Array:
    """``log q_φ`` at fixed values of the guide's sample sites (scaled as
    NumPyro scales sites); its gradient in ``param_map`` is the score function.

    :param guide: the guide (seeded for its plates, as in
        :func:`particle_terms`).
    :param param_map: the parameters, with their gradient.
    :param draws: the values of the guide's own sample sites
        (``ParticleTerms.guide_draws`` of one particle).
    :param key: random key for the guide's other randomness.
    :param args: positional arguments of the guide.
    :param kwargs: keyword arguments of the guide.
    """
    rerun = substitute(substitute(seed(guide, key), data=draws), data=param_map)
    try:
        tr = trace(rerun).get_trace(*args, **kwargs)
        return _sum_log_density(_latent_sites(tr))
    except NotImplementedError as err:
        raise ValueError(
            f"The guide ({type(guide).__name__}) cannot evaluate its log density "
            "at given points (it has no inverse transform), which this objective "
            "needs. Use AutoNormal, AutoDiagonalNormal, AutoMultivariateNormal, "
            "AutoLowRankMultivariateNormal, AutoIAFNormal or a hand-written guide."
        ) from err


def seed_plates(fn: Callable, plate_key: jax.Array) -> Callable:
    """``fn`` whose subsampled plates draw their indices from ``plate_key``
    (sample sites are left unseeded), as :func:`particle_terms` seeds model
    and guide."""
    return seed(fn, plate_key, hide_types=["sample", "prng_key", "control_flow"])


def particle_terms(
    rng_key: jax.Array,
    param_map: dict[str, jax.Array],
    model: Callable,
    guide: Callable,
    args: tuple,
    kwargs: dict,
    *,
    num_particles: int,
    vectorize_particles_fn: Callable,
    requests: Iterable[str] = (LOG_LIK,),
    data_plate: str | None = None,
    objective: str = "objective",
    require_reparam: bool = True,
    require_observed: bool = True,
    stratify: bool = False,
    plate_key: jax.Array | None = None,
) -> ParticleTerms:
    """Run ``num_particles`` particles through guide and model.

    All particles see the same subsample of every subsampled plate (the plate
    indices are drawn once per call), so the per-observation arrays line up.

    :param rng_key: random key.
    :param param_map: current parameter values, as passed to ``ELBO.loss``.
    :param model: the NumPyro model.
    :param guide: the guide.
    :param args: positional arguments of model and guide.
    :param kwargs: keyword arguments of model and guide.
    :param num_particles: ``M``, the number of draws from the guide.
    :param vectorize_particles_fn: how to map over particles (``vmap`` or
        ``lax.map``), the objective's ``vectorize_particles_fn``.
    :param requests: optional quantities wanted besides the latent log
        densities: any of ``"log_lik"`` (with ``log_lik_scaled``),
        ``"weight"``, ``"y_sim"``, ``"log_pmf"``, ``"log_q_fixed"``,
        ``"latents"``, ``"guide_draws"``, ``"observed"``. ``"weight"`` raises
        when the observed sites of one observation have different constant
        handler scales (traced scales that differ give a NaN weight).
    :param data_plate: name of the plate that indexes observations, or
        ``None`` to use the plate shared by all observed sites.
    :param objective: the calling objective's name, for error messages.
    :param require_reparam: raise when a latent site of the guide, or an
        observed site whose draws ``"y_sim"`` are requested, has no
        reparameterised sampler. With ``False`` no gradient flows through
        the draws (held-out evaluation, score-function and contrastive
        estimators): the guide draws with its parameters' gradient stopped.
    :param require_observed: raise when the model has no observed site. With
        ``False`` such a model has no observation: ``log_lik`` is ``(M, 0)``
        and ``weight`` is ``(0,)`` (``"y_sim"`` and ``"log_pmf"`` still need
        observations).
    :param stratify: if the guide is stratifiable (it has an integer
        ``num_strata`` attribute ``K``, e.g.
        :class:`~numpyro_pvi.guides.AutoGaussianMixture`), draw
        ``num_particles`` particles from *each* of its ``K`` components and
        return the weights ``log_w`` and ``particle_weight`` with which they
        enter: the predictive of observation ``i`` is
        ``Σ_k ω_k(x_i) (1/M) Σ_m p(y_i | θ_km)`` and expectations over the
        guide are ``Σ_k ω̄_k (1/M) Σ_m f(θ_km)``.
        Callers must consume the weights (:func:`particle_log_weights`);
        other guides ignore the flag.
    :param plate_key: the key subsampled plates draw their indices from;
        by default derived from ``rng_key``. Calls with the same
        ``plate_key`` see the same subsample (further rounds of draws).
    :return: :class:`ParticleTerms` with a leading particle axis of size
        ``num_particles`` (``K * num_particles`` when stratified).
    """
    requests = frozenset(requests)
    unknown = requests - _KNOWN_REQUESTS
    if unknown:
        raise ValueError(f"Unknown particle requests {sorted(unknown)}.")
    guide_fn = guide  # before seeding: stratification is read from it
    default_plate_key, rng_key = random.split(rng_key)
    plate_key = default_plate_key if plate_key is None else plate_key
    # Subsampled plates draw their indices from plate_key, identically for
    # every particle; sample sites get per-particle keys below.
    model = seed_plates(model, plate_key)
    guide = seed_plates(guide, plate_key)
    draw_params = param_map if require_reparam else stop_gradient(param_map)

    def one_particle(
        key: jax.Array, component: jax.Array | None = None
    ) -> dict[str, jax.Array]:
        model_key, guide_key, sim_key, rerun_key = random.split(key, 4)
        seeded_guide = substitute(seed(guide, guide_key), data=draw_params)
        if component is not None:
            seeded_guide = _draw_from_component(seeded_guide, component)
        with _without_rsample_stop_gradient():
            guide_trace = trace(seeded_guide).get_trace(*args, **kwargs)
        if require_reparam:
            require_reparam_guide(guide_trace, objective)
        seeded_model = substitute(
            replay(seed(model, model_key), guide_trace), data=draw_params
        )
        model_trace = trace(seeded_model).get_trace(*args, **kwargs)
        check_model_guide_match(model_trace, guide_trace)
        observed = _observed_sites(model_trace)
        if observed or require_observed:
            plate = _find_data_plate(model_trace, data_plate)
        else:  # a model without data: no observation to score
            plate = _DataPlate(None, 0, 1, 0)
        out = {
            "log_prior": _sum_log_density(_latent_sites(model_trace)),
            "log_q": _sum_log_density(_latent_sites(guide_trace)),
            "subsample_scale": jnp.asarray(plate.size / max(plate.subsample_size, 1)),
        }
        if OBS_WEIGHT in requests:
            out["weight"] = (
                _observation_weight(observed, plate) if observed else jnp.ones((0,))
            )
        if LOG_LIK in requests:
            zeros = jnp.zeros((plate.subsample_size,))
            pairs = [_site_log_lik(s, plate) for s in observed]
            out["log_lik"] = sum((u for u, _ in pairs), start=zeros)
            out["log_lik_scaled"] = sum((c for _, c in pairs), start=zeros)
        out.update(_draw_requests(requests, observed, plate, sim_key, require_reparam))
        if LOG_Q_FIXED in requests or GUIDE_DRAWS in requests:
            fixed = _guide_sample_values(guide_fn, guide_trace)
            if GUIDE_DRAWS in requests:
                out["guide_draws"] = fixed
            if LOG_Q_FIXED in requests:
                out["log_q_fixed"] = guide_log_density(
                    guide, param_map, fixed, rerun_key, args, kwargs
                )
        if component is not None:
            out.update(
                _stratum_log_weights(
                    guide_trace,
                    model_trace,
                    plate,
                    whole_data=data_plate == WHOLE_DATA,
                )
            )
        if LATENTS in requests:
            out["latents"] = {s["name"]: s["value"] for s in _latent_sites(model_trace)}
        if OBSERVED in requests:
            out["observed"] = {s["name"]: s["value"] for s in observed}
        return out

    num_strata = getattr(guide_fn, "num_strata", None) if stratify else None
    if isinstance(num_strata, int) and num_strata >= 1:
        keys = random.split(rng_key, num_strata * num_particles)
        components = jnp.repeat(jnp.arange(num_strata), num_particles)
        out = vectorize_particles_fn(lambda kc: one_particle(*kc), (keys, components))
        log_omega = out.pop("log_omega")[0]  # (b, K)
        log_w = log_omega.T[components] - math.log(num_particles)  # (K M, b)
        particle_weight = jnp.exp(out.pop("log_omega_bar")[0][components])
        strata = {
            "log_w": log_w,
            "particle_weight": particle_weight / num_particles,
            "num_strata": num_strata,
        }
    else:
        keys = random.split(rng_key, num_particles)
        out = vectorize_particles_fn(one_particle, keys)
        strata = {}
    return ParticleTerms(
        log_prior=out["log_prior"],
        log_q=out["log_q"],
        log_lik=out.get("log_lik"),
        weight=out["weight"][0] if "weight" in out else None,
        subsample_scale=out["subsample_scale"][0],
        log_lik_scaled=out.get("log_lik_scaled"),
        y_obs=out["y_obs"][0] if "y_obs" in out else None,
        y_sim=out.get("y_sim"),
        log_pmf=out.get("log_pmf"),
        log_q_fixed=out.get("log_q_fixed"),
        latents=out.get("latents"),
        guide_draws=out.get("guide_draws"),
        observed=(
            jax.tree.map(lambda v: v[0], out["observed"]) if "observed" in out else None
        ),
        **strata,
    )


def _draw_requests(
    requests: frozenset[str],
    observed: list[dict[str, Any]],
    plate: _DataPlate,
    key: jax.Array,
    reparam: bool,
) -> dict[str, jax.Array]:
    """Simulated observations (with the observed values) and log pmfs."""
    out = {}
    if Y_SIM in requests:
        keys = random.split(key, len(observed))
        out["y_sim"] = jnp.concatenate(
            [
                _site_draw(s, plate, k, reparam)
                for s, k in zip(observed, keys, strict=True)
            ],
            axis=1,
        )
        out["y_obs"] = jnp.concatenate(
            [_per_observation(s["value"], plate, s["fn"].event_dim) for s in observed],
            axis=1,
        )
    if LOG_PMF in requests:
        out["log_pmf"] = _pad_support([_site_log_pmf(s, plate) for s in observed])
    return out


class _draw_from_component(Messenger):
    """Makes a stratifiable latent site (one whose distribution has a
    ``stratum(k)`` method) draw from its component ``k``."""

    def __init__(self, fn: Callable, component: jax.Array) -> None:
        self.component = component
        super().__init__(fn)

    def process_message(self, msg: dict[str, Any]) -> None:
        if (
            msg["type"] == "sample"
            and not msg["is_observed"]
            and hasattr(msg["fn"], "stratum")
        ):
            msg["fn"] = msg["fn"].stratum(self.component)


def _stratum_log_weights(
    guide_trace: dict[str, Any],
    model_trace: dict[str, Any],
    plate: _DataPlate,
    *,
    whole_data: bool,
) -> dict[str, jax.Array]:
    """Log weights of the strata: averaged ``(K,)`` and per observation of
    this (sub)sample ``(b, K)``. With ``whole_data`` (expectations over the
    guide only, e.g. the stratified ELBO) the averaged weights serve all."""
    sites = [
        s for s in _latent_sites(guide_trace) if hasattr(s["fn"], "stratum_log_weights")
    ]
    if len(sites) != 1:
        raise ValueError(
            "Stratified expectations need exactly one stratified latent site in "
            f"the guide, found {len(sites)}."
        )
    fn = sites[0]["fn"]
    mean_log_w = fn.stratum_log_weights  # (K,)
    per_obs = fn.observation_log_weights  # (n, K) or None
    if per_obs is None or whole_data:
        b = max(plate.subsample_size, 1)
        return {
            "log_omega_bar": mean_log_w,
            "log_omega": jnp.broadcast_to(mean_log_w, (b,) + mean_log_w.shape),
        }
    if plate.name is None:
        raise ValueError(
            "The guide's mixture weights depend on covariates of the "
            "observations (gating_covariates), but the model has no data plate "
            "to align them with. Put the observations in a plate."
        )
    if per_obs.shape[0] != plate.size:
        raise ValueError(
            f"The guide's gating_covariates have {per_obs.shape[0]} rows but the "
            f"data plate '{plate.name}' has {plate.size} observations: pass one "
            "covariate row per observation, in the order of the plate."
        )
    indices = model_trace[plate.name]["value"]
    return {"log_omega_bar": mean_log_w, "log_omega": per_obs[indices]}


def particle_log_weights(terms: ParticleTerms) -> jax.Array:
    """``(M, b)`` log weight of each particle in each observation's predictive:
    ``terms.log_w`` when stratified, else ``-log M``.

    :param terms: particle terms with ``log_lik``, ``y_sim`` or ``log_pmf``.
    """
    if terms.log_w is not None:
        return terms.log_w
    ref = next(x for x in (terms.log_lik, terms.y_sim, terms.log_pmf) if x is not None)
    m, b = ref.shape[0], ref.shape[1]
    return jnp.full((m, b), -math.log(m), dtype=jnp.result_type(float))


def particle_weights(terms: ParticleTerms) -> jax.Array:
    """``(M,)`` weight of each particle in expectations over the guide:
    ``terms.particle_weight`` when stratified, else ``1/M``.

    :param terms: particle terms.
    """
    if terms.particle_weight is not None:
        return terms.particle_weight
    m = terms.log_q.shape[0]
    return jnp.full((m,), 1.0 / m, dtype=terms.log_q.dtype)


def log_joint(terms: ParticleTerms) -> jax.Array:
    """``(M,)`` the log joint density ``log p(θ_j, y)`` of each particle, every
    site with its own scale as in :func:`numpyro.infer.util.log_density`
    (needs ``"log_lik"``).

    :param terms: particle terms.
    """
    return terms.log_prior + jnp.sum(terms.log_lik_scaled, axis=1)


def particle_sum(x: jax.Array, weights: jax.Array | None = None) -> jax.Array:
    r""":math:`\sum_j w_j x_j` over the leading (particle) axis (``w = 1`` when
    ``weights`` is ``None``; ``weights`` is ``(M,)`` or ``x.shape``).

    Computed as a contraction (``dot_general``) rather than a reduction: on
    CPU, XLA reduces a leading axis column by column, and once the ``(M, b)``
    array outgrows the cache that strided loop is an order of magnitude
    slower than a matrix-vector product (``benchmarks/RESULTS.md``).
    """
    if weights is not None and jnp.ndim(weights) > 1:
        x = weights * x
        weights = None
    if weights is None:
        weights = jnp.ones(x.shape[0], x.dtype)
    return jnp.tensordot(weights, x, axes=(0, 0), precision=jax.lax.Precision.HIGHEST)


def _particle_max(x: jax.Array) -> jax.Array:
    """Maximum over the leading axis by halving (contiguous elementwise
    maxima; overlapping halves when odd)."""
    while x.shape[0] > 1:
        n, h = x.shape[0], (x.shape[0] + 1) // 2
        x = jnp.maximum(x[:h], x[n - h :])
    return x[0]


def particle_logsumexp(x: jax.Array) -> jax.Array:
    """``log Σ_j exp(x_j)`` over the leading (particle) axis, stable for
    ``±inf`` entries like :func:`jax.nn.logsumexp` (an all ``-inf`` slice
    gives ``-inf``), with the fast contraction of :func:`particle_sum`."""
    shift = jax.lax.stop_gradient(_particle_max(x))
    shift = jnp.where(jnp.isfinite(shift), shift, 0.0)
    return jnp.log(particle_sum(jnp.exp(x - shift))) + shift


def log_mean_exp(x: jax.Array, axis: int = 0) -> jax.Array:
    """``log((1/M) Σ_j exp(x_j))`` along ``axis``, stable for ``-inf`` entries.

    An all ``-inf`` slice gives ``-inf`` (not NaN).
    """
    m = x.shape[axis]
    return particle_logsumexp(jnp.moveaxis(x, axis, 0)) - math.log(m)
