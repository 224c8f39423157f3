"""Tracing one particle: a draw of the guide and the model replayed against it.

:func:`trace_particle` is the one place where a guide is run and the model is
replayed on its draw; :func:`guide_log_density` re-runs the guide at given
values of its sample sites (score-function and contrastive estimators).
Subsampled plates are seeded apart from the sample sites
(:func:`seed_plates`) so that every particle sees the same subsample.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from jax import random
from jax.lax import stop_gradient
from numpyro.distributions import Delta, MaskedDistribution
from numpyro.distributions.transforms import biject_to
from numpyro.handlers import replay, seed, substitute, trace
from numpyro.infer.util import is_identically_one
from numpyro.util import check_model_guide_match

from numpyro_pvi._trace.enumeration import marginalized
from numpyro_pvi._trace.numpyro_private import without_rsample_stop_gradient
from numpyro_pvi._trace.validation import explained_failure


def site_log_prob(site: dict[str, Any]) -> tuple[jax.Array, jax.Array]:
    """A sample site's log density, unscaled and with its handler scale."""
    fn, value = site["fn"], site["value"]
    if site.get("intermediates"):
        log_prob = fn.log_prob(value, site["intermediates"])
    else:
        log_prob = fn.log_prob(value)
    scale = site["scale"]
    if scale is None or is_identically_one(scale):
        return log_prob, log_prob
    return log_prob, scale * log_prob


def latent_sites(tr: dict[str, Any]) -> Iterable[dict[str, Any]]:
    """The latent (unobserved) sample sites of a trace."""
    return (s for s in tr.values() if s["type"] == "sample" and not s["is_observed"])


def guide_density_sites(tr: dict[str, Any]) -> Iterable[dict[str, Any]]:
    """The sample sites of a guide trace that make its log density: its
    latent sites and its factors (``numpyro.factor``, an observed site of a
    guide, e.g. the kinetic-energy term of ``AutoDAIS``), as NumPyro's
    ``Trace_ELBO`` counts them."""
    return (s for s in tr.values() if s["type"] == "sample")


def sum_log_density(sites: Iterable[dict[str, Any]]) -> jax.Array:
    """The summed log density of ``sites``, each with its handler scale."""
    return sum((jnp.sum(site_log_prob(s)[1]) for s in sites), start=jnp.zeros(()))


def obs_mask_site(name: str, tr: Mapping[str, dict[str, Any]]) -> str | None:
    """The name given to ``numpyro.sample(..., obs_mask=...)`` when ``name``
    is the latent site of its missing entries, else ``None``.

    ``numpyro.sample(name, fn, obs=y, obs_mask=m)`` records the observed
    site ``{name}_observed`` (``fn`` masked by ``m``), the latent site
    ``{name}_unobserved`` (``fn`` masked by ``~m``) and the deterministic
    ``{name}`` that interleaves them; the latent's entries at observed
    positions are used nowhere and have no density in the model. Reads
    names and site types only, so it works on the static structure of
    :func:`~numpyro_pvi._trace.structure.replay_trace` too.
    """
    suffix = "_unobserved"
    site = tr.get(name, {})
    if site.get("type") != "sample" or site.get("is_observed"):
        return None
    if not name.endswith(suffix):
        return None
    base = name[: -len(suffix)]
    observed = tr.get(f"{base}_observed", {})
    interleaved = tr.get(base, {})
    if observed.get("is_observed") and interleaved.get("type") == "deterministic":
        return base
    return None


def obs_mask_latents(model_trace: dict[str, Any]) -> dict[str, jax.Array]:
    """The latent sites of missing entries that ``obs_mask=`` creates (see
    :func:`obs_mask_site`), with their masks (``True`` at the missing
    entries)."""
    out = {}
    for name, site in model_trace.items():
        fn = site.get("fn")
        if (
            obs_mask_site(name, model_trace) is not None
            and isinstance(fn, MaskedDistribution)
            and not isinstance(fn._mask, bool)
        ):
            out[name] = fn._mask
    return out


