"""ArviZ's container for any fitted guide (VI or PVI), with the pointwise
log-likelihood of the data plate."""

from __future__ import annotations

from collections.abc import Callable, Mapping
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
from numpyro_pvi._trace.data_plate import data_sites, observed_sites, plate_of
from numpyro_pvi._trace.enumeration import enumerates
from numpyro_pvi._trace.particles import ParticleSpec
from numpyro_pvi._trace.reductions import log_joint
from numpyro_pvi._trace.structure import model_structure
from numpyro_pvi._trace.terms import LATENTS, LOG_LIK, OBSERVED, ParticleTerms, present
from numpyro_pvi._trace.validation import check_data_plate, check_int, check_loss_target
from numpyro_pvi.diagnostics._predictive import (
    deterministic_values,
    discrete_values,
    model_observations,
    predictive_groups,
    refuse_drawn_params,
)
from numpyro_pvi.evaluation.draws import check_fitted_call, structured_draws

__all__ = ["NOT_POSTERIOR_LOG_LIKELIHOOD", "PSIS_LOO_NOTE", "to_inference_data"]

#: The group that holds the pointwise log-likelihood of a fit whose
#: objective does not target the Bayesian posterior (not ``log_likelihood``:
#: ArviZ's LOO, WAIC and compare read that group and would treat the draws
#: as a posterior).
NOT_POSTERIOR_LOG_LIKELIHOOD = "pointwise_log_likelihood"

#: What a PSIS-LOO of these draws estimates, stored with every export.
PSIS_LOO_NOTE = (
    "PSIS-LOO (az.loo) treats these draws as a Bayesian posterior; for fits "
    "made with predictive objectives (PredictiveELBO, PACmELBO) it is not a "
    "held-out score of the fit: compare such fits with "
    "numpyro_pvi.predictive_score on held-out data. For a Bayesian fit, "
    "sample_stats holds lp = log p(theta, y) and log_q = log q(theta) of the "
    "same draws: arviz_stats.loo_approximate_posterior(data, "
    "data.sample_stats.lp, data.sample_stats.log_q) (ArviZ >= 1.0) corrects "
    "PSIS-LOO for the variational approximation."
)
#: The root attribute ``guide_density`` of an export of a mixture of fits.
MIXTURE_NOTE = (
    "the mixture's: the draws come from a mixture of fits (a StackedGuide) "
    "and log_q is the mixture's density; the log-likelihood is kept out of "
    "ArviZ's LOO (the mixture does not target the posterior)."
)


