"""The structure of a model run against a guide, without computing it.

:func:`replay_trace` traces the model replayed against the guide under
:func:`jax.eval_shape` (sites, plates, shapes; nothing is computed), and
:func:`check_full_data` refuses subsampled plates for the functions that need
every observation (diagnostics and held-out scores).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax import random
from numpyro.distributions import ExpandedDistribution, Independent, MaskedDistribution
from numpyro.handlers import seed, substitute, trace

from numpyro_pvi._trace.autoguide_setup import set_up_autoguide, traceable_guide
from numpyro_pvi._trace.data_plate import simulation_law
from numpyro_pvi._trace.site_laws import (
    describe,
    innermost,
    is_censored,
    sampler_failure,
)
from numpyro_pvi._trace.tracing import replayed
from numpyro_pvi._trace.validation import explained_failure


def replay_trace(
    rng_key: jax.Array,
    param_map: dict[str, jax.Array],
    model: Callable,
    guide: Callable,
    args: tuple,
    kwargs: dict,
    function: str = "tracing",
    *,
    eager_prototype: bool = True,
) -> dict[str, Any]:
    """The structure of one trace of ``model`` replayed against ``guide``
    (``function``: the caller's name, for messages).

    Traced abstractly (``jax.eval_shape``, nothing is computed). Only the
    static structure is kept, so that no tracer outlives the trace: per site
    its ``name``, ``type``, ``is_observed``, ``cond_indep_stack``, plate
    ``args`` (sizes), ``fn.event_dim``, ``fn.support.is_discrete`` and a
    ``value`` with the right shape and dtype but no data (read values from
    an evaluated trace).

    :param eager_prototype: an autoguide that has not built its prototype
        builds it first, outside the trace, for the programs the caller
        compiles next (:func:`~numpyro_pvi._trace.autoguide_setup.set_up_autoguide`);
        ``False``: a copy of it builds it inside the trace and ``guide`` is
        left as it was (``param_map`` may then hold shapes only,
        :class:`jax.ShapeDtypeStruct`).
    """
    if eager_prototype:
        set_up_autoguide(guide, rng_key, param_map, args, kwargs)
    captured = {}

    def run(key: jax.Array, params: dict[str, jax.Array]) -> int:
        model_key, guide_key = random.split(key)
        traced = guide if eager_prototype else traceable_guide(guide)
        seeded_guide = substitute(seed(traced, guide_key), data=params)
        with explained_failure(function, "guide"):
            guide_trace = trace(seeded_guide).get_trace(*args, **kwargs)
        seeded = replayed(model, guide_trace, model_key, params)
        with explained_failure(function, "model"):
            tr = trace(seeded).get_trace(*args, **kwargs)
        captured["trace"] = {name: _static_site(site) for name, site in tr.items()}
        return 0

    jax.eval_shape(run, rng_key, param_map)
    return captured["trace"]


class _Support(NamedTuple):
    is_discrete: bool


class _SiteFn(NamedTuple):
    """What the structure keeps of a sample site's distribution."""

    event_dim: int
    support: _Support
    single_draw: bool = False
    masked: bool = False  # a mask (handlers.mask, .mask(), obs_mask) applies
    improper: bool = False  # an improper prior: no draws
    censored: str | None = None  # a censored likelihood's family, for messages
    factor: bool = False  # a numpyro.factor: a density term, no draws
    unsampled: str | None = None  # why an observed site cannot be simulated


#: Outcomes observed once whose every distribution over their support is of
#: the family: a mixture of them over θ is one of them again.
_SINGLE_DRAW = (
    dist.BernoulliLogits,
    dist.BernoulliProbs,
    dist.CategoricalLogits,
    dist.CategoricalProbs,
)


def single_draw_outcome(fn: Any) -> bool:
    r"""Whether ``fn`` is a binary or categorical outcome drawn once
    (Bernoulli, Categorical, Binomial with ``total_count`` 1), through
    ``Independent``, ``Expanded`` and ``Masked`` wrappers. Its predictive
    :math:`E_q[p(y \mid \theta)]` is again such a distribution: it
    depends on q only through the mean probabilities."""
    fn = innermost(fn)
    if isinstance(fn, _SINGLE_DRAW):
        return True
    if isinstance(fn, (dist.BinomialLogits, dist.BinomialProbs)):
        try:
            return bool(np.all(np.asarray(fn.total_count) == 1))
        except jax.errors.TracerArrayConversionError:
            return False
    return False


def _is_masked(fn: Any) -> bool:
    """Whether a ``MaskedDistribution`` among the wrappers of ``fn`` may
    remove components (its mask is not ``True``)."""
    while isinstance(fn, (Independent, ExpandedDistribution, MaskedDistribution)):
        if isinstance(fn, MaskedDistribution) and fn._mask is not True:
            return True
        fn = fn.base_dist
    return False


def _static_site(site: dict[str, Any]) -> dict[str, Any]:
    """What :func:`replay_trace` keeps of a site: no traced value."""
    value: Any = site.get("value")
    static = {
        "name": site["name"],
        "type": site["type"],
        "is_observed": site.get("is_observed", False),
        "cond_indep_stack": site.get("cond_indep_stack", []),
        "infer": {k: v for k, v in site.get("infer", {}).items() if k == "enumerate"},
        "in_scan": bool(site.get("_control_flow_done", False)),  # NumPyro's scan
        # a read-only view of the shape and dtype, no memory; a pytree of
        # them for a parameter that is one (numpyro.module's network weights)
        "value": jax.tree.map(_stand_in, value)
        if isinstance(value, (list, tuple, dict))
        else _stand_in(value),
    }
    if site["type"] == "plate":
        static["args"] = tuple(int(a) if a is not None else None for a in site["args"])
    fn: Any = site.get("fn")
    if site["type"] == "sample":
        static["nan_data"] = _nan_data(site)
        static["tempered"] = _tempered(site.get("scale"))
        static["fn"] = _SiteFn(
            int(fn.event_dim),
            _Support(bool(fn.support.is_discrete)),
            single_draw_outcome(fn),
            _is_masked(fn),
            isinstance(innermost(fn), IMPROPER),
            describe(fn) if is_censored(fn) else None,
            isinstance(innermost(fn), dist.Unit),
            sampler_failure(simulation_law(site)) if site.get("is_observed") else None,
        )
    return static


def _tempered(scale: Any) -> bool:
    """Whether a site's handler scale is known to differ from 1 (a traced
    scale is not known)."""
    if scale is None or isinstance(scale, jax.core.Tracer):
        return False
    return not np.allclose(np.asarray(scale), 1.0)


def _stand_in(value: Any) -> np.ndarray:
    """A read-only array of ``value``'s shape and dtype, with no memory."""
    dtype = jax.dtypes.canonicalize_dtype(jnp.result_type(value))
    return np.broadcast_to(np.zeros((), dtype), np.shape(value))


def _nan_data(site: dict[str, Any]) -> list[int]:
    """The flat indices of the NaN entries of an observed site's data where
    no mask removes them (none for a latent site, a masked one, or a value
    computed from latent values)."""
    value = site.get("value")
    if (
        not site.get("is_observed")
        or _is_masked(site["fn"])
        or isinstance(value, jax.core.Tracer)
        or not jnp.issubdtype(jnp.result_type(value), jnp.floating)
    ):
        return []
    return np.flatnonzero(np.isnan(np.asarray(value))).tolist()


def model_structure(
    model: Callable, rng_key: jax.Array, args: tuple, kwargs: dict
) -> dict[str, Any]:
    """The structure of one trace of ``model`` alone (as :func:`replay_trace`
    keeps it), traced abstractly; improper latent sites take a feasible
    value (:func:`feasible_improper`)."""
    captured: dict[str, Any] = {}

    def run(key: jax.Array) -> int:
        tr = trace(seed(feasible_improper(model), key)).get_trace(*args, **kwargs)
        captured["trace"] = {name: _static_site(site) for name, site in tr.items()}
        return 0

    jax.eval_shape(run, rng_key)
    return captured["trace"]


#: Distributions without draws: improper priors (``ImproperUniform``, a
#: flat density over a support, as NumPyro's ordinal-regression notebook
#: uses for cut points).
IMPROPER = (dist.ImproperUniform,)


def _feasible_value(site: dict[str, Any]) -> Any:
    if site["type"] != "sample" or site.get("is_observed"):
        return None
    fn = site["fn"]
    if not isinstance(innermost(fn), IMPROPER):
        return None
    shape = tuple(site["kwargs"].get("sample_shape", ())) + tuple(fn.shape())
    return fn.support.feasible_like(jnp.zeros(shape))


def feasible_improper(model: Callable) -> Callable:
    """``model`` whose improper latent sites take a value of their support
    (``support.feasible_like``) instead of a draw, which they have not: the
    other sites are then drawn as the model draws them given that value."""
    return substitute(model, substitute_fn=_feasible_value)


def improper_latents(
    model: Callable, rng_key: jax.Array, args: tuple, kwargs: dict
) -> list[str]:
    """The latent sites of ``model`` with an improper prior, read from its
    abstract structure (:func:`model_structure`): an eager run at a prior
    draw would validate the distributions at that draw, and a vague prior's
    draw can make one invalid (a Gaussian process's covariance at a
    ``LogNormal(0, 10)`` length scale) where the model itself is fine."""
    tr = model_structure(model, rng_key, args, kwargs)
    return [
        name
        for name, site in tr.items()
        if site["type"] == "sample" and not site["is_observed"] and site["fn"].improper
    ]


def latent_dependent_observations(
    model: Callable, args: tuple, kwargs: dict, names: list[str] | None = None
) -> list[str]:
    """The observed sites (of ``names``; ``None``: all) whose value is
    computed from the latent draws: priors written as observed sites
    (``numpyro.sample("c", dist.Normal(0, 1), obs=latent)``), residuals
    (``obs=y - mu``), terms of the joint density rather than data.

    Found abstractly, under any trace: the model runs under ``jax.vmap``
    over its latent sites' values (substituted), and a probe with a custom
    batching rule (:func:`jax.custom_batching.custom_vmap`) on each observed
    value records whether the value is batched, i.e. depends on them.
    Values the model closes over, traced by a caller's own transformation
    (an objective's ``jit``, a grid's ``vmap``), are constants of this
    abstract trace and do not count.
    """
    batched: dict[str, bool] = {}
    probe = _batching_probe(batched)

    def run(key: jax.Array) -> int:
        proper = feasible_improper(model)
        tr = trace(seed(proper, key)).get_trace(*args, **kwargs)
        observed = [n for n, site in tr.items() if _is_observed(site)]
        wanted = observed if names is None else [n for n in observed if n in names]
        latents = {n: site["value"] for n, site in tr.items() if _is_latent(site)}

        def values(draws: dict[str, jax.Array]) -> list[jax.Array]:
            fixed = substitute(seed(proper, key), data=draws)
            tr = trace(fixed).get_trace(*args, **kwargs)
            return [probe(n)(jnp.asarray(tr[n]["value"])) for n in wanted]

        stacked = jax.tree.map(lambda v: jnp.stack([v, v]), latents)
        jax.vmap(values, axis_size=2)(stacked)  # (no latent sites: none batched)
        return 0

    jax.eval_shape(run, random.PRNGKey(0))
    return [name for name, is_batched in batched.items() if is_batched]


def _batching_probe(batched: dict[Any, bool]) -> Callable[[Any], Callable]:
    """``probe(label)``: an identity whose batching rule records in
    ``batched[label]`` whether its input is batched under ``jax.vmap``
    (:func:`jax.custom_batching.custom_vmap`): whether a value depends on
    what the ``vmap`` maps over."""

    def probe(label: Any) -> Callable:
        @jax.custom_batching.custom_vmap
        def identity(x: jax.Array) -> jax.Array:
            return x

        @identity.def_vmap
        def rule(axis_size: int, in_batched: list, x: jax.Array) -> tuple:
            batched[label] = batched.get(label, False) or bool(in_batched[0])
            return x, in_batched[0]

        return identity

    return probe


def amortized_latents(
    model: Callable,
    guide: Callable,
    params: Mapping[str, Any],
    args: tuple,
    kwargs: dict,
    plate: str | None,
) -> dict[str, str]:
    """``{site: argument}``: the model's latent sites local to the data
    plate ``plate`` whose draws by ``guide`` read the observations' data
    (an amortized encoder), each with the argument that carries the data.

    Found abstractly, one array argument at a time: model and guide run
    under ``jax.vmap`` over two copies of it, and a probe
    (:func:`_batching_probe`) on each local latent value and each observed
    value of the plate records which depend on it; a local latent that
    depends on an argument the observed values depend on reads the data.
    """
    if plate is None:
        return {}
    paths, treedef = jax.tree_util.tree_flatten_with_path((args, kwargs))
    leaves = [leaf for _, leaf in paths]
    found: dict[str, str] = {}
    for i, (path, leaf) in enumerate(paths):
        if not isinstance(leaf, jax.Array | np.ndarray):
            continue
        batched: dict[tuple[bool, str], bool] = {}
        probe = _batching_probe(batched)

        def one(
            key: jax.Array, value: jax.Array, i: int = i, probe: Callable = probe
        ) -> int:
            a, k = jax.tree.unflatten(treedef, [*leaves[:i], value, *leaves[i + 1 :]])
            guide_tr = trace(substitute(seed(guide, key), data=params)).get_trace(
                *a, **k
            )
            model_tr = trace(replayed(model, guide_tr, key, params)).get_trace(*a, **k)
            for name, site in model_tr.items():
                in_plate = plate in {f.name for f in site.get("cond_indep_stack", [])}
                if site["type"] == "sample" and in_plate:
                    label = (bool(site["is_observed"]), name)
                    probe(label)(jnp.asarray(site["value"]))
            return 0

        def run(key: jax.Array, value: jax.Array) -> Any:
            return jax.vmap(one, in_axes=(None, 0))(key, jnp.stack([value, value]))

        try:
            jax.eval_shape(run, random.PRNGKey(0), leaf)
        except _PYTHON_ON_VALUES:  # Python reads its value: not the data
            continue
        if any(v for (observed, _), v in batched.items() if observed):
            for (observed, name), v in batched.items():
                if v and not observed:
                    found.setdefault(name, _argument_name(guide, args, path))
    return found


#: What tracing raises where Python asks a traced value for its value.
_PYTHON_ON_VALUES = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
)


