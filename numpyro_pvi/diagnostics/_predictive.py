"""Posterior-predictive draws and the model's inputs, as ArviZ's groups:
``posterior_predictive``, ``constant_data``, ``predictions`` and
``predictions_constant_data`` (what ``az.plot_ppc``, ``loo_pit`` and
``plot_ppc_pit`` read)."""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import xarray as xr
from numpyro.handlers import seed, trace
from numpyro.infer import Predictive
from numpyro.primitives import Messenger

from numpyro_pvi._arviz.containers import ADAPTER
from numpyro_pvi._arviz.idata import draws_dataset, site_dims
from numpyro_pvi._trace.data_plate import simulation_law
from numpyro_pvi._trace.enumeration import enumerated_sites
from numpyro_pvi._trace.site_laws import describe, is_censored, sampler_failure
from numpyro_pvi._trace.structure import feasible_improper
from numpyro_pvi._trace.tracing import drawn_params


class _simulate_observed(Messenger):
    """The observed sites ``names`` sample from their distribution instead of
    returning the data: the posterior predictive of the model as written.
    Other observed sites (a prior written as an observed site, a factor)
    keep their values, and so do censored ones, whose sampler draws the
    uncensored outcome where they observe bounds, and those whose
    distribution has no sampler; ``left_out`` says why, by name."""

    def __init__(self, fn: Callable, names: list[str]) -> None:
        self.names = frozenset(names)
        self.left_out: dict[str, str] = {}
        super().__init__(fn)

    def process_message(self, msg: dict[str, Any]) -> None:
        if msg["type"] != "sample" or msg["name"] not in self.names:
            return
        fn = msg["fn"]
        if is_censored(fn):
            self.left_out[msg["name"]] = (
                f"({describe(fn)}): it is censored, its observations are "
                "censoring bounds of the outcome, and its sampler draws the "
                "uncensored outcome, which does not compare with them (a "
                "posterior predictive check of it would be wrong)"
            )
            return
        law = simulation_law(msg)
        why = sampler_failure(law)
        if why is not None:
            self.left_out[msg["name"]] = f"({describe(fn)}): {why}"
            return
        msg["fn"] = law
        msg["is_observed"] = False
        msg["value"] = None


def simulate_observed(
    rng_key: jax.Array,
    model: Callable,
    draws: Mapping[str, Any],
    observed: list[str],
    args: tuple,
    kwargs: dict,
    *,
    params: Mapping[str, Any],
    num_draws: int,
    function: str = "to_inference_data",
    stacklevel: int = 4,
) -> dict[str, np.ndarray]:
    """``(S, ...)`` every site of ``observed`` simulated at each of the
    ``S = num_draws`` latent ``draws`` (one vectorised call of
    ``numpyro.infer.Predictive``), the model's own ``numpyro.param`` sites
    at their values in ``params``. A censored site, or one without a
    sampler, is left out, with a warning naming it and ``function``
    (``stacklevel``: the user's call, for the warning)."""
    simulating = _simulate_observed(model, observed)
    predictive = Predictive(
        simulating,
        posterior_samples=dict(draws) if draws else None,
        params=dict(params),
        num_samples=None if draws else num_draws,
        return_sites=observed,
    )
    out = predictive(rng_key, *args, **kwargs)
    for name, why in simulating.left_out.items():
        warnings.warn(
            f"{function}: no simulated values of the observed site '{name}' {why}.",
            UserWarning,
            stacklevel=stacklevel,
        )
    return {
        n: np.asarray(out[n])
        for n in observed
        if n in out and n not in simulating.left_out
    }


