"""Draws of a fitted guide, compiled once per model, guide and options.

:func:`guide_draws` runs the particle machinery for ``S`` draws of a fitted
guide (no gradient) in one jit-compiled program, optionally chunked to bound
memory, and optionally reduces the draws inside the program (e.g. to
per-observation scores). The compiled program is cached: a second call with
the same model, guide and options, and arrays of the same shapes, does not
compile again. :func:`check_fitted_call` checks the argument order shared by
every function that takes a fitted guide, ``(rng_key, params, model,
guide, *args)`` as in :func:`numpyro.infer.psis_diagnostic`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_pvi._trace.autoguide_setup import traceable_guide
from numpyro_pvi._trace.imputed import NeedsConstantArguments
from numpyro_pvi._trace.particles import ParticleSpec, particle_terms
from numpyro_pvi._trace.structure import check_full_data, replay_trace
from numpyro_pvi._trace.terms import ParticleTerms
from numpyro_pvi._trace.tracing import point_mass_sites
from numpyro_pvi._trace.validation import check_int
from numpyro_pvi.evaluation.laplace import laplace_posterior


def check_fitted_call(
    function: str,
    params: Any,
    model: Any,
    guide: Any,
    *,
    needs_density: bool = False,
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
) -> tuple[dict[str, jax.Array], Callable, Callable]:
    """Check ``(params, model, guide)`` of a call on a fitted guide.

    :param function: the function's name, for the messages.
    :param params: should be the fitted parameters (a mapping).
    :param model: should be the model (callable).
    :param guide: should be the guide (callable).
    :param needs_density: the function reads the guide's log density: refuse
        a guide that gives latent sites as point masses.
    :param args: the model's positional arguments (an
        ``AutoLaplaceApproximation`` not run yet sets itself up with them).
    :param kwargs: the model's keyword arguments.
    :return: ``(params, model, guide)`` in that order; an
        ``AutoLaplaceApproximation`` as the fitted Laplace approximation it
        stands for (:func:`~numpyro_pvi.evaluation.laplace.laplace_posterior`).
    """
    problems = []
    if not isinstance(params, Mapping):
        problems.append(
            f"params (2nd) must be the dict of fitted parameters, e.g. "
            f"svi_result.params, got {_describe(params)}"
        )
    if not callable(model):
        problems.append(f"model (3rd) must be the model, got {_describe(model)}")
    if not callable(guide):
        problems.append(f"guide (4th) must be the guide, got {_describe(guide)}")
    if problems:
        raise TypeError(
            f"{function} takes (rng_key, params, model, guide, *args, **kwargs): "
            + "; ".join(problems)
            + "."
        )
    check_finite_params(function, params)
    guide, params = laplace_posterior(guide, params, args, kwargs or {})
    point_masses = (
        point_mass_sites(model, guide, params, args, kwargs or {}, function)
        if needs_density
        else []
    )
    if point_masses:
        raise ValueError(
            f"{function} reads the guide's log density at its draws, but this "
            f"guide ({type(guide).__name__}) gives the latent sites "
            f"{point_masses} as point masses (Delta, as AutoDelta does), so it "
            "has no density over them and the importance ratios p(θ, y)/q(θ) "
            "are not defined. Fit a guide with a spread over every latent site "
            "(AutoNormal, AutoMultivariateNormal, ...), or "
            "AutoLaplaceApproximation, which this function reads as its Laplace "
            "approximation once fitted."
        )
    return params, model, guide


def check_finite_params(function: str, param_map: Mapping[str, Any]) -> None:
    """Raise if a fitted parameter holds a NaN or an infinity (a fit that
    diverged): every number computed from it would be NaN or meaningless.

    :param function: the calling function's name, for the message.
    :param param_map: the fitted parameters (array leaves are checked;
        traced values are left alone).
    """
    bad = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(dict(param_map)):
        if isinstance(leaf, jax.core.Tracer) or not hasattr(leaf, "dtype"):
            continue
        values = np.asarray(leaf)
        if np.issubdtype(values.dtype, np.inexact) and not np.all(np.isfinite(values)):
            name = jax.tree_util.keystr(path, simple=True, separator="/")
            count = int(np.sum(~np.isfinite(values)))
            bad.append(f"'{name}' ({count} of {values.size} values NaN or infinite)")
    if bad:
        raise ValueError(
            f"{function}: the fitted parameters are not finite: {', '.join(bad)}. "
            "The fit diverged (its losses read NaN from some step on): refit with "
            "a smaller step size, more particles, or another initialisation "
            "before reading diagnostics or scores of it."
        )


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
    spec: ParticleSpec,
    *,
    chunk_size: int | None = None,
    reduce: Callable[..., Any] | None = None,
    inputs: tuple = (),
) -> Any:
    """The particle terms of ``spec.num_particles`` draws of a fitted guide,
    without gradient.

    One jit-compiled call of :func:`numpyro_pvi._trace.particles.particle_terms`,
    vectorised with ``vmap``, or over chunks of ``chunk_size`` draws (a
    ``lax.map`` of ``vmap``) to bound memory. The compiled program is cached
    per model, guide and static arguments: array arguments of the model are
    inputs of the program, every other argument is a compile-time constant.

    :param spec: what to draw (with ``chunk_size``, its ``vectorize`` is
        replaced as above).
    :param chunk_size: draws per chunk (``None``: all at once).
    :param reduce: applied to the :class:`ParticleTerms` (and ``inputs``)
        inside the program (hashable, e.g. a bound method of a score); its
        result is returned instead of the terms.
    :param inputs: arrays passed to ``reduce``, inputs of the program.
    """
    if chunk_size is not None:
        chunk_size = check_int(chunk_size, "chunk_size", spec.objective, minimum=1)
        if chunk_size >= spec.num_particles:
            chunk_size = None
    return run_compiled(
        _draws,
        rng_key,
        param_map,
        args,
        kwargs,
        *inputs,
        model=model,
        guide=guide,
        spec=dataclasses.replace(spec, require_reparam=False),
        chunk_size=chunk_size,
        reduce=reduce,
    )


#: Programs whose model computes with its arguments in Python (``len``,
#: ``np.unique``, ...): they get the arguments as constants.
_NEEDS_CONSTANTS: set = set()
#: What tracing raises when Python asks a traced argument for its value (and
#: the particles, when an observed site's imputed entries need its value).
CONCRETE_VALUE_ERRORS = (
    NeedsConstantArguments,
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
)


def run_compiled(
    fn: Callable,
    rng_key: jax.Array,
    param_map: dict[str, jax.Array],
    args: tuple,
    kwargs: dict,
    *inputs: Any,
    **static: Any,
) -> Any:
    """``fn(rng_key, param_map, args, kwargs, *inputs, **static)`` in one
    jit-compiled program (see :func:`compiled`)."""
    return compiled(fn, args, kwargs, **static)(rng_key, param_map, *inputs)


def compiled(fn: Callable, args: tuple, kwargs: dict, **static: Any) -> Callable:
    """``(rng_key, param_map, *inputs) -> fn(rng_key, param_map, args,
    kwargs, *inputs, **static)`` compiled.

    The array leaves of the model arguments are inputs of the program, so a
    call with other arrays of the same shapes (new data) runs the program
    compiled for the first, which is cached per ``fn``, static options and
    non-array arguments. A model that computes with its arguments in Python
    (``len(np.unique(x))``, ``if flag:``; as :meth:`numpyro.infer.SVI.run`
    allows, since it closes over them) cannot take them traced: it then gets
    them as constants, in a program cached per the arguments' values (a
    second diagnostic of the same data compiles nothing; new values compile
    anew). A non-array argument that is not hashable gets a program per
    callable returned.

    :param fn: the function (hashable: a module-level function).
    :param static: hashable compile-time options.
    """
    structure, dynamic = split_arrays(args, kwargs)
    options = tuple(sorted(static.items()))
    cache_key: tuple | None = (fn, structure, options)
    try:
        hash(cache_key)
    except TypeError:  # an unhashable constant
        cache_key = None

    def call(rng_key: jax.Array, param_map: dict, *inputs: Any) -> Any:
        if cache_key is not None and cache_key not in _NEEDS_CONSTANTS:
            try:
                return _cached_program(
                    rng_key,
                    param_map,
                    dynamic,
                    inputs,
                    fn=fn,
                    structure=structure,
                    options=options,
                )
            except CONCRETE_VALUE_ERRORS:
                _NEEDS_CONSTANTS.add(cache_key)
        constant = _constant_program(fn, args, kwargs, static, cache_key, dynamic)
        return constant(rng_key, param_map, *inputs)

    return call


#: Programs compiled with the model arguments as constants, per function,
#: options and the arguments' values: a second call with equal arguments
#: (another diagnostic of the same fit, the same data again) runs the
#: program compiled for the first. The least recently used go first: each
#: holds its arguments.
_CONSTANT_PROGRAMS: OrderedDict[tuple, Callable] = OrderedDict()
_MAX_CONSTANT_PROGRAMS = 32


def _constant_program(
    fn: Callable,
    args: tuple,
    kwargs: dict,
    static: dict[str, Any],
    cache_key: tuple | None,
    dynamic: list,
) -> Callable:
    """``fn`` jit-compiled with ``args`` and ``kwargs`` as constants, cached
    per ``cache_key`` and the values of the arrays ``dynamic`` (uncached when
    either is unavailable: an unhashable constant, a traced array)."""
    digest = None if cache_key is None else _values_digest(dynamic)
    key = None if cache_key is None or digest is None else (cache_key, digest)
    if key is not None and key in _CONSTANT_PROGRAMS:
        _CONSTANT_PROGRAMS.move_to_end(key)
        return _CONSTANT_PROGRAMS[key]
    program = jax.jit(lambda k, p, *i: fn(k, p, args, kwargs, *i, **_traceable(static)))
    if key is not None:
        _CONSTANT_PROGRAMS[key] = program
        if len(_CONSTANT_PROGRAMS) > _MAX_CONSTANT_PROGRAMS:
            _CONSTANT_PROGRAMS.popitem(last=False)
    return program


def _values_digest(arrays: list) -> str | None:
    """A digest of the arrays' dtypes, shapes and values, or ``None`` when
    one is traced."""
    digest = hashlib.blake2b(digest_size=20)
    for x in arrays:
        if isinstance(x, jax.core.Tracer):
            return None
        values = np.ascontiguousarray(np.asarray(x))
        digest.update(f"{values.dtype.str}{values.shape}".encode())
        digest.update(values.tobytes())
    return digest.hexdigest()


def cached_program_count() -> int:
    """How many programs :func:`compiled` holds compiled (for tests: a new
    call with arrays of the same shapes compiles none; for a model that
    computes with its arguments in Python, a call with the same values)."""
    traced = _cached_program._cache_size()  # type: ignore[attr-defined]
    return traced + len(_CONSTANT_PROGRAMS)


@functools.partial(jax.jit, static_argnames=("fn", "structure", "options"))
def _cached_program(
    rng_key: jax.Array,
    param_map: dict[str, jax.Array],
    dynamic: list[jax.Array],
    inputs: tuple,
    *,
    fn: Callable,
    structure: tuple[Any, tuple],
    options: tuple,
) -> Any:
    args, kwargs = join_arrays(structure, dynamic)
    return fn(rng_key, param_map, args, kwargs, *inputs, **_traceable(dict(options)))


def _traceable(options: dict[str, Any]) -> dict[str, Any]:
    """The options with a ``guide`` that can be called in this trace: an
    autoguide that has not built its prototype builds it on a copy
    (:func:`~numpyro_pvi._trace.autoguide_setup.traceable_guide`), so that
    a program may be compiled around a guide no one has run yet."""
    if "guide" not in options:
        return options
    return {**options, "guide": traceable_guide(options["guide"])}


def split_arrays(args: tuple, kwargs: dict) -> tuple[tuple[Any, tuple], list]:
    """Model arguments as ``(structure, arrays)``: the array leaves (inputs of
    a compiled program) and everything else, ``(treedef, leaves)`` with
    ``None`` in place of each array (compile-time constants; hashable when
    the constants are). :func:`join_arrays` is the inverse."""
    leaves, treedef = jax.tree.flatten((args, kwargs))
    is_array = [isinstance(x, jax.Array | np.ndarray) for x in leaves]
    static = tuple(None if a else x for x, a in zip(leaves, is_array, strict=True))
    return (treedef, static), [x for x, a in zip(leaves, is_array, strict=True) if a]


def join_arrays(structure: tuple[Any, tuple], arrays: list) -> tuple[tuple, dict]:
    """``(args, kwargs)`` from :func:`split_arrays`'s structure and arrays."""
    treedef, static = structure
    remaining = iter(arrays)
    leaves = [next(remaining) if x is None else x for x in static]
    return jax.tree.unflatten(treedef, leaves)


