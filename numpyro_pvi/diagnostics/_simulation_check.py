"""Whether the models fitted to simulated data sets are the model that
simulated them.

VSBC and the predictive calibration draw each data set from the model
called with the user's arguments, then fit the model called with the data
set in place of the data (``data_injector``). Where a site's distribution
reads the data argument itself (a prior centred on ``y.mean()``, a
likelihood of lagged values ``y[t - 1]``), the two differ: the latents and
data sets drawn are not those of the models fitted, and an exact fit would
look miscalibrated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.handlers import condition, seed, trace

#: Relative and absolute tolerance on a site's summed log density (float32).
RTOL = 1e-5
ATOL = 1e-4


def check_fits_are_the_simulating_model(
    rng_key: jax.Array,
    model: Callable,
    args: tuple,
    kwargs: dict,
    inject: Callable[[dict], tuple[tuple, dict]],
    data: dict[str, jax.Array],
    *,
    function: str,
    alternative: str = "",
) -> None:
    """Raise, naming the site, where a site's log density at one simulated
    data set (``data``: site -> value of one data set) and one draw of the
    latents differs between the model called with ``args``/``kwargs`` (which
    simulated it) and with ``inject(data)`` (which is fitted to it).

    A model that does not run eagerly on these values is left to the fits,
    which report their own errors.
    """
    fit_args, fit_kwargs = inject(data)
    try:
        simulating = trace(seed(condition(model, data), rng_key)).get_trace(
            *args, **kwargs
        )
        values = {n: s["value"] for n, s in simulating.items() if s["type"] == "sample"}
        fitted = trace(seed(condition(model, values), rng_key)).get_trace(
            *fit_args, **fit_kwargs
        )
    except Exception:  # noqa: BLE001 - the fits raise and explain their own errors
        return
    before, after = _log_densities(simulating), _log_densities(fitted)
    for name in before.keys() & after.keys():
        if not np.isclose(before[name], after[name], rtol=RTOL, atol=ATOL):
            raise ValueError(
                _message(name, before[name], after[name], function, alternative)
            )


def _log_densities(tr: dict[str, Any]) -> dict[str, float]:
    """Each sample site's summed log density (sites without one left out)."""
    out = {}
    for name, site in tr.items():
        if site["type"] != "sample":
            continue
        try:
            out[name] = float(jnp.sum(site["fn"].log_prob(site["value"])))
        except Exception:  # noqa: BLE001 - a simulator without a density
            continue
    return out


def _message(
    name: str, before: float, after: float, function: str, alternative: str
) -> str:
    return (
        f"{function}: the distribution of the site '{name}' reads the data the "
        "model is given (its log density at one simulated data set is "
        f"{before:.6g} with the original data as the model's argument, "
        f"{after:.6g} with the simulated data set), e.g. a prior centred on "
        "y.mean() or a likelihood of lagged values y[t - 1]. Each data set is "
        "simulated by the model given the original data, and each fit is given "
        "the simulated data set: the draws and data sets would not be those of "
        "the models fitted, and an exact fit would look miscalibrated. Compute "
        "such constants once and pass them as arguments of their own "
        "(prior_loc=y.mean()), carry lagged values through the sampled ones "
        "(numpyro.contrib.control_flow.scan), or give each fit the arguments "
        "its data set was simulated with (the observed sites are conditioned "
        "on the simulated data in any case): replications=Replications("
        "simulated_data_to_args=lambda data, *args, **kwargs: (args, kwargs))"
        f"{alternative}."
    )
