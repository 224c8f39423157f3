"""The one deprecation shim: call shapes of earlier versions, translated to
the current ones with a ``FutureWarning``, for one release.

The public surface has two call shapes, NumPyro's: a function on a fitted
guide takes ``(rng_key, params, model, guide, *args, **kwargs)``
(:func:`numpyro.infer.psis_diagnostic`), one that fits takes ``(rng_key,
model, guide, optim, ...)`` (:func:`numpyro.infer.calibration.
vsbc_diagnostic`) with its options in the values of
:mod:`~numpyro_pvi._core.recipes`. Each public function whose shape changed
is wrapped by :func:`accepts_old_calls` with one translator below; the
translators, and nothing else, know the old shapes. They are removed in the
release after the one that deprecates them (see CONTRIBUTING's deprecation
policy).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from numpyro_pvi._core.recipes import FitRecipe, Replications

F = TypeVar("F", bound=Callable[..., Any])
Translator = Callable[[str, tuple, dict], tuple[tuple, dict]]

#: Keyword arguments of earlier versions that now travel in a value.
REPLICATION_KEYWORDS = tuple(f.name for f in Replications.__dataclass_fields__.values())
FIT_KEYWORDS = ("num_steps", "num_draws", "progress_bar")


def accepts_old_calls(translate: Translator) -> Callable[[F], F]:
    """Wrap a public function so that calls of the old shape that
    ``translate(name, args, kwargs)`` recognises still work (it warns)."""

    def decorator(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = translate(fn.__name__, args, dict(kwargs))
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorator


def _warn(old: str, new: str) -> None:
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release: call {new}.",
        FutureWarning,
        stacklevel=4,
    )


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def fitted(name: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``(rng_key, model, guide, params, ...)`` and ``param_map=`` →
    ``(rng_key, params, model, guide, ...)``."""
    if "param_map" in kwargs:
        _warn(f"{name}(..., param_map=...)", f"{name}(..., params=...)")
        kwargs["params"] = kwargs.pop("param_map")
    if len(args) >= 4 and callable(args[1]) and isinstance(args[3], Mapping):
        _warn(
            f"{name}(rng_key, model, guide, params, ...)",
            f"{name}(rng_key, params, model, guide, ...), the order of "
            "numpyro.infer.psis_diagnostic",
        )
        args = (args[0], args[3], args[1], args[2], *args[4:])
    return args, kwargs


def heterogeneity(name: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Both earlier orders of two fits → ``(rng_key, params, model, guide,
    ..., reference_params=, reference_guide=)``."""
    new = (
        f"{name}(rng_key, params, model, guide, *args, reference_params=vi_params, "
        "reference_guide=vi_guide)"
    )
    if len(args) >= 6 and callable(args[1]) and isinstance(args[3], Mapping):
        _warn(
            f"{name}(rng_key, model, pvi_guide, pvi_params, vi_guide, vi_params)", new
        )
        key, model, guide, params, ref_guide, ref_params, *rest = args
    elif len(args) >= 6 and isinstance(args[2], Mapping) and callable(args[3]):
        _warn(
            f"{name}(rng_key, pvi_params, vi_params, model, pvi_guide, vi_guide)", new
        )
        key, params, ref_params, model, guide, ref_guide, *rest = args
    else:
        return args, kwargs
    kwargs.update(reference_params=ref_params, reference_guide=ref_guide)
    return (key, params, model, guide, *rest), kwargs


def _pop_into(
    name: str, kwargs: dict, field: str, cls: type, keywords: tuple[str, ...]
) -> None:
    """Move old loose keywords of ``cls``'s fields into ``kwargs[field]``."""
    loose = {k: kwargs.pop(k) for k in keywords if k in kwargs}
    if not loose:
        return
    if field in kwargs:
        raise TypeError(
            f"{name}: pass {', '.join(loose)} inside {field}={cls.__name__}(...), "
            f"not beside it."
        )
    shown = ", ".join(f"{k}=..." for k in loose)
    _warn(f"{name}(..., {shown})", f"{name}(..., {field}={cls.__name__}({shown}))")
    kwargs[field] = cls(**loose)


def replicated(name: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``num_simulations=``, ``num_svi_steps=``, ... → ``replications=``."""
    _pop_into(name, kwargs, "replications", Replications, REPLICATION_KEYWORDS)
    return args, kwargs


def vsbc(name: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """As :func:`replicated`, and ``log_likelihood=False`` →
    ``test_quantities={..., "log_likelihood": None}``."""
    args, kwargs = replicated(name, args, kwargs)
    if "log_likelihood" in kwargs:
        keep = kwargs.pop("log_likelihood")
        _warn(
            f"{name}(..., log_likelihood=...)",
            f'{name}(..., test_quantities={{"log_likelihood": None}}) to leave '
            "the joint log-likelihood out (it is in by default)",
        )
        if not keep:
            kwargs["test_quantities"] = {
                **(kwargs.get("test_quantities") or {}),
                "log_likelihood": None,
            }
    return args, kwargs


def cross_validate(
    name: str, args: tuple, kwargs: dict, *, default_candidates: Callable
) -> tuple[tuple, dict]:
    """``(rng_key, model, guide, optim, num_steps, ...)``, ``num_draws=``,
    ``progress_bar=`` → ``fit=FitRecipe(...)``; ``num_particles=`` →
    ``candidates=default_candidates(guide, score, num_particles=...)`` (the
    selection package passes its ``default_candidates``: the core does not
    import upward)."""
    if "fit" not in kwargs and len(args) >= 5 and _is_int(args[4]):
        kwargs.setdefault("num_steps", args[4])
        args = args[:4] + args[5:]
    _pop_into(name, kwargs, "fit", FitRecipe, FIT_KEYWORDS)
    if "num_particles" in kwargs:
        _warn(
            f"{name}(..., num_particles=...)",
            f"{name}(..., candidates=default_candidates(guide, score, "
            "num_particles=...))",
        )
        kwargs["candidates"] = default_candidates(
            args[2],
            kwargs.get("score", "log"),
            num_particles=kwargs.pop("num_particles"),
        )
    return args, kwargs


def fit_gm_pvi(name: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``(rng_key, model, guide, optim, loss, num_steps, ...)`` →
    ``(..., loss, *args, num_steps=...)``."""
    if "num_steps" not in kwargs and len(args) >= 6 and _is_int(args[5]):
        _warn(
            f"{name}(rng_key, model, guide, optim, loss, num_steps, *args)",
            f"{name}(rng_key, model, guide, optim, loss, *args, num_steps=...)",
        )
        kwargs["num_steps"] = args[5]
        args = args[:5] + args[6:]
    return args, kwargs


def params_first(name: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``(guide, params, ...)`` → ``(params, guide, ...)``."""
    if len(args) >= 2 and callable(args[0]) and isinstance(args[1], Mapping):
        _warn(f"{name}(guide, params, ...)", f"{name}(params, guide, ...)")
        args = (args[1], args[0], *args[2:])
    return args, kwargs