def guide_latent_log_density(
    guide_trace: dict[str, Any],
    masks: dict[str, jax.Array] | None = None,
    *,
    draws_only: bool = False,
) -> jax.Array:
    """The guide's log density at its draws (each site with its handler
    scale, its factors included: :func:`guide_density_sites`), its sites of
    :func:`obs_mask_latents` left out at the observed entries, as the model
    leaves them out.

    :param guide_trace: a trace of the guide.
    :param masks: ``{site: mask}`` from :func:`obs_mask_latents` of the
        model trace (``None``: no such site).
    :param draws_only: the density of the guide's own draws only
        (:func:`is_sample_draw`), without the change of variables of the
        point-mass sites that map them to the model's sites.
    """
    masks = masks or {}
    total = jnp.zeros(())
    for site in guide_density_sites(guide_trace):
        if draws_only and not (is_sample_draw(site) or site["is_observed"]):
            continue
        log_prob = site_log_prob(site)[1]
        mask = masks.get(site["name"])
        if mask is not None:
            log_prob = _masked_guide_density(site, log_prob, mask)
        total = total + jnp.sum(log_prob)
    return total


def _masked_guide_density(
    site: dict[str, Any], log_prob: jax.Array, mask: jax.Array
) -> jax.Array:
    """``log_prob`` of a guide site of an ``obs_mask`` latent, zero at the
    observed entries, or an error when the guide's density is joint over
    the entries."""
    shape = jnp.shape(log_prob)
    per_entry = not _is_deterministic_transform(site) and (
        jnp.broadcast_shapes(jnp.shape(mask), shape) == shape
    )
    if not per_entry:
        name = site["name"]
        base = name[: -len("_unobserved")]
        raise ValueError(
            f"The model's site '{base}' uses obs_mask=: NumPyro makes its missing "
            f"entries the latent site '{name}', which has no density at the "
            "observed entries. The guide's density of it is joint over all its "
            "entries (e.g. the _auto_latent of an AutoContinuous guide), so it "
            "cannot leave the observed entries out, and an objective or "
            "diagnostic that reads log q would measure the guide where the model "
            "defines nothing (SVI's Trace_ELBO drifts to -inf there). Give "
            f"'{name}' a factor per entry inside its plate: AutoNormal, or "
            f"AutoGuideList with AutoNormal(block(model, expose=['{name}'])) "
            "beside your guide of the other sites."
        )
    return jnp.where(mask, log_prob, jnp.zeros_like(log_prob))


def require_reparam_guide(guide_trace: dict[str, Any], objective: str) -> None:
    """Raise if a latent site of the guide has no reparameterised sampler.

    :param guide_trace: a trace of the guide.
    :param objective: the objective's name, for the message.
    """
    for site in latent_sites(guide_trace):
        if not site["fn"].has_rsample:
            raise ValueError(
                f"{objective}: the guide's latent site '{site['name']}' "
                f"({type(site['fn']).__name__}) has no reparameterised sampler, "
                "and this estimator differentiates through the draws. Use a "
                "continuous guide for that site, or an objective that does not "
                "need reparameterisation (SoftCVIELBO, SNISForwardKL, or "
                "PredictiveELBO(log_score_estimator='rejection'))."
            )


def _is_deterministic_transform(site: dict[str, Any]) -> bool:
    """Delta sites of a guide (e.g. the constrained sites of AutoContinuous
    guides) are functions of earlier draws, not draws of their own."""
    fn = site["fn"]
    while hasattr(fn, "base_dist") and not isinstance(fn, Delta):
        fn = fn.base_dist
    return isinstance(fn, Delta)


def is_sample_draw(site: dict[str, Any]) -> bool:
    """Whether a site of a guide trace is one of the guide's own draws (a
    latent sample site that is not a point mass at a function of others)."""
    return (
        site["type"] == "sample"
        and not site["is_observed"]
        and not _is_deterministic_transform(site)
    )


