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
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import (
    Distribution,
    ExpandedDistribution,
    Independent,
    MaskedDistribution,
)
from numpyro.handlers import condition, seed, trace
from numpyro.primitives import Messenger

#: Relative and absolute tolerance on a site's summed log density (float32).
RTOL = 1e-5
ATOL = 1e-4


class EagerRuns(NamedTuple):
    """The model run eagerly at one simulated data set and one draw of the
    latents: ``simulating`` with the user's arguments, ``fitted`` with those
    the data set's fit is given (both traces without masks), and
    ``masked``: the sites whose masks leave out entries in the fitted run."""

    simulating: dict[str, Any]
    fitted: dict[str, Any]
    masked: frozenset[str]


def eager_runs(
    rng_key: jax.Array,
    model: Callable,
    args: tuple,
    kwargs: dict,
    inject: Callable[[dict], tuple[tuple, dict]],
    data: dict[str, jax.Array],
) -> EagerRuns | None:
    """:class:`EagerRuns` at ``data`` (site -> value of one data set), or
    ``None`` where the model does not run eagerly on these values (the fits
    then raise and explain their own errors)."""
    fit_args, fit_kwargs = inject(data)
    fitted_masks = _unmasked()
    try:
        draw = trace(seed(_unmasked(condition(model, data)), rng_key)).get_trace(
            *args, **kwargs
        )
        values = {n: s["value"] for n, s in draw.items() if s["type"] == "sample"}
        # every sample site given, in both runs: the same keys reach the rest
        # (numpyro.prng_key, e.g. a network's dropout)
        simulating = trace(
            seed(_unmasked(condition(model, values)), rng_key)
        ).get_trace(*args, **kwargs)
        with fitted_masks:
            fitted = trace(seed(condition(model, values), rng_key)).get_trace(
                *fit_args, **fit_kwargs
            )
    except Exception:  # noqa: BLE001 - the fits raise and explain their own errors
        return None
    return EagerRuns(simulating, fitted, frozenset(fitted_masks.masked))


def check_fits_are_the_simulating_model(
    runs: EagerRuns | None, *, function: str, alternative: str = ""
) -> None:
    """Raise, naming the site, where a site's log density differs between
    the two runs: the model fitted to the data set is not the one that
    simulated it. Masks are left out of the comparison (:class:`_unmasked`).
    """
    if runs is None:
        return
    before, after = _log_densities(runs.simulating), _log_densities(runs.fitted)
    for name in before.keys() & after.keys():
        if not np.isclose(
            before[name], after[name], rtol=RTOL, atol=ATOL, equal_nan=True
        ):
            raise ValueError(
                _message(name, before[name], after[name], function, alternative)
            )


class _unmasked(Messenger):
    """The sites' distributions without their masks, and the names of the
    sites whose masks leave out entries (``masked``). A mask computed from
    the data (NumPyro's Lotka-Volterra notebook masks its missing values)
    leaves out terms of the original data that a complete simulated data
    set has; the draws do not see masks, so the fits are those of the
    simulating model."""

    def __init__(self, fn: Callable | None = None) -> None:
        self.masked: set[str] = set()
        super().__init__(fn)

    def process_message(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "sample":
            if _leaves_out_entries(msg["fn"]):
                self.masked.add(msg["name"])
            msg["fn"] = _without_mask(msg["fn"])


def _leaves_out_entries(fn: Distribution) -> bool:
    while isinstance(fn, (Independent, ExpandedDistribution, MaskedDistribution)):
        if isinstance(fn, MaskedDistribution) and not np.all(np.asarray(fn._mask)):
            return True
        fn = fn.base_dist
    return False


def _without_mask(fn: Distribution) -> Distribution:
    if isinstance(fn, MaskedDistribution):
        return _without_mask(fn.base_dist)
    if isinstance(fn, Independent):
        return Independent(_without_mask(fn.base_dist), fn.reinterpreted_batch_ndims)
    if isinstance(fn, ExpandedDistribution):
        return _without_mask(fn.base_dist).expand(fn.batch_shape)
    return fn


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
