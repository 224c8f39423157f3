"""Draws of a fitted guide, compiled once per model, guide and options.

:func:`guide_draws` runs the particle machinery for ``S`` draws of a fitted
guide (no gradient) in one jit-compiled program, optionally chunked to bound
memory, and optionally reduces the draws inside the program (e.g. to
per-observation scores). The compiled program is cached: a second call with
the same model, guide and options, and arrays of the same shapes, does not
compile again. :func:`check_fitted_call` checks the argument order shared by
every function that takes a fitted guide, ``(rng_key, param_map, model,
guide, *args)`` as in :func:`numpyro.infer.psis_diagnostic`.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_pvi._particles import ParticleTerms, particle_terms
from numpyro_pvi._validation import check_int

__all__ = ["check_fitted_call", "guide_draws"]


def check_fitted_call(
    function: str,
    param_map: Any,
    model: Any,
    guide: Any,
    *,
    legacy_order: bool = False,
) -> tuple[dict[str, jax.Array], Callable, Callable]:
    """Check ``(param_map, model, guide)`` of a call on a fitted guide.

    :param function: the function's name, for the messages.
    :param param_map: should be the fitted parameters (a mapping).
    :param model: should be the model (callable).
    :param guide: should be the guide (callable).
    :param legacy_order: accept the order ``(model, guide, params)`` of
        earlier releases, with a ``FutureWarning``.
    :return: ``(param_map, model, guide)`` in that order.
    """
    if legacy_order and callable(param_map) and isinstance(guide, Mapping):
        warnings.warn(
            f"{function}(rng_key, model, guide, params, ...) is deprecated and will "
            f"be removed in the next release: call {function}(rng_key, params, "
            "model, guide, ...), the order of numpyro.infer.psis_diagnostic.",
            FutureWarning,
            stacklevel=3,
        )
        param_map, model, guide = guide, param_map, model
    problems = []
    if not isinstance(param_map, Mapping):
        problems.append(
            f"param_map (2nd) must be the dict of fitted parameters, e.g. "
            f"svi_result.params, got {_describe(param_map)}"
        )
    if not callable(model):
        problems.append(f"model (3rd) must be the model, got {_describe(model)}")
    if not callable(guide):
        problems.append(f"guide (4th) must be the guide, got {_describe(guide)}")
    if problems:
        raise TypeError(
            f"{function} takes (rng_key, param_map, model, guide, *args, **kwargs): "
            + "; ".join(problems)
            + "."
        )
    return dict(param_map), model, guide


def _describe(x: Any) -> str:
    name = getattr(x, "__name__", None)
    return f"{type(x).__name__} {name!r}" if name else type(x).__name__


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
    stratify: bool = False,
    reduce: Callable[[ParticleTerms], Any] | None = None,
    function: str = "diagnostic",
) -> Any:
    """``num_draws`` draws of the guide and their per-draw quantities.

    One jit-compiled call of :func:`numpyro_pvi._particles.particle_terms`,
    vectorised with ``vmap``, or over chunks of ``chunk_size`` draws (a
    ``lax.map`` of ``vmap``) to bound memory. The compiled program is cached
    per model, guide and static arguments: array arguments of the model are
    inputs of the program, every other argument is a compile-time constant.

    :param reduce: applied to the :class:`ParticleTerms` inside the program
        (hashable, e.g. a bound method of a score); its result is returned
        instead of the terms.
    """
    if chunk_size is not None:
        chunk_size = check_int(chunk_size, "chunk_size", function, minimum=1)
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
        stratify=stratify,
        reduce=reduce,
        function=function,
    )
    leaves, treedef = jax.tree.flatten((args, kwargs))
    is_array = [isinstance(x, jax.Array | np.ndarray) for x in leaves]
    static = tuple(None if a else x for x, a in zip(leaves, is_array, strict=True))
    dynamic = [x for x, a in zip(leaves, is_array, strict=True) if a]
    try:
        hash((static, reduce))
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
    stratify: bool,
    reduce: Callable | None,
    function: str,
) -> Any:
    if chunk_size is None:
        vectorize = lambda f, keys: jax.vmap(f)(keys)  # noqa: E731
    else:
        vectorize = functools.partial(_chunked_map, chunk=chunk_size)
    terms = particle_terms(
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
        stratify=stratify,
    )
    return terms if reduce is None else jax.lax.stop_gradient(reduce(terms))


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
        "stratify",
        "reduce",
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
) -> Any:
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