def point_mass_sites(
    model: Callable,
    guide: Callable,
    params: Mapping[str, Any],
    args: tuple,
    kwargs: Mapping,
    function: str = "tracing",
) -> list[str]:
    """The model's latent sites that ``guide`` gives as point masses, when
    its draws span fewer (unconstrained) dimensions than the model's latent
    sites: ``AutoDelta``, or ``AutoDelta`` beside another guide in an
    ``AutoGuideList``, where importance ratios are not defined. Empty for a
    guide with a density over every latent dimension (an ``AutoContinuous``
    guide's sites are Deltas of its one draw, which spans them all). One
    abstract trace of each."""
    found: dict[str, list[str]] = {}

    def run(key: jax.Array) -> int:
        seeded_guide = substitute(seed(guide, key), data=dict(params))
        with explained_failure(function, "guide"):
            guide_trace = trace(seeded_guide).get_trace(*args, **kwargs)
        with explained_failure(function, "model"):
            model_trace = trace(replayed(model, guide_trace, key, params)).get_trace(
                *args, **kwargs
            )
        latents = {s["name"]: s for s in latent_sites(model_trace)}
        guide_sites = list(latent_sites(guide_trace))
        draws = [s for s in guide_sites if is_sample_draw(s)]
        drawn = {s["name"] for s in draws}
        points = [n for n in map(_name, guide_sites) if n in latents and n not in drawn]
        spans = sum(map(_dimensions, draws)) >= sum(map(_dimensions, latents.values()))
        found["sites"] = [] if spans else points
        return 0

    jax.eval_shape(run, random.PRNGKey(0))
    return found["sites"]


def _name(site: dict[str, Any]) -> str:
    return site["name"]


def _dimensions(site: dict[str, Any]) -> int:
    """The number of unconstrained dimensions of a sample site's value."""
    fn, shape = site["fn"], jnp.shape(site["value"])
    if fn.support.is_discrete:
        return math.prod(shape)
    return math.prod(biject_to(fn.support).inverse_shape(shape))


