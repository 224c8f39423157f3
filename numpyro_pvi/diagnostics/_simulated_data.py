"""Simulated data sets of VSBC and predictive calibration: drawn from the
prior predictive (or a user simulator), passed to the model through its
arguments."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from numpyro.handlers import block, seed
from numpyro.infer import Predictive
from numpyro.primitives import Messenger

from numpyro_pvi._core import (
    latent_dependent_observations,
    obs_mask_site,
    resolve_observed_sites,
    simulation_law,
)
from numpyro_pvi.diagnostics._simulation_refusals import (
    refuse_censored,
    refuse_density_terms,
    refuse_factors,
    refuse_imputed,
    refuse_tempered_priors,
    refuse_unsampled,
)
from numpyro_pvi.distributions import simulators_without_density


class unobserve(Messenger):
    """Sample the named sites from the model even when they are observed."""

    def __init__(self, fn: Callable, names: Sequence[str]) -> None:
        self.names = frozenset(names)
        super().__init__(fn)

    def process_message(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "sample" and msg["name"] in self.names:
            msg["fn"] = simulation_law(msg)
            msg["value"] = None
            msg["is_observed"] = False


def data_injector(
    model: Callable,
    observed: Sequence[str],
    args: tuple,
    kwargs: dict,
    simulated_data_to_args: Callable | None,
    model_trace: dict | None = None,
    function: str = "",
) -> Callable[[dict], tuple[tuple, dict]]:
    """Return ``data -> (args, kwargs)`` that passes simulated data to the model.

    An observed site whose name is a parameter of ``model`` receives its
    simulated value through that argument (so a guide that reads the data sees
    the simulated data); every observed site is also conditioned on, which
    overrides any ``obs=`` the model was called with. With ``model_trace``,
    an argument whose shape is not its observed site's is refused (naming
    ``function``), with ``simulated_data_to_args`` as the remedy.
    """
    if simulated_data_to_args is not None:
        if not callable(simulated_data_to_args):
            raise TypeError("Replications: simulated_data_to_args must be callable.")

        def inject_custom(data: dict) -> tuple[tuple, dict]:
            out = simulated_data_to_args(data, *args, **kwargs)
            if not (isinstance(out, tuple) and len(out) == 2):
                raise ValueError(
                    "Replications: simulated_data_to_args must return a pair "
                    "(args, kwargs)."
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
    if model_trace is not None:
        _check_argument_shapes(signature, names, model_trace, args, kwargs, function)

    def inject(data: dict) -> tuple[tuple, dict]:
        if not names:
            return args, kwargs
        bound = signature.bind_partial(*args, **kwargs)
        for n in names:
            bound.arguments[n] = data[n]
        return tuple(bound.args), dict(bound.kwargs)

    return inject


def _check_argument_shapes(
    signature: inspect.Signature,
    names: Sequence[str],
    model_trace: dict,
    args: tuple,
    kwargs: dict,
    function: str,
) -> None:
    """Raise when the model's argument named after an observed site is not
    that site's observed value (NumPyro's AR(2) example takes the series
    ``y`` and observes ``y[2:]``): a simulated data set passed through it
    would not fit, and the model would mix simulated and real values."""
    bound = signature.bind_partial(*args, **kwargs).arguments
    for name in names:
        if bound.get(name) is None:
            continue
        given, observed = np.shape(bound[name]), np.shape(model_trace[name]["value"])
        if given != observed:
            raise ValueError(
                f"{function}: the model's argument '{name}' has shape {given}, "
                f"but its observed site '{name}' has shape {observed}, so a "
                "simulated data set cannot be passed through that argument as "
                "it is. Pass replications=Replications(simulated_data_to_args="
                "f), with f(data, *args, **kwargs) -> (args, kwargs) building "
                f"the model's arguments from a simulated data set (data['{name}'] "
                "has the observed site's shape), or giving each fit the "
                "arguments the data sets were simulated with, f = lambda data, "
                "*args, **kwargs: (args, kwargs) (the observed sites are "
                "conditioned on the simulated data in any case)."
            )


def generated_data(
    key: jax.Array,
    num: int,
    model: Callable,
    observed: Sequence[str],
    model_trace: dict,
    data_generator: Callable | None,
    args: tuple,
    kwargs: dict,
    *,
    function: str,
) -> dict[str, jax.Array]:
    """``num`` data sets: the model's prior predictive, or the generator's
    (``rng_key -> {observed site: value}``, called once per data set outside
    ``jit``, checked against the shapes the model observes)."""
    if data_generator is None:
        prior = Predictive(
            unobserve(model, observed),
            num_samples=num,
            return_sites=list(observed),
            parallel=True,
        )
        return jax.jit(lambda k: prior(k, *args, **kwargs))(key)
    if not callable(data_generator):
        raise TypeError(f"{function}: data_generator must be callable f(rng_key).")
    sets = [data_generator(k) for k in random.split(key, num)]
    for name in observed:
        expected = np.shape(model_trace[name]["value"])
        got = [np.shape(s[name]) if name in s else None for s in sets[:1]]
        if got[0] != expected:
            raise ValueError(
                f"{function}: data_generator must return a dict with the observed "
                f"site '{name}' of shape {expected} (as the model observes it), "
                f"got {'no such key' if got[0] is None else got[0]}."
            )
    return {n: jnp.stack([jnp.asarray(s[n]) for s in sets]) for n in observed}


def resolve_sites(
    model_trace: dict,
    observed_sites: Sequence[str] | None,
    *,
    function: str,
    model: Callable,
    args: tuple,
    kwargs: dict,
    prior_draws: bool = True,
) -> tuple[list[str], list[str]]:
    """The observed (data) and latent site names, as NumPyro's VSBC
    resolves them, or an error naming ``function`` and what to pass.

    Observed sites whose value changes with the latent draws (a prior
    written as an observed site) are terms of the joint density, not data:
    they are neither simulated nor passed. ``prior_draws``: the procedure
    draws the latents from the prior, which an improper prior refuses, and
    so does such a term (the prior's draws do not see it).
    """
    for name in model_trace:
        base = obs_mask_site(name, model_trace)
        if base is not None:
            raise ValueError(
                f"{function}: the model's site '{base}' uses obs_mask=, so its "
                f"missing entries are the latent site '{name}', whose observed "
                "entries have no density: prior draws of them are not draws of "
                f"the model, and a refit cannot be ranked there. {function} "
                "simulates complete data sets: call it with the model's "
                "arguments for complete data (obs_mask=None)."
            )
    refuse_censored(model_trace, function)
    improper = [
        name
        for name, site in model_trace.items()
        if site["type"] == "sample" and not site["is_observed"] and site["fn"].improper
    ]
    if improper and prior_draws:
        instead = (
            "pass replications=Replications(data_generator=...) (data sets from "
            "a process of your own: no prior draws are needed)"
            if function == "predictive_calibration"
            else "VSBC compares fits with the prior's draws, so give it a proper "
            "prior, or check the predictive calibration of the fits with "
            "predictive_calibration(..., replications=Replications("
            "data_generator=...)), which needs none"
        )
        raise ValueError(
            f"{function}: the latent site '{improper[0]}' has an improper prior "
            "(ImproperUniform), which has no draws to simulate data sets from; "
            f"{instead}."
        )
    sites = model_trace.values()
    if observed_sites is None and not any(
        site["type"] == "sample" and site["is_observed"] for site in sites
    ):
        raise ValueError(
            f"{function}: the model, called with these arguments, has no "
            "observed site. If it observes data when given them, pass the data "
            "as for SVI, or name the sites it simulates with observed_sites=[...]. "
            f"A model without data (a target density) has no data sets for "
            f"{function} to simulate and fit: check it with diagnostics.psis or "
            "report (k̂ of the guide against it)."
        )
    try:
        observed, latent = resolve_observed_sites(model_trace, observed_sites)
    except ValueError as err:
        raise ValueError(
            f"{function}: {err} Pass the observed data as for SVI, or name the "
            "observed sites with `observed_sites=`."
        ) from None
    density_terms = latent_dependent_observations(model, args, kwargs)
    refuse_imputed(model, args, kwargs, density_terms, function)
    if prior_draws:
        refuse_density_terms(density_terms, function)
        refuse_tempered_priors(model_trace, function)
    if observed_sites is None:
        observed = [name for name in observed if name not in density_terms]
    refuse_factors(model_trace, observed, function, prior_draws)
    refuse_unsampled(model_trace, observed, function)
    return list(observed), list(latent)


def set_up_guide(
    guide: Callable, rng_key: jax.Array, inject: Callable, data: dict, function: str
) -> None:
    """Run ``guide`` once on the first simulated data set, outside any trace:
    an autoguide sets up its prototype on its first call, which must not
    happen under ``jit``/``vmap`` (it stores concrete initial values). A
    failure there is NumPyro's own (``SVI.init`` fails alike) and is
    re-raised with the stage and what to try."""
    with simulators_without_density(), block():
        args, kwargs = inject({name: value[0] for name, value in data.items()})
        try:
            seed(guide, rng_key)(*args, **kwargs)
        except Exception as err:
            raise ValueError(
                f"{function}: the guide's set-up on the first simulated data set "
                f"failed ({type(err).__name__}: {err}). An autoguide runs the "
                "model at prior draws and at its initial values to set itself "
                "up, as SVI.init does on the same data; a model "
                "whose numerics fail at some of those draws (an ODE that "
                "diverges, a log of a negative value) fails for some keys. Make "
                "the model robust there (a tighter prior, clipped values), or "
                "pass another rng_key."
            ) from err