def _argument_name(guide: Callable, args: tuple, path: tuple) -> str:
    """The guide's argument at ``path`` of ``(args, kwargs)``, for messages."""
    where, key = path[0].idx, path[1]
    if where == 1:
        return repr(key.key)
    try:
        names = list(inspect.signature(guide).parameters)
    except (TypeError, ValueError):
        names = []
    index = key.idx
    if index < len(names) and len(names) >= len(args):
        return repr(names[index])
    return f"#{index} (positional)"


def refuse_dependent_observations(names: list[str], function: str) -> None:
    """Raise if one of ``names``, observed sites of the data plate found by
    :func:`latent_dependent_observations`, observes a value computed from
    the latent draws: each draw would score its own observations. (A site
    that fills some entries only, missing values imputed, is split by
    :mod:`~numpyro_pvi._trace.imputed` instead.)"""
    if names:
        raise ValueError(
            f"{function}: the observed site '{names[0]}' observes a value "
            "computed from the latent draws (it changes from draw to draw), so "
            "it is a term of the joint density rather than data, and a "
            "predictive score, which compares each draw's predictive with the "
            "same observations, is not defined for it. Put the dependence in "
            "the distribution and observe the data (dist.Normal(mu, sigma), "
            "obs=y rather than dist.Normal(0, sigma), obs=y - mu), or pass a "
            "data_plate the site is outside of (it then enters with the prior, "
            "as a term of the joint density). Missing values filled with "
            "latent draws (some entries only; whole events of a vector-valued "
            "site) are split into data and imputed entries where the model's "
            "arguments are concrete, as SVI.run passes them; or observe the "
            "data alone with obs_mask=. "
            "SoftCVIELBO, SNISForwardKL, Trace_ELBO and diagnostics.psis read "
            "the joint density only and take the model as it is."
        )


