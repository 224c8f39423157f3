"""Small helpers shared by the diagnostics that build ArviZ ``InferenceData``.

- :func:`root_attrs`: the root attributes (library versions, guide class);
- :func:`guide_draws`: draws and per-draw quantities of a fitted guide through
  the shared particle machinery, optionally chunked;
- :func:`replay_trace`: the structure (plates, shapes, observed values) of a
  model trace replayed against the guide, traced abstractly;
- :func:`site_dims`: dimension names of sample sites (plates name their axes);
- :func:`draws_dataset`: an ``xarray.Dataset`` with ``(chain=1, draw=S)`` dims.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import xarray as xr
from jax import random
from numpyro.handlers import replay, seed, substitute, trace
from numpyro.infer.autoguide import AutoGuide

from numpyro_pvi._particles import ParticleTerms, particle_terms

__all__ = [
    "check_full_data",
    "check_num_draws",
    "draws_dataset",
    "guide_draws",
    "guide_name",
    "replay_trace",
    "root_attrs",
    "site_dims",
]


def check_num_draws(
    num_draws: Any, minimum: int, function: str, name: str = "num_draws"
) -> int:
    """Validate a number of draws (an ``int`` of at least ``minimum``)."""
    if (
        isinstance(num_draws, bool)
        or not isinstance(num_draws, int | np.integer)
        or num_draws < minimum
    ):
        raise ValueError(
            f"{function}: {name} must be an integer >= {minimum}, got {num_draws!r}."
        )
    return int(num_draws)


def guide_name(guide: Callable) -> str:
    """The class name of an autoguide, or the name of a guide function."""
    if isinstance(guide, AutoGuide):
        return type(guide).__name__
    return getattr(guide, "__name__", type(guide).__name__)


def root_attrs(guide: Callable | None = None, **extra: Any) -> dict[str, Any]:
    """Root attributes of an ``InferenceData``: library versions, guide class.

    :param guide: the guide whose class (or function name) is recorded.
    :param extra: further attributes (strings or numbers).
    :return: a dict serialisable to netCDF.
    """
    import numpyro_pvi

    attrs: dict[str, Any] = {
        "inference_library": "numpyro",
        "inference_library_version": numpyro.__version__,
        "numpyro_pvi_version": numpyro_pvi.__version__,
        "jax_version": jax.__version__,
        "arviz_version": az.__version__,
    }
    if guide is not None:
        attrs["guide"] = guide_name(guide)
    attrs.update(extra)
    return attrs


def guide_draws(
    rng_key: jax.Array,
    param_map: dict[str, jax.Array],
    model: Callable,
    guide: Callable,
    args: tuple,
    kwargs: dict,
    *,
    num_draws: int,
    requests: Iterable[str],
    chunk_size: int | None = None,
    data_plate: str | None = None,
    require_observed: bool = True,
    function: str = "diagnostic",
) -> ParticleTerms:
    """``num_draws`` draws of the guide and their per-draw quantities.

    One jit-compiled call of :func:`numpyro_pvi._particles.particle_terms`,
    vectorised with ``vmap``, or over chunks of ``chunk_size`` draws (a
    ``lax.map`` of ``vmap``) to bound memory. The compiled program is cached
    per model, guide and static arguments: array arguments of the model are
    inputs of the program, every other argument is a compile-time constant.
    """
    if chunk_size is not None:
        chunk_size = check_num_draws(chunk_size, 1, function, "chunk_size")
        if chunk_size >= num_draws:
            chunk_size = None
    options = dict(
        model=model,
        guide=guide,
        num_draws=num_draws,
        requests=tuple(sorted(requests)),
        chunk_size=chunk_size,
        data_plate=data_plate,
        require_observed=require_observed,
        function=function,
    )
    leaves, treedef = jax.tree.flatten((args, kwargs))
    is_array = [isinstance(x, jax.Array | np.ndarray) for x in leaves]
    static = tuple(None if a else x for x, a in zip(leaves, is_array, strict=True))
    dynamic = [x for x, a in zip(leaves, is_array, strict=True) if a]
    try:
        hash(static)
    except TypeError:  # an unhashable constant: compile for this call only
        return jax.jit(
            lambda key, params: _draws(key, params, args, kwargs, **options)
        )(rng_key, param_map)
    return _cached_draws(
        rng_key, param_map, dynamic, structure=(treedef, static), **options
    )


def _draws(
    rng_key: jax.Array,
    param_map: dict[str, jax.Array],
    args: tuple,
    kwargs: dict,
    *,
    model: Callable,
    guide: Callable,
    num_draws: int,
    requests: tuple[str, ...],
    chunk_size: int | None,
    data_plate: str | None,
    require_observed: bool,
    function: str,
) -> ParticleTerms:
    if chunk_size is None:
        vectorize = lambda f, keys: jax.vmap(f)(keys)  # noqa: E731
    else:
        vectorize = functools.partial(_chunked_map, chunk=chunk_size)
    return particle_terms(
        rng_key,
        param_map,
        model,
        guide,
        args,
        kwargs,
        num_particles=num_draws,
        vectorize_particles_fn=vectorize,
        requests=requests,
        data_plate=data_plate,
        objective=function,
        require_reparam=False,
        require_observed=require_observed,
    )


@functools.partial(
    jax.jit,
    static_argnames=(
        "structure",
        "model",
        "guide",
        "num_draws",
        "requests",
        "chunk_size",
        "data_plate",
        "require_observed",
        "function",
    ),
)
def _cached_draws(
    rng_key: jax.Array,
    param_map: dict[str, jax.Array],
    dynamic: list[jax.Array],
    *,
    structure: tuple[Any, tuple],
    **options: Any,
) -> ParticleTerms:
    treedef, static = structure
    arrays = iter(dynamic)
    leaves = [next(arrays) if x is None else x for x in static]
    args, kwargs = jax.tree.unflatten(treedef, leaves)
    return _draws(rng_key, param_map, args, kwargs, **options)


def _chunked_map(f: Callable, keys: jax.Array, *, chunk: int) -> Any:
    """``vmap`` of ``f`` over chunks of ``chunk`` keys, the chunks in a
    ``lax.map`` (outputs may have zero-size axes, unlike ``lax.map``'s own
    ``batch_size``)."""
    num = keys.shape[0]
    num_chunks = -(-num // chunk)
    padded = jnp.concatenate([keys, keys[: num_chunks * chunk - num]])
    out = jax.lax.map(jax.vmap(f), padded.reshape((num_chunks, chunk) + keys.shape[1:]))
    return jax.tree.map(
        lambda x: x.reshape((num_chunks * chunk,) + x.shape[2:])[:num], out
    )


def replay_trace(
    rng_key: jax.Array,
    param_map: dict[str, jax.Array],
    model: Callable,
    guide: Callable,
    args: tuple,
    kwargs: dict,
) -> dict[str, Any]:
    """The structure of one trace of ``model`` replayed against ``guide``.

    Traced abstractly (``jax.eval_shape``, nothing is computed): values
    computed from draws are abstract (shapes only); observed values passed
    in as data stay concrete.
    """
    captured = {}

    def run(key: jax.Array, params: dict[str, jax.Array]) -> int:
        model_key, guide_key = random.split(key)
        seeded_guide = substitute(seed(guide, guide_key), data=params)
        guide_trace = trace(seeded_guide).get_trace(*args, **kwargs)
        seeded = substitute(replay(seed(model, model_key), guide_trace), data=params)
        captured["trace"] = trace(seeded).get_trace(*args, **kwargs)
        return 0

    jax.eval_shape(run, rng_key, param_map)
    return captured["trace"]


def check_full_data(tr: Mapping[str, dict[str, Any]], function: str) -> None:
    """Raise if a plate of the trace is subsampled.

    :param tr: a trace, e.g. from :func:`replay_trace`.
    :param function: the calling function's name, for the message.
    """
    for name, site in tr.items():
        if site["type"] != "plate":
            continue
        size, subsample = site["args"][0], np.shape(site["value"])[0]
        if subsample < size:
            raise ValueError(
                f"{function}: the plate '{name}' is subsampled ({subsample} of "
                f"{size}), so the log density of the data would only be "
                "estimated; pass the full data set (no subsample_size)."
            )


def site_dims(tr: Mapping[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Dimension names of every sample site of a trace (without chain/draw).

    An axis indexed by a plate is named after the plate; the other axes are
    ``<site>_dim_<i>`` as ArviZ names them.
    """
    dims = {}
    for name, site in tr.items():
        if site["type"] != "sample":
            continue
        shape = np.shape(site["value"])
        names = [f"{name}_dim_{i}" for i in range(len(shape))]
        batch_ndim = len(shape) - site["fn"].event_dim
        for frame in site["cond_indep_stack"]:
            axis = batch_ndim + frame.dim
            if 0 <= axis < batch_ndim and shape[axis] == frame.size:
                names[axis] = frame.name
        dims[name] = names
    return dims


def draws_dataset(
    draws: Mapping[str, Any],
    *,
    dims: Mapping[str, list[str]] | None = None,
    attrs: Mapping[str, Any] | None = None,
) -> xr.Dataset:
    """A dataset of draws ``(S, ...)`` with dims ``(chain=1, draw=S, ...)``.

    :param draws: arrays with the draw axis first.
    :param dims: per variable, the names of the axes after the draw axis.
    :param attrs: dataset attributes.
    """
    return az.dict_to_dataset(
        {name: np.asarray(value)[None] for name, value in draws.items()},
        dims=dict(dims or {}),
        attrs=dict(attrs or {}),
        library=numpyro,
    )
