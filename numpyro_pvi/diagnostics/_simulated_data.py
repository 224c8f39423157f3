"""Simulated data sets of VSBC: drawn from the prior predictive, passed to
the model through its arguments."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from numpyro.primitives import Messenger

__all__ = ["data_injector", "unobserve"]


class unobserve(Messenger):
    """Sample the named sites from the model even when they are observed."""

    def __init__(self, fn: Callable, names: Sequence[str]) -> None:
        self.names = frozenset(names)
        super().__init__(fn)

    def process_message(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "sample" and msg["name"] in self.names:
            msg["value"] = None
            msg["is_observed"] = False


def data_injector(
    model: Callable,
    observed: Sequence[str],
    args: tuple,
    kwargs: dict,
    simulated_data_to_args: Callable | None,
) -> Callable[[dict], tuple[tuple, dict]]:
    """Return ``data -> (args, kwargs)`` that passes simulated data to the model.

    An observed site whose name is a parameter of ``model`` receives its
    simulated value through that argument (so a guide that reads the data sees
    the simulated data); every observed site is also conditioned on, which
    overrides any ``obs=`` the model was called with.
    """
    if simulated_data_to_args is not None:
        if not callable(simulated_data_to_args):
            raise TypeError("`simulated_data_to_args` must be callable.")

        def inject_custom(data: dict) -> tuple[tuple, dict]:
            out = simulated_data_to_args(data, *args, **kwargs)
            if not (isinstance(out, tuple) and len(out) == 2):
                raise ValueError(
                    "`simulated_data_to_args` must return a pair (args, kwargs)."
                )
            return tuple(out[0]), dict(out[1])

        return inject_custom

    try:
        signature = inspect.signature(model)
    except (TypeError, ValueError):  # builtins, some callables
        return lambda data: (args, kwargs)
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = [
        n
        for n in observed
        if n in signature.parameters and signature.parameters[n].kind in kinds
    ]

    def inject(data: dict) -> tuple[tuple, dict]:
        if not names:
            return args, kwargs
        bound = signature.bind_partial(*args, **kwargs)
        for n in names:
            bound.arguments[n] = data[n]
        return tuple(bound.args), dict(bound.kwargs)

    return inject