def refuse_drawn_params(
    model: Callable,
    guide: Callable,
    params: Mapping[str, Any],
    args: tuple,
    kwargs: dict,
    where: str,
) -> None:
    """Refuse a guide that draws the model's own parameters (a
    :class:`~numpyro_pvi.selection.StackedGuide` of a model with a
    ``numpyro.module``: each candidate's): ``numpyro.infer.Predictive``,
    which simulates from the model, takes one value of them."""
    names = drawn_params(model, guide, params, args, kwargs)
    if names:
        raise ValueError(
            f"{where}: the guide gives the model parameters of its own "
            f"{names} with each draw (a stacked fit: each candidate's), and "
            "simulating from the model takes one value of them. Export each "
            "candidate's fit (its own parameters: StackedFit.candidate_params), "
            "or score the stacked predictive with predictive_score."
        )


def deterministic_values(
    rng_key: jax.Array,
    model: Callable,
    draws: Mapping[str, Any],
    names: list[str],
    args: tuple,
    kwargs: dict,
    *,
    params: Mapping[str, Any],
) -> dict[str, np.ndarray]:
    """``(S, ...)`` the model's ``numpyro.deterministic`` sites ``names`` at
    each of the latent ``draws``, the data as observed (what
    ``numpyro.infer.Predictive`` returns of them)."""
    if not names or not draws:
        return {}
    out = Predictive(
        model, posterior_samples=dict(draws), params=dict(params), return_sites=names
    )(rng_key, *args, **kwargs)
    return {n: np.asarray(out[n]) for n in names if n in out}


def discrete_values(
    rng_key: jax.Array,
    model: Callable,
    draws: Mapping[str, Any],
    structure: dict[str, Any],
    args: tuple,
    kwargs: dict,
    *,
    params: Mapping[str, Any],
) -> tuple[dict[str, np.ndarray], dict[str, list[str]], str | None]:
    """``(S, ...)`` draws of the sites summed out of the fits (the enumerated
    sites the guide does not draw, and the deterministic sites after them)
    from their posterior at each of the latent ``draws``, by NumPyro's
    ``infer_discrete``; their dims; and where NumPyro cannot draw them
    (sites inside ``scan``), no draws and the reason. ``structure``: the
    model's own (not summed-out) structure."""
    enumerated = [n for n in enumerated_sites(structure) if n not in draws]
    if not enumerated:
        return {}, {}, None
    if any(structure[n]["in_scan"] for n in enumerated):
        return (
            {},
            {},
            (
                f"the enumerated site(s) {enumerated} are not in the posterior "
                "group: NumPyro's infer_discrete does not draw sites inside scan"
            ),
        )
    drawn = Predictive(
        model,
        posterior_samples=dict(draws),
        params=dict(params),
        return_sites=enumerated,
        infer_discrete=True,
    )(rng_key, *args, **kwargs)
    values = {n: np.asarray(drawn[n]) for n in enumerated}
    order = list(structure)
    after = order[order.index(enumerated[0]) :]
    values |= deterministic_values(
        rng_key,
        model,
        {**draws, **values},
        [n for n in after if structure[n]["type"] == "deterministic"],
        args,
        kwargs,
        params=params,
    )
    dims = site_dims(structure)
    return values, {n: dims[n] for n in values}, None


def model_observations(
    model: Callable, args: tuple, kwargs: dict
) -> dict[str, np.ndarray]:
    """The values of the model's observed sites, as it observes them (its
    improper latent sites at a value of their support, which they cannot
    draw)."""
    tr = trace(seed(feasible_improper(model), 0)).get_trace(*args, **kwargs)
    return {
        n: np.asarray(s["value"])
        for n, s in tr.items()
        if s["type"] == "sample" and s["is_observed"]
    }


