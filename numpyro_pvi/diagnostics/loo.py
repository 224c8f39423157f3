"""PSIS-LOO of a variational fit from its export, corrected for the
approximation (Magnusson et al. 2019): the expected log predictive density
and the leave-one-out importance weights of the guide's draws."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import xarray as xr

from numpyro_pvi._arviz.containers import ADAPTER, SAMPLE_DIMS, Container, dataset
from numpyro_pvi._arviz.loo import approximate_loo_log_weights
from numpyro_pvi._arviz.numerics import NUMERICS
from numpyro_pvi.diagnostics.export import NOT_POSTERIOR_LOG_LIKELIHOOD
from numpyro_pvi.evaluation.psis import MIN_TAIL

__all__ = ["MIN_LOO_DRAWS", "approximate_loo", "approximate_loo_weights"]


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

    The log ratios of :func:`approximate_loo`, Pareto-smoothed and normalised
    per observation (ArviZ's ``loo_pit`` would treat the guide's draws as
    posterior draws):

    .. code-block:: python

        log_weights, pareto_k = approximate_loo_weights(data)
        arviz_stats.loo_pit(data, log_weights=log_weights, pareto_k=pareto_k)  # 1.x
        az.loo_pit(data, y="y", log_weights=log_weights["y"].stack(
            __sample__=("chain", "draw")))                                   # 0.2x

    :param data: the result of :func:`to_inference_data` of a fit whose
        objective targets the posterior.
    :param var_names: the ``log_likelihood`` variables (default: all).
    :return: ``log_weights`` and ``pareto_k``, ``xarray.Dataset`` with one
        variable per observed site.

    **References**

    1. Magnusson, M., Andersen, M., Jonasson, J. & Vehtari, A. (2019).
       *Bayesian leave-one-out cross-validation for large data*. ICML.
    2. Vehtari, A., Gelman, A. & Gabry, J. (2017). *Practical Bayesian model
       evaluation using leave-one-out cross-validation and WAIC*. Statistics and
       Computing 27, §5.
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