def _is_observed(site: dict[str, Any]) -> bool:
    return site["type"] == "sample" and bool(site["is_observed"])


def _is_latent(site: dict[str, Any]) -> bool:
    return site["type"] == "sample" and not site["is_observed"]


def check_full_data(tr: Mapping[str, dict[str, Any]], function: str) -> None:
    """Raise if a plate of the trace is subsampled, or an observed site's
    data hold NaN where no mask removes them (missing values: their
    log-likelihood is -inf or NaN, and every score of theirs with it).

    :param tr: a trace, e.g. from :func:`replay_trace`.
    :param function: the calling function's name, for the message.
    """
    for name, site in tr.items():
        missing = site.get("nan_data", [])
        if missing:
            raise ValueError(
                f"{function}: the observed site '{name}' holds NaN at "
                f"{len(missing)} entries (flat indices {missing[:5]}"
                f"{', ...' if len(missing) > 5 else ''}) and no mask removes "
                "them, so their log-likelihood, and every score read from it, "
                "is -inf or NaN. Mask the missing values: numpyro.sample("
                f"'{name}', ..., obs=y, obs_mask=~np.isnan(y)) (NumPyro imputes "
                "them), or numpyro.handlers.mask around the site."
            )
        if site["type"] != "plate":
            continue
        size, subsample = site["args"][0], np.shape(site["value"])[0]
        if subsample < size:
            raise ValueError(
                f"{function}: the plate '{name}' is subsampled ({subsample} of "
                f"{size}), but {function} needs every observation (a subsampled "
                "plate would give it a random subset of them); call it with the "
                "model arguments that use the full data (no subsample_size). A "
                "model that fixes subsample_size itself takes every index from "
                "numpyro.handlers.substitute(model, data={"
                f"'{name}': jnp.arange({size})}}) (the guide likewise), called "
                "with the full data; a guide built for the subsample's size "
                "(AutoSemiDAIS) is built again on the full data, AutoSemiDAIS("
                f"..., subsample_plate='{name}'), and given the fitted parameters."
            )
