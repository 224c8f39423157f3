"""ArviZ's container for any fitted guide (VI or PVI), with the pointwise
log-likelihood of the data plate."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import xarray as xr
from jax import random

from numpyro_pvi._core import (
    MIN_TAIL,
    ParticleSpec,
    approximate_loo_log_weights,
    check_data_plate,
    check_fitted_call,
    check_int,
    check_loss_target,
    data_sites,
    deprecation,
    has_own_density,
    observed_sites,
    plate_of,
    structured_draws,
)
from numpyro_pvi.diagnostics._arviz_numerics import NUMERICS
from numpyro_pvi.diagnostics._containers import (
    ADAPTER,
    SAMPLE_DIMS,
    Container,
    dataset,
)
from numpyro_pvi.diagnostics._idata import (
    draws_dataset,
    objective_attrs,
    root_attrs,
    site_dims,
)
from numpyro_pvi.diagnostics._predictive import predictive_groups
from numpyro_pvi.particles import (
    LATENTS,
    LOG_LIK,
    OBSERVED,
    ParticleTerms,
    log_joint,
    present,
)

__all__ = [
    "NOT_POSTERIOR_LOG_LIKELIHOOD",
    "PSIS_LOO_NOTE",
    "approximate_loo",
    "approximate_loo_weights",
    "to_inference_data",
]

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
#: The root attribute ``guide_density`` of an export of a guide without a
#: density of its own.
NO_DENSITY_NOTE = (
    "none: the draws come from a mixture of fits (a StackedGuide), each from "
    "one component, so no log_q is stored and the log-likelihood is kept out "
    "of ArviZ's LOO (the mixture does not target the posterior); the draws, "
    "posterior_predictive and predictions serve predictive checks."
)


@deprecation.accepts_old_calls(deprecation.fitted)
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

    The ``log_likelihood`` group holds :math:`\log p(y_i \mid \theta_s)` for
    every observation :math:`y_i` of the data plate (several observed sites
    at index :math:`i` form one observation, their log-likelihoods summed),
    so :func:`arviz.loo`, :func:`arviz.waic`, :func:`arviz.compare` and
    :func:`arviz.plot_posterior` work on any fitted guide. The draws are
    independent, so pass ``reff=1`` where ArviZ asks for it (it is the value
    ArviZ estimates for one chain of independent draws). Handler scales of
    the observed sites are applied as NumPyro applies them, so the pointwise
    values sum to the model's (scaled) log-likelihood. The values are stored
    in float64 (ArviZ's Pareto smoothing of float32 values overflows).

    **PSIS-LOO assumes a Bayesian posterior.** It estimates the leave-one-out
    predictive of the posterior the draws come from; for a fit made with a
    predictive objective (:class:`~numpyro_pvi.PredictiveELBO`,
    :class:`~numpyro_pvi.PACmELBO`) the draws do not target the Bayesian
    posterior, and its ``elpd_loo`` is not a held-out score of that fit
    (the root attribute ``psis_loo`` says so). Pass the objective as
    ``loss=``: it is recorded (root attributes ``objective`` and
    ``targets_posterior``), and for an objective that does not target the
    posterior the pointwise log-likelihood is stored in the group
    ``pointwise_log_likelihood`` instead of ``log_likelihood``, so that
    :func:`arviz.loo`, :func:`arviz.waic` and :func:`arviz.compare` refuse it
    (they find no log-likelihood) rather than rank the fit by a number that
    does not measure it; the draws, observed data and ``lp``/``log_q`` stay
    for plots and predictive checks. Compare fits of any objective with
    :func:`~numpyro_pvi.selection.cross_validate`:
    ``arviz.compare(cv.to_elpd())`` ranks them by held-out log score.

    Groups (dims ``(chain=1, draw=S, ...)``; axes indexed by a plate are named
    after the plate):

    - ``posterior``: the guide draws of every latent site (constrained);
    - ``log_likelihood``: one variable, named after the observed site (the
      names joined by ``"__"`` for several), with dims ``(chain, draw,
      <data plate>)``;
    - ``observed_data``: the observed values of every observed site;
    - ``sample_stats``: ``lp`` (:math:`\log p(\theta_s, y)`, every site with
      its handler scale) and ``log_q`` (:math:`\log q(\theta_s)`) of the same
      draws: what ArviZ ≥ 1.0's ``arviz_stats.loo_approximate_posterior(data,
      data.sample_stats.lp, data.sample_stats.log_q)`` needs to correct
      PSIS-LOO for the difference between the guide and the posterior
      (Magnusson et al. 2019);
    - ``posterior_predictive``: every observed site of the data plate
      simulated at each draw (the model run with its observed sites
      sampled), so ``az.plot_ppc``, ``az.loo_pit`` (0.2x),
      ``arviz_stats.loo_pit`` and ``arviz_plots.plot_ppc_pit`` (≥ 1.0) run
      on the container as it is;
    - ``constant_data``: the model's array arguments other than the observed
      data, by their parameter names (an axis as long as the data plate is
      named after it);
    - with ``predictions={"x": x_new, ...}`` (new values of the model's
      arguments, by name; the observed data are left out): ``predictions``,
      the observed sites simulated at the new inputs from the same draws,
      and ``predictions_constant_data``, the new inputs.

    On ArviZ ≥ 1.0, ``arviz_base.from_numpyro_svi`` also converts an SVI fit;
    use it for the posterior draws (and its own ``log_likelihood`` of each
    observed site). This function adds what LOO needs when an observation is
    more than one site: one pointwise log-likelihood per index of the data
    plate (several observed sites at that index summed, handler scales
    applied), and the ``lp``/``log_q`` of the approximation correction.

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

    1. *Practical Bayesian model evaluation using leave-one-out
       cross-validation and WAIC*, Vehtari, Gelman, Gabry (Statistics and
       Computing 2017).
    2. *Bayesian leave-one-out cross-validation for large data*, Magnusson,
       Andersen, Jonasson, Vehtari (ICML 2019).
    """
    where = "to_inference_data"
    params, model, guide = check_fitted_call(
        where, params, model, guide, args=args, kwargs=kwargs
    )
    num_draws = check_int(num_draws, "num_draws", where, minimum=1)
    data_plate = check_data_plate(data_plate, where)
    targets = check_loss_target(loss, where)
    own_density = has_own_density(guide)
    if not own_density:  # a mixture of fits (StackedGuide): not the posterior
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
    if not own_density:
        attrs["objective"] = type(guide).__name__
        attrs["guide_density"] = NO_DENSITY_NOTE
    groups = export_groups(terms, tr, data_plate, targets, log_q=own_density)
    if not observed_sites(tr):  # a target density: draws and their lp only
        return ADAPTER.build(groups, attrs)
    plate = plate_of(tr, data_plate)
    observed = data_sites(observed_sites(tr), plate)[0]
    observed_values = present(terms.observed, "observed")
    groups.update(
        predictive_groups(
            random.fold_in(rng_key, 1),
            model,
            (
                present(terms.latents, "latents"),
                {site["name"]: observed_values[site["name"]] for site in observed},
                site_dims(tr),
            ),
            (plate.name, plate.size),
            args,
            kwargs,
            predictions,
        )
    )
    return ADAPTER.build(groups, attrs)