def model_inputs(
    model: Callable, args: tuple, kwargs: dict, observed_values: Mapping[str, Any]
) -> tuple[dict[str, np.ndarray], inspect.BoundArguments | None]:
    """The model's array arguments that are not observed data, by the name of
    their parameter, and the bound arguments (``None`` when the model's
    signature cannot be read)."""
    try:
        bound = inspect.signature(model).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return {}, None
    observed = [np.asarray(v) for v in observed_values.values()]
    inputs = {}
    for name, value in bound.arguments.items():
        if not isinstance(value, np.ndarray | jax.Array) or np.ndim(value) == 0:
            continue
        array = np.asarray(value)
        if any(_same(array, y) for y in observed):
            continue
        inputs[name] = array
    return inputs, bound


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal up to rounding (two compiled programs of the same values)."""
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=1e-6, equal_nan=True))


def inputs_dataset(
    inputs: Mapping[str, np.ndarray], plate_name: str | None, plate_size: int
) -> xr.Dataset:
    """``constant_data``: an axis as long as the data plate is named after it."""
    dims = {
        name: [plate_name] + [f"{name}_dim_{i}" for i in range(1, x.ndim)]
        for name, x in inputs.items()
        if plate_name is not None and x.shape[0] == plate_size
    }
    return ADAPTER.dict_to_dataset(dict(inputs), dims=dims, sample_dims=())


def predictive_groups(
    rng_key: jax.Array,
    model: Callable,
    fit: tuple[
        Mapping[str, Any], Mapping[str, Any], dict[str, list[str]], Mapping[str, Any]
    ],
    plate: tuple[str | None, int],
    args: tuple,
    kwargs: dict,
    predictions: Mapping[str, Any] | None,
    *,
    params: Mapping[str, Any],
    num_draws: int,
) -> dict[str, xr.Dataset]:
    """``posterior_predictive`` and ``constant_data`` of a fit, and with
    ``predictions`` (new values of the model's arguments, by name)
    ``predictions`` and ``predictions_constant_data``. ``fit`` is ``(draws,
    observed_values, dims, fixed)``; ``plate`` the data plate's name and size;
    ``params`` the fitted parameters (the model's own among them) and
    ``num_draws`` the number of draws."""
    draws, observed_values, dims, fixed = fit
    observed = list(observed_values)
    sites = observed + list(fixed)  # the deterministic sites, as observed
    groups = {}
    simulate = functools.partial(simulate_observed, params=params, num_draws=num_draws)
    try:
        simulated = simulate(rng_key, model, draws, sites, args, kwargs)
    except NotImplementedError as err:  # a distribution without a sampler
        warnings.warn(
            f"to_inference_data: no posterior_predictive group: an observed site "
            f"of {observed} cannot be simulated "
            f"({str(err) or type(err).__name__}).",
            UserWarning,
            stacklevel=3,
        )
    else:
        # the deterministic sites that depend on the data: simulated with it
        simulated = {
            n: v
            for n, v in simulated.items()
            if n not in fixed or not _close(v, fixed[n])
        }
        groups["posterior_predictive"] = draws_dataset(
            simulated, dims={n: dims[n] for n in simulated}
        )
    inputs, bound = model_inputs(model, args, kwargs, observed_values)
    if inputs:
        groups["constant_data"] = inputs_dataset(inputs, *plate)
    if predictions is None:
        return groups
    if bound is None:
        raise ValueError(
            "to_inference_data: predictions= names the model's arguments, but "
            "the model's signature cannot be read; wrap it in a function with "
            "named parameters."
        )
    unknown = sorted(set(predictions) - set(inspect.signature(model).parameters))
    if unknown:
        raise ValueError(
            f"to_inference_data: predictions= names {unknown}, which are not "
            f"arguments of the model {sorted(inspect.signature(model).parameters)}."
        )
    new = inspect.signature(model).bind(*args, **kwargs)
    for name, value in new.arguments.items():
        if name not in inputs and any(
            _same(np.asarray(value), np.asarray(y)) for y in observed_values.values()
        ):
            new.arguments[name] = None  # the observed data: simulated instead
    new.arguments.update(predictions)
    key = jax.random.fold_in(rng_key, 1)
    predicted = simulate(key, model, draws, sites, new.args, new.kwargs)
    groups["predictions"] = draws_dataset(
        predicted, dims={n: dims[n] for n in predicted}
    )
    new_inputs = {k: np.asarray(v) for k, v in predictions.items() if v is not None}
    groups["predictions_constant_data"] = ADAPTER.dict_to_dataset(
        new_inputs, sample_dims=()
    )
    return groups