def guide_sample_values(
    guide: Callable, guide_trace: dict[str, Any]
) -> dict[str, jax.Array]:
    """The values of the guide's own (non-deterministic) latent sample sites,
    with their gradient stopped: what fixes a draw of the guide."""
    fixed = {
        name: stop_gradient(site["value"])
        for name, site in guide_trace.items()
        if is_sample_draw(site)
    }
    if not fixed and any(True for _ in latent_sites(guide_trace)):
        raise ValueError(
            f"The guide ({type(guide).__name__}) has only point-mass (Delta) latent "
            "sites, so it has no log density to evaluate, which this objective "
            "needs. Use AutoNormal, AutoDiagonalNormal, AutoMultivariateNormal, "
            "AutoLowRankMultivariateNormal, AutoIAFNormal, numpyro_pvi.guides.AutoFlow "
            "or a hand-written guide "
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
    masks: dict[str, jax.Array] | None = None,
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
    :param masks: :func:`obs_mask_latents` of the model.
    """
    rerun = substitute(substitute(seed(guide, key), data=draws), data=param_map)
    try:
        tr = trace(rerun).get_trace(*args, **kwargs)
        return guide_latent_log_density(tr, masks)
    except NotImplementedError as err:
        raise ValueError(
            f"The guide ({type(guide).__name__}) cannot evaluate its log density "
            "at given points (it has no inverse transform), which this objective "
            "needs. Use AutoNormal, AutoDiagonalNormal, AutoMultivariateNormal, "
            "AutoLowRankMultivariateNormal, AutoIAFNormal, numpyro_pvi.guides.AutoFlow "
            "or a hand-written guide."
        ) from err


def with_guide_params(
    params: Mapping[str, Any], guide_trace: dict[str, Any]
) -> dict[str, Any]:
    """``params`` and the parameters a guide registered at this draw that
    ``params`` does not hold: the model runs with them (the drawn
    candidate's own model parameters, which a
    :class:`~numpyro_pvi.selection.StackedGuide` registers)."""
    drawn = {
        name: site["value"]
        for name, site in guide_trace.items()
        if site["type"] == "param" and name not in params
    }
    return {**drawn, **params}


def replayed(
    model: Callable,
    guide_trace: dict[str, Any],
    key: jax.Array,
    params: Mapping[str, Any],
) -> Callable:
    """``model`` replayed against a guide trace: seeded with ``key``, the
    guide's draws and parameters (:func:`with_guide_params`) substituted,
    and the enumerated sites the guide does not draw summed out
    (:func:`~numpyro_pvi._trace.enumeration.marginalized`)."""
    drawn = [n for n, s in guide_trace.items() if s["type"] == "sample"]
    return substitute(
        replay(seed(marginalized(model, drawn), key), guide_trace),
        data=with_guide_params(params, guide_trace),
    )


def drawn_params(
    model: Callable,
    guide: Callable,
    params: Mapping[str, Any],
    args: tuple,
    kwargs: Mapping,
) -> list[str]:
    """The model's parameters that the guide registers at its draws and
    ``params`` does not hold (:func:`with_guide_params`: a stacked fit's
    candidates' own), from one abstract trace of guide and model."""
    names: list[str] = []

    def run(key: jax.Array) -> int:
        seeded = substitute(seed(guide, key), data=dict(params))
        guide_trace = trace(seeded).get_trace(*args, **kwargs)
        model_trace = trace(replayed(model, guide_trace, key, params)).get_trace(
            *args, **kwargs
        )
        names.extend(
            n
            for n, s in model_trace.items()
            if s["type"] == "param" and n in guide_trace and n not in params
        )
        return 0

    jax.eval_shape(run, random.PRNGKey(0))
    return sorted(names)


def seed_plates(fn: Callable, plate_key: jax.Array) -> Callable:
    """``fn`` whose subsampled plates draw their indices from ``plate_key``
    (sample sites are left unseeded), as :func:`particle_terms` seeds model
    and guide."""
    return seed(fn, plate_key, hide_types=["sample", "prng_key", "control_flow"])


def trace_particle(
    guide_key: jax.Array,
    model_key: jax.Array,
    draw_params: dict[str, jax.Array],
    model: Callable,
    guide: Callable,
    args: tuple,
    kwargs: dict,
    *,
    strata: StratifiedGuide | None = None,
    component: jax.Array | None = None,
    require_reparam: bool = True,
    objective: str = "objective",
    model_params: dict[str, jax.Array] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Draw one particle from the guide and replay the model against it.

    :param guide_key: the key of the guide's sample sites (plates are
        seeded apart, see :func:`seed_plates`).
    :param model_key: the key of the model's other sample sites.
    :param draw_params: the parameters the guide draws with.
    :param model: the model, plates seeded.
    :param guide: the guide, plates seeded.
    :param args: positional arguments of model and guide.
    :param kwargs: keyword arguments of model and guide.
    :param strata: the guide as a
        :class:`~numpyro_pvi.particles.StratifiedGuide` (unseeded), to draw
        from its stratum ``component``; ``None`` for an ordinary draw.
    :param component: the stratum to draw from.
    :param require_reparam: raise when a latent site of the guide has no
        reparameterised sampler.
    :param objective: the calling objective's name, for messages.
    :param model_params: the parameters the model is replayed with
        (``None``: ``draw_params``); draws held fixed keep the gradient of
        the model's own parameters this way.
    :return: ``(guide_trace, model_trace)``.
    """
    seeded_guide = substitute(seed(guide, guide_key), data=draw_params)
    if strata is not None:
        assert component is not None  # stratified draws name their stratum
        seeded_guide = strata.draw_stratum(seeded_guide, component)
    with without_rsample_stop_gradient(), explained_failure(objective, "guide"):
        guide_trace = trace(seeded_guide).get_trace(*args, **kwargs)
    if require_reparam:
        require_reparam_guide(guide_trace, objective)
    params = draw_params if model_params is None else model_params
    seeded_model = replayed(model, guide_trace, model_key, params)
    with explained_failure(objective, "model"):
        model_trace = trace(seeded_model).get_trace(*args, **kwargs)
    check_model_guide_match(model_trace, guide_trace)
    return guide_trace, model_trace


@runtime_checkable
class StratifiedGuide(Protocol):
    """A guide drawn from stratum by stratum (the guide side of stratification).

    The particle machinery draws ``M`` particles from each of the guide's
    ``num_strata`` strata when an objective asks for stratified draws, and
    weights them with :meth:`stratum_log_weights`.
    :class:`~numpyro_pvi.guides.AutoGaussianMixture` implements it.
    """

    @property
    def num_strata(self) -> int:
        """The number ``K`` of strata."""

    def draw_stratum(self, fn: object, component: jax.Array) -> object:
        """``fn`` (this guide, seeded and substituted) drawing its stratified
        site from stratum ``component`` only; that site's log density stays
        the whole guide's."""

    def stratum_log_weights(
        self, params: dict[str, jax.Array]
    ) -> tuple[jax.Array, jax.Array | None]:
        """``(K,)`` log weights of the strata in expectations over the guide,
        and ``(N, K)`` per-observation log weights ``log ω_k(x_i)`` over the
        data plate, or ``None`` when they do not depend on the observation."""

    def entropy_term(self, params: dict[str, jax.Array]) -> jax.Array | None:
        """The guide's entropy (or a bound) in closed form, used in place of
        the Monte Carlo mean of ``-log q``; ``None`` to use the mean."""