def export_groups(
    terms: ParticleTerms,
    tr: dict[str, Any],
    data_plate: str | int | None,
    targets: bool | None,
    *,
    log_q: bool = True,
) -> dict[str, xr.Dataset]:
    """The groups of :func:`to_inference_data` from draws ``terms`` (with
    ``log_lik``, ``latents`` and ``observed``, at ``data_plate``) and the
    model's structure ``tr``: ``posterior``, the pointwise log-likelihood
    (``log_likelihood``, or :data:`NOT_POSTERIOR_LOG_LIKELIHOOD` when
    ``targets`` is false), ``sample_stats`` (``lp``, and ``log_q`` unless
    the guide has no density of its own) and ``observed_data``; a model
    without an observed site (a target density) has ``posterior`` and
    ``sample_stats`` only."""
    dims = site_dims(tr)
    latents = present(terms.latents, "latents")
    groups = {
        "posterior": draws_dataset(
            latents, dims={name: dims[name] for name in latents}
        ),
        "sample_stats": draws_dataset(
            {"lp": np.asarray(log_joint(terms), dtype=np.float64)}
            | ({"log_q": np.asarray(terms.log_q, dtype=np.float64)} if log_q else {})
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


#: The fewest draws that give arviz-stats' Pareto fit its smallest tail
#: (``floor(S/5) ≥ MIN_TAIL``): below them PSIS-LOO is refused under either
#: ArviZ generation alike.
MIN_LOO_DRAWS = 25


def approximate_loo(
    data: Container, *, pointwise: bool = True, var_name: str | None = None
) -> Any:
    r"""PSIS-LOO of a variational fit, corrected for the approximation.

    The guide's draws :math:`\theta_s \sim q` are importance-weighted towards
    each leave-one-out posterior with the ratios
    :math:`p(\theta_s, y) / (q(\theta_s)\, p(y_i \mid \theta_s))`
    (Magnusson et al. 2019), Pareto-smoothed per observation; plain
    :func:`arviz.loo` on the same draws treats q as the posterior. On ArviZ ≥
    1.0 this is ``arviz_stats.loo_approximate_posterior(data,
    data.sample_stats.lp, data.sample_stats.log_q)``; on ArviZ 0.2x, which
    has no such function, the same computation with :func:`arviz.psislw`.
    Like every PSIS-LOO it estimates the leave-one-out predictive of the
    *Bayesian* posterior (see ``PSIS_LOO_NOTE``).

    :param data: the result of :func:`to_inference_data` (refused for a fit
        exported with an objective that does not target the posterior).
    :param pointwise: also return ``loo_i`` / ``elpd_i`` and ``pareto_k``
        per observation (:func:`arviz.compare` needs them).
    :param var_name: the ``log_likelihood`` variable; default the only one.
    :return: ArviZ's ``ELPDData`` (``elpd_loo``/``elpd``, ``se``, ``p_loo``/
        ``p``, ``good_k``, ...), usable in :func:`arviz.compare`.

    **References**

    1. *Bayesian leave-one-out cross-validation for large data*, Magnusson,
       Andersen, Jonasson, Vehtari (ICML 2019).
    """
    stats = _posterior_export(data, "approximate_loo")
    num_draws = int(stats["lp"].size)
    if num_draws < MIN_LOO_DRAWS:
        raise ValueError(
            f"approximate_loo: the container holds {num_draws} draws, too few "
            f"for PSIS, whose Pareto fit takes a tail of at least {MIN_TAIL} "
            f"(at least {MIN_LOO_DRAWS} draws): export more draws "
            f"(to_inference_data(..., num_draws={MIN_LOO_DRAWS}) or more)."
        )
    return NUMERICS.approximate_loo(
        data, stats["lp"], stats["log_q"], pointwise=pointwise, var_name=var_name
    )


def approximate_loo_weights(
    data: Container, *, var_names: str | list[str] | None = None
) -> tuple[xr.Dataset, xr.Dataset]:
    r"""The leave-one-out importance weights of a variational fit's draws,
    corrected for the approximation, for ArviZ's LOO-PIT.

    The log ratios :math:`\log p(\theta_s, y) - \log q(\theta_s) - \log p(y_i
    \mid \theta_s)` of :func:`approximate_loo`, Pareto-smoothed and
    normalised per observation. ArviZ's ``loo_pit`` computes its weights from
    the log-likelihood alone, treating the guide's draws as posterior draws;
    with these it weights them towards each leave-one-out posterior:

    .. code-block:: python

        log_weights, pareto_k = approximate_loo_weights(data)
        arviz_stats.loo_pit(data, log_weights=log_weights, pareto_k=pareto_k)  # 1.x
        az.loo_pit(data, y="y", log_weights=log_weights["y"].stack(
            __sample__=("chain", "draw")))                                   # 0.2x

    :param data: the result of :func:`to_inference_data` of a fit whose
        objective targets the posterior.
    :param var_names: the ``log_likelihood`` variables (default: all).
    :return: ``log_weights`` (dims of the log-likelihood: ``chain``,
        ``draw`` and the observation's) and ``pareto_k`` (the observation's
        dims), ``xarray.Dataset`` with one variable per observed site.

    **References**

    1. *Bayesian leave-one-out cross-validation for large data*, Magnusson,
       Andersen, Jonasson, Vehtari (ICML 2019).
    2. *Practical Bayesian model evaluation using leave-one-out
       cross-validation and WAIC*, Vehtari, Gelman, Gabry (Statistics and
       Computing 2017), §5 (LOO-PIT).
    """
    stats = _posterior_export(data, "approximate_loo_weights")
    group = dataset(
        data, "log_likelihood", "approximate_loo_weights", "to_inference_data"
    )
    available = [str(name) for name in group.data_vars]
    names = [var_names] if isinstance(var_names, str) else var_names
    names = available if names is None else names
    unknown = sorted(set(names) - set(available))
    if unknown:
        raise ValueError(
            f"approximate_loo_weights: {unknown} are not log_likelihood variables; "
            f"choose among {sorted(available)}."
        )
    log_p = stats["lp"].values.reshape(-1)
    log_q = stats["log_q"].values.reshape(-1)
    weights, ks = {}, {}
    for name in names:
        log_lik = group[name]
        obs_dims = [d for d in log_lik.dims if d not in SAMPLE_DIMS]
        flat = log_lik.transpose(*obs_dims, *SAMPLE_DIMS)
        values = flat.values.reshape(-1, log_p.size)
        log_weight, k = approximate_loo_log_weights(
            values, log_p, log_q, NUMERICS.psislw
        )
        weights[name] = flat.copy(data=log_weight.reshape(flat.shape)).transpose(
            *log_lik.dims
        )
        ks[name] = flat.isel({d: 0 for d in SAMPLE_DIMS}, drop=True).copy(
            data=k.reshape(flat.shape[: len(obs_dims)])
        )
    return xr.Dataset(weights), xr.Dataset(ks)


def _posterior_export(data: Container, where: str) -> xr.Dataset:
    """The ``sample_stats`` of an export of a fit that targets the posterior,
    with ``lp`` and ``log_q``; refused otherwise."""
    if NOT_POSTERIOR_LOG_LIKELIHOOD in ADAPTER.groups(data):
        raise ValueError(
            f"{where}: this export is of a fit whose objective "
            f"({dict(data.attrs).get('objective')}) does not target the "
            "Bayesian posterior; PSIS-LOO would estimate the Bayesian posterior's "
            "held-out score, not this fit's. Compare such fits by held-out score: "
            "arviz.compare(numpyro_pvi.selection.cross_validate(...).to_elpd())."
        )
    stats = dataset(data, "sample_stats", where, "to_inference_data")
    dataset(data, "log_likelihood", where, "to_inference_data")
    missing = {"lp", "log_q"} - set(stats.data_vars)
    if missing:
        raise ValueError(
            f"{where}: sample_stats lacks {sorted(missing)}; pass the "
            "result of numpyro_pvi.diagnostics.to_inference_data."
        )
    _warn_undefined_ratios(data, stats["lp"], where)
    return stats


def _warn_undefined_ratios(data: Container, lp: xr.DataArray, where: str) -> None:
    r"""Warn of the observations whose leave-one-out ratios the export does
    not determine: a draw of zero likelihood there has
    :math:`p(\theta_s, y) = 0`, and ``lp`` then says nothing of
    :math:`p(\theta_s, y_{-i})`, the ratio's numerator (a bound of the
    data's support that is a parameter, as in a ``Uniform(0, theta)``
    likelihood, makes such draws)."""
    zero_joint = lp == -np.inf
    if not bool(zero_joint.any()):
        return
    undefined = {}
    for name, log_lik in ADAPTER.dataset(data, "log_likelihood").data_vars.items():
        cells = ((log_lik == -np.inf) & zero_joint).any(SAMPLE_DIMS)
        if bool(cells.any()):
            flat = np.flatnonzero(cells.values).tolist()
            undefined[str(name)] = flat[:10] + ["..."] * (len(flat) > 10)
    if undefined:
        warnings.warn(
            f"{where}: some draws of the guide have zero likelihood at these "
            f"observations (flat indices, by site: {undefined}), so zero joint "
            "density: the leave-one-out ratio p(theta, y_-i) / q(theta) of such "
            "a draw is not determined by lp (the model says nothing of it "
            "without the observation), and the elpd and k-hat of these "
            "observations read nan. A K-fold estimate refits without each "
            "fold: arviz.compare(numpyro_pvi.selection.cross_validate(...)"
            ".to_elpd()).",
            UserWarning,
            stacklevel=3,
        )