def structured_draws(
    rng_key: jax.Array,
    param_map: dict[str, jax.Array],
    model: Callable,
    guide: Callable,
    args: tuple,
    kwargs: dict,
    spec: ParticleSpec,
    *,
    chunk_size: int | None = None,
) -> tuple[ParticleTerms, dict[str, Any]]:
    """:func:`guide_draws` and the model's static structure (the trace of
    :func:`~numpyro_pvi._trace.structure.replay_trace`), the data checked complete:
    what every diagnostic on a fitted guide starts from."""
    draw_key, trace_key = jax.random.split(rng_key)
    tr = replay_trace(trace_key, param_map, model, guide, args, kwargs, spec.objective)
    check_full_data(tr, spec.objective)
    terms = guide_draws(
        draw_key, param_map, model, guide, args, kwargs, spec, chunk_size=chunk_size
    )
    return terms, tr


def _draws(
    rng_key: jax.Array,
    param_map: dict[str, jax.Array],
    args: tuple,
    kwargs: dict,
    *inputs: Any,
    model: Callable,
    guide: Callable,
    spec: ParticleSpec,
    chunk_size: int | None,
    reduce: Callable | None,
) -> Any:
    if chunk_size is not None:  # a partial per call: kept out of the cache key
        vectorize = functools.partial(_chunked_map, chunk=chunk_size)
        spec = dataclasses.replace(spec, vectorize=vectorize)
    terms = particle_terms(rng_key, param_map, model, guide, args, kwargs, spec)
    if reduce is None:
        return terms
    return jax.lax.stop_gradient(reduce(terms, *inputs))


def _chunked_map(f: Callable, xs: Any, *, chunk: int) -> Any:
    """``vmap`` of ``f`` over chunks of ``chunk`` rows of ``xs`` (a pytree),
    the chunks in a ``lax.map`` (outputs may have zero-size axes, unlike
    ``lax.map``'s own ``batch_size``)."""
    num = jax.tree.leaves(xs)[0].shape[0]
    num_chunks = -(-num // chunk)

    def blocks(x: jax.Array) -> jax.Array:
        padded = jnp.concatenate([x, x[: num_chunks * chunk - num]])
        return padded.reshape((num_chunks, chunk) + x.shape[1:])

    out = jax.lax.map(jax.vmap(f), jax.tree.map(blocks, xs))
    return jax.tree.map(
        lambda x: x.reshape((num_chunks * chunk,) + x.shape[2:])[:num], out
    )