def to_inference_data(
    rng_key: jax.Array,
    params: dict[str, jax.Array],
    model: Callable,
    guide: Callable,
    *args: Any,
    loss: Any = None,
    num_draws: int = 1000,
    data_plate: str | int | None = None,
    chunk_size: int | None = None,
    predictions: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Container:
    r"""Draws of a fitted guide with the pointwise log-likelihood, for ArviZ.

    The ``log_likelihood`` group holds :math:`\log p(y_i \mid \theta_s)` per
    observation of the data plate (several observed sites at one index summed,
    handler scales applied), in float64, so :func:`arviz.loo`,
    :func:`arviz.waic` and :func:`arviz.compare` work on any fitted guide; the
    draws are independent (``reff=1``).

    **PSIS-LOO assumes a Bayesian posterior.** Pass the objective as ``loss=``:
    it is recorded (root attributes ``objective``, ``targets_posterior``), and
    for a fit that does not target the posterior (:class:`~numpyro_pvi.PredictiveELBO`,
    :class:`~numpyro_pvi.PACmELBO`) the pointwise log-likelihood is stored as
    ``pointwise_log_likelihood``, so that ArviZ's LOO refuses it rather than rank
    the fit by a number that does not measure it. Compare such fits with
    ``arviz.compare(cv.to_elpd())`` of :func:`~numpyro_pvi.selection.cross_validate`.

    Groups (dims ``(chain=1, draw=S, ...)``, plate axes named after the plate):
    ``posterior`` (constrained guide draws; a model's enumerated sites drawn
    from their posterior at each draw by NumPyro's ``infer_discrete``, where
    it runs); ``log_likelihood``;
    ``observed_data``; ``sample_stats`` (``lp`` and ``log_q`` of the draws, for
    ``arviz_stats.loo_approximate_posterior``, Magnusson et al. 2019);
    ``posterior_predictive`` (the observed sites simulated at each draw, for
    ``az.plot_ppc`` and LOO-PIT); ``constant_data`` (the model's other array
    arguments); and with ``predictions={"x": x_new}`` the groups
    ``predictions`` and ``predictions_constant_data``.

    :param rng_key: random key.
    :param params: the fitted parameters (e.g. ``svi_result.params``).
    :param model: the NumPyro model.
    :param guide: the fitted guide.
    :param args: positional arguments of model and guide.
    :param loss: the objective the guide was fitted with (``None``: not
        recorded; the container is read as a Bayesian fit's).
    :param num_draws: ``S``, the number of draws.
    :param data_plate: the plate (or negative batch dimension) that indexes
        observations, as for :class:`~numpyro_pvi.PredictiveELBO`.
    :param chunk_size: evaluate the draws in chunks of this size to bound
        memory; ``None`` evaluates all at once.
    :param predictions: new values of the model's arguments, by parameter
        name, for the ``predictions`` group.
    :param kwargs: keyword arguments of model and guide.
    :return: ``arviz.InferenceData`` on ArviZ 0.2x, ``xarray.DataTree`` with
        the same groups on ArviZ ≥ 1.0.

    **References**

    1. Vehtari, A., Gelman, A. & Gabry, J. (2017). *Practical Bayesian model
       evaluation using leave-one-out cross-validation and WAIC*. Statistics
       and Computing 27.
    2. Magnusson, M., Andersen, M., Jonasson, J. & Vehtari, A. (2019).
       *Bayesian leave-one-out cross-validation for large data*. ICML.
    """
    where = "to_inference_data"
    params, model, guide = check_fitted_call(
        where, params, model, guide, args=args, kwargs=kwargs
    )
    num_draws = check_int(num_draws, "num_draws", where, minimum=1)
    data_plate = check_data_plate(data_plate, where)
    targets = check_loss_target(loss, where)
    mixture_of_fits = getattr(guide, "targets_posterior", True) is False
    if mixture_of_fits:  # a StackedGuide: not the posterior
        targets = False
    spec = ParticleSpec(
        num_draws,
        frozenset({LOG_LIK, LATENTS, OBSERVED}),
        data_plate,
        objective="to_inference_data",
        require_observed=False,
        stratified=False,
    )
    terms, tr = structured_draws(
        rng_key, params, model, guide, args, kwargs, spec, chunk_size=chunk_size
    )
    attrs = root_attrs(
        guide,
        diagnostic="to_inference_data",
        psis_loo=PSIS_LOO_NOTE,
        **objective_attrs(loss, targets),
    )
    if mixture_of_fits:
        attrs["objective"] = type(guide).__name__
        attrs["guide_density"] = MIXTURE_NOTE
    refuse_drawn_params(model, guide, params, args, kwargs, where)
    latents = present(terms.latents, "latents")
    fixed = deterministic_values(
        random.fold_in(rng_key, 2),
        model,
        latents,
        [n for n, site in tr.items() if site["type"] == "deterministic"],
        args,
        kwargs,
        params=params,
    )
    structure = (
        model_structure(model, rng_key, args, kwargs)
        if enumerates(model, args, kwargs)
        else {}
    )
    discrete, discrete_dims, not_drawn = discrete_values(
        random.fold_in(rng_key, 3), model, latents, structure, args, kwargs,
        params=params,
    )  # fmt: skip
    if not_drawn:
        attrs["discrete_sites"] = not_drawn
    groups = export_groups(
        terms, tr, data_plate, targets, fixed | discrete, dims=discrete_dims
    )
    if not observed_sites(tr):  # a target density: draws and their lp only
        return ADAPTER.build(groups, attrs)
    plate = plate_of(tr, data_plate)
    observed_values = present(terms.observed, "observed")
    data: dict[str, Any] = {
        site["name"]: observed_values[site["name"]]
        for site in data_sites(observed_sites(tr), plate)[0]
    }
    dims = site_dims(tr)
    if structure:  # the model's own observed sites, not the summed-out one
        data, dims = model_observations(model, args, kwargs), site_dims(structure)
        groups["observed_data"] = ADAPTER.dict_to_dataset(
            data, dims={n: dims[n] for n in data}, sample_dims=()
        )
    groups.update(
        predictive_groups(
            random.fold_in(rng_key, 1),
            model,
            (latents | discrete, data, dims, fixed),
            (plate.name, plate.size),
            args,
            kwargs,
            predictions,
            params=params,
            num_draws=num_draws,
        )
    )
    return ADAPTER.build(groups, attrs)


def export_groups(
    terms: ParticleTerms,
    tr: dict[str, Any],
    data_plate: str | int | None,
    targets: bool | None,
    deterministic: dict[str, np.ndarray] | None = None,
    dims: dict[str, list[str]] | None = None,
) -> dict[str, xr.Dataset]:
    """The groups of :func:`to_inference_data` from draws ``terms`` (with
    ``log_lik``, ``latents`` and ``observed``, at ``data_plate``) and the
    model's structure ``tr``: ``posterior`` (with the ``deterministic``
    sites' values at the draws), the pointwise log-likelihood
    (``log_likelihood``, or :data:`NOT_POSTERIOR_LOG_LIKELIHOOD` when
    ``targets`` is false), ``sample_stats`` (``lp`` and ``log_q``) and
    ``observed_data``; a model without an observed site (a target density)
    has ``posterior`` and ``sample_stats`` only; ``dims`` names the axes of
    sites that ``tr`` does not hold (those summed out of the fits)."""
    dims = site_dims(tr) | (dims or {})
    latents = {**present(terms.latents, "latents"), **(deterministic or {})}
    groups = {
        "posterior": draws_dataset(
            latents, dims={name: dims[name] for name in latents}
        ),
        "sample_stats": draws_dataset(
            {
                "lp": np.asarray(log_joint(terms), dtype=np.float64),
                "log_q": np.asarray(terms.log_q, dtype=np.float64),
            }
        ),
    }
    if not observed_sites(tr):
        return groups
    plate = plate_of(tr, data_plate)
    # the observations' sites (observed sites outside the data plate are
    # terms of the joint density: in lp, not in log_likelihood)
    observed = [site["name"] for site in data_sites(observed_sites(tr), plate)[0]]
    obs_dim = plate.name if plate.name is not None else "observation"
    log_lik_name = "__".join(observed)
    log_lik_group = (
        NOT_POSTERIOR_LOG_LIKELIHOOD if targets is False else "log_likelihood"
    )
    observed_values = present(terms.observed, "observed")
    return groups | {
        log_lik_group: draws_dataset(
            {log_lik_name: np.asarray(terms.log_lik_scaled, dtype=np.float64)},
            dims={log_lik_name: [obs_dim]},
        ),
        "observed_data": ADAPTER.dict_to_dataset(
            {name: np.asarray(observed_values[name]) for name in observed},
            dims={name: dims[name] for name in observed},
            sample_dims=(),
        ),
    }
