"""An autoguide's prototype, built outside any trace or inside one.

An autoguide builds its prototype (a trace of the model, and initial values
found by NumPyro's search for valid parameters) on its first call and keeps
it. Built eagerly, that is one small program per operation, each compiled,
where the same ``SVI.init`` compiles as one program.
Built under ``jit`` or ``eval_shape`` it keeps tracers, which must not
outlive the trace. :func:`set_up_autoguide` builds it eagerly, for callers
that compile programs around the guide afterwards;
:func:`traceable_guide` gives a trace a copy of a guide that has not built
it, so that the prototype built in that trace leaves with the copy.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import jax
from numpyro.handlers import block, seed, substitute
from numpyro.infer.autoguide import AutoGuide

from numpyro_pvi.distributions import simulators_without_density

__all__ = ["needs_prototype", "set_up_autoguide", "traceable_guide"]


def needs_prototype(guide: Callable) -> bool:
    """Whether ``guide`` is an autoguide that has not built its prototype."""
    return isinstance(guide, AutoGuide) and guide.prototype_trace is None


def set_up_autoguide(
    guide: Callable,
    rng_key: jax.Array,
    param_map: dict[str, jax.Array],
    args: tuple,
    kwargs: dict,
) -> None:
    """Run an autoguide that has not run yet once, outside any trace.

    ``SVI.init`` builds the prototype of fitted guides; a guide given only
    its parameters (e.g. loaded from disk) is built here, before programs
    are compiled around it.
    """
    if needs_prototype(guide):
        with simulators_without_density(), block():
            substitute(seed(guide, rng_key), data=param_map)(*args, **kwargs)


def traceable_guide(guide: Callable) -> Callable:
    """``guide``, or a copy of it when it is an autoguide that has not built
    its prototype: call it inside one trace (``jit``, ``eval_shape``) and
    drop it with the trace. The copy shares the model (and any object the
    guide holds only through it); the rest of the guide is copied, so that
    nothing the trace builds reaches the guide the user holds. (A guide
    that ``copy.deepcopy`` cannot copy raises its error: build its
    prototype eagerly instead, :func:`set_up_autoguide`.)
    """
    if not needs_prototype(guide):
        return guide
    model = guide.model  # type: ignore[attr-defined]
    return copy.deepcopy(guide, {id(model): model})
