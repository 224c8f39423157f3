r"""Importance resampling of a guide's draws with Pareto-smoothed weights.

When the guide is close enough to the posterior (k̂ below ``good_k``), the
Pareto-smoothed importance weights :math:`\tilde w_s \propto p(\theta_s,
y)/q(\theta_s)` turn the guide's draws into draws nearer the posterior:
resampling :math:`\theta_s` with probability :math:`\tilde w_s` (Stan's
Pathfinder ``psis_resample``, rstan's ``vb(importance_resampling=TRUE)``),
and running the model's predictive at the resampled draws gives an
importance-weighted posterior predictive.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import xarray as xr
from jax import random

from numpyro_pvi._arviz.containers import ADAPTER, Container
from numpyro_pvi._arviz.idata import (
    draws_dataset,
    objective_attrs,
    root_attrs,
    site_dims,
)
from numpyro_pvi._trace.data_plate import (
    WHOLE_DATA,
    data_sites,
    observed_sites,
    plate_of,
)
from numpyro_pvi._trace.particles import ParticleSpec
from numpyro_pvi._trace.terms import LATENTS, LOG_LIK
from numpyro_pvi._trace.validation import check_data_plate, check_int, check_loss_target
from numpyro_pvi.diagnostics._predictive import (
    deterministic_values,
    refuse_drawn_params,
    simulate_observed,
)
from numpyro_pvi.diagnostics.psis import psis_arrays
from numpyro_pvi.evaluation.draws import check_fitted_call, structured_draws

__all__ = ["psis_resample", "resample_indices"]


def resample_indices(
    log_weight: np.ndarray, num_draws: int, *, replace: bool, seed: int
) -> np.ndarray:
    """Indices of ``num_draws`` draws resampled with probabilities
    ``exp(log_weight)``: multinomial with replacement, or successive sampling
    without replacement (each index at most once, as Stan offers).

    :param log_weight: ``(S,)`` normalised log weights.
    :param num_draws: how many indices.
    :param replace: with replacement.
    :param seed: the NumPy generator's seed.
    :return: ``(num_draws,)`` indices into the ``S`` draws.
    """
    w = np.exp(np.asarray(log_weight, np.float64))
    w = w / w.sum()
    if not replace and num_draws > np.count_nonzero(w):
        raise ValueError(
            f"psis_resample: {num_draws} draws without replacement, but only "
            f"{np.count_nonzero(w)} of the guide's draws have a non-zero weight: "
            "ask for fewer, resample with replacement, or draw more proposals "
            "(num_proposals=)."
        )
    return np.random.default_rng(seed).choice(w.size, num_draws, replace, p=w)


def psis_resample(
    rng_key: jax.Array,
    params: dict[str, jax.Array],
    model: Callable,
    guide: Callable,
    *args: Any,
    loss: Any = None,
    num_draws: int = 1000,
    num_proposals: int = 4000,
    replace: bool = True,
    data_plate: str | int | None = None,
    **kwargs: Any,
) -> Container:
    r"""Resample a fitted guide's draws with their Pareto-smoothed importance
    weights, and the importance-weighted posterior predictive.

    Draws ``num_proposals`` times from the guide, Pareto-smooths the log ratios
    :math:`\log p(\theta_s, y) - \log q(\theta_s)` as
    :func:`~numpyro_pvi.diagnostics.psis` does, resamples ``num_draws`` of them
    with the smoothed weights and runs the model at each, its observed sites
    simulated. Only for objectives that target the Bayesian posterior (the
    weights would undo a :class:`~numpyro_pvi.PredictiveELBO` or
    :class:`~numpyro_pvi.PACmELBO` fit: refused); a k̂ at or above ``good_k`` is
    warned about.

    Groups: ``posterior`` (the resampled draws), ``posterior_predictive``,
    ``psis`` (``pareto_k``, ``good_k``, ``ess_is``, ``num_distinct``).

    :param rng_key: random key.
    :param params: the fitted parameters.
    :param model: the model.
    :param guide: the fitted guide.
    :param args: the model's positional arguments (with the data).
    :param loss: the objective the guide was fitted with (``None``: a
        Bayesian fit).
    :param num_draws: the number of resampled draws.
    :param num_proposals: the number of guide draws resampled from.
    :param replace: resample with replacement (multinomial, the default) or
        without (successive sampling, each proposal at most once; the draws
        then lean toward the guide as ``num_draws`` nears ``num_proposals``).
    :param data_plate: the plate (or negative batch dimension) that indexes
        observations, whose observed sites are simulated, as for
        :func:`~numpyro_pvi.diagnostics.to_inference_data`.
    :param kwargs: the model's keyword arguments.
    :return: ArviZ's container (``InferenceData`` / ``DataTree``).

    **References**

    1. Vehtari, A., Simpson, D., Gelman, A., Yao, Y. & Gabry, J. (2024).
       *Pareto smoothed importance sampling*. JMLR 25(72).
    2. Zhang, L., Carpenter, B., Gelman, A. & Vehtari, A. (2022). *Pathfinder:
       Parallel quasi-Newton variational inference*. JMLR 23.
    """
    params, model, guide = check_fitted_call(
        "psis_resample",
        params,
        model,
        guide,
        needs_density=True,
        args=args,
        kwargs=kwargs,
    )
    num_draws = check_int(num_draws, "num_draws", "psis_resample", minimum=1)
    num_proposals = check_int(
        num_proposals, "num_proposals", "psis_resample", minimum=2
    )
    data_plate = check_data_plate(data_plate, "psis_resample")
    targets = check_loss_target(loss, "psis_resample")
    if targets is False:
        raise ValueError(
            f"psis_resample: {type(loss).__name__} does not target the Bayesian "
            "posterior: importance weights toward the posterior would undo what "
            "it fits. Use the guide's own draws for its predictive "
            "(predictive_score, numpyro.infer.Predictive), or resample a fit of "
            "Trace_ELBO, StratifiedELBO, SoftCVIELBO or SNISForwardKL."
        )
    key_draws, key_resample, key_predict = random.split(rng_key, 3)
    spec = ParticleSpec(
        num_proposals,
        frozenset({LOG_LIK, LATENTS}),
        WHOLE_DATA,
        objective="psis_resample",
        require_observed=False,
        fixed_observations=False,
        stratified=False,
    )
    fit = (key_draws, params, model, guide, args, kwargs)
    terms, tr = structured_draws(*fit, spec)
    arrays = psis_arrays(fit, terms, max_draws=num_proposals)
    smoothing = arrays.smoothing
    if not smoothing.pareto_k < smoothing.good_k:
        warnings.warn(
            f"psis_resample: k̂ = {smoothing.pareto_k:.2f} is not below good_k = "
            f"{smoothing.good_k:.2f}: the importance weights are unreliable and "
            "so are the resampled draws. Improve the guide (a richer family, "
            "more steps) before resampling.",
            UserWarning,
            stacklevel=2,
        )
    seed = int(random.randint(key_resample, (), 0, np.iinfo(np.int32).max))
    index = resample_indices(arrays.log_weight, num_draws, replace=replace, seed=seed)
    draws = {name: value[index] for name, value in arrays.latents.items()}
    refuse_drawn_params(model, guide, params, args, kwargs, "psis_resample")
    deterministic = deterministic_values(
        random.fold_in(key_predict, 1),
        model,
        draws,
        [n for n, site in tr.items() if site["type"] == "deterministic"],
        args,
        kwargs,
        params=params,
    )
    # the observations' sites (a prior written as an observed site keeps its value)
    observed = [
        s["name"] for s in data_sites(observed_sites(tr), plate_of(tr, data_plate))[0]
    ]
    predictive = simulate_observed(
        key_predict,
        model,
        draws,
        observed,
        args,
        kwargs,
        params=params,
        num_draws=num_draws,
        function="psis_resample",
        stacklevel=3,
    )
    dims = site_dims(tr)
    groups = {
        "posterior": draws_dataset(
            {**draws, **deterministic},
            dims={n: dims[n] for n in [*draws, *deterministic]},
        ),
        "posterior_predictive": draws_dataset(
            predictive, dims={n: dims[n] for n in predictive}
        ),
        "psis": xr.Dataset(
            {
                "pareto_k": smoothing.pareto_k,
                "good_k": smoothing.good_k,
                "ess_is": smoothing.ess_is,
                "num_distinct": len(np.unique(index)),
            },
            attrs={
                "method": "Pareto smoothed importance resampling",
                "num_proposals": num_proposals,
                "replace": str(replace).lower(),
            },
        ),
    }
    attrs = objective_attrs(loss, targets)
    return ADAPTER.build(
        groups,
        root_attrs(
            guide, diagnostic="psis_resample", replace=str(replace).lower(), **attrs
        ),
    )
